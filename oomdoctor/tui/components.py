"""The Components tab: a tree from component to module path or source line to each live block, at
the target, or right after the timeline cursor's event when the cursor is elsewhere (`show_event`)."""

from __future__ import annotations

from textual import on
from textual.app import ComposeResult
from textual.containers import Vertical

from oomdoctor.analysis import Replayer
from oomdoctor.analysis.results import Analysis, LiveBlock
from oomdoctor.tui.content import (
    COMPONENT_LABELS,
    NOT_ATTRIBUTED,
    NOT_ATTRIBUTED_LABEL,
    ComponentNode,
    blocks_after,
    component_nodes,
    cursor_label,
    cursor_moment,
    describe_block,
    label_width,
    path_style,
    where_label,
)
from oomdoctor.tui.guard import GuardedPane, guarded
from oomdoctor.tui.kept import Tree
from oomdoctor.tui.safe import plain
from oomdoctor.tui.stack import StackPane
from oomdoctor.units import human_size

LEAVES_PER_GROUP = 100


class ComponentsPane(GuardedPane, Vertical):
    TAB_TITLE = "Components"

    def __init__(self, analysis: Analysis, **kwargs) -> None:
        super().__init__(**kwargs)
        self.analysis = analysis
        self.nodes: list[ComponentNode] = []
        self.shown_index: int | None = None  # the cursor's event the tree is live after; None: the target

    def build(self) -> ComposeResult:
        width = label_width(self.app.size.width)
        self.nodes = component_nodes(self.analysis, width=width)
        tree: Tree[LiveBlock | None] = Tree(plain(self._title()), id="component-tree")
        tree.root.expand()
        self._fill_tree(tree)
        yield tree
        yield StackPane(plain("Highlight a block to see where it was allocated.", style="dim"), id="component-stack")

    def _title(self) -> str:
        total = sum(node.bytes for node in self.nodes)
        if self.shown_index is None:
            return f"live memory {where_label(self.analysis)}: {human_size(total)}"
        return f"live memory {cursor_label(self.shown_index)}: {human_size(total)}"  # the footer offers `t`

    def _fill_tree(self, tree: Tree[LiveBlock | None]) -> None:
        width = label_width(self.app.size.width)
        paths = path_style(self.analysis)
        for node in self.nodes:
            if node.name == NOT_ATTRIBUTED:
                label = plain(
                    f"{NOT_ATTRIBUTED_LABEL}  {human_size(node.bytes)}  (not live {where_label(self.analysis)},"
                    " so the analysis did not place them)"
                )
            else:
                label = plain(
                    f"{COMPONENT_LABELS[node.name]}  {human_size(node.bytes)}  ({node.method}, confidence {node.confidence:.0%})"
                )
            largest = node is self.nodes[0]  # opened down to its largest group's blocks
            branch = tree.root.add(label, expand=largest)
            for group in node.groups:
                twig = branch.add(
                    plain(f"{human_size(group.bytes):>11}  {group.key}  ({len(group.blocks)} blocks)"),
                    expand=largest and group is node.groups[0],
                )
                for block in group.blocks[:LEAVES_PER_GROUP]:
                    text = describe_block(
                        block.name,
                        block.frames,
                        block.alloc_index,
                        paths=paths,
                        width=width,
                        has_trace=bool(self.analysis.replay.event_count),
                    )
                    twig.add_leaf(plain(f"{human_size(block.size_bytes):>11}  {text}  {block.address:#x}"), data=block)
                rest = group.blocks[LEAVES_PER_GROUP:]
                if rest:
                    rest_bytes = sum(b.size_bytes for b in rest)
                    twig.add_leaf(
                        plain(
                            f"{human_size(rest_bytes):>11}  {len(rest)} smaller blocks (search for them under Allocations)",
                            style="dim",
                        )
                    )

    @guarded
    def on_mount(self) -> None:
        self.query_one("#component-tree", Tree).cursor_line = 0  # a visible cursor from the first key

    def show_event(self, event_index: int | None, replay: Replayer | None) -> None:
        """The tree of the blocks live right after `event_index` (None, the target's, or no
        replayer yet: the target's, as the analysis has it)."""
        if self.failed:
            return
        try:
            shown = cursor_moment(self.analysis, event_index, replay)
            if shown == self.shown_index:
                return
            width = label_width(self.app.size.width)
            if shown is None or replay is None:
                self.nodes = component_nodes(self.analysis, width=width)
            else:
                self.nodes = component_nodes(
                    self.analysis, width=width, blocks=blocks_after(replay, shown, self.analysis)
                )
            self.shown_index = shown
            tree = self.query_one("#component-tree", Tree)
            tree.clear()
            tree.root.set_label(plain(self._title()))
            self._fill_tree(tree)
            tree.cursor_line = 0
            self.query_one("#component-stack", StackPane).clear()
        except Exception as error:
            self.fail(error)

    @on(Tree.NodeHighlighted)
    @guarded
    def _node_highlighted(self, message: Tree.NodeHighlighted) -> None:
        block = message.node.data
        if isinstance(block, LiveBlock):
            where = f"event {block.alloc_index}" if block.alloc_index is not None else "before the trace"
            how = (
                "not attributed at this event"
                if block.component == NOT_ATTRIBUTED
                else f"{block.method}, confidence {block.confidence:.0%}"
            )
            header = f"{block.address:#x} ({human_size(block.size_bytes)}), allocated at {where} in {block.phase.replace('_', ' ')}; {how}"
            self.query_one("#component-stack", StackPane).show(header, block.frames, path_style(self.analysis))
