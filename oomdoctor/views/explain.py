"""`oomdoctor explain` as plain text or JSON: each distinct OOM message, the highlighted one in full."""

from __future__ import annotations

import dataclasses
from typing import Any

import orjson

from oomdoctor.messages.explain import Explanation
from oomdoctor.messages.figures import Figure
from oomdoctor.safetext import json_printable, printable_lines
from oomdoctor.units import human_size, plural
from oomdoctor.views.wrap import MIN_LAST_CELL, fill, wrap_text

JSON_SCHEMA_VERSION = 1
WIDTH = 100  # the width text is wrapped to when not told another (a terminal's, --width)

_KIND_NAMES = {
    "caching-allocator": "caching allocator",
    "preemptive-rejection": "caching allocator, preemptive rejection (memory fraction)",
    "cuda-malloc-async": "cudaMallocAsync allocator",
    "mps": "allocator",
    "legacy-thc": "legacy THC allocator",
    "cuda-error": "runtime error outside the caching allocator",
    "library-alloc": "library allocation failure",
    "cpu-allocator": "allocator (host RAM)",
    "batch-size-finder": "accelerate batch-size finder",
    "exception-only": "OutOfMemoryError without its message",
    "memory-summary": "memory_summary() table",
    "deepspeed-memory": "DeepSpeed see_memory_usage line",
    "vllm-memory": "vLLM memory profiling",
}
_BACKEND_NAMES = {"cuda": "CUDA", "rocm": "ROCm (HIP)", "xpu": "XPU", "mps": "MPS", "cpu": "CPU"}


def _header(explanation: Explanation) -> str:
    m = explanation.message
    backend = _BACKEND_NAMES.get(m.backend)
    bits = [f"{backend} {_KIND_NAMES[m.kind]}" if backend else _KIND_NAMES[m.kind]]
    if m.device_index is not None:
        bits.append(f"GPU {m.device_index}")
    if m.era:
        bits.append(f"torch {m.era}")
    if m.exception_type:
        bits.append(m.exception_type)
    if m.truncated:
        bits.append("message cut short")
    return ", ".join(bits)


def _figure_rows(figures: tuple[Figure, ...], indent: str, width: int) -> list[str]:
    label_width = max((len(f.label) for f in figures), default=0)
    rows = []
    for f in figures:
        value = human_size(f.bytes) if f.bytes is not None else "-"
        head = f"{indent}{f.label:<{label_width}}  {value:>11}  "
        if width - len(head) >= MIN_LAST_CELL:  # the meaning beside its figure, else under it
            rows += fill(f.meaning, width, head, " " * len(head))
        else:
            rows += [head.rstrip(), *fill(f.meaning, width, indent + "    ", indent + "    ")]
    return rows


def _wrapped(text: str, width: int, indent: str, continuation: str | None = None) -> list[str]:
    hanging = " " * (len(indent) + 2) if continuation is None else continuation
    return fill(text, width, indent, hanging)


def _section(title: str, items: tuple[str, ...], width: int, numbered: bool = False) -> list[str]:
    if not items:
        return []
    lines = ["", f"  {title}"]
    for position, item in enumerate(items, 1):
        lines += _wrapped(item, width, f"    {position}. " if numbered else "    - ")
    return lines


def to_text(explanations: list[Explanation], highlighted: int, reason: str, source: str, *, width: int = WIDTH) -> str:
    """The explanations as text, wrapped to `width` (oomdoctor.views.wrap)."""
    total = sum(e.message.occurrences for e in explanations)
    distinct = len(explanations)
    lines = [f"{plural(total, 'OOM message')} in {source}"
             + (f" ({distinct} distinct)" if distinct != total else "")]  # fmt: skip
    if distinct > 1:
        lines.append(f"Message {highlighted + 1} is shown in full: {reason}.")
    for index, e in enumerate(explanations):
        m = e.message
        mark = "*" if index == highlighted else " "
        repeats = f", repeated {m.occurrences} times" if m.occurrences > 1 else ""
        lines += ["", f"{mark} Message {index + 1} of {distinct}, line {m.line}{repeats}: {_header(e)}"]
        lines.append(f"  Verdict: {e.verdict}  (confidence {e.confidence:.0%})")
        lines += _wrapped(e.summary, width, "  ", "  ")
        if index != highlighted:
            continue
        if m.era_clues:
            lines += _wrapped(f"torch {m.era or 'version unclear'}, from: {'; '.join(m.era_clues)}", width, "  ")
        lines += [""] + _wrapped(m.text, width, "  | ", "  | ")
        if e.figures:
            lines += ["", "  What the message says"] + _figure_rows(e.figures, "    ", width)
        if e.derived:
            lines += ["", "  What follows from it"] + _figure_rows(e.derived, "    ", width)
        lines += _section("Findings", e.findings, width)
        lines += _section("What to do", e.recommendations, width, numbered=True)
        lines += _section("Not known from a message", e.unknowns, width)
    # the messages come from a log or pasted text: no control character reaches the terminal; the
    # lines not wrapped above (a message's header) are wrapped like any text view's
    return wrap_text(printable_lines(lines), width) + "\n"


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def to_json(explanations: list[Explanation], highlighted: int, reason: str, source: str) -> bytes:
    """`messages[i]`: `message` (kind, backend, the figures in bytes, era, ...), `verdict`,
    `confidence`, `summary`, `figures`, `derived`, `findings`, `recommendations`, `unknowns`."""
    document = {
        "schema_version": JSON_SCHEMA_VERSION,
        "source": source,
        "occurrences": sum(e.message.occurrences for e in explanations),
        "highlighted": highlighted,
        "highlight_reason": reason,
        "messages": [_plain(e) for e in explanations],
    }
    return json_printable(orjson.dumps(document, option=orjson.OPT_INDENT_2)) + b"\n"
