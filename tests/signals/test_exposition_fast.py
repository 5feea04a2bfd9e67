"""The 0.0.4 parser's fast loop reads every document exactly as its reference loop does (issue 27).

``_Prometheus004Parser.run`` inlines the common cases (HELP / TYPE lines, ``name{labels} value`` lines)
and hands anything else to the methods ``run_reference`` calls line by line. Both must give the same
samples, families and malformed lines, or raise the same ParseError, in strict and lenient mode; and
``_plain_labels`` (the label decoder for plain label texts) must agree with the general decoder.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gpuremediate.signals import exposition
from gpuremediate.signals.exposition import ParseError, ParseResult, Sample, parse

DATA = Path(__file__).resolve().parent / "data" / "dcgm-exporter"
# the project's reference data (bench/run.py reads it too); its scrapes are checked where it is present
SHARED = Path(os.environ.get("GPUREMEDIATE_SHARED_DATA", Path(__file__).resolve().parents[3] / "shared" / "data"))
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
SETTINGS = settings(max_examples=400, deadline=None)

Outcome = tuple[object, ...]


def outcome(read: ParseResult | ParseError) -> Outcome:
    if isinstance(read, ParseError):
        return ("error", read.line_no, read.reason)
    samples = [(type(s), s.name, s.labels, "NaN" if math.isnan(s.value) else s.value, s.timestamp, s.exemplar)
               for s in read.samples]
    return ("ok", samples, dict(read.families), read.malformed, read.format)


def fast(text: str, strict: bool) -> Outcome:
    try:
        return outcome(parse(text, content_type=CONTENT_TYPE, strict=strict))
    except ParseError as err:
        return outcome(err)


def reference(text: str, strict: bool) -> Outcome:
    """What parse() does for a 0.0.4 content type, through the reference loop."""
    if not strict and "\r" in text:
        text = text.replace("\r\n", "\n")
    try:
        return outcome(exposition._Prometheus004Parser(strict).run_reference(text))
    except ParseError as err:
        return outcome(err)


def check(text: str) -> None:
    for strict in (True, False):
        assert fast(text, strict) == reference(text, strict), (strict, text)


# --- a grammar of dcgm-exporter-like documents, valid and broken ------------------------------------

metric_names = st.sampled_from(["DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_XID_ERRORS", "a", "a:b", "h", "h_bucket",
                                "h_count", "h_sum", "s", "s_count", "c_total", "__x"]) | st.sampled_from(
    ["1bad", "x-y", "é", ""])
label_names = st.sampled_from(["gpu", "UUID", "Hostname", "err_msg", "le", "quantile", "_x"]) | st.sampled_from(
    ["__name__", "__x", "9", "a-b", "", "é"])
value_chars = st.sampled_from(['a', "0", '"', "\\", "n", " ", "\t", "}", "{", ",", "=", "é", "\r", "-", "#"])
raw_values = st.text(alphabet=value_chars, max_size=6)
numbers = st.sampled_from(["1410", "0", "42.000000", "-2.5", "1e3", ".5", "1.", "+1", "NaN", "+Inf", "-Inf",
                           "9223372036854775794"]) | st.sampled_from(
    ["1_0", "x", "0x1", "", "1e", "--1", "\u0661", "1.2.3", "inf", "nan", "+", "."])
stamps = st.sampled_from(["", "", "", " 1700000000123", " -3", " 1.5", " abc", "  12", " 99999999999999999999"])
separators = st.sampled_from(["=", "=", "=", " = ", "= "])
joins = st.sampled_from([",", ",", ",", ", ", ",,", ""])


@st.composite
def sample_lines(draw: st.DrawFn) -> str:
    pairs = draw(st.lists(st.tuples(label_names, raw_values), max_size=4))
    if draw(st.booleans()):  # mostly well-formed, the rest broken by the drawn pieces
        body = ",".join(f'{k}="{v.replace(chr(92), "").replace(chr(34), "")}"' for k, v in pairs)
    else:
        body = draw(joins).join(f'{k}{draw(separators)}"{v}"' for k, v in pairs) + draw(
            st.sampled_from(["", "", ",", " ", ", "]))
    labels = "{" + body + "}" if pairs or draw(st.booleans()) else ""
    space = draw(st.sampled_from([" ", " ", " ", "  ", "\t", ""]))
    line = f"{draw(metric_names)}{labels}{space}{draw(numbers)}{draw(stamps)}"
    return line + draw(st.sampled_from(["", "", "", "\r", " "]))


comment_lines = st.one_of(
    st.builds("# TYPE {} {}".format, metric_names, st.sampled_from(
        ["gauge", "counter", "histogram", "summary", "untyped", "GAUGE", "gauge ", "bogus", ""])),
    st.builds("# HELP {} {}".format, metric_names, raw_values),
    st.sampled_from(["# HELP a", "# TYPE a", "#HELP a b", "# HELP  a b", "#  TYPE a gauge", "# a comment", "#",
                     "", " ", "  # HELP a b", "# HELP a  b", "# TYPE a\tgauge", "# HELP a \\", "# EOF"]),
)


@st.composite
def documents(draw: st.DrawFn) -> str:
    lines = draw(st.lists(st.one_of(sample_lines(), comment_lines), max_size=10))
    text = "\n".join(lines) + draw(st.sampled_from(["\n", "\n", "", "\r\n"]))
    if text and draw(st.booleans()):  # one random edit
        at = draw(st.integers(0, len(text) - 1))
        text = text[:at] + draw(st.sampled_from(['"', "\\", "\n", " ", "{", "}", "", "#", "1", ","])) + text[at + 1:]
    return text


@SETTINGS
@given(documents())
@example(text='1bad{gpu="",gpu="",gpu="",gpu=""} }410\n')  # a bad name and duplicate labels: the name first
def test_the_fast_loop_reads_documents_as_the_reference_loop_does(text: str) -> None:
    check(text)


@SETTINGS
@given(st.text(alphabet=st.sampled_from('ab_=",{}\\ 1#\n\t:.e+-'), max_size=40))
def test_the_fast_loop_agrees_on_any_text(text: str) -> None:
    check(text)


TRICKY = [
    "a 1\n# TYPE a gauge\n",  # TYPE after samples
    "# TYPE a gauge\n# TYPE a counter\na 1\n",  # a second TYPE
    "# HELP a x\n# HELP a y\na 1\n",  # a second HELP
    "# HELP a x\\ny \\\\ \\d\na 1\n",  # escapes in HELP
    "# HELP a x\\\n",  # a lone backslash at the end of HELP
    "# TYPE a GAUGE\n# TYPE b gauge \n# TYPE c bogus\na 1\nb 2\n",
    "# HELP a  two spaces\n# HELP\tb x\n# HELP c\n#  TYPE d gauge\n",
    "# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_bucket 2\nh_bucket{le=\"x\"} 3\nh_count 3\nh 4\n",
    "# TYPE s summary\ns{quantile=\"0.5\"} 1\ns 2\ns_count 2\ns_sum 1\n",
    "a{b=\"1\"} 1\na{b=\"1\"} 2\na{b=\"1\",} 3\na{ b=\"1\"} 4\n",
    "a{b=\"1\"} 1 1700000000123\na{b=\"1\"}  2\na{b=\"1\"} 3 99999999999999999999\n",
    "a{b=\"x\\\\d\"} 1\na{b=\"x\\\"\"} 2\na{b=\"x\"y\"} 3\na{b=\"x\"c=\"y\"} 4\n",
    "a{__name__=\"x\"} 1\na{b=\"1\",b=\"2\"} 2\na{__b=\"1\"} 3\n",
    "a NaN\nb +Inf\nc -Inf\nd 1_0\ne \u0661\nf 0x1\ng 1e\nh .\ni\nj 1\r\nk{} 1\n",
    "a{b=\"}\"} 1\na{b=\"{\"} 2\na{b=\"1\"}1\na{b=\"1\"} 1\t\n",
    "a 1\n# TYPE a_count gauge\na_count 1\n# TYPE a summary\n",
    "a 1\nb 2",  # no final line feed
    "a 1\n  \n  # HELP a x\n\ta 2\n",
]


@pytest.mark.parametrize("text", TRICKY)
def test_tricky_documents_read_alike(text: str) -> None:
    check(text)


def real_lines() -> list[str]:
    lines: list[str] = []
    for path in sorted(DATA.glob("*.prom")):
        lines.extend(path.read_text(encoding="utf-8").splitlines())
    return lines


@pytest.mark.parametrize("path", sorted(DATA.glob("*.prom")), ids=lambda path: path.name)
def test_the_real_scrapes_read_alike(path: Path) -> None:
    check(path.read_text(encoding="utf-8"))
    read = parse(path.read_text(encoding="utf-8"), content_type=CONTENT_TYPE, strict=False)
    assert read.samples and not read.malformed
    assert all(type(sample) is Sample for sample in read.samples)


def real_scrapes() -> list[Path]:
    """Every exporter scrape in the tests' data and in the reference data (where it is present)."""
    shared = sorted(SHARED.rglob("*.prom")) if SHARED.is_dir() else []
    return sorted(DATA.glob("*.prom")) + shared


@pytest.mark.parametrize("path", real_scrapes(), ids=str)
def test_every_real_scrape_reads_alike_in_both_loops_and_both_modes(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    check(text)
    assert fast(text.replace("\n", "\r\n"), False) == fast(text, False)  # CRLF lines read alike (lenient)


@pytest.mark.parametrize("path", real_scrapes(), ids=str)
def test_every_real_scrape_gives_prometheus_clients_samples(path: Path) -> None:
    """The samples bench/run.py times are the ones prometheus_client's parser reads (where it is installed)."""
    parser = pytest.importorskip("prometheus_client.parser")
    text = path.read_text(encoding="utf-8")
    ours = parse(text, content_type=CONTENT_TYPE, strict=False)
    mine = sorted((s.name, s.labels, s.value) for s in ours.samples)
    names = {name for name, _, _ in mine}
    # prometheus_client names a 0.0.4 counter's samples <name>_total; undo it to compare (as bench/run.py does)
    theirs = sorted((s.name if s.name in names else s.name.removesuffix("_total"), tuple(sorted(s.labels.items())),
                     float(s.value)) for family in parser.text_string_to_metric_families(text) for s in family.samples)
    assert mine == theirs and not ours.malformed


def test_families_are_made_when_first_read_and_read_like_a_mapping() -> None:
    read = parse("# HELP a x\n# TYPE a gauge\na 1\nb 2\n")
    families = read.families
    assert families.frozen is None  # type: ignore[attr-defined]  # nothing made yet
    assert dict(families) == {"a": exposition.MetricFamily("a", "gauge", "x"), "b": exposition.MetricFamily(
        "b", "untyped")}
    assert "a" in families and "c" not in families and families.get("c") is None and len(families) == 2
    assert families == parse("# HELP a x\n# TYPE a gauge\na 3\nb 4\n").families == dict(families)
    assert families["a"] is parse("# HELP a x\n# TYPE a gauge\n").families["a"]  # shared between scrapes
    with pytest.raises(TypeError):
        families["c"] = exposition.MetricFamily("c", "gauge")  # type: ignore[index]
    with pytest.raises(TypeError):
        hash(families)


def test_one_character_corruptions_of_real_lines_read_alike() -> None:
    """Every deletion, and a replacement or insertion of a telling character, anywhere in each distinct
    line shape of the real scrapes (a HELP and TYPE line, a sample line per label set)."""
    picked: dict[str, str] = {}
    for line in real_lines():
        key = line[:6] if line.startswith("#") else line[line.find("{"):line.rfind("}")]
        picked.setdefault(key, line)
    for line in picked.values():
        for i in range(len(line) + 1):
            variants = {line[:i] + line[i + 1:]}
            for char in '"{}= \\,':
                variants.add(line[:i] + char + line[i:])
                variants.add(line[:i] + char + line[i + 1:])
            for variant in variants:
                check(f"# TYPE DCGM_FI_DEV_GPU_TEMP gauge\n{variant}\n{line}\n")


# --- the plain label decoder ------------------------------------------------------------------------


def general_labels(text: str, strict: bool) -> tuple[object, ...] | None:
    """What the 0.0.4 parser makes of a label text without ``_plain_labels``: labels, an error, or None
    (neither the fast pattern nor the scanner takes it as a whole label set). A text with blanks between
    its labels (``a="1", b="2"``) is the scanner's (``scan_labels``, as the reference loop reads it)."""
    parser = exposition._Prometheus004Parser(strict)
    if exposition._LABELS_004.match(text) is None:
        try:
            pairs, end = parser.scan_labels("{" + text + "}", 1, False)
            return ("ok", parser.checked_labels(pairs, False)) if end == len(text) + 2 else None
        except exposition._LineError as err:
            return ("error", err.reason)
    pairs = exposition._decode_pairs(text)
    try:
        if "\\" in text:
            pairs = [(key, parser.unescape(value)) for key, value in pairs]
        return ("ok", parser.checked_labels(pairs, False))
    except exposition._LineError as err:
        return ("error", err.reason)


label_texts = st.one_of(
    st.lists(st.tuples(label_names, raw_values), max_size=5).map(
        lambda pairs: ",".join(f'{k}="{v}"' for k, v in pairs)),
    st.text(alphabet=st.sampled_from('ab_="=,\\ 9'), max_size=16),
)


@SETTINGS
@given(label_texts, st.sampled_from(["", ","]))
def test_plain_labels_agree_with_the_general_decoder(text: str, trailing: str) -> None:
    text += trailing
    plain = exposition._plain_labels(text)
    if plain is None:
        return
    assert "\\" not in text
    for strict in (True, False):
        assert general_labels(text, strict) == ("ok", plain), text
    assert plain == exposition._Prometheus004Parser(True).labels_of(text, False)


def test_plain_labels_of_the_real_scrapes_are_taken() -> None:
    for line in real_lines():
        if "{" in line and not line.startswith("#"):
            text = line[line.find("{") + 1:line.rfind("}")]
            assert exposition._plain_labels(text) == general_labels(text, True)[1]  # type: ignore[index]


def test_plain_labels_leave_the_rest_to_the_general_path() -> None:
    for text in ('a="1",a="2"', '__name__="x"', '__a="x"', 'a="x\\"y"', 'a="1"b="2"', 'a="1",,b="2"', ",",
                 'a="1', 'a="x"y"', '9="1"', 'a="1",b="2",,', 'a=""""', 'a="1" b="2"', 'a="1", a="2"', " ",
                 'a="1",\n b="2"'):
        assert exposition._plain_labels(text) is None, text
    assert exposition._plain_labels("") == ()
    assert exposition._plain_labels('b="2",a="1",') == (("a", "1"), ("b", "2"))


# dcgm-exporter's README quickstart sample (and older exporters) write ", " between labels: 0.0.4 allows blanks
# around names, '=' and commas, and such a label set stays on the fast path (issue 45)
README_LABELS = 'gpu="0", UUID="GPU-604ac76c-d9cf-fef3-62e9-d92044ab6e52",container="",namespace="",pod=""'


@pytest.mark.parametrize("text", [README_LABELS, 'a = "1"', 'a="1" ', ' a="1" , b="2", ', 'a="1",\tb="2"'])
def test_plain_labels_take_blanks_where_0_0_4_allows_them(text: str) -> None:
    plain = exposition._plain_labels(text)
    assert plain is not None and ("ok", plain) == general_labels(text, True) == general_labels(text, False)


def test_a_readme_shaped_scrape_stays_on_the_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    sets = [README_LABELS.replace('gpu="0"', f'gpu="{n}"') for n in range(4)]
    lines = ["DCGM_FI_DEV_SM_CLOCK{" + labels + "} 139" for labels in sets]
    text = "# TYPE DCGM_FI_DEV_SM_CLOCK gauge\n" + "\n".join(lines) + "\n"
    check(text)
    left: list[str] = []
    original = exposition._Prometheus004Parser.sample_line

    def sample_line(self: exposition._Prometheus004Parser, line: str, resolved: dict[str, object]) -> None:
        left.append(line)
        original(self, line, resolved)  # type: ignore[arg-type]

    monkeypatch.setattr(exposition._Prometheus004Parser, "sample_line", sample_line)
    for strict in (True, False):
        read = parse(text, content_type=CONTENT_TYPE, strict=strict)
        assert [s.label("gpu") for s in read.samples] == ["0", "1", "2", "3"] and not read.malformed
    assert left == []  # no line left the fast loop


def test_a_shape_gets_code_of_its_own_when_it_recurs() -> None:
    text = 'zz_b="2",zz_a="1",zz_c=""'
    shape = 'zz_b=",zz_a=",zz_c="'
    exposition._SHAPES.pop(shape, None)
    first = exposition._plain_labels(text)
    generic = exposition._SHAPES[shape]
    second = exposition._plain_labels(text)
    compiled = exposition._SHAPES[shape]
    assert compiled is not generic
    assert first == second == exposition._plain_labels(text) == (("zz_a", "1"), ("zz_b", "2"), ("zz_c", ""))
    assert exposition._plain_labels('zz_b="x",zz_a="y",zz_c="z",') == (("zz_a", "y"), ("zz_b", "x"), ("zz_c", "z"))


def test_plain_labels_agree_on_first_and_later_sight() -> None:
    for line in real_lines():
        if "{" in line and not line.startswith("#"):
            text = line[line.find("{") + 1:line.rfind("}")]
            exposition._SHAPES.clear()
            assert len({exposition._plain_labels(text) for _ in range(3)}) == 1
