import sys

from gpuremediate.shutdown import Shutdown

# The long-running commands handle SIGTERM from the first moment: a signal that came before the handler is
# installed (while the controller's modules import) would kill the process with no clean shutdown.
_LONG_RUNNING = (["run"], ["agent"], ["plugin", "drain-window"])
early = Shutdown().install() if any(sys.argv[1 : 1 + len(c)] == c for c in _LONG_RUNNING) else None

from gpuremediate.cli import main  # noqa: E402  (after the handler, on purpose)

sys.exit(main(shutdown=early))
