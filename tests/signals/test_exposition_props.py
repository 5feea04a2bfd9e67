"""Property tests of the exposition parser: it never fails in an unexpected way, and writing round-trips."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuremediate.signals.exposition import MetricFamily, ParseError, ParseResult, Sample, format, parse

OM = "application/openmetrics-text; version=1.0.0"
CONTENT_TYPES = (None, OM, "text/plain; version=0.0.4")
SETTINGS = settings(max_examples=150, deadline=None)


def comparable(samples: list[Sample]) -> list[tuple[object, ...]]:
    """Samples as tuples where NaN equals NaN (and exemplars, which 0.0.4 cannot carry, are left out)."""
    return [(s.name, s.labels, "NaN" if math.isnan(s.value) else s.value, s.timestamp) for s in samples]


def parse_or_error(text: str, content_type: str | None) -> ParseResult | None:
    try:
        return parse(text, content_type=content_type)
    except ParseError as err:
        assert err.line_no >= 0 and err.reason
        return None


# --- a grammar of near-valid documents --------------------------------------------------------------

# mostly valid pieces, with a few broken ones mixed in
names = st.sampled_from(["a", "b", "c", "c_total", "c_created", "h", "h_bucket", "h_count", "h_sum", "s",
                         "i_info", "g_gcount", "a:b", "d", "e", "f"]) | st.sampled_from(["1bad", "x-y"])
label_names = st.sampled_from(["l", "m", "n", "le", "quantile", "s"]) | st.sampled_from(["__name__", "9"])
raw_values = st.text(alphabet=st.sampled_from(['a', '"', "\\", "n", " ", "}", ",", "=", "é", "\r"]), max_size=6)
numbers = st.sampled_from(["1", "0", "-2.5", "NaN", "+Inf", "-Inf", "1e3", ".5"]) | st.sampled_from(
    ["1_0", "x", "0x1", ""])
stamps = st.sampled_from(["", "", " 1700000000123", " 1.5", " -3"]) | st.just(" abc")


@st.composite
def sample_lines(draw: st.DrawFn) -> str:
    pairs = draw(st.lists(st.tuples(label_names, raw_values), max_size=3))
    escape = draw(st.booleans())
    body = ",".join(
        f'{k}="{v.replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34)) if escape else v}"'
        for k, v in pairs
    )
    empty_braces: bool = draw(st.booleans())
    labels = "{" + body + "}" if pairs or empty_braces else ""
    exemplar = draw(st.sampled_from(["", "", "", ' # {t="1"} 1', " # {} 2 1.5", " # bad"]))
    return f"{draw(names)}{labels} {draw(numbers)}{draw(stamps)}{exemplar}"


descriptor_lines = st.one_of(
    st.builds("# TYPE {} {}".format, names, st.sampled_from(
        ["counter", "gauge", "histogram", "summary", "untyped", "unknown", "info", "stateset", "gaugehistogram",
         "bogus"])),
    st.builds("# HELP {} {}".format, names, raw_values),
    st.builds("# UNIT {} {}".format, names, st.sampled_from(["", "seconds", "bytes!"])),
    st.sampled_from(["# EOF", "", "# just a comment", "#", "  ", "# HELP", "# TYPE a"]),
)


def escaped(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


@st.composite
def valid_documents(draw: st.DrawFn) -> tuple[str, str | None]:
    """A document valid in the drawn format, built family by family."""
    om = draw(st.booleans())
    lines = []
    for fam in draw(st.lists(st.sampled_from(["a", "b", "c", "d_seconds"]), unique=True, max_size=4)):
        type_ = draw(st.sampled_from(["counter", "gauge", "histogram", "summary", "unknown" if om else "untyped"]))
        lines.append(f"# TYPE {fam} {type_}")
        if draw(st.booleans()):
            lines.append(f"# HELP {fam} {escaped(draw(st.text(max_size=8)))}".rstrip(" " if not om else ""))
        for series in draw(st.lists(st.text(max_size=6), unique=True, max_size=3)):
            label = f'l="{escaped(series)}"'
            stamp = draw(st.sampled_from(["", " 1.5" if om else " 1500"]))
            value = draw(st.sampled_from(["0", "3", "1.5e3", "+Inf"]))
            lines.extend(_family_lines(fam, type_, label, value, stamp, om))
    if om:
        lines.append("# EOF")
    return "\n".join(lines) + "\n", OM if om else draw(st.sampled_from([None, "text/plain"]))


def _family_lines(fam: str, type_: str, label: str, value: str, stamp: str, om: bool) -> list[str]:
    if type_ == "counter":
        return [f"{fam}{'_total' if om else ''}{{{label}}} {value}{stamp}"]
    if type_ == "histogram":
        return [f'{fam}_bucket{{{label},le="1"}} 1', f'{fam}_bucket{{{label},le="+Inf"}} 2',
                f"{fam}_count{{{label}}} 2", f"{fam}_sum{{{label}}} {value}"]
    if type_ == "summary":
        return [f'{fam}{{{label},quantile="0.5"}} {value}', f"{fam}_count{{{label}}} 2"]
    return [f"{fam}{{{label}}} {value}{stamp}"]


@st.composite
def documents(draw: st.DrawFn) -> tuple[str, str | None]:
    if draw(st.booleans()):
        text, content_type = draw(valid_documents())
    else:
        lines = draw(st.lists(st.one_of(sample_lines(), descriptor_lines), max_size=12))
        text = "\n".join(lines) + draw(st.sampled_from(["\n", ""]))
        content_type = draw(st.sampled_from(CONTENT_TYPES))
    if text and draw(st.booleans()):  # one random edit: the near-miss cases
        at = draw(st.integers(0, len(text) - 1))
        text = text[:at] + draw(st.sampled_from(['"', "\\", "\n", " ", "{", "", "#", "1"])) + text[at + 1:]
    return text, content_type


# --- properties ------------------------------------------------------------------------------------


@SETTINGS
@given(st.text(), st.sampled_from(CONTENT_TYPES))
def test_any_text_parses_or_raises_parse_error(text: str, content_type: str | None) -> None:
    parse_or_error(text, content_type)
    lenient = parse(text, content_type=content_type, strict=False)
    assert all(isinstance(s, Sample) for s in lenient.samples)


@SETTINGS
@given(valid_documents())
def test_valid_documents_parse_strictly(document: tuple[str, str | None]) -> None:
    text, content_type = document
    result = parse(text, content_type=content_type)
    assert len(result.samples) == sum(1 for line in text.split("\n") if line and not line.startswith("#"))


@SETTINGS
@given(documents())
def test_near_valid_documents_parse_or_raise_parse_error(document: tuple[str, str | None]) -> None:
    text, content_type = document
    strict = parse_or_error(text, content_type)
    lenient = parse(text, content_type=content_type, strict=False)
    if strict is not None:  # a document valid strictly is read the same leniently, with nothing skipped
        assert comparable(lenient.samples) == comparable(strict.samples)
        assert lenient.malformed == []


@SETTINGS
@given(documents(), st.booleans())
def test_parse_format_parse_keeps_the_samples(document: tuple[str, str | None], strict: bool) -> None:
    text, content_type = document
    try:
        first = parse(text, content_type=content_type, strict=strict)
    except ParseError:
        return
    again = parse(format(first))  # the written text is always valid 0.0.4
    assert comparable(again.samples) == comparable(first.samples)


# --- generated samples: format, then parse ---------------------------------------------------------

metric_names = st.from_regex(r"[a-zA-Z_:][a-zA-Z0-9_:]{0,12}", fullmatch=True)
valid_label_names = st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_]{0,8}", fullmatch=True).filter(
    lambda name: not name.startswith("__"))
label_values = st.text(st.characters(codec=None), max_size=12) | st.sampled_from(['"', "\\", "\n", '\\"', "\\n"])
values = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([1e-300, 5e-324, 1.7976931348623157e308,
                                                                          9223372036854775794.0, -0.0])
timestamps = st.none() | st.integers(-(2**52), 2**52).map(lambda ms: ms / 1000)


@st.composite
def generated_samples(draw: st.DrawFn) -> tuple[list[Sample], dict[str, MetricFamily]]:
    fams = draw(st.dictionaries(metric_names, st.sampled_from(["counter", "gauge", "untyped"]), max_size=4))
    families = {
        name: MetricFamily(name, type_, draw(st.text(max_size=10).filter(lambda h: h[:1] not in " \t")))
        for name, type_ in fams.items()
    }
    samples = []
    for _ in range(draw(st.integers(0, 8))):
        name = draw(st.sampled_from(sorted(families)) | metric_names) if families else draw(metric_names)
        labels = draw(st.dictionaries(valid_label_names, label_values, max_size=4))
        samples.append(Sample(name, tuple(sorted(labels.items())), draw(values), draw(timestamps)))
    return samples, families


@SETTINGS
@given(generated_samples())
def test_format_then_parse_gives_the_same_samples(generated: tuple[list[Sample], dict[str, MetricFamily]]) -> None:
    samples, families = generated
    result = parse(format(samples, families))
    assert comparable(result.samples) == comparable(samples)
    for name, fam in families.items():  # the HELP and TYPE of every family survive too
        assert result.families[name].type == fam.type
        assert result.families[name].help == fam.help
