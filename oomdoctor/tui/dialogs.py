"""The app's modal screens: the keys of the current tab (`?`), and "go to event N" (`g`).

Each closes with Esc (and the help with `?` or `q` too); nothing in them comes from the dump except
the numbers the user types, which are parsed, never shown as markup.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Input, Static

from oomdoctor.tui.safe import plain


def parse_event(text: str, event_count: int) -> int | None:
    """The event index typed in `text` ("1234", "event 1234", "#1234"), or None when it is not one
    of the trace's events (0 to event_count - 1)."""
    words = text.strip().lower().removeprefix("event").strip().lstrip("#").replace(",", "").replace("_", "")
    if not words.isdigit():
        return None
    index = int(words)
    return index if 0 <= index < event_count else None


class HelpScreen(ModalScreen[None]):
    """The keys that work where the user was, grouped: this tab's, then the app's."""

    BINDINGS = [
        Binding("escape", "dismiss_help", "Close", show=True),
        Binding("question_mark", "dismiss_help", "Close", show=False),
        Binding("q", "dismiss_help", "Close", show=False),
    ]

    def __init__(self, title: str, groups: Sequence[tuple[str, Sequence[tuple[str, str]]]]) -> None:
        super().__init__(id="help-screen")
        self.title_text = title
        self.groups = groups

    def compose(self) -> ComposeResult:
        body = Text()
        body.append_text(plain(self.title_text, style="bold"))
        for heading, keys in self.groups:
            body.append("\n\n")
            body.append_text(plain(heading, style="bold"))
            width = max((len(key) for key, _ in keys), default=0)
            for key, description in keys:
                body.append("\n  ")
                body.append_text(plain(key.ljust(width), style="bold"))
                body.append("  ")
                body.append_text(plain(description))
        body.append("\n\n")
        body.append_text(plain("Esc closes this.", style="dim"))
        with VerticalScroll(id="help-body"):
            yield Static(body, id="help-text")

    def action_dismiss_help(self) -> None:
        self.dismiss(None)


class GoToEventScreen(ModalScreen[int | None]):
    """Asks for an event number; dismissed with the index, or None (Esc)."""

    BINDINGS = [Binding("escape", "cancel", "Cancel", show=True)]

    def __init__(self, event_count: int) -> None:
        super().__init__(id="goto-screen")
        self.event_count = event_count

    def compose(self) -> ComposeResult:
        with Vertical(id="goto-box"):
            yield Static(plain(f"Go to event (0 to {max(self.event_count - 1, 0)}), Enter to go, Esc to cancel"))
            yield Input(placeholder="event number", id="goto-input")
            yield Static(Text(), id="goto-error")

    @on(Input.Submitted, "#goto-input")
    def _submitted(self, message: Input.Submitted) -> None:
        index = parse_event(message.value, self.event_count)
        if index is None:
            self.query_one("#goto-error", Static).update(
                plain(
                    f"not an event of this trace: type a number from 0 to {max(self.event_count - 1, 0)}", style="red"
                )
            )
            return
        self.dismiss(index)

    def action_cancel(self) -> None:
        self.dismiss(None)
