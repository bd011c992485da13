"""The Allocations tab: every block live at the target, searchable by name, component, file or function."""

from __future__ import annotations

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import DataTable, Input, Static

from oomdoctor.analysis.results import Analysis
from oomdoctor.tui.content import COMPONENT_LABELS, AllocationRow, allocation_rows, filter_rows, phase_words, stack_lines
from oomdoctor.units import human_size

SHOWN_ROWS = 500  # the largest matches; filling a table with every block of a huge dump would stall typing


class AllocationsPane(Vertical):
    def __init__(self, analysis: Analysis, **kwargs) -> None:
        super().__init__(**kwargs)
        self.all_rows = allocation_rows(analysis)
        self.shown_rows: list[AllocationRow] = list(self.all_rows)

    def compose(self) -> ComposeResult:
        yield Input(placeholder="search: name, component, phase, file or function (all words must match)", id="allocation-search")
        yield Static(id="allocation-count")
        table = DataTable(id="allocation-table", cursor_type="row", zebra_stripes=True)
        table.add_columns("size", "component", "phase", "step", "event", "name or source line")
        yield table
        yield Static(id="allocation-stack")

    def on_mount(self) -> None:
        self._fill()

    @on(Input.Changed, "#allocation-search")
    def _search(self, message: Input.Changed) -> None:
        self.shown_rows = filter_rows(self.all_rows, message.value)
        self._fill()

    @on(Input.Submitted, "#allocation-search")
    def _to_table(self) -> None:
        self.query_one("#allocation-table", DataTable).focus()

    def _fill(self) -> None:
        table = self.query_one("#allocation-table", DataTable)
        table.clear()
        for row in self.shown_rows[:SHOWN_ROWS]:
            block = row.block
            table.add_row(
                human_size(block.size_bytes),
                COMPONENT_LABELS.get(block.component, block.component),
                phase_words(block.phase),
                "-" if block.step is None else str(block.step),
                "-" if block.alloc_index is None else str(block.alloc_index),
                Text(row.label),
            )
        shown_bytes = sum(row.block.size_bytes for row in self.shown_rows)
        capped = f" (the largest {SHOWN_ROWS} listed)" if len(self.shown_rows) > SHOWN_ROWS else ""
        self.query_one("#allocation-count", Static).update(Text(f"{len(self.shown_rows)} of {len(self.all_rows)} live blocks, {human_size(shown_bytes)}{capped}"))
        if not self.shown_rows:
            self.query_one("#allocation-stack", Static).update("")

    @on(DataTable.RowHighlighted, "#allocation-table")
    def _highlighted(self, message: DataTable.RowHighlighted) -> None:
        if 0 <= message.cursor_row < len(self.shown_rows):
            block = self.shown_rows[message.cursor_row].block
            header = f"{block.address:#x} ({human_size(block.size_bytes)} for a request of {human_size(block.requested_bytes)})"
            self.query_one("#allocation-stack", Static).update(Text("\n".join([header, *stack_lines(block.frames)])))
