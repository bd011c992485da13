"""SVG snapshots of every tab of the demo at 80x24 and 160x50 (pytest-textual-snapshot; textual is
pinned in pyproject.toml because its rendering decides every byte). After a deliberate change to
the app, review the differences and refresh them with

    python -m pytest tests/test_tui_snapshots.py --snapshot-update

The app has no clock on screen and nothing animated: the tab is pressed, its build and the cursor's
replay worker waited for, then the screen taken.
"""

from __future__ import annotations

import pytest

pytest.importorskip("textual")
pytest.importorskip("pytest_textual_snapshot")

from oomdoctor.analysis import analyse  # noqa: E402
from oomdoctor.examples import EXAMPLE_DUMP  # noqa: E402
from oomdoctor.load import load  # noqa: E402
from oomdoctor.tui.app import make_app  # noqa: E402

TABS = {"overview": "1", "timeline": "2", "segments": "3", "components": "4", "allocations": "5"}
SIZES = {"80x24": (80, 24), "160x50": (160, 50)}


def demo_app():
    snapshot = load(EXAMPLE_DUMP)
    return make_app(analyse(snapshot), snapshot, source="example.pickle")


@pytest.mark.parametrize("size", SIZES, ids=list(SIZES))
@pytest.mark.parametrize("tab", TABS, ids=list(TABS))
def test_each_tab_of_the_demo_at_both_sizes(snap_compare, tab, size):
    async def show_tab(pilot):
        await pilot.press(TABS[tab])
        for _ in range(3):
            await pilot.pause()
            await pilot.app.workers.wait_for_complete()
        await pilot.pause()

    assert snap_compare(demo_app(), terminal_size=SIZES[size], run_before=show_tab)
