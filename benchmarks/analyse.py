"""Load + full analysis of a one-million-event snapshot, as ratios to the plain restricted pickle.load.

    python benchmarks/analyse.py [--events 1000000] [--source SNAPSHOT] [--keep FILE]

The snapshot is built from a real trace (the largest corpus snapshot with history, or --source),
repeated with shifted times until it holds --events events on one device; each event is its own
dict and its own frame list over shared frame dicts, as torch writes them. Each measurement runs in
a fresh process: wall time of the work, and peak resident memory above what the process held just
before it. Targets (DESIGN §8): at most 1.5x the time and 1.3x the memory of the plain load.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CHILD = r"""
import gc, json, resource, sys, time
sys.path.insert(0, {root!r})
from oomdoctor.load.safe_pickle import RestrictedUnpickler
import oomdoctor.load, oomdoctor.analysis
mode, path = sys.argv[1], sys.argv[2]
gc.collect()
def rss():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
before = rss()
start = time.perf_counter()
if mode == "pickle":
    with open(path, "rb") as f:
        data = RestrictedUnpickler(f).load()
    phase = None
else:
    snapshot = oomdoctor.load.load(path)
    loaded = time.perf_counter()
    result = oomdoctor.analysis.analyse(snapshot)
    phase = loaded - start
elapsed = time.perf_counter() - start
print(json.dumps({{"seconds": elapsed, "load_seconds": phase, "peak_bytes": rss() - before}}))
"""


def _corpus_source() -> Path | None:
    env = os.environ.get("OOMDOCTOR_CORPUS")
    corpus = Path(env) if env else ROOT.parent / "shared" / "corpus"
    candidates = [
        corpus / "snapshots" / "compile_context__decomfl__memory.pickle",
        corpus / "snapshots" / "cs336_mixed_precision__niuhuangxiaozi__fwd_bwd_200_mixed_precision.pickle",
    ]
    return next((p for p in candidates if p.is_file()), None)


def source_snapshot(given: Path | None) -> Path | None:
    """The snapshot whose trace a benchmark repeats: `given`, else a corpus file; None, said on
    stderr, when there is neither."""
    source = given or _corpus_source()
    if source is None:
        print("no source snapshot: pass --source or set OOMDOCTOR_CORPUS", file=sys.stderr)
    return source


def build(source: Path, events: int, out: Path) -> int:
    from oomdoctor.load import load_raw

    raw = load_raw(source)
    traces = raw.get("device_traces") or []
    device = max(range(len(traces)), key=lambda d: len(traces[d]))
    trace = traces[device]
    span_us = (trace[-1].get("time_us", 0) - trace[0].get("time_us", 0)) + 1000 if trace else 1
    built = []
    repeat = 0
    while len(built) < events:
        for event in trace:
            if len(built) >= events:
                break
            copy = dict(event)
            if "frames" in copy:
                copy["frames"] = list(copy["frames"])
            if "time_us" in copy:
                copy["time_us"] = copy["time_us"] + repeat * span_us
            built.append(copy)
        repeat += 1
    traces = [[] for _ in traces]
    traces[device] = built
    snapshot = dict(raw)
    snapshot["device_traces"] = traces
    with open(out, "wb") as handle:
        pickle.dump(snapshot, handle, protocol=4)
    return len(built)


def measure(mode: str, path: Path) -> dict:
    code = CHILD.format(root=str(ROOT))
    done = subprocess.run([sys.executable, "-c", code, mode, str(path)], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--source", type=Path, default=None)
    parser.add_argument("--keep", type=Path, default=None, help="write the built snapshot here and keep it")
    parser.add_argument("--repeats", type=int, default=2, help="measure each side this many times, keep the best")
    args = parser.parse_args()
    source = source_snapshot(args.source)
    if source is None:
        return 2
    with tempfile.TemporaryDirectory() as folder:
        path = args.keep or Path(folder) / "million.pickle"
        count = build(source, args.events, path)
        size = path.stat().st_size
        plain = min((measure("pickle", path) for _ in range(args.repeats)), key=lambda r: r["seconds"])
        ours = min((measure("analyse", path) for _ in range(args.repeats)), key=lambda r: r["seconds"])
    print(f"snapshot: {count} events from {source.name}, {size / 2**20:.1f} MiB")
    print(f"restricted pickle.load: {plain['seconds']:.2f} s, peak +{plain['peak_bytes'] / 2**20:.0f} MiB")
    print(
        f"load + analyse:        {ours['seconds']:.2f} s (load {ours['load_seconds']:.2f} s, analysis {ours['seconds'] - ours['load_seconds']:.2f} s),"
        f" peak +{ours['peak_bytes'] / 2**20:.0f} MiB"
    )
    print(f"time ratio:   {ours['seconds'] / plain['seconds']:.2f}x  (target <= 1.5x)")
    print(f"memory ratio: {ours['peak_bytes'] / plain['peak_bytes']:.2f}x  (target <= 1.3x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
