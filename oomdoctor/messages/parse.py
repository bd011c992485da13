"""Find PyTorch out-of-memory messages in a log and read their figures into `OomMessage`s.

Tolerant of what logs do to the message: line wrapping (at spaces), per-line prefixes (`[rank3]:`,
`[default0]:`, vLLM's `(VllmWorker rank=3 pid=1090) ERROR 06-05 06:18:13 [file.py:470]`, logging
timestamps and levels, `> ` quotes), progress-bar lines cut into it, and truncation. Every format
torch has written is recognised: the caching allocator's message in each era (0.4.1-1.4 "cached",
1.5-2.0 "reserved in total", 2.1+ "of which ... is free" with NVML process lines), ROCm (HIP) and
XPU variants, MPS, cudaMallocAsync, the legacy THC error, `CUDA error: out of memory`, cuBLAS/cuDNN
allocation failures, the CPU allocator and accelerate's batch-size finder giving up.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import replace

from oomdoctor.messages import memory_reports
from oomdoctor.messages.eras import era_of
from oomdoctor.messages.formats import PARSERS, SIZE
from oomdoctor.messages.model import OomMessage

WINDOW_LINES = 80  # a message with its wrapping and interleaved noise fits in this many lines

_EXCEPTION_BEFORE = re.compile(r"([\w.]*(?:OutOfMemoryError|RuntimeError|Error)):\s*(?:\.\.\.)?$")
# Every branch starts with a literal, so that the regex engine skips most of a long log quickly.
_ANCHORS = re.compile(
    r"(?P<native>(?P<backend>CUDA|HIP|XPU)\s+out\s+of\s+memory\.)"
    r"|(?P<fragment>Tried\s+to\s+allocate\s+" + SIZE + r"\s*(?:\(GPU|\.\s*GPU))"
    r"|(?P<mps>MPS\s+backend\s+out\s+of\s+memory)"
    r"|(?P<async>Allocation\s+on\s+device(?P<async_device>\s+\d+\s+would\s+exceed)?)"
    r"|(?P<thc>cuda\s+runtime\s+error\s+\(2\)\s*:\s*out\s+of\s+memory|THCudaCheck\s+FAIL\s+file=\S+\s+line=\d+\s+error=2\s*:\s*out\s+of\s+memory)"
    r"|(?P<cuda_error>(?P<error_backend>CUDA|HIP)\s+(?:driver\s+)?error:\s*out\s+of\s+memory)"
    r"|(?P<library>(?:CUBLAS|CUDNN|CUSOLVER|CUSPARSE|CUFFT|HIPBLAS|MIOPEN)_STATUS_ALLOC_FAILED)"
    r"|(?P<cpu>DefaultCPUAllocator:\s*(?:not\s+enough\s+memory|can't\s+allocate\s+memory))"
    r"|(?P<finder>No\s+executable\s+batch\s+size\s+found,\s+reached\s+zero\.)" + memory_reports.ANCHORS
)
PARSERS = {**PARSERS, **memory_reports.PARSERS}


# Patterns that begin with a literal are searched fast; _ANCHORS then runs only around their hits.
_KEYWORDS = [re.compile(k) for k in (r"out\s+of\s+memory", r"Tried\s+to\s+allocate", r"Allocation\s+on\s+device",
             r"_STATUS_ALLOC_FAILED", r"DefaultCPUAllocator", r"No\s+executable\s+batch",
             *memory_reports.KEYWORDS)]  # fmt: skip


def _anchor_starts(text: str) -> set[int]:
    starts: set[int] = set()
    scanned_to = -1
    for hit in sorted(m.start() for keyword in _KEYWORDS for m in keyword.finditer(text)):
        if hit < scanned_to:
            continue
        # from the start of the previous line: the anchor may begin there (wrapped, or a long THC path)
        begin = text.rfind("\n", 0, max(0, text.rfind("\n", 0, hit))) + 1
        scanned_to = hit + 200
        starts.update(m.start() for m in _ANCHORS.finditer(text, begin, scanned_to) if _is_anchor(text, m))
    return starts


def _is_anchor(text: str, anchor: re.Match[str]) -> bool:
    """A bare "Allocation on device" is cudaMallocAsync's only when it is an OutOfMemoryError's message;
    a bare exception type is a message only where Python prints one (at a line's start) and no
    message follows it on its line."""
    if anchor.group("bare") is not None:
        line_start = text.rfind("\n", 0, anchor.start()) + 1
        if text[line_start : anchor.start()].strip():
            return False
        line_end = text.find("\n", anchor.end())
        rest = _ANCHORS.finditer(text, anchor.end(), len(text) if line_end < 0 else line_end)  # its own line only
        following = next((m for m in rest if m.group("bare") is None), None)
        return memory_reports.bare_is_anchor(text, anchor, following.start() if following else None)
    if anchor.group("async") is None or anchor.group("async_device"):
        return True
    return text[max(0, anchor.start() - 40) : anchor.start()].rstrip().endswith("OutOfMemoryError:")


_FOREIGN = (
    ("JAX/XLA", re.compile(r"RESOURCE_EXHAUSTED|XlaRuntimeError|jaxlib|BufferAssignment OOM")),
    ("TensorFlow", re.compile(r"ResourceExhaustedError|OOM when allocating tensor|tensorflow")),
)

_LINE_PREFIX = re.compile(
    r"^(?:\s*(?:"
    r"\[[A-Za-z_]*\d+\]:\s?"  # [rank3]:  [default0]:
    r"|\((?:[\w.-]+\s+)?\w+=[^)]*\)\s+"  # (VllmWorker rank=3 pid=1090)
    r"|(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\s+\d\d-\d\d\s+[\d:.]+\s+\[[^\]]*\]\s+"  # vLLM
    r"|(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\s*\|[^|]*\|\s*\S+\s+-\s+"  # loguru
    r"|\[?\d{4}-\d\d-\d\d[ T][\d:.,]+(?:Z|[+-]\d\d:?\d\d)?\]?(?:\s+-\s+\S+\s+-\s+[A-Z]+\s+-)?\s*"  # timestamps
    r"|\[(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\]\s*(?:\[[^\]]*\]\s*)?"  # DeepSpeed: [ERROR] [engine.py:12:step]
    r"|(?:DEBUG|INFO|WARNING|ERROR|CRITICAL):[\w.]*:"  # logging's default format: ERROR:root:
    r"|>(?!>)\s?"  # a quoted paste (not the message's own ">> allocated memory" wrapped to a line start)
    r"))+"
)
_PROGRESS_BAR = re.compile(r"\d+%\||\d+it/s\]|s/it\]|\?it/s\]")

# -- the log as lines ----------------------------------------------------------------------------


def _clean(lines: list[str]) -> str:
    """Strip prefixes from each line, blank progress-bar lines; line count is kept for line numbers."""
    out = []
    for line in lines:
        line = _LINE_PREFIX.sub("", line, count=1)
        if _PROGRESS_BAR.search(line) and not _ANCHORS.search(line):
            line = ""
        out.append(line)
    return "\n".join(out)


def find_messages(text: str) -> list[OomMessage]:
    """Every PyTorch OOM message in `text`, in order, each distinct one once (`occurrences` counts).

    Raises ForeignMessage when there is none but another framework's OOM is there.
    """
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text).replace("\r\n", "\n").replace("\r", "\n")
    lines = text.split("\n")
    line_starts = [0] + [m.end() for m in re.finditer("\n", text)]
    anchor_lines = sorted({bisect.bisect_right(line_starts, start) - 1 for start in _anchor_starts(text)})
    found: list[OomMessage] = []
    for first, last in _windows(anchor_lines, len(lines)):
        found.extend(_parse_window(_clean(lines[first:last]), first))
    if not found:
        for framework, pattern in _FOREIGN:
            if pattern.search(text):
                raise ForeignMessage(framework)
    return _deduplicate(found)


class ForeignMessage(ValueError):
    """The text holds another framework's out-of-memory message, not PyTorch's."""

    def __init__(self, framework: str) -> None:
        super().__init__(framework)
        self.framework = framework


def _windows(anchor_lines: list[int], line_count: int) -> list[tuple[int, int]]:
    windows: list[list[int]] = []
    for line in anchor_lines:
        if windows and line <= windows[-1][1]:
            windows[-1][1] = min(line + WINDOW_LINES, line_count)
        else:
            windows.append([line, min(line + WINDOW_LINES, line_count)])
    return [(a, b) for a, b in windows]


def _parse_window(text: str, first_line: int) -> list[OomMessage]:
    line_starts = [0] + [m.end() for m in re.finditer("\n", text)]
    found = []
    position = 0
    while (anchor := _ANCHORS.search(text, position)) is not None:
        if not _is_anchor(text, anchor):
            position = anchor.end()
            continue
        fields, end = PARSERS[_group(anchor)](text, anchor)
        line_start = line_starts[bisect.bisect_right(line_starts, anchor.start()) - 1]
        before = _EXCEPTION_BEFORE.search(text, line_start, anchor.start())
        fields["exception_type"] = before.group(1) if before else None
        fields.setdefault("text", " ".join(text[anchor.start() : end].split()))  # a report words its own
        fields["line"] = first_line + bisect.bisect_right(line_starts, anchor.start())
        message = OomMessage(**fields)
        era, clues = era_of(message)
        found.append(replace(message, era=era, era_clues=clues))
        position = max(end, anchor.end())
    return found


def _group(anchor: re.Match[str]) -> str:
    return next(name for name in PARSERS if anchor.group(name) is not None)


def _deduplicate(messages: list[OomMessage]) -> list[OomMessage]:
    unique: dict[tuple, OomMessage] = {}
    for message in messages:
        key = message.identity()
        if key in unique:
            kept = unique[key]
            unique[key] = replace(
                kept, occurrences=kept.occurrences + 1, truncated=kept.truncated and message.truncated
            )
        else:
            unique[key] = message
    return list(unique.values())
