"""gpuremediate: a Kubernetes controller that keeps GPU nodes healthy on its own."""

__version__ = "0.1.0"
