"""e2e scenarios (see harness.py)."""
