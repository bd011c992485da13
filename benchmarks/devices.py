"""`oomdoctor report --format json` on one file that holds several devices' traces, against the floor.

    python benchmarks/devices.py [--devices 8] [--events 125000] [--runs 3] [--source SNAPSHOT]

One process that drives several GPUs (DataParallel, a model split with device_map="auto", pipeline
stages in one process) writes one snapshot holding every device's trace and segments. The analysis
judges the device that ran out and reads every other device too, at its own moment and at the
judged one's time (`analysis.devices`). Each dump: the plain torch trace (or --source) repeated as
benchmarks/analyse.py repeats it, to about --events events, then copied to --devices devices, each
in its own address range; only the last device keeps the trace's `oom` events (where it has none,
as the default corpus trace, the report judges the first device at its peak and reads the others
beside it). It is measured beside a dump of one device holding as many events in all, each against
its own floor (a bare restricted pickle.load, GC paused). Each run is a fresh process, the sides alternating --runs
times; medians.
"""

from __future__ import annotations

import argparse
import pickle
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from analyse import _ADDRESSED, address_range, measure, repeat_trace, source_snapshot  # noqa: E402  (benchmarks/analyse.py)


def _shifted_segment(segment: dict[str, Any], device: int, shift: int) -> dict[str, Any]:
    moved = dict(segment, device=device, address=segment["address"] + shift)
    moved["blocks"] = [dict(b, address=b["address"] + shift) if "address" in b else dict(b) for b in segment["blocks"]]
    return moved


def build(source: Path, devices: int, events: int, out: Path) -> int:
    """Write `devices` copies of the source's repeated trace (about `events` events each) as one
    snapshot; the events in all."""
    from oomdoctor.load import load_raw

    raw = repeat_trace(load_raw(source), events)
    traces = raw["device_traces"]
    device = max(range(len(traces)), key=lambda d: len(traces[d]))
    trace = traces[device]
    segments = [s for s in raw["segments"] if s.get("device", 0) == device]
    _, high, stride = address_range(trace, segments)
    raw["device_traces"] = []
    raw["segments"] = []
    for copy in range(devices):
        shift = copy * stride if high + copy * stride < 2**63 else -copy * stride
        last = copy == devices - 1
        events_of_copy = []
        for event in trace:
            if event["action"] == "oom" and not last:
                continue  # only the last device ran out
            item = dict(event)
            item["frames"] = list(event.get("frames") or [])  # torch writes one list per traceback
            if event["action"] in _ADDRESSED:
                item["addr"] = event["addr"] + shift
            events_of_copy.append(item)
        raw["device_traces"].append(events_of_copy)
        raw["segments"].extend(_shifted_segment(s, copy, shift) for s in segments)
    with open(out, "wb") as handle:
        pickle.dump(raw, handle, protocol=4)
    return sum(map(len, raw["device_traces"]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--events", type=int, default=125_000, help="trace events per device")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--source", type=Path, default=None, help="the plain torch snapshot to repeat")
    args = parser.parse_args()
    source = source_snapshot(args.source)
    if source is None:
        return 2
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        sides = {
            "one device": folder / "one.pickle",
            f"{args.devices} devices": folder / "several.pickle",
        }
        several = build(source, args.devices, args.events, sides[f"{args.devices} devices"])
        counts = {"one device": build(source, 1, several, sides["one device"]), f"{args.devices} devices": several}
        results: dict[str, dict[str, list[float]]] = {side: {"floor": [], "report": [], "load": []} for side in sides}
        for _ in range(args.runs):  # alternate, so that other work on the machine falls on every side
            for side, path in sides.items():
                results[side]["floor"].append(measure("pickle", path)["seconds"])
                ours = measure("report", path)
                results[side]["report"].append(ours["seconds"])
                results[side]["load"].append(ours["load_seconds"])
    print(f"from {source.name}; each run a fresh process, medians of {args.runs}")
    for side in sides:
        floor_s, report_s, load_s = (statistics.median(results[side][key]) for key in ("floor", "report", "load"))
        print(
            f"  {side:>11}, {counts[side]:8d} events: floor {floor_s:5.2f} s, report {report_s:5.2f} s"
            f" (load {load_s:.2f}, analysis and report {report_s - load_s:.2f})  {report_s / floor_s:4.2f}x the floor"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
