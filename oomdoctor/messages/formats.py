"""One parser per message family: the text after an anchor -> the figures, in bytes, and where it ends.

Each parser takes the cleaned text and the anchor match and returns (fields for `OomMessage`, end
offset). Grammars are written as templates (`_pattern`), in which any space may be any run of
whitespace, so a message wrapped across lines reads the same. A piece that does not match where it
should marks the message `truncated` and ends it there.
"""

from __future__ import annotations

import re

from oomdoctor.messages.model import (
    BATCH_SIZE_FINDER,
    CACHING_ALLOCATOR,
    CPU_ALLOCATOR,
    CUDA_ERROR,
    CUDA_MALLOC_ASYNC,
    LIBRARY_ALLOC,
    MPS,
    PREEMPTIVE_REJECTION,
    THC,
    ProcessUsage,
)
from oomdoctor.units import parse_size

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


SIZE = _PLACEHOLDERS["size"].format("n")  # one size, as group "n"


def _bytes(size_text: str, *, mps: bool = False) -> int:
    number, unit = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(\w+)", size_text).groups()
    if unit in ("bytes", "B"):
        return int(float(number))
    if mps and not unit.endswith("iB"):  # MPS prints binary sizes as KB/MB/GB (older releases)
        unit = unit[0] + "iB"
    return parse_size(number + unit)


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
_PREEMPTIVE = _pattern(
    "Allocation was preemptively rejected because it would exceed per_process_memory_fraction limit."
)
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
    ("allocated_bytes", re.compile(_GAP + r"Currently\s+allocated\s*:\s*" + SIZE.replace("?P<n>", "?P<value>"))),
    ("requested_bytes", re.compile(_GAP + r"Requested\s*:\s*" + SIZE.replace("?P<n>", "?P<value>"))),
    ("capacity_bytes", re.compile(_GAP + r"Device\s+limit\s*:\s*" + SIZE.replace("?P<n>", "?P<value>"))),
    ("free_bytes", re.compile(_GAP + r"Free\s+\(according\s+to\s+CUDA\)\s*:\s*" + SIZE.replace("?P<n>", "?P<value>"))),
    ("allowed_bytes", re.compile(
        _GAP + r"PyTorch\s+limit\s+\(set\s+by\s+user-supplied\s+memory\s+fraction\)\s*:\s*" + SIZE.replace("?P<n>", "?P<value>")
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
    return {
        "kind": BATCH_SIZE_FINDER,
        "backend": "unknown",
        "wording": "accelerate find_executable_batch_size",
    }, anchor.end()


PARSERS = {
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
