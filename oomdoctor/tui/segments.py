"""The Segments tab: each segment with a bar of its blocks; a segment's blocks; a block's stack."""

from __future__ import annotations

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import DataTable, Static

from oomdoctor.analysis.results import Analysis, EventState
from oomdoctor.model import DeviceTrace
from oomdoctor.tui.content import (
    COMPONENT_LABELS,
    BlockRow,
    block_rows_of,
    fragmentation_lines,
    largest_free_block_bytes,
    segment_bar,
    segment_pool,
    stack_lines,
    where_label,
)
from oomdoctor.units import human_size

BAR_CELLS = 16


class SegmentsPane(Vertical):
    """Segments at the target event, as the replayer lays them out (free gaps included)."""

    def __init__(self, analysis: Analysis, state: EventState, trace: DeviceTrace, **kwargs) -> None:
        super().__init__(**kwargs)
        self.analysis = analysis
        self.state = state
        self.trace = trace
        self.block_rows: list[BlockRow] = []

    def compose(self) -> ComposeResult:
        count = len(self.state.segments)
        lines = [f"{count} segments {where_label(self.analysis)}; █ allocated ▒ pending free ░ free", *fragmentation_lines(self.analysis)]
        yield Static(Text("\n".join(lines)), id="fragmentation")
        segments = DataTable(id="segment-table", cursor_type="row", zebra_stripes=True)
        segments.add_columns("address", "blocks", "total", "allocated", "free", "largest free", "pool", "stream")
        for segment in self.state.segments:
            segments.add_row(
                f"{segment.address:#x}",
                Text(segment_bar(segment, BAR_CELLS)),
                human_size(segment.total_size),
                human_size(segment.allocated_bytes),
                human_size(segment.free_bytes),
                human_size(largest_free_block_bytes(segment)),
                segment_pool(segment),
                str(segment.stream),
                key=str(segment.address),
            )
        yield segments
        blocks = DataTable(id="segment-blocks", cursor_type="row", zebra_stripes=True)
        blocks.add_columns("block", "size", "component", "name, source line or state")
        yield blocks
        yield Static(id="segment-stack")

    @on(DataTable.RowHighlighted, "#segment-table")
    def _segment_highlighted(self, message: DataTable.RowHighlighted) -> None:
        segment = self.state.segments[message.cursor_row]
        self.block_rows = block_rows_of(segment, self.analysis, self.trace)
        table = self.query_one("#segment-blocks", DataTable)
        table.clear()
        for row in self.block_rows:
            table.add_row(f"{row.address:#x}", human_size(row.size_bytes), COMPONENT_LABELS.get(row.component, "-"), Text(row.label))
        if self.block_rows:
            self._show_stack(self.block_rows[0])

    @on(DataTable.RowHighlighted, "#segment-blocks")
    def _block_highlighted(self, message: DataTable.RowHighlighted) -> None:
        if 0 <= message.cursor_row < len(self.block_rows):
            self._show_stack(self.block_rows[message.cursor_row])

    def _show_stack(self, row: BlockRow) -> None:
        header = f"{row.address:#x} ({human_size(row.size_bytes)}): {row.label}"
        self.query_one("#segment-stack", Static).update(Text("\n".join([header, *stack_lines(row.frames)])))
