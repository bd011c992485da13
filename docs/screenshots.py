"""Regenerate the README's screenshots from the real app: the demo's Overview and Timeline tabs.

    python docs/screenshots.py            # writes docs/images/demo-overview.svg, demo-timeline.svg

The app runs headless at 100x32 on the example dump shipped with the package (what `oomdoctor
demo` opens), exactly as a user sees it; the SVGs are Textual's own screenshots.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

SIZE = (100, 32)
SHOTS = {"demo-overview": "1", "demo-timeline": "2"}  # file name -> the key that shows its tab


def demo_app():
    from oomdoctor.analysis import analyse
    from oomdoctor.examples import EXAMPLE_DUMP
    from oomdoctor.load import load
    from oomdoctor.tui.app import make_app

    snapshot = load(EXAMPLE_DUMP)
    return make_app(analyse(snapshot), snapshot, source="example.pickle")


async def shoot(key: str) -> str:
    app = demo_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press(key)
        for _ in range(3):  # the tab is built on first visit, the cursor's replay in a worker
            await pilot.pause()
            await app.workers.wait_for_complete()
        await pilot.pause()
        return app.export_screenshot(title=f"oomdoctor demo ({'Overview' if key == '1' else 'Timeline'})")


def main() -> int:
    folder = HERE / "images"
    folder.mkdir(exist_ok=True)
    for name, key in SHOTS.items():
        path = folder / f"{name}.svg"
        path.write_text(asyncio.run(shoot(key)), encoding="utf-8")
        print(f"wrote {path.relative_to(HERE.parent)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
