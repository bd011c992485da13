"""The peak's walk notes, as it goes, the events two later readings walk again (`ReplayState`'s
large_events and segment_events): they are the events those readings find by themselves, and
what the readings conclude from them is the same."""

from __future__ import annotations

from pathlib import Path

from oomdoctor.analysis.reading import read_device
from oomdoctor.analysis.reading import replay as replay_device
from oomdoctor.analysis.replay import near_ooms, unsized_remainders
from oomdoctor.analysis.sizing import SMALL_REQUEST_BYTES
from oomdoctor.dump_metadata import NO_METADATA
from oomdoctor.load import load
from oomdoctor.model import ALLOC, FREE_REQUESTED, SEGMENT_ALLOC, SEGMENT_FREE, SEGMENT_MAP, SEGMENT_UNMAP
from tests.builders import GiB, Sim
from tests.test_risks_without_oom import RELU_STACK, _near_oom

DUMPS = sorted((Path(__file__).resolve().parent.parent / "fixtures" / "dumps").glob("*.pickle"))


def _replayed(snapshot):
    device = snapshot.devices[0]
    dump = read_device(snapshot, snapshot.oomdoctor or NO_METADATA, device)
    return dump, replay_device(dump, 480)


def _snapshots():
    yield from (load(path) for path in DUMPS[:6])
    sim = Sim(total_bytes=4 * GiB)
    _near_oom(sim, RELU_STACK)
    yield sim.snapshot(metadata=False)


def test_the_noted_events_are_the_ones_the_readings_find_and_conclude_the_same_from():
    def at_most(rounded: int) -> int:
        return rounded // 8

    segment_actions = (SEGMENT_ALLOC, SEGMENT_MAP, SEGMENT_FREE, SEGMENT_UNMAP)
    seen_large = seen_near = 0
    for snapshot in _snapshots():
        dump, state = _replayed(snapshot)
        trace = dump.trace
        pairs = list(enumerate(zip(trace.actions, trace.sizes)))
        large = [i for i, (a, size) in pairs if a in (ALLOC, FREE_REQUESTED) and size > SMALL_REQUEST_BYTES]
        assert list(state.large_events) == large
        assert list(state.segment_events) == [i for i, (a, _) in pairs if a in segment_actions]
        alone = unsized_remainders(trace, state.history, state.peak_index, at_most)
        assert unsized_remainders(trace, state.history, state.peak_index, at_most, (), state.large_events) == alone
        found = near_ooms(trace, dump.segments)
        assert near_ooms(trace, dump.segments, state.segment_events) == found
        seen_large += bool(large)
        seen_near += bool(found)
    assert seen_large and seen_near
