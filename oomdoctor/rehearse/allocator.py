"""A pure-Python simulator of torch 2.13's CUDA caching allocator (one device).

It follows c10/cuda/CUDACachingAllocator.cpp rule for rule (see the reference spec, §4): request
rounding, small (<= 1 MiB) and large pools, 2 MiB / 20 MiB / rounded segments, best fit per stream
with ties to the lowest address, splitting and merging, oversize blocks under max_split_size_mb,
roundup_power2_divisions, garbage collection under a memory fraction, the release of oversize
blocks and the full flush before an OOM, record_stream's deferred frees, and expandable segments.
What it produces has torch's shapes exactly: `snapshot()` is `torch.cuda.memory._snapshot()`,
`memory_stats()` is `torch.cuda.memory_stats()`, and `SimulatedOutOfMemory` carries the text of
torch's OutOfMemoryError.

The device is a capacity in bytes minus what lives outside this allocator (this process's CUDA
context, another process). cudaMalloc succeeds when the free bytes cover the segment; addresses
come from a first-fit virtual address space, so freed ranges are reused as the driver does.
"""

from __future__ import annotations

import copy
import os
import time
from bisect import bisect_left, insort
from collections import deque
from collections.abc import Callable
from typing import Any

from oomdoctor.allocator_rules import (
    MIN_BLOCK_BYTES,
    ROUND_LARGE_BYTES,
    SMALL_REQUEST_BYTES,
    SMALL_SEGMENT_BYTES,
    UNLIMITED,
    AllocatorConfig,
    parse_alloc_conf,
)
from oomdoctor.units import format_size

Frames = list  # list of {"filename", "line", "name"} dicts, innermost first, shared not copied

SEGMENT_BASE_ADDRESS = 0x7F0000000000  # where cudaMalloc'd segments start
EXPANDABLE_BASE_ADDRESS = 0x3000000000  # where expandable-segment reservations start
DEFAULT_POOL_ID = (0, 0)

_CONTEXT_LEVELS = {None: 0, "state": 1, "alloc": 2, "all": 3}
_STAT_ARRAYS = (
    "allocation",
    "segment",
    "active",
    "inactive_split",
    "allocated_bytes",
    "reserved_bytes",
    "active_bytes",
    "inactive_split_bytes",
    "requested_bytes",
)
_OOM_HINT = (
    " If reserved but unallocated memory is large try setting"
    " PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for"
    " Memory Management  (https://docs.pytorch.org/docs/stable/notes/cuda.html"
    "#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)"
)


class SimulatedOutOfMemory(Exception):
    """The simulated allocator gave up; str() is torch 2.13's OutOfMemoryError message.

    request_bytes is the rounded request (what the `oom` trace event records); alloc_bytes the
    segment-sized "Tried to allocate" figure; device_total_bytes and device_free_bytes are the
    third and fourth arguments torch passes to OOM observers (the total is the memory-fraction
    limit when one is set, as in torch).
    """

    def __init__(
        self,
        message: str,
        *,
        device: int,
        request_bytes: int,
        alloc_bytes: int,
        device_total_bytes: int,
        device_free_bytes: int,
    ) -> None:
        super().__init__(message)
        self.device = device
        self.request_bytes = request_bytes
        self.alloc_bytes = alloc_bytes
        self.device_total_bytes = device_total_bytes
        self.device_free_bytes = device_free_bytes


class _Stat:
    __slots__ = ("current", "peak", "allocated", "freed")

    def __init__(self) -> None:
        self.current = self.peak = self.allocated = self.freed = 0

    def increase(self, amount: int) -> None:
        self.current += amount
        self.allocated += amount
        if self.current > self.peak:
            self.peak = self.current

    def decrease(self, amount: int) -> None:
        self.current -= amount
        self.freed += amount

    def as_dict(self) -> dict[str, int]:
        return {"current": self.current, "peak": self.peak, "allocated": self.allocated, "freed": self.freed}


class _ExpandableSegment:
    """One virtual address reservation of a (stream, pool), mapped in pages."""

    __slots__ = ("base", "page_bytes", "page_count", "mapped_pages", "stream")

    def __init__(self, base: int, page_bytes: int, page_count: int, stream: int) -> None:
        self.base = base
        self.page_bytes = page_bytes
        self.page_count = page_count
        self.mapped_pages: set[int] = set()
        self.stream = stream

    @property
    def size(self) -> int:
        return self.page_bytes * self.page_count


class _Block:
    __slots__ = (
        "address",
        "size",
        "requested_size",
        "stream",
        "pool",
        "allocated",
        "mapped",
        "prev",
        "next",
        "expandable",
        "frames",
        "segment_frames",
        "stream_uses",
        "event_count",
        "gc_count_base",
    )

    def __init__(self, address: int, size: int, stream: int, pool: _Pool) -> None:
        self.address = address
        self.size = size
        self.requested_size = 0
        self.stream = stream
        self.pool = pool
        self.allocated = False
        self.mapped = True
        self.prev: _Block | None = None
        self.next: _Block | None = None
        self.expandable: _ExpandableSegment | None = None
        self.frames: Frames | None = None  # context_when_allocated
        self.segment_frames: Frames | None = None  # context_when_segment_allocated
        self.stream_uses: set[int] = set()
        self.event_count = 0
        self.gc_count_base = 0

    def is_split(self) -> bool:
        return self.prev is not None or self.next is not None

    def link_before(self, block: _Block) -> None:
        """Put this block into block's segment chain, right before it."""
        self.prev = block.prev
        self.next = block
        if block.prev is not None:
            block.prev.next = self
        block.prev = self

    def link_after(self, block: _Block) -> None:
        """Put this block into block's segment chain, right after it."""
        self.prev = block
        self.next = block.next
        if block.next is not None:
            block.next.prev = self
        block.next = self


class _Pool:
    """Free blocks of one pool, ordered like torch's std::set: by (stream, size, address)."""

    def __init__(self, is_small: bool) -> None:
        self.is_small = is_small
        self.free: dict[int, list[tuple[int, int]]] = {}  # stream -> sorted (size, address)
        self.free_blocks: dict[int, _Block] = {}  # address -> block
        self.unmapped: dict[int, list[int]] = {}  # stream -> sorted addresses of unmapped blocks
        self.get_free_blocks_call_count = 0

    def insert(self, block: _Block) -> None:
        block.gc_count_base = self.get_free_blocks_call_count
        insort(self.free.setdefault(block.stream, []), (block.size, block.address))
        self.free_blocks[block.address] = block

    def remove(self, block: _Block) -> None:
        keys = self.free[block.stream]
        del keys[bisect_left(keys, (block.size, block.address))]
        del self.free_blocks[block.address]

    def contains(self, block: _Block) -> bool:
        return self.free_blocks.get(block.address) is block

    def insert_unmapped(self, block: _Block) -> None:
        insort(self.unmapped.setdefault(block.stream, []), block.address)

    def remove_unmapped(self, block: _Block) -> None:
        addresses = self.unmapped[block.stream]
        del addresses[bisect_left(addresses, block.address)]

    def ordered_free_blocks(self) -> list[_Block]:
        return [self.free_blocks[address] for stream in sorted(self.free) for _, address in self.free[stream]]


class AddressSpace:
    """Where cudaMalloc places segments: first fit, 2 MiB aligned, freed ranges reused lowest first.

    The CUDA driver's real placement is its own business (it may even hand out descending
    addresses); it only matters to the allocator through best fit's tie-break on the lowest
    address. Replays of real traces pass a subclass that returns torch's recorded addresses.
    """

    def __init__(self, base: int) -> None:
        self._holes: list[tuple[int, int]] = []  # sorted (address, size)
        self._top = base

    def take(self, size: int) -> int:
        for index, (address, hole_size) in enumerate(self._holes):
            if hole_size >= size:
                if hole_size == size:
                    del self._holes[index]
                else:
                    self._holes[index] = (address + size, hole_size - size)
                return address
        address = self._top
        self._top += -(-size // ROUND_LARGE_BYTES) * ROUND_LARGE_BYTES
        return address

    def give_back(self, address: int, size: int) -> None:
        size = -(-size // ROUND_LARGE_BYTES) * ROUND_LARGE_BYTES
        index = bisect_left(self._holes, (address, 0))
        self._holes.insert(index, (address, size))
        # coalesce with the neighbours so that a later, larger segment can reuse the range
        if index + 1 < len(self._holes) and address + size == self._holes[index + 1][0]:
            size += self._holes[index + 1][1]
            self._holes[index] = (address, size)
            del self._holes[index + 1]
        if index > 0 and self._holes[index - 1][0] + self._holes[index - 1][1] == address:
            previous_address, previous_size = self._holes[index - 1]
            self._holes[index - 1] = (previous_address, previous_size + size)
            del self._holes[index]
        if self._holes and self._holes[-1][0] + self._holes[-1][1] == self._top:
            self._top = self._holes.pop()[0]


class _MonotonicClock:
    def __init__(self, source: Callable[[], int] | None) -> None:
        self._source = source or (lambda: time.time_ns() // 1000)
        self._last = 0

    def __call__(self) -> int:
        now = int(self._source())
        if now <= self._last:
            now = self._last + 1
        self._last = now
        return now


class CachingAllocatorSimulator:
    """One device's caching allocator. Sizes are bytes; streams are ints (0 = default stream)."""

    def __init__(
        self,
        capacity_bytes: int,
        *,
        alloc_conf: str = "",
        context_bytes: int = 0,
        other_process_bytes: int = 0,
        device: int = 0,
        clock_us: Callable[[], int] | None = None,
        other_process_pid: int | None = None,
        address_space: AddressSpace | None = None,
    ) -> None:
        if capacity_bytes <= 0:
            raise ValueError("device capacity must be positive")
        self.capacity_bytes = int(capacity_bytes)
        self.context_bytes = int(context_bytes)
        self.other_process_bytes = int(other_process_bytes)
        self.device = device
        self.pid = os.getpid()
        self.other_process_pid = other_process_pid if other_process_pid is not None else self.pid + 1
        self.config: AllocatorConfig = parse_alloc_conf(alloc_conf)
        self._clock = _MonotonicClock(clock_us)

        self._small = _Pool(is_small=True)
        self._large = _Pool(is_small=False)
        self._blocks: dict[int, _Block] = {}  # address -> every live block, mapped or not
        self._segments: set[int] = set()  # base addresses of cudaMalloc'd segments
        self._expandable: list[_ExpandableSegment] = []
        self._pending_frees: list[_Block] = []  # record_stream'ed blocks waiting for their events
        self._addresses = address_space if address_space is not None else AddressSpace(SEGMENT_BASE_ADDRESS)
        self._next_reservation_address = EXPANDABLE_BASE_ADDRESS
        self._reserved_total_bytes = 0  # total_allocated_memory: cudaMalloc'd plus mapped
        self._allowed_bytes: int | None = None
        if self.config.per_process_memory_fraction is not None:
            self.set_per_process_memory_fraction(self.config.per_process_memory_fraction)

        self._stats = {name: (_Stat(), _Stat(), _Stat()) for name in _STAT_ARRAYS}  # all, small, large
        self._oversize_allocations = _Stat()
        self._oversize_segments = _Stat()
        self._counters = {
            "num_alloc_retries": 0,
            "num_ooms": 0,
            "num_sync_all_streams": 0,
            "num_device_alloc": 0,
            "num_device_free": 0,
        }

        self._history_enabled = False
        self._context_level = 0
        self._trace: deque[dict[str, Any]] = deque(maxlen=1)
        self._annotations: deque[dict[str, Any]] = deque(maxlen=1)

    # ----------------------------------------------------------------- public API

    def record_history(self, enabled: bool, *, max_entries: int = 100_000, context: str | None = "all") -> None:
        """Like `_record_memory_history`: context is None, "state", "alloc" or "all"."""
        if context not in _CONTEXT_LEVELS:
            raise ValueError(f"context must be one of None, 'state', 'alloc', 'all', not {context!r}")
        self._history_enabled = bool(enabled)
        self._context_level = _CONTEXT_LEVELS[context] if enabled else 0
        entries = max(1, int(max_entries))
        if not enabled:
            self._trace = deque(maxlen=entries)  # torch clears the ring when recording stops
            self._annotations = deque(maxlen=entries)
        elif self._trace.maxlen != entries:
            self._trace = deque(self._trace, maxlen=entries)
            self._annotations = deque(self._annotations, maxlen=entries)

    def set_per_process_memory_fraction(self, fraction: float) -> None:
        if not 0.0 <= fraction <= 1.0:
            raise ValueError("memory fraction must be in [0, 1]")
        self._allowed_bytes = int(fraction * self.capacity_bytes)

    def annotate(self, name: str, stage: str) -> None:
        """A record_function START/END entry of `external_annotations`."""
        if self._history_enabled:
            self._annotations.append({"name": name, "stage": stage, "device": self.device, "time_us": self._clock()})

    def mem_get_info(self) -> tuple[int, int]:
        """(free_bytes, total_bytes) as cudaMemGetInfo reports them."""
        used = self.context_bytes + self.other_process_bytes + self._reserved_total_bytes
        return max(0, self.capacity_bytes - used), self.capacity_bytes

    def malloc(self, nbytes: int, stream: int = 0, frames: Frames | None = None) -> int:
        """Allocate nbytes on stream; returns the block address. Raises SimulatedOutOfMemory."""
        if nbytes < 0:
            raise ValueError("cannot allocate a negative number of bytes")
        if nbytes == 0:
            return 0  # torch hands out a null pointer without asking the allocator
        context = self._gather(1, frames)
        self._process_events(context)
        size = self.config.round_size(nbytes)
        pool = self._small if size <= SMALL_REQUEST_BYTES else self._large
        alloc_bytes = self.config.allocation_size(size)

        block = self._get_free_block(pool, stream, size)
        if block is None:
            if self._gc_enabled():
                self._garbage_collect(context)
            block = self._alloc_block(pool, stream, size, alloc_bytes, False, context)
            if block is None and self._release_available_cached_blocks(pool, stream, size, context):
                block = self._alloc_block(pool, stream, size, alloc_bytes, False, context)
            if block is None:
                self._release_cached_blocks(context)
                block = self._alloc_block(pool, stream, size, alloc_bytes, True, context)
        if block is None:
            raise self._out_of_memory(size, alloc_bytes, stream, context)
        return self._alloc_found_block(block, pool, stream, size, nbytes, context)

    def free(self, address: int, frames: Frames | None = None) -> None:
        """Release the block at address (free_requested, then free_completed unless record_stream'ed)."""
        if address == 0:
            return
        block = self._blocks.get(address)
        if block is None or not block.allocated:
            raise ValueError(f"invalid device pointer: {address:#x}")
        context = self._gather(3, frames)
        block.allocated = False
        for stat in self._selected("allocation", block.pool):
            stat.decrease(1)
        for stat in self._selected("allocated_bytes", block.pool):
            stat.decrease(block.size)
        self._record("free_requested", block.address, block.requested_size, block.stream, context, block.frames)
        if block.size >= self.config.max_split_size_bytes:
            self._oversize_allocations.decrease(1)
        if block.stream_uses:
            block.event_count += len(block.stream_uses)
            block.stream_uses.clear()
            self._pending_frees.append(block)
        else:
            self._free_block(block, context)

    def record_stream(self, address: int, stream: int) -> None:
        """Mark the block as used on another stream: its free completes only at the next sync point."""
        block = self._blocks.get(address)
        if block is None or not block.allocated:
            raise ValueError(f"invalid device pointer: {address:#x}")
        if stream != block.stream:
            block.stream_uses.add(stream)

    def would_flush(self, nbytes: int, stream: int = 0) -> bool:
        """Whether malloc(nbytes) now would have to release cached memory (a retry, or an OOM).

        Answered on a copy; this allocator, its trace and its statistics are left untouched.
        """
        trace, annotations, clock = self._trace, self._annotations, self._clock
        self._trace, self._annotations = deque(maxlen=1), deque(maxlen=1)
        try:
            trial = copy.deepcopy(self)
        finally:
            self._trace, self._annotations, self._clock = trace, annotations, clock
        trial.record_history(False)
        retries = trial._counters["num_alloc_retries"]
        released = trial._counters["num_device_free"]
        try:
            trial.malloc(nbytes, stream)
        except SimulatedOutOfMemory:
            return True
        return trial._counters["num_alloc_retries"] > retries or trial._counters["num_device_free"] > released

    def empty_cache(self, frames: Frames | None = None) -> None:
        """torch.cuda.empty_cache(): release every unsplit cached block and free expandable pages.

        With context "all", the segment_free / segment_unmap events carry `frames` (the caller's
        stack) when given, else the stack of the malloc that created the segment.
        """
        self._release_cached_blocks(self._gather(3, frames))

    def snapshot(self) -> dict[str, Any]:
        """torch 2.13's `torch.cuda.memory._snapshot()` dict for this device."""
        segments, total_active = self._segment_infos()
        traces: list[list[dict[str, Any]]] = [[] for _ in range(self.device)]
        traces.append(list(self._trace))
        result = {
            "segments": segments,
            "device_traces": traces,
            "allocator_settings": self.config.settings_dict(),
            "external_annotations": list(self._annotations),
        }
        self._record("snapshot", 0, total_active, 0, None, None)
        return result

    def memory_stats(self) -> dict[str, Any]:
        """torch.cuda.memory_stats(): flat, sorted keys like "allocated_bytes.all.current"."""
        flat: list[tuple[str, Any]] = []
        for name, (all_pools, small, large) in self._stats.items():
            for pool_name, stat in (("all", all_pools), ("small_pool", small), ("large_pool", large)):
                for field, value in stat.as_dict().items():
                    flat.append((f"{name}.{pool_name}.{field}", value))
        oversize = (
            ("oversize_allocations", self._oversize_allocations),
            ("oversize_segments", self._oversize_segments),
        )
        for name, stat in oversize:
            for field, value in stat.as_dict().items():
                flat.append((f"{name}.{field}", value))
        flat.extend(self._counters.items())
        flat.append(("num_oom_rejections", 0))
        max_split = self.config.max_split_size_bytes
        flat.append(("max_split_size", -1 if max_split == UNLIMITED else max_split))
        return dict(sorted(flat))

    # ------------------------------------------------------------ history helpers

    def _gather(self, level: int, frames: Frames | None) -> Frames | None:
        """The stack torch would gather at this RecordContext level: None when it would not."""
        if self._context_level < level:
            return None
        return frames if frames is not None else ([] if level < 3 else None)

    def _record(
        self,
        action: str,
        address: int,
        size: int,
        stream: int,
        context: Frames | None,
        fallback: Frames | None,
    ) -> None:
        if not self._history_enabled:
            return
        entry: dict[str, Any] = {"action": action, "addr": address, "size": size, "stream": stream}
        entry["time_us"] = self._clock()
        entry["compile_context"] = "N/A"
        entry["user_metadata"] = ""
        entry["pool_id"] = DEFAULT_POOL_ID
        frames = context if context is not None else fallback
        if frames and self._context_level >= 2:
            entry["frames"] = frames
        self._trace.append(entry)

    # -------------------------------------------------------------- stat helpers

    def _selected(self, name: str, pool: _Pool) -> tuple[_Stat, _Stat]:
        all_pools, small, large = self._stats[name]
        return all_pools, (small if pool.is_small else large)

    # ------------------------------------------------------------ allocator core

    def _gc_enabled(self) -> bool:
        return self._allowed_bytes is not None and self.config.garbage_collection_threshold > 0.0

    def _get_free_block(self, pool: _Pool, stream: int, size: int) -> _Block | None:
        if self._gc_enabled():
            pool.get_free_blocks_call_count += 1
        keys = pool.free.get(stream)
        if not keys:
            return None
        index = bisect_left(keys, (size, -1))
        if index == len(keys):
            return None
        block = pool.free_blocks[keys[index][1]]
        if block.expandable is not None:
            if self.config.expandable_segments:
                # best fit counts the unmapped tail an expandable block could grow into
                def expandable_size(candidate: _Block) -> int:
                    tail = candidate.next
                    return candidate.size + (tail.size if tail is not None and not tail.mapped else 0)

                while block.expandable is not None and index + 1 < len(keys):
                    following = pool.free_blocks[keys[index + 1][1]]
                    if expandable_size(following) >= expandable_size(block):
                        break
                    index += 1
                    block = following
            else:
                index += 1
                while index < len(keys) and pool.free_blocks[keys[index][1]].expandable is not None:
                    index += 1
                if index == len(keys):
                    return None
                block = pool.free_blocks[keys[index][1]]
        max_split = self.config.max_split_size_bytes
        if size < max_split and block.size >= max_split:
            return None
        if size >= max_split and block.size >= size + self.config.max_non_split_rounding_bytes:
            return None
        pool.remove(block)
        return block

    def _cuda_free_bytes(self) -> int:
        return self.mem_get_info()[0]

    def _alloc_block(
        self,
        pool: _Pool,
        stream: int,
        size: int,
        alloc_bytes: int,
        is_retry: bool,
        context: Frames | None,
    ) -> _Block | None:
        if is_retry:
            self._counters["num_alloc_retries"] += 1
        if self._allowed_bytes is not None and self._reserved_total_bytes + alloc_bytes > self._allowed_bytes:
            return None
        if self.config.expandable_segments:
            return self._try_allocate_expandable_block(pool, stream, size, context)
        if alloc_bytes > self._cuda_free_bytes():
            return None
        address = self._addresses.take(alloc_bytes)
        self._reserved_total_bytes += alloc_bytes
        block = _Block(address, alloc_bytes, stream, pool)
        self._blocks[address] = block
        self._segments.add(address)
        for stat in self._selected("segment", pool):
            stat.increase(1)
        for stat in self._selected("reserved_bytes", pool):
            stat.increase(alloc_bytes)
        if alloc_bytes >= self.config.max_split_size_bytes:
            self._oversize_segments.increase(1)
        self._counters["num_device_alloc"] += 1
        self._record("segment_alloc", address, alloc_bytes, stream, context, None)
        block.segment_frames = context
        return block

    def _should_split(self, block: _Block, size: int) -> bool:
        remaining = block.size - size
        if block.pool.is_small or self.config.expandable_segments:
            return remaining >= MIN_BLOCK_BYTES
        return size < self.config.max_split_size_bytes and remaining > SMALL_REQUEST_BYTES

    def _alloc_found_block(
        self,
        block: _Block,
        pool: _Pool,
        stream: int,
        size: int,
        nbytes: int,
        context: Frames | None,
    ) -> int:
        already_split = block.is_split()
        if self._should_split(block, size):
            remaining = block
            block = _Block(remaining.address, size, stream, pool)
            block.expandable = remaining.expandable
            block.link_before(remaining)
            remaining.address += size
            remaining.size -= size
            self._blocks[block.address] = block
            self._blocks[remaining.address] = remaining
            pool.insert(remaining)
            if block.expandable is None:
                if already_split:
                    for stat in self._selected("inactive_split_bytes", pool):
                        stat.decrease(block.size)
                else:
                    for stat in self._selected("inactive_split_bytes", pool):
                        stat.increase(remaining.size)
                    for stat in self._selected("inactive_split", pool):
                        stat.increase(1)
        elif already_split and block.expandable is None:
            for stat in self._selected("inactive_split_bytes", pool):
                stat.decrease(block.size)
            for stat in self._selected("inactive_split", pool):
                stat.decrease(1)

        block.allocated = True
        block.requested_size = nbytes
        block.frames = context
        self._record("alloc", block.address, nbytes, block.stream, context, None)
        for name, amount in (
            ("allocation", 1),
            ("allocated_bytes", block.size),
            ("active", 1),
            ("active_bytes", block.size),
            ("requested_bytes", nbytes),
        ):
            for stat in self._selected(name, pool):
                stat.increase(amount)
        if block.size >= self.config.max_split_size_bytes:
            self._oversize_allocations.increase(1)
        return block.address

    def _free_block(self, block: _Block, context: Frames | None) -> None:
        self._record("free_completed", block.address, block.requested_size, block.stream, context, block.frames)
        block.frames = None
        original_size = block.size
        requested = block.requested_size
        pool = block.pool
        split_blocks_change = 0
        split_bytes_change = 0
        for candidate in (block.prev, block.next):
            subsumed = self._try_merge(block, candidate)
            if subsumed:
                split_blocks_change -= 1
                split_bytes_change -= subsumed
        pool.insert(block)
        if block.is_split():
            split_blocks_change += 1
            split_bytes_change += block.size
        if block.expandable is None:
            for stat in self._selected("inactive_split", pool):
                if split_blocks_change > 0:
                    stat.increase(split_blocks_change)
                elif split_blocks_change < 0:
                    stat.decrease(-split_blocks_change)
            for stat in self._selected("inactive_split_bytes", pool):
                if split_bytes_change > 0:
                    stat.increase(split_bytes_change)
                elif split_bytes_change < 0:
                    stat.decrease(-split_bytes_change)
        for stat in self._selected("active", pool):
            stat.decrease(1)
        for stat in self._selected("active_bytes", pool):
            stat.decrease(original_size)
        for stat in self._selected("requested_bytes", pool):
            stat.decrease(requested)

    def _try_merge(self, destination: _Block, source: _Block | None) -> int:
        """Fold a free neighbour into destination; returns the bytes gained (0 when not mergeable)."""
        if (
            source is None
            or source.allocated
            or source.event_count > 0
            or source.stream_uses
            or destination.mapped != source.mapped
        ):
            return 0
        pool = source.pool
        del self._blocks[source.address]
        if destination.prev is source:
            del self._blocks[destination.address]
            destination.address = source.address
            destination.prev = source.prev
            if destination.prev is not None:
                destination.prev.next = destination
            destination.segment_frames = source.segment_frames
            self._blocks[destination.address] = destination
        else:
            destination.next = source.next
            if destination.next is not None:
                destination.next.prev = destination
        if source.mapped:
            pool.remove(source)
        else:
            pool.remove_unmapped(source)
        destination.size += source.size
        return source.size

    def _process_events(self, context: Frames | None) -> None:
        # A simulated device finishes its work at once: every recorded use is over by the next call.
        if not self._pending_frees:
            return
        pending, self._pending_frees = self._pending_frees, []
        for block in pending:
            block.event_count = 0
            self._free_block(block, context)

    def _synchronize_and_free_events(self, context: Frames | None) -> None:
        self._counters["num_sync_all_streams"] += 1
        self._process_events(context)

    def _release_block(self, block: _Block, context: Frames | None) -> None:
        self._counters["num_device_free"] += 1
        self._record("segment_free", block.address, block.size, block.stream, context, block.segment_frames)
        self._addresses.give_back(block.address, block.size)
        self._reserved_total_bytes -= block.size
        pool = block.pool
        for stat in self._selected("segment", pool):
            stat.decrease(1)
        for stat in self._selected("reserved_bytes", pool):
            stat.decrease(block.size)
        if block.size >= self.config.max_split_size_bytes:
            self._oversize_segments.decrease(1)
        pool.remove(block)
        del self._blocks[block.address]
        self._segments.remove(block.address)

    def _release_available_cached_blocks(self, pool: _Pool, stream: int, size: int, context: Frames | None) -> bool:
        """With max_split_size set: free the smallest fitting oversize block, else the largest ones."""
        max_split = self.config.max_split_size_bytes
        if max_split == UNLIMITED:
            return False
        target = max(size, max_split)
        keys = pool.free.get(stream, [])
        index = bisect_left(keys, (target, -1))
        if index < len(keys):
            block = pool.free_blocks[keys[index][1]]
            if block.expandable is not None:
                return False
            self._release_block(block, context)
            return True
        released = 0
        for key in reversed(list(keys)):
            block = pool.free_blocks[key[1]]
            if released >= target or block.size < max_split or block.expandable is not None:
                break
            released += block.size
            self._release_block(block, context)
        return released >= target

    def _release_cached_blocks(self, context: Frames | None) -> None:
        self._synchronize_and_free_events(context)
        self._release_blocks(self._large, context)
        self._release_blocks(self._small, context)

    def _release_blocks(self, pool: _Pool, context: Frames | None) -> None:
        to_unmap = []
        for block in pool.ordered_free_blocks():
            if block.expandable is not None:
                to_unmap.append(block)
            elif block.prev is None and block.next is None:
                self._release_block(block, context)
        for block in to_unmap:
            self._unmap_block(block, context)
            if block.prev is None and block.next is None:
                self._release_expandable_segment(block)

    def _garbage_collect(self, context: Frames | None) -> None:
        assert self._allowed_bytes is not None
        threshold_bytes = int(self.config.garbage_collection_threshold * self._allowed_bytes)
        if self._reserved_total_bytes <= threshold_bytes:
            return
        target = self._reserved_total_bytes - threshold_bytes
        pool = self._large

        def age(block: _Block) -> int:
            return pool.get_free_blocks_call_count - block.gc_count_base

        candidates = [b for b in pool.ordered_free_blocks() if not b.is_split() and b.expandable is None]
        total_age = sum(age(b) for b in candidates)
        count = len(candidates)
        reclaimed = 0
        freed_one = True
        while reclaimed < target and freed_one and count > 0:
            threshold_age = total_age / count
            freed_one = False
            for block in pool.ordered_free_blocks():
                if block.is_split() or block.expandable is not None:
                    continue
                if age(block) >= threshold_age:
                    freed_one = True
                    reclaimed += block.size
                    total_age -= age(block)
                    count -= 1
                    self._release_block(block, context)

    # ------------------------------------------------------- expandable segments

    def _page_bytes(self, pool: _Pool) -> int:
        return SMALL_SEGMENT_BYTES if pool.is_small else self.config.large_segment_size_bytes

    def _find_expandable_block(self, pool: _Pool, stream: int, size: int) -> _Block:
        def allocatable(block: _Block | None) -> bool:
            return block is not None and not block.allocated and block.event_count == 0 and not block.stream_uses

        def has_room(block: _Block | None) -> bool:
            room = 0
            while room < size and allocatable(block):
                room += block.size  # type: ignore[union-attr]
                block = block.next  # type: ignore[union-attr]
            return room >= size

        for address in pool.unmapped.get(stream, []):
            candidate = self._blocks[address]
            if allocatable(candidate.prev):
                candidate = candidate.prev  # type: ignore[assignment]
            if has_room(candidate):
                return candidate
        page_bytes = self._page_bytes(pool)
        total = self.capacity_bytes
        page_count = -(-(total + total // 8) // page_bytes)
        segment = _ExpandableSegment(self._next_reservation_address, page_bytes, page_count, stream)
        self._next_reservation_address += -(-segment.size // ROUND_LARGE_BYTES) * ROUND_LARGE_BYTES
        self._expandable.append(segment)
        block = _Block(segment.base, segment.size, stream, pool)
        block.mapped = False
        block.expandable = segment
        self._blocks[block.address] = block
        pool.insert_unmapped(block)
        return block

    def _map_block(self, block: _Block, size: int, context: Frames | None) -> bool:
        segment = block.expandable
        assert segment is not None and not block.mapped
        first_page = (block.address - segment.base) // segment.page_bytes
        end_page = -(-(block.address + size - segment.base) // segment.page_bytes)
        mapped_bytes = (end_page - first_page) * segment.page_bytes
        if mapped_bytes == 0:
            return False
        if mapped_bytes > self._cuda_free_bytes():
            return False
        segment.mapped_pages.update(range(first_page, end_page))
        pool = block.pool
        mapped_address = block.address
        pool.remove_unmapped(block)
        block.mapped = True
        if mapped_bytes < block.size:
            remaining = _Block(block.address + mapped_bytes, block.size - mapped_bytes, block.stream, pool)
            remaining.mapped = False
            remaining.expandable = segment
            remaining.link_after(block)
            self._blocks[remaining.address] = remaining
            pool.insert_unmapped(remaining)
            block.size = mapped_bytes
        self._try_merge(block, block.prev)
        self._try_merge(block, block.next)
        pool.insert(block)
        self._reserved_total_bytes += mapped_bytes
        for stat in self._selected("reserved_bytes", pool):
            stat.increase(mapped_bytes)
        self._counters["num_device_alloc"] += 1
        self._record("segment_map", mapped_address, mapped_bytes, block.stream, context, None)
        if block.prev is None and block.segment_frames is None:
            block.segment_frames = context
        return True

    def _try_allocate_expandable_block(
        self, pool: _Pool, stream: int, size: int, context: Frames | None
    ) -> _Block | None:
        candidate = self._find_expandable_block(pool, stream, size)
        if not candidate.mapped and not self._map_block(candidate, min(candidate.size, size), context):
            return None
        while candidate.size < size:
            following = candidate.next
            assert following is not None
            if not self._map_block(following, min(size - candidate.size, following.size), context):
                return None
            candidate = following
        pool.remove(candidate)
        return candidate

    def _unmap_block(self, block: _Block, context: Frames | None) -> None:
        segment = block.expandable
        assert segment is not None
        page = segment.page_bytes
        first_page = -(-(block.address - segment.base) // page)
        end_page = (block.address + block.size - segment.base) // page
        if first_page >= end_page:
            return
        pool = block.pool
        pool.remove(block)
        del self._blocks[block.address]
        unmapped_address = segment.base + first_page * page
        unmapped_bytes = (end_page - first_page) * page
        before_bytes = unmapped_address - block.address
        if before_bytes > 0:
            before = _Block(block.address, before_bytes, block.stream, pool)
            before.expandable = segment
            before.link_before(block)
            self._blocks[before.address] = before
            pool.insert(before)
        after_bytes = block.size - (before_bytes + unmapped_bytes)
        if after_bytes > 0:
            after = _Block(unmapped_address + unmapped_bytes, after_bytes, block.stream, pool)
            after.expandable = segment
            after.link_after(block)
            self._blocks[after.address] = after
            pool.insert(after)
        block.address = unmapped_address
        block.size = unmapped_bytes
        block.mapped = False
        self._blocks[block.address] = block
        segment.mapped_pages.difference_update(range(first_page, end_page))
        self._try_merge(block, block.prev)
        self._try_merge(block, block.next)
        pool.insert_unmapped(block)
        self._reserved_total_bytes -= unmapped_bytes
        for stat in self._selected("reserved_bytes", pool):
            stat.decrease(unmapped_bytes)
        self._counters["num_device_free"] += 1
        self._record("segment_unmap", unmapped_address, unmapped_bytes, block.stream, context, block.segment_frames)

    def _release_expandable_segment(self, block: _Block) -> None:
        segment = block.expandable
        assert segment is not None and not block.mapped and block.size == segment.size
        self._expandable.remove(segment)
        block.pool.remove_unmapped(block)
        del self._blocks[block.address]

    # ------------------------------------------------------------------- OOM

    def _out_of_memory(self, size: int, alloc_bytes: int, stream: int, context: Frames | None) -> SimulatedOutOfMemory:
        device_free, device_total = self.mem_get_info()
        if self._history_enabled:
            entry: dict[str, Any] = {
                "action": "oom",
                "device_free": device_free,
                "size": size,
                "stream": stream,
                "time_us": self._clock(),
                "compile_context": "N/A",
                "user_metadata": "",
                "pool_id": DEFAULT_POOL_ID,
            }
            if context and self._context_level >= 2:
                entry["frames"] = context
            self._trace.append(entry)
        self._counters["num_ooms"] += 1
        allocated = self._stats["allocated_bytes"][0].current
        reserved = self._stats["reserved_bytes"][0].current
        processes = (
            f"Including non-PyTorch memory, this process has "
            f"{format_size(self.context_bytes + self._reserved_total_bytes)} memory in use. "
        )
        if self.other_process_bytes > 0:
            other = format_size(self.other_process_bytes)
            processes += f"Process {self.other_process_pid} has {other} memory in use. "
        allowed = f"{format_size(self._allowed_bytes)} allowed; " if self._allowed_bytes is not None else ""
        message = (
            f"CUDA out of memory. Tried to allocate {format_size(alloc_bytes)}. GPU {self.device} has a total "
            f"capacity of {format_size(device_total)} of which {format_size(device_free)} is free. "
            f"{processes}{allowed}Of the allocated memory {format_size(allocated)} is allocated by PyTorch, "
            f"and {format_size(reserved - allocated)} is reserved by PyTorch but unallocated.{_OOM_HINT}"
        )
        return SimulatedOutOfMemory(
            message,
            device=self.device,
            request_bytes=size,
            alloc_bytes=alloc_bytes,
            device_total_bytes=self._allowed_bytes if self._allowed_bytes is not None else device_total,
            device_free_bytes=device_free,
        )

    # -------------------------------------------------------------- snapshot

    def _segment_heads(self) -> list[_Block]:
        heads = [self._blocks[base] for base in self._segments]
        for segment in self._expandable:
            block = self._blocks[segment.base]
            while block is not None:
                if block.mapped and (block.prev is None or not block.prev.mapped):
                    heads.append(block)
                block = block.next
        return heads

    def _segment_infos(self) -> tuple[list[dict[str, Any]], int]:
        segments = []
        total_active = 0
        for head in self._segment_heads():
            blocks = []
            total = allocated = active = requested = 0
            block: _Block | None = head
            address = head.address
            while block is not None and block.mapped:
                is_active = block.allocated or block.event_count > 0 or bool(block.stream_uses)
                if block.allocated:
                    state = "active_allocated"
                    allocated += block.size
                elif is_active:
                    state = "active_pending_free"
                else:
                    state = "inactive"
                if is_active:
                    active += block.size
                    requested += block.requested_size
                total += block.size
                blocks.append(
                    {
                        "address": address,
                        "size": block.size,
                        "requested_size": block.requested_size,
                        "state": state,
                        "frames": block.frames if block.frames is not None else [],
                    }
                )
                address += block.size
                block = block.next
            total_active += active
            segments.append(
                {
                    "device": self.device,
                    "address": head.address,
                    "total_size": total,
                    "allocated_size": allocated,
                    "active_size": active,
                    "requested_size": requested,
                    "stream": head.stream,
                    "segment_type": "small" if head.pool.is_small else "large",
                    "segment_pool_id": DEFAULT_POOL_ID,
                    "is_expandable": head.expandable is not None,
                    "frames": head.segment_frames if head.segment_frames is not None else [],
                    "blocks": blocks,
                }
            )
        segments.sort(key=lambda segment: segment["address"])
        return segments, total_active
