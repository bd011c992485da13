"""Textual's DataTable and Tree, keeping what they rendered when a tab is shown again.

Both throw their rendered lines away more often than what they draw changes:

- on every Resize, which Textual also sends to a widget shown again at the size it had (each
  switch back to a tab); the Tree also asks for a layout of the whole screen then;
- on every restyle, focus and blur included; the Tree again with a layout of the screen.

Their line caches are keyed by the focus state already (`_pseudo_class_state`), so a focus change
needs no more than a repaint. These keep the caches in both cases; any other restyle (a theme, a
class, hover) still clears them as Textual does.
"""

from __future__ import annotations

from typing import TypeVar

from textual import events
from textual.widget import Widget
from textual.widgets import DataTable as TextualDataTable
from textual.widgets import Tree as TextualTree

_Size = tuple[object, object]
NodeData = TypeVar("NodeData")


def _same_size(widget: DataTable | Tree, event: events.Resize) -> bool:
    """The widget had this size at its last Resize (it is being shown again): the event stops here.
    (Its virtual size is its own: the rows' extent, which the widget sets itself.)"""
    size: _Size = (event.size, event.container_size)
    same = size == widget._resized_to
    widget._resized_to = size
    if same:
        event.prevent_default()  # the base class's handler would drop its caches
    return same


class DataTable(TextualDataTable):
    _resized_to: _Size | None = None
    _focus_restyle = False

    def _on_resize(self, event: events.Resize) -> None:
        _same_size(self, event)

    def watch_has_focus(self, has_focus: bool) -> None:
        self._focus_restyle = True
        try:
            super().watch_has_focus(has_focus)
        finally:
            self._focus_restyle = False

    def notify_style_update(self) -> None:
        if not self._focus_restyle:
            super().notify_style_update()
            return
        # Rows, cells and lines are cached by the focus state and the widget's style; what is not
        # is the cursor's and hover's style per kind of cell, read from the restyled components.
        Widget.notify_style_update(self)
        self._get_styles_to_render_cell.cache_clear()
        self.refresh()


class Tree(TextualTree[NodeData]):
    _resized_to: _Size | None = None
    _focus_restyle = False

    def _on_resize(self, event: events.Resize) -> None:
        _same_size(self, event)

    def watch_has_focus(self, has_focus: bool) -> None:
        self._focus_restyle = True
        try:
            super().watch_has_focus(has_focus)
        finally:
            self._focus_restyle = False

    def notify_style_update(self) -> None:
        if not self._focus_restyle:
            super().notify_style_update()
            return
        # Lines are cached by the focus state; the tree's lines and widths do not change with it.
        Widget.notify_style_update(self)
        self.refresh()
