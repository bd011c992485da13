"""What users paste instead of a dump: memory reports, and an OOM known only by its exception type.

* `torch.cuda.memory_summary()`'s table: allocated, active, requested, reserved and non-releasable
  memory (current and peak), the allocator's OOM and cudaMalloc-retry counts. Sizes are whole
  numbers of a unit (`12292 KiB`), so a figure is off by up to one unit.
* DeepSpeed's `see_memory_usage` line: `MA 1.2 GB Max_MA 3.4 GB CA 5.6 GB Max_CA 7 GB` (memory
  allocated and reserved, "cached", now and at the peak; GB are GiB, rounded to two decimals).
* vLLM's memory profiling lines (what its start-up logs before it sizes the KV cache): the budget
  `total_gpu_memory x gpu_memory_utilization`, the weights, the activation peak, memory outside
  torch, the KV cache left; in the wordings of 0.6 (`Memory profiling results: key=value, ...`),
  0.7 (`model weights take ...; ...`) and later (`Available KV cache memory: ...`).
* `torch.OutOfMemoryError` (or `torch.cuda.OutOfMemoryError`) with its message cut away or empty.

Each is read into an `OomMessage` of its own kind (figures in `report_figures`, counts in
`report_counts`) and explained by `explain_report` with the same `Explanation` as an OOM message.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from oomdoctor.messages.model import (
    BARE_EXCEPTION,
    DEEPSPEED_MEMORY,
    MEMORY_SUMMARY,
    VLLM_MEMORY,
    OomMessage,
)
from oomdoctor.units import GIB, MIB, human_size, parse_size, plural

if TYPE_CHECKING:
    from oomdoctor.messages.explain import Explanation

REPORT_KINDS = (MEMORY_SUMMARY, DEEPSPEED_MEMORY, VLLM_MEMORY)

# the anchors oomdoctor.messages.parse looks for, each beginning with a literal
ANCHORS = (
    r"|(?P<summary>PyTorch\s+CUDA\s+memory\s+summary,\s+device\s+ID\s+(?P<summary_device>\d+))"
    r"|(?P<deepspeed>MA\s+[\d.]+\s*GB\s+Max_MA\s+[\d.]+\s*GB\s+CA\s+[\d.]+\s*GB\s+Max_CA\s+[\d.]+\s*GB)"
    r"|(?P<vllm>Memory\s+profiling\s+results:|total_gpu_memory\s+\(|Available\s+KV\s+cache\s+memory:"
    r"|No\s+available\s+memory\s+for\s+the\s+cache\s+blocks)"
    r"|(?P<bare>(?:torch\.(?:cuda\.)?)OutOfMemoryError\b)"
)
KEYWORDS = (r"memory\s+summary", r"Max_MA", r"Memory\s+profiling", r"total_gpu_memory", r"KV\s+cache",
            r"available\s+memory\s+for\s+the\s+cache", r"OutOfMemoryError")  # fmt: skip

_SUMMARY_END = re.compile(r"\|={20,}\|")
_SUMMARY_COUNTS = re.compile(r"CUDA\s+OOMs:\s*(?P<ooms>\d+)\s*\|\s*cudaMalloc\s+retries:\s*(?P<retries>\d+)")
_UNIT_SIZE = r"(\d+)\s*(B|KiB|MiB|GiB|TiB|PiB)"
_SUMMARY_ROWS = {
    "allocated": "Allocated memory",
    "active": "Active memory",
    "requested": "Requested memory",
    "reserved": "GPU reserved memory",
    "non_releasable": "Non-releasable memory",
}
_SUMMARY_COUNT_ROWS = {
    "allocations": "Allocations",
    "segments": "GPU reserved segments",
    "oversize": "Oversize allocations",
}


def _unit_bytes(number: str, unit: str) -> int:
    return int(number) * {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40, "PiB": 1 << 50}[unit]


def _compact(size_bytes: int) -> str:
    return human_size(size_bytes)


def _parse_summary(text: str, anchor: re.Match[str]) -> tuple[dict, int]:
    end_match = None
    for match in _SUMMARY_END.finditer(text, anchor.end()):
        end_match = match  # the table's last rule: the one after its rows
        if text.find("Oversize GPU segments", anchor.end(), match.start()) >= 0:
            break
    end = end_match.end() if end_match is not None else len(text)
    body = text[anchor.end() : end]
    figures: list[tuple[str, int]] = []
    counts: list[tuple[str, int]] = []
    for name, label in _SUMMARY_ROWS.items():
        row = re.search(re.escape(label) + r"\s*\|\s*" + _UNIT_SIZE + r"\s*\|\s*" + _UNIT_SIZE, body)
        if row:
            figures.append((name, _unit_bytes(row.group(1), row.group(2))))
            figures.append((f"peak_{name}", _unit_bytes(row.group(3), row.group(4))))
    for name, label in _SUMMARY_COUNT_ROWS.items():
        row = re.search(re.escape(label) + r"\s*\|\s*(\d+)\s*\|\s*(\d+)", body)
        if row:
            counts.append((name, int(row.group(1))))
            counts.append((f"peak_{name}", int(row.group(2))))
    header = _SUMMARY_COUNTS.search(body)
    if header:
        counts += [("ooms", int(header.group("ooms"))), ("alloc_retries", int(header.group("retries")))]
    figures_map = dict(figures)
    rows = [anchor.group("summary")]
    if header:
        rows.append(f"CUDA OOMs: {header.group('ooms')} | cudaMalloc retries: {header.group('retries')}")
    rows += [
        f"{label}: {_compact(figures_map[name])} (peak {_compact(figures_map['peak_' + name])})"
        for name, label in _SUMMARY_ROWS.items()
        if name in figures_map
    ]
    return {
        "text": " | ".join(rows),
        "kind": MEMORY_SUMMARY,
        "backend": "cuda",
        "wording": "torch.cuda.memory_summary()",
        "device_index": int(anchor.group("summary_device")),
        "allocated_bytes": figures_map.get("allocated"),
        "reserved_bytes": figures_map.get("reserved"),
        "truncated": end_match is None or "allocated" not in figures_map,
        "report_figures": tuple(figures),
        "report_counts": tuple(counts),
    }, end


_DEEPSPEED = re.compile(
    r"MA\s+(?P<ma>[\d.]+)\s*GB\s+Max_MA\s+(?P<max_ma>[\d.]+)\s*GB\s+CA\s+(?P<ca>[\d.]+)\s*GB\s+Max_CA\s+(?P<max_ca>[\d.]+)\s*GB"
)


def _parse_deepspeed(text: str, anchor: re.Match[str]) -> tuple[dict, int]:
    match = _DEEPSPEED.match(text, anchor.start())
    assert match is not None  # the anchor is this pattern
    figures = tuple((name, round(float(match.group(name)) * GIB)) for name in ("ma", "max_ma", "ca", "max_ca"))
    return {
        "kind": DEEPSPEED_MEMORY,
        "backend": "cuda",
        "wording": "DeepSpeed see_memory_usage",
        "allocated_bytes": figures[0][1],
        "reserved_bytes": figures[2][1],
        "report_figures": figures,
    }, match.end()


_V_SIZE = r"(\d+(?:\.\d+)?\s*(?:[KMGT]i?B))"
_VLLM_FIGURES = (
    ("total", (r"total_gpu_memory\s*(?:=|\()\s*" + _V_SIZE,)),
    ("budget", (r"gpu_memory_utilization\s*\(\s*[\d.]+\s*\)\s*=\s*" + _V_SIZE,)),
    (
        "weights",
        (
            r"model\s+weights\s+take\s+" + _V_SIZE,
            r"weights\s+memory:\s*" + _V_SIZE,
            r"Model\s+loading\s+took\s+" + _V_SIZE,
        ),
    ),  # fmt: skip
    (
        "activation_peak",
        (
            r"activation\s+peak\s+memory\s+takes\s+" + _V_SIZE,
            r"peak_torch_memory=" + _V_SIZE,
            r"torch\s+peak\s+memory\s+increase:\s*" + _V_SIZE,
        ),
    ),  # fmt: skip
    (
        "non_torch",
        (r"non_torch_memory\s*(?:takes\s+|=)" + _V_SIZE, r"non-torch\s+forward\s+increase\s+memory:\s*" + _V_SIZE),
    ),
    (
        "kv_cache",
        (
            r"reserved\s+for\s+KV\s+Cache\s+is\s+(-?\d+(?:\.\d+)?\s*[KMGT]i?B)",
            r"kv_cache_size=(-?\d+(?:\.\d+)?\s*[KMGT]i?B)",
            r"Available\s+KV\s+cache\s+memory:\s*(-?\d+(?:\.\d+)?\s*[KMGT]i?B)",
        ),
    ),  # fmt: skip
)
_VLLM_UTILIZATION = re.compile(r"gpu_memory_utilization\s*(?:=|\()\s*(\d+(?:\.\d+)?)")
_VLLM_SPAN_LINES = 8  # the profiling lines follow one another


def _size(text: str) -> int:
    negative = text.startswith("-")
    size = parse_size(text.lstrip("-").replace(" ", ""))
    return -size if negative else size


def _parse_vllm(text: str, anchor: re.Match[str]) -> tuple[dict, int]:
    line_start = text.rfind("\n", 0, anchor.start()) + 1
    end = line_start
    for _ in range(_VLLM_SPAN_LINES):
        next_end = text.find("\n", end + 1)
        end = len(text) if next_end < 0 else next_end
        if next_end < 0:
            break
    span = text[line_start:end]
    figures: list[tuple[str, int]] = []
    used_to = 0
    for name, patterns in _VLLM_FIGURES:
        for pattern in patterns:
            match = re.search(pattern, span)
            if match:
                figures.append((name, _size(match.group(1))))
                used_to = max(used_to, match.end())
                break
    counts: list[tuple[str, int]] = []
    utilization = _VLLM_UTILIZATION.search(span)
    if utilization:
        counts.append(("gpu_memory_utilization_percent", round(float(utilization.group(1)) * 100)))
        used_to = max(used_to, utilization.end())
    no_cache = re.search(r"No\s+available\s+memory\s+for\s+the\s+cache\s+blocks", span)
    if no_cache:
        counts.append(("no_cache_blocks", 1))
        used_to = max(used_to, no_cache.end())
    mapped = dict(figures)
    return {
        "kind": VLLM_MEMORY,
        "backend": "cuda",
        "wording": "vLLM memory profiling",
        "capacity_bytes": mapped.get("total"),
        "report_figures": tuple(figures),
        "report_counts": tuple(counts),
    }, line_start + max(used_to, anchor.end() - line_start)


_BARE_TAIL = re.compile(r":?[ \t]*(?P<rest>[^\n]*)")


def _parse_bare(text: str, anchor: re.Match[str]) -> tuple[dict, int]:
    tail = _BARE_TAIL.match(text, anchor.end())
    end = tail.end() if tail else anchor.end()
    return {
        "kind": BARE_EXCEPTION,
        "backend": "cuda" if ".cuda." in anchor.group("bare") or "torch." in anchor.group("bare") else "unknown",
        "wording": "exception type only",
        "truncated": True,
    }, end


def bare_is_anchor(text: str, anchor: re.Match[str], other_anchor_at: int | None) -> bool:
    """The exception type is the message only when no other message follows it on its line (the
    OutOfMemoryError before "CUDA out of memory. ..." is that message's type)."""
    line_end = text.find("\n", anchor.end())
    line_end = len(text) if line_end < 0 else line_end
    return other_anchor_at is None or other_anchor_at > line_end


PARSERS = {"summary": _parse_summary, "deepspeed": _parse_deepspeed, "vllm": _parse_vllm, "bare": _parse_bare}


# -- explaining them ------------------------------------------------------------------------------

FRAGMENTED_SHARE = 0.25  # non-releasable memory at least this share of what is reserved
FRAGMENTED_MIN_BYTES = 256 * MIB


def _h(size_bytes: int | None) -> str:
    return human_size(size_bytes)


def explain_report(message: OomMessage) -> Explanation:
    from oomdoctor.messages.explain import RECORD_A_DUMP, Explanation
    from oomdoctor.messages.figures import Figure

    figures = dict(message.report_figures)
    counts = dict(message.report_counts)
    findings: list[str] = []
    recs: list[str] = []
    unknowns = ["which tensors, source lines and training phases hold the memory (a report has no stacks; a dump has)"]
    shown: list[Figure] = []
    derived: list[Figure] = []
    verdict, confidence = "unknown", 0.1

    def figure(name: str, label: str, meaning: str, into: list[Figure] = shown) -> None:
        if name in figures:
            into.append(Figure(name, label, figures[name], meaning))

    if message.kind == MEMORY_SUMMARY:
        figure("allocated", "Allocated memory (now)", "bytes in live tensors, rounded to whole blocks")
        figure("peak_allocated", "Allocated memory (peak)", "the most tensors held at once since the last peak reset")
        figure("reserved", "GPU reserved memory (now)", "what PyTorch's caching allocator holds from the GPU")
        figure("peak_reserved", "GPU reserved memory (peak)", "the most it held at once")
        figure(
            "non_releasable",
            "Non-releasable memory",
            "free parts of segments that also hold live tensors: cached, but unusable for a larger request and not returned by empty_cache()",
        )
        figure("requested", "Requested memory (now)", "what the tensors asked for, before rounding")
        allocated, reserved = figures.get("allocated"), figures.get("reserved")
        if allocated is not None and reserved is not None:
            derived.append(
                Figure("reserved - allocated", "cached, free", reserved - allocated, "reserved but holding no tensor")
            )
        ooms, retries = counts.get("ooms", 0), counts.get("alloc_retries", 0)
        summary = (
            f"torch.cuda.memory_summary() of GPU {message.device_index}: {_h(allocated)} in tensors "
            f"(peak {_h(figures.get('peak_allocated'))}), {_h(reserved)} reserved by PyTorch "
            f"(peak {_h(figures.get('peak_reserved'))})."
        )
        if ooms:
            findings.append(f"the allocator ran out of memory {plural(ooms, 'time')} before this table was printed")
        if retries:
            findings.append(
                f"{plural(retries, 'cudaMalloc retry', 'cudaMalloc retries')}: the allocator freed its whole cache"
                f" and asked the GPU again {plural(retries, 'time')}, a sign that memory was tight or fragmented (and each retry is slow)"
            )
        non_releasable = figures.get("non_releasable")
        if (
            non_releasable is not None
            and reserved
            and non_releasable >= FRAGMENTED_MIN_BYTES
            and non_releasable >= FRAGMENTED_SHARE * reserved
        ):
            findings.append(
                f"{_h(non_releasable)} of the {_h(reserved)} reserved is non-releasable: free pieces of segments that "
                "also hold tensors, which a larger request cannot use"
            )
            recs.append(
                "set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True so that segments grow in place instead of "
                "leaving unusable free pieces"
            )
            verdict, confidence = "fragmentation", 0.4 if (ooms or retries) else 0.25
        if counts.get("oversize"):
            findings.append(f"{counts['oversize']} oversize allocations (above max_split_size_mb) are live")
        unknowns.append("the GPU's total and free memory, and memory outside PyTorch: the table does not show them")
    elif message.kind == DEEPSPEED_MEMORY:
        figure("ma", "MA", "memory allocated: bytes in live tensors now (torch.cuda.memory_allocated)")
        figure("max_ma", "Max_MA", "the most allocated at once (max_memory_allocated)")
        figure("ca", "CA", "memory reserved ('cached') by PyTorch's allocator now (memory_reserved)")
        figure("max_ca", "Max_CA", "the most reserved at once (max_memory_reserved)")
        summary = (
            f"DeepSpeed's see_memory_usage: {_h(figures['ma'])} in tensors (peak {_h(figures['max_ma'])}), "
            f"{_h(figures['ca'])} reserved (peak {_h(figures['max_ca'])})."
        )
        gap = figures["max_ca"] - figures["max_ma"]
        derived.append(
            Figure(
                "Max_CA - Max_MA",
                "reserved beyond the tensors' peak",
                gap,
                "cache the allocator kept but no tensor needed at the peak: fragmentation or freed memory kept for reuse",
            )
        )
        if gap >= FRAGMENTED_MIN_BYTES and gap >= FRAGMENTED_SHARE * max(1, figures["max_ca"]):
            findings.append(
                f"PyTorch reserved {_h(gap)} more at its peak than its tensors ever held: a fragmented cache"
            )
            recs.append("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; in ZeRO, smaller reduce_bucket_size and "
                        "allgather_bucket_size (or contiguous_gradients) make fewer, smaller buffers")  # fmt: skip
            verdict, confidence = "fragmentation", 0.25
        unknowns.append("which ZeRO stage's buffers, parameters, gradients or optimizer partitions the bytes are")
        unknowns.append(
            "the GPU's total memory: DeepSpeed's line does not show it (the figures are GiB rounded to two decimals)"
        )
    elif message.kind == VLLM_MEMORY:
        figure("total", "total_gpu_memory", "the GPU's memory")
        figure("budget", "budget", "total_gpu_memory x gpu_memory_utilization: what this vLLM instance may use")
        figure("weights", "model weights", "the model's parameters on this GPU")
        figure(
            "activation_peak", "activation peak", "PyTorch's peak during the profiling run (activations, workspaces)"
        )
        figure(
            "non_torch", "non-torch memory", "memory outside PyTorch's allocator: NCCL, the CUDA context, CUDA graphs"
        )
        figure("kv_cache", "KV cache", "what is left for the KV cache")
        utilization = counts.get("gpu_memory_utilization_percent")
        kv_cache = figures.get("kv_cache")
        summary = "vLLM's memory profiling: how it split the GPU before sizing the KV cache"
        if utilization is not None:
            summary += f" (gpu_memory_utilization {utilization / 100:.2f})"
        summary += "."
        weights, budget = figures.get("weights"), figures.get("budget")
        if budget is None and figures.get("total") and utilization is not None:
            budget = round(figures["total"] * utilization / 100)
            derived.append(Figure("total x utilization", "budget", budget, "what this vLLM instance may use"))
        if counts.get("no_cache_blocks") or (kv_cache is not None and kv_cache <= 0):
            findings.append("nothing is left for the KV cache: the weights, the activation peak and memory outside "
                            "PyTorch fill the budget")  # fmt: skip
            verdict, confidence = "model-states-too-large", 0.3
            if weights is not None and budget is not None and weights < budget:
                verdict = "unknown"
            recs += [
                "raise gpu_memory_utilization (if nothing else uses this GPU), or lower max_model_len and "
                "max_num_seqs (a smaller profiling batch and activation peak)",
                "shard the model over more GPUs (tensor_parallel_size) or load a quantized one",
            ]
        elif kv_cache is not None and budget:
            findings.append(f"{_h(kv_cache)} of the {_h(budget)} budget went to the KV cache ({kv_cache / budget:.0%})")
            recs.append("an OOM after start-up is outside this budget: lower gpu_memory_utilization to leave room "
                        "for other processes and CUDA graphs, or limit cudagraph_capture_sizes")  # fmt: skip
        if weights is not None and budget and weights >= 0.9 * budget:
            findings.append(f"the weights alone take {weights / budget:.0%} of the budget")
            verdict, confidence = "model-states-too-large", 0.4
        unknowns.append(
            "whether the OOM (if any) came at start-up or later while serving: these lines are from start-up"
        )
    else:
        raise ValueError(message.kind)
    recs.append(RECORD_A_DUMP)
    return Explanation(
        message=message,
        verdict=verdict,
        confidence=confidence,
        summary=summary,
        figures=tuple(shown),
        derived=tuple(derived),
        findings=tuple(findings),
        recommendations=tuple(recs),
        unknowns=tuple(unknowns),
    )


BARE_SUMMARY = (
    "PyTorch ran out of GPU memory (the exception is torch's OutOfMemoryError), but its message is cut "
    "away: how much was asked for, reserved and free is not known."
)
BARE_RECOMMENDATIONS = (
    "find the full message earlier in the log or the console (it starts 'CUDA out of memory. Tried to allocate'); "
    "with ComfyUI's cudaMallocAsync backend the message is only 'Allocation on device': --disable-cuda-malloc "
    "gives the full one",
)
