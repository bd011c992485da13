"""Text for the widgets: every string a widget shows is a `rich.text.Text`, never a markup string.

Textual reads a plain `str` given to a DataTable cell, a Static, a Tree label or a Label as
markup, so a dump's string could carry styles, links or `@click` actions (one click ran
`app.screenshot`, overwriting a file) or crash the app (`[/bold]`). These helpers build `Text`
only, and escape control characters again (idempotent: `printable` leaves its own output as it
is), so that nothing the content builders missed reaches the terminal raw.
"""

from __future__ import annotations

from collections.abc import Iterable

from rich.text import Text

from oomdoctor.safetext import printable


def plain(value: str | int, style: str = "") -> Text:
    """`value` shown literally, on one line: never markup, control characters escaped."""
    return Text(printable(value if type(value) is str else str(value), limit=None), style=style)


def lines(values: Iterable[str], style: str = "") -> Text:
    """Each of `values` shown literally on a line of its own."""
    return Text("\n", style=style).join(plain(value, style) for value in values)


def row(*cells: str | int | Text) -> tuple[Text, ...]:
    """DataTable cells, each a Text (a Text given here is kept: it was built by this module or
    from constants)."""
    return tuple(cell if isinstance(cell, Text) else plain(cell) for cell in cells)


__all__ = ["lines", "plain", "row"]
