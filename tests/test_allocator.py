"""The allocator simulator against the numbers of the spec (§4) and torch 2.13's formats (§1, §3)."""

from __future__ import annotations

import itertools
import re

import pytest

from oomdoctor.allocator_rules import (
    AllocatorConfig,
    AllocatorConfigError,
    divisions_for,
    parse_alloc_conf,
    roundup_power2_next_division,
)
from oomdoctor.rehearse.allocator import CachingAllocatorSimulator, SimulatedOutOfMemory
from oomdoctor.units import GIB as GiB
from oomdoctor.units import MIB as MiB
from oomdoctor.units import format_size

DEVICE_BYTES = 8 * GiB


def make(capacity_bytes: int = DEVICE_BYTES, **options) -> CachingAllocatorSimulator:
    ticks = itertools.count(1_700_000_000_000_000)
    simulator = CachingAllocatorSimulator(capacity_bytes, clock_us=lambda: next(ticks), **options)
    simulator.record_history(True, max_entries=10_000, context="all")
    return simulator


def trace(simulator: CachingAllocatorSimulator) -> list[dict]:
    return simulator.snapshot()["device_traces"][simulator.device]


def actions(simulator: CachingAllocatorSimulator, *names: str) -> list[tuple[str, int]]:
    return [(e["action"], e["size"]) for e in trace(simulator) if e["action"] in names]


def layout(simulator: CachingAllocatorSimulator) -> list[tuple[str, list[tuple[int, str]]]]:
    return [
        (segment["segment_type"], [(block["size"], block["state"]) for block in segment["blocks"]])
        for segment in simulator.snapshot()["segments"]
    ]


# --------------------------------------------------------------------------- rounding (§4.1)


@pytest.mark.parametrize(
    "nbytes, rounded",
    [(1, 512), (511, 512), (512, 512), (513, 1024), (1000, 1024), (MiB, MiB), (MiB + 1, MiB + 512)],
)
def test_round_size_to_multiples_of_512(nbytes, rounded):
    assert AllocatorConfig().round_size(nbytes) == rounded


def test_power2_division_example_of_the_spec():
    assert roundup_power2_next_division(1200, 4) == 1280
    assert roundup_power2_next_division(2048, 4) == 2048  # powers of two stay


def test_power2_divisions_apply_only_above_512_times_divisions():
    config = parse_alloc_conf("roundup_power2_divisions:4")
    assert config.round_size(1200) == 1536  # 1200 <= 512 * 4: plain 512 rounding
    assert config.round_size(5 * MiB + 1) == 6 * MiB  # steps of 1 MiB between 4 and 8 MiB
    assert config.round_size(4 * MiB) == 4 * MiB
    assert config.round_size(600 * MiB) == 640 * MiB  # steps of 128 MiB between 512 MiB and 1 GiB


def test_power2_division_intervals_and_bracket_syntax():
    config = parse_alloc_conf("roundup_power2_divisions:[256:1,512:2,>:4]")
    assert config.roundup_power2_divisions == [1] * 9 + [2] + [4] * 6
    assert divisions_for(1000, config.roundup_power2_divisions) == 1  # below 2 MiB: interval "1"
    assert divisions_for(600 * MiB, config.roundup_power2_divisions) == 2  # [512, 1024) MiB
    assert divisions_for(40 * GiB, config.roundup_power2_divisions) == 4  # >= 32 GiB: the last interval
    settings = config.settings_dict()["roundup_power2_divisions"]
    assert list(settings) == [str(1 << i) for i in range(16)] and settings["512"] == 2


@pytest.mark.parametrize(
    "conf",
    [
        "roundup_power2_divisions:3",
        "roundup_power2_divisions:[100:2]",
        "max_split_size_mb:10",
        "garbage_collection_threshold:1.5",
        "expandable_segments:maybe",
        "no_such_key:1",
        "max_split_size_mb",
        "backend:cudaMallocAsync",
    ],
)
def test_bad_configs_are_refused(conf):
    with pytest.raises(AllocatorConfigError):
        parse_alloc_conf(conf)


def test_settings_dict_has_torch_2_13_keys():
    settings = parse_alloc_conf("max_split_size_mb:512,expandable_segments:True").settings_dict()
    assert set(settings) == {
        "PYTORCH_CUDA_ALLOC_CONF",
        "max_split_size",
        "garbage_collection_threshold",
        "expandable_segments",
        "pinned_num_register_threads",
        "release_lock_on_cudamalloc",
        "pinned_use_cuda_host_register",
        "graph_capture_record_stream_reuse",
        "max_round_threshold",
        "max_cached_size",
        "roundup_power2_divisions",
    }
    assert settings["max_split_size"] == 512 * MiB and settings["expandable_segments"] is True
    assert AllocatorConfig().settings_dict()["max_split_size"] == -1


# ------------------------------------------------------------------- segment sizes (§4.1)


@pytest.mark.parametrize(
    "rounded, segment",
    [
        (512, 2 * MiB),
        (MiB, 2 * MiB),
        (MiB + 512, 20 * MiB),
        (10 * MiB - 512, 20 * MiB),
        (10 * MiB, 10 * MiB),
        (11 * MiB + 512, 12 * MiB),
    ],
)
def test_allocation_size(rounded, segment):
    assert AllocatorConfig().allocation_size(rounded) == segment


def test_segments_created_by_malloc():
    simulator = make()
    simulator.malloc(100)
    simulator.malloc(3 * MiB)
    simulator.malloc(25 * MiB + 1)
    assert actions(simulator, "segment_alloc") == [
        ("segment_alloc", 2 * MiB),
        ("segment_alloc", 20 * MiB),
        ("segment_alloc", 26 * MiB),
    ]
    assert [segment for segment, _ in layout(simulator)] == ["small", "large", "large"]
    for segment in simulator.snapshot()["segments"]:
        assert segment["address"] % (2 * MiB) == 0


def test_large_segment_size_mb():
    simulator = make(alloc_conf="large_segment_size_mb:32")
    simulator.malloc(3 * MiB)
    assert actions(simulator, "segment_alloc") == [("segment_alloc", 32 * MiB)]


def test_small_requests_pack_into_one_2_mib_segment():
    simulator = make()
    for _ in range(4):
        simulator.malloc(1000)
    assert layout(simulator) == [("small", [(1024, "active_allocated")] * 4 + [(2 * MiB - 4096, "inactive")])]


# --------------------------------------------------------------------- splitting (§4.3)


def test_large_pool_splits_only_when_more_than_1_mib_remains():
    simulator = make()
    simulator.malloc(19 * MiB)  # 20 MiB segment, remainder exactly 1 MiB: kept inside the block
    assert layout(simulator) == [("large", [(20 * MiB, "active_allocated")])]
    simulator = make()
    simulator.malloc(19 * MiB - 512)  # remainder 1 MiB + 512: split off
    assert layout(simulator) == [("large", [(19 * MiB - 512, "active_allocated"), (MiB + 512, "inactive")])]


def test_small_pool_splits_down_to_512_bytes():
    simulator = make()
    simulator.malloc(MiB)
    simulator.malloc(MiB - 512)
    assert layout(simulator) == [
        ("small", [(MiB, "active_allocated"), (MiB - 512, "active_allocated"), (512, "inactive")])
    ]


def test_free_merges_neighbours_and_requested_size_is_recorded():
    simulator = make()
    a = simulator.malloc(4 * MiB + 3)
    b = simulator.malloc(4 * MiB)
    simulator.malloc(4 * MiB)
    simulator.free(a)
    simulator.free(b)
    (segment,) = simulator.snapshot()["segments"]
    assert [(block["size"], block["state"]) for block in segment["blocks"]] == [
        (8 * MiB + 512, "inactive"),
        (4 * MiB, "active_allocated"),
        (8 * MiB - 512, "inactive"),
    ]
    assert segment["requested_size"] == 4 * MiB and segment["allocated_size"] == 4 * MiB
    alloc_sizes = [e["size"] for e in trace(simulator) if e["action"] == "alloc"]
    assert alloc_sizes[0] == 4 * MiB + 3  # the un-rounded request


def test_inactive_split_stats_track_non_releasable_fragments():
    simulator = make()
    a = simulator.malloc(4 * MiB)
    simulator.malloc(4 * MiB)
    stats = simulator.memory_stats()
    assert stats["inactive_split_bytes.all.current"] == 12 * MiB
    simulator.free(a)
    stats = simulator.memory_stats()
    assert stats["inactive_split_bytes.all.current"] == 16 * MiB
    assert stats["inactive_split.all.current"] == 2
    simulator.empty_cache()  # a split segment cannot be released
    assert simulator.memory_stats()["reserved_bytes.all.current"] == 20 * MiB


# ------------------------------------------------------------- best fit per stream (§4.2)


def test_best_fit_takes_the_smallest_block_that_fits():
    simulator = make()
    blocks = [simulator.malloc(size) for size in (3 * MiB, 2 * MiB, 5 * MiB, 2 * MiB)]
    simulator.malloc(2 * MiB)  # keep the tail of the segment allocated
    simulator.free(blocks[0])  # 3 MiB hole
    simulator.free(blocks[2])  # 5 MiB hole
    address = simulator.malloc(2 * MiB + 512)
    assert address == blocks[0]


def test_ties_go_to_the_lowest_address():
    simulator = make()
    first = simulator.malloc(2 * MiB)
    simulator.malloc(2 * MiB)
    second = simulator.malloc(2 * MiB)
    simulator.malloc(2 * MiB)
    simulator.free(second)
    simulator.free(first)
    assert simulator.malloc(2 * MiB) == first


def test_free_blocks_are_reused_on_the_same_stream_only():
    simulator = make()
    address = simulator.malloc(4 * MiB, stream=7)
    simulator.free(address)
    simulator.malloc(4 * MiB, stream=9)
    assert [(e[1]) for e in actions(simulator, "segment_alloc")] == [20 * MiB, 20 * MiB]
    assert simulator.malloc(4 * MiB, stream=7) == address
    streams = sorted(segment["stream"] for segment in simulator.snapshot()["segments"])
    assert streams == [7, 9]


# ---------------------------------------------------------------- oversize blocks (§4.2)


def test_max_split_size_keeps_oversize_blocks_whole_and_apart():
    simulator = make(alloc_conf="max_split_size_mb:100")
    big = simulator.malloc(150 * MiB)
    simulator.free(big)
    simulator.malloc(30 * MiB)  # below max_split_size: never takes the 150 MiB oversize block
    assert [size for _, size in actions(simulator, "segment_alloc")] == [150 * MiB, 30 * MiB]
    assert simulator.malloc(140 * MiB) == big  # 150 < 140 + 20 MiB (max_non_split_rounding_mb)
    segments = {segment["total_size"]: segment for segment in simulator.snapshot()["segments"]}
    assert [(b["size"], b["state"]) for b in segments[150 * MiB]["blocks"]] == [(150 * MiB, "active_allocated")]
    stats = simulator.memory_stats()
    assert stats["oversize_allocations.current"] == 1 and stats["oversize_segments.current"] == 1
    assert stats["max_split_size"] == 100 * MiB


def test_oversize_block_too_much_larger_is_not_used():
    simulator = make(alloc_conf="max_split_size_mb:100")
    simulator.free(simulator.malloc(150 * MiB))
    simulator.malloc(120 * MiB)  # 150 >= 120 + 20: a new segment
    assert [size for _, size in actions(simulator, "segment_alloc")] == [150 * MiB, 120 * MiB]
    simulator = make(alloc_conf="max_split_size_mb:100,max_non_split_rounding_mb:40")
    first = simulator.malloc(150 * MiB)
    simulator.free(first)
    assert simulator.malloc(120 * MiB) == first


def test_oversize_blocks_are_released_before_the_full_flush():
    simulator = make(capacity_bytes=400 * MiB, alloc_conf="max_split_size_mb:100")
    small_cached = simulator.malloc(30 * MiB)
    simulator.free(simulator.malloc(250 * MiB))
    simulator.free(small_cached)
    simulator.malloc(180 * MiB)  # 250 >= 180 + 20: not reusable, but released to make room
    assert actions(simulator, "segment_free") == [("segment_free", 250 * MiB)]
    assert simulator.memory_stats()["num_alloc_retries"] == 0


def test_oversize_release_falls_back_to_the_full_flush():
    simulator = make(capacity_bytes=400 * MiB, alloc_conf="max_split_size_mb:100")
    small_cached = simulator.malloc(30 * MiB)
    simulator.free(simulator.malloc(150 * MiB))
    simulator.free(small_cached)
    simulator.malloc(300 * MiB)  # the oversize block alone is not enough: flush everything, retry
    assert actions(simulator, "segment_free") == [("segment_free", 150 * MiB), ("segment_free", 30 * MiB)]
    assert simulator.memory_stats()["num_alloc_retries"] == 1


# ------------------------------------------------------------- flush and retry, OOM (§4.4)


def test_flush_and_retry_releases_cached_segments_then_allocates():
    simulator = make(capacity_bytes=100 * MiB)
    a = simulator.malloc(40 * MiB)
    b = simulator.malloc(40 * MiB)
    simulator.free(a)
    simulator.free(b)
    simulator.malloc(60 * MiB)
    assert actions(simulator, "segment_alloc", "segment_free")[-3:] == [
        ("segment_free", 40 * MiB),
        ("segment_free", 40 * MiB),
        ("segment_alloc", 60 * MiB),
    ]
    stats = simulator.memory_stats()
    assert stats["num_alloc_retries"] == 1 and stats["num_ooms"] == 0 and stats["num_sync_all_streams"] == 1


def test_oom_after_the_flush_records_the_event_and_the_message():
    simulator = make(capacity_bytes=8 * GiB, context_bytes=500 * MiB, other_process_bytes=GiB, other_process_pid=4321)
    kept = simulator.malloc(4 * GiB)
    simulator.free(simulator.malloc(100 * MiB))
    with pytest.raises(SimulatedOutOfMemory) as caught:
        simulator.malloc(3 * GiB)
    error = caught.value
    events = trace(simulator)
    assert [e["action"] for e in events[-2:]] == ["segment_free", "oom"]
    oom = events[-1]
    assert "addr" not in oom and oom["size"] == 3 * GiB
    free_bytes = 8 * GiB - 500 * MiB - GiB - 4 * GiB
    assert oom["device_free"] == free_bytes == error.device_free_bytes
    assert (error.request_bytes, error.alloc_bytes, error.device_total_bytes) == (3 * GiB, 3 * GiB, 8 * GiB)
    assert str(error) == (
        "CUDA out of memory. Tried to allocate 3.00 GiB. GPU 0 has a total capacity of 8.00 GiB of which "
        "2.51 GiB is free. Including non-PyTorch memory, this process has 4.49 GiB memory in use. "
        "Process 4321 has 1024.00 MiB memory in use. Of the allocated memory 4.00 GiB is allocated by "
        "PyTorch, and 0 bytes is reserved by PyTorch but unallocated. If reserved but unallocated memory "
        "is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  "
        "See documentation for Memory Management  (https://docs.pytorch.org/docs/stable/notes/cuda.html"
        "#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)"
    )
    stats = simulator.memory_stats()
    assert stats["num_ooms"] == 1 and stats["num_alloc_retries"] == 1
    assert kept in {b["address"] for s in simulator.snapshot()["segments"] for b in s["blocks"]}


def test_tried_to_allocate_is_segment_sized_while_the_event_holds_the_rounded_request():
    simulator = make(capacity_bytes=10 * MiB)
    with pytest.raises(SimulatedOutOfMemory) as caught:
        simulator.malloc(3 * MiB + 1)
    assert caught.value.request_bytes == 3 * MiB + 512
    assert caught.value.alloc_bytes == 20 * MiB
    assert "Tried to allocate 20.00 MiB." in str(caught.value)
    assert trace(simulator)[-1]["size"] == 3 * MiB + 512


def test_fragmented_device_reports_reserved_but_unallocated():
    simulator = make(capacity_bytes=60 * MiB)
    blocks = [simulator.malloc(4 * MiB) for _ in range(10)]  # two 20 MiB segments, split
    for address in blocks[::2]:
        simulator.free(address)
    with pytest.raises(SimulatedOutOfMemory) as caught:
        simulator.malloc(25 * MiB)
    message = str(caught.value)
    assert "Of the allocated memory 20.00 MiB is allocated by PyTorch, and 20.00 MiB is reserved" in message


def test_memory_fraction_limits_cuda_malloc_and_shows_allowed():
    simulator = make(capacity_bytes=GiB, alloc_conf="per_process_memory_fraction:0.5")
    simulator.malloc(400 * MiB)
    with pytest.raises(SimulatedOutOfMemory) as caught:
        simulator.malloc(200 * MiB)
    assert "512.00 MiB allowed; Of the allocated memory" in str(caught.value)
    assert caught.value.device_total_bytes == 512 * MiB


def test_garbage_collection_frees_old_cached_blocks_before_cuda_malloc():
    conf = "per_process_memory_fraction:0.5,garbage_collection_threshold:0.5"
    simulator = make(capacity_bytes=GiB, alloc_conf=conf)  # allowed 512 MiB, collect above 256 MiB
    simulator.free(simulator.malloc(200 * MiB))
    simulator.malloc(100 * MiB, stream=1)  # other stream: no cached block fits; 200 MiB <= 256 MiB
    assert actions(simulator, "segment_free") == []
    simulator.malloc(100 * MiB, stream=2)  # 300 MiB reserved > 256 MiB: the old block is collected
    assert actions(simulator, "segment_free") == [("segment_free", 200 * MiB)]
    assert simulator.memory_stats()["num_alloc_retries"] == 0


# ------------------------------------------------------------ expandable segments (§4.7)


def test_expandable_segments_map_pages_and_grow_one_segment():
    simulator = make(alloc_conf="expandable_segments:True")
    a = simulator.malloc(5 * MiB)
    b = simulator.malloc(30 * MiB)
    simulator.malloc(100)
    assert actions(simulator, "segment_map", "segment_alloc") == [
        ("segment_map", 20 * MiB),
        ("segment_map", 20 * MiB),
        ("segment_map", 2 * MiB),
    ]
    segments = simulator.snapshot()["segments"]
    assert [(s["segment_type"], s["total_size"], s["is_expandable"]) for s in segments] == [
        ("large", 40 * MiB, True),
        ("small", 2 * MiB, True),
    ]
    assert b == a + 5 * MiB  # one contiguous mapped range


def test_expandable_segments_unmap_free_pages_and_report_ranges():
    simulator = make(alloc_conf="expandable_segments:True")
    blocks = [simulator.malloc(20 * MiB) for _ in range(3)]
    simulator.free(blocks[1])
    simulator.empty_cache()
    assert actions(simulator, "segment_unmap") == [("segment_unmap", 20 * MiB)]
    segments = simulator.snapshot()["segments"]
    assert [(s["address"], s["total_size"]) for s in segments] == [(blocks[0], 20 * MiB), (blocks[2], 20 * MiB)]
    assert simulator.memory_stats()["reserved_bytes.all.current"] == 40 * MiB
    simulator.malloc(20 * MiB)  # the hole is mapped again, lowest address first
    assert [s["total_size"] for s in simulator.snapshot()["segments"]] == [60 * MiB]


def test_expandable_segment_released_entirely_when_empty():
    simulator = make(alloc_conf="expandable_segments:True")
    simulator.free(simulator.malloc(50 * MiB))
    simulator.empty_cache()
    assert simulator.snapshot()["segments"] == []
    assert actions(simulator, "segment_unmap") == [("segment_unmap", 60 * MiB)]
    assert simulator.memory_stats()["reserved_bytes.all.current"] == 0


def test_expandable_oom_after_unmapping():
    simulator = make(capacity_bytes=100 * MiB, alloc_conf="expandable_segments:True")
    simulator.malloc(40 * MiB)
    simulator.free(simulator.malloc(40 * MiB))
    with pytest.raises(SimulatedOutOfMemory):
        simulator.malloc(70 * MiB)
    events = [e["action"] for e in trace(simulator)]
    assert events[-2:] == ["segment_unmap", "oom"]


# ------------------------------------------------------------------- record_stream (§4.5)


def test_record_stream_defers_the_free_until_the_next_malloc():
    simulator = make()
    address = simulator.malloc(4 * MiB)
    simulator.record_stream(address, 5)
    simulator.free(address)
    states = [b["state"] for s in simulator.snapshot()["segments"] for b in s["blocks"]]
    assert states[0] == "active_pending_free"
    stats = simulator.memory_stats()
    assert stats["allocated_bytes.all.current"] == 0 and stats["active_bytes.all.current"] == 4 * MiB
    simulator.malloc(1000)
    # the snapshot above left its marker; the deferred free completes inside the next malloc
    assert [e["action"] for e in trace(simulator)][-4:] == ["snapshot", "free_completed", "segment_alloc", "alloc"]


# ---------------------------------------------------------------- formats (§1, §3, §4.9)


def test_snapshot_has_torch_2_13_key_sets():
    frames = [{"filename": "train.py", "line": 3, "name": "step"}]
    simulator = make()
    simulator.free(simulator.malloc(4 * MiB, frames=frames), frames=frames)
    simulator.malloc(100, frames=frames)
    simulator.annotate("Optimizer.step#Adam.step", "START")
    snapshot = simulator.snapshot()
    assert set(snapshot) == {"segments", "device_traces", "allocator_settings", "external_annotations"}
    for segment in snapshot["segments"]:
        assert set(segment) == {
            "device",
            "address",
            "total_size",
            "allocated_size",
            "active_size",
            "requested_size",
            "stream",
            "segment_type",
            "segment_pool_id",
            "is_expandable",
            "frames",
            "blocks",
        }
        assert segment["segment_pool_id"] == (0, 0)
        for block in segment["blocks"]:
            assert set(block) == {"address", "size", "requested_size", "state", "frames"}
    for event in snapshot["device_traces"][0]:
        assert set(event) - {"frames"} == {
            "action",
            "addr",
            "size",
            "stream",
            "time_us",
            "compile_context",
            "user_metadata",
            "pool_id",
        }
    (annotation,) = snapshot["external_annotations"]
    assert annotation == {
        "name": "Optimizer.step#Adam.step",
        "stage": "START",
        "device": 0,
        "time_us": annotation["time_us"],
    }


def test_frames_are_shared_and_only_on_events_that_have_them():
    frames = [{"filename": "train.py", "line": 3, "name": "step"}]
    simulator = make()
    address = simulator.malloc(4 * MiB, frames=frames)
    simulator.malloc(4 * MiB)  # no frames passed: the event carries no frames key
    events = trace(simulator)
    assert events[1]["frames"] is frames and "frames" not in events[2]
    (segment,) = simulator.snapshot()["segments"]
    # torch keeps the segment's stack on the block that was split, not on the new head block, so a
    # split segment reports no stack (every multi-block segment in the real corpus has frames == [])
    assert segment["frames"] == []
    assert segment["blocks"][0]["frames"] is frames and segment["blocks"][1]["frames"] == []
    whole = make()
    whole.malloc(30 * MiB, frames=frames)
    assert whole.snapshot()["segments"][0]["frames"] is frames
    simulator.free(address)
    assert simulator.snapshot()["segments"][0]["blocks"][0]["frames"] == []


def test_context_levels():
    frames = [{"filename": "train.py", "line": 3, "name": "step"}]
    simulator = make()
    simulator.record_history(True, context="state")
    simulator.malloc(4 * MiB, frames=frames)
    assert all("frames" not in e for e in trace(simulator))
    assert simulator.snapshot()["segments"][0]["blocks"][0]["frames"] is frames
    simulator.record_history(False)
    assert trace(simulator) == []
    simulator.malloc(4 * MiB, frames=frames)
    assert trace(simulator) == []


def test_trace_ring_keeps_the_last_max_entries_with_increasing_time():
    simulator = make()
    simulator.record_history(True, max_entries=5)
    for _ in range(10):
        simulator.free(simulator.malloc(1000))
    events = trace(simulator)
    assert len(events) == 5 and events[-1]["action"] == "free_completed"
    times = [e["time_us"] for e in events]
    assert times == sorted(set(times))


def test_clock_is_made_strictly_increasing():
    simulator = CachingAllocatorSimulator(GiB, clock_us=lambda: 42)
    simulator.record_history(True)
    simulator.free(simulator.malloc(1000))
    assert [e["time_us"] for e in trace(simulator)] == [42, 43, 44, 45]


def test_memory_stats_keys_and_invariants():
    simulator = make()
    kept = [simulator.malloc(size) for size in (100, 3 * MiB, 30 * MiB, 700)]
    simulator.free(kept[1])
    stats = simulator.memory_stats()
    assert list(stats) == sorted(stats)
    for name in ("allocated_bytes", "reserved_bytes", "active_bytes", "requested_bytes", "segment", "allocation"):
        for pool in ("all", "small_pool", "large_pool"):
            for field in ("current", "peak", "allocated", "freed"):
                assert f"{name}.{pool}.{field}" in stats
    counters = ("num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc", "num_device_free")
    for key in counters + ("max_split_size",):
        assert key in stats
    segments = simulator.snapshot()["segments"]
    assert stats["reserved_bytes.all.current"] == sum(s["total_size"] for s in segments)
    assert stats["allocated_bytes.all.current"] == sum(s["allocated_size"] for s in segments)
    assert stats["allocated_bytes.small_pool.current"] == 512 + 1024
    assert stats["requested_bytes.all.current"] == 100 + 30 * MiB + 700
    assert stats["allocated_bytes.all.peak"] == 512 + 3 * MiB + 30 * MiB + 1024
    assert stats["allocated_bytes.all.freed"] == 3 * MiB


def test_mem_get_info_subtracts_everything_outside_the_cache():
    simulator = make(capacity_bytes=GiB, context_bytes=100 * MiB, other_process_bytes=200 * MiB)
    simulator.malloc(50 * MiB)
    assert simulator.mem_get_info() == (GiB - 350 * MiB, GiB)


def test_format_size():
    assert [format_size(n) for n in (1024, 1025, MiB, MiB + 1, GiB, GiB + 1)] == [
        "1024 bytes",
        "1.00 KiB",
        "1024.00 KiB",
        "1.00 MiB",
        "1024.00 MiB",
        "1.00 GiB",
    ]


def test_invalid_free_is_refused():
    simulator = make()
    address = simulator.malloc(1000)
    simulator.free(address)
    with pytest.raises(ValueError, match=re.escape(f"{address:#x}")):
        simulator.free(address)


def test_the_simulator_is_pure_python():
    import subprocess
    import sys

    code = (
        "import sys, oomdoctor.rehearse, oomdoctor.rehearse.allocator_fidelity; "
        "print(sorted(m for m in ('torch', 'numpy', 'rich', 'textual') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
