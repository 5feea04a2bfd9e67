"""The node state layer: pure, no I/O (design §3).

- :mod:`gpuremediate.state.states`: the states, the reasons, the one transition table.
- :mod:`gpuremediate.state.record`: ``NodeRecord`` and its annotation codec, ``transition``.
- :mod:`gpuremediate.state.decide`: the decisions the loops apply (``on_findings``, ``complete_*``...).

Import the submodules directly; this package imports nothing (``decide`` uses ``policy.safety``,
which uses ``state.record``: keeping this file empty keeps that import order free of cycles).
"""
