"""The allocator's state at any event, for a cursor moving along a trace of millions of events."""

from __future__ import annotations

from collections.abc import Sequence

from oomdoctor.analysis.replay import (
    CURSOR_COPY_EVENTS,
    CURSOR_COPY_SEGMENT_EVENTS,
    LiveHistory,
    SegmentHistory,
    columns,
    event_state,
    lay_out,
)
from oomdoctor.analysis.results import EventState
from oomdoctor.model import Segment, TraceEvent


class Replayer:
    """The state at any event of one device's trace, for a cursor that moves along the timeline.

    Construction makes one pass forward (`LiveHistory.record`), keeping a copy of the live set
    every `every` events (more apart while the live set is large: at most one copied entry per two
    events), and one walk back over the segment events (`SegmentHistory`); `state_at(i)` then
    replays at most a few thousand events and undoes a few dozen segment events, so a cursor
    move costs milliseconds anywhere in a trace of millions of events.
    """

    def __init__(
        self,
        trace: Sequence[TraceEvent],
        segments: Sequence[Segment],
        divisions: tuple[tuple[int, int], ...] = (),
        every: int = CURSOR_COPY_EVENTS,
        segment_every: int = CURSOR_COPY_SEGMENT_EVENTS,
    ):
        self.trace = columns(trace)
        self.segments = tuple(segments)
        self.divisions = divisions
        self.history = LiveHistory.record(self.trace, self.segments, divisions, every)
        self.segment_history = SegmentHistory(self.trace, self.segments, segment_every)

    def state_at(self, event_index: int) -> EventState:
        count = len(self.trace)
        if count == 0 or event_index >= count - 1:
            return event_state(count - 1, self.segments, self.history.at_end(), exact=True)
        live, pending = self.history.at(event_index)
        segments, _ = self.segment_history.at(event_index)
        return event_state(event_index, lay_out(segments, live.values(), pending), live, exact=False)
