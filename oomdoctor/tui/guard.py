"""Failures in the app become one line, never a traceback: a tab that cannot be shown says why in
the tab (the other tabs keep working), and the app remembers the first failure so that the CLI
reports it, as one line on stderr with a non-zero exit code, once the terminal is restored.

A pane builds its widgets in `build()` (not `compose()`) and decorates its handlers with
`@guarded`; anything either raises ends up in `GuardedPane.fail`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

from textual.app import ComposeResult
from textual.widget import Widget
from textual.widgets import Static
from textual.worker import WorkerFailed

from oomdoctor.errors import OomdoctorError
from oomdoctor.safetext import printable
from oomdoctor.tui.safe import plain

MESSAGE_LIMIT = 300  # characters of an exception's own text


def internal_error(source: str, doing: str, error: BaseException) -> OomdoctorError:
    """One line saying that oomdoctor could not do `doing` with `source`, and why."""
    if isinstance(error, WorkerFailed):
        error = error.error
    try:
        detail = str(error)
    except Exception:  # an exception whose own text cannot be made
        detail = ""
    kind = type(error).__name__
    reason = f"{kind}: {printable(detail, MESSAGE_LIMIT)}" if detail else kind
    return OomdoctorError(
        f"{printable(source)}: oomdoctor could not {doing} ({reason}); this is a bug in oomdoctor, please report it"
    )


def report_failure(widget: Widget, doing: str, error: BaseException) -> str:
    """Tell the app (when it keeps failures: OomdoctorApp) and return the one line to show."""
    app = widget.app
    report = getattr(app, "report_failure", None)
    if report is not None:
        return report(doing, error)
    return str(internal_error(getattr(app, "source", "the file"), doing, error))


class GuardedPane(Widget):
    """A tab's pane whose failures replace its content with one line."""

    TAB_TITLE: ClassVar[str] = "this"
    failed = False

    def build(self) -> ComposeResult:
        raise NotImplementedError

    def compose(self) -> ComposeResult:
        try:
            widgets = list(self.build())
        except Exception as error:
            self.failed = True
            yield self._failure(error)
            return
        yield from widgets

    def fail(self, error: BaseException) -> None:
        """Show one line saying what went wrong instead of the tab's content."""
        first = not self.failed
        self.failed = True
        line = self._failure(error)
        if first:
            self.remove_children()
            self.mount(line)

    def _failure(self, error: BaseException) -> Static:
        line = report_failure(self, f"show the {self.TAB_TITLE} tab", error)
        return Static(plain(line), classes="tab-failure")


Method = TypeVar("Method", bound=Callable[..., Any])


def guarded(method: Method) -> Method:
    """A GuardedPane handler whose exception fails the pane (and which does nothing once failed)."""

    @functools.wraps(method)
    def wrapper(self: GuardedPane, *args: Any, **kwargs: Any) -> Any:
        if self.failed:
            return None
        try:
            return method(self, *args, **kwargs)
        except Exception as error:
            self.fail(error)
            return None

    return wrapper  # type: ignore[return-value]


__all__ = ["GuardedPane", "guarded", "internal_error", "report_failure"]
