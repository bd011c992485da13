"""Every real snapshot in the corpus loads, and `info` agrees with torch's own segsum on its bytes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from oomdoctor.cli import main
from oomdoctor.load import load, load_raw
from oomdoctor.model import ACTIVE_ALLOCATED
from tests.conftest import CORPUS, corpus_params

memory_viz = pytest.importorskip("torch.cuda._memory_viz")


def _html_exports() -> list:
    if CORPUS is None:
        return [pytest.param(None, marks=pytest.mark.skip(reason="corpus not found"))]
    return [pytest.param(p, id=p.name) for p in sorted((CORPUS / "other_formats").glob("*.html"))]


def _segsum_totals(raw, monkeypatch) -> dict[str, int]:
    """segsum's total_reserved, total_allocated and total_free, to the byte."""
    monkeypatch.setattr(memory_viz, "_format_size", lambda num: f"{int(num)}B")
    data = {"segments": raw, "traces": []} if isinstance(raw, list) else raw  # as _memory_viz._read
    text = memory_viz.segsum(data)
    found = dict(re.findall(r"^(total_reserved|total_allocated|total_free): (\d+)B", text, re.MULTILINE))
    return {key: int(value) for key, value in found.items()}


def _info_json(path: Path, capsys) -> dict:
    assert main(["info", str(path), "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("path", corpus_params() + _html_exports())
def test_info_bytes_equal_segsum(path: Path, capsys, monkeypatch) -> None:
    info = _info_json(path, capsys)
    expected = _segsum_totals(load_raw(path), monkeypatch)
    assert info["reserved_bytes"] == expected["total_reserved"]
    assert info["requested_bytes"] == expected["total_allocated"]
    # segsum counts the rounding inside allocated blocks as free
    assert info["free_bytes"] + info["rounding_bytes"] == expected["total_free"]
    assert info["allocated_bytes"] + info["free_bytes"] == info["reserved_bytes"]


@pytest.mark.parametrize("path", corpus_params())
def test_corpus_snapshot_matches_its_raw_data(path: Path) -> None:
    raw = load_raw(path)
    snapshot = load(path)
    raw_segments = raw if isinstance(raw, list) else raw["segments"]
    raw_traces = [] if isinstance(raw, list) else raw["device_traces"]
    assert len(snapshot.segments) == len(raw_segments)
    assert [len(t) for t in snapshot.traces] == [len(t) for t in raw_traces]
    for segment, raw_segment in zip(snapshot.segments, raw_segments):
        assert segment.total_size == raw_segment["total_size"] == sum(b.size for b in segment.blocks)
        assert segment.allocated_bytes == raw_segment["allocated_size"]
        # blocks tile their segment: addresses are contiguous
        address = segment.address
        for block in segment.blocks:
            assert block.address == address
            address += block.size
    for trace, raw_trace in zip(snapshot.traces, raw_traces):
        for index in range(0, len(trace), max(1, len(trace) // 50)):
            event, raw_event = trace[index], raw_trace[index]
            assert event.action == raw_event["action"]
            assert event.size == raw_event["size"]
            assert event.addr == raw_event.get("addr", 0)
            assert event.time_us == raw_event.get("time_us")
            assert [(f.filename, f.line, f.name) for f in event.frames] == [
                (f["filename"], f["line"], f["name"]) for f in raw_event.get("frames", [])
            ]


def test_html_export_holds_the_same_snapshot_as_its_pickle(corpus_dir: Path) -> None:
    html = load(corpus_dir / "other_formats" / "memory_viz_html_export__silmont2000__bf16.html")
    pickled = load(corpus_dir / "snapshots" / "cs336_pair_pickle__silmont2000__memory_forward_bf16_128.pickle")
    assert html.container == "html+pickle-protocol-4"
    assert html.segments == pickled.segments
    assert list(html.traces[0]) == list(pickled.traces[0])


def test_legacy_torch20_history_blocks(corpus_dir: Path) -> None:
    snapshot = load(corpus_dir / "snapshots" / "legacy_torch20_block_history__yiyi_llm_inference__oom_snapshot.pickle")
    assert snapshot.source_format == "legacy-history"
    assert snapshot.torch_version_hint == "2.0"
    allocated = [b for s in snapshot.segments for b in s.blocks if b.state == ACTIVE_ALLOCATED]
    assert allocated and all(b.frames for b in allocated)  # stacks come from history[0]
    assert snapshot.traces[0][0].time_us is None


def test_real_oom_events_keep_device_free(corpus_dir: Path) -> None:
    snapshot = load(
        corpus_dir / "snapshots" / "multi_device_expandable__constructor_sun_code_location__memory_snapshot.pickle"
    )
    trace = snapshot.traces[1]
    (index,) = [i for i, action in enumerate(trace.actions) if action == "oom"]
    event = trace[index]
    assert event.addr == 0 and event.device_free == trace.device_free[index] > 0
    assert snapshot.allocator_settings is not None and snapshot.allocator_settings.expandable_segments


def test_real_frames_are_shared(corpus_dir: Path) -> None:
    snapshot = load(corpus_dir / "snapshots" / "cs336_small__silmont2000__mem_snapshot.pickle")
    trace = snapshot.traces[0]
    stacks = [trace.frames_at(i) for i in range(len(trace))]
    frames = {id(f) for stack in stacks for f in stack}
    values = {f for stack in stacks for f in stack}
    assert len(frames) == len(values)  # one Frame object per distinct frame
    assert trace.frames_at(0) is trace.frames_at(0)


def test_profiler_memory_timeline_is_not_a_snapshot(corpus_dir: Path, capsys) -> None:
    path = corpus_dir / "other_formats" / "profiler_memory_timeline_raw__tonghuikang__modal_gpu_adam.raw.json.gz"
    assert main(["info", str(path)]) == 2
    error = capsys.readouterr().err
    assert "not a list of segments (export_memory_timeline rows" in error and error.count("\n") == 1
