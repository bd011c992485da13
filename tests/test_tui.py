"""The terminal app: what each tab shows (as data first), then the app driven by Textual's pilot."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from functools import cache

import pytest

pytest.importorskip("textual")

from textual import events  # noqa: E402
from textual.widgets import DataTable, Input, Static, TabbedContent, Tree  # noqa: E402

from oomdoctor.analysis import analyse, replayer  # noqa: E402
from oomdoctor.analysis.frame_kinds import USER, frame_kind, lead_frame_index  # noqa: E402
from oomdoctor.cli import main  # noqa: E402
from oomdoctor.commands import open as open_command  # noqa: E402
from oomdoctor.examples import EXAMPLE_DUMP  # noqa: E402
from oomdoctor.load import load  # noqa: E402
from oomdoctor.metadata import COMPONENTS  # noqa: E402
from oomdoctor.model import ACTIVE_ALLOCATED, INACTIVE, Block, Segment  # noqa: E402
from oomdoctor.tui import allocations, content  # noqa: E402
from oomdoctor.tui.app import Browser, LoadingView, make_app, make_loading_app  # noqa: E402
from oomdoctor.tui.stack import StackPane  # noqa: E402
from oomdoctor.tui.timeline import AXIS_WIDTH, OOM_MARK, SHORT_LABELS, TimelineChart, TimelinePane  # noqa: E402
from oomdoctor.units import human_size  # noqa: E402
from oomdoctor.views import phrasing  # noqa: E402
from tests.builders import spike_sim  # noqa: E402
from tests.conftest import FIXTURES  # noqa: E402

DUMPS = FIXTURES / "dumps"
LEAK = DUMPS / "creeping-leak-gpt-adamw.pickle"  # six steps, a few thousand events
FRAGMENTED = DUMPS / "fragmentation-retrieval-class-scores.pickle"


@cache
def loaded(path):
    snapshot = load(path)
    return snapshot, analyse(snapshot)


def run_app(app, scenario, size=(80, 24)):
    """Drive `app` headless through `scenario(app, pilot)` and return what it returns."""

    async def drive():
        async with app.run_test(size=size) as pilot:
            await settle(app, pilot)
            return await scenario(app, pilot)

    return asyncio.run(drive())


async def settle(app, pilot):
    """Let messages, mounts and the replay workers finish (no clock involved)."""
    await pilot.pause()
    await app.workers.wait_for_complete()
    await pilot.pause()


async def until(pilot, condition, seconds: float = 30.0) -> None:
    """Let the app run until `condition()` holds, at most `seconds` (the caller asserts it after):
    it returns as soon as it holds, so the bound is only for a loaded machine, which delays the
    app's timers and workers (3 s was once too little, with two test runs on two cores)."""
    for _ in range(int(seconds / 0.02)):
        if condition():
            return
        await pilot.pause(0.02)


def text_of(widget: Static) -> str:
    return str(widget.content)


def stack_of(app, pane_id: str) -> str:
    """The text of a stack pane (a scrolling pane around one Static)."""
    return text_of(app.query_one(f"#{pane_id}", StackPane).text_widget)


# --- the data each tab shows --------------------------------------------------------------------


def test_overview_leads_with_the_verdict_then_evidence_and_recommendations():
    _, analysis = loaded(EXAMPLE_DUMP)
    sections = content.overview_sections(analysis, "example.pickle")
    assert sections[0].title.startswith("Verdict: optimizer-state-buildup")
    assert sections[0].lines[0] == phrasing.summary(analysis.summary)
    titles = [s.title for s in sections]
    assert titles[1] == "Evidence" and titles[2].startswith("What to change")
    assert len(sections[1].lines) == len(analysis.evidence)
    assert any(human_size(analysis.accounting.request_bytes) in line for line in sections[3].lines)


def test_timeline_columns_cover_every_sampled_point_once():
    _, analysis = loaded(LEAK)
    timeline = content.Timeline(analysis)
    for width in (7, 78, len(analysis.replay.series) + 50):
        columns = timeline.columns(width)
        assert len(columns) == width
        covered = set()
        for column in columns:
            covered.update(range(column.first_point, column.last_point + 1))
        assert covered == set(range(len(analysis.replay.series)))
    assert [c.step for c in timeline.columns(78) if c.step is not None][-1] == analysis.steps[-1].step


def test_timeline_cursor_steps_along_the_sampled_points():
    _, analysis = loaded(LEAK)
    timeline = content.Timeline(analysis)
    events = [p.event_index for p in analysis.replay.series]
    start = timeline.start_index()
    assert start == analysis.replay.target_index
    back = timeline.next_point(start, -1)
    assert back < start and back in events
    assert timeline.next_point(back, 1) > back
    assert timeline.next_point(events[3], -100) == events[0]
    assert timeline.next_point(events[3], 10_000) == events[-1]


def _spike():
    snapshot = spike_sim(spike_after=251).snapshot(metadata=False)
    return snapshot, analyse(snapshot)


@pytest.mark.parametrize("source", ["demo", "spike"])
def test_the_tallest_column_is_the_replayed_peak_and_holds_the_peak_event(source):
    snapshot, analysis = loaded(EXAMPLE_DUMP) if source == "demo" else _spike()
    timeline = content.Timeline(analysis)
    peak = analysis.replay.peak_allocated_bytes
    assert timeline.max_bytes == timeline.peak_bytes == peak
    for width in (7, 74, 154, len(analysis.replay.series) + 50):
        columns = timeline.columns(width)
        tallest = max(columns, key=lambda c: c.peak.allocated_bytes)
        assert tallest.peak.allocated_bytes == peak
        assert tallest.first_event <= analysis.replay.peak_index <= tallest.last_event
        number = timeline.cursor_column(columns, analysis.replay.peak_index)
        assert columns[number].peak.allocated_bytes == peak
        assert None not in content.stacked_cells(tallest.peak, timeline.max_bytes, 8)  # full height
        assert all(
            None in content.stacked_cells(c.peak, timeline.max_bytes, 50)
            for c in columns
            if c.peak.allocated_bytes * 51 < peak * 50
        )
    if source == "spike":  # the sampled series alone misses the spike
        assert max(p.allocated_bytes for p in analysis.replay.series) < peak


def test_a_column_covers_its_events_and_is_at_least_each_of_them():
    snapshot, analysis = _spike()
    timeline = content.Timeline(analysis)
    fresh = replayer(snapshot, 0)
    columns = timeline.columns(60)
    assert columns[0].first_event == 0 and columns[-1].last_event == analysis.replay.event_count - 1
    for before, after in zip(columns, columns[1:]):
        assert after.first_event == before.last_event + 1
    for index in range(0, analysis.replay.event_count, 97):
        column = columns[timeline.cursor_column(columns, index)]
        assert column.first_event <= index <= column.last_event
        assert fresh.state_at(index).counted_bytes <= column.peak.allocated_bytes


def test_stacked_cells_fill_in_proportion_and_by_component():
    point = analyse(load(EXAMPLE_DUMP)).replay.series[-1]
    full = content.stacked_cells(point, max(point.allocated_bytes, sum(point.components)), 8)
    assert None not in full
    half = content.stacked_cells(point, 2 * max(point.allocated_bytes, sum(point.components)), 8)
    assert half.count(None) == 4
    biggest = max(range(len(point.components)), key=lambda c: point.components[c])
    assert biggest in full


def test_segment_bar_shows_allocated_and_free_in_address_order():
    mib = 1 << 20
    segment = Segment(
        0, 0, 4 * mib, 0, "large", (Block(0, mib, mib, ACTIVE_ALLOCATED), Block(mib, 3 * mib, 0, INACTIVE))
    )
    assert content.segment_bar(segment, 8) == content.BAR_ALLOCATED * 2 + content.BAR_FREE * 6
    assert content.largest_free_block_bytes(segment) == 3 * mib


def test_component_tree_holds_every_live_byte_once():
    _, analysis = loaded(LEAK)
    nodes = content.component_nodes(analysis)
    assert {n.name: n.bytes for n in nodes} == {c.name: c.bytes for c in analysis.components if c.bytes}
    for node in nodes:
        assert sum(g.bytes for g in node.groups) == node.bytes
        assert sum(len(g.blocks) for g in node.groups) == sum(
            1 for b in analysis.live_blocks if b.component == node.name
        )


def test_search_keeps_rows_that_match_every_word():
    _, analysis = loaded(EXAMPLE_DUMP)
    rows = content.allocation_rows(analysis)
    assert [r.block.size_bytes for r in rows] == sorted((b.size_bytes for b in analysis.live_blocks), reverse=True)
    found = content.filter_rows(rows, "EXP_AVG_SQ")
    assert found and len(found) < len(rows)
    assert all("exp_avg_sq" in (r.block.name or "") for r in found)
    assert content.filter_rows(rows, "exp_avg_sq body.2") == [r for r in found if "body.2" in r.block.name]
    assert content.filter_rows(rows, "") == rows
    assert content.filter_rows(rows, "no-such-thing-anywhere") == []


class _Column:
    """A million-event trace column that answers only for the slices it is asked for (any
    iteration over it fails the test) and remembers them."""

    def __init__(self, value, read):
        self.value, self.read = value, read

    def __len__(self):
        return 1_000_000

    def __getitem__(self, where):
        if isinstance(where, slice):
            self.read.append((where.start, where.stop))
            return tuple(self.value(i) for i in range(*where.indices(len(self))))
        self.read.append((where, where + 1))
        return self.value(where)

    def __iter__(self):
        raise AssertionError("the whole column was read")


def test_the_event_list_reads_only_a_window_of_a_million_event_trace():
    from oomdoctor.model import DeviceTrace

    read = []
    actions = _Column(lambda i: "alloc" if i % 2 else "free_requested", read)
    addrs = _Column(lambda i: 0x7F0000000000 + 512 * (i // 2), read)
    sizes = _Column(lambda i: 512, read)
    trace = DeviceTrace(0, actions, addrs, sizes, _Column(lambda i: 0, read))  # type: ignore[arg-type]
    _, analysis = loaded(EXAMPLE_DUMP)
    rows = content.event_rows_around(trace, 500_000, analysis, around=5)
    assert [r.index for r in rows] == list(range(499_995, 500_006))
    assert [r.action for r in rows[:2]] == ["alloc", "free_requested"]
    assert rows[5].address == 0x7F0000000000 + 512 * 250_000 and rows[5].size_bytes == 512
    assert rows[5].label == "no stack recorded"
    assert read and all(stop - start <= 11 for start, stop in read)
    # at the trace's ends the window is cut, never shifted past them
    assert [r.index for r in content.event_rows_around(trace, 2, analysis, around=5)] == list(range(0, 8))
    assert [r.index for r in content.event_rows_around(trace, 10**9, analysis, around=1)] == [999_998, 999_999]


def test_the_content_module_imports_no_textual_or_rich():
    code = "import sys, oomdoctor.tui.content; print(sorted(m for m in sys.modules if m.split('.')[0] in ('textual', 'rich', 'torch')))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


# --- the app --------------------------------------------------------------------------------------


@pytest.mark.slow
def test_overview_shows_the_verdict_and_every_tab_fits_80_by_24():
    snapshot, analysis = loaded(EXAMPLE_DUMP)

    async def scenario(app, pilot):
        first = app.query(".overview-section").first(Static)
        assert "Verdict: optimizer-state-buildup" in text_of(first)
        assert phrasing.summary(analysis.summary) in text_of(first)
        visited = []
        for key, tab in zip("12345", ("overview", "timeline", "segments", "components", "allocations")):
            await pilot.press(key)
            await settle(app, pilot)
            assert app.query_one(TabbedContent).active == tab
            # the newly focused widget is laid out on the screen's next refresh (a timer, which a
            # loaded machine runs late): wait for it, a bounded while
            await until(pilot, lambda: app.focused is not None and app.focused.region.height > 0)
            focused = app.focused
            assert focused is not None and focused.region.height > 0
            assert focused.region.right <= 80 and focused.region.bottom <= 24
            visited.append(tab)
        return visited

    app = make_app(analysis, snapshot, source="example.pickle")
    assert len(run_app(app, scenario)) == 5


@pytest.mark.slow
@pytest.mark.parametrize("path", [LEAK, DUMPS / "no-oom-expandable-segments.pickle"], ids=lambda p: p.stem)
def test_other_dumps_open_and_every_tab_renders_at_80_by_24(path):
    snapshot, analysis = loaded(path)

    async def scenario(app, pilot):
        for key in "2345":
            await pilot.press(key)
            await settle(app, pilot)
        return app.query_one(TimelinePane).shown_state

    state = run_app(make_app(analysis, snapshot, source=path.name), scenario)
    assert state is not None


@pytest.mark.slow
def test_timeline_keys_move_the_cursor_and_the_label_shows_the_replayed_state():
    snapshot, analysis = loaded(LEAK)
    fresh = replayer(snapshot, analysis.device)

    async def scenario(app, pilot):
        await pilot.press("2")
        await settle(app, pilot)
        chart = app.query_one(TimelineChart)
        pane = app.query_one(TimelinePane)
        seen = [
            (
                chart.cursor_index,
                pane.shown_state,
                text_of(app.query_one("#cursor-state", Static)),
                text_of(app.query_one("#cursor-event", Static)),
            )
        ]
        for key in ("left", "left", "shift+left", "left_square_bracket", "p", "home", "right"):
            await pilot.press(key)
            await settle(app, pilot)
            seen.append(
                (
                    chart.cursor_index,
                    pane.shown_state,
                    text_of(app.query_one("#cursor-state", Static)),
                    text_of(app.query_one("#cursor-event", Static)),
                )
            )
        return seen

    seen = run_app(make_app(analysis, snapshot, source=LEAK.name), scenario)
    indices = [index for index, *_ in seen]
    assert indices[0] == analysis.replay.target_index
    assert indices[0] > indices[1] > indices[2] > indices[3] == indices[4] + 1
    assert indices[5] == analysis.replay.peak_index and indices[6] == 0 and indices[7] > 0
    for index, state, state_label, event_label in seen:
        expected = fresh.state_at(index)
        assert state.event_index == index
        assert state.allocated_bytes == expected.allocated_bytes
        assert f"allocated {human_size(expected.counted_bytes)}" in state_label
        assert event_label.startswith(f"event {index} of {analysis.replay.event_count}")
    assert "OOM" in seen[0][3]


def test_clicking_the_chart_moves_the_cursor_there():
    snapshot, analysis = loaded(LEAK)

    async def scenario(app, pilot):
        await pilot.press("2")
        await settle(app, pilot)
        await pilot.click("#timeline-chart", offset=(AXIS_WIDTH, 3))
        await settle(app, pilot)
        return app.query_one(TimelineChart).cursor_index, app.query_one(TimelinePane).shown_state

    index, state = run_app(make_app(analysis, snapshot, source=LEAK.name), scenario)
    first = content.Timeline(analysis).columns(78 - AXIS_WIDTH)[0]
    assert index == first.peak.event_index  # the column's most: what its height shows
    assert state.event_index == index and state.counted_bytes == first.peak.allocated_bytes


def _chart_lines(app) -> list[str]:
    return app.query_one(TimelineChart).render().plain.split("\n")


def _on_timeline(snapshot, analysis, then, size=(80, 24)):
    async def scenario(app, pilot):
        await pilot.press("2")
        await settle(app, pilot)
        return await then(app, pilot)

    return run_app(make_app(analysis, snapshot, source="spike.pickle"), scenario, size=size)


def test_the_oom_is_marked_in_the_column_holding_it_and_only_there():
    snapshot = spike_sim(spike_after=251, oom_after=120).snapshot(metadata=False)
    analysis = analyse(snapshot)
    oom = analysis.replay.ooms[0].event_index
    assert oom < analysis.replay.event_count // 2  # in the middle of the chart, not at its end

    async def then(app, pilot):
        return _chart_lines(app), app.query_one(TimelineChart).plot_width()

    lines, width = _on_timeline(snapshot, analysis, then)
    timeline = content.Timeline(analysis)
    columns = timeline.columns(width)
    marks = [(row, x) for row, line in enumerate(lines[:-2]) for x, glyph in enumerate(line) if glyph == OOM_MARK]
    assert [x - AXIS_WIDTH for _, x in marks] == [timeline.cursor_column(columns, oom)]
    assert columns[marks[0][1] - AXIS_WIDTH].first_event <= oom <= columns[marks[0][1] - AXIS_WIDTH].last_event


def test_the_chart_has_an_axis_in_sizes_with_the_peak_at_its_top():
    snapshot, analysis = _spike()

    async def then(app, pilot):
        return _chart_lines(app), text_of(app.query_one("#timeline-legend", Static))

    lines, legend = _on_timeline(snapshot, analysis, then)
    peak = analysis.replay.peak_allocated_bytes
    assert lines[0].startswith(f"{content.axis_label(peak):>{AXIS_WIDTH - 1}}┤")
    assert sum("┤" in line[:AXIS_WIDTH] for line in lines[:-2]) == 2  # the top and the middle
    assert f"top {human_size(peak)}" in legend
    assert lines[-2].lstrip().startswith("phase")


@pytest.mark.slow
def test_the_cursor_figure_and_the_column_under_it_agree():
    snapshot, analysis = _spike()

    async def then(app, pilot):
        chart, pane = app.query_one(TimelineChart), app.query_one(TimelinePane)
        seen = []
        for key in ("p", "left", "left", "right_square_bracket", "shift+left", "home", "end"):
            await pilot.press(key)
            await settle(app, pilot)
            seen.append((chart.cursor_index, pane.shown_state, text_of(app.query_one("#cursor-state", Static))))
        return seen, chart.plot_width()

    seen, width = _on_timeline(snapshot, analysis, then)
    timeline = content.Timeline(analysis)
    columns = timeline.columns(width)
    assert seen[0][0] == analysis.replay.peak_index
    differing = 0
    for index, state, line in seen:
        column = columns[timeline.cursor_column(columns, index)]
        assert state.event_index == index or (state.exact and index == analysis.replay.event_count - 1)
        assert line.startswith(f"allocated {human_size(state.counted_bytes)} ")
        assert state.counted_bytes <= column.peak.allocated_bytes
        if column.peak.allocated_bytes != state.counted_bytes:
            differing += 1
            assert f"column max {human_size(column.peak.allocated_bytes)}" in line
        else:
            assert "column max" not in line
    assert (
        "column max" not in seen[0][2] and f"allocated {human_size(analysis.replay.peak_allocated_bytes)}" in seen[0][2]
    )
    assert differing  # some move lands below its column's most


def test_without_colour_each_component_is_its_own_letter_in_the_chart_and_the_legend(monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")
    snapshot, analysis = loaded(LEAK)
    letters = list(content.COMPONENT_LETTERS.values())
    assert len(set(letters)) == len(letters) == len(COMPONENTS)

    async def then(app, pilot):
        assert app.no_color
        return _chart_lines(app), text_of(app.query_one("#timeline-legend", Static))

    lines, legend = _on_timeline(snapshot, analysis, then)
    drawn = {glyph for line in lines[:-2] for glyph in line[AXIS_WIDTH:]} - {" ", "│", OOM_MARK}
    assert "█" not in drawn and len(drawn) >= 3
    assert drawn <= set(letters)
    for letter in drawn:
        name = next(n for n, value in content.COMPONENT_LETTERS.items() if value == letter)
        assert f"{letter} {SHORT_LABELS[name]}" in legend


@pytest.mark.slow
def test_the_chart_grows_with_the_terminal():
    snapshot, analysis = loaded(LEAK)

    async def then(app, pilot):
        chart = app.query_one(TimelineChart)
        return chart.region.height, len(_chart_lines(app))

    heights = {size: _on_timeline(snapshot, analysis, then, size=size) for size in ((80, 16), (80, 24), (160, 50))}
    for height, lines in heights.values():
        assert height == lines >= content.CHART_MIN_ROWS + 2
    assert heights[(80, 16)][0] == content.CHART_MIN_ROWS + 2
    assert heights[(80, 16)][0] <= heights[(80, 24)][0] < heights[(160, 50)][0]
    assert heights[(160, 50)][0] >= 2 * (heights[(80, 24)][0] - 2)


@pytest.mark.slow
def test_a_burst_of_key_presses_replays_the_last_not_each():
    snapshot, analysis = loaded(LEAK)
    app = make_app(analysis, snapshot, source=LEAK.name)
    replayed = []
    original = app.replay.state_at

    def slow_state_at(index):
        replayed.append(index)
        time.sleep(0.05)
        return original(index)

    async def then(app, pilot):
        chart, pane = app.query_one(TimelineChart), app.query_one(TimelinePane)
        await pilot.press("home")
        await settle(app, pilot)
        app.replay.state_at = slow_state_at
        start = chart.cursor_index
        for _ in range(20):
            app._driver.send_message(events.Key("right", None))
        await settle(app, pilot)
        while pane.shown_state is None or pane.shown_state.event_index != chart.cursor_index:
            await asyncio.sleep(0.01)
        return start, chart.cursor_index, pane.shown_state, text_of(app.query_one("#cursor-event", Static))

    async def scenario(app, pilot):
        await pilot.press("2")
        await settle(app, pilot)
        return await asyncio.wait_for(then(app, pilot), 10)

    start, final, state, label = run_app(app, scenario)
    assert final == content.Timeline(analysis).next_point(start, 20)
    assert state.event_index == final and label.startswith(f"event {final} ")
    assert replayed[-1] == final and len(replayed) <= 4  # the first, maybe one on the way, the last


@pytest.mark.slow
def test_search_filters_the_allocation_table_and_a_row_shows_its_stack(monkeypatch):
    snapshot, analysis = loaded(EXAMPLE_DUMP)
    expected = content.filter_rows(content.allocation_rows(analysis), "exp_avg_sq")
    # a pause longer than the pilot takes between two keys on a loaded machine (it waits for each key
    # to be handled: 0.1 s and more, near the 0.15 s meant for a person typing), so that no prefix of
    # the word is searched for before the word
    monkeypatch.setattr(allocations, "SEARCH_PAUSE", 2.0)

    async def scenario(app, pilot):
        await pilot.press("5")
        await settle(app, pilot)
        table = app.query_one("#allocation-table", DataTable)
        before = table.row_count
        assert isinstance(app.focused, Input)
        await pilot.press(*"exp_avg_sq")
        await settle(app, pilot)
        typing = table.row_count  # the search waits for a pause in the typing
        # the pause's timer and the filter's worker run on the app's clock, which a loaded machine
        # delays: wait for the filtered rows rather than for a fixed time
        await until(pilot, lambda: table.row_count != before)
        await settle(app, pilot)
        after = table.row_count
        count_label = text_of(app.query_one("#allocation-count", Static))
        await pilot.press("enter")  # to the table
        await settle(app, pilot)
        return (
            before,
            after,
            typing,
            count_label,
            stack_of(app, "allocation-stack"),
            app.query_one(TabbedContent).active,
        )

    before, after, typing, count_label, stack, active = run_app(
        make_app(analysis, snapshot, source="example.pickle"), scenario
    )
    assert before == len(analysis.live_blocks)
    assert after == len(expected) < before == typing
    assert count_label.startswith(f"{len(expected)} of {before} live blocks")
    first = expected[0].block
    assert stack.startswith(f"{first.address:#x}")
    lead = first.frames[lead_frame_index(first.frames)]  # the user's line, not the innermost frame
    assert f"{lead.filename.rsplit('/', 1)[-1]}:{lead.line} in {lead.name}" in stack
    assert active == "allocations"  # typing digits or letters in the search box switches no tab


def test_a_stack_starts_at_the_users_line_and_f_shows_every_frame():
    snapshot, analysis = loaded(EXAMPLE_DUMP)
    largest = min(analysis.live_blocks, key=lambda b: (-b.size_bytes, b.address))  # the table's first row
    users = [frame for frame in largest.frames if frame_kind(frame) == USER]
    assert users and frame_kind(largest.frames[0]) != USER  # torch's frame is innermost: something to hide

    async def scenario(app, pilot):
        await pilot.press("5")
        await settle(app, pilot)
        await pilot.press(*"f", "backspace")  # typed in the search box: no toggle there
        await pilot.press("enter")  # to the table: its first row, the largest block
        await settle(app, pilot)
        shown = [stack_of(app, "allocation-stack")]
        for _ in range(2):
            await pilot.press("f")
            await settle(app, pilot)
            shown.append(stack_of(app, "allocation-stack"))
        await pilot.press("2")
        await settle(app, pilot)
        app.query_one("#cursor-blocks", DataTable).focus()
        await settle(app, pilot)
        timeline_pane = app.query_one(TimelinePane)
        return shown, timeline_pane.block_rows[0], stack_of(app, "cursor-stack")

    (default, every, again), timeline_row, timeline_stack = run_app(
        make_app(analysis, snapshot, source="example.pickle"), scenario
    )
    header, note, *frame_lines = default.splitlines()
    assert header.startswith(f"{largest.address:#x}")
    lead = users[0]
    assert frame_lines[0].endswith(f"{lead.filename.rsplit('/', 1)[-1]}:{lead.line} in {lead.name}")
    assert len([line for line in frame_lines if " in " in line]) == len(users)  # the user's frames only
    hidden = len(largest.frames) - len(users)
    assert note.startswith(f"{hidden} torch frame") and "f shows all" in note
    every_lines = [line for line in every.splitlines()[2:] if " in " in line]
    assert len(every_lines) == len(largest.frames) > len(users)
    assert every_lines[0].endswith(f"{largest.frames[0].line} in {largest.frames[0].name}")
    assert again == default
    # the Timeline's block table has a stack pane too, starting at its row's user line
    assert timeline_stack.startswith(f"{timeline_row.address:#x}")
    position = lead_frame_index(timeline_row.frames)
    assert position is not None
    timeline_lead = timeline_row.frames[position]
    assert (
        f"{timeline_lead.filename.rsplit('/', 1)[-1]}:{timeline_lead.line} in {timeline_lead.name}"
        in (timeline_stack.splitlines()[2])
    )


def test_a_long_stack_scrolls_once_its_pane_is_focused(corpus_dir):
    path = corpus_dir / "snapshots" / "oom_action__nesta_discrete_diffusion__memory_snapshot.json"
    snapshot, analysis = loaded(path)

    async def scenario(app, pilot):
        await pilot.press("5")
        await settle(app, pilot)
        await pilot.press("enter", "f")
        await settle(app, pilot)
        pane = app.query_one("#allocation-stack", StackPane)
        pane.focus()
        await pilot.press("end")
        await pilot.wait_for_animation()  # End scrolls animated, for about a second here
        await settle(app, pilot)
        return pane.region.height, pane.max_scroll_y, pane.scroll_y, stack_of(app, "allocation-stack").count("\n")

    height, max_scroll, scrolled, lines = run_app(make_app(analysis, snapshot, source=path.name), scenario)
    assert lines > 200 and max_scroll > 0 and scrolled == max_scroll and height >= 6


def test_segments_list_the_layout_at_the_oom_and_a_block_shows_its_stack():
    snapshot, analysis = loaded(FRAGMENTED)
    state = replayer(snapshot, analysis.device).state_at(analysis.replay.target_index)

    async def scenario(app, pilot):
        await pilot.press("3")
        await settle(app, pilot)
        segments = app.query_one("#segment-table", DataTable)
        blocks = app.query_one("#segment-blocks", DataTable)
        await pilot.press("tab")  # to the blocks of the first segment
        await settle(app, pilot)
        return (
            segments.row_count,
            blocks.row_count,
            text_of(app.query_one("#fragmentation", Static)),
            stack_of(app, "segment-stack"),
        )

    segment_count, block_count, summary, stack = run_app(make_app(analysis, snapshot, source=FRAGMENTED.name), scenario)
    assert segment_count == len(state.segments)
    assert block_count == len(state.segments[0].blocks)
    fragmentation = analysis.fragmentation
    assert f"largest block {human_size(fragmentation.largest_usable_free_block_bytes)}" in summary
    assert f"request fits if contiguous: {'yes' if fragmentation.would_fit_if_contiguous else 'no'}" in summary
    first = state.segments[0].blocks[0]
    assert stack.startswith(f"{first.address:#x}")


def test_component_tree_lists_components_largest_first_down_to_blocks():
    snapshot, analysis = loaded(EXAMPLE_DUMP)
    nodes = content.component_nodes(analysis)

    async def scenario(app, pilot):
        await pilot.press("4")
        await settle(app, pilot)
        tree = app.query_one("#component-tree", Tree)
        labels = [str(child.label) for child in tree.root.children]
        # down: first component, its first group, that group's first block
        for _ in range(3):
            await pilot.press("down")
        await settle(app, pilot)
        return labels, tree.cursor_node.data, stack_of(app, "component-stack")

    labels, block, stack = run_app(make_app(analysis, snapshot, source="example.pickle"), scenario)
    assert [label.split("  ")[0] for label in labels] == [content.COMPONENT_LABELS[n.name] for n in nodes]
    assert block is nodes[0].groups[0].blocks[0]
    assert stack.startswith(f"{block.address:#x} ({human_size(block.size_bytes)})")


# --- loading in the worker, and the commands --------------------------------------------------------


def test_loading_app_shows_progress_then_the_tabs():
    stages = []

    def loader(enter_stage):
        snapshot = load(EXAMPLE_DUMP)
        enter_stage("analysing")
        stages.append("analysing")
        return snapshot, analyse(snapshot)

    async def scenario(app, pilot):
        await settle(app, pilot)
        return bool(app.query(LoadingView)), bool(app.query(Browser)), app.analysis

    loading, browsing, analysis = run_app(make_loading_app(loader, source="example.pickle"), scenario)
    assert stages == ["analysing"]
    assert not loading and browsing
    assert analysis.verdict == "optimizer-state-buildup"


def test_open_moves_the_progress_bar_while_reading_and_builds_tabs_on_first_visit():
    seen = []

    def loader(report):
        snapshot = load(EXAMPLE_DUMP, progress=lambda fraction: report(fraction=0.7 * fraction))
        report("analysing")
        seen.append("analysed")
        return snapshot, analyse(snapshot)

    async def scenario(app, pilot):
        await settle(app, pilot)
        browser = app.query_one(Browser)
        before = set(browser.built), bool(app.query(TimelinePane))
        await pilot.press("2")
        await settle(app, pilot)
        return before, set(browser.built), app.query_one(TimelinePane).shown_state is not None

    (built, timeline), after, shown = run_app(make_loading_app(loader, source="example.pickle"), scenario)
    assert seen == ["analysed"]
    assert built == {"overview"} and not timeline  # only the overview is built at first
    assert after == {"overview", "timeline"} and shown


def test_load_reports_its_progress_from_reading_to_the_built_model():
    fractions = []
    load(EXAMPLE_DUMP, progress=fractions.append)
    # reading reports as the bytes come (a small file: in one read), then the built model
    assert fractions == sorted(fractions) and fractions[-2:] == [0.8, 1.0] and len(fractions) >= 3


def test_a_load_error_in_the_worker_ends_the_app_with_one_line_and_exit_2(tmp_path):
    bad = tmp_path / "not-a-snapshot.pickle"
    bad.write_bytes(b"this is not a pickle at all")
    app = make_loading_app(open_command.loader_for(str(bad), device=None, max_bytes=None), source=str(bad))

    async def scenario(app, pilot):
        await settle(app, pilot)
        return app.return_code

    assert run_app(app, scenario) == 2
    assert app.error is not None and app.error.exit_code == 2
    message = str(app.error)
    assert message.startswith(str(bad)) and "\n" not in message


def test_asking_for_a_missing_device_ends_the_app_with_exit_2():
    app = make_loading_app(
        open_command.loader_for(str(EXAMPLE_DUMP), device=7, max_bytes=None), source="example.pickle"
    )

    async def scenario(app, pilot):
        await settle(app, pilot)
        return app.return_code

    assert run_app(app, scenario) == 2
    assert "no device 7" in str(app.error)


@pytest.mark.parametrize(
    "argv, words",
    [
        (["open", "no-such-dump.pickle"], "no such file"),
        (["open", str(FIXTURES)], "is a directory"),
        (["open", str(EXAMPLE_DUMP), "--max-bytes", "1KiB"], "larger than"),
        (["open", str(EXAMPLE_DUMP)], "needs a terminal"),  # pytest's stdout is no terminal
    ],
    ids=["missing", "directory", "too-large", "no-terminal"],
)
def test_open_refuses_before_the_app_starts_with_one_line(argv, words, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1 and "Traceback" not in err


def test_open_refuses_an_empty_file(tmp_path, capsys):
    empty = tmp_path / "empty.pickle"
    empty.write_bytes(b"")
    assert main(["open", str(empty)]) == 2
    assert "empty" in capsys.readouterr().err


def test_demo_prints_the_report_when_not_in_a_terminal_or_with_text(capsys):
    assert main(["demo", "--text"]) == 0
    assert capsys.readouterr().out.startswith("Verdict: optimizer-state-buildup")
    assert main(["demo", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["verdict"] == "optimizer-state-buildup"


@pytest.mark.slow
def test_a_dump_with_thousands_of_live_blocks_lists_the_largest_and_still_searches(corpus_dir):
    from oomdoctor.tui.allocations import SHOWN_ROWS

    path = corpus_dir / "snapshots" / "no_trace_6633_blocks__muduard_layoutediting__dump_snapshot.pickle"
    if not path.exists():
        pytest.skip("corpus snapshot with thousands of blocks not present")
    snapshot = load(path)
    analysis = analyse(snapshot)
    assert len(analysis.live_blocks) > SHOWN_ROWS

    async def scenario(app, pilot):
        await pilot.press("5")
        await settle(app, pilot)
        table = app.query_one("#allocation-table", DataTable)
        listed, label = table.row_count, text_of(app.query_one("#allocation-count", Static))
        await pilot.press(*"0x")  # every address matches
        await settle(app, pilot)
        return listed, label, table.row_count

    listed, label, after_search = run_app(make_app(analysis, snapshot, source=path.name), scenario)
    assert listed == SHOWN_ROWS == after_search
    assert (
        label.startswith(f"{len(analysis.live_blocks)} of {len(analysis.live_blocks)} live blocks")
        and f"largest {SHOWN_ROWS} listed" in label
    )


def test_every_phase_has_its_own_timeline_letter_and_every_pass_a_colour():
    from oomdoctor.tui.timeline import PHASE_COLORS
    from oomdoctor.vocabulary import Phase

    letters = [content.PHASE_LETTERS.get(phase.value) for phase in Phase]
    assert None not in letters and len(set(letters)) == len(letters)
    assert {Phase.FORWARD, Phase.EVALUATION, Phase.BACKWARD, Phase.OPTIMIZER_STEP} <= set(PHASE_COLORS)
    assert PHASE_COLORS[Phase.EVALUATION] != PHASE_COLORS[Phase.FORWARD]
