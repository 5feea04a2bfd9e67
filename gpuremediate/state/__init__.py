"""The node state layer: pure, no I/O (design §3).

- :mod:`gpuremediate.vocab.states`: the states, the reasons, the one transition table.
- :mod:`gpuremediate.vocab.record`: ``NodeRecord`` and its annotation codec, ``transition``.
- :mod:`gpuremediate.state.decide`: the decisions the loops apply (``on_findings``, ``complete_*``...).

Import the submodules directly; this package imports nothing (the record and its states are in
``vocab``, below ``policy``, since issue 44).
"""
