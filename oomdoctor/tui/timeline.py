"""The Timeline tab: memory by component over the recorded events, and a cursor that replays any event."""

from __future__ import annotations

from rich.text import Text
from textual import events, on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.reactive import reactive
from textual.widget import Widget
from textual.widgets import DataTable, Static

from oomdoctor.analysis import Replayer
from oomdoctor.analysis.results import Analysis, EventState
from oomdoctor.metadata import COMPONENTS
from oomdoctor.model import Snapshot
from oomdoctor.tui.content import (
    COMPONENT_LABELS,
    PHASE_LETTERS,
    BlockRow,
    Timeline,
    live_rows_at,
    path_style,
    phase_words,
    stacked_cells,
)
from oomdoctor.tui.guard import GuardedPane, guarded, report_failure
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
PHASE_COLORS = {"forward": "#59a14f", "backward": "#f28e2b", "optimizer_step": "#e15759", "zero_grad": "#b07aa1"}
CHART_ROWS = 8
TOP_BLOCKS = 8


class TimelineChart(Widget, can_focus=True):
    """Stacked columns of allocated bytes by component, a phase row and a step row under them."""

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

    cursor_index: reactive[int] = reactive(0)

    class CursorMoved(Message):
        def __init__(self, event_index: int) -> None:
            super().__init__()
            self.event_index = event_index

    def __init__(self, timeline: Timeline, **kwargs) -> None:
        super().__init__(**kwargs)
        self.timeline = timeline
        self.set_reactive(TimelineChart.cursor_index, timeline.start_index())

    def on_mount(self) -> None:
        self.post_message(self.CursorMoved(self.cursor_index))

    def watch_cursor_index(self, event_index: int) -> None:
        self.post_message(self.CursorMoved(event_index))

    def action_move(self, points: int) -> None:
        self.cursor_index = self.timeline.next_point(self.cursor_index, points)

    def action_step_event(self, events_: int) -> None:
        self.cursor_index = self.timeline.clamp(self.cursor_index + events_)

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

    def on_click(self, event: events.Click) -> None:
        columns = self.timeline.columns(self.size.width)
        if columns and 0 <= event.x < len(columns):
            self.cursor_index = columns[event.x].point.event_index
        self.focus()

    def render(self) -> Text:
        try:
            return self._draw()
        except Exception as error:  # data the chart cannot draw: one line in its place
            return plain(report_failure(self, "draw the timeline", error), style="red")

    def _draw(self) -> Text:
        width = self.size.width
        timeline = self.timeline
        if not timeline:
            return plain("No allocation history was recorded, so there is no timeline.")
        columns = timeline.columns(width)
        cursor = timeline.cursor_column(columns, self.cursor_index)
        stacks = [stacked_cells(column.point, timeline.max_bytes, CHART_ROWS) for column in columns]
        lines = []
        for level in range(CHART_ROWS - 1, -1, -1):
            line = Text()
            for number, cells in enumerate(stacks):
                component = cells[level]
                style = COMPONENT_COLORS[COMPONENTS[component]] if component is not None else ""
                if number == cursor:
                    line.append(
                        "█" if component is not None else "│",
                        style="bold white" if component is None else f"{style} reverse",
                    )
                else:
                    line.append("█" if component is not None else " ", style=style)
            lines.append(line)
        phases = Text()
        steps = Text()
        previous_step = None
        for number, column in enumerate(columns):
            letter = PHASE_LETTERS.get(column.phase, "?")
            phases.append(letter, style="reverse" if number == cursor else PHASE_COLORS.get(column.phase, "dim"))
            if column.step is not None and column.step != previous_step and len(steps) <= number:
                label = f"s{column.step}"
                steps.append(label[: width - number], style="dim")
            elif len(steps) <= number:
                steps.append(" ")
            previous_step = column.step
        lines.extend((phases, steps))
        return Text("\n").join(lines)

    def get_content_height(self, container, viewport, width: int) -> int:
        return CHART_ROWS + 2 if self.timeline else 1


class TimelinePane(GuardedPane, Vertical):
    """The chart, a legend, the cursor's event and the largest blocks live after it."""

    TAB_TITLE = "Timeline"

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

    def build(self) -> ComposeResult:
        self.timeline = Timeline(self.analysis)
        yield Static(self._legend(), id="timeline-legend")
        yield TimelineChart(self.timeline, id="timeline-chart")
        yield Static(Text(), id="cursor-event")
        yield Static(Text(), id="cursor-state")
        table = DataTable(id="cursor-blocks", cursor_type="row", zebra_stripes=True)
        table.add_columns(*row("size", "component", "allocated at", "name or source line"))
        yield table
        yield StackPane(id="cursor-stack")

    def _legend(self) -> Text:
        assert self.timeline is not None
        present = [name for name, share in zip(COMPONENTS, self.analysis.components) if share.bytes] or list(
            COMPONENTS[:4]
        )
        legend = Text()
        for name in present:
            legend.append("█ ", style=COMPONENT_COLORS[name])
            legend.append(f"{SHORT_LABELS[name]} ")
        legend.append(f"top {human_size(self.timeline.max_bytes)}", style="dim")
        return legend

    @on(TimelineChart.CursorMoved)
    @guarded
    def _cursor_moved(self, message: TimelineChart.CursorMoved) -> None:
        assert self.timeline is not None
        self.query_one(TimelineChart).refresh()
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
        self.query_one("#cursor-event", Static).update(plain(" · ".join(bits)))
        self.query_one("#cursor-state", Static).update(plain("replaying…", style="dim"))
        self._replay(index)

    @work(thread=True, exclusive=True, group="timeline-cursor")
    def _replay(self, event_index: int) -> None:
        try:
            state = self.replayer.state_at(event_index)
            rows = live_rows_at(state, self.replayer.trace, self.replayer.segments, self.analysis, limit=TOP_BLOCKS)
        except Exception as error:  # the worker's thread: the pane fails on the app's
            self.post_message(self.ReplayFailed(error))
            return
        self.post_message(self.StateReady(state, rows))

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
        self.query_one("#cursor-state", Static).update(
            plain(
                f"allocated {human_size(state.allocated_bytes)} · reserved {human_size(state.reserved_bytes)} · "
                f"{len(state.live)} live blocks" + ("" if state.exact else " (replayed)")
            )
        )
        table = self.query_one("#cursor-blocks", DataTable)
        self.block_rows = message.rows
        table.clear()
        for block_row in message.rows:
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
        if not message.rows:
            self.query_one("#cursor-stack", StackPane).clear()

    @on(DataTable.RowHighlighted, "#cursor-blocks")
    @guarded
    def _block_highlighted(self, message: DataTable.RowHighlighted) -> None:
        if 0 <= message.cursor_row < len(self.block_rows):
            block_row = self.block_rows[message.cursor_row]
            header = f"{block_row.address:#x} ({human_size(block_row.size_bytes)}): {block_row.label}"
            self.query_one("#cursor-stack", StackPane).show(header, block_row.frames, path_style(self.analysis))
