"""Simulators: Kubernetes API emulator, kubelet stand-in, dcgm-exporter stand-in."""
