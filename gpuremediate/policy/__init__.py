"""The policy layer: pure functions from readings to findings (no I/O but reading the policy file).

Modules: ``xid`` (the XID table), ``selector`` (label selectors), ``config`` (the policy file),
``rules`` (one GPU's rules), ``evaluate`` (one node: ``evaluate``, ``PolicyMemory``, ``worst``),
``findings`` (the output type). Import from the modules; this package re-exports nothing so that
``python -m gpuremediate.policy.xid`` runs cleanly.
"""
