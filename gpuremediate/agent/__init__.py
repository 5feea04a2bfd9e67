"""``gpuremediate agent``: the node agent (a DaemonSet on GPU nodes).

kmsg (the kernel log: Xid/SXid lines, resume point) → health (the shared policy evaluation plus what only a
node can see: a hung driver, a missing GPU, NVSwitch errors) → publish (NodeConditions on its own Node),
with metrics; run holds the loop, cli the flags.
"""
