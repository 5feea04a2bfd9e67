"""A minimal example remediation controller (NVSentinel's custom-remediation contract), for the
e2e scenarios and as a template for docs/plugins.md.

It reconciles ``RemediationRequest`` (``remediation.example.com/v1alpha1``): per node, a mode says
what the "repair" does — ``succeed`` (``Complete=True``), ``fail-then-succeed`` (the first request
for the node gets ``Complete=False``, later ones ``True``) or ``never`` (stays in progress until
``complete(name)`` is called). It is idempotent (no-op once the condition is set) and writes status
only through the ``/status`` subresource. Run standalone: ``python -m e2e.plugins.remediation
--kubeconfig K --mode succeed``.
"""

from __future__ import annotations

import argparse
import contextlib
import threading
import time
from pathlib import Path
from typing import Any

from gpuremediate.actions.custom import condition
from gpuremediate.kube import errors, miniyaml
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.config import load_config
from gpuremediate.kube.resources import CRDS, Resource

GROUP = "remediation.example.com"
API_VERSION = f"{GROUP}/v1alpha1"
KIND = "RemediationRequest"
COMPLETE = "Complete"
MODES = ("succeed", "fail-then-succeed", "never")
ROOT = Path(__file__).resolve().parents[2]
DRAIN_REQUEST_CRD = ROOT / "manifests" / "plugins" / "drain-window" / "crd-drainrequests.yaml"


def remediation_crd() -> dict[str, Any]:
    status = {"type": "object", "properties": {"conditions": {"type": "array", "items": {
        "type": "object", "x-kubernetes-preserve-unknown-fields": True}}}}
    spec = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    return {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": f"remediationrequests.{GROUP}"},
        "spec": {"group": GROUP, "scope": "Namespaced",
                 "names": {"kind": KIND, "listKind": f"{KIND}List", "plural": "remediationrequests",
                           "singular": "remediationrequest"},
                 "versions": [{"name": "v1alpha1", "served": True, "storage": True,
                               "subresources": {"status": {}},
                               "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                                   "spec": spec, "status": status}}}}]},
    }


def drain_request_crd() -> dict[str, Any]:
    """The DrainRequest CRD exactly as shipped in manifests/plugins/drain-window/."""
    crd: dict[str, Any] = miniyaml.loads(DRAIN_REQUEST_CRD.read_text())
    return crd


def install_crd(client: KubeClient, crd: dict[str, Any], api_version: str, kind: str,
                timeout: float = 10.0) -> Resource:
    """Create the CRD (if missing) and wait until discovery serves the kind."""
    with contextlib.suppress(errors.AlreadyExists):
        client.create(CRDS, crd)
    deadline = time.monotonic() + timeout
    while True:
        try:
            return client.resolve(api_version, kind)
        except errors.NotFound:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


class ExampleRemediationController:
    def __init__(self, client: KubeClient, *, mode: str = "succeed", interval: float = 0.1) -> None:
        if mode not in MODES:
            raise ValueError(f"mode: expected one of {', '.join(MODES)}, got {mode!r}")
        self.client = client
        self.default_mode = mode
        self.modes: dict[str, str] = {}
        self.interval = interval
        self.res = client.resolve(API_VERSION, KIND)
        self.seen: list[str] = []  # request names, in the order first seen
        self._failed_nodes: set[str] = set()
        self._manual: dict[str, str] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="example-remediation", daemon=True)

    def set_mode(self, node: str, mode: str) -> None:
        if mode not in MODES:
            raise ValueError(f"mode: expected one of {', '.join(MODES)}, got {mode!r}")
        with self._lock:
            self.modes[node] = mode

    def complete(self, name: str, status: str = "True") -> None:
        """Finish a ``never`` request by hand (as the external system eventually would)."""
        with self._lock:
            self._manual[name] = status

    def start(self) -> ExampleRemediationController:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                for item in self.client.list(self.res)["items"]:
                    self.reconcile(item)
            except (errors.ApiError, errors.TransportError):
                continue

    def reconcile(self, item: dict[str, Any]) -> None:
        name = item["metadata"]["name"]
        with self._lock:
            if name not in self.seen:
                self.seen.append(name)
            if condition(item, COMPLETE) is not None and name not in self._manual:
                return  # idempotent: done once the condition is set
            status = self._decide(item, name)
        if status is None or (condition(item, COMPLETE) or {}).get("status") == status:
            return
        reason = "RepairSucceeded" if status == "True" else "RepairFailed"
        item["status"] = {"conditions": [{"type": COMPLETE, "status": status, "reason": reason,
                                          "message": f"example repair {reason}",
                                          "lastTransitionTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}]}
        with contextlib.suppress(errors.Conflict, errors.NotFound):
            self.client.replace(self.res, name, item, item["metadata"]["namespace"], subresource="status")

    def _decide(self, item: dict[str, Any], name: str) -> str | None:
        if name in self._manual:
            return self._manual[name]
        node = str((item.get("spec") or {}).get("nodeName", ""))
        mode = self.modes.get(node, self.default_mode)
        if mode == "never":
            return None
        if mode == "fail-then-succeed" and node not in self._failed_nodes:
            self._failed_nodes.add(node)
            return "False"
        return "True"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kubeconfig")
    parser.add_argument("--mode", choices=MODES, default="succeed")
    args = parser.parse_args()
    client = KubeClient(load_config(args.kubeconfig))
    install_crd(client, remediation_crd(), API_VERSION, KIND)
    controller = ExampleRemediationController(client, mode=args.mode).start()
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        controller.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
