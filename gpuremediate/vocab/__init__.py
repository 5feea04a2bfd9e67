"""The words every layer speaks, at the bottom of the package graph: findings with their actions, kinds and
severities (``findings``); the node record, its states and constants (``record``, ``states``); the policy's schema
machinery and validators (``schema``) and the section types several layers read (``degradation``, ``window``).

A module here imports nothing of gpuremediate's but another module here (tests/test_import_cycles.py checks it,
with the order of the layers above it)."""
