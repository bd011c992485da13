"""`oomdoctor report DIR` on a folder of rank dumps: worker processes against one process.

    python benchmarks/ranks.py [--ranks 16] [--events 100000] [--repeats 3]

Builds --ranks dump files from a fixture (its trace repeated as benchmarks/analyse.py repeats it,
self-consistently, to about --events events), then reads and analyses the folder with
`read_folder` three ways, alternating, --repeats times: in this process alone, in one worker per
usable CPU (forced), and as `read_folder` chooses by itself (fewer workers, or none, when the load
average says other work keeps the CPUs busy). Prints the medians, the speed-ups, the CPU cost of
going parallel and the best speed-up the CPUs left idle allow; checks that every way gives the same
rank comparison. Target (issue 12): at least 1.7x on 2 idle cores.
"""

from __future__ import annotations

import argparse
import os
import pickle
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

SOURCE = ROOT / "fixtures" / "dumps" / "creeping-leak-gpt-adamw.pickle"


def build(folder: Path, ranks: int, events: int) -> int:
    """--ranks files of the fixture's trace repeated to about `events` events, as benchmarks/analyse.py
    repeats a trace (self-consistently: each copy earlier, in its own address range, closed)."""
    from analyse import repeat_trace

    from oomdoctor.load import load_raw

    raw = repeat_trace(load_raw(SOURCE), events)
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


def _spin(count: int) -> int:
    return sum(range(count))


def machine_speedup(workers: int, count: int = 30_000_000) -> float:
    """How much faster `workers` processes run a pure CPU loop than one process runs it `workers`
    times: the most any parallel reading can gain on this machine right now."""
    from concurrent.futures import ProcessPoolExecutor

    start = time.perf_counter()
    for _ in range(workers):
        _spin(count)
    serial = time.perf_counter() - start
    with ProcessPoolExecutor(max_workers=workers) as pool:
        pool.submit(_spin, 1).result()  # the workers are started before the clock
        start = time.perf_counter()
        list(pool.map(_spin, [count] * workers))
        parallel = time.perf_counter() - start
    return serial / parallel


def timed(folder: Path, parallel: bool, max_workers: int | None = None):
    """(wall seconds, CPU seconds, the RankFolder read) of one read of the folder."""
    from oomdoctor.pipeline import read_folder

    cpu_start = cpu_seconds()
    start = time.perf_counter()
    result = read_folder(folder, parallel=parallel, max_workers=max_workers)
    return time.perf_counter() - start, cpu_seconds() - cpu_start, result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=16)
    parser.add_argument("--events", type=int, default=100_000, help="trace events per rank file")
    parser.add_argument("--repeats", type=int, default=3, help="alternating runs of each side; medians are compared")
    args = parser.parse_args()
    from oomdoctor.analysis.ranks import compare_ranks
    from oomdoctor.load.folder import available_memory_bytes, idle_cpus, usable_cpus, worker_count

    cpus = usable_cpus()
    runs: dict[str, list[tuple[float, float]]] = {"serial": [], "parallel": [], "auto": []}
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        total_bytes = build(folder, args.ranks, args.events)
        largest_file_bytes = max(path.stat().st_size for path in folder.iterdir())
        for path in folder.iterdir():  # every side reads from the page cache
            path.read_bytes()
        loads, idles, chosen = [], [], []
        same = True
        for _ in range(args.repeats):  # alternate, so that other work on the machine falls on every side
            loads.append(os.getloadavg()[0])
            idle = idle_cpus()
            idles.append(idle if idle is not None else float(cpus))
            chosen.append(
                worker_count(
                    args.ranks,
                    largest_file_bytes=largest_file_bytes,
                    available_bytes=available_memory_bytes(),
                    idle=idle,
                )
            )
            serial_s, serial_cpu, serial = timed(folder, False)
            parallel_s, parallel_cpu, parallel = timed(folder, True, max_workers=cpus)
            auto_s, auto_cpu, auto = timed(folder, True)
            runs["serial"].append((serial_s, serial_cpu))
            runs["parallel"].append((parallel_s, parallel_cpu))
            runs["auto"].append((auto_s, auto_cpu))
            same = same and compare_ranks(serial.dumps) == compare_ranks(parallel.dumps) == compare_ranks(auto.dumps)

    spin = machine_speedup(cpus)

    def median(side: str, part: int) -> float:
        return statistics.median(run[part] for run in runs[side])

    serial_s, parallel_s, auto_s = median("serial", 0), median("parallel", 0), median("auto", 0)
    cpu_cost = median("parallel", 1) / median("serial", 1)
    idle = statistics.median(idles)
    print(f"folder: {args.ranks} rank files of about {args.events} events, {total_bytes / 2**20:.1f} MiB in all")
    print(
        f"CPUs usable: {cpus}; load average (1 min) at each run: {', '.join(f'{v:.1f}' for v in loads)}; "
        f"idle CPUs estimated: {idle:.1f}"
    )
    print(f"one process:                  {serial_s:.2f} s wall, {median('serial', 1):.2f} s CPU")
    print(f"{cpus} worker processes (forced): {parallel_s:.2f} s wall, {median('parallel', 1):.2f} s CPU")
    print(f"as read_folder chooses ({', '.join(map(str, chosen))} workers): {auto_s:.2f} s wall")
    print(
        f"speed-up of {cpus} workers (serial / parallel wall): {serial_s / parallel_s:.2f}x  (target >= 1.7x on 2 cores)"
    )
    print(f"speed-up as read_folder chooses (serial / chosen wall): {serial_s / auto_s:.2f}x")
    print(
        f"CPU cost of going parallel (parallel / serial CPU): {cpu_cost:.2f}x; the best {cpus} workers can do "
        f"with the CPUs left idle: {min(cpus, max(1.0, idle)) / cpu_cost:.2f}x"
    )
    print(
        f"a pure CPU loop in {cpus} processes against one after another, just after: {spin:.2f}x (the machine's ceiling now)"
    )
    print(f"(medians of {args.repeats} alternating runs); same comparison every way: {'yes' if same else 'NO'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
