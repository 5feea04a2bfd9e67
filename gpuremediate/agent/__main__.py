import sys

from gpuremediate.shutdown import Shutdown

early = Shutdown().install()  # SIGTERM is handled from the first moment, as in gpuremediate/__main__.py

from gpuremediate.agent.cli import add_arguments, main  # noqa: E402  (after the handler, on purpose)


def _main() -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m gpuremediate.agent",
                                     description="gpuremediate node agent: GPU health → NodeConditions")
    add_arguments(parser)
    return main(parser.parse_args(), shutdown=early)


sys.exit(_main())
