"""A corrupted line never reads as another GPU's sample (issue 22 item 6).

A one-character corruption of a valid sample line (a character deleted, inserted or replaced) is, in
lenient mode, either malformed (counted in ``ParseResult.malformed``), or a sample with the original
line's labels, or a sample whose labels are what the corrupted line itself says under the grammar of the
text format as lenient mode extends it. The oracle, ``grammar_labels``, is written from that grammar
(one regular expression for the whole label set), not from the parser's scanner.
"""

from __future__ import annotations

import re
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuremediate.signals.exposition import Labels, ParseResult, parse

DATA = Path(__file__).resolve().parent / "data" / "dcgm-exporter"

# --- the oracle: the label set's grammar ------------------------------------------------------------

_NAME = r"[a-zA-Z_][a-zA-Z0-9_]*"
_BLANK = r"[ \t]*"
# One character of a label value: anything but a quote or a backslash; the escapes \\ \" \n; (lenient) a
# backslash before anything else is itself; (lenient) a raw quote is text unless it is followed, blanks
# aside, by a comma or the end of the label set: then it closes the value.
_VALUE_CHAR = r'(?:[^"\\]|\\[\\"n]|\\(?![\\"n])|"(?!' + _BLANK + r"(?:,|\Z)))"
_PAIR = _NAME + _BLANK + "=" + _BLANK + '"' + _VALUE_CHAR + '*"'
_LABEL_SET = re.compile(_BLANK + "(?:" + _PAIR + _BLANK + "(?:," + _BLANK + _PAIR + _BLANK + ")*(?:," + _BLANK
                        + ")?)?")
_ONE_PAIR = re.compile(_BLANK + "(" + _NAME + ")" + _BLANK + "=" + _BLANK + '"(' + _VALUE_CHAR + '*)"' + _BLANK
                       + ",?")
_TOKEN = re.compile(r'\\[\\"n]|.', re.S)
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


def grammar_labels(text: str) -> Labels | None:
    """The labels of ``text`` (what is between a sample's braces), or None when it is not a label set.

    Besides the pattern: label names are unique and not ``__name__``, and a value that holds a raw quote
    holds no ``="`` (such a value would read another label's start as text: one reading only)."""
    if _LABEL_SET.fullmatch(text) is None:
        return None
    pairs: list[tuple[str, str]] = []
    pos = 0
    while pos < len(text) and text[pos:].strip(" \t"):
        match = _ONE_PAIR.match(text, pos)
        assert match is not None, (text, pos)
        name, raw = match.groups()
        tokens = _TOKEN.findall(raw)
        if '"' in tokens and re.search('=' + _BLANK + '"', raw + '"'):
            return None
        pairs.append((name, "".join(_UNESCAPE.get(token, token) for token in tokens)))
        pos = match.end()
    names = [name for name, _ in pairs]
    if len(set(names)) != len(names) or "__name__" in names:
        return None
    return tuple(sorted(pairs))


def test_the_oracle_reads_what_the_format_says() -> None:
    assert grammar_labels('a="1",b="x\\"y\\\\z\\n"') == (("a", "1"), ("b", 'x"y\\z\n'))
    assert grammar_labels(' a = "1" , b="2", ') == (("a", "1"), ("b", "2"))
    assert grammar_labels('msg="a "b" c",h="n"') == (("h", "n"), ("msg", 'a "b" c'))
    assert grammar_labels('p="C:\\temp"') == (("p", "C:\\temp"),)
    assert grammar_labels("") == ()
    for broken in ('UUID="GPU-1"pci="0"', 'UUID="GPU-1,pci="0"', 'a="1",,b="2"', 'a="1" b="2"', "a=1",
                   'a-b="1"', 'a="1",a="2"', '__name__="x"', 'a="1', 'a="x"y="z"'):
        assert grammar_labels(broken) is None, broken


# --- corruptions --------------------------------------------------------------------------------------

CORRUPTING = '",={}\\ \ta0_-n#'


def corruptions(line: str) -> list[str]:
    """Every one-character deletion, insertion (of a character of CORRUPTING) and replacement of ``line``."""
    out = {line[:i] + line[i + 1:] for i in range(len(line))}
    for i in range(len(line) + 1):
        for char in CORRUPTING:
            out.add(line[:i] + char + line[i:])
            if i < len(line):
                out.add(line[:i] + char + line[i + 1:])
    out.discard(line)
    return sorted(out)


def check_corruption(original: Labels, corrupted: str) -> None:
    result: ParseResult = parse(corrupted + "\n", strict=False)
    if not result.samples:
        assert result.malformed or corrupted.lstrip(" \t").startswith("#") or not corrupted.strip(), corrupted
        return
    assert len(result.samples) == 1 and not result.malformed, corrupted
    labels = result.samples[0].labels
    if labels == original:
        return
    text = corrupted[corrupted.index("{") + 1 : corrupted.rindex("}")]
    assert labels == grammar_labels(text), f"{corrupted!r} read as {labels}; the line itself says " \
                                           f"{grammar_labels(text)}"


def real_label_sets() -> list[str]:
    """One sample line per distinct label set of the real scrapes."""
    lines: dict[str, str] = {}
    for path in sorted(DATA.glob("*.prom")):
        for line in path.read_text(encoding="utf-8").splitlines():
            if "{" in line and not line.startswith("#"):
                lines.setdefault(line[line.index("{") : line.rindex("}")], line)
    return list(lines.values())


def test_every_one_character_corruption_of_the_real_scrapes_label_sets() -> None:
    lines = real_label_sets()
    assert len(lines) >= 3
    for line in lines:
        [sample] = parse(line + "\n").samples
        for corrupted in corruptions(line):
            check_corruption(sample.labels, corrupted)


def test_the_issue_s_corruptions_are_malformed() -> None:
    line = ('DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-a0ac4f0e-b190-0000",pci_bus_id="00000000:03:00.0",'
            'device="nvidia0",Hostname="node-a"} 42')
    for corrupted in (line.replace('",pci', '"pci'),  # a comma deleted
                      line.replace('0000",pci', '0000,pci'),  # a closing quote deleted
                      line.replace("pci_bus_id", "pci_bus-id"),  # a stray character in a label name
                      line.replace("pci_bus_id=", "pci_bus_id"),  # an '=' deleted
                      line.replace('pci_bus_id="', "pci_bus_id=")):  # an opening quote deleted
        result = parse(corrupted + "\n" + line.replace('gpu="0"', 'gpu="1"') + "\n", strict=False)
        assert [s.label("gpu") for s in result.samples] == ["1"], corrupted
        assert [n for n, _ in result.malformed] == [1], corrupted


# --- generated valid lines ------------------------------------------------------------------------------

label_names = st.sampled_from(["gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "err_msg", "a",
                               "b_2", "_x"])
values = st.text(alphabet=st.sampled_from(list('a0-:. ,={}"\\\né')), max_size=10)


def _escaped(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


@st.composite
def valid_lines(draw: st.DrawFn) -> tuple[str, Labels]:
    names = draw(st.lists(label_names, min_size=1, max_size=6, unique=True))
    pairs = [(name, draw(values)) for name in names]
    body = ",".join(f'{name}="{_escaped(value)}"' for name, value in pairs)
    trailing = draw(st.sampled_from(["", ","]))
    metric = draw(st.sampled_from(["DCGM_FI_DEV_XID_ERRORS", "a", "m:x"]))
    tail = draw(st.sampled_from([" 42", " 1.5", " -3e2", " 13 1700000000123"]))
    return f"{metric}{{{body}{trailing}}}{tail}", tuple(sorted(pairs))


@settings(max_examples=300, deadline=None)
@given(line=valid_lines(), data=st.data())
def test_a_one_character_corruption_reads_as_the_original_labels_or_as_what_it_says(
    line: tuple[str, Labels], data: st.DataObject
) -> None:
    text, labels = line
    [sample] = parse(text + "\n").samples  # the line is valid (strictly)
    assert sample.labels == labels
    assert grammar_labels(text[text.index("{") + 1 : text.rindex("}")]) == labels
    position = data.draw(st.integers(0, len(text)))
    char = data.draw(st.sampled_from(CORRUPTING))
    corrupted = data.draw(st.sampled_from([text[:position] + text[position + 1:], text[:position] + char
                                           + text[position:], text[:position] + char + text[position + 1:]]))
    if corrupted != text:
        check_corruption(labels, corrupted)
