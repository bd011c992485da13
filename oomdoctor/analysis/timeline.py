"""The allocator's state at any event, for a cursor moving along a trace of millions of events."""

from __future__ import annotations

from collections.abc import Sequence

from oomdoctor.analysis.replay import LiveHistory, columns, event_state, lay_out, segments_at
from oomdoctor.analysis.results import EventState
from oomdoctor.model import Segment, TraceEvent


class Replayer:
    """The state at any event of one device's trace, for a cursor that moves along the timeline.

    Construction makes one pass (`LiveHistory.record`) and keeps a copy of the live set every
    `len(trace) / checkpoints` events; `state_at(i)` then replays at most that many events, so
    moving a cursor stays cheap on a trace of millions of events.
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
        self.history = LiveHistory.record(self.trace, self.segments, divisions, checkpoints)

    def state_at(self, event_index: int) -> EventState:
        count = len(self.trace)
        if count == 0 or event_index >= count - 1:
            return event_state(count - 1, self.segments, self.history.at_end(), exact=True)
        live, pending = self.history.at(event_index)
        segments, _ = segments_at(self.trace, self.segments, event_index)
        return event_state(event_index, lay_out(segments, live.values(), pending), live, exact=False)
