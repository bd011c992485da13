"""`oomdoctor open` on a one-million-event snapshot: time until the overview is on screen, as a ratio
to `oomdoctor report --format json` on the same file.

    python benchmarks/tui_open.py [--events 1000000] [--source SNAPSHOT] [--runs 3]

The snapshot is built as benchmarks/analyse.py builds its plain torch dump. Each side runs in a
fresh process, after the imports, and the two alternate --runs times; medians are compared. The
app runs headless at 80x24 with the loader `open` gives it (commands/open.py); its time is from
the app's start until the Overview tab is mounted and drawn. While it loads, the loading view's
progress bar is sampled, to show that it moves through the whole load. Target (issue 12): at most
2x the report.

    python benchmarks/tui_open.py --compare

`open A --compare B` with the snapshot as both A and B: time until the comparison is on screen, as
the app reads them (B in a worker process beside A when both are large and two CPUs are idle) and
with both read in the app's process, one after the other; and `diff A B --format json`.
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

from analyse import build, source_snapshot  # noqa: E402  (benchmarks/analyse.py)

TARGET_RATIO = 2.0

CHILD = r"""
import asyncio, json, sys, time
sys.path.insert(0, {root!r})
mode, path = sys.argv[1], sys.argv[2]
import oomdoctor.pipeline, oomdoctor.views.json_report
from oomdoctor.commands import open as open_command
from oomdoctor.tui.app import make_loading_app
from oomdoctor.tui.overview import OverviewPane
from oomdoctor.tui.compare import CompareView, make_compare_app
from textual.widgets import ProgressBar

async def compare_screen():
    app = make_compare_app(open_command.compare_loader_for(path, path, device=None, max_bytes=None), source_a=path, source_b=path)
    start = time.perf_counter()
    async with app.run_test(size=(80, 24)) as pilot:
        while not app.query(CompareView):
            await asyncio.sleep(0.02)
        await pilot.pause()
        seconds = time.perf_counter() - start
    return seconds

async def first_screen():
    app = make_loading_app(open_command.loader_for(path, device=None, max_bytes=None), source=path)
    samples = []
    start = time.perf_counter()
    async with app.run_test(size=(80, 24)) as pilot:
        while not app.query(OverviewPane):
            for bar in app.query(ProgressBar).results(ProgressBar):
                samples.append((round(time.perf_counter() - start, 2), bar.progress))
            await asyncio.sleep(0.02)
        await pilot.pause()  # the overview drawn
        seconds = time.perf_counter() - start
    return seconds, samples

start = time.perf_counter()
if mode == "report":
    oomdoctor.pipeline.report_file(path, "json")
    print(json.dumps({{"seconds": time.perf_counter() - start}}))
elif mode == "diff":
    oomdoctor.pipeline.render_diff(oomdoctor.pipeline.diff_files(path, path), "json")
    print(json.dumps({{"seconds": time.perf_counter() - start}}))
elif mode.startswith("compare"):
    if mode == "compare-serial":
        oomdoctor.pipeline.PARALLEL_SIDE_MIN_BYTES = 1 << 62  # both files read in the app's process
    print(json.dumps({{"seconds": asyncio.run(compare_screen())}}))
else:
    seconds, samples = asyncio.run(first_screen())
    print(json.dumps({{"seconds": seconds, "samples": samples}}))
"""


def measure(mode: str, path: Path) -> dict:
    code = CHILD.format(root=str(ROOT))
    done = subprocess.run([sys.executable, "-c", code, mode, str(path)], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--source", type=Path, default=None)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--compare", action="store_true", help="time open A --compare B instead")
    args = parser.parse_args()
    source = source_snapshot(args.source)
    if source is None:
        return 2
    if args.compare:
        return compare_main(source, args.events, args.runs)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "million.pickle"
        count = build(source, args.events, path)
        reports, screens = [], []
        for _ in range(args.runs):
            reports.append(measure("report", path))
            screens.append(measure("open", path))
    report_s = statistics.median(r["seconds"] for r in reports)
    screen_s = statistics.median(r["seconds"] for r in screens)
    samples = screens[len(screens) // 2]["samples"]
    shown = sorted({progress for _, progress in samples})
    print(f"snapshot: {count} events from {source.name}")
    print(f"report --format json:           {report_s:.2f} s")
    print(f"open, until the overview shows: {screen_s:.2f} s")
    print(f"ratio: {screen_s / report_s:.2f}x  (target <= {TARGET_RATIO:.0f}x)")
    print(
        f"progress bar while loading: {len(samples)} samples, {len(shown)} distinct values "
        f"({', '.join(f'{p:.0f}' for p in shown[:12])}{', ...' if len(shown) > 12 else ''})"
    )
    print(f"(medians of {args.runs} alternating runs, each in a fresh process)")
    return 0


def compare_main(source: Path, events: int, runs: int) -> int:
    modes = ("diff", "compare", "compare-serial")
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "million.pickle"
        count = build(source, events, path)
        seconds: dict[str, list[float]] = {mode: [] for mode in modes}
        for _ in range(runs):
            for mode in modes:
                seconds[mode].append(measure(mode, path)["seconds"])
    diff_s, compare_s, serial_s = (statistics.median(seconds[mode]) for mode in modes)
    print(f"snapshot: {count} events from {source.name}, as both A and B")
    print(f"diff A B --format json:                            {diff_s:.2f} s")
    print(f"open A --compare B, until the comparison shows:    {compare_s:.2f} s")
    print(f"  the same with both files read in the app's process: {serial_s:.2f} s")
    print(f"speed-up: {serial_s / compare_s:.2f}x;  open --compare / diff: {compare_s / diff_s:.2f}x")
    print(f"(medians of {runs} alternating runs, each in a fresh process)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
