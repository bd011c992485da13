"""Loading a one-million-event snapshot, against a plain restricted pickle.load of the same file.

    python benchmarks/load.py [--events 1000000] [--source FILE] [--repeat 3] [--keep PATH]

Builds the snapshot from a real corpus trace (its events repeated, round after round, with torch's
sharing kept: frame dicts shared across all events, frame lists shared as in the original), writes
it with pickle protocol 4, then times each way of reading it in a fresh process, alternating, and
prints the ratios oomdoctor / plain: wall time, CPU time and peak resident memory (the rise of
the process's high-water mark during the load). Target: at most 1.3 on both time and memory.
oomdoctor pauses the cyclic garbage collector while loading, which plain pickle.load does not;
the last line compares against pickle.load with the collector paused as well.
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

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SOURCE = "cs336_mixed_precision__niuhuangxiaozi__fwd_bwd_200_mixed_precision.pickle"

_CHILD = r"""
import json, pickle, resource, sys, time

def peak_bytes():
    # VmHWM is this process's own high-water mark; ru_maxrss can carry the parent's over exec
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

mode, path = sys.argv[1], sys.argv[2]
if mode == "oomdoctor":
    from oomdoctor.load import load
else:
    if mode == "pickle-gc-paused":
        import gc
        gc.disable()
    class Restricted(pickle.Unpickler):
        def find_class(self, module, name):
            raise pickle.UnpicklingError(f"global {module}.{name} refused")
    def load(path):
        with open(path, "rb") as handle:
            return Restricted(handle).load()
before = peak_bytes()
wall, cpu = time.perf_counter(), time.process_time()
result = load(path)
wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
print(json.dumps({"wall_s": wall, "cpu_s": cpu, "peak_bytes": peak_bytes() - before}))
"""


def _corpus() -> Path | None:
    configured = os.environ.get("OOMDOCTOR_CORPUS")
    candidate = Path(configured) if configured else ROOT.parent / "shared" / "corpus"
    return candidate if candidate.is_dir() else None


def build(source: Path, events: int, out: Path) -> int:
    """Write a snapshot whose device-0 trace repeats `source`'s trace to `events` events."""
    from oomdoctor.load import load_raw

    raw = load_raw(source)
    trace = next(t for t in raw["device_traces"] if t)
    first_time = trace[0].get("time_us") or 0
    span = (trace[-1].get("time_us") or 0) - first_time + 1
    grown = []
    round_index = 0
    while len(grown) < events:
        copies: dict[int, list] = {}  # within a round, events share frame lists as the original did
        for event in trace:
            if len(grown) == events:
                break
            copy = dict(event)
            frames = event.get("frames")
            if frames is not None:
                copy["frames"] = copies.setdefault(id(frames), list(frames))
            if "time_us" in copy:
                copy["time_us"] += round_index * span
            grown.append(copy)
        round_index += 1
    raw["device_traces"] = [grown] + [[] for _ in raw["device_traces"][1:]]
    with open(out, "wb") as handle:
        pickle.dump(raw, handle, protocol=4)
    return out.stat().st_size


def measure(mode: str, path: Path) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, mode, str(path)], capture_output=True, text=True, check=True, cwd=ROOT
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--source", type=Path, help="snapshot whose trace to repeat (default: a corpus file)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--keep", type=Path, help="write the built snapshot here and keep it")
    parser.add_argument("--build-only", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.build_only:
        build(args.source, args.events, args.build_only)
        return 0
    source = args.source
    if source is None:
        corpus = _corpus()
        if corpus is None:
            print("corpus not found (../shared/corpus or OOMDOCTOR_CORPUS); pass --source", file=sys.stderr)
            return 2
        source = corpus / "snapshots" / DEFAULT_SOURCE
    with tempfile.TemporaryDirectory() as scratch:
        path = args.keep or Path(scratch) / "million.pickle"
        # built in a child process, so that this one stays small while the others are measured
        subprocess.run(
            [
                sys.executable,
                __file__,
                "--build-only",
                str(path),
                "--events",
                str(args.events),
                "--source",
                str(source),
            ],
            check=True,
            cwd=ROOT,
        )
        size = path.stat().st_size
        print(f"snapshot: {args.events} events from {source.name}, {size / 2**20:.1f} MiB (pickle protocol 4)")
        runs: dict[str, list[dict]] = {"pickle": [], "oomdoctor": [], "pickle-gc-paused": []}
        for _ in range(args.repeat):
            for mode in runs:
                runs[mode].append(measure(mode, path))
    best = {
        mode: {
            "wall_s": min(r["wall_s"] for r in results),
            "cpu_s": min(r["cpu_s"] for r in results),
            "peak_bytes": statistics.median(r["peak_bytes"] for r in results),
        }
        for mode, results in runs.items()
    }
    for mode, numbers in best.items():
        print(
            f"{mode:>10}: wall {numbers['wall_s']:.2f} s, cpu {numbers['cpu_s']:.2f} s, "
            f"peak +{numbers['peak_bytes'] / 2**20:.0f} MiB (best wall/cpu, median peak of {args.repeat})"
        )
    plain, ours = best["pickle"], best["oomdoctor"]
    print(f"load time ratio (wall): {ours['wall_s'] / plain['wall_s']:.2f}x")
    print(f"load time ratio (cpu):  {ours['cpu_s'] / plain['cpu_s']:.2f}x")
    print(f"peak memory ratio:      {ours['peak_bytes'] / plain['peak_bytes']:.2f}x   (target: at most 1.3x each)")
    # oomdoctor pauses the cyclic GC while loading; against pickle.load with the GC paused too,
    # the ratio is the cost of validating and converting alone
    floor = best["pickle-gc-paused"]
    print(
        f"against pickle.load with the GC paused too: cpu {ours['cpu_s'] / floor['cpu_s']:.2f}x, "
        f"memory {ours['peak_bytes'] / floor['peak_bytes']:.2f}x"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
