"""The Segments tab: each segment with a bar of its blocks; a segment's blocks; a block's stack."""

from __future__ import annotations

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Static

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
from oomdoctor.tui.kept import DataTable
from oomdoctor.tui.safe import lines, row
from oomdoctor.tui.stack import StackPane
from oomdoctor.units import human_size

BAR_CELLS = 16


class SegmentsPane(GuardedPane, Vertical):
    """Segments at the timeline cursor's event (the target until the cursor moves), as the replayer
    lays them out (free gaps included)."""

    TAB_TITLE = "Segments"

    def __init__(self, analysis: Analysis, replay: Replayer, **kwargs) -> None:
        super().__init__(**kwargs)
        self.analysis = analysis
        self.replay = replay
        self.trace = replay.trace
        self.state: EventState | None = None
        self.block_rows: list[BlockRow] = []
        self.at_target = True

    def build(self) -> ComposeResult:
        yield Static(Text(), id="fragmentation")
        segments = DataTable(id="segment-table", cursor_type="row", zebra_stripes=True)
        segments.add_columns(*row("address", "blocks", "total", "allocated", "free", "largest free", "pool", "stream"))
        yield segments
        blocks = DataTable(id="segment-blocks", cursor_type="row", zebra_stripes=True)
        blocks.add_columns(*row("block", "size", "component", "name, source line or state"))
        yield blocks
        yield StackPane(id="segment-stack")

    @guarded
    def on_mount(self) -> None:
        if self.state is None:
            self.show_event(None)

    @property
    def shown_index(self) -> int | None:
        return None if self.state is None else self.state.event_index

    def show_event(self, event_index: int | None, address: int | None = None) -> None:
        """The segments right after `event_index` (None: the target), as the replayer lays them
        out; the block at `address` selected when it is in one of them."""
        try:
            self._show_event(event_index, address)
        except Exception as error:
            self.fail(error)

    def _show_event(self, event_index: int | None, address: int | None) -> None:
        if self.failed:
            return
        target = self.analysis.replay.target_index
        at_target = event_index is None or event_index == target
        index = (target if target is not None else len(self.trace) - 1) if event_index is None else event_index
        if self.state is None or self.state.event_index != index:
            self.state = self.replay.state_at(index)
            self.at_target = at_target
            self._fill_segments(at_target)
        if address is not None:
            self._select_block(address)

    def _fill_segments(self, at_target: bool) -> None:
        state = self.state
        assert state is not None
        count = len(state.segments)
        where = where_label(self.analysis) if at_target else f"after event {state.event_index}"
        summary = [f"{count} segments {where}; █ allocated ▒ pending free ░ free"]
        if at_target:
            summary.extend(fragmentation_lines(self.analysis))
        else:
            summary.append(
                f"allocated {human_size(state.allocated_bytes)} of {human_size(state.reserved_bytes)} reserved"
                " (the timeline cursor's event; the fragmentation figures are the target's, on the Overview)"
            )
        self.query_one("#fragmentation", Static).update(lines(summary))
        segments = self.query_one("#segment-table", DataTable)
        segments.clear()
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
        if not state.segments:
            self.block_rows = []
            self.query_one("#segment-blocks", DataTable).clear()
            self.query_one("#segment-stack", StackPane).clear()

    def _select_block(self, address: int) -> None:
        assert self.state is not None
        for number, segment in enumerate(self.state.segments):
            if segment.address <= address < segment.address + segment.total_size:
                self.query_one("#segment-table", DataTable).move_cursor(row=number)
                self._show_segment(number)
                for position, block_row in enumerate(self.block_rows):
                    if block_row.address == address:
                        self.query_one("#segment-blocks", DataTable).move_cursor(row=position)
                        self._show_stack(block_row)
                return

    @on(DataTable.RowHighlighted, "#segment-table")
    @guarded
    def _segment_highlighted(self, message: DataTable.RowHighlighted) -> None:
        self._show_segment(message.cursor_row)

    def _show_segment(self, position: int) -> None:
        if self.state is None or not 0 <= position < len(self.state.segments):
            return
        segment = self.state.segments[position]
        replayed = None if self.at_target else self.state  # at the target, the analysis's own names
        self.block_rows = block_rows_of(
            segment, self.analysis, self.trace, replayed, width=label_width(self.app.size.width)
        )
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
