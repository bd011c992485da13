"""`oomdoctor diff A B` on two large dumps: both read in this process, one after the other, against
two worker processes at once (as `diff` reads two files of 4 MiB or more when two CPUs are idle).

    python benchmarks/diff.py [--events 1000000] [--runs 3] [--source SNAPSHOT] [--keep DIR]

A is the plain torch dump and B the oomdoctor dump that benchmarks/analyse.py builds (--events
each). Each measurement runs in a fresh process, after the imports: the wall time of
`pipeline.diff_files` and its text rendering, the process's own peak resident memory (VmHWM), and
the largest peak of its worker processes; for scale, `report --format json` of A alone in the same way.
The sides alternate, --runs times each, and the medians are compared. The two ways must print the
same diff.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

from analyse import OOMDOCTOR_SOURCE, build, source_snapshot  # noqa: E402  (benchmarks/analyse.py)

CHILD = r"""
import hashlib, json, resource, sys, time
sys.path.insert(0, {root!r})
from oomdoctor import pipeline
import oomdoctor.analysis, oomdoctor.analysis.diff, oomdoctor.views.diff_report, oomdoctor.views.json_report
mode, a, b = sys.argv[1:4]
if mode == "one":  # no file is large enough for workers: both read here, one after the other
    pipeline.PARALLEL_SIDE_MIN_BYTES = 1 << 62
start = time.perf_counter()
if mode == "report":
    out = pipeline.report_file(a, "json")
else:
    out = pipeline.render_diff(pipeline.diff_files(a, b), "text")
elapsed = time.perf_counter() - start
with open("/proc/self/status") as status:  # VmHWM: ru_maxrss would start from the launcher's peak
    own = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM:"))
workers = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # forked from this small process
print(json.dumps({{"seconds": elapsed, "own_peak": own, "worker_peak": workers, "digest": hashlib.sha1(out).hexdigest()}}))
"""


def measure(mode: str, a: Path, b: Path) -> dict:
    code = CHILD.format(root=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-c", code, mode, str(a), str(b)], capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--source", type=Path, default=None, help="the plain torch snapshot to repeat (A)")
    parser.add_argument("--keep", type=Path, default=None, help="write the built snapshots in this folder")
    parser.add_argument("--runs", type=int, default=3, help="alternating runs of each side; medians are compared")
    args = parser.parse_args()
    source = source_snapshot(args.source)
    if source is None:
        return 2
    with tempfile.TemporaryDirectory() as name:
        folder = args.keep or Path(name)
        folder.mkdir(parents=True, exist_ok=True)
        a, b = folder / f"torch-{args.events}.pickle", folder / f"oomdoctor-{args.events}.pickle"
        counts = (build(source, args.events, a), build(OOMDOCTOR_SOURCE, args.events, b))
        results: dict[str, list[dict]] = {"one": [], "workers": [], "report": []}
        for _ in range(args.runs):  # alternate, so that other work on the machine falls on all sides
            for mode in results:
                results[mode].append(measure(mode, a, b))
        sizes = (a.stat().st_size / 2**20, b.stat().st_size / 2**20)

    def median(mode: str, key: str) -> float:
        return statistics.median(r[key] for r in results[mode])

    one, workers, report = median("one", "seconds"), median("workers", "seconds"), median("report", "seconds")
    used = [r["worker_peak"] > 0 for r in results["workers"]]
    print(f"A: {counts[0]} events, {sizes[0]:.1f} MiB; B: {counts[1]} events, {sizes[1]:.1f} MiB")
    print(f"  report --format json of A alone:  {report:.2f} s, peak {median('report', 'own_peak') / 2**20:.0f} MiB")
    print(
        f"  diff, both read in this process:  {one:.2f} s, peak {median('one', 'own_peak') / 2**20:.0f} MiB"
        f" ({one / report:.2f}x the report's time)"
    )
    print(
        f"  diff as it chooses:               {workers:.2f} s, peak {median('workers', 'own_peak') / 2**20:.0f} MiB"
        f" here and {median('workers', 'worker_peak') / 2**20:.0f} MiB in the larger worker"
        f" ({workers / report:.2f}x the report's time); workers used in {sum(used)} of {len(used)} runs"
    )
    print(f"  speed-up: {one / workers:.2f}x")
    digests = {r["digest"] for mode in ("one", "workers") for r in results[mode]}
    print(f"  (medians of {args.runs} alternating runs); same diff both ways: {'yes' if len(digests) == 1 else 'NO'}")
    return 0 if len(digests) == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
