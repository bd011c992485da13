"""What each figure of an OOM message means, and the quantities that follow from them (bytes).

Rules from the reference spec §3.4-3.5: "Tried to allocate" is segment-sized since 1.5 (2 MiB for a
request of at most 1 MiB, 20 MiB for 1-10 MiB, else rounded up to 2 MiB); before 1.5 it was the
request itself (the corpus has 1.12 MiB and 12.50 MiB figures). In 2.1+ "allocated by PyTorch" also
counts free cached blocks in private pools, and reserved = allocated + reserved-but-unallocated.
"""

from __future__ import annotations

from dataclasses import dataclass

from oomdoctor.messages.model import CUDA_MALLOC_ASYNC, MPS, OomMessage, ProcessUsage
from oomdoctor.units import GIB, KIB, MIB, human_size

SELF_IN_CONTAINER_SLACK_BYTES = 2 * GIB  # CUDA context + library workspaces seldom exceed this


@dataclass(frozen=True)
class Figure:
    """One number: where it comes from (`name`, a message label or a formula) and what it means."""

    name: str
    label: str
    bytes: int | None
    meaning: str


@dataclass(frozen=True)
class Derived:
    """Quantities that follow from the message; None where the message lacks what they need."""

    reserved_bytes: int | None = None  # held by PyTorch's caching allocator
    tensor_bytes: int | None = None  # in live tensors
    limit_bytes: int | None = None  # what PyTorch may use: the memory fraction, else the GPU
    in_use_bytes: int | None = None  # on the whole GPU (capacity - free)
    non_pytorch_bytes: int | None = None  # on the GPU, not reserved by this allocator
    own_outside_pytorch_bytes: int | None = None  # this process (NVML) - reserved
    other_processes_bytes: int | None = None  # sum of the other processes' NVML lines
    self_seen_as_pid: int | None = None  # a "Process N" line that is most likely this process
    needed_bytes: int | None = None  # the segment the allocator had to get (the request, from 1.5)
    available_bytes: int | None = None  # what the request could still have had
    shortfall_bytes: int | None = None  # needed - available
    rounding_bytes: int = 0  # how far `available_bytes` can be off: the message rounds to two decimals


def rounding_error_bytes(*sizes: int | None) -> int:
    """The most that two-decimal figures ("1.05 GiB") can be off from the bytes they stand for, summed."""
    total = 0
    for size in sizes:
        if size is not None:
            total += next((unit // 200 for unit in (GIB, MIB, KIB) if size > unit), 0)
    return total


def segment_bytes(request_bytes: int) -> int:
    """get_allocation_size (spec §4.1): the segment cudaMalloc is asked for when no cached block fits."""
    if request_bytes <= MIB:
        return 2 * MIB
    if request_bytes <= 10 * MIB:
        return 20 * MIB
    return -(-request_bytes // (2 * MIB)) * 2 * MIB


def _sub(a: int | None, b: int | None) -> int | None:
    return None if a is None or b is None else a - b


def _own_line(message: OomMessage, reserved: int | None) -> tuple[ProcessUsage | None, list[ProcessUsage]]:
    """This process's NVML line and the others. In a PID namespace it reads "Process <hostpid>"."""
    own = next((p for p in message.processes if p.pid is None), None)
    others = [p for p in message.processes if p.pid is not None]
    if own is None and reserved is not None:
        fits = [p for p in others if 0 <= p.used_bytes - reserved <= SELF_IN_CONTAINER_SLACK_BYTES]
        if fits:
            own = min(fits, key=lambda p: p.used_bytes)
            others = [p for p in others if p is not own]
    return own, others


def derive(message: OomMessage) -> Derived:
    m = message
    if m.kind == MPS:
        in_use = None if m.allocated_bytes is None or m.other_allocations_bytes is None else (
            m.allocated_bytes + m.other_allocations_bytes)  # fmt: skip
        available = _sub(m.allowed_bytes, in_use)
        return Derived(
            limit_bytes=m.allowed_bytes, in_use_bytes=in_use,
            non_pytorch_bytes=m.other_allocations_bytes, needed_bytes=m.requested_bytes, available_bytes=available,
            shortfall_bytes=_sub(m.requested_bytes, available),
            rounding_bytes=rounding_error_bytes(m.allowed_bytes, m.allocated_bytes, m.other_allocations_bytes),
        )  # fmt: skip
    if m.reserved_bytes is not None:
        reserved = m.reserved_bytes
    elif m.kind == CUDA_MALLOC_ASYNC:
        reserved = m.allocated_bytes
    else:
        reserved = None if m.allocated_bytes is None or m.reserved_unallocated_bytes is None else (
            m.allocated_bytes + m.reserved_unallocated_bytes)  # fmt: skip
    tensors = _sub(m.allocated_bytes, m.private_pool_bytes or 0)
    in_use = _sub(m.capacity_bytes, m.free_bytes)
    own, others = _own_line(m, reserved)
    available = m.free_bytes
    if m.allowed_bytes is not None and reserved is not None:
        left_by_fraction = max(0, m.allowed_bytes - reserved)
        available = left_by_fraction if available is None else min(available, left_by_fraction)
    needed = m.requested_bytes
    if needed is not None and m.wording.startswith("0.4.1-1.4"):
        needed = segment_bytes(needed)
    rounding = rounding_error_bytes(m.free_bytes, m.allowed_bytes, m.allocated_bytes, m.reserved_unallocated_bytes)
    return Derived(
        reserved_bytes=reserved,
        tensor_bytes=tensors,
        limit_bytes=m.allowed_bytes if m.allowed_bytes is not None else m.capacity_bytes,
        in_use_bytes=in_use,
        non_pytorch_bytes=_sub(in_use, reserved),
        own_outside_pytorch_bytes=_sub(own.used_bytes, reserved) if own else None,
        other_processes_bytes=sum(p.used_bytes for p in others) if m.processes else None,
        self_seen_as_pid=own.pid if own is not None else None,
        needed_bytes=needed,
        available_bytes=available,
        shortfall_bytes=_sub(needed, available),
        rounding_bytes=rounding,
    )


def request_meaning(message: OomMessage) -> str:
    """What "Tried to allocate X" says about the tensor itself."""
    requested = message.requested_bytes
    if message.request_too_large:
        return "a request of more than 1 EB: a size computed wrongly (an overflow or a negative dimension)"
    if requested is None:
        return "not in the message"
    if message.kind == MPS:
        return f"the size of the buffer MPS tried to allocate on its {message.pool or 'unknown'} pool"
    if message.wording.startswith("0.4.1-1.4"):
        return "the request itself (rounded up to 512 bytes): before 1.5 the message gave the tensor's size"
    if message.kind not in ("caching-allocator", "preemptive-rejection"):
        return "the size asked for"
    prefix = "the segment the allocator tried to get from the GPU, not the tensor: "
    if requested == 2 * MIB:
        return (
            prefix
            + "a request of at most 1 MiB (the small pool's 2 MiB segment); the cached free memory of the large pool could not serve it"
        )
    if requested == 20 * MIB:
        return prefix + "a request of 1-10 MiB (a 20 MiB segment; configurable with large_segment_size_mb from 2.11)"
    low = max(requested - 2 * MIB, 10 * MIB) + 1
    return (
        prefix
        + f"the tensor needed {human_size(low)} to {human_size(requested)} (large requests are rounded up to a multiple of 2 MiB)"
    )


def message_figures(message: OomMessage) -> tuple[Figure, ...]:
    """The figures the message states, each with what it means."""
    m = message
    figures: list[Figure] = []

    def add(name: str, label: str, value: int | None, meaning: str) -> None:
        if value is not None:
            figures.append(Figure(name, label, value, meaning))

    if m.requested_bytes is not None or m.request_too_large:
        figures.append(Figure("requested_bytes", "Tried to allocate", m.requested_bytes, request_meaning(m)))
    if m.kind == MPS:
        add(
            "allocated_bytes",
            "MPS allocated",
            m.allocated_bytes,
            "memory in PyTorch's MPS heaps (tensors and their cache)",
        )
        add(
            "other_allocations_bytes",
            "other allocations",
            m.other_allocations_bytes,
            "other Metal memory of this process outside PyTorch's heaps (MPSGraph buffers, other libraries)",
        )
        add(
            "allowed_bytes",
            "max allowed",
            m.allowed_bytes,
            "the high-watermark limit PyTorch enforces on unified memory (PYTORCH_MPS_HIGH_WATERMARK_RATIO)",
        )
        return tuple(figures)
    add(
        "capacity_bytes",
        "total capacity" if m.kind != CUDA_MALLOC_ASYNC else "Device limit",
        m.capacity_bytes,
        "all memory of the GPU as the driver reports it, not what PyTorch may use",
    )
    add(
        "free_bytes",
        "free",
        m.free_bytes,
        "free on the whole GPU when the request failed, after PyTorch had released every wholly free cached segment and retried",
    )
    for process in m.processes:
        if process.pid is None:
            add(
                "this_process_bytes",
                "this process has (NVML)",
                process.used_bytes,
                "everything this process holds on the GPU: PyTorch's reserved memory plus the CUDA context, "
                "library workspaces (cuBLAS, cuDNN, NCCL) and any other CUDA code in the process",
            )
        else:
            add(
                f"process_{process.pid}_bytes",
                f"Process {process.pid} has (NVML)",
                process.used_bytes,
                "another process on this GPU, or this one seen by its host PID from inside a container",
            )
    add(
        "allowed_bytes",
        "allowed" if m.kind != CUDA_MALLOC_ASYNC else "PyTorch limit",
        m.allowed_bytes,
        "the per-process limit (torch.cuda.set_per_process_memory_fraction): PyTorch reserves no more, even when the GPU has room",
    )
    if "sentences" in m.wording:
        allocated_meaning = "memory in live tensors, plus free cached blocks in private pools (CUDA graphs)"
    elif m.kind == CUDA_MALLOC_ASYNC:
        allocated_meaning = "memory PyTorch has taken from the CUDA driver's pool"
    else:
        allocated_meaning = "memory in live tensors (torch.cuda.memory_allocated)"
    add("allocated_bytes", "allocated", m.allocated_bytes, allocated_meaning)
    add(
        "private_pool_bytes",
        "allocated in private pools",
        m.private_pool_bytes,
        "free cached memory inside private pools (CUDA graphs), counted in 'allocated' despite the wording; ordinary tensors cannot use it",
    )
    if m.wording.startswith("1.5-2.0"):
        add(
            "reserved_bytes",
            "reserved in total by PyTorch",
            m.reserved_bytes,
            "all memory PyTorch's caching allocator holds (torch.cuda.memory_reserved)",
        )
    label = "cached" if m.wording.startswith("0.4.1-1.4") else "reserved but unallocated"
    add(
        "reserved_unallocated_bytes",
        label,
        m.reserved_unallocated_bytes,
        "held by PyTorch but used by no tensor: free blocks inside segments that also hold live tensors, "
        "so the allocator could not give them back before failing",
    )
    return tuple(figures)


def derived_figures(derived: Derived, message: OomMessage) -> tuple[Figure, ...]:
    d = derived
    if message.kind == MPS:
        rows = [
            Figure("in_use_bytes", "in use", d.in_use_bytes, "MPS allocated + other allocations"),
            Figure("available_bytes", "left under the limit", d.available_bytes, "max allowed - in use"),
            Figure("shortfall_bytes", "missing", d.shortfall_bytes, "Tried to allocate - left under the limit"),
        ]
        return tuple(row for row in rows if row.bytes is not None)
    rows = [
        Figure("reserved_bytes", "reserved by PyTorch", d.reserved_bytes, "allocated + reserved but unallocated"),
        Figure("tensor_bytes", "in live tensors", d.tensor_bytes, "allocated - private pools' free blocks"),
        Figure("in_use_bytes", "in use", d.in_use_bytes, "total capacity - free, every process"),
        Figure(
            "non_pytorch_bytes",
            "on the GPU outside PyTorch's allocator",
            d.non_pytorch_bytes,
            "in use - reserved: other processes, this process's CUDA context and other CUDA libraries",
        ),
        Figure(
            "own_outside_pytorch_bytes",
            "this process outside PyTorch's allocator",
            d.own_outside_pytorch_bytes,
            "this process (NVML) - reserved: CUDA context, cuBLAS/cuDNN workspaces, NCCL, other CUDA code",
        ),
        Figure(
            "other_processes_bytes", "other processes", d.other_processes_bytes, "sum of the other processes' lines"
        ),
        Figure(
            "available_bytes",
            "available to the request",
            d.available_bytes,
            "free, or what the memory fraction leaves (allowed - reserved) when that is less",
        ),
        Figure(
            "needed_bytes",
            "segment needed",
            d.needed_bytes if d.needed_bytes != message.requested_bytes else None,
            "before 1.5 the figure is the request: the segment cudaMalloc needed is larger",
        ),
        Figure("shortfall_bytes", "missing", d.shortfall_bytes, "needed - available (negative: it should have fitted)"),
    ]
    return tuple(row for row in rows if row.bytes is not None)
