"""The Allocations tab: every block live at the target, or right after the timeline cursor's event
when the cursor is elsewhere (`show_event`), searchable by name, component, file or function."""

from __future__ import annotations

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.message import Message
from textual.timer import Timer
from textual.widgets import Input, Static

from oomdoctor.analysis import Replayer
from oomdoctor.analysis.results import Analysis
from oomdoctor.tui.content import (
    NOT_ATTRIBUTED,
    AllocationRow,
    allocation_rows,
    blocks_after,
    component_label,
    cursor_label,
    cursor_moment,
    filter_rows,
    label_width,
    path_style,
    phase_words,
    target_words,
)
from oomdoctor.tui.guard import GuardedPane, guarded
from oomdoctor.tui.kept import DataTable
from oomdoctor.tui.safe import plain, row
from oomdoctor.tui.stack import StackPane
from oomdoctor.units import human_size

SEARCH_PAUSE = 0.15  # seconds of no typing before the search runs
SHOWN_ROWS = 500  # the largest matches; filling a table with every block of a huge dump would stall typing


class AllocationsPane(GuardedPane, Vertical):
    TAB_TITLE = "Allocations"

    def __init__(self, analysis: Analysis, **kwargs) -> None:
        super().__init__(**kwargs)
        self.analysis = analysis
        self.all_rows: list[AllocationRow] = []
        self.shown_rows: list[AllocationRow] = []
        self.query_text = ""
        self._pending: Timer | None = None
        self.shown_index: int | None = None  # the cursor's event the rows are live after; None: the target

    def build(self) -> ComposeResult:
        self.all_rows = allocation_rows(self.analysis, width=label_width(self.app.size.width))
        self.shown_rows = list(self.all_rows)
        yield Input(
            placeholder="search: name, component, phase, file or function (all words must match)",
            id="allocation-search",
        )
        yield Static(Text(), id="allocation-count")
        table = DataTable(id="allocation-table", cursor_type="row", zebra_stripes=True)
        # the name or source line second: what tells two rows apart stays on screen at 80 columns
        table.add_columns(*row("size", "name or source line", "component", "phase", "step", "event"))
        yield table
        yield StackPane(id="allocation-stack")

    @guarded
    def on_mount(self) -> None:
        self._fill()

    class Filtered(Message):
        def __init__(self, search: str, rows: list[AllocationRow], shown_index: int | None) -> None:
            super().__init__()
            self.search = search
            self.rows = rows
            self.shown_index = shown_index  # the moment whose rows were filtered

    @on(Input.Changed, "#allocation-search")
    @guarded
    def _search(self, message: Input.Changed) -> None:
        """Typing waits for a pause (SEARCH_PAUSE) before the rows are filtered, in a worker, so
        that each key is answered at once on a dump of thousands of blocks."""
        self.query_text = message.value
        if self._pending is not None:
            self._pending.stop()
        self._pending = self.set_timer(SEARCH_PAUSE, self._start_filter)

    def _start_filter(self) -> None:
        self._pending = None
        self._filter(self.query_text)

    @work(thread=True, exclusive=True, group="allocation-search")
    def _filter(self, query: str) -> None:
        shown_index, rows = self.shown_index, self.all_rows
        self.post_message(self.Filtered(query, filter_rows(rows, query), shown_index))

    @on(Filtered)
    @guarded
    def _filtered(self, message: Filtered) -> None:
        if message.search != self.query_text or message.shown_index != self.shown_index:
            return  # typing went on (its own filter is coming), or the rows are another moment's
        self.shown_rows = message.rows
        self._fill()

    def show_event(self, event_index: int | None, replay: Replayer | None) -> None:
        """The blocks live right after `event_index` (None, the target's, or no replayer yet: the
        blocks live at the target, as the analysis has them), the search kept."""
        if self.failed:
            return
        try:
            shown = cursor_moment(self.analysis, event_index, replay)
            if shown == self.shown_index:
                return
            blocks = None if shown is None or replay is None else blocks_after(replay, shown, self.analysis)
            self.shown_index = shown
            self.all_rows = allocation_rows(self.analysis, width=label_width(self.app.size.width), blocks=blocks)
            self.shown_rows = filter_rows(self.all_rows, self.query_text) if self.query_text else list(self.all_rows)
            self._fill()
        except Exception as error:
            self.fail(error)

    def select_block(self, address: int) -> None:
        """Select the live block at `address` (the search cleared when it hides it)."""
        try:
            if not any(shown.block.address == address for shown in self.shown_rows[:SHOWN_ROWS]):
                self.query_text = ""
                self.query_one("#allocation-search", Input).value = ""
                self.shown_rows = list(self.all_rows)
                self._fill()
            for position, shown in enumerate(self.shown_rows[:SHOWN_ROWS]):
                if shown.block.address == address:
                    table = self.query_one("#allocation-table", DataTable)
                    table.move_cursor(row=position)
                    table.focus()
                    return
        except Exception as error:
            self.fail(error)

    @on(Input.Submitted, "#allocation-search")
    @guarded
    def _to_table(self) -> None:
        if self._pending is not None:  # Enter does not wait for the pause
            self._pending.stop()
            self._pending = None
            self.shown_rows = filter_rows(self.all_rows, self.query_text)
            self._fill()
        self.query_one("#allocation-table", DataTable).focus()

    def _fill(self) -> None:
        table = self.query_one("#allocation-table", DataTable)
        table.clear()
        for shown in self.shown_rows[:SHOWN_ROWS]:
            block = shown.block
            table.add_row(
                *row(
                    human_size(block.size_bytes),
                    shown.label,
                    component_label(block.component),
                    phase_words(block.phase),
                    "-" if block.step is None else block.step,
                    "-" if block.alloc_index is None else block.alloc_index,
                )
            )
        shown_bytes = sum(shown.block.size_bytes for shown in self.shown_rows)
        capped = f" (the largest {SHOWN_ROWS} listed)" if len(self.shown_rows) > SHOWN_ROWS else ""
        where = ""
        if self.shown_index is not None:  # at the target the line stays as it always was
            unplaced = sum(shown.block.component == NOT_ATTRIBUTED for shown in self.all_rows)
            where = f" {cursor_label(self.shown_index)}"
            capped += f"; {unplaced} not attributed" if unplaced else ""
            capped += f"; t: back to {target_words(self.analysis)}"
        self.query_one("#allocation-count", Static).update(
            plain(
                f"{len(self.shown_rows)} of {len(self.all_rows)} live blocks{where}, {human_size(shown_bytes)}{capped}"
            )
        )
        if not self.shown_rows:
            self.query_one("#allocation-stack", StackPane).clear()

    @on(DataTable.RowHighlighted, "#allocation-table")
    @guarded
    def _highlighted(self, message: DataTable.RowHighlighted) -> None:
        if 0 <= message.cursor_row < len(self.shown_rows):
            block = self.shown_rows[message.cursor_row].block
            header = f"{block.address:#x} ({human_size(block.size_bytes)} for a request of {human_size(block.requested_bytes)})"
            if block.component == NOT_ATTRIBUTED:
                header += "; not attributed at this event"
            self.query_one("#allocation-stack", StackPane).show(header, block.frames, path_style(self.analysis))
