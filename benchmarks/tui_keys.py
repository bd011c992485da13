"""How long the terminal app takes to answer a key press on a one-million-event snapshot.

    python benchmarks/tui_keys.py [--events 1000000] [--source SNAPSHOT] [--presses 20]

The snapshot is built as benchmarks/analyse.py builds it (a real trace repeated to --events
events). The app runs headless at 80x24 on the Timeline tab; each cursor move (what the arrow keys
do) is timed until the state replayed by the cursor's worker is on screen. Also timed on their
own: one cursor replay (`Replayer.state_at` plus naming the largest live blocks) and one chart
render. Printed as ratios to the target of DESIGN §8: a key press answered within 100 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from analyse import build, source_snapshot  # noqa: E402  (benchmarks/analyse.py)

TARGET_SECONDS = 0.100


async def _time_cursor_moves(app, moves: list[int]) -> tuple[list[float], list[float]]:
    """Seconds from a cursor move until the replayed state is on screen; seconds per chart render."""
    from oomdoctor.tui.timeline import TimelineChart, TimelinePane

    moved, renders = [], []
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("2")
        await app.workers.wait_for_complete()
        await pilot.pause()
        chart, pane = app.query_one(TimelineChart), app.query_one(TimelinePane)
        for points in moves:
            start = time.perf_counter()
            chart.action_move(points)  # what left/right/shift+arrows call
            while pane.shown_state is None or pane.shown_state.event_index != chart.cursor_index:
                await asyncio.sleep(0.0005)
            moved.append(time.perf_counter() - start)
            start = time.perf_counter()
            chart.render()
            renders.append(time.perf_counter() - start)
    return moved, renders


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--source", type=Path, default=None)
    parser.add_argument("--presses", type=int, default=20, help="rounds of six cursor moves (and replays timed alone)")
    args = parser.parse_args()
    source = source_snapshot(args.source)
    if source is None:
        return 2

    from oomdoctor.analysis import analyse
    from oomdoctor.load import load
    from oomdoctor.tui.app import make_app
    from oomdoctor.tui.content import live_rows_at
    from oomdoctor.tui.timeline import TOP_BLOCKS

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "million.pickle"
        count = build(source, args.events, path)
        snapshot = load(path)
    analysis = analyse(snapshot)
    started = time.perf_counter()
    app = make_app(analysis, snapshot, source=path.name)
    build_seconds = time.perf_counter() - started

    replay = app.replay
    events = [p.event_index for p in analysis.replay.series]
    picks = events[:: max(1, len(events) // args.presses)][: args.presses]
    replays = []
    for index in picks:
        start = time.perf_counter()
        state = replay.state_at(index)
        live_rows_at(state, replay.trace, replay.segments, analysis, limit=TOP_BLOCKS)
        replays.append(time.perf_counter() - start)
    moves, renders = asyncio.run(
        _time_cursor_moves(app, [-1, 1, -10, 10, -40, -1] * args.presses)
    )  # wanders back through the trace

    print(f"snapshot: {count} events from {source.name}; app built in {build_seconds:.2f} s (replayer pass included)")
    print(
        f"cursor replay alone (state_at + top blocks): median {statistics.median(replays) * 1000:.1f} ms, max {max(replays) * 1000:.1f} ms"
    )
    print(f"timeline chart render at 80x24: median {statistics.median(renders) * 1000:.2f} ms")
    print(
        f"cursor key to replayed state shown: median {statistics.median(moves) * 1000:.1f} ms, max {max(moves) * 1000:.1f} ms"
    )
    print(
        f"ratio to the 100 ms target: median {statistics.median(moves) / TARGET_SECONDS:.2f}x, worst {max(moves) / TARGET_SECONDS:.2f}x"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
