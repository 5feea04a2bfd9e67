"""Test and example plugins for the e2e scenarios (issue 5)."""
