"""`oomdoctor report --format json` on a one-million-event snapshot, as ratios to a bare restricted
pickle.load of the same file with the cycle GC paused (the C unpickler alone: the floor).

    python benchmarks/analyse.py [--events 1000000] [--kind torch|oomdoctor|both] [--runs 3] [--keep DIR]

Two kinds of dump, each built from a real trace repeated until it holds --events events on one
device: "torch", a plain torch snapshot whose phases come from the allocation stacks (the largest
corpus snapshot with history, or --source), and "oomdoctor", an oomdoctor dump whose phases come
from its markers (the fixture creeping-leak-gpt-adamw). The repetition keeps the snapshot
self-consistent (`repeat_trace`): each extra copy of the trace lies earlier in time and in its own
address range, is closed by frees of everything it left allocated and by frees of its segments,
and carries its own markers and annotations; the original trace comes last, so the dump's
segments and blocks are still the state after the last event. Each event is its own dict with its
own frame list over shared frame dicts, as torch writes them.

A third side shows how much of the gap any reader in Python that keeps the events as columns must
leave: the floor's pickle.load, then each key the events carry read once per event (one C-level
pass of an itemgetter per key, no checks), then the allocations' stacks numbered by their frames'
identities (torch shares frame dicts between stacks but gives every event its own list, so the
frames' identities are the least exact key of a stack).

Each measurement runs in a fresh process, after the imports: wall time of the work and peak
resident memory above what the process held just before it. The two sides alternate, --runs
times each, and the medians are compared (the machine may be shared). Targets (DESIGN §8): at
most 1.5x the time and 1.3x the memory of the floor.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

OOMDOCTOR_SOURCE = ROOT / "fixtures" / "dumps" / "creeping-leak-gpt-adamw.pickle"

CHILD = r"""
import gc, json, sys, time
sys.path.insert(0, {root!r})
from oomdoctor.load.safe_pickle import RestrictedUnpickler
import oomdoctor.load, oomdoctor.analysis, oomdoctor.pipeline, oomdoctor.views.json_report
mode, path = sys.argv[1], sys.argv[2]
gc.collect()
def rss():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
before = rss()
start = time.perf_counter()
if mode in ("pickle", "columns"):
    gc.disable()
    with open(path, "rb") as f:
        data = RestrictedUnpickler(f).load()
    phase = None
    if mode == "columns":
        # the least any reader that keeps the events as columns does beyond the floor: each key the
        # events carry read once per event, then the allocations' stacks keyed by their frames'
        # identities (the least exact key of a stack: torch shares frame dicts, never frame lists)
        from itertools import compress, count, repeat
        from operator import itemgetter
        read = []
        for events in data["device_traces"]:
            columns = {{}}
            for key in set(events[:1] and events[0]) | set(events[-1:] and events[-1]):
                try:
                    columns[key] = tuple(map(itemgetter(key), events))
                except KeyError:  # an `oom` event has no addr
                    columns[key] = tuple(map(dict.get, events, repeat(key)))
            read.append(columns)
        phase = time.perf_counter() - start
        for columns in read:
            if "frames" in columns:
                allocs = compress(columns["frames"], map("alloc".__eq__, columns["action"]))
                numbering = {{}}
                numbers = list(map(numbering.setdefault, map(tuple, map(map, repeat(id), allocs)), count()))
else:
    snapshot = oomdoctor.pipeline.load_snapshot(path)
    phase = time.perf_counter() - start
    report = oomdoctor.pipeline.render_report(snapshot, "json", source=path)
elapsed = time.perf_counter() - start
print(json.dumps({{"seconds": elapsed, "load_seconds": phase, "peak_bytes": rss() - before}}))
"""

_ADDRESSED = frozenset(
    {"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "segment_map", "segment_unmap"}
)


def _corpus_source() -> Path | None:
    env = os.environ.get("OOMDOCTOR_CORPUS")
    corpus = Path(env) if env else ROOT.parent / "shared" / "corpus"
    candidates = [
        corpus / "snapshots" / "compile_context__decomfl__memory.pickle",
        corpus / "snapshots" / "cs336_mixed_precision__niuhuangxiaozi__fwd_bwd_200_mixed_precision.pickle",
    ]
    return next((p for p in candidates if p.is_file()), None)


def source_snapshot(given: Path | None) -> Path | None:
    """The plain torch snapshot whose trace a benchmark repeats: `given`, else a corpus file; None,
    said on stderr, when there is neither."""
    source = given or _corpus_source()
    if source is None:
        print("no source snapshot: pass --source or set OOMDOCTOR_CORPUS", file=sys.stderr)
    return source


def _closing_events(raw: dict[str, Any], device: int) -> list[dict[str, Any]]:
    """What closes a copy of the trace: a free of every block the dump holds active, then a free of
    every segment (the state after the trace's last event, undone). They carry every key the
    trace's events carry (torch writes a key on all events or on none)."""
    closing: list[dict[str, Any]] = []
    trace = raw["device_traces"][device]
    segments = [s for s in raw["segments"] if s.get("device", 0) == device]
    extra = {key: trace[-1][key] for key in ("compile_context", "user_metadata") if key in trace[-1]}
    for segment in segments:
        if "pool_id" in trace[-1]:
            extra["pool_id"] = tuple(segment.get("segment_pool_id") or (0, 0))
        offset = 0
        for block in segment["blocks"]:
            address = block.get("address", segment["address"] + offset)
            offset += block["size"]
            state = block["state"]
            if state == "inactive":
                continue
            base = {
                "addr": address,
                "size": block.get("requested_size", block["size"]),
                "stream": segment["stream"],
                **extra,
            }
            frames = block.get("frames") or []
            if state == "active_allocated":
                closing.append(dict(base, action="free_requested", frames=list(frames)))
            closing.append(dict(base, action="free_completed", frames=list(frames)))
    for segment in segments:
        if "pool_id" in trace[-1]:
            extra["pool_id"] = tuple(segment.get("segment_pool_id") or (0, 0))
        closing.append(
            {
                "action": "segment_free",
                "addr": segment["address"],
                "size": segment["total_size"],
                "stream": segment["stream"],
                "frames": [],
                **extra,
            }
        )
    return closing


def address_range(trace: list[dict[str, Any]], segments: list[dict[str, Any]]) -> tuple[int, int, int]:
    """(lowest, highest, stride) of the addresses a trace's events and `segments` use: a copy
    shifted by a multiple of the stride (a power of two, at least 1 GiB) lies in its own range."""
    addresses = [e["addr"] for e in trace if e["action"] in _ADDRESSED]
    addresses += [s["address"] + s["total_size"] for s in segments] + [s["address"] for s in segments]
    low, high = min(addresses), max(addresses)
    return low, high, 1 << max((high - low + 1).bit_length(), 30)


def repeat_trace(raw: dict[str, Any], events: int) -> dict[str, Any]:
    """`raw` (a snapshot dict) with its longest trace repeated until it holds about `events` events:
    copies of the trace, each earlier in time and in its own address range, each closed by frees,
    then the original. Markers, annotations and the OOMs oomdoctor observed are repeated with them
    (the copies' `oom` events are left out: the run went on)."""
    traces = raw.get("device_traces") or []
    device = max(range(len(traces)), key=lambda d: len(traces[d]))
    trace = traces[device]
    closing = _closing_events(raw, device)
    per_copy = len(trace) + len(closing)
    copies = max(0, -(-(events - len(trace)) // per_copy))
    low, high, stride = address_range(trace, raw["segments"])
    if high + copies * stride >= 2**63:
        raise SystemExit("the trace's addresses leave no room for that many copies")
    first_us, last_us = trace[0].get("time_us", 0), trace[-1].get("time_us", 0)
    span_us = last_us - first_us + len(closing) + 1000
    metadata = raw.get("oomdoctor")
    markers = list(metadata.get("markers") or []) if isinstance(metadata, dict) else []
    steps = 1 + max((m.get("step") or 0 for m in markers), default=0)
    annotations = raw.get("external_annotations") or []

    built: list[dict[str, Any]] = []
    new_markers: list[dict[str, Any]] = []
    new_annotations: list[dict[str, Any]] = []
    for copy in range(copies):
        shift_us = -(copies - copy) * span_us
        shift = -(copies - copy) * stride  # below the original, where nothing of it lies
        shift = (copy + 1) * stride if low + shift < stride else shift
        for event in trace:
            if event["action"] == "oom":
                continue
            item = dict(event)
            item["frames"] = list(event.get("frames") or [])
            if "time_us" in item:
                item["time_us"] = event["time_us"] + shift_us
            if event["action"] in _ADDRESSED:
                item["addr"] = event["addr"] + shift
            built.append(item)
        for number, event in enumerate(closing):
            item = dict(event, addr=event["addr"] + shift, frames=list(event["frames"]))
            if "time_us" in trace[0]:
                item["time_us"] = last_us + shift_us + 1 + number
            built.append(item)
        new_markers += [
            dict(m, time_us=m["time_us"] + shift_us, step=(m.get("step") or 0) + copy * steps) for m in markers
        ]
        new_annotations += [dict(a, time_us=a["time_us"] + shift_us) for a in annotations]
    built += [dict(event, frames=list(event.get("frames") or [])) for event in trace]
    new_markers += [dict(m, step=(m.get("step") or 0) + copies * steps) for m in markers]
    new_annotations += [dict(a) for a in annotations]

    snapshot = dict(raw)
    snapshot["device_traces"] = [built if d == device else [] for d in range(len(traces))]
    if annotations:
        snapshot["external_annotations"] = new_annotations
    if markers:
        snapshot["oomdoctor"] = dict(metadata, markers=new_markers)
    return snapshot


def build(source: Path, events: int, out: Path) -> int:
    """Write `source` with its trace repeated to about `events` events to `out`; the event count."""
    from oomdoctor.load import load_raw

    snapshot = repeat_trace(load_raw(source), events)
    with open(out, "wb") as handle:
        pickle.dump(snapshot, handle, protocol=4)
    return max(map(len, snapshot["device_traces"]))


def measure(mode: str, path: Path) -> dict:
    code = CHILD.format(root=str(ROOT))
    done = subprocess.run([sys.executable, "-c", code, mode, str(path)], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def compare(name: str, source: Path, events: int, runs: int, folder: Path) -> tuple[float, float]:
    path = folder / f"{name}-{events}.pickle"
    count = build(source, events, path)
    floors, columns, ours = [], [], []
    for _ in range(runs):  # alternate, so that other work on the machine falls on all sides
        floors.append(measure("pickle", path))
        columns.append(measure("columns", path))
        ours.append(measure("report", path))

    def median(results: list[dict], key: str) -> float:
        return statistics.median(r[key] for r in results)

    floor_s, ours_s = median(floors, "seconds"), median(ours, "seconds")
    floor_b, ours_b = median(floors, "peak_bytes"), median(ours, "peak_bytes")
    load_s = median(ours, "load_seconds")
    columns_s, keys_s = median(columns, "seconds"), median(columns, "load_seconds")
    print(f"{name}: {count} events from {source.name}, {path.stat().st_size / 2**20:.1f} MiB")
    print(f"  restricted pickle.load, GC paused: {floor_s:.2f} s, peak +{floor_b / 2**20:.0f} MiB")
    print(
        f"  report --format json:              {ours_s:.2f} s (load {load_s:.2f} s, analysis and report"
        f" {ours_s - load_s:.2f} s), peak +{ours_b / 2**20:.0f} MiB"
    )
    print(
        f"  the least a column reader adds:    {columns_s:.2f} s ({columns_s / floor_s:.2f}x the floor): each key of"
        f" every event read once ({keys_s:.2f} s with the pickle.load), then the allocations' stacks keyed by"
        " their frames"
    )
    print(f"  time ratio:   {ours_s / floor_s:.2f}x  (target <= 1.5x)")
    print(f"  memory ratio: {ours_b / floor_b:.2f}x  (target <= 1.3x)")
    print(
        f"  (medians of {runs} alternating runs; all times: floor {[round(r['seconds'], 2) for r in floors]},"
        f" report {[round(r['seconds'], 2) for r in ours]})"
    )
    return ours_s / floor_s, ours_b / floor_b


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--kind", choices=("torch", "oomdoctor", "both"), default="both")
    parser.add_argument("--source", type=Path, default=None, help="the plain torch snapshot to repeat")
    parser.add_argument("--keep", type=Path, default=None, help="write the built snapshots in this folder")
    parser.add_argument("--runs", type=int, default=3, help="alternating runs of each side; medians are compared")
    args = parser.parse_args()
    kinds = []
    if args.kind in ("torch", "both"):
        source = source_snapshot(args.source)
        if source is None:
            return 2
        kinds.append(("torch", source))
    if args.kind in ("oomdoctor", "both"):
        kinds.append(("oomdoctor", OOMDOCTOR_SOURCE))
    with tempfile.TemporaryDirectory() as name:
        folder = args.keep or Path(name)
        folder.mkdir(parents=True, exist_ok=True)
        for kind, source in kinds:
            compare(kind, source, args.events, args.runs, folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
