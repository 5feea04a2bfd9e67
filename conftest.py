"""Shared pytest setup.

Under CI (``CI=true``) hypothesis runs derandomized: the same examples on every run, so a submission's
result does not depend on the luck of the draw. Locally each run explores new examples (and keeps
the failures it finds in .hypothesis/ to replay them first).
"""

import logging
import os
from collections.abc import Iterator

import pytest
from hypothesis import settings

settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
if os.environ.get("CI", "").lower() == "true":
    settings.load_profile("ci")


@pytest.fixture(autouse=True)
def _root_logger_left_as_found() -> Iterator[None]:
    """A test that runs a command (``setup_logging``) leaves the root logger writing to its captured stderr, which
    pytest closes after it: every later line from any thread was then a '--- Logging error ---' traceback. The
    handlers such a test added (ours: not pytest's capture handlers) go, and the root's level comes back."""
    root = logging.getLogger()
    before, level = list(root.handlers), root.level
    yield
    from gpuremediate.obs.log import JsonFormatter, TextFormatter
    root.handlers[:] = [h for h in root.handlers
                        if h in before or not isinstance(h.formatter, TextFormatter | JsonFormatter)]
    root.setLevel(level)
