"""The app: tabs built from one analysis, or a loading view whose worker produces that analysis.

Nothing in a file ends the app with a traceback: a loader's error, and any exception while
loading or analysing, ends it with one line in `app.error` (the CLI prints it once the terminal
is restored) and a non-zero exit code; a tab that cannot be shown says why in the tab
(oomdoctor.tui.guard); anything else Textual would print as a traceback ends the app the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import Footer, Header, LoadingIndicator, ProgressBar, Static, TabbedContent, TabPane

from oomdoctor.analysis import Replayer, replayer
from oomdoctor.analysis.results import Analysis
from oomdoctor.errors import EXIT_BAD_INPUT, OomdoctorError
from oomdoctor.model import Snapshot
from oomdoctor.safetext import printable
from oomdoctor.tui.allocations import AllocationsPane
from oomdoctor.tui.components import ComponentsPane
from oomdoctor.tui.guard import internal_error
from oomdoctor.tui.overview import OverviewPane
from oomdoctor.tui.safe import plain
from oomdoctor.tui.segments import SegmentsPane
from oomdoctor.tui.timeline import TimelinePane

TABS = ("overview", "timeline", "segments", "components", "allocations")
# What the tab shows first, so the keyboard works at once after switching.
_FOCUS_IN_TAB = {
    "overview": OverviewPane,
    "timeline": "#timeline-chart",
    "segments": "#segment-table",
    "components": "#component-tree",
    "allocations": "#allocation-search",
}

# A loader reports each stage it enters (a short phrase) and returns the snapshot and its analysis:
# oomdoctor.pipeline.load_and_analyse bound to one file (commands/open.py); the app only runs it.
Loader = Callable[[Callable[[str], None]], tuple[Snapshot, Analysis]]
LOAD_STAGES = 3  # reading the file, analysing it, preparing the timeline


class Browser(Vertical):
    """The tabs over one analysis."""

    def __init__(self, analysis: Analysis, snapshot: Snapshot, replay: Replayer, source: str) -> None:
        super().__init__(id="browser")
        self.analysis = analysis
        self.snapshot = snapshot
        self.replay = replay
        self.source = source

    def compose(self) -> ComposeResult:
        # Each pane builds its content itself, so that one that fails shows why in its own tab.
        with TabbedContent(initial="overview"):
            with TabPane("1 Overview", id="overview"):
                yield OverviewPane(self.analysis, self.source)
            with TabPane("2 Timeline", id="timeline"):
                yield TimelinePane(self.analysis, self.snapshot, self.replay)
            with TabPane("3 Segments", id="segments"):
                yield SegmentsPane(self.analysis, self.replay)
            with TabPane("4 Components", id="components"):
                yield ComponentsPane(self.analysis)
            with TabPane("5 Allocations", id="allocations"):
                yield AllocationsPane(self.analysis)

    def on_mount(self) -> None:
        self.query_one(OverviewPane).focus()

    @on(TabbedContent.TabActivated)
    def _focus_tab(self, message: TabbedContent.TabActivated) -> None:
        pane_id = message.pane.id if message.pane is not None else None
        wanted = _FOCUS_IN_TAB.get(pane_id or "")
        if wanted is not None:
            found = self.query(wanted)  # none when the tab could not be built: it shows why instead
            if found:
                found.first().focus()


class LoadingView(Vertical):
    def __init__(self, source: str) -> None:
        super().__init__(id="loading")
        self.source = source

    def compose(self) -> ComposeResult:
        yield Static(plain(f"Opening {self.source}"), id="loading-title")
        yield ProgressBar(total=LOAD_STAGES, show_eta=False, id="loading-progress")
        yield Static(plain("reading the file", style="dim"), id="loading-stage")
        yield LoadingIndicator()


class OomdoctorApp(App[None]):
    """oomdoctor's terminal app. Build it with `make_app` (ready) or `make_loading_app` (loads first)."""

    CSS_PATH = "app.tcss"
    TITLE = "oomdoctor"
    BINDINGS = [
        Binding("q", "quit", "Quit"),
        *(
            Binding(str(number), f"show_tab('{tab}')", tab.capitalize(), show=False)
            for number, tab in enumerate(TABS, 1)
        ),
    ]

    class StageEntered(Message):
        def __init__(self, stage: str) -> None:
            super().__init__()
            self.stage = stage

    class Loaded(Message):
        def __init__(self, snapshot: Snapshot, analysis: Analysis, replay: Replayer) -> None:
            super().__init__()
            self.snapshot = snapshot
            self.analysis = analysis
            self.replay = replay

    class LoadFailed(Message):
        def __init__(self, error: OomdoctorError) -> None:
            super().__init__()
            self.error = error

    def __init__(
        self,
        *,
        source: str,
        analysis: Analysis | None = None,
        snapshot: Snapshot | None = None,
        replay: Replayer | None = None,
        loader: Loader | None = None,
    ) -> None:
        super().__init__()
        self.source = source
        self.analysis = analysis
        self.snapshot = snapshot
        self.replay = replay
        self.loader = loader
        # The first failure (loading, or a tab that could not be shown); the CLI reports it after exit.
        self.error: OomdoctorError | None = None
        self.sub_title = printable(Path(source).name)  # a file's name can hold terminal escapes too

    def compose(self) -> ComposeResult:
        yield Header()
        if self.analysis is not None and self.snapshot is not None and self.replay is not None:
            yield Browser(self.analysis, self.snapshot, self.replay, self.source)
        else:
            yield LoadingView(self.source)
        yield Footer()

    def on_mount(self) -> None:
        if self.analysis is None and self.loader is not None:
            self._load()

    @work(thread=True, exclusive=True, group="load")
    def _load(self) -> None:
        assert self.loader is not None
        try:
            snapshot, analysis = self.loader(lambda stage: self.post_message(self.StageEntered(stage)))
            self.post_message(self.StageEntered("preparing the timeline"))
            replay = replayer(snapshot, analysis.device)
        except OomdoctorError as error:
            self.post_message(self.LoadFailed(error))
            return
        except Exception as error:  # a file the analysis does not cope with: one line, not a traceback
            self.post_message(self.LoadFailed(internal_error(self.source, "read and analyse it", error)))
            return
        self.post_message(self.Loaded(snapshot, analysis, replay))

    @on(StageEntered)
    def _stage_entered(self, message: StageEntered) -> None:
        if self.query(LoadingView):
            self.query_one("#loading-progress", ProgressBar).advance(1)
            self.query_one("#loading-stage", Static).update(plain(message.stage, style="dim"))

    @on(Loaded)
    async def _loaded(self, message: Loaded) -> None:
        self.analysis, self.snapshot, self.replay = message.analysis, message.snapshot, message.replay
        await self.query_one(LoadingView).remove()
        await self.mount(
            Browser(message.analysis, message.snapshot, message.replay, self.source), before=self.query_one(Footer)
        )

    @on(LoadFailed)
    def _load_failed(self, message: LoadFailed) -> None:
        self.error = message.error
        for stage in self.query("#loading-stage").results(Static):
            stage.update(plain(str(message.error), style="bold red"))
        self.exit(return_code=message.error.exit_code)

    def report_failure(self, doing: str, error: BaseException) -> str:
        """Keep the first failure for the CLI to report after exit; the one line to show now."""
        failure = internal_error(self.source, doing, error)
        if self.error is None:
            self.error = failure
        return str(failure)

    def _handle_exception(self, error: Exception) -> None:
        """Any exception nothing else caught: end the app with one line (in `self.error`) and a
        non-zero exit code, instead of Textual's traceback.

        This overrides Textual's private hook (textual 8), the one place every unhandled
        exception goes (handlers, compose, workers, rendering); tests/test_tui_hostile.py checks
        that it still ends the app cleanly. Like Textual's own, it closes the message queue, so
        the app shuts down normally and the terminal is restored.
        """
        try:
            self.report_failure("show it", error)
        except Exception:  # never fail while failing
            if self.error is None:
                self.error = OomdoctorError(
                    f"{printable(self.source)}: oomdoctor could not show it; this is a bug in oomdoctor, please report it"
                )
        self._return_code = self.error.exit_code if self.error is not None else EXIT_BAD_INPUT
        self._exception_event.set()  # the pilot waits on this (tests), as for Textual's own handling
        self._close_messages_no_wait()

    def action_show_tab(self, tab: str) -> None:
        for tabbed in self.query(TabbedContent):
            tabbed.active = tab


def make_app(analysis: Analysis, snapshot: Snapshot, *, source: str) -> OomdoctorApp:
    """The app over an analysis already made (the CLI's demo and the tests use this)."""
    return OomdoctorApp(source=source, analysis=analysis, snapshot=snapshot, replay=replayer(snapshot, analysis.device))


def make_loading_app(loader: Loader, *, source: str) -> OomdoctorApp:
    """The app that runs `loader` in a worker behind a progress bar, then shows its analysis.

    A loader's `OomdoctorError` ends the app with that error's exit code and leaves the error in
    `app.error`, for the caller to print as one line once the terminal is restored.
    """
    return OomdoctorApp(source=source, loader=loader)
