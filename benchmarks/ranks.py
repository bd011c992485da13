"""`oomdoctor report DIR` on a folder of rank dumps: parallel worker processes against one process.

    python benchmarks/ranks.py [--ranks 16] [--events 100000] [--repeats 2]

Builds --ranks dump files from a fixture (its trace repeated with shifted times until each holds
--events events), then reads and analyses the folder with `read_folder` in worker processes
(min(files, CPUs) of them) and in this process alone, and compares the rank results. Prints the
wall times and the speed-up (sequential / parallel); the ideal is the worker count, less the cost
of starting workers and of sending each rank's analysis back.
"""

from __future__ import annotations

import argparse
import os
import pickle
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SOURCE = ROOT / "fixtures" / "dumps" / "creeping-leak-gpt-adamw.pickle"


def build(folder: Path, ranks: int, events: int) -> int:
    from oomdoctor.load import load_raw

    raw = load_raw(SOURCE)
    trace = raw["device_traces"][0]
    span_us = trace[-1]["time_us"] - trace[0]["time_us"] + 1000
    built = []
    repeat = 0
    while len(built) < events:
        for event in trace[: events - len(built)]:
            copy = dict(event)
            copy["frames"] = list(copy.get("frames") or [])
            copy["time_us"] = event["time_us"] + repeat * span_us
            built.append(copy)
        repeat += 1
    raw["device_traces"] = [built]
    total_bytes = 0
    for rank in range(ranks):
        raw["oomdoctor"] = dict(raw["oomdoctor"], rank=rank, world_size=ranks, host=f"node{rank // 8}")
        path = folder / f"oom-rank{rank}-node{rank // 8}-{1000 + rank}-20260101T000000Z.pickle"
        path.write_bytes(pickle.dumps(raw, protocol=4))
        total_bytes += path.stat().st_size
    return total_bytes


def cpu_seconds() -> float:
    """CPU time of this process and of its finished children (the workers, once their pool is shut)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def timed(folder: Path, parallel: bool, repeats: int):
    """(best wall seconds, CPU seconds of that run, the RankFolder read)."""
    from oomdoctor.pipeline import read_folder

    best = None
    result = None
    for _ in range(repeats):
        cpu_start = cpu_seconds()
        start = time.perf_counter()
        result = read_folder(folder, parallel=parallel)
        seconds = time.perf_counter() - start
        cpu = cpu_seconds() - cpu_start
        if best is None or seconds < best[0]:
            best = (seconds, cpu)
    return best[0], best[1], result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=16)
    parser.add_argument("--events", type=int, default=100_000, help="trace events per rank file")
    parser.add_argument("--repeats", type=int, default=2, help="measure each side this many times, keep the best")
    args = parser.parse_args()
    from oomdoctor.analysis.ranks import compare_ranks
    from oomdoctor.load.folder import available_memory_bytes, usable_cpus, worker_count

    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        total_bytes = build(folder, args.ranks, args.events)
        largest_file_bytes = max(path.stat().st_size for path in folder.iterdir())
        for path in folder.iterdir():  # both sides read from the page cache
            path.read_bytes()
        sequential_s, sequential_cpu, sequential = timed(folder, False, args.repeats)
        parallel_s, parallel_cpu, parallel = timed(folder, True, args.repeats)
    same = compare_ranks(sequential.dumps) == compare_ranks(parallel.dumps)
    workers = worker_count(args.ranks, largest_file_bytes=largest_file_bytes, available_bytes=available_memory_bytes())
    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    print(f"folder: {args.ranks} rank files of {args.events} events, {total_bytes / 2**20:.1f} MiB in all")
    print(
        f"CPUs usable: {usable_cpus()}; load average before: {load} (other work on the machine slows the parallel side)"
    )
    print(
        f"one process:          {sequential_s:.2f} s wall, {sequential_cpu:.2f} s CPU ({sequential_s / args.ranks:.3f} s per file)"
    )
    print(f"{workers} worker processes:   {parallel_s:.2f} s wall, {parallel_cpu:.2f} s CPU (workers and this process)")
    print(f"speed-up (sequential / parallel wall time): {sequential_s / parallel_s:.2f}x  (ideal {workers}x)")
    print(f"CPU cost of going parallel (parallel / sequential CPU time): {parallel_cpu / sequential_cpu:.2f}x")
    print(f"same comparison either way: {'yes' if same else 'NO'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
