"""`oomdoctor report --format json` as a trace's allocations come from more and more distinct stacks.

    python benchmarks/stacks.py [--events 300000] [--variants 1,30,300] [--runs 3] [--source SNAPSHOT]

The analysis works out what its rules read in a stack once per distinct stack (`frame_kinds.per_stack`,
the loader's one tuple per distinct stack), so its time grows with the events and with the distinct
stacks times their frames. Real stacks are deep: torch records C++ frames with the Python ones, 40
to 200 a stack in the corpus (cs336_mixed_precision: 49, nine in ten C++). A long run through many
code paths (dynamic shapes, many model variants, compiled graphs) can allocate from thousands of
them. Each dump: the corpus trace (or --source) repeated as benchmarks/analyse.py repeats it, to
about --events events, then each allocation's stack made one of --variants versions of itself: its
middle frame (a C++ frame there) replaced by one of that many frame dicts that differ in their line,
shared between the stacks that use them as torch shares frame dicts. Each run is a fresh process,
the variants alternating --runs times; medians. Prints, per variant count, the distinct stacks, the
time, its ratio to the first count's, and the cost of each distinct stack beyond the first count's.
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

from analyse import measure, repeat_trace, source_snapshot  # noqa: E402  (benchmarks/analyse.py)

CORPUS_DEEP = "cs336_mixed_precision__niuhuangxiaozi__fwd_bwd_200_mixed_precision.pickle"


def build(source: Path, events: int, variants: int, out: Path) -> tuple[int, int]:
    """Write the dump for `variants` versions of each stack; (events, distinct allocation stacks)."""
    from oomdoctor.load import load_raw

    snapshot = repeat_trace(load_raw(source), events)
    trace = max(snapshot["device_traces"], key=len)
    replacements: dict[tuple[int, int], dict[str, Any]] = {}  # (id of the middle frame, variant) -> its version
    allocations = 0
    stacks: set[tuple[int, ...]] = set()
    for event in trace:
        frames = event.get("frames")
        if event["action"] != "alloc" or not frames:
            continue
        variant = allocations % variants
        allocations += 1
        if variant:
            middle = len(frames) // 2
            original = frames[middle]
            version = replacements.get((id(original), variant))
            if version is None:
                version = replacements[(id(original), variant)] = dict(
                    original, line=int(original.get("line") or 0) + 100_000 * variant
                )
            event["frames"] = frames = [*frames[:middle], version, *frames[middle + 1 :]]
        stacks.add(tuple(map(id, frames)))
    with open(out, "wb") as handle:
        pickle.dump(snapshot, handle, protocol=4)
    return len(trace), len(stacks)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=300_000)
    parser.add_argument("--variants", default="1,30,300", help="comma-separated counts of versions of each stack")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--source", type=Path, default=None, help="the plain torch snapshot to repeat")
    args = parser.parse_args()
    counts = [int(v) for v in args.variants.split(",")]
    given = args.source
    if given is None:
        from analyse import ROOT

        deep = ROOT.parent / "shared" / "corpus" / "snapshots" / CORPUS_DEEP
        given = deep if deep.is_file() else None
    source = source_snapshot(given)
    if source is None:
        return 2
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        built = {}
        for count in counts:
            path = folder / f"stacks-{count}.pickle"
            built[count] = (path, *build(source, args.events, count, path))
        times: dict[int, list[float]] = {count: [] for count in counts}
        loads: dict[int, list[float]] = {count: [] for count in counts}
        for _ in range(args.runs):
            for count in counts:
                result = measure("report", built[count][0])
                times[count].append(result["seconds"])
                loads[count].append(result["load_seconds"])
    first = counts[0]
    base_s = statistics.median(times[first])
    base_stacks = built[first][2]
    print(f"{built[first][1]} events from {source.name}; each run a fresh process, medians of {args.runs}")
    for count in counts:
        seconds = statistics.median(times[count])
        load_s = statistics.median(loads[count])
        stacks = built[count][2]
        line = (
            f"  {count:5d} versions: {stacks:7d} distinct allocation stacks  {seconds:6.2f} s"
            f" (load {load_s:.2f}, analysis and report {seconds - load_s:.2f})  {seconds / base_s:5.2f}x"
        )
        if stacks > base_stacks:
            line += f"  {(seconds - base_s) / (stacks - base_stacks) * 1e6:6.1f} us per further stack"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
