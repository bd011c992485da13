"""The Components tab: a tree from component to module path or source line to each live block."""

from __future__ import annotations

from textual import on
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Tree

from oomdoctor.analysis.results import Analysis, LiveBlock
from oomdoctor.tui.content import (
    COMPONENT_LABELS,
    ComponentNode,
    component_nodes,
    describe_block,
    label_width,
    path_style,
    where_label,
)
from oomdoctor.tui.guard import GuardedPane, guarded
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

    def build(self) -> ComposeResult:
        width = label_width(self.app.size.width)
        paths = path_style(self.analysis)
        self.nodes = component_nodes(self.analysis, width=width)
        total = sum(node.bytes for node in self.nodes)
        tree: Tree[LiveBlock | None] = Tree(
            plain(f"live memory {where_label(self.analysis)}: {human_size(total)}"), id="component-tree"
        )
        tree.root.expand()
        for node in self.nodes:
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
                    text = describe_block(block.name, block.frames, block.alloc_index, paths=paths, width=width)
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
        yield tree
        yield StackPane(plain("Highlight a block to see where it was allocated.", style="dim"), id="component-stack")

    @guarded
    def on_mount(self) -> None:
        self.query_one("#component-tree", Tree).cursor_line = 0  # a visible cursor from the first key

    @on(Tree.NodeHighlighted)
    @guarded
    def _node_highlighted(self, message: Tree.NodeHighlighted) -> None:
        block = message.node.data
        if isinstance(block, LiveBlock):
            where = f"event {block.alloc_index}" if block.alloc_index is not None else "before the trace"
            header = f"{block.address:#x} ({human_size(block.size_bytes)}), allocated at {where} in {block.phase.replace('_', ' ')}; {block.method}, confidence {block.confidence:.0%}"
            self.query_one("#component-stack", StackPane).show(header, block.frames, path_style(self.analysis))
