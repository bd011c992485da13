"""`oomdoctor open A --compare B`: two dumps side by side.

Both timelines, one above the other and drawn to one scale (the higher peak at the top of both),
so that their heights compare; under them the allocation sites that changed at the peak, the rows
`oomdoctor diff A B` prints (appeared, went, grew or shrank, largest change first), and above them
the diff's one-paragraph summary. Both files are read and analysed in the worker behind the
progress bar (`make_compare_app`); bad input in either ends the app with one line and exit 2.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from textual import on, work
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import DataTable, Footer, Static

from oomdoctor.analysis.diff import GREW, SHRANK, SITE_MODULE, Diff, SiteChange
from oomdoctor.analysis.results import Analysis
from oomdoctor.errors import OomdoctorError
from oomdoctor.safetext import printable
from oomdoctor.tui.app import LoadingView, OomdoctorApp, _Progress
from oomdoctor.tui.content import Timeline, label_width
from oomdoctor.tui.guard import GuardedPane, internal_error
from oomdoctor.tui.safe import plain, row
from oomdoctor.tui.timeline import TimelineChart
from oomdoctor.units import human_size
from oomdoctor.views import diff_phrasing as words
from oomdoctor.views.shorten import shorten_name

# The loader the compare app runs in its worker: (analysis of A, analysis of B, their diff), made
# by oomdoctor.pipeline.compare_files (commands/open.py binds it to the two files).
CompareLoader = Callable[[Callable[..., None]], tuple[Analysis, Analysis, Diff]]


# The view's lines besides the charts and the table: the summary (at most 5), the two charts'
# labels and the table's title; what is left is shared by the charts and the table, a third each.
FIXED_ROWS = 8
CHART_MIN_HEIGHT = 5  # three rows of columns, the phase band, the step band


class CompareChart(TimelineChart):
    """A timeline chart as tall as the other one: both heights come from the view's, never from
    rounding a share of it, so that equal bytes are equal heights in both."""

    def get_content_height(self, container, viewport, width: int) -> int:
        if not self.timeline:
            return 1
        return max(CHART_MIN_HEIGHT, (container.height - FIXED_ROWS) // 3)


def site_cells(item: SiteChange, width: int) -> tuple[str, str, str, str, str, str]:
    """One row of the site table: change, how, the site, its component, A's and B's bytes."""
    how = words.STATUS[item.status]
    if item.status in (GREW, SHRANK):
        how += f" {words.ratio(item.ratio)}"
    where = f"{'module' if item.kind == SITE_MODULE else 'line'} {shorten_name(item.key, width)}"
    return (
        words.signed(item.delta_bytes),
        how,
        printable(where),
        words.label(item.component),
        human_size(item.a_bytes),
        human_size(item.b_bytes),
    )


class CompareView(GuardedPane, Vertical):
    """The diff's summary, A's timeline over B's (one scale), and the sites that changed at the peak."""

    TAB_TITLE = "comparison"

    def __init__(self, a: Analysis, b: Analysis, diff: Diff, **kwargs) -> None:
        super().__init__(id="compare", **kwargs)
        self.a, self.b, self.diff = a, b, diff
        self.sites: tuple[SiteChange, ...] = diff.at_peak.sites

    def build(self) -> ComposeResult:
        diff = self.diff
        scale = max(Timeline(self.a).max_bytes, Timeline(self.b).max_bytes)
        yield Static(plain(words.summary(diff)), id="compare-summary")
        for key, analysis, side in (("A", self.a, diff.a), ("B", self.b, diff.b)):
            timeline = Timeline(analysis, scale_bytes=scale)
            peak = f"peak {human_size(timeline.peak_bytes)}" if timeline else "no allocation history"
            yield Static(
                plain(f"{key}  {Path(side.label).name}: {peak}; {side.verdict} ({side.confidence:.0%})"),
                classes="compare-label",
            )
            yield CompareChart(timeline, id=f"compare-chart-{key.lower()}", classes="compare-chart")
        shown = len(self.sites)
        title = (
            f"Sites that changed at the peak (largest change first, {shown})"
            if shown
            else "No allocation site changed at the peak."
        )
        yield Static(plain(title, style="bold"), id="compare-sites-title")
        table = DataTable(id="compare-sites", cursor_type="row", zebra_stripes=True)
        table.add_columns(*row("change", "how", "site", "component", "A", "B"))
        width = label_width(self.app.size.width)
        for item in self.sites:
            table.add_row(*row(*site_cells(item, width)))
        yield table

    def on_mount(self) -> None:
        self.query_one("#compare-sites", DataTable).focus()


class CompareApp(OomdoctorApp):
    """The app over two files: loads both in the worker, then shows the CompareView."""

    class CompareLoaded(Message):
        def __init__(self, a: Analysis, b: Analysis, diff: Diff) -> None:
            super().__init__()
            self.a, self.b, self.diff = a, b, diff

    def __init__(self, loader: CompareLoader, *, source_a: str, source_b: str) -> None:
        super().__init__(source=f"{source_a} and {source_b}", loader=loader)  # type: ignore[arg-type]
        self.compare_loader = loader
        self.sub_title = f"{printable(Path(source_a).name)} vs {printable(Path(source_b).name)}"

    def _name_device(self) -> None:
        pass  # the subtitle names both files (set in __init__)

    @work(thread=True, exclusive=True, group="load")
    def _load(self) -> None:
        try:
            a, b, diff = self.compare_loader(_Progress(self))
        except OomdoctorError as error:
            self.post_message(self.LoadFailed(error))
            return
        except Exception as error:  # a file the analysis does not cope with: one line, not a traceback
            self.post_message(self.LoadFailed(internal_error(self.source, "read and compare them", error)))
            return
        self.post_message(self.CompareLoaded(a, b, diff))

    @on(CompareLoaded)
    async def _compared(self, message: CompareLoaded) -> None:
        await self.query(LoadingView).remove()
        await self.mount(CompareView(message.a, message.b, message.diff), before=self.query_one(Footer))

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Only the keys that do something here: no tabs, devices, stacks or event numbers."""
        if action in ("show_frames", "next_device", "go_to_event", "back_to_target", "show_tab"):
            return False
        return super().check_action(action, parameters)


def make_compare_app(loader: CompareLoader, *, source_a: str, source_b: str) -> CompareApp:
    """The app that runs `loader` (both files) in a worker behind a progress bar, then compares.

    A loader's `OomdoctorError` (either file) ends the app with that error's exit code and leaves
    it in `app.error`, for the caller to print as one line once the terminal is restored.
    """
    return CompareApp(loader, source_a=source_a, source_b=source_b)
