"""Replay invariants over random allocation histories (hypothesis): the state rebuilt at any event
walking back from the dump equals the state computed forward from the start."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from oomdoctor.analysis import Replayer, analyse, replayer
from oomdoctor.analysis.reading import read_device, replay
from oomdoctor.analysis.replay import LiveHistory, ring_buffer_wrapped
from oomdoctor.analysis.results import Unknown, UnknownKind
from oomdoctor.analysis.sizing import round_size
from oomdoctor.dump_metadata import NO_METADATA
from oomdoctor.model import DeviceTrace, Snapshot, TraceEvent
from tests.builders import USER_STACK, MiB, Sim, metadata_fields, spike_sim

OPS = st.lists(
    st.one_of(
        st.tuples(st.just("alloc"), st.integers(min_value=1, max_value=40 * MiB)),
        st.tuples(st.just("free"), st.integers(min_value=0, max_value=50)),
        st.tuples(st.just("flush"), st.just(0)),
        st.tuples(st.just("oom"), st.integers(min_value=1, max_value=80 * MiB)),
    ),
    min_size=1,
    max_size=40,
)


def _run(ops):
    sim = Sim(total_bytes=1 << 40)
    live: list[int] = []
    for kind, value in ops:
        if kind == "alloc":
            live.append(sim.alloc(value, USER_STACK))
        elif kind == "free" and live:
            sim.free(live.pop(value % len(live)))
        elif kind == "flush":
            sim.release_cache()
        elif kind == "oom":
            sim.oom(value)
    return sim


def _forward_states(events):
    live: dict[int, int] = {}
    reserved = 0
    states = []
    for event in events:
        if event.action == "alloc":
            live[event.addr] = round_size(event.size)
        elif event.action == "free_requested":
            live.pop(event.addr)
        elif event.action == "segment_alloc":
            reserved += event.size
        elif event.action == "segment_free":
            reserved -= event.size
        states.append((sum(live.values()), reserved, set(live)))
    return states


@settings(max_examples=60, deadline=None)
@given(OPS)
def test_state_at_every_event_matches_a_forward_replay(ops):
    sim = _run(ops)
    snapshot = sim.snapshot(metadata=False)
    replay = replayer(snapshot, 0)
    for index, (allocated, reserved, addresses) in enumerate(_forward_states(sim.events)):
        state = replay.state_at(index)
        assert state.allocated_bytes == allocated
        assert state.reserved_bytes == reserved
        assert {live.address for live in state.live} == addresses
        for segment in state.segments:
            assert sum(b.size for b in segment.blocks) == segment.total_size


@settings(max_examples=60, deadline=None)
@given(OPS, st.sampled_from([(1, 1), (2, 1), (3, 2), (7, 3)]), st.randoms(use_true_random=False))
def test_state_at_from_dense_copies_matches_a_forward_replay(ops, every, rng):
    """The cursor's copies of the live set (every few events) and of the segments (every few
    segment events, walking back) rebuild the same state as a replay from event 0, at any event."""
    sim = _run(ops)
    snapshot = sim.snapshot(metadata=False)
    fresh = Replayer(snapshot.traces[0], snapshot.segments, every=every[0], segment_every=every[1])
    states = _forward_states(sim.events)
    for index in rng.sample(range(len(states)), min(len(states), 12)):
        allocated, reserved, addresses = states[index]
        state = fresh.state_at(index)
        assert state.allocated_bytes == state.counted_bytes == allocated
        assert state.reserved_bytes == reserved
        assert {live.address for live in state.live} == addresses


def test_a_long_trace_replays_from_many_copies_to_the_state_of_a_forward_replay():
    sim = spike_sim(allocations=300)
    snapshot = sim.snapshot(metadata=False)
    states = _forward_states(sim.events)
    default, dense = replayer(snapshot, 0), Replayer(snapshot.traces[0], snapshot.segments, every=16, segment_every=4)
    assert len(dense.history.copies) >= 3 and len(dense.segment_history._copies) >= 3
    rng = random.Random(13)
    for index in rng.sample(range(len(states) - 1), 40) + [0, len(states) - 2]:
        allocated, reserved, addresses = states[index]
        for fresh in (default, dense):
            state = fresh.state_at(index)
            assert (state.counted_bytes, state.reserved_bytes) == (allocated, reserved)
            assert {live.address for live in state.live} == addresses


def test_the_walk_copies_the_live_set_about_every_eighth_of_the_trace_whatever_its_points():
    """A device read for its summary only (two series points, as another device of the dump is)
    keeps copies as the judged one does: its moments replay from the nearest, not from the start,
    and the copies hold at most one entry per two events."""
    sim = spike_sim(allocations=300)
    snapshot = sim.snapshot(metadata=False)
    trace = snapshot.traces[0]
    states = _forward_states(sim.events)
    for points in (2, 480):
        history = replay(read_device(snapshot, NO_METADATA, 0), points).history
        kept = [copy for copy in history.copies if trace.actions[copy[0]] != "oom"]
        assert len(kept) >= 3
        assert sum(len(live) + len(pending) for _, live, pending in kept) <= len(trace) / 2
        for index in [0, len(trace) // 3, len(trace) // 2, len(trace) - 2] + [copy[0] for copy in kept]:
            live, _ = history.at(index)
            assert set(live) == states[index][2]


@settings(max_examples=40, deadline=None)
@given(OPS)
def test_the_cursors_copies_hold_at_most_one_entry_per_two_events(ops):
    sim = _run(ops)
    trace = sim.snapshot(metadata=False).traces[0]
    history = LiveHistory.record(trace, (), every=1)
    assert sum(len(live) + len(pending) for _, live, pending in history.copies) <= len(trace) / 2


@settings(max_examples=80, deadline=None)
@given(
    OPS,
    st.integers(min_value=0, max_value=30),
    st.integers(min_value=0, max_value=30),
    st.sampled_from([1, 3, 2048]),
)
def test_the_bytes_live_after_an_event_are_what_its_live_set_sums_to(ops, dropped, cut, every):
    """`bytes_at` counts what `at` makes, at every event: also where the trace lost its oldest
    events (blocks from before it, freed in it, or never), or its newest (blocks it holds live
    that the dump does not), replayed from copies taken anywhere (the walk's at every OOM)."""
    sim = _run(ops)
    segments = sim.snapshot(metadata=False).segments
    events = sim.events[min(dropped, len(sim.events) // 2) : len(sim.events) - min(cut, len(sim.events) // 3)]
    snapshot = Snapshot(segments=segments, traces=(DeviceTrace.from_events(0, events),))
    trace = snapshot.traces[0]
    walked = replay(read_device(snapshot, NO_METADATA, 0), 2).history  # with copies at every OOM
    histories = [LiveHistory.record(trace, segments, every=every), walked]
    for history in histories:
        for index in range(len(trace)):
            live, _ = history.at(index)
            assert history.bytes_at(index) == sum(a.size_bytes for a in live.values())


def test_a_block_from_before_the_trace_counts_once_however_often_the_trace_frees_it():
    """A hostile or torn trace: the dump's block at `kept` was never allocated in the trace yet is
    freed in it, and `gone` (no block of the dump) is freed twice. `at` keeps one allocation per
    address, and `bytes_at` counts each once."""
    sim = Sim(total_bytes=1 << 40)
    kept = sim.alloc(10 * MiB, USER_STACK)
    segments = sim.snapshot(metadata=False).segments
    gone = kept + (64 << 20)
    events = [
        TraceEvent("free_requested", kept, 10 * MiB),
        TraceEvent("alloc", gone + (1 << 30), MiB),
        TraceEvent("free_requested", kept, 10 * MiB),
        TraceEvent("free_requested", gone, 4 * MiB),
        TraceEvent("free_requested", gone, 4 * MiB),
    ]
    history = LiveHistory.record(DeviceTrace.from_events(0, events), segments, every=1)
    for index in range(len(events)):
        live, _ = history.at(index)
        assert history.bytes_at(index) == sum(a.size_bytes for a in live.values())
    assert history.bytes_at(1) == 10 * MiB + MiB + 4 * MiB  # kept (the dump's), the alloc, gone once


@settings(max_examples=60, deadline=None)
@given(OPS, st.integers(min_value=2, max_value=9))
def test_each_series_peak_is_the_most_allocated_over_its_events(ops, points):
    """A point stands for the events after the previous one up to its own; its peak is the true
    most over them (not a sample), at the first event reaching it, and the peaks' most is the peak."""
    sim = _run(ops)
    analysis = analyse(sim.snapshot(metadata=False), series_points=points)
    states = _forward_states(sim.events)
    replay = analysis.replay
    if not states:
        return
    assert len(replay.series_peaks) == len(replay.series)
    previous = -1
    for point, peak in zip(replay.series, replay.series_peaks):
        values = [states[i][0] for i in range(previous + 1, point.event_index + 1)]
        assert peak.allocated_bytes == max(values) >= point.allocated_bytes
        assert peak.event_index == previous + 1 + values.index(max(values))
        assert sum(peak.components) == peak.allocated_bytes
        previous = point.event_index
    assert max(p.allocated_bytes for p in replay.series_peaks) == replay.peak_allocated_bytes


def test_a_one_event_spike_between_samples_is_the_peak_of_its_interval():
    missed = 0
    for spike_after in (250, 251, 252):
        sim = spike_sim(spike_after=spike_after)
        analysis = analyse(sim.snapshot(metadata=False))
        replay = analysis.replay
        assert replay.event_count > 480 * 2
        sampled = {p.event_index for p in replay.series}
        missed += replay.peak_index not in sampled
        assert max(p.allocated_bytes for p in replay.series_peaks) == replay.peak_allocated_bytes
        holder = next(p for p in replay.series_peaks if p.event_index == replay.peak_index)
        assert holder.allocated_bytes == replay.peak_allocated_bytes
        state = replayer(sim.snapshot(metadata=False), 0).state_at(replay.peak_index)
        assert state.counted_bytes == replay.peak_allocated_bytes
    assert missed  # at least one spike fell between two samples: the series alone would miss it
    assert max(p.allocated_bytes for p in replay.series) < replay.peak_allocated_bytes or missed < 3


@settings(max_examples=40, deadline=None)
@given(OPS)
def test_series_ends_at_the_dump_and_peak_is_the_maximum(ops):
    sim = _run(ops)
    analysis = analyse(sim.snapshot(metadata=False))
    states = _forward_states(sim.events)
    if not states:
        assert analysis.replay.series == () and analysis.accounting.allocated_bytes == 0
        return
    assert analysis.replay.series[-1].allocated_bytes == states[-1][0]
    assert analysis.replay.series[-1].reserved_bytes == states[-1][1]
    assert analysis.replay.peak_allocated_bytes == max(s[0] for s in states)
    assert sum(c.bytes for c in analysis.components) == analysis.accounting.allocated_bytes


@settings(max_examples=40, deadline=None)
@given(OPS)
def test_the_last_oom_is_judged_on_its_own_state(ops):
    sim = _run(ops)
    ooms = [i for i, e in enumerate(sim.events) if e.action == "oom"]
    if not ooms:
        return
    analysis = analyse(sim.snapshot(metadata=False))
    allocated, reserved, addresses = _forward_states(sim.events)[ooms[-1]]
    assert analysis.replay.target_index == ooms[-1]
    assert analysis.accounting.allocated_bytes == allocated
    assert analysis.accounting.reserved_bytes == reserved
    assert {b.address for b in analysis.live_blocks} == addresses
    assert analysis.verdict != "no-oom"


BLOCK_EVENTS = ("alloc", "free_requested", "free_completed")


@settings(max_examples=60, deadline=None)
@given(OPS, st.integers(min_value=0, max_value=30), st.lists(st.booleans(), max_size=40))
def test_the_analysis_and_the_cursor_rebuild_the_same_state_at_the_target(ops, dropped, completes):
    """One reconstruction: when the target must be replayed (blocks change after it), the report's
    state there is the cursor's, also for a wrapped trace whose frees never completed."""
    sim = _run(ops)
    events = sim.events[min(dropped, len(sim.events) // 2) :]  # the ring buffer lost the oldest
    frees = iter(completes)
    events = [e for e in events if e.action != "free_completed" or next(frees, True)]
    snapshot = Snapshot(segments=sim.snapshot(metadata=False).segments, traces=(DeviceTrace.from_events(0, events),))
    analysis = analyse(snapshot)
    target = analysis.replay.target_index
    if target is None or not any(e.action in BLOCK_EVENTS for e in events[target + 1 :]):
        return
    state = replayer(snapshot, analysis.device).state_at(target)
    assert analysis.accounting.allocated_bytes == state.allocated_bytes
    assert analysis.accounting.pending_free_bytes == state.active_bytes - state.allocated_bytes
    assert analysis.accounting.reserved_bytes == state.reserved_bytes
    assert [(b.address, b.alloc_index) for b in analysis.live_blocks] == [
        (live.address, live.alloc_index) for live in sorted(state.live, key=lambda live: -live.size_bytes)
    ]


def test_a_free_of_an_allocation_older_than_the_trace_is_pending_at_a_replayed_peak():
    sim = Sim(total_bytes=1 << 40)
    older = sim.alloc(10 * MiB, USER_STACK)
    sim.alloc(30 * MiB, USER_STACK)
    sim.free(older)
    sim.free(sim.alloc(40 * MiB, USER_STACK))  # the peak, freed again before the dump
    events = [e for e in sim.events[2:] if not (e.action == "free_completed" and e.addr == older)]
    snapshot = Snapshot(segments=sim.snapshot(metadata=False).segments, traces=(DeviceTrace.from_events(0, events),))
    analysis = analyse(snapshot)
    assert analysis.replay.target_kind == "peak" and analysis.replay.events_after_target > 0
    state = replayer(snapshot, 0).state_at(analysis.replay.target_index)
    assert analysis.accounting.pending_free_bytes == state.active_bytes - state.allocated_bytes == 10 * MiB


def test_the_ring_buffer_wrapped_when_the_trace_is_as_long_as_the_recording_kept():
    assert ring_buffer_wrapped(5000, 5000) and ring_buffer_wrapped(5001, 5000)
    assert not ring_buffer_wrapped(4999, 5000) and not ring_buffer_wrapped(1024, 0)
    assert not ring_buffer_wrapped(1000, 100_000)  # the recording's size wins over a round count
    assert ring_buffer_wrapped(1000, None) and ring_buffer_wrapped(2**20, None)  # the guess without it
    assert not ring_buffer_wrapped(1001, None)
    sim = _run([("alloc", MiB)] * 4)  # 8 events, as many as a recording of 8 keeps
    metadata = {"schema_version": 1, "recording": {"max_entries": 8}}
    snapshot = Snapshot(segments=sim.snapshot().segments, traces=sim.snapshot().traces, **metadata_fields(metadata))
    analysis = analyse(snapshot)
    assert analysis.replay.ring_buffer_wrapped
    assert Unknown(UnknownKind.RING_BUFFER_WRAPPED, 8) in analysis.unknowns
