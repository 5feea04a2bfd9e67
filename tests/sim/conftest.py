"""Fixtures for the emulator and nodesim tests (defined in kubeapi_support)."""

from kubeapi_support import raw, srv

__all__ = ["raw", "srv"]
