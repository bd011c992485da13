"""How long the terminal app takes to answer a cursor key on a one-million-event snapshot, at the
start, the middle and the end of the trace.

    python benchmarks/tui_keys.py [--events 1000000] [--source SNAPSHOT] [--presses 30] [--size 80x24]

The snapshot is built as benchmarks/analyse.py builds it (`build`: a real trace repeated to
--events events, self-consistent: each copy closed by its frees, the original trace last, so the
dump's own blocks are the state after the last event). The app runs headless on the Timeline tab.
In each region (the first, middle and last twentieth of the events) the cursor is put on a sampled
point there, then each key press (right, left, shift+arrows, ] and [, sent through the driver as a
terminal would send them) is timed from the key until the state replayed for it is shown and the
screen has painted it (its refresh timer's next paint: key to repaint). Printed per region: p50, p95 and max, in ms and
as ratios to the target of DESIGN §8 (a key answered within 100 ms).

Then two bursts at the middle: 20 right-arrow presses sent at once, and 20 sent 30 ms apart (a
held key's repeat), each timed from the last key until its state is shown, with how many replays
the 20 keys cost (a burst should collapse to the last, not replay all 20). Also timed on their
own: one cursor replay (`Replayer.state_at` plus naming the largest live blocks) per region and one
chart render.
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
KEYS = ("right", "left", "shift+right", "shift+left", "right_square_bracket", "left_square_bracket")
REGIONS = (("start", 0.0), ("middle", 0.5), ("end", 0.95))


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(share * (len(ordered) - 1))))]


def _region_point(analysis, share: float) -> int:
    """A sampled event in the region starting at `share` of the trace, a little way into it."""
    events = [p.event_index for p in analysis.replay.series]
    wanted = int(analysis.replay.event_count * (share + 0.02))
    return min(events, key=lambda e: abs(e - wanted))


PAINTS: list[tuple[float, object, int]] = []  # each paint of the screen: when, the state shown, the cursor


def _watch_paints(app, pane, chart) -> None:
    screen = app.screen
    paint = screen._compositor_refresh

    def painted() -> None:
        paint()
        PAINTS.append((time.perf_counter(), pane.shown_state, chart.cursor_index))

    screen._compositor_refresh = painted


async def _shown(app, pane, chart, before=None, first: int | None = None) -> float:
    """When the screen first painted (from its `first` paint on) a state replayed since `before`
    was shown that is the cursor's: what its refresh timer paints within a frame of the state."""
    first = len(PAINTS) if first is None else first
    deadline = time.perf_counter() + 10.0
    while time.perf_counter() < deadline:
        for when, state, cursor in PAINTS[first:]:
            if state is not before and state is not None and state.event_index == cursor == chart.cursor_index:
                return when
        first = len(PAINTS)
        await asyncio.sleep(0.0005)
    raise TimeoutError("the cursor's state was never painted")


def _key(app, name: str) -> None:
    from textual import events

    app._driver.send_message(events.Key(name, None))


async def _drive(app, analysis, presses: int, size: tuple[int, int]) -> tuple[dict, dict, list]:
    from oomdoctor.tui.timeline import TimelineChart, TimelinePane

    regions: dict[str, list[float]] = {}
    renders: dict[str, float] = {}
    bursts = []
    replays = [0]
    original = app.replay.state_at

    def counted(index):
        replays[0] += 1
        return original(index)

    app.replay.state_at = counted
    async with app.run_test(size=size) as pilot:
        await pilot.press("2")
        await app.workers.wait_for_complete()
        await pilot.pause()
        chart, pane = app.query_one(TimelineChart), app.query_one(TimelinePane)
        chart.focus()
        _watch_paints(app, pane, chart)
        for name, share in REGIONS:
            chart.cursor_index = _region_point(analysis, share)
            await _shown(app, pane, chart)
            times = []
            for number in range(presses):
                before = pane.shown_state
                start = time.perf_counter()
                _key(app, KEYS[number % len(KEYS)])
                await asyncio.sleep(0)
                times.append(await _shown(app, pane, chart, before) - start)
            regions[name] = times
            start = time.perf_counter()
            chart.render()
            renders[name] = time.perf_counter() - start
        for label, gap in (("20 right presses at once", 0.0), ("20 right presses 30 ms apart", 0.030)):
            chart.cursor_index = _region_point(analysis, 0.5)
            await _shown(app, pane, chart)
            replays[0] = 0
            before = pane.shown_state
            for _ in range(19):
                _key(app, "right")
                await asyncio.sleep(gap)
            first, start = len(PAINTS), time.perf_counter()
            _key(app, "right")
            await asyncio.sleep(0)
            bursts.append((label, await _shown(app, pane, chart, before, first) - start, replays[0]))
    app.replay.state_at = original
    return regions, renders, bursts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--source", type=Path, default=None)
    parser.add_argument("--presses", type=int, default=30, help="key presses timed in each region")
    parser.add_argument("--size", default="80x24", help="terminal size, COLUMNSxROWS")
    args = parser.parse_args()
    source = source_snapshot(args.source)
    if source is None:
        return 2
    width, height = (int(v) for v in args.size.split("x"))

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
    alone = {}
    for name, share in REGIONS:
        seconds = []
        for offset in range(5):
            index = min(int(analysis.replay.event_count * (share + 0.01 * offset)), analysis.replay.event_count - 1)
            start = time.perf_counter()
            state = replay.state_at(index)
            live_rows_at(state, replay.trace, replay.segments, analysis, limit=TOP_BLOCKS)
            seconds.append(time.perf_counter() - start)
        alone[name] = seconds
    regions, renders, bursts = asyncio.run(_drive(app, analysis, args.presses, (width, height)))

    print(f"snapshot: {count} events from {source.name}; app built in {build_seconds:.2f} s (replayer pass included)")
    print(f"key to repaint at {width}x{height}, {args.presses} presses per region; ratios to the 100 ms target:")
    for name, _ in REGIONS:
        times = regions[name]
        p50, p95, worst = statistics.median(times), percentile(times, 0.95), max(times)
        print(
            f"  {name:<6}  p50 {p50 * 1000:6.1f} ms ({p50 / TARGET_SECONDS:.2f}x)  p95 {p95 * 1000:6.1f} ms"
            f" ({p95 / TARGET_SECONDS:.2f}x)  max {worst * 1000:6.1f} ms ({worst / TARGET_SECONDS:.2f}x)"
            f"   replay alone median {statistics.median(alone[name]) * 1000:.1f} ms,"
            f" chart render {renders[name] * 1000:.1f} ms"
        )
    for label, seconds, count_replays in bursts:
        print(
            f"  {label}: final state shown {seconds * 1000:.1f} ms after the last key"
            f" ({seconds / TARGET_SECONDS:.2f}x), {count_replays} replays"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
