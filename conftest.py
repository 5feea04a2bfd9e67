"""Shared pytest setup.

Under CI (``CI=true``) hypothesis runs derandomized: the same examples on every run, so a submission's
result does not depend on the luck of the draw. Locally each run explores new examples (and keeps
the failures it finds in .hypothesis/ to replay them first).
"""

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
if os.environ.get("CI", "").lower() == "true":
    settings.load_profile("ci")
