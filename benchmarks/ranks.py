"""`oomdoctor report DIR` on a folder of rank dumps: worker processes against one process.

    python benchmarks/ranks.py [--ranks 16] [--events 100000] [--repeats 3]

Builds --ranks dump files from a fixture (its trace repeated as benchmarks/analyse.py repeats it,
self-consistently, to about --events events), then reads and analyses the folder with
`read_folder` three ways, alternating, --repeats times: in one process alone, in one worker per
usable CPU (forced), and as `read_folder` chooses by itself (fewer workers, or none, when the load
average says other work keeps the CPUs busy). Each read runs in a fresh process, after the imports,
as `report DIR` runs it: its workers are forked from a process that holds nothing yet. Prints the
medians, the speed-ups, the CPU cost of going parallel and the best speed-up the CPUs left idle
allow; checks that every way gives the same rank comparison. Target (issue 12): at least 1.7x on 2
idle cores.

A fourth side reads the folder in workers from a process that has just read it alone and still
holds those 16 analyses, as a long-lived program might: forked workers then write into pages of
that larger heap, each write a copy-on-write fault. It is printed apart, not counted in the target.
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


CHILD = r"""
import hashlib, json, resource, sys, time
sys.path.insert(0, {root!r})
from oomdoctor.analysis.ranks import compare_ranks
from oomdoctor.pipeline import read_folder
side, folder, cpus = sys.argv[1], sys.argv[2], int(sys.argv[3])
if side == "after-serial":  # this process reads the folder alone first, and keeps what it read
    kept = read_folder(folder, parallel=False)
def cpu_seconds():
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)  # the workers, once their pool is shut
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime
options = {{"serial": dict(parallel=False), "auto": {{}}}}.get(side, dict(max_workers=cpus))
cpu_start = cpu_seconds()
start = time.perf_counter()
result = read_folder(folder, **options)
wall = time.perf_counter() - start
cpu = cpu_seconds() - cpu_start
digest = hashlib.sha256(repr(compare_ranks(result.dumps)).encode()).hexdigest()
print(json.dumps({{"wall": wall, "cpu": cpu, "digest": digest}}))
"""


def timed(folder: Path, side: str, cpus: int) -> tuple[float, float, str]:
    """(wall seconds, CPU seconds, a digest of the rank comparison) of one read of the folder, in a
    fresh process: "serial" (in that process), "parallel" (`cpus` workers), "auto" (as read_folder
    chooses) or "after-serial" (`cpus` workers, from a process holding a serial read's results)."""
    code = CHILD.format(root=str(ROOT))
    env = dict(os.environ, PYTHONHASHSEED="0")  # the comparison's repr the same in every process
    done = subprocess.run(
        [sys.executable, "-c", code, side, str(folder), str(cpus)], capture_output=True, text=True, check=True, env=env
    )
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    return answer["wall"], answer["cpu"], answer["digest"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=16)
    parser.add_argument("--events", type=int, default=100_000, help="trace events per rank file")
    parser.add_argument("--repeats", type=int, default=3, help="alternating runs of each side; medians are compared")
    args = parser.parse_args()
    from oomdoctor.load.folder import available_memory_bytes, idle_cpus, usable_cpus, worker_count

    cpus = usable_cpus()
    sides = ("serial", "parallel", "auto", "after-serial")
    runs: dict[str, list[tuple[float, float]]] = {side: [] for side in sides}
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
            digests = set()
            for side in sides:
                wall, cpu, digest = timed(folder, side, cpus)
                runs[side].append((wall, cpu))
                digests.add(digest)
            same = same and len(digests) == 1

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
    after_s = median("after-serial", 0)
    print(
        f"{cpus} workers forked from a process holding a serial read's results: {after_s:.2f} s wall, "
        f"{median('after-serial', 1):.2f} s CPU ({serial_s / after_s:.2f}x; not the target's measure)"
    )
    print(
        f"(medians of {args.repeats} alternating runs, each read in a fresh process); "
        f"same comparison every way: {'yes' if same else 'NO'}"
    )
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
