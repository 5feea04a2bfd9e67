"""Parser and writer for the Prometheus text formats: 0.0.4 and OpenMetrics 1.0.

``parse`` reads a whole exposition in one pass over its lines. Common sample lines are matched by one
anchored regular expression built without nested quantifiers that could backtrack; anything it does
not match goes through a slower scanner that knows every rule and says which one a line breaks.

0.0.4 (what exporters send) has a fast loop of string operations (``_Prometheus004Parser.run``) that
hands every line it does not take to the same methods as its reference loop. What it keeps between
parses is only what a fleet's exporters write alike: HELP / TYPE lines (``_COMMENTS``), label-name
sequences (``_SHAPES``), MetricFamily objects (``_FROZEN``) and content types. Label texts hold a node's
GPUs, so they are cached within one parse only, and every parse pays for its own; ``ParseResult.families``
makes its MetricFamily objects when it is first read.

Strict mode raises ``ParseError`` at the first violation. Lenient mode is for real exporters: it
skips a line it cannot read and lists every skipped line (and a missing ``# EOF``) in
``ParseResult.malformed``. It tolerates only what exporters really write and what has one reading:

- CRLF line ends, and a last line without its line feed (read, as prometheus_client reads it);
- a stray backslash in a label value or HELP text (dcgm-exporter writes values unescaped): ``\\d``
  stays those two characters; ``\\\\``, ``\\"`` and ``\\n`` are escapes as always;
- a raw ``"`` inside a label value: the value ends at the first quote followed (blanks aside) by
  ``,`` or ``}``, and holds no ``="`` up to there. A value that would hold one has swallowed the
  next label (a comma, a quote or a label name's character lost: ``UUID="GPU-1"pci_bus_id="0"``);
  that line is malformed, never a sample with a different GPU's labels. prometheus_client (and Prometheus)
  reject every such line; here it is a sample, so a line corrupted on the way can read as one with a quote in a
  value (211 of the 6,181 one-character edits of a real L4 line do, 156 of them in UUID, gpu, pci_bus_id or
  Hostname: ``tests/signals/test_exposition_corruption.py``'s edits). ``signals.dcgm`` therefore skips and counts
  (``malformed_lines``, ``gpuremediate_scrape_malformed_lines_total``) a series whose GPU or node label (UUID,
  gpu, pci_bus_id, Hostname, ...) holds a quote; elsewhere (``err_msg``) the quote is the exporter's text;
- cosmetic violations that lose nothing (blank lines or stray comments in OpenMetrics, interleaved
  families), accepted silently.

Everything else about a label set is as strict as strict mode: ``tests/signals/test_exposition_corruption.py``
checks that a one-character corruption of a valid line is malformed, reads as the original labels,
or is itself a valid line under these rules.

Timestamps are unix seconds as floats in both formats (0.0.4 writes integer milliseconds).
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

PROMETHEUS_004 = "0.0.4"
OPENMETRICS_100 = "openmetrics-1.0"

Labels = tuple[tuple[str, str], ...]

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LABEL_NAME = r"[a-zA-Z_][a-zA-Z0-9_]*"
# A quoted label value; unrolled so that the engine never tries two ways to split the same text.
_QUOTED = r'"[^"\\]*(?:\\.[^"\\]*)*"'
_PAIR = _LABEL_NAME + "=" + _QUOTED
_FLOAT = (
    r"[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?"
    r"|[-+]?[iI][nN][fF](?:[iI][nN][iI][tT][yY])?|[-+]?[nN][aA][nN]"
)
_REAL = r"[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?"
_LABEL_SET = r"\{((?:" + _PAIR + r"(?:," + _PAIR + r")*)?)\}"

# The shape of a plain label text (see _plain_labels): name=" then ,name=" per further label, a trailing comma;
# blanks (space, tab) where 0.0.4 allows them: around the names, the '=' and the commas (``a="1", b="2"``, as older
# exporters and dcgm-exporter's README quickstart sample write a label set). OpenMetrics texts reach it only through
# _FAST_OM, whose label sets hold no blank.
_PLAIN_SHAPE = re.compile(
    r"[ \t]*" + _LABEL_NAME + r'[ \t]*=[ \t]*"(?:[ \t]*,[ \t]*' + _LABEL_NAME + r'[ \t]*=[ \t]*")*[ \t]*(?:,[ \t]*)?\Z'
)
_Shape = Callable[[list[str]], Labels]
_SHAPES: dict[str, _Shape | Literal[False]] = {}
# The pieces and the shape last looked up in _SHAPES by the 0.0.4 fast loop: comparing pieces costs less
# than joining and hashing them, and every label text of an exporter (of a fleet) has the same shape.
_LAST_SHAPE: list[tuple[list[str], str]] = [([], "")]
_MAX_SHAPES = 1024  # distinct label-name sequences kept; an exporter has a handful
_LABELS_004 = re.compile("(?:" + _PAIR + "(?:," + _PAIR + r")*,?)?\Z")
_FAST_OM = re.compile(
    "(" + _NAME + ")(?:" + _LABEL_SET + ")? (" + _FLOAT + ")(?: (" + _REAL + r"))?"
    r"(?: # " + _LABEL_SET + " (" + _FLOAT + ")(?: (" + _REAL + r"))?)?\Z"
)
_PAIRS = re.compile("(" + _LABEL_NAME + r')="([^"\\]*(?:\\.[^"\\]*)*)"')
_NAME_RE = re.compile(_NAME)
_NAME_FULL = re.compile(_NAME + r"\Z")
_LABEL_NAME_RE = re.compile(_LABEL_NAME)
_LABEL_NAME_FULL = re.compile(_LABEL_NAME + r"\Z")
_FLOAT_FULL = re.compile("(?:" + _FLOAT + r")\Z")
_REAL_FULL = re.compile(_REAL + r"\Z")
_INT_FULL = re.compile(r"[-+]?[0-9]+\Z")
_VALUE_BODY = re.compile(r'[^"\\]*(?:\\.[^"\\]*)*')
_ESCAPE = re.compile(r"\\(.?)", re.S)
_UNIT_FULL = re.compile(r"[a-zA-Z0-9_:]*\Z")
_EOF_LINE = re.compile(r"^# EOF$", re.M)
# Lenient: the quote that closes a label value is the first one followed (blanks aside) by ',' or '}';
# an earlier raw quote is the value's text (dcgm-exporter writes values unescaped).
_LENIENT_CLOSE = re.compile(r'"[ \t]*[,}]')
# A closing quote followed by another label without a comma (NVIDIA's README sample has one): reject,
# for taking the rest as the value garbles every label after it.
_MISSING_COMMA = re.compile(r'"[ \t]*' + _LABEL_NAME + r'[ \t]*=[ \t]*"')
# A value read past a raw quote that holds '="' has swallowed the start of another label.
_SWALLOWED_LABEL = re.compile(r'=[ \t]*"')
_COMMENT_004 = re.compile(r"#[ \t]*(HELP|TYPE)(?:[ \t]+(.*))?\Z", re.S)
_DESCRIPTOR_OM = re.compile(r"# (HELP|TYPE|UNIT) (.*)\Z", re.S)

_TYPES_004 = frozenset({"counter", "gauge", "histogram", "summary", "untyped"})
_UNTYPED = ("",)  # _SUFFIXES_004["untyped"]
_TYPES_OM = frozenset({"counter", "gauge", "histogram", "gaugehistogram", "stateset", "info", "summary", "unknown"})
_SUFFIXES_004: Mapping[str, tuple[str, ...]] = {
    "counter": ("",),
    "gauge": ("",),
    "untyped": _UNTYPED,
    "histogram": ("_bucket", "_count", "_sum"),
    "summary": ("", "_count", "_sum"),
}
_SUFFIXES_OM: Mapping[str, tuple[str, ...]] = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "unknown": ("",),
    "stateset": ("",),
    "info": ("_info",),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "gaugehistogram": ("_bucket", "_gcount", "_gsum"),
    "summary": ("", "_count", "_sum", "_created"),
}
_EXEMPLAR_SUFFIXES = {"counter": "_total", "histogram": "_bucket", "gaugehistogram": "_bucket"}
_NON_NEGATIVE = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_count", "_sum"),
    "summary": ("_count", "_sum"),
    "gaugehistogram": ("_bucket", "_gcount"),
}
# Sum and Count are counters: never NaN or negative (Gsum may be negative, never NaN)
_NOT_NAN = {"gaugehistogram": ("_gsum",)}
_UNESCAPE = {"\\": "\\", "n": "\n", '"': '"'}
_NEEDS_LABEL = frozenset({"histogram", "summary"})  # 0.0.4 types whose samples need an le / quantile label
# a value made of only these is a decimal (or not a number at all): float() and _FLOAT agree on it
_DECIMAL_CHARS = "0123456789.eE+-"
_MAX_EXEMPLAR_LABEL_CHARS = 128
_new = object.__new__
_INT64 = 2**63


class ParseError(ValueError):
    """The text breaks the format: ``line_no`` (1-based; 0 for the whole document) and why."""

    def __init__(self, line_no: int, reason: str) -> None:
        super().__init__(f"line {line_no}: {reason}")
        self.line_no = line_no
        self.reason = reason


class _LineError(Exception):
    """A rule broken by the current line; the caller turns it into a ParseError or a malformed entry."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Exemplar:
    labels: Labels
    value: float
    timestamp: float | None = None


@dataclass(frozen=True, slots=True)
class Sample:
    name: str
    labels: Labels  # sorted (name, value) pairs
    value: float
    timestamp: float | None = None  # unix seconds
    exemplar: Exemplar | None = None

    def label(self, name: str, default: str | None = None) -> str | None:
        for key, value in self.labels:
            if key == name:
                return value
        return default


class _SampleFields:
    """Sample's slots without its frozen ``__init__``: the parser's hot loop sets the fields and then makes
    the object a Sample (``__class__`` assignment, allowed between classes with the same slots), which
    costs a third of calling ``Sample(...)``. What comes out is a Sample like any other."""

    __slots__ = Sample.__slots__
    name: str
    labels: Labels
    value: float
    timestamp: float | None
    exemplar: Exemplar | None


@dataclass(frozen=True, slots=True)
class MetricFamily:
    name: str
    type: str  # "untyped" (0.0.4) / "unknown" (OpenMetrics) when no TYPE line says otherwise
    help: str = ""
    unit: str = ""


# MetricFamily objects (immutable) by their fields: every scrape of an exporter fleet describes the same families.
_FROZEN: dict[tuple[str, str, str, str], MetricFamily] = {}
_MAX_FROZEN = 4096


def _frozen_family(key: tuple[str, str, str, str]) -> MetricFamily:
    family = object.__new__(_MetricFamilyFields)  # MetricFamily(*key) at a third of the cost (see _SampleFields)
    family.name, family.type, family.help, family.unit = key
    family.__class__ = MetricFamily  # type: ignore[assignment]
    if len(_FROZEN) >= _MAX_FROZEN:
        _FROZEN.clear()
    _FROZEN[key] = family  # type: ignore[assignment]
    return family  # type: ignore[return-value]


class _MetricFamilyFields:
    """MetricFamily's slots without its frozen ``__init__`` (see _SampleFields)."""

    __slots__ = MetricFamily.__slots__
    name: str
    type: str
    help: str
    unit: str


class _Families(Mapping[str, MetricFamily]):
    """``ParseResult.families``: read-only; its MetricFamily objects are made when it is first read, for
    the controller reads only a scrape's samples and so never pays for them."""

    __slots__ = ("building", "frozen")

    def __init__(self, building: Mapping[str, _Family]) -> None:
        self.building = building  # the parser's families, no longer changed
        self.frozen: Mapping[str, MetricFamily] | None = None

    def view(self) -> Mapping[str, MetricFamily]:
        frozen = self.frozen
        if frozen is None:
            frozen = self.frozen = MappingProxyType(_frozen_families(self.building))
        return frozen

    def __getitem__(self, name: str) -> MetricFamily:
        return self.view()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.view())

    def __len__(self) -> int:
        return len(self.view())

    def __contains__(self, name: object) -> bool:
        return name in self.view()

    def get(self, name: str, default: Any = None) -> Any:
        return self.view().get(name, default)

    def __eq__(self, other: object) -> bool:
        return self.view() == other

    __hash__ = None  # type: ignore[assignment]  # as a mappingproxy's

    def __repr__(self) -> str:
        return repr(dict(self.view()))


def _frozen_families(families: Mapping[str, _Family]) -> dict[str, MetricFamily]:
    frozen: dict[str, MetricFamily] = {}
    known = _FROZEN
    for name, fam in families.items():  # fam.frozen() for each, mostly made before
        key = (fam.name, fam.type, fam.help, fam.unit)
        family = known.get(key)
        frozen[name] = _frozen_family(key) if family is None else family
    return frozen


@dataclass(frozen=True, slots=True)
class ParseResult:
    samples: list[Sample]
    families: Mapping[str, MetricFamily]
    malformed: list[tuple[int, str]] = field(default_factory=list)
    format: str = PROMETHEUS_004


class _ParseResultFields:
    """ParseResult's slots without its frozen ``__init__`` (see _SampleFields)."""

    __slots__ = ParseResult.__slots__
    samples: list[Sample]
    families: Mapping[str, MetricFamily]
    malformed: list[tuple[int, str]]
    format: str


class _Family:
    """A family while the parser is still reading it."""

    __slots__ = ("buckets", "group", "group_stamp", "groups", "has_help", "has_samples", "has_type", "has_unit",
                 "help", "last_line", "name", "seen", "suffixes", "type", "unit")

    def __init__(self, name: str, type_: str, suffixes: tuple[str, ...]) -> None:
        self.name = name
        self.type = type_
        self.suffixes = suffixes
        self.help = ""
        self.unit = ""
        self.has_help = self.has_type = self.has_unit = self.has_samples = False
        self.last_line = 0
        self.seen: dict[tuple[str, Labels], float | None] = {}  # series → its last timestamp
        self.buckets: list[Sample] = []  # histogram / gauge histogram samples with a suffix, in order
        self.group: Labels | None = None  # the MetricPoint group being read (labels without le / quantile)
        self.group_stamp: float | None = None
        self.groups: set[Labels] = set()

    def frozen(self) -> MetricFamily:
        return MetricFamily(self.name, self.type, self.help, self.unit)


def parse(text: str, *, content_type: str | None = None, strict: bool = True) -> ParseResult:
    """Parse an exposition; the format comes from ``content_type``, else from a ``# EOF`` line."""
    if not isinstance(text, str):
        raise TypeError(f"parse() needs the exposition as str, got {type(text).__name__}")
    if not strict and "\r" in text:
        text = text.replace("\r\n", "\n")  # CRLF: every line alike, comments and # EOF included
    if (_FORMAT_OF.get(content_type) is False) if content_type is not None else "# EOF" not in text:
        return _Prometheus004Parser(strict).run(text)  # the common case: 0.0.4 (as _is_openmetrics says)
    try:
        openmetrics = _is_openmetrics(text, content_type)
    except _LineError as err:
        if strict:
            raise ParseError(0, err.reason) from None
        openmetrics = _EOF_LINE.search(text) is not None
        malformed = [(0, err.reason)]
    else:
        malformed = []
        if content_type is not None and len(_FORMAT_OF) < _MAX_FORMATS:
            _FORMAT_OF[content_type] = openmetrics
    parser = _OpenMetricsParser(strict) if openmetrics else _Prometheus004Parser(strict)
    parser.malformed.extend(malformed)
    return parser.run(text)


# Whether a content type (as an exporter sends it, byte for byte) is OpenMetrics: the few an exporter
# fleet sends, remembered once _is_openmetrics has accepted them.
_FORMAT_OF: dict[str, bool] = {}
_MAX_FORMATS = 64


def _is_openmetrics(text: str, content_type: str | None) -> bool:
    if content_type is None:
        return "# EOF" in text and _EOF_LINE.search(text) is not None
    media, _, params = content_type.partition(";")
    media = media.strip().lower()
    if media == "application/openmetrics-text":
        version = _content_type_param(params, "version")
        if version not in (None, "1.0.0", "0.0.1"):
            raise _LineError(f"unsupported OpenMetrics version {version!r} in content type {content_type!r}")
        return True
    if media == "text/plain":
        return False
    raise _LineError(f"unsupported content type {content_type!r}")


def _content_type_param(params: str, key: str) -> str | None:
    for param in params.split(";"):
        name, _, value = param.partition("=")
        if name.strip().lower() == key:
            return value.strip().strip('"')
    return None


class _Parser:
    """What both formats share: family bookkeeping, label decoding, the result."""

    __slots__ = ("families", "label_cache", "malformed", "samples", "strict")
    suffixes: Mapping[str, tuple[str, ...]]
    default_type: str

    def __init__(self, strict: bool) -> None:
        self.strict = strict
        self.samples: list[Sample] = []
        self.families: dict[str, _Family] = {}
        self.malformed: list[tuple[int, str]] = []
        # decoded label sets by their raw text: exporters repeat the same few sets in every family
        self.label_cache: dict[str, Labels] = {}

    def result(self, fmt: str) -> ParseResult:
        result = _new(_ParseResultFields)  # ParseResult(...) at a third of the cost (see _SampleFields)
        result.samples = self.samples
        families: _Families = _new(_Families)  # _Families(self.families), as cheaply
        families.building, families.frozen = self.families, None
        result.families = families
        result.malformed = self.malformed
        result.format = fmt
        result.__class__ = ParseResult  # type: ignore[assignment]
        return result  # type: ignore[return-value]

    def fail(self, line_no: int, reason: str) -> None:
        if self.strict:
            raise ParseError(line_no, reason)
        self.malformed.append((line_no, reason))

    def new_family(self, name: str, type_: str) -> _Family:
        fam = _Family(name, type_, self.suffixes[type_])
        self.families[name] = fam
        return fam

    def family_of_suffixed(self, name: str) -> _Family | None:
        """The family that owns ``name`` through a type suffix (``foo_bucket`` → histogram ``foo``)."""
        for suffix in ("_bucket", "_count", "_sum", "_total", "_created", "_gcount", "_gsum", "_info"):
            if name.endswith(suffix):
                fam = self.families.get(name[: -len(suffix)])
                if fam is not None and suffix in fam.suffixes:
                    return fam
        return None

    def labels_of(self, text: str, om: bool) -> Labels:
        """Decode the inside of a ``{...}`` already matched by a fast pattern (cached per text)."""
        labels = self.label_cache.get(text)
        if labels is None:
            labels = _plain_labels(text)
            if labels is not None:
                self.label_cache[text] = labels
                return labels
            pairs = _decode_pairs(text)
            if "\\" in text:
                pairs = [(key, self.unescape(value)) for key, value in pairs]
            labels = self.label_cache[text] = self.checked_labels(pairs, om, reserved_possible="__" in text)
        return labels

    def checked_labels(self, pairs: list[tuple[str, str]], om: bool, reserved_possible: bool = True) -> Labels:
        if len(dict(pairs)) != len(pairs):
            keys = [key for key, _ in pairs]
            dup = next(key for i, key in enumerate(keys) if key in keys[:i])
            raise _LineError(f"duplicate label name {dup!r}")
        if reserved_possible:
            for key, _ in pairs:
                if key.startswith("__") and (om or key == "__name__"):
                    raise _LineError(f"label name {key!r} is reserved")
        return tuple(sorted(pairs))

    def unescape(self, raw: str) -> str:
        return _ESCAPE.sub(self._one_escape, raw)

    keeps_unknown_escapes = False  # OpenMetrics' grammar allows BS normal-char, kept as written

    def _one_escape(self, match: re.Match[str]) -> str:
        char = match.group(1)
        if char in _UNESCAPE:
            return _UNESCAPE[char]
        if self.strict and not (self.keeps_unknown_escapes and char not in ("", "\n")):
            raise _LineError(f"invalid escape sequence '\\{char}' (only \\\\, \\\" and \\n are allowed)")
        return match.group(0)  # exporters write values raw: keep the backslash as text

    def scan_labels(self, line: str, pos: int, om: bool) -> tuple[list[tuple[str, str]], int]:
        """Read labels from just after ``{``; returns the pairs and the index after ``}``."""
        pairs: list[tuple[str, str]] = []
        blank = "" if om else " \t"
        while True:
            pos = _skip(line, pos, blank)
            if pos < len(line) and line[pos] == "}" and (not pairs or not om):
                return pairs, pos + 1
            match = _LABEL_NAME_RE.match(line, pos)
            if match is None:
                raise _LineError(_label_problem(line, pos))
            key, pos = match.group(), _skip(line, match.end(), blank)
            if not line.startswith("=", pos):
                raise _LineError(f"expected '=' after label name {key!r}")
            pos = _skip(line, pos + 1, blank)
            if not line.startswith('"', pos):
                raise _LineError(f"label value of {key!r} must start with a double quote")
            value, pos = self.scan_value(line, pos + 1, key)
            pairs.append((key, value))
            pos = _skip(line, pos, blank)
            if line.startswith(",", pos):
                pos += 1
                if om and line.startswith("}", pos):
                    raise _LineError("trailing comma in label set")
            elif not line.startswith("}", pos):
                raise _LineError(f"expected ',' or '}}' after the value of label {key!r}")

    def scan_value(self, line: str, pos: int, key: str) -> tuple[str, int]:
        """Read a label value from just after its opening quote; returns it and the index after its end."""
        end = _VALUE_BODY.match(line, pos).end()  # type: ignore[union-attr]
        if end >= len(line) or line[end] != '"':
            raise _LineError(f"label value of {key!r} is not terminated")
        if not self.strict and _LENIENT_CLOSE.match(line, end) is None:
            if _MISSING_COMMA.match(line, end):
                raise _LineError(f"missing ',' after the value of label {key!r}")
            close = _lenient_close(line, end)
            if close != end and _SWALLOWED_LABEL.search(line, pos, close + 1):
                raise _LineError(f"label value of {key!r} runs into another label ('=\"' after a raw '\"'): "
                                 "a ',' or a '\"' is missing")
            end = close
        raw = line[pos:end]
        return (self.unescape(raw) if "\\" in raw else raw), end + 1


def _split_sample(line: str) -> tuple[str, str | None, str] | None:
    """(name, the text between the braces or None without braces, what follows) of a sample line of the common
    shape; None where the braces do not close right before a space (the general path reads it)."""
    brace = line.find("{")
    if brace == -1:
        name, _, rest = line.partition(" ")
        return name, None, rest
    close = line.rfind("}")  # values and timestamps hold no brace: the last one closes the labels
    if close < brace or not line.startswith(" ", close + 1):
        return None
    return line[:brace], line[brace + 1 : close], line[close + 2 :]


def _plain_labels(text: str) -> Labels | None:
    """The labels of a label text with no backslash whose names are plain and distinct (never ``__``-
    prefixed), as ``checked_labels(_decode_pairs(text))`` gives them; None for any other text (the
    general path then reads it or says what is wrong). Split at the quotes (a value holds none), the
    text is values between the pieces of its *shape*: ``name="`` for the first label, ``,name="`` for
    each further one, and an optional trailing comma, with 0.0.4's blanks around them as ``scan_labels``
    reads them (``a="1", b="2"``); everything to check is in the shape, which is the same on every
    series of an exporter, so what it yields (or that it yields nothing) is kept."""
    if "\\" in text:
        return None
    parts = text.split('"')
    if not len(parts) & 1:
        return None  # an odd number of quotes
    shape = '"'.join(parts[::2])
    known = _SHAPES.get(shape)
    if known is None:
        known = _shape(shape)
        if len(_SHAPES) >= _MAX_SHAPES:
            _SHAPES.clear()
        _SHAPES[shape] = known
    if known is False:
        return None
    return known(parts)


def _last_shape(pieces: list[str]) -> str:
    shape = '"'.join(pieces)
    _LAST_SHAPE[0] = (pieces, shape)
    return shape


def _shape(shape: str) -> _Shape | Literal[False]:
    """For ``_plain_labels``: a function that makes the labels out of the text split at its quotes
    (values at odd indices); False for a shape it leaves to the general path."""
    if not shape:
        return _no_labels
    if _PLAIN_SHAPE.match(shape) is None:
        return False
    names = _LABEL_NAME_RE.findall(shape)  # the pattern took them: nothing but names, '=', ',', quotes and blanks
    if len(set(names)) != len(names) or any(name.startswith("__") for name in names):
        return False  # a duplicate or reserved name: the general path says which
    order = sorted(range(len(names)), key=names.__getitem__)
    keys, picks = tuple(names[i] for i in order), tuple(2 * i + 1 for i in order)
    uses = 0

    def build(parts: list[str]) -> Labels:
        nonlocal uses
        uses += 1
        if uses == 2 and _SHAPES.get(shape) is build:  # seen again: worth code of its own
            _SHAPES[shape] = _compiled(keys, picks) or build
        return tuple(zip(keys, [parts[i] for i in picks], strict=True))

    return build


def _compiled(keys: tuple[str, ...], picks: tuple[int, ...]) -> _Shape | None:
    """``lambda p: ((keys[0], p[picks[0]]), ...)`` as code: three times as fast as tuple(zip()), and
    costs a compilation (80 µs), so made for a shape only once it recurs."""
    if any(_LABEL_NAME_FULL.match(key) is None for key in keys):
        return None  # cannot happen (the shape's pattern took them), but they go into code
    pairs = "".join(f"({key!r}, p[{pick}]), " for key, pick in zip(keys, picks, strict=True))
    made: _Shape = eval(f"lambda p: ({pairs})", {"__builtins__": {}})
    return made


def _no_labels(parts: list[str]) -> Labels:
    return ()


def _decode_pairs(text: str) -> list[tuple[str, str]]:
    """Pairs of a well-formed label text (``a="1",b="2"`` with an optional trailing comma)."""
    if "\\" in text:
        return _PAIRS.findall(text)  # values still escaped
    # With no backslash a value holds no quote, so '="' and '",' usually occur only between names and
    # values; a value that itself starts with ',' or ends with '=' breaks that, so check by rebuilding.
    body = text[:-2] if text.endswith(",") else text[:-1]
    parts = iter(body.replace('",', '="').split('="')) if body else iter(())
    pairs = list(zip(parts, parts, strict=False))
    if ",".join(f'{key}="{value}"' for key, value in pairs) != text.removesuffix(","):
        return _PAIRS.findall(text)
    return pairs


def _skip(line: str, pos: int, chars: str) -> int:
    while pos < len(line) and line[pos] in chars:
        pos += 1
    return pos


def _label_problem(line: str, pos: int) -> str:
    if pos >= len(line):
        return "label set is not closed with '}'"
    return f"invalid label name at column {pos + 1} ({line[pos:pos + 10]!r})"


def _lenient_close(line: str, end: int) -> int:
    """For an unescaped value holding a raw quote, the first later quote that can close it (``end``: none)."""
    candidate = line.find('"', end + 1)
    while candidate != -1:
        if _LENIENT_CLOSE.match(line, candidate):
            return candidate
        candidate = line.find('"', candidate + 1)
    return end


def _float(text: str, what: str) -> float:
    if _FLOAT_FULL.match(text) is None:
        raise _LineError(f"invalid {what} {text!r}")
    return float(text)


class _Prometheus004Parser(_Parser):
    __slots__ = ()
    suffixes = _SUFFIXES_004
    default_type = "untyped"

    def run(self, text: str) -> ParseResult:
        """The loop of ``run_reference`` with its common cases inlined: ``# HELP`` / ``# TYPE`` lines and
        ``name{labels} value`` lines whose label text was seen before (or is plain) and whose value is a
        plain decimal. Anything else on a line goes to the same methods ``run_reference`` calls, so both
        give the same result (tests/signals/test_exposition_fast.py checks it)."""
        lines = text.split("\n")  # as lines_of() does
        unterminated = lines.pop()
        if unterminated and unterminated.strip(" \t") and not self.strict:
            lines.append(unterminated)
            unterminated = ""
        families = self.families
        resolved: dict[str, _Family] = {}
        cache = self.label_cache
        append = self.samples.append
        rows = iter(lines)  # the line number is counted only for a line that breaks a rule (_line_no)
        for line in rows:
            if not line:
                continue
            try:
                if line[0] == "#":
                    known = _COMMENTS.get(line)
                    if known is None:
                        known = _cached_comment_004(line)
                    if known is False:
                        self.comment(line)
                        continue
                    if known is True:
                        continue  # "# HELP name" / "# TYPE name" alone says nothing
                    name, said, suffixes = known  # describe(), its common cases inline
                    described = families.get(name)
                    if described is None:  # new_family(name, "untyped") then set_type() / set_help(), inline
                        described = families[name] = _new(_Family)
                        described.name, described.unit = name, ""
                        described.has_unit = described.has_samples = False
                        if suffixes:  # TYPE with a 0.0.4 type
                            described.type, described.suffixes, described.has_type = said, suffixes, True
                            described.help, described.has_help = "", False
                            continue
                        described.type, described.suffixes, described.has_type = "untyped", _UNTYPED, False
                        if suffixes is None and "\\" not in said:  # HELP without escapes
                            described.help, described.has_help = said, True
                            continue
                        described.help, described.has_help = "", False
                    if suffixes is not None:  # a TYPE line
                        if suffixes and not (described.has_type or described.has_samples):
                            described.type, described.has_type, described.suffixes = said, True, suffixes
                        else:
                            self.set_type(described, said)
                    elif described.has_help or "\\" in said:
                        self.set_help(described, said)
                    else:
                        described.help, described.has_help = said, True
                    continue
                # name{labels} value: the last "} " closes the labels (a value holds no brace), the first "{" opens them
                head, closed, rest = line.rpartition("} ")
                if closed:
                    name, opened, label_text = head.partition("{")
                    labels = cache.get(label_text) if opened else None
                    if labels is None and opened:  # self.new_labels(label_text), its common case inline
                        parts = label_text.split('"')
                        pieces = parts[::2]
                        last_pieces, last_shape = _LAST_SHAPE[0]  # an exporter's label texts share their shape
                        build = _SHAPES.get(last_shape if pieces == last_pieces else _last_shape(pieces))
                        if build and len(parts) & 1 and "\\" not in label_text:
                            labels = cache[label_text] = build(parts)
                        else:
                            try:
                                labels = self.new_labels(label_text)
                            except _LineError:  # sample_line says the line's first error (its name may be bad too)
                                labels = None
                    if labels is None:
                        self.sample_line(line, resolved)
                        continue
                else:
                    name, _, rest = line.partition(" ")  # a "{" without "} " leaves no valid name: see below
                    labels = ()
                if rest.strip(_DECIMAL_CHARS):
                    self.sample_line(line, resolved)  # a timestamp, NaN / ±Inf, or something to report
                    continue
                fam = resolved.get(name)  # resolved and known names were checked when they were first read
                if fam is None:
                    described = families.get(name)
                    if described is None and not (name.isidentifier() and name.isascii()) and \
                            _NAME_FULL.match(name) is None:
                        self.sample_line(line, resolved)
                        continue
                try:
                    value = float(rest)
                except ValueError:
                    self.sample_line(line, resolved)
                    continue
                if fam is None:  # self.family_for(name), its common case inline
                    fam = described if described is not None and "" in described.suffixes else self.family_for(name)
                    resolved[name] = fam
                if fam.type in _NEEDS_LABEL:
                    _check_required_label(fam.type, fam.name, name, labels)
                fam.has_samples = True
                sample = _new(_SampleFields)  # a Sample built field by field (see _SampleFields)
                sample.name = name
                sample.labels = labels
                sample.value = value
                sample.timestamp = sample.exemplar = None
                sample.__class__ = Sample  # type: ignore[assignment]
                append(sample)  # type: ignore[arg-type]
            except _LineError as err:
                self.fail(_line_no(lines, rows), err.reason)
        if unterminated:
            return self.finish(len(lines), unterminated)
        result = _new(_ParseResultFields)  # self.result(PROMETHEUS_004), inline
        result.samples = self.samples
        view: _Families = _new(_Families)
        view.building, view.frozen = families, None
        result.families = view
        result.malformed = self.malformed
        result.format = PROMETHEUS_004
        result.__class__ = ParseResult  # type: ignore[assignment]
        return result  # type: ignore[return-value]

    def new_labels(self, text: str) -> Labels | None:
        """The labels of a label text not read before in this exposition (kept in ``label_cache``); None
        for a text the fast loop leaves to ``sample_line`` (which reads it or says what is wrong)."""
        labels = _plain_labels(text)
        if labels is not None:
            self.label_cache[text] = labels
            return labels
        if _LABELS_004.match(text) is None:
            return None
        return self.labels_of(text, False)

    def new_family(self, name: str, type_: str) -> _Family:
        """A family with what 0.0.4 reads; OpenMetrics' bookkeeping (``seen``, ``buckets``, ``group``…) is
        left unset, a third of the cost of ``_Family()``."""
        fam = self.families[name] = object.__new__(_Family)
        fam.name, fam.type, fam.suffixes = name, type_, _SUFFIXES_004[type_]
        fam.help = fam.unit = ""
        fam.has_help = fam.has_type = fam.has_unit = fam.has_samples = False
        return fam

    def run_reference(self, text: str) -> ParseResult:
        """Line by line through the general methods: what ``run`` must agree with."""
        lines, unterminated = self.lines_of(text)
        resolved: dict[str, _Family] = {}
        for line_no, line in enumerate(lines, 1):
            if not line:
                continue
            try:
                if line[0] == "#":
                    self.comment(line)
                    continue
                self.sample_line(line, resolved)
            except _LineError as err:
                self.fail(line_no, err.reason)
        return self.finish(len(lines), unterminated)

    def lines_of(self, text: str) -> tuple[list[str], str]:
        lines = text.split("\n")
        unterminated = lines.pop()  # "" when the text ends with a line feed, as it must
        if unterminated.strip(" \t") and not self.strict:
            lines.append(unterminated)  # lenient: read it, as prometheus_client and Prometheus do
            unterminated = ""
        return lines, unterminated

    def finish(self, line_count: int, unterminated: str) -> ParseResult:
        if unterminated.strip(" \t"):
            self.fail(line_count + 1, "the last line does not end with a line feed (truncated?)")
        return self.result(PROMETHEUS_004)

    def sample_line(self, line: str, resolved: dict[str, _Family]) -> None:
        """A line that is not a comment: its sample (if any) into ``samples``; ``resolved`` caches families."""
        parsed = self.quick_sample(line) or self.slow_line(line)
        if parsed is None:
            return
        name, labels, value, stamp = parsed
        fam = resolved.get(name)
        if fam is None:
            fam = resolved[name] = self.family_for(name)
        if fam.type in _NEEDS_LABEL:
            _check_required_label(fam.type, fam.name, name, labels)
        fam.has_samples = True
        self.samples.append(Sample(name, labels, value, stamp))

    def quick_sample(self, line: str) -> tuple[str, Labels, float, float | None] | None:
        """The common shape ``name{labels} value [ms]`` with single spaces, by string operations;
        None for anything else (the slow path then reads it, or says what is wrong)."""
        split = _split_sample(line)
        if split is None:
            return None
        name, label_text, rest = split
        if label_text is None:
            labels: Labels = ()
        else:
            cached = self.label_cache.get(label_text)
            if cached is None:
                if _LABELS_004.match(label_text) is None:
                    return None
                cached = self.labels_of(label_text, False)
            labels = cached
        value_text, space, stamp_text = rest.partition(" ")
        if _NAME_FULL.match(name) is None or _FLOAT_FULL.match(value_text) is None:
            return None
        if not space:
            return name, labels, float(value_text), None
        if _INT_FULL.match(stamp_text) is None:
            return None
        return name, labels, float(value_text), _timestamp_ms(stamp_text)

    def slow_line(self, line: str) -> tuple[str, Labels, float, float | None] | None:
        """A line the fast pattern did not take: blank, indented comment, or a sample to scan."""
        if not self.strict:
            line = line.rstrip("\r")
        stripped = line.lstrip(" \t")
        if not stripped:
            return None
        if stripped[0] == "#":
            self.comment(stripped)
            return None
        return self.slow_sample(stripped)

    def family_for(self, name: str) -> _Family:
        fam = self.families.get(name)
        if fam is not None and "" in fam.suffixes:
            return fam
        owner = self.family_of_suffixed(name)
        if owner is not None:
            return owner
        if fam is not None:
            raise _LineError(f"sample {name!r} does not fit {fam.type} family {fam.name!r}")
        return self.new_family(name, "untyped")

    def slow_sample(self, line: str) -> tuple[str, Labels, float, float | None]:
        match = _NAME_RE.match(line)
        if match is None:
            raise _LineError(f"invalid metric name at the start of {line[:40]!r}")
        name, pos = match.group(), _skip(line, match.end(), " \t")
        labels: Labels = ()
        if line.startswith("{", pos):
            pairs, pos = self.scan_labels(line, pos + 1, False)
            labels = self.checked_labels(pairs, False)
        elif pos == match.end() and pos < len(line):
            raise _LineError(f"invalid character {line[pos]!r} in metric name {name + line[pos]!r}")
        tokens = [token for token in line[pos:].replace("\t", " ").split(" ") if token]
        if not tokens:
            raise _LineError(f"sample {name!r} has no value")
        value = _float(tokens[0], "sample value")
        stamp = _timestamp_ms(tokens[1]) if len(tokens) >= 2 else None
        if len(tokens) > 2:
            raise _LineError(f"unexpected text after the timestamp: {tokens[2]!r}")
        return name, labels, value, stamp

    def comment(self, line: str) -> None:
        keyword = line[2:6]
        if line.startswith("# ") and keyword in ("HELP", "TYPE") and line.startswith(" ", 6):
            name, _, value = line[7:].partition(" ")
            if value[:1] not in (" ", "\t") and _NAME_FULL.match(name) is not None:
                self.describe(keyword, name, value)
                return
        match = _COMMENT_004.match(line)
        if match is None or match.group(2) is None:
            return  # a plain comment
        keyword, rest = match.groups()
        if not rest:
            return
        name_match = _NAME_RE.match(rest)
        name_end = name_match.end() if name_match else 0
        if name_end == 0 or (name_end < len(rest) and rest[name_end] not in " \t"):
            raise _LineError(f"invalid metric name in {keyword} line: {rest[:40]!r}")
        self.describe(keyword, rest[:name_end], rest[name_end:].lstrip(" \t"))

    def describe(self, keyword: str, name: str, value: str) -> None:
        if not value:
            return  # "# HELP name" alone says nothing (Go's parser ignores it too)
        fam = self.families.get(name) or self.new_family(name, "untyped")
        if keyword == "HELP":
            self.set_help(fam, value)
        else:
            self.set_type(fam, value)

    def set_help(self, fam: _Family, value: str) -> None:
        if fam.has_help:
            raise _LineError(f"second HELP line for metric name {fam.name!r}")
        fam.help, fam.has_help = self.unescape_help(value), True

    def unescape_help(self, value: str) -> str:
        if "\\" not in value:
            return value
        if value.endswith("\\") and (len(value) - len(value.rstrip("\\"))) % 2 == 1:
            if self.strict:
                raise _LineError("HELP text ends in a lone backslash")
            value += "\\"
        return self.unescape(value)

    def set_type(self, fam: _Family, value: str) -> None:
        type_ = value.rstrip(" \t").lower()
        if type_ not in _TYPES_004:
            raise _LineError(f"unknown metric type {value!r} for {fam.name!r}")
        if fam.has_type or fam.has_samples:
            raise _LineError(f"second TYPE line for metric name {fam.name!r}, or TYPE after its samples")
        fam.type, fam.has_type, fam.suffixes = type_, True, self.suffixes[type_]


def _comment_004(line: str) -> tuple[str, str, tuple[str, ...] | None] | bool:
    """What ``comment()`` reads in a ``# HELP name text`` / ``# TYPE name type`` line as its fast path
    takes it: (the name, the text, for TYPE the type's suffixes or () for no 0.0.4 type, for HELP None);
    True for such a line with no text (it says nothing), False for any other comment line."""
    head = line[:7]
    if head != "# HELP " and head != "# TYPE ":
        return False
    name, _, said = line[7:].partition(" ")
    # an ASCII identifier is a metric name; the pattern decides the rest (a ':')
    if not (name.isidentifier() and name.isascii()) and _NAME_FULL.match(name) is None:
        return False
    if said[:1] in (" ", "\t"):
        return False
    if not said:
        return True
    return name, said, (_SUFFIXES_004.get(said, ()) if head == "# TYPE " else None)


def _cached_comment_004(line: str) -> tuple[str, str, tuple[str, ...] | None] | bool:
    if len(_COMMENTS) >= _MAX_COMMENTS:
        _COMMENTS.clear()
    known = _COMMENTS[line] = _comment_004(line)
    return known


def _line_no(lines: list[str], rows: Iterator[str]) -> int:
    """The 1-based number of the line ``rows`` (an iterator over ``lines``) gave last."""
    return len(lines) - operator.length_hint(rows)


# Comment lines read by _comment_004, by their text: an exporter fleet writes the same HELP and TYPE
# lines in every scrape, so they are read once, and their names and texts are shared between scrapes.
_COMMENTS: dict[str, tuple[str, str, tuple[str, ...] | None] | bool] = {}
_MAX_COMMENTS = 4096


def _timestamp_ms(text: str) -> float:
    if _INT_FULL.match(text) is None:
        raise _LineError(f"invalid timestamp {text!r} (0.0.4 wants integer milliseconds)")
    millis = int(text)
    if not -_INT64 <= millis < _INT64:
        raise _LineError(f"timestamp {text!r} is out of the int64 range")
    return millis / 1000


def _check_required_label(type_: str, family: str, name: str, labels: Labels) -> None:
    """Histogram buckets need ``le``, summary quantiles need ``quantile``, both holding a float."""
    key = ("quantile" if name == family else None) if type_ == "summary" else None
    if type_ != "summary" and name.endswith("_bucket"):
        key = "le"
    if key is None:
        return
    value = next((v for k, v in labels if k == key), None)
    if value is None:
        raise _LineError(f"{type_} sample {name!r} has no {key!r} label")
    _float(value, f"{key!r} label value")


class _OpenMetricsParser(_Parser):
    __slots__ = ("current", "line_no")
    suffixes = _SUFFIXES_OM
    default_type = "unknown"
    keeps_unknown_escapes = True

    def __init__(self, strict: bool) -> None:
        super().__init__(strict)
        self.current: _Family | None = None
        self.line_no = 0

    def run(self, text: str) -> ParseResult:
        lines = text.split("\n")
        eof_at = next((i for i, line in enumerate(lines) if line == "# EOF"), None)
        if eof_at is None and lines[-1] == "":
            lines.pop()
        samples = self.samples
        fast = _FAST_OM.match
        for line_no, line in enumerate(lines[:eof_at], 1):
            self.line_no = line_no
            try:
                if not line:
                    if self.strict:
                        raise _LineError("blank lines are not allowed in OpenMetrics")
                    continue
                if line[0] == "#":
                    self.descriptor(line)
                    continue
                match = fast(line)
                sample = self.slow_sample(line) if match is None else self.fast_sample(match)
                fam = self.family_for(sample.name)
                if self.check_sample(fam, sample):
                    samples.append(sample)
            except _LineError as err:
                self.fail(line_no, err.reason)
        self.close_current()
        self.check_end(lines, eof_at)
        return self.result(OPENMETRICS_100)

    def check_end(self, lines: list[str], eof_at: int | None) -> None:
        if eof_at is None:
            self.fail(len(lines), "missing '# EOF' (OpenMetrics ends with it; the exposition may be truncated)")
            return
        for line_no, line in enumerate(lines[eof_at + 1 :], eof_at + 2):
            if line or line_no != len(lines):
                self.fail(line_no, "content after '# EOF'")
                if self.strict:
                    return

    def fast_sample(self, match: re.Match[str]) -> Sample:
        name, label_text, value_text, stamp_text, ex_labels, ex_value, ex_stamp = match.groups()
        labels = self.labels_of(label_text, True) if label_text else ()
        exemplar = None
        if ex_value is not None:
            exemplar = self.exemplar(self.labels_of(ex_labels, True) if ex_labels else (), ex_value, ex_stamp)
        stamp = _timestamp_s(stamp_text) if stamp_text else None
        return Sample(name, labels, float(value_text), stamp, exemplar)

    def slow_sample(self, line: str) -> Sample:
        match = _NAME_RE.match(line)
        if match is None:
            raise _LineError(f"invalid metric name at the start of {line[:40]!r}")
        name, pos = match.group(), match.end()
        labels: Labels = ()
        if line.startswith("{", pos):
            pairs, pos = self.scan_labels(line, pos + 1, True)
            labels = self.checked_labels(pairs, True)
        head, sep, tail = line[pos:].partition(" # ")
        if not head.startswith(" "):
            raise _LineError(f"expected one space then the value after {name!r}")
        tokens = head[1:].split(" ")
        if "" in tokens or len(tokens) > 2:
            raise _LineError("sample fields must be separated by single spaces, with nothing after them")
        value = _float(tokens[0], "sample value")
        stamp = _timestamp_s(tokens[1]) if len(tokens) == 2 else None
        exemplar = self.slow_exemplar(tail) if sep else None
        return Sample(name, labels, value, stamp, exemplar)

    def slow_exemplar(self, text: str) -> Exemplar:
        if not text.startswith("{"):
            raise _LineError("exemplar must start with a label set")
        pairs, pos = self.scan_labels(text, 1, True)
        labels = self.checked_labels(pairs, True)
        if not text.startswith(" ", pos):
            raise _LineError("exemplar label set must be followed by a space and a value")
        tokens = text[pos + 1 :].split(" ")
        if "" in tokens or len(tokens) > 2:
            raise _LineError("exemplar fields must be separated by single spaces")
        return self.exemplar(labels, tokens[0], tokens[1] if len(tokens) == 2 else None)

    def exemplar(self, labels: Labels, value: str, stamp: str | None) -> Exemplar:
        if sum(len(k) + len(v) for k, v in labels) > _MAX_EXEMPLAR_LABEL_CHARS:
            raise _LineError(f"exemplar labels exceed {_MAX_EXEMPLAR_LABEL_CHARS} characters")
        return Exemplar(labels, _float(value, "exemplar value"), _timestamp_s(stamp) if stamp else None)

    def descriptor(self, line: str) -> None:
        match = _DESCRIPTOR_OM.match(line)
        if match is None:
            if self.strict:
                raise _LineError(f"not an OpenMetrics descriptor: {line[:40]!r} (only HELP, TYPE, UNIT, EOF)")
            return
        keyword, rest = match.groups()
        name, sep, value = rest.partition(" ")
        if _NAME_FULL.match(name) is None:
            raise _LineError(f"invalid metric name {name!r} in {keyword} line")
        if not sep:
            raise _LineError(f"{keyword} line for {name!r} needs a space after the name")
        fam = self.family_to_describe(name, keyword)
        if keyword == "TYPE":
            self.set_type(fam, value)
        elif keyword == "HELP":
            self.set_help(fam, value)
        else:
            self.set_unit(fam, value)

    def family_to_describe(self, name: str, keyword: str) -> _Family:
        fam = self.current
        if fam is not None and fam.name == name:
            if fam.has_samples:
                raise _LineError(f"{keyword} for {name!r} after its samples")
            return fam
        if name in self.families:
            raise _LineError(f"metric family {name!r} is interleaved with another family")
        owner = self.family_of_suffixed(name)
        if owner is not None:
            raise _LineError(f"metric family {name!r} clashes with {owner.type} {owner.name!r}'s samples")
        self.close_current()
        fam = self.current = self.new_family(name, "unknown")
        return fam

    def set_type(self, fam: _Family, value: str) -> None:
        if fam.has_type:
            raise _LineError(f"second TYPE line for {fam.name!r}")
        if value not in _TYPES_OM:
            raise _LineError(f"unknown metric type {value!r} for {fam.name!r}")
        clash = next((fam.name + suffix for suffix in self.suffixes[value]
                      if suffix and fam.name + suffix in self.families), None)
        if clash is not None:
            raise _LineError(f"{value} {fam.name!r} clashes with the metric family {clash!r}")
        if fam.has_unit and fam.unit and value in ("info", "stateset"):
            raise _LineError(f"{value} {fam.name!r} cannot have a unit")
        fam.type, fam.has_type, fam.suffixes = value, True, self.suffixes[value]

    def set_help(self, fam: _Family, value: str) -> None:
        if fam.has_help:
            raise _LineError(f"second HELP line for {fam.name!r}")
        fam.help, fam.has_help = (self.unescape(value) if "\\" in value else value), True

    def set_unit(self, fam: _Family, value: str) -> None:
        if fam.has_unit:
            raise _LineError(f"second UNIT line for {fam.name!r}")
        if _UNIT_FULL.match(value) is None:
            raise _LineError(f"invalid unit {value!r}")
        if value and not fam.name.endswith("_" + value):
            raise _LineError(f"family {fam.name!r} with unit {value!r} must end in '_{value}'")
        if value and fam.type in ("info", "stateset"):
            raise _LineError(f"{fam.type} {fam.name!r} cannot have a unit")
        fam.unit, fam.has_unit = value, True

    def family_for(self, name: str) -> _Family:
        fam = self.current
        if fam is not None and name.startswith(fam.name) and name[len(fam.name):] in fam.suffixes:
            return fam
        if fam is not None and name == fam.name:
            raise _LineError(_misnamed(fam))
        owner = self.families.get(name) or self.family_of_suffixed(name)
        if owner is not None:
            if self.strict:
                raise _LineError(f"metric family {owner.name!r} is interleaved with another family")
            return owner
        self.close_current()
        fam = self.current = self.new_family(name, "unknown")
        return fam

    def check_sample(self, fam: _Family, sample: Sample) -> bool:
        """Every per-sample rule; False for a repeat of a point at the same timestamp (the first is kept)."""
        suffix = sample.name[len(fam.name):]
        if sample.exemplar is not None and _EXEMPLAR_SUFFIXES.get(fam.type) != suffix:
            raise _LineError(f"exemplars are not allowed on {fam.type} sample {sample.name!r}")
        if suffix in _NON_NEGATIVE.get(fam.type, ()) and not sample.value >= 0:
            raise _LineError(f"{fam.type} sample {sample.name!r} must be a non-negative number")
        if suffix in _NOT_NAN.get(fam.type, ()) and math.isnan(sample.value):
            raise _LineError(f"{fam.type} sample {sample.name!r} must not be NaN")
        self.check_type_rules(fam, suffix, sample)
        self.check_group(fam, sample)
        if not self.check_repeat(fam, sample):
            return False
        fam.has_samples = True
        fam.last_line = self.line_no
        if suffix and fam.type in ("histogram", "gaugehistogram"):
            fam.buckets.append(sample)
        return True

    def check_group(self, fam: _Family, sample: Sample) -> None:
        """MetricPoints of one Metric are not interleaved with another's, and their timestamps agree."""
        group = _group_of(fam, sample)
        if group != fam.group:
            if group in fam.groups:
                raise _LineError(f"metric {fam.name}{dict(group)} is interleaved with another of its family")
            fam.group, fam.group_stamp = group, sample.timestamp
            fam.groups.add(group)
            return
        if (sample.timestamp is None) != (fam.group_stamp is None):
            raise _LineError(f"{sample.name}: some samples of one metric have a timestamp and some do not")
        before, now = fam.group_stamp, sample.timestamp
        if fam.type != "info" and before is not None and now is not None and now < before:
            raise _LineError(f"{sample.name}: timestamps go backwards within a metric")
        fam.group_stamp = sample.timestamp

    def check_repeat(self, fam: _Family, sample: Sample) -> bool:
        """A series may repeat with later timestamps (several points); the same timestamp keeps the first."""
        key = (sample.name, sample.labels)
        if key in fam.seen:
            before = fam.seen[key]
            if before is None or sample.timestamp is None:
                raise _LineError(f"duplicate sample {sample.name} with the same labels")
            if sample.timestamp < before:
                raise _LineError(f"{sample.name}: timestamps go backwards")
            if sample.timestamp == before:
                return False
        fam.seen[key] = sample.timestamp
        return True

    def check_type_rules(self, fam: _Family, suffix: str, sample: Sample) -> None:
        if fam.type in ("histogram", "summary", "gaugehistogram"):
            _check_required_label(fam.type, fam.name, sample.name, sample.labels)
            if fam.type != "summary" and suffix == "_bucket":
                _check_canonical(sample.label("le") or "", "le")
            elif fam.type == "summary" and not suffix:
                quantile = _check_canonical(sample.label("quantile") or "", "quantile")
                if not 0 <= quantile <= 1:
                    raise _LineError(f"quantile {sample.label('quantile')!r} of {sample.name!r} is outside [0, 1]")
                if sample.value < 0:
                    raise _LineError(f"summary quantile value of {sample.name!r} must not be negative")
        elif fam.type == "info" and sample.value != 1:
            raise _LineError(f"info sample {sample.name!r} must have the value 1")
        elif fam.type == "stateset":
            if sample.label(fam.name) is None:
                raise _LineError(f"stateset sample {sample.name!r} needs a label named {fam.name!r}")
            if sample.value not in (0, 1):
                raise _LineError(f"stateset sample {sample.name!r} must be 0 or 1")

    def close_current(self) -> None:
        fam = self.current
        self.current = None
        if fam is None or not fam.buckets:
            return
        try:
            _check_histogram(fam)
        except _LineError as err:
            self.fail(fam.last_line, err.reason)


def _misnamed(fam: _Family) -> str:
    if fam.type == "counter":
        return f"counter {fam.name!r}: its samples must be named {fam.name + '_total'!r}"
    return f"sample {fam.name!r} is not a valid name in {fam.type} family {fam.name!r} ({fam.suffixes})"


def _group_of(fam: _Family, sample: Sample) -> Labels:
    """The labels that identify a sample's Metric (prometheus_client's _group_for_sample)."""
    if fam.type == "info":
        return ()
    drop = None
    if fam.type == "summary" and sample.name == fam.name:
        drop = "quantile"
    elif fam.type in ("histogram", "gaugehistogram") and sample.name == fam.name + "_bucket":
        drop = "le"
    elif fam.type == "stateset":
        drop = fam.name
    return sample.labels if drop is None else tuple(pair for pair in sample.labels if pair[0] != drop)


def _check_canonical(text: str, what: str) -> float:
    """An ``le`` / ``quantile`` value: a real number, or +Inf / -Inf spelled so (never NaN or +INF)."""
    if text not in ("+Inf", "-Inf") and _REAL_FULL.match(text) is None:
        raise _LineError(f"{what} label value {text!r} must be a number (infinity is written +Inf)")
    return float(text)


def _check_histogram(fam: _Family) -> None:
    """Per MetricPoint (one label set, one timestamp): buckets cumulative in ascending bounds ending
    with +Inf, a count equal to the +Inf bucket, _sum and _count together (_gsum and _gcount), no
    _sum beside negative buckets, a negative _gsum only beside them."""
    point: list[Sample] = []
    for sample in fam.buckets:
        if point and (_group_of(fam, sample) != _group_of(fam, point[0]) or sample.timestamp != point[0].timestamp):
            _check_histogram_point(fam, point)
            point = []
        point.append(sample)
    if point:
        _check_histogram_point(fam, point)


def _check_histogram_point(fam: _Family, point: list[Sample]) -> None:
    where = f"{fam.name}{dict(_group_of(fam, point[0]))}"
    by_suffix: dict[str, list[Sample]] = {}
    for sample in point:
        by_suffix.setdefault(sample.name[len(fam.name):], []).append(sample)
    buckets = [(float(s.label("le") or "nan"), s.value) for s in by_suffix.get("_bucket", [])]
    bounds = [bound for bound, _ in buckets]
    if bounds != sorted(bounds) or len(set(bounds)) != len(bounds):
        raise _LineError(f"{where}: buckets are not in ascending 'le' order")
    if not bounds or bounds[-1] != math.inf:
        raise _LineError(f"{where}: no le=\"+Inf\" bucket")
    values = [value for _, value in buckets]
    if values != sorted(values):
        raise _LineError(f"{where}: buckets are not cumulative")
    sum_suffix, count_suffix = ("_sum", "_count") if fam.type == "histogram" else ("_gsum", "_gcount")
    counts, sums = by_suffix.get(count_suffix, []), by_suffix.get(sum_suffix, [])
    if counts and counts[0].value != values[-1]:
        raise _LineError(f"{where}: {count_suffix} {counts[0].value} differs from the +Inf bucket {values[-1]}")
    if bool(counts) != bool(sums):
        have, lack = (count_suffix, sum_suffix) if counts else (sum_suffix, count_suffix)
        raise _LineError(f"{where}: {have} without {lack}")
    negative_buckets = bounds[0] < 0
    if fam.type == "histogram" and negative_buckets and sums:
        raise _LineError(f"{where}: a histogram with negative buckets cannot have a _sum")
    if fam.type == "gaugehistogram" and sums and sums[0].value < 0 and not negative_buckets:
        raise _LineError(f"{where}: a negative _gsum needs negative buckets")


def _timestamp_s(text: str) -> float:
    if _REAL_FULL.match(text) is None:
        raise _LineError(f"invalid timestamp {text!r}")
    stamp = float(text)
    if math.isinf(stamp):
        raise _LineError(f"timestamp {text!r} is out of range")
    return stamp


# --- writing 0.0.4 -------------------------------------------------------------------------------

# How a family of each type is written in 0.0.4, per sample-name suffix: the 0.0.4 type, whether the
# 0.0.4 family keeps the family's name (else it is named after the sample), whether it keeps the HELP.
_WRITE_AS: Mapping[str, Mapping[str, tuple[str, bool, bool]]] = {
    "counter": {"": ("counter", True, True), "_total": ("counter", False, True), "_created": ("gauge", False, False)},
    "gauge": {"": ("gauge", True, True)},
    "untyped": {"": ("untyped", True, True)},
    "unknown": {"": ("untyped", True, True)},
    "histogram": {s: ("histogram", True, True) for s in ("_bucket", "_count", "_sum")}
    | {"_created": ("gauge", False, False)},
    "summary": {s: ("summary", True, True) for s in ("", "_count", "_sum")} | {"_created": ("gauge", False, False)},
    "gaugehistogram": {s: ("gauge", False, False) for s in ("_bucket", "_gcount", "_gsum")},
    "info": {"_info": ("gauge", False, True)},
    "stateset": {"": ("gauge", False, True)},
}
_SUFFIX_ORDER = ("", "_bucket", "_count", "_sum", "_total", "_created", "_gcount", "_gsum", "_info")


def format(
    data: ParseResult | Iterable[Sample],
    families: Mapping[str, MetricFamily] | None = None,
) -> str:
    """Write samples as Prometheus text 0.0.4, with HELP/TYPE before each family's first sample.

    OpenMetrics-only parts are written as what 0.0.4 can carry: a counter ``foo`` becomes the 0.0.4
    counter ``foo_total``; ``_created``, gauge histograms, info and stateset become gauges. Exemplars
    and sub-millisecond timestamp digits have no 0.0.4 form and are dropped.
    """
    if isinstance(data, ParseResult):
        samples: Iterable[Sample] = data.samples
        families = data.families if families is None else families
    else:
        samples = data
    families = families or {}
    out: list[str] = []
    written: set[str] = set()
    placement: dict[str, tuple[str, str | None, str, str]] = {}
    for sample in samples:
        where = placement.get(sample.name)
        if where is None:
            where = placement[sample.name] = _placement(sample.name, families)
        name, type_, help_, _ = where
        if name not in written:
            written.add(name)
            _write_metadata(out, name, type_, help_)
        out.append(_sample_line(sample))
    described = {source for _, _, _, source in placement.values()}
    for fam in families.values():
        if fam.name not in described and fam.name not in written:
            type_ = fam.type if fam.type in _TYPES_004 else "untyped"
            _write_metadata(out, fam.name, type_, fam.help)
    return "".join(out)


def _placement(name: str, families: Mapping[str, MetricFamily]) -> tuple[str, str | None, str, str]:
    """The 0.0.4 family (name, type, help) a sample goes into, and the family it came from."""
    for suffix in _SUFFIX_ORDER:
        if suffix and not name.endswith(suffix):
            continue
        fam = families.get(name[: len(name) - len(suffix)])
        if fam is None:
            continue
        rule = _WRITE_AS.get(fam.type, {}).get(suffix)
        if rule is not None:
            type_, keeps_name, keeps_help = rule
            return (fam.name if keeps_name else name), type_, (fam.help if keeps_help else ""), fam.name
    return name, None, "", name


def _write_metadata(out: list[str], name: str, type_: str | None, help_: str) -> None:
    if help_:
        out.append(f"# HELP {name} {help_.replace(chr(92), chr(92) * 2).replace(chr(10), chr(92) + 'n')}\n")
    if type_ is not None:
        out.append(f"# TYPE {name} {type_}\n")


def _sample_line(sample: Sample) -> str:
    if _NAME_FULL.match(sample.name) is None:
        raise ValueError(f"cannot write sample: invalid metric name {sample.name!r}")
    parts = [sample.name]
    if sample.labels:
        parts.append("{")
        parts.append(",".join(f'{_label_name(k)}="{_escape_label(v)}"' for k, v in sample.labels))
        parts.append("}")
    parts.append(" ")
    parts.append(_number(sample.value))
    if sample.timestamp is not None:
        parts.append(f" {round(sample.timestamp * 1000)}")
    parts.append("\n")
    return "".join(parts)


def _label_name(name: str) -> str:
    if _LABEL_NAME_FULL.match(name) is None or name == "__name__":
        raise ValueError(f"cannot write sample: invalid label name {name!r}")
    return name


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    value = float(value)
    if value != value:
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(value)
