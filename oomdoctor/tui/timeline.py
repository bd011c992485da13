"""The Timeline tab: memory by component over the recorded events, and a cursor that replays any event."""

from __future__ import annotations

import threading
import time

from rich.text import Text
from textual import events, on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.reactive import reactive
from textual.widget import Widget
from textual.widgets import Static

from oomdoctor.analysis import Replayer
from oomdoctor.analysis.results import Analysis, EventState
from oomdoctor.metadata import COMPONENTS
from oomdoctor.model import Snapshot
from oomdoctor.tui.content import (
    CHART_MIN_ROWS,
    COMPONENT_LABELS,
    COMPONENT_LETTERS,
    PHASE_LETTERS,
    BlockRow,
    ChartColumn,
    EventRow,
    Timeline,
    axis_label,
    chart_rows,
    event_rows_around,
    label_width,
    live_rows_at,
    path_style,
    phase_words,
    stacked_cells,
)
from oomdoctor.tui.guard import GuardedPane, guarded, report_failure
from oomdoctor.tui.kept import DataTable
from oomdoctor.tui.safe import plain, row
from oomdoctor.tui.stack import StackPane
from oomdoctor.units import human_size

COMPONENT_COLORS = {
    "parameters": "#4e79a7",
    "gradients": "#f28e2b",
    "optimizer_state": "#e15759",
    "activations": "#59a14f",
    "temporaries": "#76b7b2",
    "inputs": "#edc948",
    "buffers": "#b07aa1",
    "workspace": "#86bcb6",
    "preallocated": "#d37295",
    "other": "#ff9da7",
    "unknown": "#9c755f",
}
SHORT_LABELS = {
    "parameters": "params",
    "gradients": "grads",
    "optimizer_state": "optim",
    "activations": "activ",
    "temporaries": "temps",
    "inputs": "inputs",
    "buffers": "buffers",
    "workspace": "wkspace",
    "preallocated": "prealloc",
    "other": "other",
    "unknown": "unknown",
}
PHASE_COLORS = {
    "forward": "#59a14f",
    "backward": "#f28e2b",
    "optimizer_step": "#e15759",
    "zero_grad": "#b07aa1",
    "evaluation": "#4e79a7",
}
TOP_BLOCKS = 8
QUICK_REPLAY_SECONDS = 0.02  # a cursor replay this quick runs on the app's thread
REPLAY_DELAY_SECONDS = 0.008  # after this, so the keys of a burst move the cursor first


AXIS_WIDTH = 6  # "1.66G" and the axis line
OOM_MARK = "▼"


class TimelineChart(Widget, can_focus=True):
    """Stacked columns of allocated bytes by component (each column as tall as the most allocated
    over its events), a y axis at the left, the OOM marked, and a phase band and a step band under
    them. Its height follows the pane's (`chart_rows`); without colour each component is its letter."""

    BINDINGS = [
        Binding("left", "move(-1)", "Earlier", show=True),
        Binding("right", "move(1)", "Later", show=True),
        Binding("shift+left", "move(-10)", "10 back", show=False),
        Binding("shift+right", "move(10)", "10 on", show=False),
        Binding("left_square_bracket", "step_event(-1)", "-1 event", show=False),
        Binding("right_square_bracket", "step_event(1)", "+1 event", show=False),
        Binding("home", "jump('first')", "First", show=False),
        Binding("end", "jump('last')", "Last", show=False),
        Binding("o", "jump('target')", "OOM", show=True),
        Binding("p", "jump('peak')", "Peak", show=True),
    ]

    cursor_index: reactive[int] = reactive(0, repaint=False)  # repainted when its column changes

    class CursorMoved(Message):
        def __init__(self, event_index: int) -> None:
            super().__init__()
            self.event_index = event_index

    def __init__(self, timeline: Timeline, **kwargs) -> None:
        super().__init__(**kwargs)
        self.timeline = timeline
        self.set_reactive(TimelineChart.cursor_index, timeline.start_index())
        self._rows = CHART_MIN_ROWS
        self._drawn_cursor = -1  # the column the cursor was last drawn in
        self._stacks: dict[tuple[int, int], list[list[int | None]]] = {}

    def on_mount(self) -> None:
        self.post_message(self.CursorMoved(self.cursor_index))

    def watch_cursor_index(self, event_index: int) -> None:
        columns = self.timeline.columns(self.plot_width())
        if columns and self.timeline.cursor_column(columns, event_index) != self._drawn_cursor:
            self.refresh()  # most moves stay in their column: nothing to repaint
        self.post_message(self.CursorMoved(event_index))

    def action_move(self, points: int) -> None:
        self.cursor_index = self.timeline.next_point(self.cursor_index, points)

    def action_step_event(self, events_: int) -> None:
        self.cursor_index = self.timeline.clamp(self.cursor_index + events_)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """`o` only where the trace has an OOM, `p` only where it has a peak: the footer offers
        only the keys that do something."""
        if action == "jump" and parameters == ("target",):
            return bool(self.timeline.oom_indices) and self.timeline.target_index is not None
        if action == "jump" and parameters == ("peak",):
            return self.timeline.peak_index is not None
        return True

    def action_jump(self, where: str) -> None:
        timeline = self.timeline
        targets = {
            "first": 0,
            "last": timeline.event_count - 1,
            "target": timeline.start_index(),
            "peak": timeline.peak_index,
        }
        wanted = targets.get(where)
        if wanted is not None:
            self.cursor_index = timeline.clamp(wanted)

    @property
    def monochrome(self) -> bool:
        """Colour is off (NO_COLOR): components are told apart by their letters."""
        return bool(getattr(self.app, "no_color", False))

    def plot_width(self) -> int:
        return max(self.size.width - AXIS_WIDTH, 1)

    def cursor_chart_column(self) -> ChartColumn | None:
        """The column under the cursor, as drawn now."""
        columns = self.timeline.columns(self.plot_width())
        return columns[self.timeline.cursor_column(columns, self.cursor_index)] if columns else None

    def on_click(self, event: events.Click) -> None:
        columns = self.timeline.columns(self.plot_width())
        x = event.x - AXIS_WIDTH
        if columns and 0 <= x < len(columns):
            self.cursor_index = columns[x].peak.event_index  # the column's most: the height drawn
        self.focus()

    def render(self) -> Text:
        try:
            return self._draw()
        except Exception as error:  # data the chart cannot draw: one line in its place
            return plain(report_failure(self, "draw the timeline", error), style="red")

    def _stacks_for(self, columns: list[ChartColumn], width: int, rows: int) -> list[list[int | None]]:
        key = (width, rows)
        stacks = self._stacks.get(key)
        if stacks is None:
            max_bytes = self.timeline.max_bytes
            stacks = self._stacks[key] = [stacked_cells(column.peak, max_bytes, rows) for column in columns]
        return stacks

    def _draw(self) -> Text:
        timeline = self.timeline
        if not timeline:
            return plain("No allocation history was recorded, so there is no timeline.")
        width = self.plot_width()
        rows = max(self.size.height - 2, 1) if self.size.height else self._rows
        columns = timeline.columns(width)
        cursor = self._drawn_cursor = timeline.cursor_column(columns, self.cursor_index)
        stacks = self._stacks_for(columns, width, rows)
        monochrome = self.monochrome
        marks = [
            column.oom and (number == 0 or columns[number - 1].first_point != column.first_point)
            for number, column in enumerate(columns)
        ]
        tops = [sum(cell is not None for cell in cells) for cells in stacks]
        # a row's label is the bytes up to its top: the top row's the scale, the middle one's about half
        middle = rows // 2 - 1
        labels = {rows - 1: axis_label(timeline.max_bytes)}
        if 0 <= middle < rows - 1:
            labels[middle] = axis_label(timeline.max_bytes * (middle + 1) // rows)
        lines = []
        for level in range(rows - 1, -1, -1):
            label = labels.get(level)
            line = Text(f"{label:>{AXIS_WIDTH - 1}}┤" if label else f"{'':>{AXIS_WIDTH - 1}}│", style="dim")
            run, run_style = [], ""  # cells of one style go in as one span: far less for Textual to lay out
            for number, cells in enumerate(stacks):
                component = cells[level]
                name = COMPONENTS[component] if component is not None else None
                if marks[number] and (level == tops[number] or (level == rows - 1 and tops[number] >= rows)):
                    glyph, style = OOM_MARK, "bold reverse" if number == cursor else "bold red"
                elif name is None:
                    glyph, style = ("│", "bold") if number == cursor else (" ", "")
                else:
                    glyph = COMPONENT_LETTERS[name] if monochrome else "█"
                    style = "" if monochrome else COMPONENT_COLORS[name]
                    if number == cursor:
                        style = f"{style} reverse".strip()
                if style != run_style and run:
                    line.append("".join(run), style=run_style)
                    run = []
                run.append(glyph)
                run_style = style
            if run:
                line.append("".join(run), style=run_style)
            lines.append(line)
        phases = Text(f"{'phase':>{AXIS_WIDTH - 1}} ", style="dim")
        steps = Text(f"{'step':>{AXIS_WIDTH - 1}} " if timeline.has_steps else " " * AXIS_WIDTH, style="dim")
        previous_step = None
        written = 0
        run, run_style = [], ""
        for number, column in enumerate(columns):
            letter = PHASE_LETTERS.get(column.phase, "?")
            style = "reverse" if number == cursor else "" if monochrome else PHASE_COLORS.get(column.phase, "dim")
            if style != run_style and run:
                phases.append("".join(run), style=run_style)
                run = []
            run.append(letter)
            run_style = style
            if column.step is not None and column.step != previous_step and written <= number:
                label = f"s{column.step}"[: width - number]
                steps.append(label, style="dim")
                written = number + len(label)
            elif written <= number:
                steps.append(" ")
                written = number + 1
            previous_step = column.step
        if run:
            phases.append("".join(run), style=run_style)
        lines.extend((phases, steps))
        return Text("\n").join(lines)

    def get_content_height(self, container, viewport, width: int) -> int:
        if not self.timeline:
            return 1
        self._rows = chart_rows(container.height)
        return self._rows + 2


class TimelinePane(GuardedPane, Vertical):
    """The chart, a legend, the cursor's event and the largest blocks live after it, or (`e`) the
    events around it."""

    TAB_TITLE = "Timeline"
    BINDINGS = [
        # one key, two labels: what pressing it will show in place of the table
        # (not in the footer, full at 80 columns; `?` and `open --help` list it)
        Binding("e", "show_list('events')", "Events around the cursor", show=False),
        Binding("e", "show_list('blocks')", "Blocks live after the cursor", show=False),
    ]

    showing_events: reactive[bool] = reactive(False, init=False)  # the event list in place of the block table

    class StateReady(Message):
        def __init__(self, state: EventState, rows: list[BlockRow]) -> None:
            super().__init__()
            self.state = state
            self.rows = rows

    class ReplayFailed(Message):
        def __init__(self, error: Exception) -> None:
            super().__init__()
            self.error = error

    def __init__(self, analysis: Analysis, snapshot: Snapshot, replayer: Replayer, **kwargs) -> None:
        super().__init__(**kwargs)
        self.analysis = analysis
        self.snapshot = snapshot
        self.replayer = replayer
        self.timeline: Timeline | None = None
        self.shown_state: EventState | None = None
        self.block_rows: list[BlockRow] = []  # the rows of #cursor-blocks
        self._replay_lock = threading.Lock()
        self._wanted = 0
        self._replaying = False
        self._replay_seconds = 0.0  # the last replay's
        self._table_rows: list[BlockRow] | None = None  # what #cursor-blocks lists
        self.event_rows: list[EventRow] = []  # the rows of #cursor-events

    def build(self) -> ComposeResult:
        self.timeline = Timeline(self.analysis)
        yield Static(self._legend(), id="timeline-legend")
        yield TimelineChart(self.timeline, id="timeline-chart")
        yield Static(Text(), id="cursor-event")
        yield Static(Text(), id="cursor-state")
        table = DataTable(id="cursor-blocks", cursor_type="row", zebra_stripes=True)
        table.add_columns(*row("size", "component", "allocated at", "name or source line"))
        yield table
        events_table = DataTable(id="cursor-events", cursor_type="row", zebra_stripes=True)
        events_table.add_columns(*row("", "event", "action", "size", "source line", "address"))
        events_table.display = False
        yield events_table
        yield StackPane(id="cursor-stack")

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "show_list":  # the one of its two labels that says what `e` will show
            return parameters != (("events" if self.showing_events else "blocks"),)
        return True

    def action_show_list(self, which: str) -> None:
        self.showing_events = which == "events"

    @guarded
    def watch_showing_events(self, showing: bool) -> None:
        self.refresh_bindings()
        blocks, events_table = self.query_one("#cursor-blocks", DataTable), self.query_one("#cursor-events", DataTable)
        moving_focus = self.app.focused in (blocks, events_table)
        blocks.display, events_table.display = not showing, showing
        if showing:
            self._fill_events(self.query_one(TimelineChart).cursor_index)
        elif 0 <= blocks.cursor_row < len(self.block_rows):  # the table kept up meanwhile: its stack again
            self._show_block_stack(self.block_rows[blocks.cursor_row])
        else:
            self.query_one("#cursor-stack", StackPane).clear()
        if moving_focus:
            (events_table if showing else blocks).focus()

    def _fill_events(self, event_index: int) -> None:
        """The events around the cursor's, the cursor's marked and under the table's cursor."""
        rows = event_rows_around(
            self.replayer.trace, event_index, self.analysis, width=label_width(self.app.size.width)
        )
        self.event_rows = rows
        table = self.query_one("#cursor-events", DataTable)
        table.clear()
        here = 0
        for position, event in enumerate(rows):
            at_cursor = event.index == event_index
            if at_cursor:
                here = position
            style = "bold" if at_cursor else ""
            table.add_row(
                *(
                    plain(cell, style=style)
                    for cell in (
                        "▶" if at_cursor else "",
                        event.index,
                        event.action,
                        human_size(event.size_bytes),
                        event.label,
                        f"{event.address:#x}",
                    )
                ),
                key=str(event.index),
            )
        if rows:
            table.move_cursor(row=here, animate=False, scroll=False)
            table.call_after_refresh(self._centre_events, here)  # once the table knows its new rows
        else:
            self.query_one("#cursor-stack", StackPane).clear()

    def _centre_events(self, position: int) -> None:
        """Scroll the event list so that the cursor's event is in its middle."""
        table = self.query_one("#cursor-events", DataTable)
        visible = max(table.scrollable_content_region.height - 1, 1)  # the rows under the header
        table.scroll_to(y=max(position - (visible - 1) // 2, 0), animate=False)

    @on(DataTable.RowHighlighted, "#cursor-events")
    @guarded
    def _event_highlighted(self, message: DataTable.RowHighlighted) -> None:
        if self.showing_events and 0 <= message.cursor_row < len(self.event_rows):
            event = self.event_rows[message.cursor_row]
            header = f"event {event.index}: {event.action} {human_size(event.size_bytes)} at {event.address:#x}"
            self.query_one("#cursor-stack", StackPane).show(header, event.frames, path_style(self.analysis))

    @on(DataTable.RowSelected, "#cursor-events")
    @guarded
    def _event_selected(self, message: DataTable.RowSelected) -> None:
        """Enter on an event: the timeline cursor goes there (and the list follows)."""
        if 0 <= message.cursor_row < len(self.event_rows):
            chart = self.query_one(TimelineChart)
            chart.cursor_index = chart.timeline.clamp(self.event_rows[message.cursor_row].index)

    def _legend(self) -> Text:
        assert self.timeline is not None
        timeline = self.timeline
        shown = {name for name, share in zip(COMPONENTS, self.analysis.components) if share.bytes}
        for peak in timeline.peaks:  # and whatever is a visible share of some column
            shown.update(
                name for name, value in zip(COMPONENTS, peak.components) if value * 20 >= timeline.max_bytes > 0
            )
        present = [name for name in COMPONENTS if name in shown] or list(COMPONENTS[:4])
        monochrome = bool(getattr(self.app, "no_color", False))
        legend = Text()
        for name in present:
            if monochrome:
                legend.append(f"{COMPONENT_LETTERS[name]} ", style="bold")
            else:
                legend.append("█ ", style=COMPONENT_COLORS[name])
            legend.append(f"{SHORT_LABELS[name]} ")
        legend.append(f"top {human_size(timeline.peak_bytes)}", style="dim")
        if timeline.oom_indices:
            legend.append(f" {OOM_MARK} OOM", style="bold" if monochrome else "bold red")
        return legend

    @on(TimelineChart.CursorMoved)
    @guarded
    def _cursor_moved(self, message: TimelineChart.CursorMoved) -> None:
        assert self.timeline is not None
        index = message.event_index
        span = self.timeline.phase_at(index)
        bits = [f"event {index} of {self.timeline.event_count}"]
        if span is not None:
            if self.analysis.steps:
                bits.append(f"step {span.step}")
            bits.append(phase_words(span.phase))
        if index == self.analysis.replay.target_index:
            bits.append(
                self.analysis.replay.target_kind.upper()
                if self.analysis.replay.target_kind == "oom"
                else self.analysis.replay.target_kind
            )
        self._show_line("#cursor-event", plain(" · ".join(bits)))
        self._show_line("#cursor-state", plain("replaying…", style="dim"), shrink=False)
        if self.showing_events:
            self._fill_events(index)
        self._request_replay(index)

    def _show_line(self, selector: str, text: Text, shrink: bool = True) -> None:
        """Update a label, laying the pane out again only when its height must change (a layout of
        the whole screen per key press was most of what a cursor move cost); a placeholder
        (`shrink` False) keeps the height the label has, so the line it stands for fits again."""
        label = self.query_one(selector, Static)
        width, height = label.size
        lines = max(1, -(-text.cell_len // width)) if width else 0
        if not shrink:
            lines = max(lines, height)
        label.update(text, layout=lines != height)

    def _request_replay(self, event_index: int) -> None:
        """Replay `event_index`: one replay at a time, of the latest index asked for, dropping
        those the cursor has already left (a held key's run of moves costs one replay at a time,
        not one each). A replay as quick as the last one was (a few ms: the Replayer's copies)
        runs on the app's own thread a few ms later, once the keys already queued have moved the
        cursor (a burst ends in a replay or two, of the last), and no thread hands the interpreter
        back and forth; a slow one (a huge live set) runs in a worker thread, so the keys keep
        answering meanwhile."""
        with self._replay_lock:
            self._wanted = event_index
            if self._replaying:
                return
            self._replaying = True
        if self._replay_seconds <= QUICK_REPLAY_SECONDS:
            self.set_timer(REPLAY_DELAY_SECONDS, self._replay_here)
        else:
            self._replay_in_thread()

    def _replay_here(self) -> None:
        message = self._replay_latest()
        if isinstance(message, self.ReplayFailed):
            self.fail(message.error)
        else:
            self.post_message(message)

    @work(thread=True, group="timeline-cursor")
    def _replay_in_thread(self) -> None:
        self.post_message(self._replay_latest())

    def _replay_latest(self) -> StateReady | ReplayFailed:
        """Replay until the state replayed is where the cursor still is."""
        while True:
            with self._replay_lock:
                event_index = self._wanted
            started = time.perf_counter()
            try:
                state = self.replayer.state_at(event_index)
                rows = live_rows_at(state, self.replayer.trace, self.replayer.segments, self.analysis, limit=TOP_BLOCKS)
            except Exception as error:  # in a worker's thread: the pane fails on the app's
                with self._replay_lock:
                    self._replaying = False
                return self.ReplayFailed(error)
            self._replay_seconds = time.perf_counter() - started
            with self._replay_lock:
                if self._wanted != event_index:
                    continue  # the cursor moved on meanwhile: replay where it is now
                self._replaying = False
            return self.StateReady(state, rows)

    @staticmethod
    def _state_line(state: EventState, column: ChartColumn | None) -> str:
        """The cursor's figures: allocated as the chart counts it (docs/definitions.md), and the
        column's height where the column's most is more than the event's own."""
        line = (
            f"allocated {human_size(state.counted_bytes)} · reserved {human_size(state.reserved_bytes)} · "
            f"{len(state.live)} live blocks" + ("" if state.exact else " (replayed)")
        )
        if column is not None and column.peak.allocated_bytes != state.counted_bytes:
            line += f" · column max {human_size(column.peak.allocated_bytes)}"
        return line

    @on(ReplayFailed)
    def _replay_failed(self, message: ReplayFailed) -> None:
        self.fail(message.error)

    @on(StateReady)
    @guarded
    def _state_ready(self, message: StateReady) -> None:
        assert self.timeline is not None
        chart = self.query_one(TimelineChart)
        state = message.state
        if state.event_index != chart.cursor_index and not (
            state.exact and chart.cursor_index >= self.timeline.event_count - 1
        ):
            return  # the cursor has moved on; a newer replay is coming
        self.shown_state = state
        self._show_line("#cursor-state", plain(self._state_line(state, chart.cursor_chart_column())))
        if message.rows == self._table_rows:
            return  # the same blocks: the table stays as it is
        self._table_rows = message.rows
        self._fill_blocks(message.rows)

    def _fill_blocks(self, rows: list[BlockRow]) -> None:
        table = self.query_one("#cursor-blocks", DataTable)
        self.block_rows = rows
        table.clear()
        for block_row in rows:
            where = f"event {block_row.alloc_index}" if block_row.alloc_index is not None else "before trace"
            table.add_row(
                *row(
                    human_size(block_row.size_bytes),
                    COMPONENT_LABELS.get(block_row.component, "-"),
                    where,
                    block_row.label,
                ),
                key=str(block_row.address),
            )
        if not rows and not self.showing_events:
            self.query_one("#cursor-stack", StackPane).clear()

    @on(DataTable.RowHighlighted, "#cursor-blocks")
    @guarded
    def _block_highlighted(self, message: DataTable.RowHighlighted) -> None:
        if not self.showing_events and 0 <= message.cursor_row < len(self.block_rows):
            self._show_block_stack(self.block_rows[message.cursor_row])

    def _show_block_stack(self, block_row: BlockRow) -> None:
        header = f"{block_row.address:#x} ({human_size(block_row.size_bytes)}): {block_row.label}"
        self.query_one("#cursor-stack", StackPane).show(header, block_row.frames, path_style(self.analysis))
