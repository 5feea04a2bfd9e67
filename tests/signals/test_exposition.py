"""Table tests of the exposition parser: each spec rule, the lenient repairs, and real dcgm-exporter scrapes."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from gpuremediate.signals.exposition import (
    OPENMETRICS_100,
    PROMETHEUS_004,
    Exemplar,
    MetricFamily,
    ParseError,
    Sample,
    format,
    parse,
)

DATA = Path(__file__).resolve().parent / "data" / "dcgm-exporter"
OM = "application/openmetrics-text; version=1.0.0; charset=utf-8"
TEXT = "text/plain; version=0.0.4; charset=utf-8"


def scrape(name: str) -> str:
    return (DATA / name).read_text(encoding="utf-8")


# --- accepted input -------------------------------------------------------------------------------


def test_004_sample_with_labels_escapes_and_timestamp() -> None:
    text = 'm{b="x\\"y",a="back\\\\slash\\nnl"} 1.5e3 1700000000123\n'
    [sample] = parse(text).samples
    assert sample == Sample("m", (("a", "back\\slash\nnl"), ("b", 'x"y')), 1500.0, 1700000000.123)


def test_004_whitespace_rules_of_the_go_parser() -> None:
    text = '  m { a = "1" , b="2", }\t 7 \t\n\n   \n# a plain comment\n#HELP m text\n'
    result = parse(text)
    assert [(s.name, s.labels, s.value) for s in result.samples] == [("m", (("a", "1"), ("b", "2")), 7.0)]
    assert result.families["m"].help == "text"


@pytest.mark.parametrize(
    ("token", "expected"),
    [("NaN", math.nan), ("+Inf", math.inf), ("-Inf", -math.inf), ("Inf", math.inf), ("-0.5e-3", -0.0005),
     (".5", 0.5), ("9223372036854775794", 9.223372036854775794e18)],
)
def test_004_special_and_edge_values(token: str, expected: float) -> None:
    [sample] = parse(f"m {token}\n").samples
    assert sample.value == expected or (math.isnan(expected) and math.isnan(sample.value))


def test_004_families_help_type_and_suffixes() -> None:
    text = (
        "# HELP h Latency.\\nSecond line \\\\ done\n# TYPE h histogram\n"
        'h_bucket{le="0.5"} 1\nh_bucket{le="+Inf"} 2\nh_count 2\nh_sum 0.7\n'
        '# TYPE s summary\ns{quantile="0.9"} 3\ns_count 1\ns_sum 3\n# TYPE c COUNTER\nc 4\n'
    )
    result = parse(text)
    assert result.format == PROMETHEUS_004
    assert result.families["h"] == MetricFamily("h", "histogram", "Latency.\nSecond line \\ done")
    assert result.families["s"].type == "summary"
    assert result.families["c"].type == "counter"
    assert [s.name for s in result.samples] == ["h_bucket", "h_bucket", "h_count", "h_sum", "s", "s_count",
                                                "s_sum", "c"]
    assert set(result.families) == {"h", "s", "c"}


def test_format_detection() -> None:
    om_text = "# TYPE c counter\nc_total 1\n# EOF\n"
    assert parse(om_text).format == OPENMETRICS_100
    assert parse("c 1\n").format == PROMETHEUS_004
    # the content type wins over sniffing: as 0.0.4, '# EOF' is a comment and c_total is untyped
    assert parse(om_text, content_type=TEXT).families["c_total"].type == "untyped"
    with pytest.raises(ParseError, match="missing '# EOF'"):
        parse("c_total 1\n", content_type=OM)
    with pytest.raises(ParseError, match="unsupported content type"):
        parse("c 1\n", content_type="application/json")


def test_openmetrics_full_document() -> None:
    text = (
        "# TYPE req counter\n# UNIT req \n# HELP req Requests \\\"served\\\".\n"
        'req_total{code="200"} 10 1.25 # {trace_id="abc"} 1 1.5\nreq_created{code="200"} 1.0 1.25\n'
        "# TYPE lat_seconds histogram\n# UNIT lat_seconds seconds\n"
        'lat_seconds_bucket{le="0.1"} 1 # {trace_id="x"} 0.05\nlat_seconds_bucket{le="+Inf"} 3\n'
        "lat_seconds_count 3\nlat_seconds_sum 1.5\n"
        "# TYPE build info\nbuild_info{version=\"1.0\"} 1\n"
        '# TYPE mode stateset\nmode{mode="a"} 1\nmode{mode="b"} 0\n'
        "# TYPE q gaugehistogram\nq_bucket{le=\"+Inf\"} 4\nq_gcount 4\nq_gsum 2\n"
        "untyped_thing 5\n# EOF"
    )
    result = parse(text, content_type=OM)
    first = result.samples[0]
    assert first == Sample("req_total", (("code", "200"),), 10.0, 1.25, Exemplar((("trace_id", "abc"),), 1.0, 1.5))
    assert result.families["req"] == MetricFamily("req", "counter", 'Requests "served".', "")
    assert result.families["lat_seconds"].unit == "seconds"
    assert result.families["untyped_thing"].type == "unknown"
    assert len(result.samples) == 13


# --- rejected input: OpenMetrics ----------------------------------------------------------------

OM_REJECTS = [
    ("missing EOF", "a 1\n", 1, "missing '# EOF'"),
    ("content after EOF", "a 1\n# EOF\nb 2\n", 3, "content after '# EOF'"),
    ("blank line", "a 1\n\n# EOF\n", 2, "blank lines"),
    ("duplicate label names", 'a{x="1",x="2"} 1\n# EOF\n', 1, "duplicate label name 'x'"),
    ("interleaved families", "a 1\nb 1\na 2\n# EOF\n", 3, "interleaved"),
    ("descriptor of an earlier family", "# TYPE a gauge\na 1\nb 1\n# HELP a x\n# EOF\n", 4, "interleaved"),
    ("counter without _total", "# TYPE c counter\nc 1\n# EOF\n", 2, "must be named 'c_total'"),
    ("TYPE after samples", "# HELP a x\na 1\n# TYPE a gauge\n# EOF\n", 3, "after its samples"),
    ("second TYPE", "# TYPE a gauge\n# TYPE a gauge\n# EOF\n", 2, "second TYPE"),
    ("unknown type", "# TYPE a untyped\n# EOF\n", 1, "unknown metric type 'untyped'"),
    ("unit not a suffix", "# TYPE a gauge\n# UNIT a seconds\n# EOF\n", 2, "must end in '_seconds'"),
    ("invalid unit characters", "# UNIT a_s- s-\n# EOF\n", 1, "invalid metric name"),
    ("unit on info", "# TYPE x_b info\n# UNIT x_b b\n# EOF\n", 2, "cannot have a unit"),
    ("double space", "a  1\n# EOF\n", 1, "single spaces"),
    ("trailing comma", 'a{x="1",} 1\n# EOF\n', 1, "trailing comma"),
    ("stray comment", "# hello\n# EOF\n", 1, "not an OpenMetrics descriptor"),
    ("exemplar on a gauge", '# TYPE g gauge\ng 1 # {a="b"} 1\n# EOF\n', 2, "exemplars are not allowed"),
    ("exemplar too long", f'# TYPE c counter\nc_total 1 # {{a="{"x" * 130}"}} 1\n# EOF\n', 2, "exceed 128"),
    ("negative counter", "# TYPE c counter\nc_total -1\n# EOF\n", 2, "non-negative"),
    ("bucket without le", "# TYPE h histogram\nh_bucket 1\n# EOF\n", 2, "no 'le' label"),
    ("histogram without +Inf", '# TYPE h histogram\nh_bucket{le="1"} 1\n# EOF\n', 2, 'no le="\\+Inf"'),
    ("non-cumulative buckets", '# TYPE h histogram\nh_bucket{le="1"} 2\nh_bucket{le="+Inf"} 1\n# EOF\n', 3,
     "not cumulative"),
    ("count differs from +Inf", '# TYPE h histogram\nh_bucket{le="+Inf"} 2\nh_count 3\n# EOF\n', 3, "differs"),
    ("info value not 1", "# TYPE b info\nb_info 2\n# EOF\n", 2, "value 1"),
    ("stateset without its label", "# TYPE s stateset\ns 1\n# EOF\n", 2, "needs a label named 's'"),
    ("duplicate sample", "a 1\na 2\n# EOF\n", 2, "duplicate sample"),
    ("reserved label", 'a{__x="1"} 1\n# EOF\n', 1, "reserved"),
    ("float timestamp out of range", "a 1 1e999\n# EOF\n", 1, "out of range"),
    ("HELP without a space", "# HELP a\n# EOF\n", 1, "needs a space"),
]


@pytest.mark.parametrize(("case", "text", "line_no", "reason"), OM_REJECTS, ids=[c[0] for c in OM_REJECTS])
def test_openmetrics_rejects(case: str, text: str, line_no: int, reason: str) -> None:
    with pytest.raises(ParseError, match=reason) as caught:
        parse(text, content_type=OM)
    assert caught.value.line_no == line_no
    assert str(caught.value).startswith(f"line {line_no}: ")


# --- rejected input: 0.0.4 -----------------------------------------------------------------------

PROM_REJECTS = [
    ("name starting with a digit", "1a 1\n", 1, "invalid metric name"),
    ("name with a dash", "a-b 1\n", 1, "invalid character '-'"),
    ("invalid label name", 'a{1x="1"} 1\n', 1, "invalid label name"),
    ("unterminated label value", 'a{x="1} 1\n', 1, "not terminated"),
    ("label set not closed", 'a{x="1" 1\n', 1, "expected ',' or '}'"),
    ("label value without quotes", "a{x=1} 1\n", 1, "must start with a double quote"),
    ("bad float", "a 1.2.3\n", 1, "invalid sample value"),
    ("hex float", "a 0x10\n", 1, "invalid sample value"),
    ("underscore in number", "a 1_000\n", 1, "invalid sample value"),
    ("missing value", "a\n", 1, "has no value"),
    ("float timestamp", "a 1 1.5\n", 1, "integer milliseconds"),
    ("extra token", "a 1 2 3\n", 1, "after the timestamp"),
    ("duplicate HELP", "# HELP a x\n# HELP a y\n", 2, "second HELP"),
    ("duplicate TYPE", "# TYPE a gauge\n# TYPE a counter\n", 2, "second TYPE"),
    ("TYPE after samples", "a 1\n# TYPE a gauge\n", 2, "TYPE after its samples"),
    ("unknown type", "# TYPE a gaugehistogram\n", 1, "unknown metric type"),
    ("invalid name in HELP", "# HELP a-b text\n", 1, "invalid metric name in HELP"),
    ("bad escape in label", 'a{x="\\d"} 1\n', 1, "invalid escape sequence '\\\\d'"),
    ("bad escape in HELP", "# HELP a x\\ty\n", 1, "invalid escape sequence"),
    ("duplicate label names", 'a{x="1",x="1"} 1\n', 1, "duplicate label name"),
    ("__name__ label", 'a{__name__="b"} 1\n', 1, "reserved"),
    ("histogram bucket without le", "# TYPE h histogram\nh_bucket 1\n", 2, "no 'le' label"),
    ("summary quantile not a float", '# TYPE s summary\ns{quantile="x"} 1\n', 2, "'quantile' label value"),
    ("last line without line feed", "a 1\nb 2", 2, "does not end with a line feed"),
    ("timestamp beyond int64", f"a 1 {2**63}\n", 1, "int64"),
]


@pytest.mark.parametrize(("case", "text", "line_no", "reason"), PROM_REJECTS, ids=[c[0] for c in PROM_REJECTS])
def test_prometheus_004_rejects(case: str, text: str, line_no: int, reason: str) -> None:
    with pytest.raises(ParseError, match=reason) as caught:
        parse(text)
    assert caught.value.line_no == line_no


@pytest.mark.parametrize(("case", "text", "line_no", "reason"), PROM_REJECTS, ids=[c[0] for c in PROM_REJECTS])
def test_lenient_records_instead_of_raising(case: str, text: str, line_no: int, reason: str) -> None:
    result = parse(text, strict=False)
    assert [n for n, _ in result.malformed] == [line_no] or case in LENIENT_REPAIRS
    if case in LENIENT_REPAIRS:
        assert result.malformed == []


# what lenient mode repairs or keeps rather than skips: raw backslashes in exporter-written values, and
# a last line without a line feed (read, as prometheus_client and Prometheus read it)
LENIENT_REPAIRS = {"bad escape in label", "bad escape in HELP", "last line without line feed"}


# --- lenient mode: what exporters really emit ------------------------------------------------------


def test_lenient_keeps_unescaped_quotes_and_backslashes_of_dcgm_exporter() -> None:
    text = (
        'DCGM_FI_DEV_XID_ERRORS{gpu="0",err_msg="Graphics "SM" Exception",path="C:\\temp\\x",'
        'hostname="node-a"} 13\n'
    )
    [sample] = parse(text, strict=False).samples
    assert sample.label("err_msg") == 'Graphics "SM" Exception'
    assert sample.label("path") == "C:\\temp\\x"
    assert sample.label("hostname") == "node-a"
    assert sample.value == 13.0
    with pytest.raises(ParseError):
        parse(text)


def test_lenient_skips_unreadable_lines_and_keeps_the_rest() -> None:
    text = 'ok 1\nbroken{x="1 2\n# TYPE ok counter\nalso_ok 2\r\npartial 3'
    result = parse(text, strict=False)
    assert [(s.name, s.value) for s in result.samples] == [("ok", 1.0), ("also_ok", 2.0), ("partial", 3.0)]
    assert [n for n, _ in result.malformed] == [2, 3]
    assert "not terminated" in result.malformed[0][1]


# NVIDIA's dcgm-exporter README sample writes `{gpu="0" UUID="..."}` without the comma (hand-made line
# after it). Taking the rest as gpu's value would garble every later label and lose the UUID.
@pytest.mark.parametrize("labels", ['gpu="0" UUID="GPU-a",Hostname="n"', 'gpu="0",UUID="GPU-a"\tHostname="n"',
                                    'gpu="0",UUID="GPU-a" Hostname = "n"'])
def test_lenient_rejects_a_label_set_with_a_missing_comma(labels: str) -> None:
    text = f"DCGM_FI_DEV_GPU_TEMP{{{labels}}} 42\nDCGM_FI_DEV_GPU_TEMP{{gpu=\"1\",UUID=\"GPU-b\"}} 43\n"
    result = parse(text, strict=False)
    assert [(s.label("gpu"), s.label("UUID")) for s in result.samples] == [("1", "GPU-b")]
    [(line_no, reason)] = result.malformed
    assert line_no == 1 and "missing ','" in reason
    with pytest.raises(ParseError):
        parse(text)


def test_lenient_raw_quotes_followed_by_text_are_still_kept() -> None:
    text = 'DCGM_FI_DEV_XID_ERRORS{gpu="0",err_msg="a "b" c=d",Hostname="n"} 13\n'
    [sample] = parse(text, strict=False).samples
    assert sample.label("err_msg") == 'a "b" c=d' and sample.label("Hostname") == "n"


SCRAPES_WITH_SAMPLES = ["scrape-L4-default.prom", "scrape-A100-vgpu-xid-labels.prom"]


@pytest.mark.parametrize("name", SCRAPES_WITH_SAMPLES)
def test_lenient_reads_a_real_scrape_with_crlf_line_ends_like_the_original(name: str) -> None:
    original = parse(scrape(name), strict=False)
    crlf = parse(scrape(name).replace("\n", "\r\n"), strict=False)
    assert crlf.malformed == []
    assert crlf.samples == original.samples and crlf.families == original.families
    assert any(fam.type == "gauge" for fam in crlf.families.values())  # the TYPE lines were read


@pytest.mark.parametrize("name", SCRAPES_WITH_SAMPLES)
def test_lenient_keeps_the_last_line_of_a_real_scrape_without_its_line_feed(name: str) -> None:
    original = parse(scrape(name), strict=False)
    cut = parse(scrape(name).rstrip("\n"), strict=False)
    assert cut.malformed == [] and cut.samples == original.samples


def test_lenient_openmetrics_with_crlf_finds_its_eof() -> None:
    text = "# TYPE a gauge\r\na 1\r\n# EOF\r\n"
    result = parse(text, strict=False)
    assert result.format == OPENMETRICS_100 and result.malformed == [] and result.families["a"].type == "gauge"


@pytest.mark.parametrize(("line", "reason"), [
    ('a{x="1"} not a number\n', "invalid sample value 'not'"),
    ('a{x="1"} 1 two three\n', "invalid timestamp 'two'"),
    ("a 1 2 3\n", "unexpected text after the timestamp: '3'"),
])
def test_the_first_bad_field_is_the_one_named(line: str, reason: str) -> None:
    with pytest.raises(ParseError, match=re.escape(reason)):
        parse(line)
    assert reason in parse(line, strict=False).malformed[0][1]


def test_lenient_openmetrics_tolerates_cosmetics_but_reports_truncation() -> None:
    text = '# TYPE a gauge\na 1\n\n# stray\nb 1\na{x="2"} 2\n'
    result = parse(text, content_type=OM, strict=False)
    assert [(s.name, s.value) for s in result.samples] == [("a", 1.0), ("b", 1.0), ("a", 2.0)]
    assert result.malformed == [(6, "missing '# EOF' (OpenMetrics ends with it; the exposition may be truncated)")]


def test_lenient_never_raises_for_unknown_content_type() -> None:
    result = parse("a 1\n", content_type="text/html", strict=False)
    assert [s.name for s in result.samples] == ["a"]
    assert result.malformed[0][0] == 0


def test_non_text_input_raises_type_error() -> None:
    with pytest.raises(TypeError, match="bytes"):
        parse(b"a 1\n", strict=False)  # type: ignore[arg-type]


# --- the three real scrapes ------------------------------------------------------------------------

SCRAPES = {"scrape-L4-default.prom": 23, "scrape-A100-vgpu-xid-labels.prom": 12, "exporter-test-response.prom": 1}


@pytest.mark.parametrize(("name", "count"), SCRAPES.items())
def test_real_scrapes_parse_cleanly_as_004_strict_and_lenient(name: str, count: int) -> None:
    strict = parse(scrape(name), content_type=TEXT)
    lenient = parse(scrape(name), strict=False)
    assert len(strict.samples) == count
    assert lenient.malformed == []
    assert lenient.samples == strict.samples


def test_real_scrape_values_and_quirks() -> None:
    l4 = parse(scrape("scrape-L4-default.prom"))
    power = next(s for s in l4.samples if s.name == "DCGM_FI_DEV_POWER_USAGE")
    assert power.value == 16.365 and power.label("UUID") == "GPU-c2f76b33-7953-256e-8f33-1343419b1a1c"
    assert l4.families["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"].type == "counter"
    test = parse(scrape("exporter-test-response.prom"))
    assert test.families["TEST_METRIC"].help == ""  # "# HELP TEST_METRIC " (trailing space): no text
    assert test.samples[0].label("hostname") == "testhost" and test.samples[0].label("pci_bus_id") == ""


# Which real scrape fails strictly, and why: all three are valid 0.0.4; none is valid OpenMetrics.
STRICT_OM_FAILURES = {
    "scrape-L4-default.prom": (1, "blank lines are not allowed"),  # the file opens with an empty line
    # a counter named like an OpenMetrics sample: its samples would have to be ..._TOTAL_total
    "scrape-A100-vgpu-xid-labels.prom": (33, "must be named 'DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL_total'"),
    "exporter-test-response.prom": (3, "missing '# EOF'"),
}


@pytest.mark.parametrize(("name", "failure"), STRICT_OM_FAILURES.items())
def test_real_scrapes_are_not_openmetrics(name: str, failure: tuple[int, str]) -> None:
    line_no, reason = failure
    with pytest.raises(ParseError, match=reason) as caught:
        parse(scrape(name), content_type=OM)
    assert caught.value.line_no == line_no


# --- writing -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", SCRAPES)
def test_format_round_trips_real_scrapes(name: str) -> None:
    first = parse(scrape(name))
    again = parse(format(first))
    assert again.samples == first.samples
    assert dict(again.families) == dict(first.families)


def test_format_writes_openmetrics_only_parts_as_004() -> None:
    text = (
        '# TYPE c counter\n# HELP c Help.\nc_total{a="1"} 3 1.5 # {t="x"} 1\nc_created 9\n'
        "# TYPE i info\ni_info 1\n# EOF\n"
    )
    written = format(parse(text))
    assert written == (
        "# HELP c_total Help.\n# TYPE c_total counter\n"
        'c_total{a="1"} 3 1500\n# TYPE c_created gauge\nc_created 9\n# TYPE i_info gauge\ni_info 1\n'
    )


def test_format_escapes_and_special_values() -> None:
    samples = [Sample("m", (("a", 'q"\\\n'),), math.nan), Sample("m", (("a", "2"),), -math.inf, 0.001)]
    written = format(samples, {"m": MetricFamily("m", "gauge", "two\nlines\\")})
    assert written == (
        "# HELP m two\\nlines\\\\\n# TYPE m gauge\n" 'm{a="q\\"\\\\\\n"} NaN\nm{a="2"} -Inf 1\n'
    )


def test_format_rejects_unwritable_names() -> None:
    with pytest.raises(ValueError, match="invalid metric name 'a b'"):
        format([Sample("a b", (), 1.0)])
    with pytest.raises(ValueError, match="invalid label name '1x'"):
        format([Sample("a", (("1x", "v"),), 1.0)])


@pytest.mark.parametrize("labels", ['l=","', 'a=",",b=","', 'a="=",b=""', 'a="x=",b="y"'])
def test_values_that_look_like_separators_are_read_whole(labels: str) -> None:
    """Found by hypothesis: a value starting with ',' or ending with '=' must not split the label set."""
    text = f"m{{{labels}}} 1\n"
    expected = tuple(sorted((k, v) for k, v in re.findall(r'(\w+)="([^"]*)"', labels)))
    for strict in (True, False):
        assert parse(text, strict=strict).samples[0].labels == expected
