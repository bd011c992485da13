"""The allocator's state at any event, for a cursor moving along a trace of millions of events."""

from __future__ import annotations

from collections.abc import Sequence

from oomdoctor.analysis.replay import columns, final_live_blocks, lay_out, segments_at
from oomdoctor.analysis.results import EventState, LiveAllocation
from oomdoctor.analysis.sizing import round_size
from oomdoctor.model import (
    ACTIVE_ALLOCATED,
    ACTIVE_PENDING_FREE,
    ALLOC,
    FREE_COMPLETED,
    FREE_REQUESTED,
    Segment,
    TraceEvent,
)


class Replayer:
    """The state at any event of one device's trace, for a cursor that moves along the timeline.

    Construction makes one pass and keeps a copy of the live set every `len(trace) / checkpoints`
    events; `state_at(i)` then replays at most that many events, so moving a cursor stays cheap on
    a trace of millions of events.
    """

    def __init__(
        self,
        trace: Sequence[TraceEvent],
        segments: Sequence[Segment],
        divisions: tuple[tuple[int, int], ...] = (),
        checkpoints: int = 32,
    ):
        self.trace = columns(trace)
        self.segments = tuple(segments)
        self.divisions = divisions
        self._final = final_live_blocks(self.segments)
        count = len(self.trace)
        every = max(1, -(-count // checkpoints)) if count else 1
        live: dict[int, tuple[int, int, int]] = {}
        pending: dict[int, int] = {}
        self._checkpoints: list[tuple[int, dict[int, tuple[int, int, int]], dict[int, int]]] = []
        self._pre_existing_frees: list[tuple[int, int, int]] = []
        rounded: dict[int, int] = {}
        for index, action, addr, size in zip(range(count), self.trace.actions, self.trace.addrs, self.trace.sizes):
            if action == ALLOC:
                block_size = rounded.get(size)
                if block_size is None:
                    block_size = rounded[size] = round_size(size, divisions)
                live[addr] = (index, block_size, size)
            elif action == FREE_REQUESTED:
                entry = live.pop(addr, None)
                if entry is None:
                    self._pre_existing_frees.append((index, addr, round_size(size, divisions)))
                    pending[addr] = round_size(size, divisions)
                else:
                    pending[addr] = entry[1]
            elif action == FREE_COMPLETED:
                pending.pop(addr, None)
            if index % every == every - 1:
                self._checkpoints.append((index, dict(live), dict(pending)))
        self._rounded = rounded
        self._live_at_end = live

    def state_at(self, event_index: int) -> EventState:
        count = len(self.trace)
        if count == 0 or event_index >= count - 1:
            return self._final_state(count - 1)
        start = 0
        live: dict[int, tuple[int, int, int]] = {}
        pending: dict[int, int] = {}
        for index, saved_live, saved_pending in self._checkpoints:
            if index > event_index:
                break
            start, live, pending = index + 1, dict(saved_live), dict(saved_pending)
        end = event_index + 1
        trace = self.trace
        for index, action, addr, size in zip(
            range(start, end), trace.actions[start:end], trace.addrs[start:end], trace.sizes[start:end]
        ):
            if action == ALLOC:
                live[addr] = (index, self._rounded.get(size) or round_size(size, self.divisions), size)
            elif action == FREE_REQUESTED:
                entry = live.pop(addr, None)
                pending[addr] = entry[1] if entry is not None else round_size(size, self.divisions)
            elif action == FREE_COMPLETED:
                pending.pop(addr, None)
        merged: dict[int, LiveAllocation] = {}
        for address, (alloc_index, size, requested) in live.items():
            end_entry = self._live_at_end.get(address)
            block = self._final.get(address)
            if end_entry is not None and end_entry[0] == alloc_index and block is not None:
                merged[address] = LiveAllocation(address, alloc_index, block.size, block.requested_size)
            else:
                merged[address] = LiveAllocation(address, alloc_index, size, requested)
        for address, block in self._final.items():
            if address not in self._live_at_end and address not in merged:
                merged[address] = LiveAllocation(address, None, block.size, block.requested_size)
        for index, address, size in self._pre_existing_frees:
            if index > event_index and address not in merged:
                merged[address] = LiveAllocation(address, None, size, size)
        segments, _ = segments_at(trace, self.segments, event_index)
        layout = lay_out(segments, merged.values(), pending)
        return _state_from_layout(event_index, layout, merged, exact=False)

    def _final_state(self, event_index: int) -> EventState:
        merged = {}
        for address, block in self._final.items():
            entry = self._live_at_end.get(address)
            alloc_index = entry[0] if entry is not None else None
            merged[address] = LiveAllocation(address, alloc_index, block.size, block.requested_size)
        return _state_from_layout(event_index, list(self.segments), merged, exact=True)


def _state_from_layout(
    event_index: int, layout: Sequence[Segment], live: dict[int, LiveAllocation], exact: bool
) -> EventState:
    allocated = active = reserved = 0
    rows = []
    for segment in layout:
        reserved += segment.total_size
        for block in segment.blocks:
            if block.state == ACTIVE_ALLOCATED:
                allocated += block.size
                active += block.size
                allocation = live.get(block.address)
                if allocation is None:
                    allocation = LiveAllocation(block.address, None, block.size, block.requested_size)
                elif allocation.size_bytes != block.size:
                    allocation = allocation._replace(size_bytes=block.size)
                rows.append(allocation)
            elif block.state == ACTIVE_PENDING_FREE:
                active += block.size
    return EventState(
        event_index=event_index,
        allocated_bytes=allocated,
        active_bytes=active,
        reserved_bytes=reserved,
        live=tuple(rows),
        segments=tuple(layout),
        exact=exact,
    )
