"""Replay invariants over random allocation histories (hypothesis): the state rebuilt at any event
walking back from the dump equals the state computed forward from the start."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from oomdoctor.analysis import analyse, replayer
from oomdoctor.analysis.sizing import round_size
from tests.builders import USER_STACK, MiB, Sim

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
