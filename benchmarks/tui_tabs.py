"""How long the terminal app takes to switch tabs once each tab is built, on a large snapshot.

    python benchmarks/tui_tabs.py [SNAPSHOT] [--size 160x50] [--rounds 5]

Default SNAPSHOT: the corpus snapshot with the most segments (../shared/corpus, or where
OOMDOCTOR_CORPUS points). The app runs headless; every tab is visited once (its first build, timed
apart), then each tab key is pressed `--rounds` times in turn. Each switch is timed two ways, from
the key to the next idle screen: wall time through Textual's pilot (which also waits for the
screen's refresh timer), and the process's CPU time over the same interval (the work the switch
costs: hiding one tab, showing another, laying it out and painting it). Printed against the
100 ms target of issue 13 ("tab switches under 100 ms after first build"), with Textual's
animations as they are set (TEXTUAL_ANIMATIONS, "full" by default: the tab underline's 0.3 s slide
is painted frame by frame, and its frames are counted in the switch's CPU), then with them off.
Not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

TARGET_SECONDS = 0.100
TABS = "12345"


def largest_corpus_snapshot() -> Path | None:
    from oomdoctor.load import load

    root = Path(os.environ.get("OOMDOCTOR_CORPUS") or HERE.parent.parent / "shared" / "corpus")
    best: tuple[int, Path] | None = None
    for path in sorted(root.glob("snapshots/*")):
        try:
            count = len(load(path).segments)
        except Exception:  # noqa: BLE001 - files the loader refuses are not candidates
            continue
        if best is None or count > best[0]:
            best = (count, path)
    return best[1] if best else None


async def _switches(app, rounds: int, size: tuple[int, int]) -> tuple[dict[str, float], dict[str, list[tuple]]]:
    from textual.widgets import Input

    first: dict[str, float] = {}
    again: dict[str, list[tuple]] = {tab: [] for tab in TABS}

    async def settle(pilot) -> None:
        await pilot.pause()
        await app.workers.wait_for_complete()
        await pilot.pause()

    async def leave_input(pilot) -> None:
        """Allocations focuses its search box, which would take the next digit as text: Esc first."""
        if isinstance(app.focused, Input):
            await pilot.press("escape")
            await settle(pilot)

    async with app.run_test(size=size) as pilot:
        await settle(pilot)
        for tab in TABS[1:] + TABS[0]:
            await leave_input(pilot)
            start = time.perf_counter()
            await pilot.press(tab)
            await settle(pilot)
            first[tab] = time.perf_counter() - start
        for _ in range(rounds):
            for tab in TABS[1:] + TABS[0]:
                await leave_input(pilot)
                wall, cpu = time.perf_counter(), time.process_time()
                await pilot.press(tab)
                await settle(pilot)
                again[tab].append((time.perf_counter() - wall, time.process_time() - cpu))
    return first, again


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("snapshot", nargs="?", type=Path)
    parser.add_argument("--size", default="160x50", help="terminal size, COLUMNSxROWS")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    path = args.snapshot or largest_corpus_snapshot()
    if path is None:
        print("no snapshot given and no corpus found", file=sys.stderr)
        return 2
    width, height = (int(value) for value in args.size.split("x"))

    from oomdoctor.analysis import analyse
    from oomdoctor.load import load
    from oomdoctor.tui.app import make_app

    snapshot = load(path)
    analysis = analyse(snapshot)
    blocks = sum(len(segment.blocks) for segment in snapshot.segments)
    print(f"{path.name}: {len(snapshot.segments)} segments, {blocks} blocks; {width}x{height}, {args.rounds} rounds")
    names = {"1": "overview", "2": "timeline", "3": "segments", "4": "components", "5": "allocations"}
    # Textual slides the tab underline to the new tab over 0.3 s, painting each frame of it: the
    # switch's own work is timed again with animations off (what TEXTUAL_ANIMATIONS=none gives)
    for animation in (None, "none"):
        app = make_app(analysis, snapshot, source=path.name)
        if animation is not None:
            app.animation_level = animation
        first, again = asyncio.run(_switches(app, args.rounds, (width, height)))
        print(f"animations {app.animation_level}:")
        for tab in TABS:
            walls = [wall for wall, _ in again[tab]]
            cpus = [cpu for _, cpu in again[tab]]
            print(
                f"  {tab} {names[tab]:<12} first build {first[tab] * 1000:7.0f} ms;"
                f" after it: CPU median {statistics.median(cpus) * 1000:5.0f} ms"
                f" ({statistics.median(cpus) / TARGET_SECONDS:.2f}x), max {max(cpus) * 1000:5.0f} ms;"
                f" wall through the pilot median {statistics.median(walls) * 1000:5.0f} ms"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
