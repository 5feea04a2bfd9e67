"""The ResourceSlice NVIDIA's DRA driver for GPUs publishes for a node (NodeSim's opt-in ``dra=True``).

What NVIDIA/k8s-dra-driver-gpu's kubelet plugin (cmd/gpu-kubelet-plugin/deviceinfo.go, ``GpuInfo.GetDevice``)
puts in a slice, through k8s.io/dynamic-resource-allocation/resourceslice's controller:

- driver ``gpu.nvidia.com``; pool name = the node name; ``spec.nodeName`` = the node; one slice, so
  ``resourceSliceCount`` 1; an ownerReference to the Node (controller: true), so the slice goes with the Node;
  ``generateName`` ``<index as 5 hex digits>-<driver>-<node>-``.
- one device per whole GPU, named ``gpu-<minor>`` (a simulated GPU's minor is its index), attributes ``type``
  ("gpu"), ``uuid`` (the UUID gpu-sim gives that GPU: sim.gpusim.gpu_uuid), ``productName``, ``brand``,
  ``architecture``, ``cudaComputeCapability``, ``driverVersion``, ``cudaDriverVersion``, ``pcieBusID``, and
  capacity ``memory``. ``index`` and ``minor`` (ints) as earlier versions of the driver published them
  (klueska/nvk8s-resourcemodel); the current driver has neither, so nothing should rely on them: gpuremediate
  finds a GPU by ``uuid``.

Not modelled: MIG devices (``gpu-<minor>-mig-<profile>-<start>-<size>``), VFIO devices, the PCIe root attribute,
health-driven device taints the driver may write.
"""

from __future__ import annotations

from typing import Any

from sim.gpusim import DEFAULT_DRIVER, DEFAULT_MODEL, HGX_BUSES, gpu_uuid

DRIVER = "gpu.nvidia.com"
MEMORY = "81559Mi"  # an H100 80GB HBM3's framebuffer as NVML reports it
CUDA_DRIVER = "12.8.0"


def device_name(index: int) -> str:
    return f"gpu-{index}"


def gpu_device(node: str, index: int) -> dict[str, Any]:
    bus = HGX_BUSES[index] if index < len(HGX_BUSES) else f"{0xC0 + index:02X}"
    attributes = {
        "type": {"string": "gpu"}, "uuid": {"string": gpu_uuid(node, index)}, "index": {"int": index},
        "minor": {"int": index}, "productName": {"string": DEFAULT_MODEL}, "brand": {"string": "Nvidia"},
        "architecture": {"string": "Hopper"}, "cudaComputeCapability": {"version": "9.0.0"},
        "driverVersion": {"version": DEFAULT_DRIVER}, "cudaDriverVersion": {"version": CUDA_DRIVER},
        "pcieBusID": {"string": f"0000:{bus.lower()}:00.0"},
    }
    return {"name": device_name(index), "attributes": attributes, "capacity": {"memory": {"value": MEMORY}}}


def resource_slice(node: str, node_uid: str, gpus: int, generation: int = 1) -> dict[str, Any]:
    """The body to create (the server appends the name's random suffix)."""
    owner = {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid, "controller": True}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"generateName": f"{0:05x}-{DRIVER}-{node}-", "ownerReferences": [owner]},
            "spec": {"driver": DRIVER, "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
                     "nodeName": node, "devices": [gpu_device(node, i) for i in range(gpus)]}}
