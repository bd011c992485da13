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
from dataclasses import dataclass, replace

from oomdoctor.messages.eras import era_of
from oomdoctor.units import parse_size

WINDOW_LINES = 80  # a message with its wrapping and interleaved noise fits in this many lines

CACHING_ALLOCATOR = "caching-allocator"
PREEMPTIVE_REJECTION = "preemptive-rejection"
CUDA_MALLOC_ASYNC = "cuda-malloc-async"
MPS = "mps"
THC = "legacy-thc"
CUDA_ERROR = "cuda-error"
LIBRARY_ALLOC = "library-alloc"
CPU_ALLOCATOR = "cpu-allocator"
BATCH_SIZE_FINDER = "batch-size-finder"
KINDS = (CACHING_ALLOCATOR, PREEMPTIVE_REJECTION, CUDA_MALLOC_ASYNC, MPS, THC, CUDA_ERROR, LIBRARY_ALLOC,
         CPU_ALLOCATOR, BATCH_SIZE_FINDER)  # fmt: skip


@dataclass(frozen=True)
class ProcessUsage:
    """One NVML line: `pid` None is the line about this process ("Including non-PyTorch memory")."""

    pid: int | None
    used_bytes: int


@dataclass(frozen=True)
class OomMessage:
    """One OOM message as found. Sizes are bytes, exact to the message's two decimals.

    `allocated_bytes` is the message's "allocated" figure: live tensors, plus (2.1+) free cached
    blocks in private pools. `reserved_bytes` is only set where the message states it (1.5-2.0;
    derived for 0.4.1-1.4 as allocated + cached). `allowed_bytes` is a per-process limit (memory
    fraction; MPS's "max allowed"). `wording` names the message layout; `era` the torch versions
    whose wording it is, from `era_clues`.
    """

    kind: str
    backend: str  # "cuda", "rocm", "xpu", "mps", "cpu", or "unknown"
    text: str  # the message, whitespace collapsed
    line: int  # 1-based line where it starts
    wording: str
    exception_type: str | None = None
    device_index: int | None = None
    requested_bytes: int | None = None
    request_too_large: bool = False  # "Tried to allocate more than 1EB memory."
    capacity_bytes: int | None = None
    free_bytes: int | None = None
    allowed_bytes: int | None = None
    allocated_bytes: int | None = None
    reserved_bytes: int | None = None
    private_pool_bytes: int | None = None
    reserved_unallocated_bytes: int | None = None
    other_allocations_bytes: int | None = None  # MPS: Metal memory outside PyTorch's heaps
    processes: tuple[ProcessUsage, ...] = ()
    pool: str | None = None  # MPS: "shared" or "private"
    hint: str | None = None  # the setting the message suggests
    location: str | None = None  # THC: source file and line
    truncated: bool = False
    era: str | None = None
    era_clues: tuple[str, ...] = ()
    occurrences: int = 1

    def identity(self) -> tuple:
        """What makes two occurrences the same message (a log repeating it, a wrapper re-raising it)."""
        skip = {"text", "line", "exception_type", "truncated", "occurrences", "era", "era_clues"}
        return tuple(getattr(self, name) for name in self.__dataclass_fields__ if name not in skip)


# -- patterns ------------------------------------------------------------------------------------

_GAP = r"(?:\s|\[[A-Za-z_]*\d+\]:)*"  # whitespace, or a torchrun prefix glued into a joined line
_PLACEHOLDERS = {
    "size": r"(?P<{0}>\d+(?:\.\d+)?\s*(?:bytes|[KMGT]i?B))",
    "int": r"(?P<{0}>\d+)",
    "word": r"(?P<{0}>\w+)",
}


def _pattern(template: str) -> re.Pattern[str]:
    """Template -> regex: `{size:name}` etc. are groups, every space may be any run of whitespace."""
    out = [_GAP]
    for part in re.split(r"(\{\w+:\w+\})", template):
        field = re.fullmatch(r"\{(\w+):(\w+)\}", part)
        if field:
            out.append(_PLACEHOLDERS[field[1]].format(field[2]))
        elif part:
            out.append(r"\s+".join(re.escape(word) for word in re.split(r" +", part)))
    return re.compile("".join(out))


_SIZE = _PLACEHOLDERS["size"].format("n")
_EXCEPTION_BEFORE = re.compile(r"([\w.]*(?:OutOfMemoryError|RuntimeError|Error)):\s*(?:\.\.\.)?$")
# Every branch starts with a literal, so that the regex engine skips most of a long log quickly.
_ANCHORS = re.compile(
    r"(?P<native>(?P<backend>CUDA|HIP|XPU)\s+out\s+of\s+memory\.)"
    r"|(?P<fragment>Tried\s+to\s+allocate\s+" + _SIZE + r"\s*(?:\(GPU|\.\s*GPU))"
    r"|(?P<mps>MPS\s+backend\s+out\s+of\s+memory)"
    r"|(?P<async>Allocation\s+on\s+device(?P<async_device>\s+\d+\s+would\s+exceed)?)"
    r"|(?P<thc>cuda\s+runtime\s+error\s+\(2\)\s*:\s*out\s+of\s+memory|THCudaCheck\s+FAIL\s+file=\S+\s+line=\d+\s+error=2\s*:\s*out\s+of\s+memory)"
    r"|(?P<cuda_error>(?P<error_backend>CUDA|HIP)\s+(?:driver\s+)?error:\s*out\s+of\s+memory)"
    r"|(?P<library>(?:CUBLAS|CUDNN|CUSOLVER|CUSPARSE|CUFFT|HIPBLAS|MIOPEN)_STATUS_ALLOC_FAILED)"
    r"|(?P<cpu>DefaultCPUAllocator:\s*(?:not\s+enough\s+memory|can't\s+allocate\s+memory))"
    r"|(?P<finder>No\s+executable\s+batch\s+size\s+found,\s+reached\s+zero\.)"
)


# Patterns that begin with a literal are searched fast; _ANCHORS then runs only around their hits.
_KEYWORDS = [re.compile(k) for k in (r"out\s+of\s+memory", r"Tried\s+to\s+allocate", r"Allocation\s+on\s+device",
             r"_STATUS_ALLOC_FAILED", r"DefaultCPUAllocator", r"No\s+executable\s+batch")]  # fmt: skip


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
    """A bare "Allocation on device" is cudaMallocAsync's only when it is an OutOfMemoryError's message."""
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


def _bytes(size_text: str, *, mps: bool = False) -> int:
    number, unit = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(\w+)", size_text).groups()
    if unit in ("bytes", "B"):
        return int(float(number))
    if mps and not unit.endswith("iB"):  # MPS prints binary sizes as KB/MB/GB (older releases)
        unit = unit[0] + "iB"
    return parse_size(number + unit)


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
        fields, end = _PARSERS[_group(anchor)](text, anchor)
        line_start = line_starts[bisect.bisect_right(line_starts, anchor.start()) - 1]
        before = _EXCEPTION_BEFORE.search(text, line_start, anchor.start())
        fields["exception_type"] = before.group(1) if before else None
        fields["text"] = " ".join(text[anchor.start() : end].split())
        fields["line"] = first_line + bisect.bisect_right(line_starts, anchor.start())
        message = OomMessage(**fields)
        era, clues = era_of(message)
        found.append(replace(message, era=era, era_clues=clues))
        position = max(end, anchor.end())
    return found


def _group(anchor: re.Match[str]) -> str:
    return next(name for name in _PARSERS if anchor.group(name) is not None)


def _deduplicate(messages: list[OomMessage]) -> list[OomMessage]:
    unique: dict[tuple, OomMessage] = {}
    for message in messages:
        key = message.identity()
        if key in unique:
            kept = unique[key]
            unique[key] = replace(kept, occurrences=kept.occurrences + 1, truncated=kept.truncated and message.truncated)
        else:
            unique[key] = message
    return list(unique.values())


# -- one parser per message family ---------------------------------------------------------------


class _Cursor:
    def __init__(self, text: str, position: int) -> None:
        self.text, self.position = text, position

    def take(self, pattern: re.Pattern[str]) -> dict[str, str] | None:
        match = pattern.match(self.text, self.position)
        if match is None:
            return None
        self.position = match.end()
        return match.groupdict()


_BACKENDS = {"CUDA": "cuda", "HIP": "rocm", "XPU": "xpu"}
_TRIED = _pattern("Tried to allocate {size:requested}")
_TRIED_ABSURD = _pattern("Tried to allocate more than 1EB memory.")
_PREEMPTIVE = _pattern("Allocation was preemptively rejected because it would exceed per_process_memory_fraction limit.")
_REQUESTED_SIZE = _pattern("Requested size: {size:requested}")
_OLD = [
    _pattern("(GPU {int:device};"),
    _pattern("{size:capacity} total capacity;"),
    _pattern("{size:allocated} already allocated;"),
    _pattern("{size:free} free;"),
]
_OLD_ALLOWED = _pattern("{size:allowed} allowed;")
_OLD_RESERVED = re.compile(
    _pattern("{size:reserved} reserved in total by PyTorch)").pattern + "|" + _pattern("{size:cached} cached)").pattern
)
_OLD_HINT = _pattern(
    "If reserved memory is >> allocated memory try setting max_split_size_mb to avoid fragmentation."
    " See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF"
)
_NEW_GPU = _pattern(". GPU {int:device} has a total {word:capacity_word} of {size:capacity}")
_NEW_FREE = _pattern("of which {size:free} is free")
_DOT = _pattern(".")
_OWN_PROCESS = _pattern("Including non-PyTorch memory, this process has {size:used} memory in use.")
_OTHER_PROCESS = _pattern("Process {int:pid} has {size:used} memory in use.")
_NEW_ALLOWED = _pattern("{size:allowed} allowed;")
_NEW_ALLOCATED = _pattern("Of the allocated memory {size:allocated} is allocated by PyTorch,")
_NEW_PRIVATE = _pattern("with {size:private} allocated in private pools (e.g., {word:graphs} Graphs),")
_NEW_UNALLOCATED = _pattern("and {size:unallocated} is reserved by PyTorch but unallocated.")
_NEW_HINT = re.compile(
    _pattern("If reserved but unallocated memory is large try setting").pattern
    + r"\s+(?P<hint>max_split_size_mb|PYTORCH_\w*ALLOC_CONF=expandable_segments:True)\s+to\s+avoid\s+fragmentation\."
)
_SEE_DOCS = _pattern("See documentation for Memory Management")
_DOCS_TAIL = re.compile(
    _pattern("and PYTORCH_CUDA_ALLOC_CONF").pattern + "|" + _GAP + r"\((?P<url>https?://[^)]{1,300})\)"
)
_XPU_HINT = _pattern("Please use `empty_cache` to release all unoccupied cached memory.")


def _parse_native(text: str, anchor: re.Match[str]) -> tuple[dict, int]:
    backend_word = anchor.group("backend")
    at = _Cursor(text, anchor.end())
    if backend_word is None:  # a pasted fragment that starts at "Tried to allocate"
        at.position = anchor.start()
    fields: dict = {"kind": CACHING_ALLOCATOR, "backend": _BACKENDS.get(backend_word or "", "unknown"), "wording": ""}
    if at.take(_PREEMPTIVE) is not None:
        fields.update(kind=PREEMPTIVE_REJECTION, wording="2.12+ preemptive rejection")
        requested = at.take(_REQUESTED_SIZE)
        if requested:
            fields["requested_bytes"] = _bytes(requested["requested"])
        return fields, at.position
    if at.take(_TRIED_ABSURD) is not None:
        fields.update(request_too_large=True, wording="request over 1 EB")
        return fields, at.position
    tried = at.take(_TRIED)
    if tried is None:
        fields.update(wording="bare", truncated=True)
        return fields, at.position
    fields["requested_bytes"] = _bytes(tried["requested"])
    if _OLD[0].match(text, at.position):
        return _parse_old(at, fields)
    if _NEW_GPU.match(text, at.position):
        return _parse_new(at, fields)
    fields.update(wording="truncated after the request", truncated=True)
    return fields, at.position


def _parse_old(at: _Cursor, fields: dict) -> tuple[dict, int]:
    """0.4.1-2.0: "(GPU 0; T total capacity; A already allocated; F free; [L allowed; ]R reserved...)"."""
    fields["wording"] = "0.4.1-2.0 parenthesised"
    names = ("device_index", "capacity_bytes", "allocated_bytes", "free_bytes")
    for pattern, name in zip(_OLD, names):
        got = at.take(pattern)
        if got is None:
            fields["truncated"] = True
            return fields, at.position
        value = next(iter(got.values()))
        fields[name] = int(value) if name == "device_index" else _bytes(value)
    if (allowed := at.take(_OLD_ALLOWED)) is not None:
        fields["allowed_bytes"] = _bytes(allowed["allowed"])
    reserved = at.take(_OLD_RESERVED)
    if reserved is None:
        fields["truncated"] = True
        # "... 1.51 GiB reserved in total by PyTorch" without its closing parenthesis
        tail = _pattern("{size:reserved} reserved in total by PyTorch").match(at.text, at.position)
        if tail:
            fields.update(reserved_bytes=_bytes(tail["reserved"]), wording="1.5-2.0 reserved in total")
            fields["reserved_unallocated_bytes"] = fields["reserved_bytes"] - fields["allocated_bytes"]
            return fields, tail.end()
        return fields, at.position
    if reserved["cached"] is not None:  # 0.4.1-1.4: "cached" is reserved but not allocated
        fields["wording"] = "0.4.1-1.4 cached"
        fields["reserved_unallocated_bytes"] = _bytes(reserved["cached"])
        fields["reserved_bytes"] = fields["allocated_bytes"] + fields["reserved_unallocated_bytes"]
        return fields, at.position
    fields["wording"] = "1.5-2.0 reserved in total"
    fields["reserved_bytes"] = _bytes(reserved["reserved"])
    fields["reserved_unallocated_bytes"] = fields["reserved_bytes"] - fields["allocated_bytes"]
    if at.take(_OLD_HINT) is not None:
        fields["hint"] = "max_split_size_mb"
    return fields, at.position


def _parse_new(at: _Cursor, fields: dict) -> tuple[dict, int]:
    """2.1+: "GPU d has a total capacity of T of which F is free. {NVML lines}{L allowed; }Of the ..."."""
    gpu = at.take(_NEW_GPU)
    fields.update(wording="2.1+ sentences", device_index=int(gpu["device"]), capacity_bytes=_bytes(gpu["capacity"]))
    if gpu["capacity_word"] == "capacty":
        fields["wording"] = "2.1 sentences ('capacty')"
    if (free := at.take(_NEW_FREE)) is not None:
        fields["free_bytes"] = _bytes(free["free"])
    if at.take(_DOT) is None:
        fields["truncated"] = True
        return fields, at.position
    processes = []
    while (line := at.take(_OWN_PROCESS) or at.take(_OTHER_PROCESS)) is not None:
        processes.append(ProcessUsage(int(line["pid"]) if line.get("pid") else None, _bytes(line["used"])))
    fields["processes"] = tuple(processes)
    if (allowed := at.take(_NEW_ALLOWED)) is not None:
        fields["allowed_bytes"] = _bytes(allowed["allowed"])
    if (allocated := at.take(_NEW_ALLOCATED)) is None:
        fields["truncated"] = True
        return fields, at.position
    fields["allocated_bytes"] = _bytes(allocated["allocated"])
    if (private := at.take(_NEW_PRIVATE)) is not None:
        fields["private_pool_bytes"] = _bytes(private["private"])
    if (unallocated := at.take(_NEW_UNALLOCATED)) is None:
        fields["truncated"] = True
        return fields, at.position
    fields["reserved_unallocated_bytes"] = _bytes(unallocated["unallocated"])
    if at.take(_XPU_HINT) is not None:
        fields["hint"] = "empty_cache"
        return fields, at.position
    hint = at.take(_NEW_HINT)
    if hint is None:
        fields["truncated"] = True
        return fields, at.position
    fields["hint"] = hint["hint"]
    if at.take(_SEE_DOCS) is None or (tail := at.take(_DOCS_TAIL)) is None:
        fields["truncated"] = True
    elif tail.get("url"):
        fields["hint"] += f" ({''.join(tail['url'].split())})"  # a terminal may have wrapped the link
    return fields, at.position


_MPS = [
    _pattern("(MPS allocated: {size:allocated},"),
    _pattern("other allocations: {size:other},"),
    _pattern("max allowed: {size:allowed})."),
    _pattern("Tried to allocate {size:requested} on {word:pool} pool."),
]
_MPS_HINT = _pattern("Use PYTORCH_MPS_HIGH_WATERMARK_RATIO=0.0")
_MPS_HINT_TAIL = _pattern("to disable upper limit for memory allocations (may cause system failure).")


def _parse_mps(text: str, anchor: re.Match[str]) -> tuple[dict, int]:
    fields: dict = {"kind": MPS, "backend": "mps", "wording": "MPS"}
    at = _Cursor(text, anchor.end())
    names = {"allocated": "allocated_bytes", "other": "other_allocations_bytes", "allowed": "allowed_bytes",
             "requested": "requested_bytes"}  # fmt: skip
    for pattern in _MPS:
        got = at.take(pattern)
        if got is None:
            fields["truncated"] = True
            return fields, at.position
        for key, value in got.items():
            if key == "pool":
                fields["pool"] = value
            else:
                fields[names[key]] = _bytes(value, mps=True)
    if at.take(_MPS_HINT) is not None:
        fields["hint"] = "PYTORCH_MPS_HIGH_WATERMARK_RATIO=0.0"
        at.take(_MPS_HINT_TAIL)
    else:
        fields["truncated"] = True
    return fields, at.position


_ASYNC = [
    ("device_index", _pattern("{int:value} would exceed allowed memory. (out of memory)")),
    ("allocated_bytes", re.compile(_GAP + r"Currently\s+allocated\s*:\s*" + _SIZE.replace("?P<n>", "?P<value>"))),
    ("requested_bytes", re.compile(_GAP + r"Requested\s*:\s*" + _SIZE.replace("?P<n>", "?P<value>"))),
    ("capacity_bytes", re.compile(_GAP + r"Device\s+limit\s*:\s*" + _SIZE.replace("?P<n>", "?P<value>"))),
    ("free_bytes", re.compile(_GAP + r"Free\s+\(according\s+to\s+CUDA\)\s*:\s*" + _SIZE.replace("?P<n>", "?P<value>"))),
    ("allowed_bytes", re.compile(
        _GAP + r"PyTorch\s+limit\s+\(set\s+by\s+user-supplied\s+memory\s+fraction\)\s*:\s*" + _SIZE.replace("?P<n>", "?P<value>")
    )),
]  # fmt: skip


def _parse_async(text: str, anchor: re.Match[str]) -> tuple[dict, int]:
    """cudaMallocAsync: "Allocation on device d would exceed allowed memory. (out of memory)" + labelled lines."""
    fields: dict = {"kind": CUDA_MALLOC_ASYNC, "backend": "cuda", "wording": "cudaMallocAsync"}
    at = _Cursor(text, re.compile(r"Allocation\s+on\s+device").match(text, anchor.start()).end())
    for name, pattern in _ASYNC:
        got = at.take(pattern)
        if got is None:
            fields["truncated"] = True
            break
        fields[name] = int(got["value"]) if name == "device_index" else _bytes(got["value"])
    capacity, allowed = fields.get("capacity_bytes"), fields.get("allowed_bytes")
    if allowed is not None and capacity is not None and allowed >= capacity:
        fields["allowed_bytes"] = None  # no fraction set: the limit printed is the whole device or more
    return fields, at.position


_THC_LOCATION = re.compile(r"(?:at\s+\S*?/|file=\S*?/)(?P<file>[\w.]+\.cu)(?::|\s+line=)(?P<line>\d+)")


def _parse_thc(text: str, anchor: re.Match[str]) -> tuple[dict, int]:
    fields: dict = {"kind": THC, "backend": "cuda", "wording": "THC cuda runtime error (2)"}
    end = anchor.end()
    line_end = text.find("\n", end)
    location = _THC_LOCATION.search(text, anchor.start(), len(text) if line_end < 0 else line_end)
    if location:
        fields["location"] = f"{location['file']}:{location['line']}"
        end = max(end, location.end())
    return fields, end


def _parse_cuda_error(text: str, anchor: re.Match[str]) -> tuple[dict, int]:
    backend = "rocm" if anchor.group("error_backend") == "HIP" else "cuda"
    return {"kind": CUDA_ERROR, "backend": backend, "wording": "CUDA error: out of memory"}, anchor.end()


def _parse_library(text: str, anchor: re.Match[str]) -> tuple[dict, int]:
    backend = "rocm" if anchor.group("library").startswith(("HIP", "MIOPEN")) else "cuda"
    return {"kind": LIBRARY_ALLOC, "backend": backend, "wording": anchor.group("library")}, anchor.end()


_CPU_SIZE = re.compile(r":\s*you\s+tried\s+to\s+allocate\s+(\d+)\s+bytes\.?")


def _parse_cpu(text: str, anchor: re.Match[str]) -> tuple[dict, int]:
    fields: dict = {"kind": CPU_ALLOCATOR, "backend": "cpu", "wording": "DefaultCPUAllocator"}
    size = _CPU_SIZE.match(text, anchor.end())
    if size is None:
        return fields, anchor.end()
    fields["requested_bytes"] = int(size.group(1))
    return fields, size.end()


def _parse_finder(text: str, anchor: re.Match[str]) -> tuple[dict, int]:
    return {"kind": BATCH_SIZE_FINDER, "backend": "unknown", "wording": "accelerate find_executable_batch_size"}, anchor.end()


_PARSERS = {
    "native": _parse_native,
    "fragment": _parse_native,
    "mps": _parse_mps,
    "async": _parse_async,
    "thc": _parse_thc,
    "cuda_error": _parse_cuda_error,
    "library": _parse_library,
    "cpu": _parse_cpu,
    "finder": _parse_finder,
}
