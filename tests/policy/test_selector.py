"""Label selectors: Kubernetes string syntax, parsed and matched."""

from __future__ import annotations

import pytest

from gpuremediate.policy.selector import SelectorError, parse_selector

LABELS = {"pool": "h100", "tier": "prod", "example.com/rack": "r7", "empty": ""}


@pytest.mark.parametrize(
    ("text", "matches"),
    [
        ("", True),
        ("pool=h100", True),
        ("pool==h100", True),
        ("pool = h100", True),
        ("pool=a100", False),
        ("pool!=a100", True),
        ("pool!=h100", False),
        ("missing!=x", True),
        ("pool", True),
        ("missing", False),
        ("!missing", True),
        ("!pool", False),
        ("tier in (prod,staging)", True),
        ("tier in (staging)", False),
        ("tier notin (staging)", True),
        ("tier notin (prod, staging)", False),
        ("missing notin (x)", True),
        ("missing in (x)", False),
        ("pool=h100,tier in (prod)", True),
        ("pool=h100, tier in (dev)", False),
        ("example.com/rack=r7", True),
        ("empty=", True),
        ("empty in (a,)", True),
    ],
)
def test_matching(text: str, matches: bool) -> None:
    assert parse_selector(text).matches(LABELS) is matches


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("pool=h100,", "stray comma"),
        ("tier in (prod", "unbalanced '('"),
        ("tier in prod)", "unbalanced ')'"),
        ("tier in ()", "at least one value"),
        ("pool=h 100", "cannot parse"),
        ("-bad=x", "invalid label key"),
        ("pool=-bad", "invalid label value"),
        ("Example.COM/rack=x", "invalid label key"),
        (f"pool={'v' * 64}", "invalid label value"),
        ("pool>3", "cannot parse"),
    ],
)
def test_errors_name_the_problem(text: str, error: str) -> None:
    with pytest.raises(SelectorError, match=error.replace("(", r"\(").replace(")", r"\)")):
        parse_selector(text)
