"""One OOM message as found in a log: its kind, backend and figures in bytes (plain, frozen data)."""

from __future__ import annotations

from dataclasses import dataclass

CACHING_ALLOCATOR = "caching-allocator"
PREEMPTIVE_REJECTION = "preemptive-rejection"
CUDA_MALLOC_ASYNC = "cuda-malloc-async"
MPS = "mps"
THC = "legacy-thc"
CUDA_ERROR = "cuda-error"
LIBRARY_ALLOC = "library-alloc"
CPU_ALLOCATOR = "cpu-allocator"
BATCH_SIZE_FINDER = "batch-size-finder"
BARE_EXCEPTION = "exception-only"  # torch.OutOfMemoryError with its message cut away
# memory reports users paste instead of a dump (memory_reports.py)
MEMORY_SUMMARY = "memory-summary"  # torch.cuda.memory_summary()'s table
DEEPSPEED_MEMORY = "deepspeed-memory"  # DeepSpeed's see_memory_usage line
VLLM_MEMORY = "vllm-memory"  # vLLM's memory profiling lines
KINDS = (CACHING_ALLOCATOR, PREEMPTIVE_REJECTION, CUDA_MALLOC_ASYNC, MPS, THC, CUDA_ERROR, LIBRARY_ALLOC,
         CPU_ALLOCATOR, BATCH_SIZE_FINDER, BARE_EXCEPTION, MEMORY_SUMMARY, DEEPSPEED_MEMORY, VLLM_MEMORY)  # fmt: skip


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
    report_figures: tuple[tuple[str, int], ...] = ()  # a memory report's sizes (memory_reports.py), bytes
    report_counts: tuple[tuple[str, int], ...] = ()  # its counts (OOMs, cudaMalloc retries, allocations)

    def identity(self) -> tuple:
        """What makes two occurrences the same message (a log repeating it, a wrapper re-raising it)."""
        skip = {"text", "line", "exception_type", "truncated", "occurrences", "era", "era_clues"}
        return tuple(getattr(self, name) for name in self.__dataclass_fields__ if name not in skip)
