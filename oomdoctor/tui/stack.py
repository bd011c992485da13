"""The stack pane under a table: a block's allocation stack, the user's frames first.

It grows with the terminal and scrolls (focus it with Tab, then the arrows, PageUp/PageDown,
Home/End); the app's `f` switches every stack pane between the user's frames and all frames.
"""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static

from oomdoctor.model import Stack
from oomdoctor.tui.content import stack_text
from oomdoctor.tui.safe import plain
from oomdoctor.views.shorten import PathStyle


class StackPane(VerticalScroll):
    """One block's stack under a header line; a hint (or nothing) until `show` is called."""

    def __init__(self, hint: Text | None = None, **kwargs) -> None:
        super().__init__(**kwargs)
        self.shown = hint if hint is not None else Text()
        self.header = ""
        self.frames: Stack | None = None
        self.paths = PathStyle()

    def compose(self) -> ComposeResult:
        yield Static(self.shown, classes="stack-text")

    @property
    def text_widget(self) -> Static:
        return self.query_one(".stack-text", Static)

    @property
    def all_frames(self) -> bool:
        return bool(getattr(self.app, "all_frames", False))

    def show(self, header: str, frames: Stack, paths: PathStyle) -> None:
        self.header, self.frames, self.paths = header, frames, paths
        self.redraw()
        self.scroll_home(animate=False)

    def clear(self) -> None:
        self.header, self.frames = "", None
        self._update(Text())

    def redraw(self) -> None:
        """Draw the stack again (after `f` switched between the user's frames and all)."""
        if self.frames is None:
            return
        text = stack_text(self.frames, all_frames=self.all_frames, paths=self.paths)
        shown = [plain(self.header), *([plain(text.note, style="dim")] if text.note else [])]
        self._update(Text("\n").join([*shown, *(plain(line) for line in text.lines)]))

    def _update(self, shown: Text) -> None:
        self.shown = shown
        if self.is_mounted and self.children:
            self.text_widget.update(shown)
