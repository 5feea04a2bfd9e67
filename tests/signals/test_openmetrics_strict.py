"""OpenMetrics 1.0 strict mode: one hand-made minimal case per rule, after the spec (specification/
OpenMetrics.md) and the shape of the official parser suite's cases (prometheus/OpenMetrics
tests/testdata/parsers); none is copied from it."""

from __future__ import annotations

import pytest

from gpuremediate.signals.exposition import ParseError, parse

OM = "application/openmetrics-text; version=1.0.0; charset=utf-8"


def om(*lines: str) -> str:
    return "\n".join((*lines, "# EOF")) + "\n"


REJECTS = [
    # Sum and Count are counters: never NaN or negative
    ("histogram _sum NaN", om("# TYPE h histogram", 'h_bucket{le="+Inf"} 1', "h_count 1", "h_sum NaN"), "non-negative"),
    ("histogram _sum negative", om("# TYPE h histogram", 'h_bucket{le="+Inf"} 1', "h_count 1", "h_sum -2"),
     "non-negative"),
    ("summary _sum NaN", om("# TYPE s summary", "s_count 1", "s_sum NaN"), "non-negative"),
    ("summary _sum negative", om("# TYPE s summary", "s_count 1", "s_sum -1"), "non-negative"),
    ("gauge histogram _gsum NaN", om("# TYPE g gaugehistogram", 'g_bucket{le="+Inf"} 1', "g_gcount 1", "g_gsum NaN"),
     "must not be NaN"),
    # negative buckets: no _sum on a histogram; a gauge histogram's _gsum may be negative only beside them
    ("_sum beside negative buckets", om("# TYPE h histogram", 'h_bucket{le="-1"} 0', 'h_bucket{le="+Inf"} 1',
                                        "h_count 1", "h_sum 3"), "negative buckets cannot have a _sum"),
    ("negative _gsum, no negative bucket", om("# TYPE g gaugehistogram", 'g_bucket{le="+Inf"} 1', "g_gcount 1",
                                              "g_gsum -1"), "needs negative buckets"),
    # quantiles
    ("negative quantile value", om("# TYPE s summary", 's{quantile="0.9"} -0.5'), "must not be negative"),
    ("quantile below 0", om("# TYPE s summary", 's{quantile="-0.1"} 1'), r"outside \[0, 1\]"),
    ("quantile above 1", om("# TYPE s summary", 's{quantile="1.5"} 1'), r"outside \[0, 1\]"),
    ("quantile NaN", om("# TYPE s summary", 's{quantile="NaN"} 1'), "must be a number"),
    # histogram structure
    ("histogram without buckets", om("# TYPE h histogram", "h_count 0", "h_sum 0"), r'no le="\+Inf" bucket'),
    ("_sum without _count", om("# TYPE h histogram", 'h_bucket{le="+Inf"} 2', "h_sum 1"), "_sum without _count"),
    ("_count without _sum", om("# TYPE h histogram", 'h_bucket{le="+Inf"} 2', "h_count 2"), "_count without _sum"),
    ("_gsum without _gcount", om("# TYPE g gaugehistogram", 'g_bucket{le="+Inf"} 2', "g_gsum 1"),
     "_gsum without _gcount"),
    ("_gcount without _gsum", om("# TYPE g gaugehistogram", 'g_bucket{le="+Inf"} 2', "g_gcount 2"),
     "_gcount without _gsum"),
    ("le spelled +INF", om("# TYPE h histogram", 'h_bucket{le="+INF"} 0'), "infinity is written"),
    ("le NaN", om("# TYPE h histogram", 'h_bucket{le="NaN"} 0', 'h_bucket{le="+Inf"} 0'), "must be a number"),
    # MetricPoints of one Metric are not interleaved with another's
    ("interleaved label sets", om("# TYPE h histogram", 'h_bucket{x="1",le="+Inf"} 0', 'h_bucket{x="2",le="+Inf"} 0',
                                  'h_bucket{x="1",le="1"} 0'), "interleaved"),
    ("interleaved gauge label sets", om('a{x="1"} 1', 'a{x="2"} 1', 'a{x="1"} 2 5'), "interleaved"),
    # a family's name must not clash with another family's sample names, samples or not
    ("created gauge then counter", om("# TYPE c_created gauge", "# TYPE c counter"), "clashes"),
    ("counter then its created gauge", om("# TYPE c counter", "# TYPE c_created gauge"), "clashes"),
    ("histogram then its count gauge", om("# TYPE h histogram", "# TYPE h_count gauge"), "clashes"),
    # timestamps of one Metric
    ("timestamp on one sample of a point", om("# TYPE c counter", "c_total 1 10", "c_created 5"), "some do not"),
    ("timestamps going backwards", om("a 1 10", "a 2 9"), "backwards"),
    ("a point repeated without a timestamp", om("a 1", "a 2"), "duplicate sample"),
]


@pytest.mark.parametrize(("case", "text", "reason"), REJECTS, ids=[case for case, _, _ in REJECTS])
def test_strict_openmetrics_rejects(case: str, text: str, reason: str) -> None:
    with pytest.raises(ParseError, match=reason):
        parse(text, content_type=OM)
    assert parse(text, content_type=OM, strict=False).malformed  # lenient reports it instead


def test_several_points_of_one_series_with_increasing_timestamps() -> None:
    text = om("# TYPE a gauge", 'a{x="1"} 1 10', 'a{x="1"} 2 10.5', 'a{x="1"} 3 11', 'a{x="2"} 4 10')
    samples = parse(text, content_type=OM).samples
    assert [(s.value, s.timestamp) for s in samples] == [(1.0, 10.0), (2.0, 10.5), (3.0, 11.0), (4.0, 10.0)]


def test_a_point_repeated_at_the_same_timestamp_keeps_the_first() -> None:
    # spec: "the MetricPoint with the earliest timestamp MUST be used" for points equal after truncation
    samples = parse(om("a 1 0", "a 2 0", "a 3 0"), content_type=OM).samples
    assert [(s.value, s.timestamp) for s in samples] == [(1.0, 0.0)]


@pytest.mark.parametrize(("raw", "value"), [
    ("b\\\\a\\z", "b\\a\\z"), ("\\t", "\\t"), ("\\f\\\\", "\\f\\"), ("x\\n\\\"", 'x\n"'),
])
def test_escapes_the_grammar_allows_in_label_values(raw: str, value: str) -> None:
    # escaped-char =/ BS normal-char: an undefined escape is kept as written
    [sample] = parse(om("# TYPE c counter", f'c_total{{v="{raw}"}} 1'), content_type=OM).samples
    assert sample.label("v") == value


@pytest.mark.parametrize(("raw", "text"), [("he\\n\\\\l\\tp", "he\n\\l\\tp"), ("\\\\\"", '\\"'), ("\\foo", "\\foo")])
def test_escapes_in_help(raw: str, text: str) -> None:
    result = parse(om("# TYPE c counter", f"# HELP c {raw}", "c_total 1"), content_type=OM)
    assert result.families["c"].help == text


def test_valid_histogram_gauge_histogram_and_summary_points() -> None:
    text = om("# TYPE h histogram", 'h_bucket{le="0.5"} 1', 'h_bucket{le="+Inf"} 2', "h_count 2", "h_sum 0.7",
              "# TYPE n histogram", 'n_bucket{le="-1.0"} 1', 'n_bucket{le="+Inf"} 2',  # no _sum, so no _count
              "# TYPE g gaugehistogram", 'g_bucket{le="-2"} 1', 'g_bucket{le="+Inf"} 3', "g_gcount 3", "g_gsum -4",
              "# TYPE s summary", 's{quantile="0"} NaN', 's{quantile="1.0"} 3', "s_count 2", "s_sum 5")
    assert len(parse(text, content_type=OM).samples) == 14
