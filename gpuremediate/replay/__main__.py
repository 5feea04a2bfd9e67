"""``python -m gpuremediate.replay ARGS``: the ``gpuremediate replay`` command on its own."""

import sys

from gpuremediate.replay.cli import entry

sys.exit(entry())
