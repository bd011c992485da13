"""`--fail-if EXPR`: a condition on named figures of a report or a diff, for CI.

    condition = parse("peak > 20GiB or activations_growth >= 50%", DIFF_FIGURE_NAMES)
    crossed = evaluate(condition, diff_figures(diff))   # the comparisons that made it hold; () if not

The grammar, parsed by hand (nothing in it is ever evaluated as code):

    expression := conjunction ("or" conjunction)*
    conjunction := term ("and" term)*
    term := "(" expression ")" | NAME OPERATOR BOUND
    OPERATOR := ">" | ">=" | "<" | "<=" | "==" | "!="
    BOUND := a size ("24GiB", "512MB", a number of bytes) or a percentage ("10%")

A figure is bytes or percent; a size bound goes with a byte figure, a percentage with a percent
figure (a bare number is either). The figures and what they mean are listed in docs/gate.md.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from oomdoctor.analysis.diff import ALLOCATED, MEMORY_FIGURES, Diff, MomentDiff
from oomdoctor.analysis.results import Analysis
from oomdoctor.errors import OomdoctorError
from oomdoctor.metadata import COMPONENTS
from oomdoctor.units import parse_size

BYTES = "bytes"
PERCENT = "percent"
OPERATORS = (">=", "<=", "==", "!=", ">", "<")
EXPRESSION_LIMIT = 1000  # characters: a condition is a line, not a program
DEPTH_LIMIT = 32  # nested parentheses

# Figures of one report: each in bytes, at the moment the report judges (the OOM, else the peak,
# else the dump), but for `peak`, the highest allocated bytes of the trace.
REPORT_FIGURE_NAMES: tuple[str, ...] = (
    "peak",
    "peak_allocated",
    "allocated",
    "reserved",
    "free_cached",
    "fragmented",
    *COMPONENTS,
)
# Figures of a diff, all at the peak: B's figure, its change from A in bytes
# (`_change`) and in percent of A (`_growth`).
_DIFF_BASES = ("peak", "peak_allocated", "reserved", "free_cached", "fragmented", *COMPONENTS)
DIFF_FIGURE_NAMES: tuple[str, ...] = tuple(
    name for base in _DIFF_BASES for name in (base, f"{base}_change", f"{base}_growth")
)


class GateError(OomdoctorError):
    """A --fail-if expression that cannot be read (one line, exit 2)."""


@dataclass(frozen=True, slots=True)
class Comparison:
    figure: str
    operator: str
    bound: float
    unit: str | None  # BYTES | PERCENT | None (a bare number)
    text: str  # as written


@dataclass(frozen=True, slots=True)
class Either:
    terms: tuple[Condition, ...]


@dataclass(frozen=True, slots=True)
class Both:
    terms: tuple[Condition, ...]


Condition = Comparison | Either | Both


@dataclass(frozen=True, slots=True)
class Value:
    value: float  # bytes or percent
    unit: str  # BYTES | PERCENT


@dataclass(frozen=True, slots=True)
class Crossing:
    """A comparison that held: the figure, its value, and the bound it crossed."""

    comparison: Comparison
    value: Value


_TOKEN = re.compile(r"\s*(?:(\()|(\))|(>=|<=|==|!=|>|<)|([A-Za-z_][A-Za-z0-9_.]*)|(-?[0-9][0-9.]*\s*[A-Za-z%]*))")


def _tokens(text: str) -> list[str]:
    tokens, position = [], 0
    while position < len(text):
        if text[position:].strip() == "":
            break
        match = _TOKEN.match(text, position)
        if match is None or match.end() == position:
            raise GateError(f"--fail-if: cannot read {text[position : position + 20]!r} in {text!r}")
        tokens.append(match.group().strip())
        position = match.end()
    return tokens


def parse(text: str, names: tuple[str, ...]) -> Condition:
    """The condition `text` states, over the figures `names`; GateError for anything else."""
    if len(text) > EXPRESSION_LIMIT:
        raise GateError(f"--fail-if: the expression is longer than {EXPRESSION_LIMIT} characters")
    tokens = _tokens(text)
    if not tokens:
        raise GateError("--fail-if: the expression is empty (try: peak > 20GiB)")
    parser = _Parser(tokens, text, names)
    condition = parser.expression(0)
    if parser.position != len(tokens):
        raise GateError(f"--fail-if: unexpected {tokens[parser.position]!r} in {text!r}")
    return condition


class _Parser:
    def __init__(self, tokens: list[str], text: str, names: tuple[str, ...]):
        self.tokens, self.text, self.names, self.position = tokens, text, names, 0

    def _peek(self) -> str | None:
        return self.tokens[self.position] if self.position < len(self.tokens) else None

    def _take(self) -> str:
        token = self._peek()
        if token is None:
            raise GateError(f"--fail-if: {self.text!r} ends too soon")
        self.position += 1
        return token

    def expression(self, depth: int) -> Condition:
        terms = [self.conjunction(depth)]
        while (self._peek() or "").lower() == "or":
            self._take()
            terms.append(self.conjunction(depth))
        return terms[0] if len(terms) == 1 else Either(tuple(terms))

    def conjunction(self, depth: int) -> Condition:
        terms = [self.term(depth)]
        while (self._peek() or "").lower() == "and":
            self._take()
            terms.append(self.term(depth))
        return terms[0] if len(terms) == 1 else Both(tuple(terms))

    def term(self, depth: int) -> Condition:
        if self._peek() == "(":
            if depth >= DEPTH_LIMIT:
                raise GateError(f"--fail-if: more than {DEPTH_LIMIT} nested parentheses")
            self._take()
            inner = self.expression(depth + 1)
            if self._peek() != ")":
                raise GateError(f"--fail-if: a parenthesis is not closed in {self.text!r}")
            self._take()
            return inner
        name = self._take()
        if name not in self.names:
            raise GateError(f"--fail-if: no figure {name!r} (figures: {', '.join(self.names)})")
        operator = self._take()
        if operator not in OPERATORS:
            raise GateError(f"--fail-if: expected one of {' '.join(OPERATORS)} after {name}, not {operator!r}")
        bound_text = self._take()
        value, unit = _bound(bound_text)
        kind = figure_unit(name)
        if unit is not None and unit != kind:
            wanted = "a size such as 20GiB" if kind == BYTES else "a percentage such as 10%"
            raise GateError(f"--fail-if: {name} is in {kind}: compare it with {wanted}, not {bound_text!r}")
        return Comparison(name, operator, value, unit, f"{name} {operator} {bound_text}")


def _bound(text: str) -> tuple[float, str | None]:
    compact = text.replace(" ", "")
    if compact.startswith("-"):
        value, unit = _bound(compact[1:])
        return -value, unit
    if compact.endswith("%"):
        try:
            return float(compact[:-1]), PERCENT
        except ValueError:
            raise GateError(f"--fail-if: not a percentage: {text!r}") from None
    try:
        if re.fullmatch(r"[0-9]+(\.[0-9]*)?", compact):
            return float(compact), None
        return float(parse_size(compact)), BYTES
    except ValueError:
        raise GateError(f"--fail-if: not a size or a percentage: {text!r} (try 20GiB, 512MB or 10%)") from None


def figure_unit(name: str) -> str:
    return PERCENT if name.endswith("_growth") else BYTES


def evaluate(condition: Condition, figures: dict[str, Value]) -> tuple[Crossing, ...]:
    """The comparisons that make `condition` hold over `figures`; () when it does not hold."""
    if isinstance(condition, Comparison):
        value = figures[condition.figure]
        return (Crossing(condition, value),) if _holds(value.value, condition.operator, condition.bound) else ()
    results = [evaluate(term, figures) for term in condition.terms]
    if isinstance(condition, Both):
        return tuple(c for r in results for c in r) if all(results) else ()
    return tuple(c for r in results for c in r)


def _holds(value: float, operator: str, bound: float) -> bool:
    return {
        ">": value > bound,
        ">=": value >= bound,
        "<": value < bound,
        "<=": value <= bound,
        "==": value == bound,
        "!=": value != bound,
    }[operator]


def report_figures(analysis: Analysis) -> dict[str, Value]:
    """The figures `oomdoctor report --fail-if` reads (REPORT_FIGURE_NAMES), in bytes."""
    pools = analysis.fragmentation.pools
    figures = {
        "peak": analysis.replay.peak_allocated_bytes,
        "peak_allocated": analysis.replay.peak_allocated_bytes,
        "allocated": analysis.replay.target_allocated_bytes,
        "reserved": analysis.accounting.reserved_bytes,
        "free_cached": analysis.accounting.free_cached_bytes,
        "fragmented": sum(p.free_bytes - p.largest_free_block_bytes for p in pools),
        **{name: 0 for name in COMPONENTS},
        **analysis.component_bytes(),
    }
    return {name: Value(float(value), BYTES) for name, value in figures.items()}


def diff_figures(diff: Diff) -> dict[str, Value]:
    """The figures `oomdoctor diff --fail-if` reads (DIFF_FIGURE_NAMES): B's, and its change from A."""
    pairs: dict[str, tuple[int, int]] = {}
    peak = diff.at_peak
    allocated = _pair(peak, ALLOCATED)
    pairs["peak"] = pairs["peak_allocated"] = allocated
    for name in MEMORY_FIGURES:
        if name != ALLOCATED:
            pairs[name] = _pair(peak, name)
    for figure in peak.components:
        pairs[figure.name] = (figure.a_bytes, figure.b_bytes)
    figures: dict[str, Value] = {}
    for base in _DIFF_BASES:
        a, b = pairs[base]
        figures[base] = Value(float(b), BYTES)
        figures[f"{base}_change"] = Value(float(b - a), BYTES)
        figures[f"{base}_growth"] = Value(_growth(a, b), PERCENT)
    return figures


def _pair(moments: MomentDiff, name: str) -> tuple[int, int]:
    figure = moments.figure(name)
    return (figure.a_bytes, figure.b_bytes) if figure is not None else (0, 0)


def _growth(a: int, b: int) -> float:
    """B's change from A in percent of A: infinite when A is zero and B is not."""
    if a == 0:
        return 0.0 if b == 0 else math.copysign(math.inf, b)
    return (b - a) * 100.0 / a
