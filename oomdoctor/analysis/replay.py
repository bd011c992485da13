"""Replay of one device's trace: the memory series, the peak, the OOMs and the live set at any event.

One forward pass over the events keeps the live allocations (address -> allocation event) and
running totals; absolute values come from the final state, walking back from the end as memory_viz
does, so bytes allocated before the trace began are still counted. Per event the pass does a dict
operation and a few integer additions; it creates no per-event objects.

The live set at any event has one home, `LiveHistory`: the pass (`walk`, or the lighter
`LiveHistory.record` a cursor uses) leaves copies of the live set along the way, and `at(i)`
replays from the nearest one and merges the result with the dump's own blocks.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import compress, islice
from operator import itemgetter

from oomdoctor.analysis.results import (
    EventState,
    LiveAllocation,
    NearOom,
    OomEvent,
    PhaseSpan,
    SeriesPeak,
    SeriesPoint,
)
from oomdoctor.analysis.sizing import (
    LARGE_SEGMENT_BYTES,
    SMALL_REQUEST_BYTES,
    SMALL_SEGMENT_BYTES,
    round_size,
    segment_size,
)
from oomdoctor.model import (
    ACTIVE_ALLOCATED,
    ACTIVE_PENDING_FREE,
    ALLOC,
    FREE_COMPLETED,
    FREE_REQUESTED,
    INACTIVE,
    OOM,
    SEGMENT_ALLOC,
    SEGMENT_FREE,
    SEGMENT_MAP,
    SEGMENT_UNMAP,
    Block,
    DeviceTrace,
    Segment,
    Stack,
    TraceEvent,
)

# An allocation as the passes keep it, one per alloc event of a million-event trace (so a plain
# tuple): (alloc event index, component index, block bytes, requested bytes). The component is
# walk's, for its totals; elsewhere it is 0. `LiveHistory` hands them out as `LiveAllocation`s.
LiveEntry = tuple[int, int, int, int]
# (event index, live: address -> entry, pending free: address -> block bytes) right after that event
LiveCopy = tuple[int, dict[int, LiveEntry], dict[int, int]]

# The walk copies the live set about this many times a trace (whatever its series' points), where
# a copy fits (`_copy_fits`, as `LiveHistory.record` copies): `LiveHistory.at` replays from the nearest.
_COPIES_PER_TRACE = 8
# A cursor's copies (`LiveHistory.record`, `SegmentHistory`): events replayed at most from the
# nearest copy; a few milliseconds of replay (about 0.3 us an event).
CURSOR_COPY_EVENTS = 2048
CURSOR_COPY_SEGMENT_EVENTS = 64
# Events walked back from the target for what last held its free blocks (`last_occupants`); a
# piece not reached by then counts as not shown
MAX_OCCUPANT_WALK = 200_000
_ROUND_RING_SIZES = frozenset([10**k for k in range(3, 9)] + [2**k for k in range(10, 27)])


@dataclass
class StepStats:
    first_index: int
    last_index: int
    peak_allocated_bytes: int  # relative to the pass start until made absolute
    end_allocated_bytes: int
    peak_activation_bytes: int


def _copy_fits(index: int, last_copy: int, live: dict[int, LiveEntry], pending: dict[int, int]) -> bool:
    """Whether a copy of the live and pending sets right after event `index` keeps the copies at
    most one entry per two events: the events since the last copy (at `last_copy`) are at least
    twice the entries it would hold."""
    return index - last_copy >= 2 * (len(live) + len(pending))


def final_live_blocks(segments: Sequence[Segment]) -> dict[int, Block]:
    return {b.address: b for s in segments for b in s.blocks if b.state == ACTIVE_ALLOCATED}


class LiveHistory:
    """Where one device's allocations lived along its trace: enough to rebuild the live set at any event.

    `copies` are the live and pending sets right after some events, in event order; `live_at_end`
    is the live set after the last event; `pre_existing_frees` are the frees of allocations made
    before the trace began, as (event index, address, block bytes). The dump's own blocks settle
    what the trace cannot know: the sizes of blocks still live at the end, and the blocks allocated
    before the trace and never freed.
    """

    __slots__ = (
        "trace",
        "final_blocks",
        "divisions",
        "copies",
        "_copy_indices",
        "live_at_end",
        "pre_existing_frees",
        "rounded_sizes",
        "_pre_free_indices",
        "_untraced",
    )

    def __init__(
        self,
        trace: DeviceTrace,
        final_blocks: dict[int, Block],
        divisions: tuple[tuple[int, int], ...],
        copies: list[LiveCopy],
        live_at_end: dict[int, LiveEntry],
        pre_existing_frees: list[tuple[int, int, int]],
        rounded_sizes: dict[int, int],
    ):
        self.trace = trace
        self.final_blocks = final_blocks
        self.divisions = divisions
        self.copies = copies
        self._copy_indices = [copy[0] for copy in copies]
        self.live_at_end = live_at_end
        self.pre_existing_frees = pre_existing_frees
        self.rounded_sizes = rounded_sizes  # request -> block bytes, as the pass rounded them
        self._pre_free_indices = [free[0] for free in pre_existing_frees]  # in event order
        # the dump's blocks allocated before the trace and never freed: live at every event
        self._untraced = [(a, b) for a, b in final_blocks.items() if a not in live_at_end]

    @classmethod
    def record(
        cls,
        trace: DeviceTrace,
        segments: Sequence[Segment],
        divisions: tuple[tuple[int, int], ...] = (),
        every: int = CURSOR_COPY_EVENTS,
    ) -> LiveHistory:
        """One pass that keeps only the live set, with a copy after every `every` events, or after
        twice as many events as the live set then holds when that is more: `at` then replays at
        most max(every, 2 x live) events, and the copies hold at most one entry per two events of
        the trace (plus one live set per `every` events), however large the live set grows."""
        count = len(trace)
        every = max(1, every)
        live: dict[int, LiveEntry] = {}
        pending: dict[int, int] = {}
        kept: list[LiveCopy] = []
        pre_existing_frees: list[tuple[int, int, int]] = []
        rounded: dict[int, int] = {}
        next_check = every - 1
        last_copy = -1
        for index, action, addr, size in zip(range(count), trace.actions, trace.addrs, trace.sizes):
            if action == ALLOC:
                block_size = rounded.get(size)
                if block_size is None:
                    block_size = rounded[size] = round_size(size, divisions)
                live[addr] = (index, 0, block_size, size)
            elif action == FREE_REQUESTED:
                entry = live.pop(addr, None)
                if entry is None:
                    block_size = round_size(size, divisions)
                    pre_existing_frees.append((index, addr, block_size))
                    pending[addr] = block_size
                else:
                    pending[addr] = entry[2]
            elif action == FREE_COMPLETED:
                pending.pop(addr, None)
            if index == next_check:
                next_check += every
                if _copy_fits(index, last_copy, live, pending):
                    kept.append((index, dict(live), dict(pending)))
                    last_copy = index
        return cls(trace, final_live_blocks(segments), divisions, kept, live, pre_existing_frees, rounded)

    def at_end(self) -> dict[int, LiveAllocation]:
        """The dump's own live blocks (address -> allocation), with their alloc events where the
        trace has them."""
        live_at_end = self.live_at_end
        live = {}
        for address, block in self.final_blocks.items():
            entry = live_at_end.get(address)
            alloc_index = entry[0] if entry is not None else None
            live[address] = LiveAllocation(address, alloc_index, block.size, block.requested_size)
        return live

    def _replayed(self, event_index: int, with_pending: bool = True) -> tuple[dict[int, LiveEntry], dict[int, int]]:
        """The pass's live set right after `event_index` (the copy's own when the nearest copy was
        taken there: do not change it) and, `with_pending`, a new pending set; replayed from the
        nearest copy at or before the event."""
        position = bisect.bisect_right(self._copy_indices, event_index)
        if position:
            copy_index, live, pending = self.copies[position - 1]
            start = copy_index + 1
        else:
            start, live, pending = 0, {}, {}
        end = event_index + 1
        pending = dict(pending) if with_pending else {}
        if start < end:
            live = dict(live)
            trace = self.trace
            rounded = self.rounded_sizes
            divisions = self.divisions
            for index, action, addr, size in zip(
                range(start, end), trace.actions[start:end], trace.addrs[start:end], trace.sizes[start:end]
            ):
                if action == ALLOC:
                    live[addr] = (index, 0, rounded.get(size) or round_size(size, divisions), size)
                elif action == FREE_REQUESTED:
                    entry = live.pop(addr, None)
                    if with_pending:
                        pending[addr] = entry[2] if entry is not None else round_size(size, divisions)
                elif action == FREE_COMPLETED:
                    pending.pop(addr, None)
        return live, pending

    def _allocations(self, event_index: int, live: dict[int, LiveEntry]) -> Iterator[tuple[int, int | None, int, int]]:
        """(address, alloc event, block bytes, requested bytes) of everything live right after
        `event_index`, each address once, from the pass's `live` set there: a block still live at
        the end has the dump's size, a block allocated before the trace is live until its free (or
        for good)."""
        live_at_end = self.live_at_end
        final = self.final_blocks
        for address, (alloc_index, _, size, requested) in live.items():
            end_entry = live_at_end.get(address)
            block = final.get(address)
            if end_entry is not None and end_entry[0] == alloc_index and block is not None:
                yield address, alloc_index, block.size, block.requested_size
            else:
                yield address, alloc_index, size, requested
        for address, block in self._untraced:  # allocated before the trace and never freed
            if address not in live:
                yield address, None, block.size, block.requested_size
        later = bisect.bisect_right(self._pre_free_indices, event_index)
        freed: set[int] = set()
        for _, address, size in self.pre_existing_frees[later:]:  # allocated before the trace, freed later
            # (not one live, nor one never freed, nor one met already)
            if address not in live and address not in freed and (address not in final or address in live_at_end):
                freed.add(address)
                yield address, None, size, size

    def at(self, event_index: int) -> tuple[dict[int, LiveAllocation], dict[int, int]]:
        """(live, pending) right after `event_index`: address -> allocation, and address -> block
        bytes of each block whose free was requested but not completed. Replayed from the nearest
        copy at or before the event (`_allocations` says which blocks and their sizes)."""
        live, pending = self._replayed(event_index)
        merged = {entry[0]: LiveAllocation(*entry) for entry in self._allocations(event_index, live)}
        return merged, pending

    def bytes_at(self, event_index: int) -> int:
        """The block bytes of everything live right after `event_index`: what `at(event_index)`'s
        allocations sum to, counted without making them (a dump of 100,000 live blocks)."""
        live, _ = self._replayed(event_index, with_pending=False)
        return sum(map(itemgetter(2), self._allocations(event_index, live)))


@dataclass
class ReplayState:
    """What the pass learned; `analysis` turns it into result objects."""

    event_count: int
    series: list[SeriesPoint]
    series_peaks: list[SeriesPeak]  # one per point of `series`: the most allocated over its interval
    peak_index: int | None
    peak_allocated_bytes: int
    oom_indices: list[int]
    history: LiveHistory  # copies of the live set about every eighth of the trace and at every OOM
    steps: dict[int, StepStats]
    allocated_offset_bytes: int
    has_frames: bool
    has_time: bool
    # frees completed in the trace of blocks whose free was requested before it: allocations older than the trace
    pre_existing_completions: int = 0
    # the alloc and free_requested events of requests over SMALL_REQUEST_BYTES, in order (what
    # `unsized_remainders` walks), noted by the pass as it goes
    large_events: Sequence[int] | None = None
    # the segment_alloc, segment_map, segment_free and segment_unmap events, in order (what
    # `near_ooms` reads), noted by the pass as it goes
    segment_events: Sequence[int] | None = None


def columns(trace: Sequence[TraceEvent]) -> DeviceTrace:
    """The columnar form of a trace (what the loader builds; tests may pass plain events)."""
    if isinstance(trace, DeviceTrace):
        return trace
    return DeviceTrace.from_events(0, tuple(trace))


def walk(
    trace: DeviceTrace,
    segments: Sequence[Segment],
    spans: Sequence[PhaseSpan],
    registered: Mapping[int, tuple[int, str, int]] | None,
    component_of_pre_existing: Callable[[int, int], int],
    component_count: int,
    activation_component: int,
    divisions: tuple[tuple[int, int], ...] = (),
    max_points: int = 480,
    phase_component_map: dict[str, int] | None = None,
    own_components: Mapping[int, int] | None = None,
    final_blocks: dict[int, Block] | None = None,
) -> ReplayState:
    """One pass over the trace. An allocation's component is the one `phase_component_map` gives
    its phase (the last component, unknown, when it gives none), unless `registered` (oomdoctor's
    registry: address -> (component, name, bytes)) holds its address with its requested bytes: then
    that one (`attribution.series_classifier`'s component_of_alloc, inline: no call per alloc).
    `own_components`: alloc event -> the component its own stack gives it whatever its phase
    (`attribution.components_by_own_stacks`), which the registry's still overrides.

    Allocated bytes after an event follow docs/definitions.md ("The peak"): each live block at
    round_size(request), unless it survives to the dump (its exact bytes there, from its alloc on),
    plus the blocks from before the trace (exact from the dump, or round_size of their free); the
    peak, the steps' peaks and the series all count them so. `final_blocks`: `final_live_blocks(segments)`
    when the caller has it."""
    count = len(trace)
    if final_blocks is None:
        final_blocks = final_live_blocks(segments)
    survivors = survivor_sizes(trace, final_blocks, divisions)
    survivor_order = sorted(survivors)
    survivor_position = 0
    next_survivor = survivor_order[0] if survivor_order else -1
    times = trace.times_us
    live: dict[int, LiveEntry] = {}
    pending: dict[int, int] = {}
    totals = [0] * component_count
    allocated = 0
    reserved = 0
    peak_value = -1
    peak_index: int | None = None
    samples: list[tuple[int, int | None, int, int, tuple[int, ...]]] = []
    stride = max(1, -(-count // max_points)) if count else 1
    next_sample = 0
    last = count - 1
    mosts: list[tuple[int, int, tuple[int, ...]]] = []  # per sample: (event, allocated, totals) of its interval's most
    oom_indices: list[int] = []
    pre_existing_frees: list[tuple[int, int, int]] = []
    completed_only = 0
    rounded_cache: dict[int, int] = {}
    large_events: list[int] = []
    large = large_events.append
    segment_events: list[int] = []
    segment_event = segment_events.append
    small = SMALL_REQUEST_BYTES
    steps: dict[int, StepStats] = {}
    copies: list[LiveCopy] = []  # at every OOM, and about every eighth of the trace
    copy_every = max(1, -(-count // _COPIES_PER_TRACE))
    next_copy = copy_every - 1
    last_copy = -1

    span_position = 0
    next_boundary = spans[1].first_index if len(spans) > 1 else count
    phase = spans[0].phase if spans else "unknown"
    step = spans[0].step if spans else 0
    phase_components = phase_component_map or {}
    phase_component = phase_components.get(phase, component_count - 1)
    stats = steps.setdefault(step, StepStats(0, 0, 0, 0, 0))
    stats_peak = stats_activation_peak = 0

    actions = trace.actions
    # The events come in intervals, each ending at a sampled event: (previous sample, sample]. Per
    # interval the pass keeps its most allocated bytes, the event and the components there: an
    # alloc that beats the interval's most is its new most (and only such an alloc can be the
    # peak), and the components there are copied once the next free ends the climb (or at the
    # interval's end), so a climb of many allocs costs one copy. An interval opening with an event
    # that leaves allocated as it was starts at the state before it.
    interval_most, most_index, most_totals = -1, 0, None
    climbing = False  # the interval's most was just set by an alloc: its components not copied yet
    if count and actions[0] != ALLOC:
        climbing = actions[0] == FREE_REQUESTED
        if not climbing:
            interval_most, most_totals = 0, tuple(totals)
    # The events in chunks that end at a span boundary or a sample: the checks for those run
    # once a chunk, not once an event.
    events = zip(range(count), actions, trace.addrs, trace.sizes)
    position = 0
    while position < count:
        if position == next_boundary:
            index = position
            span_position += 1
            span = spans[span_position]
            phase = span.phase
            phase_component = phase_components.get(phase, component_count - 1)
            next_boundary = spans[span_position + 1].first_index if span_position + 1 < len(spans) else count
            if span.step != step:
                stats.last_index = index - 1
                stats.end_allocated_bytes = allocated
                stats.peak_allocated_bytes = stats_peak
                stats.peak_activation_bytes = stats_activation_peak
                step = span.step
                stats = steps.get(step) or steps.setdefault(step, StepStats(index, index, allocated, allocated, 0))
                stats_peak = stats.peak_allocated_bytes
                stats_activation_peak = stats.peak_activation_bytes
        stop = min(next_boundary if next_boundary > position else count, next_sample + 1, next_copy + 1, count)
        for index, action, addr, size in islice(events, stop - position):
            if action == ALLOC:
                if size > small:
                    large(index)
                if index == next_survivor:  # live at the dump: its exact bytes there
                    block_size = survivors[index]
                    survivor_position += 1
                    next_survivor = survivor_order[survivor_position] if survivor_position < len(survivor_order) else -1
                else:
                    rounded = rounded_cache.get(size)
                    if rounded is None:
                        rounded = rounded_cache[size] = round_size(size, divisions)
                    block_size = rounded
                component = phase_component
                if own_components:
                    component = own_components.get(index, component)
                if registered:
                    known = registered.get(addr)
                    if known is not None and known[2] == size:
                        component = known[0]
                live[addr] = (index, component, block_size, size)
                allocated += block_size
                totals[component] += block_size
                if allocated > interval_most:  # the peak is at least the interval's most
                    interval_most = allocated
                    most_index = index
                    climbing = True
                    if allocated > peak_value:
                        peak_value = allocated
                        peak_index = index
                if allocated > stats_peak:
                    stats_peak = allocated
                if component == activation_component and totals[component] > stats_activation_peak:
                    stats_activation_peak = totals[component]
            elif action == FREE_REQUESTED:
                if size > small:
                    large(index)
                entry = live.pop(addr, None)
                if entry is None:
                    block_size = round_size(size, divisions)
                    entry = (-1, component_of_pre_existing(addr, block_size), block_size, size)
                    pre_existing_frees.append((index, addr, block_size))
                _, freed_component, freed_bytes, _ = entry
                if climbing:
                    climbing = False
                    if interval_most >= 0:  # the state just before this free is the interval's most
                        most_totals = tuple(totals)
                    else:  # the interval opens with this free: its most is right after it, so far
                        interval_most = allocated - freed_bytes
                        opening = totals[:]
                        opening[freed_component] -= freed_bytes
                        most_totals = tuple(opening)
                allocated -= freed_bytes
                totals[freed_component] -= freed_bytes
                pending[addr] = freed_bytes
            elif action == FREE_COMPLETED:
                if pending.pop(addr, None) is None and addr not in live:
                    completed_only += 1  # its free was requested before the trace: so was its allocation
            elif action == SEGMENT_ALLOC or action == SEGMENT_MAP:
                reserved += size
                segment_event(index)
            elif action == SEGMENT_FREE or action == SEGMENT_UNMAP:
                reserved -= size
                segment_event(index)
            elif action == OOM:
                oom_indices.append(index)
                copies.append((index, dict(live), dict(pending)))
        position = stop
        if index == next_copy:
            next_copy += copy_every
            if _copy_fits(index, last_copy, live, pending) and not (copies and copies[-1][0] == index):
                copies.append((index, dict(live), dict(pending)))
                last_copy = index
        if index == next_sample:
            now = tuple(totals)
            mosts.append((most_index, interval_most, now if climbing or most_totals is None else most_totals))
            samples.append((index, times[index] if times is not None else None, allocated, reserved, now))
            next_sample += stride
            # the next interval's most: set by its first event if that is an alloc or a free
            # (`climbing` tells the free so), else the state now, which that event leaves as it is
            following = actions[index + 1] if index < last else None
            climbing = following == FREE_REQUESTED
            if following == ALLOC or climbing:
                interval_most, most_index, most_totals = -1, index + 1, None
            else:
                interval_most, most_index, most_totals = allocated, index + 1, now
    if count and samples[-1][0] != count - 1:  # the last interval ends at the last event, a sample of its own
        now = tuple(totals)
        mosts.append((most_index, interval_most, now if climbing or most_totals is None else most_totals))
        samples.append((count - 1, times[count - 1] if times is not None else None, allocated, reserved, now))
    stats.last_index = max(count - 1, 0)
    stats.end_allocated_bytes = allocated
    stats.peak_allocated_bytes = stats_peak
    stats.peak_activation_bytes = stats_activation_peak

    final_allocated = sum(b.size for b in final_blocks.values())
    final_reserved = sum(s.total_size for s in segments)
    allocated_offset = final_allocated - allocated
    reserved_offset = final_reserved - reserved

    # Per-component offsets: what each component held before the trace began.
    final_totals = [0] * component_count
    for address, block in final_blocks.items():
        entry = live.get(address)
        component = entry[1] if entry is not None else component_of_pre_existing(address, block.size)
        final_totals[component] += block.size
    component_offsets = [final_totals[c] - totals[c] for c in range(component_count)]

    def offset(comps: tuple[int, ...]) -> tuple[int, ...]:
        return tuple([v + o if v + o > 0 else 0 for v, o in zip(comps, component_offsets)])

    series = [
        SeriesPoint(
            event_index=i,
            time_us=t,
            allocated_bytes=a + allocated_offset,
            reserved_bytes=r + reserved_offset,
            components=offset(comps),
        )
        for i, t, a, r, comps in samples
    ]
    series_peaks = [
        SeriesPeak(event_index=i, allocated_bytes=a + allocated_offset, components=offset(comps))
        for i, a, comps in mosts
    ]
    for one in steps.values():
        one.peak_allocated_bytes += allocated_offset
        one.end_allocated_bytes += allocated_offset
        one.peak_activation_bytes += max(0, component_offsets[activation_component])
    return ReplayState(
        event_count=count,
        series=series,
        series_peaks=series_peaks,
        peak_index=peak_index,
        peak_allocated_bytes=(peak_value + allocated_offset) if peak_index is not None else final_allocated,
        oom_indices=oom_indices,
        history=LiveHistory(trace, final_blocks, divisions, copies, live, pre_existing_frees, rounded_cache),
        pre_existing_completions=completed_only,
        steps=steps,
        allocated_offset_bytes=allocated_offset,
        has_frames=trace.any_frames,
        has_time=times is not None,
        large_events=large_events,
        segment_events=segment_events,
    )


def unsized_remainders(
    trace: DeviceTrace,
    history: LiveHistory,
    peak_index: int | None,
    remainder_at_most: Callable[[int], int],
    divisions: tuple[tuple[int, int], ...] = (),
    large_events: Sequence[int] | None = None,
) -> tuple[int, int] | None:
    """(bytes, blocks): how much more than the peak torch's own allocated bytes (what
    `torch.cuda.max_memory_allocated` tracks) may have reached over the trace's events, and how many
    blocks could hold an unsized remainder when that much could; None without a peak.

    The peak (docs/definitions.md) counts a block the dump no longer holds at round_size of its
    request, which is less than the block when the allocator left an unsplit remainder in it
    (spec §4.3); `remainder_at_most` gives the most that can be for a block of given bytes
    (`allocator_rules.unsplit_remainder_at_most`): nothing in the small pool, so only requests over
    SMALL_REQUEST_BYTES are walked (the large pool's segments hold no others: a block's neighbour
    in its segment is one of them). A block has none when another block began right where its
    counted bytes end while it was live (a remainder would have been in its way; one walk counts a
    block until such a neighbour shows, which can only make the bound larger), and blocks live at
    the dump have their exact size there. torch's allocated bytes after any event are at most the
    peak's rule's there (at most the peak) plus the most the blocks live then may hold: the largest
    of those sums over the events bounds what the file leaves unsized. (Adding it to each event's
    own allocated bytes, and pinning a block for its whole life, would be tighter, at the cost of
    more walks over the events: the analysis' time is kept for the peak's own walk.) `large_events`:
    the alloc and free_requested events over SMALL_REQUEST_BYTES (`ReplayState.large_events`), found
    here when not given."""
    if peak_index is None:
        return None
    final = history.final_blocks
    exact = {entry[0] for address, entry in history.live_at_end.items() if address in final}
    actions, addrs, sizes = trace.actions, trace.addrs, trace.sizes
    large = (
        list(compress(range(len(sizes)), map(SMALL_REQUEST_BYTES.__lt__, sizes)))
        if large_events is None
        else large_events
    )
    cap_of: dict[int, tuple[int, int]] = {}  # request -> (its counted bytes, the most its remainder can be)
    # the live blocks by start: (counted end, the most their remainder can be); and their starts by end
    live: dict[int, tuple[int, int]] = {}
    by_end: dict[int, int] = {}
    unsized = unsized_blocks = 0
    for address, kept in final.items():
        if address not in history.live_at_end:  # from before the trace, never freed: exact
            live[address] = (address + kept.size, 0)
            by_end[address + kept.size] = address
    for _, address, size in history.pre_existing_frees:
        live[address] = (address + size, remainder_at_most(size) if size > SMALL_REQUEST_BYTES else 0)
        by_end[address + size] = address
    for address, (end, most) in list(live.items()):  # a neighbour right at its end: no remainder
        if most and end in live:
            live[address] = (end, 0)
    for _, most in live.values():
        if most:
            unsized += most
            unsized_blocks += 1
    best_value, best_blocks = unsized, unsized_blocks
    # One walk over the large pool's events (SMALL_REQUEST_BYTES: the small pool leaves no
    # remainder, and a large segment holds only large blocks). A block counts as possibly holding
    # a remainder until a block is seen live right at its counted end: from then on it has none
    # (counting it until then can only make the bound larger, never wrong).
    for index, action, addr, size in zip(
        large, map(actions.__getitem__, large), map(addrs.__getitem__, large), map(sizes.__getitem__, large)
    ):
        if action == ALLOC:
            if index in exact:
                end, most = addr + final[addr].size, 0
            else:
                known = cap_of.get(size)
                if known is None:
                    rounded = round_size(size, divisions)
                    known = cap_of[size] = (rounded, remainder_at_most(rounded))
                end, most = addr + known[0], known[1]
            before = by_end.get(addr)
            if before is not None:  # the block ending here has no remainder
                held = live.get(before)
                if held is not None and held[1]:
                    live[before] = (held[0], 0)
                    unsized -= held[1]
                    unsized_blocks -= 1
            if most and end in live:
                most = 0
            old = live.get(addr)
            if old is not None:
                by_end.pop(old[0], None)
            live[addr] = (end, most)
            by_end[end] = addr
            if most:
                unsized += most
                unsized_blocks += 1
                if unsized > best_value:
                    best_value, best_blocks = unsized, unsized_blocks
        elif action == FREE_REQUESTED:
            held = live.pop(addr, None)
            if held is not None:
                if by_end.get(held[0]) == addr:
                    del by_end[held[0]]
                if held[1]:
                    unsized -= held[1]
                    unsized_blocks -= 1
    return best_value, best_blocks


def _frees_cache(stack: Stack) -> bool:
    """A stack of `torch.cuda.empty_cache()` (or of no frames): a flush the user asked for."""
    return not stack or any(frame.name == "empty_cache" for frame in stack)


_SEGMENT_ACTIONS = frozenset({SEGMENT_ALLOC, SEGMENT_MAP, SEGMENT_FREE, SEGMENT_UNMAP})


def _segment_events(actions: Sequence[str]) -> list[int]:
    """The indices of the segment events among `actions`, in order."""
    return list(compress(range(len(actions)), map(_SEGMENT_ACTIONS.__contains__, actions)))


def near_ooms(
    trace: DeviceTrace, segments: Sequence[Segment], segment_events: Sequence[int] | None = None
) -> tuple[NearOom, ...]:
    """The cudaMalloc failures the allocator survived: when a segment cannot be had, torch frees
    its cached segments (the `segment_free` events carry the stack of the allocation waiting) and
    tries again; a `segment_alloc` with that same stack right after the run is the retry.
    `segment_events`: the trace's segment events (`ReplayState.segment_events`), found here when
    not given."""
    actions, sizes = trace.actions, trace.sizes
    events = _segment_events(actions) if segment_events is None else segment_events
    if not events:
        return ()
    grows = (SEGMENT_ALLOC, SEGMENT_MAP)
    traced = sum(sizes[i] if actions[i] in grows else -sizes[i] for i in events)
    reserved = sum(s.total_size for s in segments) - traced  # reserved before the first event
    found: list[NearOom] = []
    position = 0
    while position < len(events):
        index = events[position]
        if actions[index] in grows:
            reserved += sizes[index]
            position += 1
            continue
        stack = trace.frames_at(index)
        before, flushed = reserved, 0
        run_end = index
        while position < len(events) and events[position] == run_end and actions[run_end] not in grows:
            if trace.frames_at(run_end) != stack:
                break
            flushed += sizes[run_end]
            reserved -= sizes[run_end]
            position += 1
            run_end += 1
        if (
            not _frees_cache(stack)
            and position < len(events)
            and events[position] == run_end
            and actions[run_end] in grows
            and trace.frames_at(run_end) == stack
        ):
            found.append(NearOom(run_end, sizes[run_end], flushed, before))
    return tuple(found)


def survivor_sizes(
    trace: DeviceTrace, final_blocks: Mapping[int, Block], divisions: tuple[tuple[int, int], ...] = ()
) -> dict[int, int]:
    """alloc event index -> the dump's exact block bytes, for each allocation of the trace still
    live at the end whose block is not round_size(request) (an unsplit remainder, say): the trace's
    last event at the block's address is its alloc. Other blocks the walk counts at round_size,
    which is then their size."""
    differing = {a: b.size for a, b in final_blocks.items() if b.size != round_size(b.requested_size, divisions)}
    if not differing:
        return {}
    addrs, actions = trace.addrs, trace.actions
    found = {}
    left = set(differing)  # addresses whose last event is still to be met, walking back
    # the events at those addresses, latest first (the rest skipped in C)
    for index in compress(range(len(addrs) - 1, -1, -1), map(differing.__contains__, reversed(addrs))):
        address = addrs[index]
        if address in left:
            left.discard(address)
            if actions[index] == ALLOC:
                found[index] = differing[address]
            if not left:
                break
    return found


def last_occupants(
    trace: DeviceTrace,
    holes: Sequence[tuple[int, int]],
    before: int,
    limit: int = MAX_OCCUPANT_WALK,
    divisions: tuple[tuple[int, int], ...] = (),
) -> tuple[tuple[tuple[int, int | None], ...], ...]:
    """What last held each free block (address, bytes) at event `before`: its pieces, each with the
    index of the alloc event of the allocation freed last there (None: the trace does not show one,
    within its last `limit` events before `before`: the piece was free since before the trace, or
    never held, as the rest of a segment cut for a smaller request, or held as the unsplit remainder
    of a block, beyond the rounded request its free event shows). Walking back, the latest free
    that covers a byte of a block is its last occupant's; that allocation's alloc event is the one
    at the same address before it. The blocks must not overlap."""
    order = sorted(range(len(holes)), key=lambda h: holes[h][0])
    starts = [holes[h][0] for h in order]
    ends = [holes[h][0] + holes[h][1] for h in order]  # sorted too: the blocks do not overlap
    uncovered = [[[start, end]] if end > start else [] for start, end in zip(starts, ends)]
    open_holes = sum(1 for ranges in uncovered if ranges)
    pieces: list[list[tuple[int, int | None]]] = [[] for _ in order]
    waiting: dict[int, list[tuple[int, int]]] = {}  # address freed -> (block position, bytes) awaiting its alloc
    addrs, sizes, actions = trace.addrs, trace.sizes, trace.actions
    for index in range(min(before, len(actions)) - 1, max(0, before - limit) - 1, -1):
        if not open_holes and not waiting:
            break
        action = actions[index]
        address = addrs[index]
        if action == ALLOC:
            for position, nbytes in waiting.pop(address, ()):
                pieces[position].append((nbytes, index))
        elif open_holes and action in (FREE_COMPLETED, FREE_REQUESTED, SEGMENT_ALLOC, SEGMENT_MAP):
            # a free: its allocation held what it covers; a segment made: what no free covered since
            # was never held in it (an earlier segment at the same address is another story)
            freed = action in (FREE_COMPLETED, FREE_REQUESTED)
            end = address + (round_size(sizes[index], divisions) if freed else sizes[index])
            position = bisect.bisect_left(starts, end) - 1  # the last block starting below `end`
            while position >= 0 and ends[position] > address:
                ranges = uncovered[position]
                covered = sum(min(e, end) - max(s, address) for s, e in ranges if s < end and address < e)
                if covered > 0:
                    uncovered[position] = _subtract_range(ranges, address, end)
                    if freed:
                        waiting.setdefault(address, []).append((position, covered))
                    else:
                        pieces[position].append((covered, None))
                    open_holes -= not uncovered[position]
                position -= 1
    for pending in waiting.values():
        for position, nbytes in pending:
            pieces[position].append((nbytes, None))
    found: list[tuple[tuple[int, int | None], ...]] = [()] * len(holes)
    for position, h in enumerate(order):
        left = sum(e - s for s, e in uncovered[position])
        found[h] = (*pieces[position], *(((left, None),) if left else ()))
    return tuple(found)


def ring_buffer_wrapped(event_count: int, max_entries: int | None) -> bool:
    """Whether the recording's ring buffer wrapped, losing the oldest events: the trace holds as
    many events as the buffer keeps, when the recording says how many (`max_entries`); otherwise a
    guess from a round count (10^k or 2^k events, the sizes people pass)."""
    if max_entries is not None:
        return event_count >= max_entries > 0
    return event_count in _ROUND_RING_SIZES


def ooms_of(
    trace: DeviceTrace, oom_indices: Sequence[int], fatal_index: int | None, large_segment: int = LARGE_SEGMENT_BYTES
) -> tuple[OomEvent, ...]:
    found = []
    for index in oom_indices:
        size = trace.sizes[index]
        found.append(
            OomEvent(
                event_index=index,
                request_bytes=size,
                message_bytes=segment_size(size, large_segment),
                device_free_bytes=trace.device_free.get(index),
                time_us=trace.times_us[index] if trace.times_us is not None else None,
                fatal=index == fatal_index,
            )
        )
    return tuple(found)


# What the segment events after a moment undo: fixed segments by address, and the byte ranges
# mapped into expandable segments (kept as intervals; the segments are rebuilt from them).
_SegmentState = tuple[dict[int, Segment], list[list[int]]]


def _segment_state(segments: Sequence[Segment]) -> _SegmentState:
    return {s.address: s for s in segments}, [
        [s.address, s.address + s.total_size] for s in segments if s.is_expandable
    ]


def _undo_segment_event(state: _SegmentState, event: TraceEvent, device: int) -> _SegmentState:
    by_address, mapped = state
    if event.action == SEGMENT_ALLOC:
        by_address.pop(event.addr, None)
    elif event.action == SEGMENT_FREE:
        by_address[event.addr] = Segment(
            device=device,
            address=event.addr,
            total_size=event.size,
            stream=event.stream,
            segment_type="small" if event.size == SMALL_SEGMENT_BYTES else "large",
            blocks=(Block(event.addr, event.size, 0, INACTIVE),),
            pool_id=event.pool_id or (0, 0),
        )
    elif event.action == SEGMENT_MAP:
        mapped = _subtract_range(mapped, event.addr, event.addr + event.size)
    elif event.action == SEGMENT_UNMAP:
        mapped.append([event.addr, event.addr + event.size])
    return by_address, mapped


def _segments_of(state: _SegmentState, segments: Sequence[Segment]) -> list[Segment]:
    by_address, mapped = state
    template = next((s for s in segments if s.is_expandable), None)
    fixed = [s for s in by_address.values() if not s.is_expandable]
    for start, end in _merge_ranges(mapped):
        fixed.append(
            Segment(
                device=template.device if template else (segments[0].device if segments else 0),
                address=start,
                total_size=end - start,
                stream=template.stream if template else 0,
                segment_type=template.segment_type if template else "large",
                blocks=(Block(start, end - start, 0, INACTIVE),),
                pool_id=template.pool_id if template else (0, 0),
                is_expandable=True,
            )
        )
    fixed.sort(key=lambda s: s.address)
    return fixed


def segments_at(trace: DeviceTrace, segments: Sequence[Segment], target_index: int) -> tuple[list[Segment], bool]:
    """The segments just after `target_index`, walking the segment events after it backwards."""
    actions = trace.actions
    later = [i for i in range(target_index + 1, len(trace)) if actions[i] in _SEGMENT_ACTIONS]
    if not later:
        return list(segments), True
    state = _segment_state(segments)
    device = segments[0].device if segments else 0
    for index in reversed(later):
        state = _undo_segment_event(state, trace[index], device)
    return _segments_of(state, segments), False


class SegmentHistory:
    """The segments just after any event, for a cursor: `segments_at` from copies of the segment
    state kept on one walk back from the dump, so a move undoes at most a few dozen segment events
    (or twice as many as there are segments then, when that is more) instead of every one after it."""

    def __init__(self, trace: DeviceTrace, segments: Sequence[Segment], every: int = CURSOR_COPY_SEGMENT_EVENTS):
        self.trace = trace
        self.segments = tuple(segments)
        actions = trace.actions
        self.indices = _segment_events(actions)
        self._device = segments[0].device if segments else 0
        # position p -> the state with the segment events at positions p and on undone
        state = _segment_state(segments)
        self._copies: list[tuple[int, _SegmentState]] = [(len(self.indices), _copy_state(state))]
        since = 0
        for position in range(len(self.indices) - 1, -1, -1):
            state = _undo_segment_event(state, trace[self.indices[position]], self._device)
            since += 1
            if since >= max(every, 2 * len(state[0])):
                self._copies.append((position, _copy_state(state)))
                since = 0
        self._copies.reverse()
        self._copy_positions = [position for position, _ in self._copies]

    def at(self, target_index: int) -> tuple[list[Segment], bool]:
        """(segments, exact) just after `target_index`; exact: the dump's own, nothing undone."""
        first_later = bisect.bisect_right(self.indices, target_index)
        if first_later == len(self.indices):
            return list(self.segments), True
        position, kept = self._copies[bisect.bisect_left(self._copy_positions, first_later)]
        state = _copy_state(kept)
        for undone in range(position - 1, first_later - 1, -1):
            state = _undo_segment_event(state, self.trace[self.indices[undone]], self._device)
        return _segments_of(state, self.segments), False


def _copy_state(state: _SegmentState) -> _SegmentState:
    return dict(state[0]), [list(r) for r in state[1]]


def _subtract_range(ranges: list[list[int]], start: int, end: int) -> list[list[int]]:
    result = []
    for r_start, r_end in ranges:
        if r_end <= start or r_start >= end:
            result.append([r_start, r_end])
            continue
        if r_start < start:
            result.append([r_start, start])
        if r_end > end:
            result.append([end, r_end])
    return result


def _merge_ranges(ranges: list[list[int]]) -> list[tuple[int, int]]:
    merged: list[list[int]] = []
    for start, end in sorted(ranges):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def lay_out(segments: Sequence[Segment], live: Iterable[LiveAllocation], pending: dict[int, int]) -> list[Segment]:
    """Rebuild each segment's blocks from the live and pending allocations; gaps are free blocks.

    A free gap of at most 1 MiB right after a block in a large, non-expandable segment is that
    block's unsplit remainder: the allocator splits large blocks only when more than 1 MiB is left
    (spec §4.3), so no free block there can be that small.
    """
    starts = [s.address for s in segments]
    contents: dict[int, list[tuple[int, int, int, str]]] = {s.address: [] for s in segments}
    for address, _, size, requested in live:  # LiveAllocation's fields
        position = bisect.bisect_right(starts, address) - 1
        if position >= 0 and address < starts[position] + segments[position].total_size:
            contents[starts[position]].append((address, size, requested, ACTIVE_ALLOCATED))
    for address, size in pending.items():
        position = bisect.bisect_right(starts, address) - 1
        if position >= 0 and address < starts[position] + segments[position].total_size:
            contents[starts[position]].append((address, size, 0, ACTIVE_PENDING_FREE))
    result = []
    for segment in segments:
        end = segment.address + segment.total_size
        items = sorted(contents[segment.address])
        blocks: list[Block] = []
        cursor = segment.address
        for position, (address, size, requested, state) in enumerate(items):
            if address > cursor:
                blocks.append(Block(cursor, address - cursor, 0, INACTIVE))
            next_start = items[position + 1][0] if position + 1 < len(items) else end
            size = min(size, next_start - address)
            gap = next_start - address - size
            absorbs = segment.segment_type == "large" and not segment.is_expandable and size > SMALL_REQUEST_BYTES
            if 0 < gap <= SMALL_REQUEST_BYTES and absorbs:
                size += gap
            blocks.append(Block(address, size, requested, state))
            cursor = address + size
        if cursor < end:
            blocks.append(Block(cursor, end - cursor, 0, INACTIVE))
        result.append(
            Segment(
                device=segment.device,
                address=segment.address,
                total_size=segment.total_size,
                stream=segment.stream,
                segment_type=segment.segment_type,
                blocks=tuple(blocks),
                pool_id=segment.pool_id,
                is_expandable=segment.is_expandable,
                frames=segment.frames,
            )
        )
    return result


def event_state(
    event_index: int, layout: Sequence[Segment], live: Mapping[int, LiveAllocation], exact: bool
) -> EventState:
    """The state right after an event, from its segment layout and the live set laid out in it:
    the allocations the layout placed, in `live`'s order, each with its own bytes by the one rule
    (docs/definitions.md, "The peak"). `allocated_bytes` is the layout's: the blocks as it placed
    them, with the unsplit remainders it gives large blocks."""
    allocated = active = reserved = 0
    placed: set[int] = set()
    for segment in layout:
        reserved += segment.total_size
        for block in segment.blocks:
            if block.state == ACTIVE_ALLOCATED:
                allocated += block.size
                active += block.size
                placed.add(block.address)
            elif block.state == ACTIVE_PENDING_FREE:
                active += block.size
    rows = [allocation for address, allocation in live.items() if address in placed]
    return EventState(
        event_index=event_index,
        allocated_bytes=allocated,
        active_bytes=active,
        reserved_bytes=reserved,
        live=tuple(rows),
        segments=tuple(layout),
        exact=exact,
        counted_bytes=sum([allocation.size_bytes for allocation in live.values()]),
    )
