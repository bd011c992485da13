"""Replaying traces through the simulator: the corpus agreement, and the rules that pick the traces."""

from __future__ import annotations

import io
import itertools
import sys
from pathlib import Path

import pytest

from oomdoctor.rehearse.allocator import CachingAllocatorSimulator, SimulatedOutOfMemory
from oomdoctor.rehearse.allocator_fidelity import as_snapshot, replay_snapshot
from oomdoctor.units import MIB as MiB

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import simulator_fidelity  # noqa: E402

# device traces of the corpus whose history starts from an empty allocator
QUALIFYING = {
    ("compile_context__decomfl__memory.pickle", 0),
    ("cs336_mixed_precision__niuhuangxiaozi__fwd_bwd_200_mixed_precision.pickle", 0),
    ("cs336_small__silmont2000__mem_snapshot.pickle", 0),
    ("multi_device_expandable__constructor_sun_code_location__memory_snapshot.pickle", 0),
    ("multi_device_expandable__constructor_sun_code_location__memory_snapshot.pickle", 1),
    ("multi_device_expandable__constructor_sun_code_location__memory_snapshot.pickle", 2),
    ("oom_action__nesta_discrete_diffusion__memory_snapshot.json", 0),
}
# traces that began after a small segment existed, but whose large pool history is whole
LARGE_POOL_ONLY = {
    ("segment_free__octree_nca__inference2_peso_oct.pickle", 0),
    ("tiny_5_events__octree_nca__cuda_single_step.pickle", 0),
}


@pytest.mark.slow
def test_corpus_agreement_is_total(corpus_dir):
    out = io.StringIO()
    agreement = simulator_fidelity.run(corpus_dir, out=out)
    lines = out.getvalue().splitlines()
    assert lines[-1] == "agreement: 1.0000"
    assert agreement == 1.0
    replayed = set()
    for path in simulator_fidelity.snapshot_files(corpus_dir):
        outcome = simulator_fidelity.replay_file(path)
        if not isinstance(outcome, str):
            replayed.update((path.name, replay.device, replay.scope) for replay in outcome if replay.qualifies)
    assert {(name, device, "all pools") for name, device in QUALIFYING} <= replayed
    assert {(name, device, "large pool") for name, device in LARGE_POOL_ONLY} <= replayed


def test_benchmark_refuses_a_missing_folder(tmp_path, capsys):
    assert simulator_fidelity.main([str(tmp_path / "absent")]) == 2
    assert "not a folder" in capsys.readouterr().err


def _workload(simulator: CachingAllocatorSimulator) -> None:
    live = []
    sizes = [100, 3000, 700_000, 3 * MiB, 7 * MiB + 5, 13 * MiB, 40 * MiB + 1, 2 * MiB]
    for step, size in zip(range(120), itertools.cycle(sizes)):
        stream = 0 if step % 7 else 3
        try:
            live.append(simulator.malloc(size * (1 + step % 3), stream))
        except SimulatedOutOfMemory:
            pass
        if step % 3 == 2:
            simulator.free(live.pop(step % len(live)))
        if step == 60:
            simulator.empty_cache()


@pytest.mark.parametrize("conf", ["", "expandable_segments:True", "roundup_power2_divisions:4"])
@pytest.mark.parametrize("capacity_bytes", [1 << 40, 300 * MiB])
def test_the_simulator_agrees_with_its_own_trace(conf, capacity_bytes):
    simulator = CachingAllocatorSimulator(capacity_bytes, alloc_conf=conf)
    simulator.record_history(True, max_entries=100_000)
    _workload(simulator)
    snapshot = simulator.snapshot()
    if capacity_bytes < 1 << 40:
        assert any(event["action"] == "oom" for event in snapshot["device_traces"][0])
    (replay,) = replay_snapshot(as_snapshot(snapshot))
    assert replay.qualifies, replay.reason
    assert replay.mismatches == []
    assert replay.segment_events_matched == replay.segment_events_total > 0
    assert replay.blocks_matched == replay.blocks_total > 0


def test_a_trace_that_starts_mid_run_does_not_qualify():
    simulator = CachingAllocatorSimulator(1 << 40)
    kept_large = simulator.malloc(3 * MiB)
    kept_small = simulator.malloc(100)
    simulator.record_history(True)
    simulator.free(kept_large)
    simulator.free(kept_small)
    simulator.malloc(MiB)
    simulator.malloc(5 * MiB)
    (replay,) = replay_snapshot(as_snapshot(simulator.snapshot()))
    assert not replay.qualifies
    assert "starts mid-run" in replay.reason


def test_a_segment_from_before_the_trace_leaves_the_other_pool_to_replay():
    simulator = CachingAllocatorSimulator(1 << 40)
    simulator.malloc(100)  # small segment, never seen by the trace
    simulator.record_history(True)
    simulator.malloc(30 * MiB)
    simulator.free(simulator.malloc(3 * MiB))
    simulator.malloc(200)
    (replay,) = replay_snapshot(as_snapshot(simulator.snapshot()))
    assert replay.qualifies and replay.scope == "large pool"
    assert replay.segment_events_matched == replay.segment_events_total == 2
    assert replay.blocks_matched == replay.blocks_total == 2


def test_segments_from_before_the_trace_in_both_pools_disqualify():
    simulator = CachingAllocatorSimulator(1 << 40)
    simulator.malloc(100)
    simulator.malloc(30 * MiB)
    simulator.record_history(True)
    simulator.malloc(200)
    simulator.malloc(40 * MiB)
    (replay,) = replay_snapshot(as_snapshot(simulator.snapshot()))
    assert not replay.qualifies
    assert "starts mid-run" in replay.reason


def test_a_diverging_replay_is_scored_below_one():
    simulator = CachingAllocatorSimulator(1 << 40)
    simulator.record_history(True)
    simulator.malloc(3 * MiB)
    simulator.malloc(5 * MiB)
    snapshot = simulator.snapshot()
    snapshot["device_traces"][0][1]["size"] = 30 * MiB  # as if torch had asked for more
    (replay,) = replay_snapshot(as_snapshot(snapshot))
    assert replay.segment_events_matched < replay.segment_events_total
    assert replay.blocks_matched < replay.blocks_total
    assert replay.mismatches


@pytest.mark.parametrize("conf", ["", "expandable_segments:True"])
def test_empty_cache_before_an_oom_is_not_mistaken_for_the_flush(conf):
    simulator = CachingAllocatorSimulator(60 * MiB, alloc_conf=conf)
    simulator.record_history(True)
    simulator.free(simulator.malloc(20 * MiB + 1))
    simulator.empty_cache()
    simulator.malloc(20 * MiB + 1)
    with pytest.raises(SimulatedOutOfMemory):
        simulator.malloc(40 * MiB + 513)
    (replay,) = replay_snapshot(as_snapshot(simulator.snapshot()))
    assert replay.mismatches == []
    assert replay.release_events_matched == replay.release_events_total == 1


def test_would_flush_leaves_the_allocator_untouched():
    simulator = CachingAllocatorSimulator(100 * MiB)
    simulator.record_history(True)
    simulator.free(simulator.malloc(60 * MiB))
    before = (simulator.snapshot(), simulator.memory_stats())
    assert not simulator.would_flush(50 * MiB)  # the 60 MiB cached block serves it
    assert simulator.would_flush(70 * MiB)  # needs the 60 MiB segment released first
    assert simulator.would_flush(200 * MiB)  # cannot be served at all
    after = (simulator.snapshot(), simulator.memory_stats())
    assert before[0]["segments"] == after[0]["segments"] and before[1] == after[1]
    assert len(after[0]["device_traces"][0]) == len(before[0]["device_traces"][0]) + 1  # the snapshot marker
