"""The tables and the tree keep what they rendered across tab switches (oomdoctor.tui.kept), and what
they paint is what they would paint from nothing: after focus moves, after a tab is shown again,
after the theme changes."""

from __future__ import annotations

import pytest

pytest.importorskip("textual")

from textual.geometry import Region  # noqa: E402

from oomdoctor.tui.kept import DataTable, Tree  # noqa: E402
from tests.test_tui import run_app, settle  # noqa: E402
from tests.test_tui_navigation import demo_app  # noqa: E402


def painted(widget) -> list[list[tuple[str, object]]]:
    """What the widget paints now, as text and style per segment."""
    region = Region(0, 0, widget.size.width, widget.size.height)
    return [[(segment.text, segment.style) for segment in strip] for strip in widget.render_lines(region)]


def from_nothing(widget) -> list[list[tuple[str, object]]]:
    """What the widget paints with every cache of its own dropped first."""
    if isinstance(widget, DataTable):
        widget._clear_caches()
    else:
        widget._invalidate()
    widget._styles_cache.clear()
    return painted(widget)


@pytest.mark.parametrize(("tab", "selector"), [("3", "#segment-table"), ("4", "#component-tree")])
def test_a_table_or_tree_shown_again_keeps_its_caches_and_paints_as_from_nothing(tab, selector):
    app, _, _ = demo_app()

    async def scenario(app, pilot):
        await pilot.press(tab)
        await settle(app, pilot)
        widget = app.query_one(selector)
        kept = type(widget), widget._update_count if isinstance(widget, DataTable) else widget._updates
        await pilot.press("1")
        await settle(app, pilot)
        await pilot.press(tab)
        await settle(app, pilot)
        again = widget._update_count if isinstance(widget, DataTable) else widget._updates
        focused = app.focused is widget
        seen, fresh = painted(widget), from_nothing(widget)
        app.theme = "textual-light" if app.theme != "textual-light" else "textual-dark"
        await settle(app, pilot)
        themed = painted(widget)
        return kept, again, focused, seen, fresh, themed, from_nothing(widget)

    (kind, before), again, focused, seen, fresh, themed, themed_fresh = run_app(app, scenario)
    assert kind in (DataTable, Tree)
    assert focused
    assert again == before  # shown again at its size and refocused: nothing dropped
    assert seen == fresh
    assert themed == themed_fresh and themed != seen
