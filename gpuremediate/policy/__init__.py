"""The policy layer: pure functions from readings to findings (no I/O but reading the policy file)."""

from gpuremediate.policy.config import Policy, PolicyError, PolicyFile, default_policy, load_policy, loads_policy
from gpuremediate.policy.evaluate import Evaluation, PolicyMemory, PolicyMemoryError, evaluate, worst
from gpuremediate.policy.findings import Finding
from gpuremediate.policy.xid import XID_TABLE, XidEntry, lookup

__all__ = [
    "XID_TABLE",
    "Evaluation",
    "Finding",
    "Policy",
    "PolicyError",
    "PolicyFile",
    "PolicyMemory",
    "PolicyMemoryError",
    "XidEntry",
    "default_policy",
    "evaluate",
    "load_policy",
    "loads_policy",
    "lookup",
    "worst",
]
