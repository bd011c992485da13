"""Invariants of the allocator simulator over random workloads (spec §1.10, §4.3)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oomdoctor.rehearse.allocator import CachingAllocatorSimulator, SimulatedOutOfMemory
from oomdoctor.rehearse.allocator_fidelity import as_snapshot, replay_snapshot
from oomdoctor.units import MIB as MiB

request_sizes = st.one_of(
    st.integers(1, 4096),
    st.integers(4096, MiB),
    st.integers(MiB, 12 * MiB),
    st.integers(12 * MiB, 90 * MiB),
)
operations = st.lists(
    st.one_of(
        st.tuples(st.just("malloc"), request_sizes, st.sampled_from([0, 0, 0, 5])),
        st.tuples(st.just("free"), st.integers(0, 1000), st.just(0)),
        st.tuples(st.just("empty_cache"), st.just(0), st.just(0)),
    ),
    max_size=80,
)
configs = st.sampled_from(["", "expandable_segments:True", "roundup_power2_divisions:[2:4,>:2]"])
capacities = st.sampled_from([1 << 40, 200 * MiB, 64 * MiB])


def run(conf: str, capacity_bytes: int, steps: list) -> CachingAllocatorSimulator:
    simulator = CachingAllocatorSimulator(capacity_bytes, alloc_conf=conf, context_bytes=0)
    simulator.record_history(True, max_entries=1_000_000, context="alloc")
    live: list[int] = []
    for action, value, stream in steps:
        if action == "malloc":
            try:
                live.append(simulator.malloc(value, stream))
            except SimulatedOutOfMemory as error:
                assert error.device_free_bytes < error.alloc_bytes or conf == "expandable_segments:True"
        elif action == "free" and live:
            simulator.free(live.pop(value % len(live)))
        elif action == "empty_cache":
            simulator.empty_cache()
        check_invariants(simulator, conf, capacity_bytes)
    return simulator


def check_invariants(simulator: CachingAllocatorSimulator, conf: str, capacity_bytes: int) -> None:
    snapshot = simulator.snapshot()
    stats = simulator.memory_stats()
    reserved = allocated = active = requested = split_inactive = 0
    for segment in snapshot["segments"]:
        address = segment["address"]
        previous_state = None
        for block in segment["blocks"]:
            assert block["address"] == address  # blocks tile the segment in address order
            address += block["size"]
            assert block["size"] > 0 and block["size"] % 512 == 0
            # freed neighbours always merge
            assert not (block["state"] == "inactive" and previous_state == "inactive")
            previous_state = block["state"]
            if block["state"] == "active_allocated":
                assert block["requested_size"] <= block["size"]
        assert address - segment["address"] == segment["total_size"]
        assert segment["allocated_size"] <= segment["active_size"] <= segment["total_size"]
        if segment["segment_type"] == "small" and not segment["is_expandable"]:
            assert segment["total_size"] == 2 * MiB
        if not segment["is_expandable"]:
            assert segment["address"] % (2 * MiB) == 0
            if len(segment["blocks"]) > 1:
                split_inactive += sum(b["size"] for b in segment["blocks"] if b["state"] == "inactive")
        reserved += segment["total_size"]
        allocated += segment["allocated_size"]
        active += segment["active_size"]
        requested += segment["requested_size"]
    assert stats["reserved_bytes.all.current"] == reserved
    assert stats["allocated_bytes.all.current"] == allocated
    assert stats["active_bytes.all.current"] == active
    assert stats["requested_bytes.all.current"] == requested
    assert stats["inactive_split_bytes.all.current"] == split_inactive
    assert stats["reserved_bytes.all.peak"] >= reserved
    assert reserved <= capacity_bytes
    free_bytes, total_bytes = simulator.mem_get_info()
    assert free_bytes + reserved == total_bytes == capacity_bytes


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conf=configs, capacity_bytes=capacities, steps=operations)
def test_random_workloads_keep_the_invariants_and_replay_exactly(conf, capacity_bytes, steps):
    simulator = run(conf, capacity_bytes, steps)
    snapshot = simulator.snapshot()
    (replay,) = replay_snapshot(as_snapshot(snapshot))
    if replay.qualifies:
        assert replay.mismatches == []
        assert replay.segment_events_matched == replay.segment_events_total
        assert replay.blocks_matched == replay.blocks_total
