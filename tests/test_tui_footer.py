"""The footer (oomdoctor.tui.footer) mounts and removes only the keys that change from one tab to
the next; what it shows is what rebuilding it from nothing shows."""

from __future__ import annotations

import pytest

pytest.importorskip("textual")

from oomdoctor.tui.footer import Footer  # noqa: E402
from tests.test_tui import run_app, settle  # noqa: E402
from tests.test_tui_navigation import demo_app  # noqa: E402


def test_the_footer_keeps_the_keys_the_next_tab_shows_too():
    app, _, _ = demo_app()

    async def scenario(app, pilot):
        footer = app.query_one(Footer)
        children = []
        for key in ("2", "3", "2"):
            await pilot.press(key)
            await settle(app, pilot)
            children.append(list(footer.children))
        return children

    timeline, segments, timeline_again = run_app(app, scenario, size=(160, 50))
    assert set(segments) < set(timeline)  # the timeline's own keys went, the others stayed
    assert set(segments) < set(timeline_again) and len(timeline_again) == len(timeline)


def test_the_footer_after_each_key_shows_what_a_rebuilt_footer_shows():
    app, _, _ = demo_app()

    def bottom_line() -> str:
        return app.screen._compositor.render_strips()[-1].text

    async def scenario(app, pilot):
        footer = app.query_one(Footer)
        seen = []
        for key in ("2", "3", "5", "escape", "f", "1", "4", "2", "f", "5"):
            await pilot.press(key)
            await settle(app, pilot)
            shown = bottom_line()
            footer.call_later(footer.recompose)  # from the footer, as its own rebuilds run
            await settle(app, pilot)
            seen.append((key, shown, bottom_line()))
        return seen

    seen = run_app(app, scenario, size=(160, 50))
    for key, shown, rebuilt in seen:
        assert shown == rebuilt, key
    assert len({shown for _, shown, _ in seen}) > 2  # the keys did change along the way
