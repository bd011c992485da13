"""The Segments tab: each segment with a bar of its blocks; a segment's blocks; a block's stack."""

from __future__ import annotations

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import DataTable, Static

from oomdoctor.analysis import Replayer
from oomdoctor.analysis.results import Analysis, EventState
from oomdoctor.tui.content import (
    COMPONENT_LABELS,
    BlockRow,
    block_rows_of,
    fragmentation_lines,
    label_width,
    largest_free_block_bytes,
    path_style,
    segment_bar,
    segment_pool,
    where_label,
)
from oomdoctor.tui.guard import GuardedPane, guarded
from oomdoctor.tui.safe import lines, row
from oomdoctor.tui.stack import StackPane
from oomdoctor.units import human_size

BAR_CELLS = 16


class SegmentsPane(GuardedPane, Vertical):
    """Segments at the target event, as the replayer lays them out (free gaps included)."""

    TAB_TITLE = "Segments"

    def __init__(self, analysis: Analysis, replay: Replayer, **kwargs) -> None:
        super().__init__(**kwargs)
        self.analysis = analysis
        self.replay = replay
        self.trace = replay.trace
        self.state: EventState | None = None
        self.block_rows: list[BlockRow] = []

    def build(self) -> ComposeResult:
        target = self.analysis.replay.target_index
        self.state = state = self.replay.state_at(target if target is not None else len(self.trace) - 1)
        count = len(state.segments)
        yield Static(
            lines(
                [
                    f"{count} segments {where_label(self.analysis)}; █ allocated ▒ pending free ░ free",
                    *fragmentation_lines(self.analysis),
                ]
            ),
            id="fragmentation",
        )
        segments = DataTable(id="segment-table", cursor_type="row", zebra_stripes=True)
        segments.add_columns(*row("address", "blocks", "total", "allocated", "free", "largest free", "pool", "stream"))
        for segment in state.segments:
            segments.add_row(
                *row(
                    f"{segment.address:#x}",
                    Text(segment_bar(segment, BAR_CELLS)),
                    human_size(segment.total_size),
                    human_size(segment.allocated_bytes),
                    human_size(segment.free_bytes),
                    human_size(largest_free_block_bytes(segment)),
                    segment_pool(segment),
                    segment.stream,
                ),
                key=str(segment.address),
            )
        yield segments
        blocks = DataTable(id="segment-blocks", cursor_type="row", zebra_stripes=True)
        blocks.add_columns(*row("block", "size", "component", "name, source line or state"))
        yield blocks
        yield StackPane(id="segment-stack")

    @on(DataTable.RowHighlighted, "#segment-table")
    @guarded
    def _segment_highlighted(self, message: DataTable.RowHighlighted) -> None:
        assert self.state is not None
        if not 0 <= message.cursor_row < len(self.state.segments):
            return
        segment = self.state.segments[message.cursor_row]
        self.block_rows = block_rows_of(segment, self.analysis, self.trace, width=label_width(self.app.size.width))
        table = self.query_one("#segment-blocks", DataTable)
        table.clear()
        for block_row in self.block_rows:
            table.add_row(
                *row(
                    f"{block_row.address:#x}",
                    human_size(block_row.size_bytes),
                    COMPONENT_LABELS.get(block_row.component, "-"),
                    block_row.label,
                )
            )
        if self.block_rows:
            self._show_stack(self.block_rows[0])

    @on(DataTable.RowHighlighted, "#segment-blocks")
    @guarded
    def _block_highlighted(self, message: DataTable.RowHighlighted) -> None:
        if 0 <= message.cursor_row < len(self.block_rows):
            self._show_stack(self.block_rows[message.cursor_row])

    def _show_stack(self, block_row: BlockRow) -> None:
        header = f"{block_row.address:#x} ({human_size(block_row.size_bytes)}): {block_row.label}"
        self.query_one("#segment-stack", StackPane).show(header, block_row.frames, path_style(self.analysis))
