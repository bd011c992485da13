"""From one OOM message to an explanation: a likely verdict, its evidence, what to change, what is unknown.

Verdicts are from `oomdoctor.metadata.VERDICTS`, judged in this order (sizes from the message):

  oversized-request   the request alone exceeds the limit (the GPU, or the memory fraction), or is
                      at least half of it
  (no verdict)        the request would have fitted in the free memory: the figures do not explain it
  outside-pytorch     memory outside PyTorch's allocator (other processes, CUDA context, libraries)
                      covers the shortfall and is at least a fifth of the limit
  fragmentation       reserved-but-unallocated bytes are at least the request (large pool only: a
                      2 MiB figure is a small-pool request the large pool's free blocks cannot serve)
  unknown             anything else, or a message without figures

When both outside-pytorch and fragmentation hold, the one with more bytes is the verdict.
"""

from __future__ import annotations

from dataclasses import dataclass

from oomdoctor.messages import model as kinds
from oomdoctor.messages.figures import Derived, Figure, derive, derived_figures, message_figures
from oomdoctor.messages.model import OomMessage
from oomdoctor.units import MIB, human_size

OVERSIZED_SHARE = 0.5
OUTSIDE_SHARE = 0.2
RECORD_A_DUMP = "record a dump: `import oomdoctor; oomdoctor.install()` at the top of the script, rerun, then `oomdoctor report oom-dumps/`"


@dataclass(frozen=True)
class Explanation:
    message: OomMessage
    verdict: str
    confidence: float
    summary: str
    figures: tuple[Figure, ...]
    derived: tuple[Figure, ...]
    findings: tuple[str, ...]
    recommendations: tuple[str, ...]
    unknowns: tuple[str, ...]


def _h(size_bytes: int | None) -> str:
    return human_size(size_bytes)


def _alloc_conf_variable(message: OomMessage) -> str:
    hint = message.hint or ""
    if "=" in hint:
        return hint.split("=", 1)[0]
    return "PYTORCH_HIP_ALLOC_CONF" if message.backend == "rocm" else "PYTORCH_CUDA_ALLOC_CONF"


def _has_expandable_segments(message: OomMessage) -> bool | None:
    """True when the message's torch offers expandable segments (2.1+), None when unknown."""
    if message.backend in ("xpu", "mps"):
        return False
    if "sentences" in message.wording or "expandable" in (message.hint or ""):
        return True
    if message.wording.startswith(("0.4.1", "1.5")) or message.kind == kinds.THC:
        return False
    return None


def _judge(m: OomMessage, d: Derived) -> tuple[str, float, str, list[str], list[str]]:
    """verdict, confidence, summary, findings, recommendations."""
    findings: list[str] = []
    recs: list[str] = []
    limit_name = "the memory fraction" if m.allowed_bytes is not None else "the GPU"
    fraction_exhausted = False
    if m.allowed_bytes is not None and d.reserved_bytes is not None and m.requested_bytes is not None:
        exhausted = d.reserved_bytes + (d.needed_bytes or 0) > m.allowed_bytes - d.rounding_bytes
        if exhausted and (m.free_bytes is None or m.free_bytes >= (d.needed_bytes or 0)):
            findings.append(
                f"the per-process limit ran out, not the GPU: {_h(m.allowed_bytes)} allowed, {_h(d.reserved_bytes)} "
                f"already reserved, while the GPU still had {_h(m.free_bytes)} free"
            )
            fraction_exhausted = True
            recs.append("raise the memory fraction (torch.cuda.set_per_process_memory_fraction, or the framework's "
                        "gpu-memory-utilization setting) if nothing else needs that memory")  # fmt: skip
    if m.request_too_large:
        return "oversized-request", 0.95, "One request asked for more than 1 EB: a size computed wrongly.", findings, [
            "check the shapes reaching the failing operation (an overflowed or negative dimension)"]  # fmt: skip
    requested, limit = m.requested_bytes, d.limit_bytes
    if requested is not None and limit:
        share = requested / limit
        if share >= OVERSIZED_SHARE:
            alone = "more than" if requested > limit else f"{share:.0%} of"
            findings.append(f"the request alone ({_h(requested)}) is {alone} {limit_name} ({_h(limit)})")
            recs.append("make this one allocation smaller: a smaller batch or sequence for this step, or compute it "
                        "in chunks (chunked attention or loss, tiled processing)")  # fmt: skip
            confidence = 0.9 if requested > limit else 0.7
            return (
                "oversized-request",
                confidence,
                f"One request of {_h(requested)} is {alone} {limit_name}.",
                findings,
                recs,
            )
    needed = d.needed_bytes
    if needed is not None and d.available_bytes is not None and d.available_bytes - needed > d.rounding_bytes:
        findings.append(
            f"{_h(d.available_bytes)} was available, more than the {_h(needed)} needed: the figures do not "
            "explain this failure (another limit, a driver or address-space problem, or memory freed by another "
            "process between the failure and the report)"
        )
        return "unknown", 0.2, "The message's own figures say the request should have fitted.", findings, recs
    outside = _outside(m, d, findings, recs)
    fragmented = _fragmentation(m, d, findings, recs)
    if outside and (not fragmented or outside >= fragmented):
        return "outside-pytorch", 0.6, f"{_h(outside)} of the GPU was held outside PyTorch's allocator.", findings, recs
    if fragmented:
        return ("fragmentation", 0.6, f"PyTorch held {_h(fragmented)} free in its cache, at least the request, "
                "but in pieces too small for it.", findings, recs)  # fmt: skip
    if fraction_exhausted:
        return ("unknown", 0.4, f"PyTorch reached its per-process memory limit ({_h(m.allowed_bytes)} allowed) "
                f"while the GPU still had {_h(m.free_bytes)} free.", findings, recs)  # fmt: skip
    if d.shortfall_bytes is not None:
        if d.tensor_bytes is not None:
            findings.append(f"live tensors held {_h(d.tensor_bytes)} of the {_h(d.limit_bytes)} PyTorch could use; "
                            f"nothing cached or outside PyTorch accounts for the {_h(max(d.shortfall_bytes, 0))} missing")  # fmt: skip
        recs.append("lower peak memory: a smaller batch or sequence, activation checkpointing, mixed precision, "
                    "or a sharded or 8-bit optimizer")  # fmt: skip
        return ("unknown", 0.3, "The memory was full of this process's own tensors; the message cannot say which.",
                findings, recs)  # fmt: skip
    return "unknown", 0.1, "The message does not carry the figures needed to say more.", findings, recs


def _outside(m: OomMessage, d: Derived, findings: list[str], recs: list[str]) -> int:
    """Bytes outside PyTorch when they explain the failure, else 0."""
    if d.non_pytorch_bytes is None or d.limit_bytes is None:
        return 0
    if d.non_pytorch_bytes < 0:
        findings.append(
            f"PyTorch reports {_h(d.reserved_bytes)} reserved, more than the {_h(d.in_use_bytes)} in use on the GPU: "
            "typical of Windows (WDDM) spilling GPU memory into shared system memory"
        )
        return 0
    if m.allowed_bytes is not None:  # under a memory fraction other processes do not count against the limit
        return 0
    shortfall = d.shortfall_bytes or 0
    explains = d.non_pytorch_bytes >= shortfall and d.non_pytorch_bytes >= OUTSIDE_SHARE * d.limit_bytes
    if d.other_processes_bytes:
        pids = ", ".join(str(p.pid) for p in m.processes if p.pid is not None and p.pid != d.self_seen_as_pid)
        findings.append(f"other processes on this GPU hold {_h(d.other_processes_bytes)} (pid {pids})")
        if explains:
            recs.append(f"free the GPU: stop or move the other processes (pid {pids}; see nvidia-smi), or pick "
                        "another GPU with CUDA_VISIBLE_DEVICES")  # fmt: skip
    if d.self_seen_as_pid is not None:
        findings.append(f"process {d.self_seen_as_pid} is most likely this process seen by its host PID (its usage "
                        "is PyTorch's reserved memory plus a CUDA context)")  # fmt: skip
    if d.own_outside_pytorch_bytes is not None and d.own_outside_pytorch_bytes > 0:
        findings.append(f"this process holds {_h(d.own_outside_pytorch_bytes)} outside PyTorch's allocator "
                        "(CUDA context, cuBLAS/cuDNN workspaces, NCCL, other CUDA libraries)")  # fmt: skip
        if explains and d.own_outside_pytorch_bytes >= d.non_pytorch_bytes / 2:
            recs.append("find what allocates outside PyTorch in this process (other CUDA libraries, NCCL buffers, "
                        "cuDNN benchmark workspaces) and cap or release it")  # fmt: skip
    if explains:
        findings.append(f"{_h(d.non_pytorch_bytes)} of the GPU was not PyTorch's (total - free - reserved), "
                        f"more than the {_h(shortfall)} the request lacked")  # fmt: skip
        if not d.other_processes_bytes and not m.processes:
            recs.append("look at nvidia-smi for other processes on this GPU; on a desktop the display also "
                        "takes memory")  # fmt: skip
        return d.non_pytorch_bytes
    return 0


def _fragmentation(m: OomMessage, d: Derived, findings: list[str], recs: list[str]) -> int:
    unallocated, requested = m.reserved_unallocated_bytes, d.needed_bytes
    if unallocated is None or requested is None or m.kind == kinds.MPS:
        return 0
    if requested <= 2 * MIB:
        if unallocated >= requested:
            findings.append(f"{_h(unallocated)} was reserved but unallocated, but a 2 MiB figure is a small-pool "
                            "request that free large-pool blocks cannot serve")  # fmt: skip
        return 0
    if unallocated < requested:
        return 0
    findings.append(f"{_h(unallocated)} was reserved but unallocated, at least the {_h(requested)} needed: "
                    "free cached memory existed, in blocks too small or in segments that could not be released")  # fmt: skip
    offered = _has_expandable_segments(m)
    variable = _alloc_conf_variable(m)
    if offered:
        recs.append(f"set {variable}=expandable_segments:True (unless it is already set: the message does not "
                    "say) so that segments grow instead of splitting")  # fmt: skip
    elif offered is False and m.backend not in ("xpu", "mps"):
        recs.append(f"this torch has no expandable segments: set {variable}=max_split_size_mb:<MB> (e.g. 128) "
                    "to stop large blocks being split, or upgrade to torch 2.1+ for expandable_segments:True")  # fmt: skip
    else:
        recs.append("reduce how often large tensors of different sizes are allocated and freed (fixed shapes, "
                    "preallocated buffers); expandable segments are not available on this backend")  # fmt: skip
    return unallocated


_NO_FIGURES = {
    kinds.THC: (
        "torch 0.4 or earlier: the THC allocator ran out of memory; the message carries no figures.",
        ["upgrade torch: newer releases say how much was requested, free and reserved"],
    ),
    kinds.CUDA_ERROR: (
        "A CUDA call outside PyTorch's caching allocator ran out of memory (CUDA context, CUDA graph "
        "capture, NCCL, cuBLAS/cuDNN handles, a kernel's own buffer), usually because the GPU was "
        "already full. CUDA errors are reported asynchronously: the stack may point elsewhere.",
        [
            "look at nvidia-smi for what holds the GPU; leave headroom (e.g. vLLM's "
            "--gpu-memory-utilization, torch.cuda.empty_cache() before the failing call)",
            "rerun with CUDA_LAUNCH_BLOCKING=1 to find the call that failed",
        ],
    ),
    kinds.LIBRARY_ALLOC: (
        "A CUDA library (cuBLAS, cuDNN, ...) could not allocate its handle or workspace: the GPU "
        "was already full when the library first ran.",
        [
            "check what fills the GPU before the first matmul or convolution (other processes, "
            "a model larger than the GPU)"
        ],
    ),
    kinds.CPU_ALLOCATOR: (
        "Host memory (RAM), not the GPU, ran out: PyTorch's CPU allocator failed.",
        ["reduce host memory: fewer DataLoader workers, memory-mapped datasets, smaller CPU copies"],
    ),
    kinds.BATCH_SIZE_FINDER: (
        "accelerate's find_executable_batch_size halved the batch size after every OOM until "
        "it reached zero: even the smallest batch ran out, or the failed attempts' memory was "
        "never freed. The OOM messages themselves were swallowed.",
        ["look earlier in the log for the first OOM message, or run once with a fixed small batch size to see it"],
    ),
}


def explain(message: OomMessage) -> Explanation:
    from oomdoctor.messages import memory_reports

    if message.kind in memory_reports.REPORT_KINDS:
        return memory_reports.explain_report(message)
    derived = derive(message)
    if message.kind == kinds.BARE_EXCEPTION:
        summary, verdict, confidence, findings = memory_reports.BARE_SUMMARY, "unknown", 0.1, []
        recs = list(memory_reports.BARE_RECOMMENDATIONS)
    elif message.kind == kinds.PREEMPTIVE_REJECTION:
        summary = ("PyTorch refused the allocation before asking CUDA: it would have exceeded the per-process "
                   "memory fraction (throw_on_cudamalloc_oom, torch 2.12+).")  # fmt: skip
        verdict, confidence, findings = "unknown", 0.4, []
        recs = ["raise the memory fraction (torch.cuda.set_per_process_memory_fraction) if nothing else needs "
                "that memory, or lower this process's peak"]  # fmt: skip
    elif message.kind == kinds.CUDA_MALLOC_ASYNC and message.requested_bytes is None:
        summary = ("The cudaMallocAsync allocator (PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync) refused an "
                   "allocation; the message is cut short before its figures.")  # fmt: skip
        verdict, confidence, findings, recs = "unknown", 0.1, [], []
    elif message.kind in _NO_FIGURES:
        summary, recs = _NO_FIGURES[message.kind]
        verdict, confidence, findings = "unknown", 0.1, []
        recs = list(recs)
    else:
        verdict, confidence, summary, findings, recs = _judge(message, derived)
    if message.kind == kinds.CUDA_MALLOC_ASYNC:
        recs.append("oomdoctor's dumps need the native allocator: unset backend:cudaMallocAsync (ComfyUI: "
                    "--disable-cuda-malloc) before recording")  # fmt: skip
    if message.kind == kinds.MPS and (message.hint or verdict != "oversized-request"):
        recs.append("PYTORCH_MPS_HIGH_WATERMARK_RATIO=0.0 lifts MPS's limit, as the message says, at the risk of "
                    "the whole system running out of memory")  # fmt: skip
    if message.backend == "cpu":
        pass  # host memory: a GPU dump would not show it
    elif message.backend in ("mps", "xpu"):
        recs.append("dumps are CUDA-only: `oomdoctor rehearse SCRIPT --device-memory SIZE` simulates a CUDA GPU on "
                    "the CPU and leaves one")  # fmt: skip
    else:
        recs.append(RECORD_A_DUMP)
    return Explanation(
        message=message,
        verdict=verdict,
        confidence=confidence,
        summary=summary,
        figures=message_figures(message),
        derived=derived_figures(derived, message),
        findings=tuple(findings),
        recommendations=tuple(recs),
        unknowns=tuple(_unknowns(message, derived)),
    )


def _unknowns(m: OomMessage, d: Derived) -> list[str]:
    unknowns = ["which tensor, source line and training phase asked for the memory, and what else was alive "
                "(a message has no stacks; a dump has)"]  # fmt: skip
    if (
        m.kind in (kinds.CACHING_ALLOCATOR, kinds.PREEMPTIVE_REJECTION)
        and m.requested_bytes
        and not m.wording.startswith("0.4.1")
    ):
        unknowns.append("the tensor's exact size: the figure is segment-sized")
    if m.truncated:
        unknowns.append("the rest of the message: it is cut short (figures after the cut are missing)")
    if m.kind == kinds.CACHING_ALLOCATOR and "sentences" in m.wording and not m.processes:
        unknowns.append(
            "per-process usage: this message has no NVML lines (no NVML, or it could not see the processes)"
        )
    if m.kind == kinds.CACHING_ALLOCATOR and "sentences" not in m.wording and m.capacity_bytes is not None:
        unknowns.append(
            "how much of the memory outside PyTorch was this process's own (torch before 2.1 has no NVML lines)"
        )
    if m.reserved_unallocated_bytes is not None and _has_expandable_segments(m):
        unknowns.append("whether expandable_segments was already on, and how the free cached memory was split")
    if m.kind == kinds.CACHING_ALLOCATOR and m.free_bytes is None and m.capacity_bytes is not None:
        unknowns.append("free memory on the device: this backend does not report it")
    if m.kind == kinds.MPS:
        unknowns.append("what the 'other allocations' are (Metal memory outside PyTorch's heaps)")
    return unknowns


def highlight(messages: list[OomMessage]) -> tuple[int, str]:
    """Which message to read first, and why: the first one, unless it has no figures and a later one has."""
    if len(messages) == 1:
        return 0, "the only OOM message"
    if messages[0].requested_bytes is None:
        with_figures = next((i for i, m in enumerate(messages) if m.requested_bytes is not None), None)
        if with_figures is not None:
            return with_figures, "the first OOM message with figures: the earlier ones carry none"
    return 0, ("the first OOM in the log: later ones are often its aftermath (memory still held by the failed "
               "step, retries, wrappers re-raising it)")  # fmt: skip
