"""Figures that are bounds or estimates say so where they are printed (docs/definitions.md, "The peak").

1. The peak counts a block freed before the dump at its rounded request; the allocator may have left
   an unsplit remainder in it that the trace does not record, so torch's own peak
   (max_memory_allocated) may be higher. The JSON carries how high it may be
   (`replay.torch_peak_at_most_bytes`); where that is 1% of the peak or more, "Not determined from
   this file" says so and why.
2. At a moment the dump postdates (allocations or frees after it), cached free, releasable,
   fragments and the free blocks of the pools come from the layout rebuilt back from the dump:
   their lines say they are an estimate; at a moment the dump holds exactly they do not.
"""

from __future__ import annotations

import dataclasses
import io
import json
import pickle
from pathlib import Path
from typing import Any

from oomdoctor.analysis import analyse
from oomdoctor.analysis.results import UnknownKind
from oomdoctor.dump_metadata import MemoryStats
from oomdoctor.load import load
from oomdoctor.model import TraceEvent
from oomdoctor.pipeline import render_report
from oomdoctor.tui.content import fragmentation_lines, memory_lines
from oomdoctor.units import human_size
from tests.builders import FORWARD_STACK, SETUP_STACK, USER_STACK, MiB, Sim

BASE = 0x7F0000000000
UNSIZED = (UnknownKind.PEAK_UNSIZED, UnknownKind.PEAK_UNSIZED_DEFAULTS)


def _raw(
    trace: list[dict[str, Any]],
    *,
    live: dict[int, int] | None = None,
    segment_bytes: int = 40 * MiB,
    settings: dict[str, Any] | None = None,
    expandable: bool = False,
) -> Any:
    """A snapshot dict in torch's shape: one segment at BASE holding `live` (offset -> bytes) at the
    dump, free elsewhere; the trace's addresses are offsets from BASE."""
    blocks, cursor = [], 0
    for offset, size in sorted((live or {}).items()):
        if offset > cursor:
            blocks.append({"address": BASE + cursor, "size": offset - cursor, "requested_size": 0, "state": "inactive"})
        blocks.append({"address": BASE + offset, "size": size, "requested_size": size, "state": "active_allocated"})
        cursor = offset + size
    if cursor < segment_bytes:
        blocks.append(
            {"address": BASE + cursor, "size": segment_bytes - cursor, "requested_size": 0, "state": "inactive"}
        )
    segment = {
        "device": 0,
        "address": BASE,
        "total_size": segment_bytes,
        "stream": 0,
        "segment_type": "large",
        "segment_pool_id": (0, 0),
        "is_expandable": expandable,
        "frames": [],
        "blocks": blocks,
    }
    events = []
    for i, e in enumerate(trace):
        event = {"stream": 0, "time_us": 1000 + i, **e}
        if "addr" in event:
            event["addr"] = BASE + event["addr"]
        events.append(event)
    raw: dict[str, Any] = {"segments": [segment], "device_traces": [events]}
    if settings is not None:
        raw["allocator_settings"] = settings
    return raw


def _snapshot(raw: Any):
    return load(io.BytesIO(pickle.dumps(raw, protocol=4)))


def _alloc_free(*blocks: tuple[int, int]) -> list[dict[str, Any]]:
    """Each (offset, bytes) allocated in order, then all freed."""
    trace = [{"action": "alloc", "addr": offset, "size": size} for offset, size in blocks]
    for offset, size in blocks:
        trace.append({"action": "free_requested", "addr": offset, "size": size})
        trace.append({"action": "free_completed", "addr": offset, "size": size})
    return trace


def _bound(raw: Any) -> int:
    replay = analyse(_snapshot(raw)).replay
    assert replay.torch_peak_at_most_bytes is not None
    return replay.torch_peak_at_most_bytes - replay.peak_allocated_bytes


# ---- 1. how much higher torch's own peak may be ------------------------------------------------------


def test_each_large_block_freed_before_the_dump_may_hold_up_to_1_mib_more():
    # two 3 MiB blocks far apart: either may have kept an unsplit remainder of up to 1 MiB
    assert _bound(_raw(_alloc_free((0, 3 * MiB), (10 * MiB, 3 * MiB)))) == 2 * MiB


def test_a_block_another_began_right_at_the_end_of_has_no_remainder():
    # the second block starts where the first one's 3 MiB end: the first had none; the second may
    assert _bound(_raw(_alloc_free((0, 3 * MiB), (3 * MiB, 3 * MiB)))) == 1 * MiB
    # the neighbour allocated first pins the later block just the same
    assert _bound(_raw(_alloc_free((3 * MiB, 3 * MiB), (0, 3 * MiB)))) == 1 * MiB


def test_no_remainder_in_the_small_pool_with_expandable_segments_or_in_a_block_the_dump_holds():
    assert _bound(_raw(_alloc_free((0, 512 * 1024), (2 * MiB, 1 * MiB)))) == 0  # small pool
    settings = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "expandable_segments": True}
    assert _bound(_raw(_alloc_free((0, 3 * MiB)), settings=settings, expandable=True)) == 0
    kept = [{"action": "alloc", "addr": 0, "size": 3 * MiB}]  # live at the dump: its exact size there
    assert _bound(_raw(kept, live={0: 3 * MiB})) == 0


def test_a_block_above_max_split_size_may_hold_up_to_max_non_split_rounding():
    settings = {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:20", "max_split_size": 20 * MiB}
    bound = _bound(_raw(_alloc_free((0, 30 * MiB)), settings=settings, segment_bytes=60 * MiB))
    assert bound == 20 * MiB - 512  # never split; a cached block is taken only when < 20 MiB larger


def test_the_bound_is_the_most_over_the_trace_not_only_at_the_peak():
    # the peak (8 MiB, one block the dump holds) has nothing unsized; an earlier moment with
    # three 2.5 MiB blocks (7.5 MiB) may have held 3 MiB more: torch's peak is at most the peak
    # plus the most that may be unsized at once, 11 MiB (it cannot be more than 10.5 MiB, a bound
    # a second walk over every event would give)
    small = 5 * MiB // 2
    trace = _alloc_free((0, small), (10 * MiB, small), (20 * MiB, small))
    trace.append({"action": "alloc", "addr": 30 * MiB, "size": 8 * MiB})
    raw = _raw(trace, live={30 * MiB: 8 * MiB})
    replay = analyse(_snapshot(raw)).replay
    assert replay.peak_allocated_bytes == 8 * MiB
    assert replay.torch_peak_at_most_bytes == 8 * MiB + 3 * MiB


def _forward_then_release(activations: int = 3):
    """Parameters from before the trace; one forward's activations, each with an unsplit remainder
    the trace does not record, make the peak and are freed."""
    sim = Sim()
    sim.alloc(256 * MiB, SETUP_STACK)
    sim.start_recording()
    sim.marker("forward", "start")
    made = [sim.alloc(3 * MiB, FORWARD_STACK, remainder=768 * 1024) for _ in range(activations)]
    sim.marker("forward", "end")
    for address in made:
        sim.free(address)
    sim.alloc(2 * MiB, USER_STACK)
    return sim.snapshot(registry=False)


def test_not_determined_says_how_much_higher_torchs_peak_may_be():
    snapshot = _forward_then_release()
    analysis = analyse(snapshot)
    peak = 256 * MiB + 3 * 3 * MiB
    assert analysis.replay.peak_allocated_bytes == peak
    assert analysis.replay.torch_peak_at_most_bytes == peak + 3 * MiB  # torch's was peak + 3 x 768 KiB
    # the snapshot records no allocator settings (as torch < 2.3): the bound is the defaults'
    (unknown,) = [u for u in analysis.unknowns if u.kind in UNSIZED]
    assert (unknown.bytes, unknown.count) == (3 * MiB, 3)
    words = f"how much higher torch's own peak (max_memory_allocated) is: up to {human_size(3 * MiB)} more"
    for fmt in ("text", "md"):
        assert words in render_report(snapshot, fmt, source="dump.pickle").decode(), fmt
    data = json.loads(render_report(snapshot, "json", source="dump.pickle"))
    assert data["replay"]["torch_peak_at_most_bytes"] == peak + 3 * MiB
    assert any(line.startswith(words) for line in data["unknowns"])


def test_a_bound_under_one_percent_of_the_peak_is_in_the_json_alone():
    snapshot = _forward_then_release(activations=2)
    analysis = analyse(snapshot)
    # 2 MiB of 262 MiB: under 1%
    assert analysis.replay.torch_peak_at_most_bytes == analysis.replay.peak_allocated_bytes + 2 * MiB
    assert not [u for u in analysis.unknowns if u.kind in UNSIZED]
    assert "max_memory_allocated" not in render_report(snapshot, "text", source="dump.pickle").decode()


def test_without_a_trace_there_is_no_bound():
    raw = _raw([], live={0: 3 * MiB})
    raw["device_traces"] = []
    assert analyse(_snapshot(raw)).replay.torch_peak_at_most_bytes is None


# ---- 2. figures of a layout rebuilt back from the dump ------------------------------------------------


def _oom_then(more: bool):
    """An OOM with free blocks in the cache; with `more`, the run allocates and frees after it, so
    the dump postdates the OOM."""
    sim = Sim(total_bytes=64 * MiB)
    sim.alloc(24 * MiB, USER_STACK)
    spare = sim.alloc(12 * MiB, USER_STACK)
    sim.free(spare)
    sim.events.append(TraceEvent("oom", 0, 40 * MiB, 0, USER_STACK, sim._tick(), device_free=4 * MiB))
    if more:
        sim.free(sim.alloc(2 * MiB, USER_STACK))
    return sim.snapshot(registry=False)


def test_the_layouts_figures_at_a_moment_the_dump_postdates_say_they_are_an_estimate():
    snapshot = _oom_then(more=True)
    text = render_report(snapshot, "text", source="dump.pickle").decode()
    md = render_report(snapshot, "md", source="dump.pickle").decode()
    analysis = analyse(snapshot)
    assert analysis.replay.target_kind == "oom" and analysis.replay.events_after_target
    (cached,) = [line for line in text.splitlines() if line.strip().startswith("cached, free")]
    assert "(an estimate, as laid out: releasable " in cached
    (pool,) = [line for line in text.splitlines() if "pool on this stream:" in line]
    assert pool.endswith("(an estimate, as laid out)")
    for label in ("cached, free", "releasable", "fragments"):
        assert f"{label} (an estimate, as laid out) |" in md, label
    assert "free cached blocks: " in md and "(an estimate, as laid out)\n- free in the" in md
    (app_cached,) = [line for line in memory_lines(analysis) if line.strip().startswith("cached, free")]
    assert "(an estimate, as laid out: releasable " in app_cached
    assert all("(an estimate, as laid out)" in line for line in fragmentation_lines(analysis))
    (app_missing,) = [line for line in memory_lines(analysis) if line.startswith("missing")]
    assert app_missing.endswith("(request minus what it could have had; an estimate, as laid out)")
    # exact lines stay as they were
    for line in text.splitlines():
        if line.strip().startswith(("reserved by PyTorch", "allocated", "failed request")):
            assert "estimate" not in line, line


def test_the_layouts_figures_at_a_moment_the_dump_holds_are_not_called_estimates():
    snapshot = _oom_then(more=False)
    analysis = analyse(snapshot)
    assert analysis.replay.target_kind == "oom" and not analysis.replay.events_after_target
    for fmt in ("text", "md"):
        assert "an estimate" not in render_report(snapshot, fmt, source="dump.pickle").decode(), fmt
    assert not any("estimate" in line for line in memory_lines(analysis) + fragmentation_lines(analysis))


def test_where_the_metadata_records_torchs_own_peak_that_is_the_figure():
    """Capture records torch's memory_stats at the dump: with the whole run in the trace, its peak
    is torch's peak over the trace, so nothing about it is left unknown."""
    sim = Sim()
    made = [sim.alloc(3 * MiB, FORWARD_STACK, remainder=768 * 1024) for _ in range(3)]
    for address in made:
        sim.free(address)
    sim.alloc(2 * MiB, USER_STACK)
    snapshot = sim.snapshot(registry=False)
    assert analyse(snapshot).replay.torch_peak_at_most_bytes == 9 * MiB + 3 * MiB  # the bound alone
    torch_peak = 9 * MiB + 3 * 768 * 1024
    stats = MemoryStats(peak_allocated_bytes=torch_peak)
    recorded = dataclasses.replace(snapshot, oomdoctor=dataclasses.replace(snapshot.oomdoctor, memory_stats=stats))
    analysis = analyse(recorded)
    assert analysis.replay.peak_allocated_bytes == 9 * MiB
    assert analysis.replay.torch_peak_at_most_bytes == torch_peak
    assert not [u for u in analysis.unknowns if u.kind in UNSIZED]
    # a recorded figure outside what the file allows (a reset peak, say) is not taken
    low = MemoryStats(peak_allocated_bytes=8 * MiB)
    reset = dataclasses.replace(snapshot, oomdoctor=dataclasses.replace(snapshot.oomdoctor, memory_stats=low))
    assert analyse(reset).replay.torch_peak_at_most_bytes == 12 * MiB


def _fragmented_then(more: bool):
    """Four 20 MiB segments, each a live 4 MiB block and 16 MiB free: a 30 MiB request fails with
    64 MiB free in pieces (fragmentation). With `more`, the run borrows a free piece after the OOM
    and gives it back, so the dump postdates the OOM and its layout is rebuilt."""
    from oomdoctor.model import ACTIVE_ALLOCATED, INACTIVE, Block, DeviceTrace, Segment, Snapshot

    segments = []
    for i in range(4):
        address = BASE + i * 64 * MiB
        blocks = (Block(address, 4 * MiB, 4 * MiB, ACTIVE_ALLOCATED), Block(address + 4 * MiB, 16 * MiB, 0, INACTIVE))
        segments.append(Segment(0, address, 20 * MiB, 0, "large", blocks))
    events = [TraceEvent("oom", 0, 30 * MiB, 0, USER_STACK, 1, device_free=8 * MiB)]
    if more:
        piece = BASE + 4 * MiB
        events += [
            TraceEvent("alloc", piece, 2 * MiB, 0, USER_STACK, 2),
            TraceEvent("free_requested", piece, 2 * MiB, 0, USER_STACK, 3),
            TraceEvent("free_completed", piece, 2 * MiB, 0, USER_STACK, 4),
        ]
    return Snapshot(segments=tuple(segments), traces=(DeviceTrace.from_events(0, events),))


def test_fragmentation_read_from_a_rebuilt_layout_says_it_is_an_estimate():
    """'would fit if contiguous', the fragmentation verdict's sentence and its evidence read the free
    blocks: at an OOM the dump postdates they are the rebuilt layout's, and say so (text, Markdown,
    JSON, the app); at an OOM the dump holds they do not."""
    snapshot = _fragmented_then(more=True)
    analysis = analyse(snapshot)
    assert analysis.verdict == "fragmentation" and analysis.replay.events_after_target
    text = render_report(snapshot, "text", source="dump.pickle").decode()
    md = render_report(snapshot, "md", source="dump.pickle").decode()
    report = json.loads(render_report(snapshot, "json", source="dump.pickle"))
    assert "would fit if contiguous: yes (an estimate, as laid out); expandable segments" in text
    assert "- would fit if contiguous: yes (an estimate, as laid out)\n" in md
    assert "request fits if contiguous: yes (an estimate, as laid out);" in "\n".join(fragmentation_lines(analysis))
    sentence = "but in pieces: the largest was 16.00 MiB (an estimate, as laid out: the dump was written after the OOM"
    assert sentence in text and sentence in md and sentence in report["summary"]
    assert "free cached bytes usable for the request (large pool, same stream; an estimate, as laid out): " in text
    assert "largest usable free block (an estimate, as laid out): " in text
    assert report["fragmentation"]["estimated_as_laid_out"] is True
    assert "missing_bytes" in report["accounting"]["estimated_as_laid_out"]

    exact = _fragmented_then(more=False)
    held = analyse(exact)
    assert held.verdict == "fragmentation" and not held.replay.events_after_target
    for fmt in ("text", "md", "json"):
        body = render_report(exact, fmt, source="dump.pickle").decode()
        assert "an estimate" not in body and "estimated_as_laid_out" not in body, fmt
    assert not any("estimate" in line for line in fragmentation_lines(held))


# ---- 3. the bound's assumption where the allocator's settings are not recorded --------------------------


def test_where_the_settings_are_not_recorded_the_bound_says_it_assumes_the_defaults():
    """Before torch 2.3 a snapshot records no allocator settings. A max_split_size_mb leaves up to
    20 MiB unsplit in a block at or above it, and roundup_power2_divisions rounds a request up past
    what the peak's rule counts, so the bound (up to 1 MiB per large block) holds for the defaults
    only: the report says so, and the JSON flags it. With the settings recorded it is the settings'
    bound and assumes nothing."""
    trace = _alloc_free((0, 30 * MiB), (40 * MiB, 30 * MiB))
    unrecorded = _snapshot(_raw(trace, segment_bytes=80 * MiB))
    analysis = analyse(unrecorded)
    assert analysis.replay.torch_peak_at_most_bytes == analysis.replay.peak_allocated_bytes + 2 * MiB
    assert analysis.replay.torch_peak_bound_assumes_defaults
    (unknown,) = [u for u in analysis.unknowns if u.kind in UNSIZED]
    assert unknown.kind == UnknownKind.PEAK_UNSIZED_DEFAULTS
    said = "up to 2.00 MiB more with the allocator's default settings, as the peak counts"
    assumption = "this torch does not record its allocator settings, and with max_split_size_mb or roundup_power2_divisions set it may be more"
    for fmt in ("text", "md"):
        body = render_report(unrecorded, fmt, source="dump.pickle").decode()
        assert said in body and assumption in body, fmt
    data = json.loads(render_report(unrecorded, "json", source="dump.pickle"))
    assert data["replay"]["torch_peak_bound_assumes_defaults"] is True
    assert any(said in line and assumption in line for line in data["unknowns"])

    settings = {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:20", "max_split_size": 20 * MiB}
    recorded = _snapshot(_raw(trace, segment_bytes=80 * MiB, settings=settings))
    replay = analyse(recorded).replay
    assert replay.torch_peak_at_most_bytes == replay.peak_allocated_bytes + 2 * (20 * MiB - 512)
    assert not replay.torch_peak_bound_assumes_defaults
    body = render_report(recorded, "json", source="dump.pickle").decode()
    assert "torch_peak_bound_assumes_defaults" not in body and "default settings" not in body


FRAGMENTATION_DUMP = (
    Path(__file__).resolve().parent.parent / "fixtures" / "dumps" / "fragmentation-retrieval-class-scores.pickle"
)


def test_would_fit_if_contiguous_with_no_answer_reads_unknown_in_the_text_report():
    """A pool known with no answer whether the request would fit contiguous: the text report says
    unknown, as the app does, never "no" (Markdown prints "-")."""
    from oomdoctor.views import text_report

    analysis = analyse(load(str(FRAGMENTATION_DUMP)))
    assert analysis.fragmentation.request_pool is not None
    unanswered = dataclasses.replace(
        analysis, fragmentation=dataclasses.replace(analysis.fragmentation, would_fit_if_contiguous=None)
    )
    assert "would fit if contiguous: unknown" in text_report.render(unanswered)
    answered = {True: "yes", False: "no"}[analysis.fragmentation.would_fit_if_contiguous]
    assert f"would fit if contiguous: {answered}" in text_report.render(analysis)
