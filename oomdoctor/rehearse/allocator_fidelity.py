"""Replay a real allocator trace through the simulator and measure how closely it agrees with torch.

A device trace qualifies for replay when its history starts from an empty allocator:

* it holds at least one `alloc`;
* the first event that touches an address is a `segment_alloc` or `segment_map` (so the ring buffer
  did not wrap and recording started before the first cudaMalloc);
* every `alloc`/`free_*` address lies inside a segment (or mapped range) created earlier in the
  trace and not yet released;
* every segment left at the end (the snapshot's `segments` for that device) lies inside ranges the
  trace created.

Replay feeds the simulator the same request sizes (an `alloc`'s `size` is the un-rounded request),
in the same order, on the same streams, with the allocator settings the snapshot records. Real
traces do not show the GPU's size: the capacity is effectively unlimited, except for a trace with an
`oom`, where it is the reserved bytes after that flush plus the `device_free` the event reports,
and the failing request (the event's rounded size) is replayed as a malloc that must fail.

A run of `segment_free`/`segment_unmap` is either the allocator's own flush inside a malloc (the
run is then followed only by new segments and that `alloc`, or by the `oom`) or an explicit
`torch.cuda.empty_cache()`. The trace does not say which; the simulator does: when the malloc
that follows could not be served without releasing memory (`would_flush`), the run is left for
the simulator to reproduce, otherwise it is replayed as an empty_cache() call. With unlimited
capacity that is always the latter, which releases exactly the same blocks in the same order.

A trace that is not whole can still have a whole history for one pool (say, it began after the
first small segment existed): with unlimited capacity the small and large pools never interact, so
that pool's events are replayed on their own (`scope` says which).

Agreement is measured on the sequence of segment sizes created (`segment_alloc`/`segment_map`,
compared in order with difflib, so one extra segment costs one event, not the rest of the trace) and
on the final layout: per segment, the sequence of (size, state, requested_size) of its blocks
(requested_size even where it is stale, on inactive blocks), with addresses relabelled: segments
are matched as a multiset; unmatched ones are paired in address order and compared block by block.

This module is pure: it reads snapshots as the project's model (`oomdoctor.model.Snapshot`, what
`oomdoctor.load.load` returns) and returns result objects. The simulator's own snapshot, a dict in
torch's shape, is read back through the same loader (`as_snapshot`), so both sides of a comparison
are read by one reader.
"""

from __future__ import annotations

import pickle
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from difflib import SequenceMatcher
from typing import Any

from oomdoctor.allocator_rules import SMALL_REQUEST_BYTES, SMALL_SEGMENT_BYTES, AllocatorConfig, parse_alloc_conf
from oomdoctor.load import load
from oomdoctor.model import DeviceTrace, Segment, Snapshot
from oomdoctor.rehearse.allocator import AddressSpace, CachingAllocatorSimulator, SimulatedOutOfMemory

UNLIMITED_CAPACITY_BYTES = 1 << 40  # 1 TiB: larger than any device in the corpus
SEGMENT_CREATE_ACTIONS = ("segment_alloc", "segment_map")
SEGMENT_RELEASE_ACTIONS = ("segment_free", "segment_unmap")
ADDRESS_ACTIONS = ("alloc", "free_requested", "free_completed") + SEGMENT_CREATE_ACTIONS + SEGMENT_RELEASE_ACTIONS


@dataclass(frozen=True)
class Event:
    action: str
    addr: int
    size: int
    stream: int
    device_free: int | None = None


@dataclass(frozen=True)
class FinalSegment:
    address: int
    total_size: int
    stream: int
    segment_type: str
    is_expandable: bool
    blocks: tuple[tuple[int, str, int], ...]  # (size, state, requested_size) in address order


@dataclass
class DeviceReplay:
    device: int
    qualifies: bool
    reason: str  # why it does not qualify, or "" when it does
    scope: str = "all pools"  # or "large pool" / "small pool" when only that pool's history is whole
    segment_events_matched: int = 0
    segment_events_total: int = 0
    release_events_matched: int = 0
    release_events_total: int = 0
    blocks_matched: int = 0
    blocks_total: int = 0
    simulated_retries: int = 0  # flush-and-retry the simulator performed on its own
    simulated_ooms: int = 0
    real_ooms: int = 0
    real_segment_sizes: list[tuple[str, int]] = field(default_factory=list)
    simulated_segment_sizes: list[tuple[str, int]] = field(default_factory=list)
    mismatches: list[str] = field(default_factory=list)


def as_snapshot(raw_snapshot: dict[str, Any]) -> Snapshot:
    """A snapshot in torch's shape (the simulator's `snapshot()`) read by the project's loader."""
    return load(pickle.dumps(raw_snapshot, protocol=pickle.HIGHEST_PROTOCOL))


def events_of(trace: DeviceTrace) -> list[Event]:
    device_free = trace.device_free
    return [
        Event(action, addr, size, stream, device_free.get(index))
        for index, (action, addr, size, stream) in enumerate(
            zip(trace.actions, trace.addrs, trace.sizes, trace.streams)
        )
    ]


def final_segments_of(segments: Iterable[Segment], device: int) -> list[FinalSegment]:
    result = [
        FinalSegment(
            address=segment.address,
            total_size=segment.total_size,
            stream=segment.stream,
            segment_type=segment.segment_type,
            is_expandable=segment.is_expandable,
            blocks=tuple((block.size, block.state, block.requested_size) for block in segment.blocks),
        )
        for segment in segments
        if segment.device == device
    ]
    return sorted(result, key=lambda segment: segment.address)


class _Ranges:
    """Live address ranges; enough for membership tests over a few thousand segments."""

    def __init__(self) -> None:
        self.ranges: dict[int, int] = {}

    def add(self, address: int, size: int) -> None:
        # adjacent mapped ranges of an expandable segment form one segment in the snapshot
        following = self.ranges.pop(address + size, None)
        if following is not None:
            size += following
        for start, length in self.ranges.items():
            if start + length == address:
                self.ranges[start] = length + size
                return
        self.ranges[address] = size

    def remove(self, address: int, size: int) -> None:
        # an unmap may cut the middle out of a mapped range: split it around the hole
        for start, length in list(self.ranges.items()):
            end = start + length
            if start <= address and address + size <= end:
                del self.ranges[start]
                if address > start:
                    self.ranges[start] = address - start
                if address + size < end:
                    self.ranges[address + size] = end - address - size
                return

    def contains(self, address: int, size: int = 1) -> bool:
        return any(start <= address and address + size <= start + length for start, length in self.ranges.items())


def qualification(events: list[Event], final: list[FinalSegment]) -> str:
    """ "" when the trace starts from an empty allocator; otherwise the reason it does not."""
    if not any(event.action == "alloc" for event in events):
        return "no alloc events"
    first = next((event for event in events if event.action in ADDRESS_ACTIONS), None)
    if first is None or first.action not in SEGMENT_CREATE_ACTIONS:
        return f"history starts mid-run (first event touching memory is {first.action if first else 'none'})"
    live = _Ranges()
    for index, event in enumerate(events):
        if event.action in SEGMENT_CREATE_ACTIONS:
            live.add(event.addr, event.size)
        elif event.action in SEGMENT_RELEASE_ACTIONS:
            live.remove(event.addr, event.size)
        elif event.action in ("alloc", "free_requested", "free_completed"):
            if not live.contains(event.addr):
                return f"event {index} ({event.action}) touches memory no traced segment holds"
    for segment in final:
        if not live.contains(segment.address, segment.total_size):
            return f"final segment {segment.address:#x} was not created in the trace"
    return ""


class TracedAddressSpace(AddressSpace):
    """Hands the simulator the address torch's driver gave the same segment, in trace order.

    When the simulator asks for a segment of the size the trace's next `segment_alloc` has, it gets
    that segment's real address (unless a live segment holds it); otherwise it falls back to first
    fit in a range far from the traced addresses.
    """

    def __init__(self, events: list[Event]) -> None:
        super().__init__(1 << 52)
        self._traced = [(e.addr, e.size) for e in events if e.action == "segment_alloc"]
        self._position = 0
        self._live: dict[int, int] = {}

    def take(self, size: int) -> int:
        address = None
        if self._position < len(self._traced) and self._traced[self._position][1] == size:
            candidate = self._traced[self._position][0]
            overlaps = any(start < candidate + size and candidate < start + n for start, n in self._live.items())
            if not overlaps:
                address = candidate
            self._position += 1
        if address is None:
            address = super().take(size)
        self._live[address] = size
        return address

    def give_back(self, address: int, size: int) -> None:
        self._live.pop(address, None)
        if address >= 1 << 52:
            super().give_back(address, size)


def _oom_capacity(events: list[Event]) -> int:
    reserved = 0
    for event in events:
        if event.action in SEGMENT_CREATE_ACTIONS:
            reserved += event.size
        elif event.action in SEGMENT_RELEASE_ACTIONS:
            reserved -= event.size
        elif event.action == "oom":
            return reserved + (event.device_free or 0)
    return UNLIMITED_CAPACITY_BYTES


def _release_runs(events: list[Event]) -> dict[int, tuple[list[int], Event | None]]:
    """Runs of segment releases: first index -> (indices, the alloc or oom that ends the run).

    The run ends in an event when only new segments come between the releases and that `alloc` or
    `oom`, which is what a flush-and-retry inside that malloc looks like.
    """
    runs: dict[int, tuple[list[int], Event | None]] = {}
    index = 0
    while index < len(events):
        if events[index].action not in SEGMENT_RELEASE_ACTIONS:
            index += 1
            continue
        members = []
        while index < len(events) and events[index].action in SEGMENT_RELEASE_ACTIONS + ("snapshot",):
            if events[index].action != "snapshot":
                members.append(index)
            index += 1
        following = index
        while following < len(events) and events[following].action in SEGMENT_CREATE_ACTIONS + ("snapshot",):
            following += 1
        ending = events[following] if following < len(events) else None
        if ending is not None and ending.action not in ("alloc", "oom"):
            ending = None
        if ending is not None and ending.action == "alloc" and following == index:
            ending = None  # releases right before an alloc that needed no new segment: empty_cache
        runs[members[0]] = (members, ending)
    return runs


def _sequence_agreement(real: list, simulated: list) -> int:
    matcher = SequenceMatcher(None, real, simulated, autojunk=False)
    return sum(block.size for block in matcher.get_matching_blocks())


def _layout_agreement(
    real: list[FinalSegment], simulated: list[FinalSegment], mismatches: list[str]
) -> tuple[int, int]:
    def key(segment: FinalSegment) -> tuple:
        return (segment.segment_type, segment.is_expandable, segment.blocks)

    exact = Counter(key(segment) for segment in real) & Counter(key(segment) for segment in simulated)
    matched = sum(len(segment_key[2]) * count for segment_key, count in exact.items())
    unclaimed = exact.copy()
    real_rest = [segment for segment in real if not _consume(unclaimed, key(segment))]
    unclaimed = exact.copy()
    simulated_rest = [segment for segment in simulated if not _consume(unclaimed, key(segment))]
    for real_segment, simulated_segment in zip(real_rest, simulated_rest):
        matched += _sequence_agreement(list(real_segment.blocks), list(simulated_segment.blocks))
    if real_rest or simulated_rest:
        mismatches.append(
            f"final layout: {len(real_rest)} real and {len(simulated_rest)} simulated segments without an exact twin"
        )
    total = max(sum(len(s.blocks) for s in real), sum(len(s.blocks) for s in simulated))
    return matched, total


def _consume(counter: Counter, key: tuple) -> bool:
    if counter.get(key, 0) > 0:
        counter[key] -= 1
        return True
    return False


def _pool_events(events: list[Event], pool: str, config: AllocatorConfig) -> list[Event]:
    """The events of one pool: small segments are exactly 2 MiB, and an alloc or free belongs to
    the small pool when its size (the request; a free carries the block's request) rounds to at
    most 1 MiB."""
    small = pool == "small"
    kept = []
    for event in events:
        if event.action in ("segment_alloc", "segment_free"):
            if (event.size == SMALL_SEGMENT_BYTES) == small:
                kept.append(event)
        elif event.action in ("alloc", "free_requested", "free_completed"):
            if (config.round_size(event.size) <= SMALL_REQUEST_BYTES) == small:
                kept.append(event)
        elif event.action == "snapshot":
            kept.append(event)
    return kept


def replay_device(snapshot: Snapshot, device: int, traced_addresses: bool = True) -> list[DeviceReplay]:
    """Replay one device's trace; when it is not whole, each pool whose own history is whole.

    Pools are independent as long as the capacity is unlimited (no flush, no garbage collection):
    a trace that began after a small segment existed still replays its large pool exactly.
    """
    if device >= len(snapshot.traces):
        return [DeviceReplay(device, False, "no trace for this device")]
    events = events_of(snapshot.traces[device])
    final = final_segments_of(snapshot.segments, device)
    settings = snapshot.allocator_settings
    conf = settings.raw_conf if settings is not None else ""
    reason = qualification(events, final)
    if not reason:
        return [_replay(events, final, conf, device, traced_addresses, "all pools")]
    config = parse_alloc_conf(conf)
    pool_replays = []
    splittable = not config.expandable_segments and not any(
        event.action in ("oom", "segment_map", "segment_unmap") for event in events
    )
    for pool in ("large", "small") if splittable else ():
        pool_events = _pool_events(events, pool, config)
        pool_final = [segment for segment in final if segment.segment_type == pool]
        if not qualification(pool_events, pool_final):
            pool_replays.append(_replay(pool_events, pool_final, conf, device, traced_addresses, f"{pool} pool"))
    return pool_replays or [DeviceReplay(device, False, reason)]


def _replay(
    events: list[Event], final: list[FinalSegment], conf: str, device: int, traced_addresses: bool, scope: str
) -> DeviceReplay:
    capacity_bytes = _oom_capacity(events)
    simulator = CachingAllocatorSimulator(
        capacity_bytes,
        alloc_conf=conf or "",
        device=device,
        address_space=TracedAddressSpace(events) if traced_addresses else None,
    )
    simulator.record_history(True, max_entries=len(events) * 4 + 100, context=None)
    result = DeviceReplay(device, True, "", scope)
    runs = _release_runs(events)
    address_map: dict[int, int] = {}
    for index, event in enumerate(events):
        if index in runs:
            _, ending = runs[index]
            # A flush the allocator makes inside a malloc is left to the simulator; any other run of
            # releases is an explicit empty_cache(). Which one it was, the simulator itself tells:
            # only a malloc that cannot be served without releasing memory flushes.
            if ending is None or not simulator.would_flush(ending.size, ending.stream):
                simulator.empty_cache()
            continue
        if event.action in SEGMENT_RELEASE_ACTIONS:
            continue
        if event.action == "alloc":
            try:
                address_map[event.addr] = simulator.malloc(event.size, event.stream)
            except SimulatedOutOfMemory:
                result.mismatches.append(f"event {index}: simulator ran out of memory where torch did not")
        elif event.action == "free_requested":
            simulated_address = address_map.pop(event.addr, None)
            if simulated_address is not None:
                simulator.free(simulated_address)
        elif event.action == "oom":
            try:
                surplus = simulator.malloc(event.size, event.stream)
            except SimulatedOutOfMemory as error:
                if error.device_free_bytes != event.device_free:
                    result.mismatches.append(
                        f"event {index}: oom device_free {error.device_free_bytes} (torch: {event.device_free})"
                    )
            else:
                result.mismatches.append(f"event {index}: torch ran out of memory, the simulator did not")
                simulator.free(surplus)

    stats = simulator.memory_stats()
    result.simulated_retries = stats["num_alloc_retries"]
    result.simulated_ooms = stats["num_ooms"]
    result.real_ooms = sum(1 for event in events if event.action == "oom")
    simulated_snapshot = as_snapshot(simulator.snapshot())
    simulated_events = events_of(simulated_snapshot.traces[device])
    result.real_segment_sizes = [(e.action, e.size) for e in events if e.action in SEGMENT_CREATE_ACTIONS]
    result.simulated_segment_sizes = [
        (e.action, e.size) for e in simulated_events if e.action in SEGMENT_CREATE_ACTIONS
    ]
    result.segment_events_matched = _sequence_agreement(result.real_segment_sizes, result.simulated_segment_sizes)
    result.segment_events_total = max(len(result.real_segment_sizes), len(result.simulated_segment_sizes))
    real_releases = [(e.action, e.size) for e in events if e.action in SEGMENT_RELEASE_ACTIONS]
    simulated_releases = [(e.action, e.size) for e in simulated_events if e.action in SEGMENT_RELEASE_ACTIONS]
    result.release_events_matched = _sequence_agreement(real_releases, simulated_releases)
    result.release_events_total = max(len(real_releases), len(simulated_releases))
    result.blocks_matched, result.blocks_total = _layout_agreement(
        final, final_segments_of(simulated_snapshot.segments, device), result.mismatches
    )
    if result.segment_events_matched < result.segment_events_total:
        result.mismatches.append(
            f"segment sizes: {result.segment_events_matched}/{result.segment_events_total} in order"
        )
    return result


def replay_snapshot(snapshot: Snapshot, traced_addresses: bool = True) -> list[DeviceReplay]:
    return [
        replay for device in range(len(snapshot.traces)) for replay in replay_device(snapshot, device, traced_addresses)
    ]
