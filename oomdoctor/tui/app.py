"""The app: tabs built from one analysis, or a loading view whose worker produces that analysis.

Nothing in a file ends the app with a traceback: a loader's error, and any exception while
loading or analysing, ends it with one line in `app.error` (the CLI prints it once the terminal
is restored) and a non-zero exit code; a tab that cannot be shown says why in the tab
(oomdoctor.tui.guard); anything else Textual would print as a traceback ends the app the same way.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterable
from pathlib import Path

from textual import on, work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.reactive import reactive
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import (
    Header,
    Input,
    LoadingIndicator,
    ProgressBar,
    Static,
    TabbedContent,
    TabPane,
)

from oomdoctor.analysis import Replayer, replayer
from oomdoctor.analysis.results import Analysis
from oomdoctor.errors import EXIT_BAD_INPUT, OomdoctorError
from oomdoctor.model import Snapshot
from oomdoctor.safetext import printable
from oomdoctor.tui.allocations import AllocationsPane
from oomdoctor.tui.components import ComponentsPane
from oomdoctor.tui.dialogs import GoToEventScreen, HelpScreen
from oomdoctor.tui.footer import Footer
from oomdoctor.tui.guard import internal_error
from oomdoctor.tui.overview import OverviewPane
from oomdoctor.tui.safe import plain
from oomdoctor.tui.segments import SegmentsPane
from oomdoctor.tui.stack import StackPane
from oomdoctor.tui.timeline import TimelineChart, TimelinePane

TABS = ("overview", "timeline", "segments", "components", "allocations")
# What the tab shows first, so the keyboard works at once after switching.
_FOCUS_IN_TAB = {
    "overview": OverviewPane,
    "timeline": "#timeline-chart",
    "segments": "#segment-table",
    "components": "#component-tree",
    "allocations": "#allocation-search",
}

# A loader reports its progress and returns the snapshot and its analysis: oomdoctor.pipeline.
# load_and_analyse bound to one file (commands/open.py); the app only runs it. It is handed a
# `report(stage=None, fraction=None)`: a short phrase when it enters a stage ("analysing"), the
# fraction of the whole load done (0 to 1) as it goes; either may be left out.
Loader = Callable[[Callable[..., None]], tuple[Snapshot, Analysis]]
# Where the bar stands when a stage is entered without a fraction: reading the file moves it from
# 0 to READ_SHARE by the bytes read (the longest stage), then analysing, then the timeline.
STAGE_FRACTIONS = {
    "reading the file": 0.0,
    "building the model": 0.55,
    "analysing": 0.7,
    "preparing the timeline": 0.95,
}
PROGRESS_STEPS = 100
_TABS_NEEDING_REPLAY = frozenset({"timeline", "segments"})
# The tabs that show the state at the timeline cursor's event (the target until it moves), and
# offer `t` to go back to the target when it is elsewhere.
_TABS_AT_THE_CURSOR = frozenset({"segments", "components", "allocations"})
_TAB_TITLES = {
    "overview": "1 Overview",
    "timeline": "2 Timeline",
    "segments": "3 Segments",
    "components": "4 Components",
    "allocations": "5 Allocations",
}


def _freeze_heap() -> None:
    """Take what is built so far out of the garbage collector's scans (gc.freeze) until the app
    ends (OomdoctorApp.on_unmount) or shows another device (OomdoctorApp._loaded).

    The snapshot, its analysis and the built tabs are a few hundred thousand objects that live as
    long as the app; every full collection walked them all (~90 ms on the 1,722-segment corpus
    file, every other tab switch or so: the caches Textual fills while painting keep the
    collector's thresholds crossed). Frozen, a full collection walks what came after (~15 ms).
    """
    gc.freeze()


class Browser(Vertical):
    """The tabs over one analysis. The overview is built at once; every other tab the first time it
    is shown (the timeline and the segments once the replayer is ready: `replay_ready`)."""

    def __init__(self, analysis: Analysis, snapshot: Snapshot, replay: Replayer | None, source: str) -> None:
        super().__init__(id="browser")
        self.analysis = analysis
        self.snapshot = snapshot
        self.replay = replay
        self.source = source
        self.built: set[str] = {"overview"}
        # Where the other tabs look: the timeline cursor's event (None: the target, as the analysis
        # has it) and the block the user last went to from a piece of evidence.
        self.cursor_event: int | None = None
        self.selected_block: int | None = None
        self.panes: dict[str, Widget] = {}  # the tabs built after the overview, by tab

    def compose(self) -> ComposeResult:
        # Each pane builds its content itself, so that one that fails shows why in its own tab.
        with TabbedContent(initial="overview"):
            with TabPane(_TAB_TITLES["overview"], id="overview"):
                yield OverviewPane(self.analysis, self.source)
            for tab in TABS[1:]:
                with TabPane(_TAB_TITLES[tab], id=tab):
                    yield Static(plain("building this tab", style="dim"), classes="tab-placeholder")

    def _pane(self, tab: str) -> Widget:
        if tab == "timeline":
            assert self.replay is not None
            return TimelinePane(self.analysis, self.snapshot, self.replay)
        if tab == "segments":
            assert self.replay is not None
            return SegmentsPane(self.analysis, self.replay)
        if tab == "components":
            return ComponentsPane(self.analysis)
        return AllocationsPane(self.analysis)

    async def build_tab(self, tab: str) -> bool:
        """Build `tab` unless it is built; False when it must wait for the replayer."""
        if tab in self.built:
            return True
        holder = self.query_one(f"#{tab}", TabPane)
        if tab in _TABS_NEEDING_REPLAY and self.replay is None:
            for placeholder in holder.query(".tab-placeholder").results(Static):
                placeholder.update(plain("preparing the timeline", style="dim"))
            return False
        self.built.add(tab)
        await holder.query(".tab-placeholder").remove()
        pane = self.panes[tab] = self._pane(tab)
        await holder.mount(pane)
        _freeze_heap()
        return True

    def on_mount(self) -> None:
        self.query_one(OverviewPane).focus()
        _freeze_heap()

    @on(TabbedContent.TabActivated)
    async def _show_tab(self, message: TabbedContent.TabActivated) -> None:
        pane_id = message.pane.id if message.pane is not None else None
        if pane_id and await self.build_tab(pane_id):
            self._follow(pane_id)
            self._focus(pane_id)
        self.app.refresh_bindings()  # `t` is offered on the tabs that follow the cursor

    def _focus(self, tab: str) -> None:
        wanted = _FOCUS_IN_TAB.get(tab)
        if wanted is not None:
            found = self.query(wanted)  # none when the tab could not be built: it shows why instead
            if found:
                found.first().focus()

    def focus_tab(self) -> None:
        """Focus what the shown tab shows first (where Esc leaves an input for)."""
        self._focus(self.query_one(TabbedContent).active)

    async def replay_ready(self, replay: Replayer) -> None:
        """The replayer is made: build the tab that waits for it, if it is the one shown (or bring
        Components or Allocations to a cursor that evidence moved before it was made)."""
        self.replay = replay
        active = self.query_one(TabbedContent).active
        if active in _TABS_NEEDING_REPLAY and await self.build_tab(active):
            self._follow(active)
            self._focus(active)
        elif active in ("components", "allocations") and active in self.built:
            self._follow(active)

    @property
    def away_from_target(self) -> bool:
        """The timeline cursor is at an event other than the target's: the tabs show that event."""
        return self.cursor_event is not None and self.cursor_event != self.analysis.replay.target_index

    @on(TimelineChart.CursorMoved)
    def _cursor_moved(self, message: TimelineChart.CursorMoved) -> None:
        away = self.away_from_target
        self.cursor_event = message.event_index
        if away != self.away_from_target:
            self.app.refresh_bindings()  # `t` (back to the target) offered or not

    def back_to_target(self) -> None:
        """The timeline cursor back to the target, and the tab shown brought there."""
        target = self.analysis.replay.target_index
        self.cursor_event = target
        if target is not None:
            for chart in self.query(TimelineChart).results(TimelineChart):
                chart.cursor_index = chart.timeline.clamp(target)
        active = self.query_one(TabbedContent).active
        if active in self.built:
            self._follow(active)
        self.app.refresh_bindings()

    @on(OverviewPane.GoTo)
    async def _go_to_evidence(self, message: OverviewPane.GoTo) -> None:
        await self.go_to(message.event_index, message.address)

    def _follow(self, tab: str) -> None:
        """Bring a built tab to the cursor's event and the selected block."""
        if tab == "timeline" and self.cursor_event is not None:
            for chart in self.query(TimelineChart).results(TimelineChart):
                chart.cursor_index = chart.timeline.clamp(self.cursor_event)
            return
        pane = self.panes.get(tab)
        if isinstance(pane, SegmentsPane):
            pane.show_event(self.cursor_event, self.selected_block)
        elif isinstance(pane, ComponentsPane):
            pane.show_event(self.cursor_event, self.replay)
        elif isinstance(pane, AllocationsPane):
            pane.show_event(self.cursor_event, self.replay)
            if self.selected_block is not None:
                pane.select_block(self.selected_block)

    async def go_to(self, event_index: int | None, address: int | None = None) -> None:
        """Show where a piece of evidence was read: its event under the timeline cursor (the other
        tabs follow it), else its block under Allocations (Segments when it is not live there)."""
        self.selected_block = address
        if event_index is not None:
            self.cursor_event = event_index
            tab = "timeline"
        elif address is not None:
            # a block without an event was read at the target: the cursor goes back there
            self.cursor_event = self.analysis.replay.target_index
            live = any(block.address == address for block in self.analysis.live_blocks)
            tab = "allocations" if live else "segments"
        else:
            return
        tabbed = self.query_one(TabbedContent)
        if tabbed.active == tab:
            if await self.build_tab(tab):
                self._follow(tab)
                self._focus(tab)
        else:
            tabbed.active = tab  # _show_tab builds it, follows and focuses


class LoadingView(Vertical):
    def __init__(self, source: str) -> None:
        super().__init__(id="loading")
        self.source = source

    def compose(self) -> ComposeResult:
        yield Static(plain(f"Opening {self.source}"), id="loading-title")
        yield ProgressBar(total=PROGRESS_STEPS, show_eta=False, id="loading-progress")
        yield Static(plain("reading the file", style="dim"), id="loading-stage")
        yield LoadingIndicator()


class _Progress:
    """What the worker hands the loader: posts the stage and the fraction done to the app, at most
    once per percent."""

    def __init__(self, app: OomdoctorApp) -> None:
        self.app = app
        self.shown = -1

    def __call__(self, stage: str | None = None, fraction: float | None = None) -> None:
        if fraction is None and stage is not None:
            fraction = STAGE_FRACTIONS.get(stage)
        step = -1 if fraction is None else int(min(max(fraction, 0.0), 1.0) * PROGRESS_STEPS)
        if stage is None and step <= self.shown:
            return
        self.shown = max(self.shown, step)
        self.app.post_message(self.app.StageEntered(stage, step if step >= 0 else None))


class OomdoctorApp(App[None]):
    """oomdoctor's terminal app. Build it with `make_app` (ready) or `make_loading_app` (loads first)."""

    CSS_PATH = "app.tcss"
    TITLE = "oomdoctor"
    BINDINGS = [
        Binding("q", "quit", "Quit"),
        Binding("question_mark", "help", "Help"),
        Binding("g", "go_to_event", "Go to event", show=False),
        Binding("d", "next_device", "Device"),
        Binding("escape", "leave", "Leave the input", show=False),
        # one key, two labels in the footer: what pressing it will show
        Binding("f", "show_frames('all')", "All frames"),
        Binding("f", "show_frames('user')", "Your frames"),
        # one key, the label naming the target: shown where a tab follows the cursor away from it
        Binding("t", "back_to_target('oom')", "At the OOM"),
        Binding("t", "back_to_target('other')", "At the target"),
        *(
            Binding(str(number), f"show_tab('{tab}')", tab.capitalize(), show=False)
            for number, tab in enumerate(TABS, 1)
        ),
    ]

    all_frames: reactive[bool] = reactive(False)  # every stack pane shows all frames, not the user's

    class StageEntered(Message):
        def __init__(self, stage: str | None, step: int | None = None) -> None:
            super().__init__()
            self.stage = stage
            self.step = step  # of PROGRESS_STEPS; None: the bar stays where it is

    class Loaded(Message):
        def __init__(self, snapshot: Snapshot, analysis: Analysis) -> None:
            super().__init__()
            self.snapshot = snapshot
            self.analysis = analysis

    class ReplayReady(Message):
        def __init__(self, replay: Replayer) -> None:
            super().__init__()
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
        self._name_device()

    def compose(self) -> ComposeResult:
        yield Header()
        if self.analysis is not None and self.snapshot is not None:
            yield Browser(self.analysis, self.snapshot, self.replay, self.source)
        else:
            yield LoadingView(self.source)
        yield Footer()

    def on_mount(self) -> None:
        if self.analysis is None and self.loader is not None:
            self.call_after_refresh(self._load)  # the loading view is on screen before the work starts

    @work(thread=True, exclusive=True, group="load")
    def _load(self) -> None:
        assert self.loader is not None
        try:
            snapshot, analysis = self.loader(_Progress(self))
        except OomdoctorError as error:
            self.post_message(self.LoadFailed(error))
            return
        except Exception as error:  # a file the analysis does not cope with: one line, not a traceback
            self.post_message(self.LoadFailed(internal_error(self.source, "read and analyse it", error)))
            return
        self.post_message(self.Loaded(snapshot, analysis))  # the overview is shown while the replayer is made
        try:
            replay = replayer(snapshot, analysis.device)
        except Exception as error:
            self.post_message(self.LoadFailed(internal_error(self.source, "prepare the timeline", error)))
            return
        self.post_message(self.ReplayReady(replay))

    @on(StageEntered)
    def _stage_entered(self, message: StageEntered) -> None:
        if self.query(LoadingView):
            if message.step is not None:
                self.query_one("#loading-progress", ProgressBar).update(progress=message.step)
            if message.stage is not None:
                self.query_one("#loading-stage", Static).update(plain(message.stage, style="dim"))

    def on_unmount(self) -> None:
        gc.unfreeze()  # what _freeze_heap held back is the collector's again

    @on(Loaded)
    async def _loaded(self, message: Loaded) -> None:
        gc.unfreeze()  # another device's Browser, removed below, is collected (frozen again once built)
        self.analysis, self.snapshot = message.analysis, message.snapshot
        self.replay = None  # the analysed device's, made next (ReplayReady)
        await self.query(LoadingView).remove()
        await self.query(Browser).remove()  # another device's
        self._name_device()
        await self.mount(
            Browser(message.analysis, message.snapshot, self.replay, self.source), before=self.query_one(Footer)
        )

    @on(ReplayReady)
    async def _replay_ready(self, message: ReplayReady) -> None:
        self.replay = message.replay
        for browser in self.query(Browser).results(Browser):
            await browser.replay_ready(message.replay)

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

    def action_show_frames(self, which: str) -> None:
        self.all_frames = which == "all"

    def watch_all_frames(self) -> None:
        self.refresh_bindings()
        for pane in self.query(StackPane).results(StackPane):
            pane.redraw()

    def action_show_tab(self, tab: str) -> None:
        browser = self._browser()
        if browser is None:
            return
        tabbed = browser.query_one(TabbedContent)
        if tabbed.active == tab:
            return
        tabbed.active = tab
        if tab in browser.built:
            # focused in the same turn as the tab is shown, not a message later in
            # Browser._show_tab (which then finds it focused): one layout of the screen for
            # both, not one each
            browser.focus_tab()

    # --- keys and commands beyond the tabs ---------------------------------------------------------

    def _browser(self) -> Browser | None:
        # query_one, not query: the footer reads this through check_action several times a
        # switch, and a query walks the whole screen (query_one stops at the Browser, a child
        # of the screen, and keeps it until the screen's children change)
        return self.query_one_optional(Browser)

    def _other_devices(self) -> tuple[int, ...]:
        if self.analysis is None:
            return ()
        return tuple(device for device in self.analysis.devices if device != self.analysis.device)

    def _name_device(self) -> None:
        name = printable(Path(self.source).name)
        if self.analysis is not None and len(self.analysis.devices) > 1:
            devices = ", ".join(str(device) for device in self.analysis.devices)
            name += f" · device {self.analysis.device} (devices with data: {devices})"
        self.sub_title = name

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Keys that do nothing here are not offered: `d` with one device, `g` before the analysis
        or on a trace without events; `f` under the label of what it will show."""
        if action == "show_frames":  # the one of its two labels that says what `f` will show
            return parameters != (("all" if self.all_frames else "user"),)
        if action == "next_device":
            return bool(self._other_devices()) and self._browser() is not None
        if action == "back_to_target":
            browser = self._browser()
            if browser is None or self.analysis is None or not browser.away_from_target:
                return False
            if browser.query_one(TabbedContent).active not in _TABS_AT_THE_CURSOR:
                return False
            return parameters == (("oom" if self.analysis.replay.target_kind == "oom" else "other"),)
        if action == "go_to_event":
            return self._browser() is not None and self.analysis is not None and self.analysis.replay.event_count > 0
        return True

    def action_leave(self) -> None:
        """Esc: out of an input (search) back to the tab, or close the keys panel."""
        if self.screen.query("HelpPanel"):
            self.action_hide_help_panel()
        elif isinstance(self.focused, Input):
            browser = self._browser()
            if browser is not None:
                browser.focus_tab()
                if isinstance(self.focused, Input):  # the tab's first widget is the input itself
                    tables = self.screen.query(f"#{self.query_one(TabbedContent).active} DataTable")
                    if tables:
                        tables.first().focus()

    def action_help(self) -> None:
        """The keys of the tab the user is on, and the app's own."""
        tab_keys: list[tuple[str, str]] = []
        app_keys: list[tuple[str, str]] = []
        seen: set[tuple[str, str]] = set()
        for active in self.screen.active_bindings.values():
            binding = active.binding
            if not active.enabled or not binding.description or binding.action.startswith("show_tab"):
                continue
            entry = (self.get_key_display(binding), binding.description)
            if entry in seen:
                continue
            seen.add(entry)
            (app_keys if active.node is self else tab_keys).append(entry)
        app_keys[:0] = [("1-5", "switch tabs (Overview, Timeline, Segments, Components, Allocations)")]
        app_keys.append(("ctrl+p", "commands: go to the OOM, the peak, an event; another device; copy the report"))
        active = self.query(TabbedContent).first().active if self.query(TabbedContent) else ""
        title = f"Keys on the {_TAB_TITLES[active].split(' ', 1)[1]} tab" if active in _TAB_TITLES else "Keys"
        groups = [("This tab", tab_keys)] if tab_keys else []
        groups.append(("Everywhere", app_keys))
        self.push_screen(HelpScreen(title, groups))

    def action_back_to_target(self, _kind: str = "") -> None:
        """Segments, Components and Allocations at the target again (the timeline cursor too)."""
        browser = self._browser()
        if browser is not None:
            browser.back_to_target()

    def action_go_to_event(self) -> None:
        if self.analysis is None or self._browser() is None:
            return

        async def chosen(index: int | None) -> None:
            browser = self._browser()
            if index is not None and browser is not None:
                await browser.go_to(index)

        self.push_screen(GoToEventScreen(self.analysis.replay.event_count), chosen)

    async def go_to_place(self, where: str) -> None:
        """The cursor to the target event ("target"), or to the peak ("peak")."""
        browser = self._browser()
        if browser is None or self.analysis is None:
            return
        replay = self.analysis.replay
        index = replay.target_index if where == "target" else replay.peak_index
        if index is not None:
            await browser.go_to(index)

    def action_next_device(self) -> None:
        others = self._other_devices()
        if others and self.analysis is not None:
            later = [device for device in others if device > self.analysis.device]
            self.show_device((later or list(others))[0])

    def show_device(self, device: int) -> None:
        """Analyse another device of the same snapshot in the worker, then show it."""
        if self.snapshot is None:
            return
        self.notify(f"analysing device {device}", timeout=2)
        self._analyse_device(device)

    @work(thread=True, exclusive=True, group="load")
    def _analyse_device(self, device: int) -> None:
        from oomdoctor.analysis import analyse

        snapshot = self.snapshot
        assert snapshot is not None
        try:
            analysis = analyse(snapshot, device=device)
        except Exception as error:
            self.post_message(self.LoadFailed(internal_error(self.source, f"analyse device {device}", error)))
            return
        self.post_message(self.Loaded(snapshot, analysis))
        try:
            replay = replayer(snapshot, device)
        except Exception as error:
            self.post_message(self.LoadFailed(internal_error(self.source, "prepare the timeline", error)))
            return
        self.post_message(self.ReplayReady(replay))

    def _copy_report(self) -> None:
        """The Markdown report `oomdoctor report --format md` prints, on the clipboard (OSC 52)."""
        from oomdoctor.analysis.environment import environment_of
        from oomdoctor.views.markdown_report import render as render_markdown

        if self.snapshot is None or self.analysis is None:
            return
        report = render_markdown(self.analysis, source=self.source, environment=environment_of(self.snapshot))
        self.copy_to_clipboard(report)
        self.notify("the Markdown report is on the clipboard (where the terminal allows it)", timeout=4)

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        """The palette (ctrl+p): oomdoctor's actions first, then Textual's (its key panel replaced by `?`)."""
        if self._browser() is not None and self.analysis is not None:
            replay = self.analysis.replay
            if replay.target_index is not None:
                yield SystemCommand(
                    f"Go to the {'OOM' if replay.target_kind == 'oom' else replay.target_kind}",
                    f"the timeline cursor to event {replay.target_index}",
                    lambda: self.run_worker(self.go_to_place("target")),
                )
            if replay.peak_index is not None:
                yield SystemCommand(
                    "Go to the peak",
                    f"the timeline cursor to event {replay.peak_index}",
                    lambda: self.run_worker(self.go_to_place("peak")),
                )
            browser = self._browser()
            if browser is not None and browser.away_from_target:
                target = "the OOM" if replay.target_kind == "oom" else "the target"
                yield SystemCommand(
                    f"Back to {target}",
                    f"Segments, Components and Allocations at {target} again, not event {browser.cursor_event} (also: t)",
                    self.action_back_to_target,
                )
            if replay.event_count:
                yield SystemCommand("Go to event…", "type an event number (also: g)", self.action_go_to_event)
            for device in self._other_devices():
                yield SystemCommand(
                    f"Show device {device}",
                    "analyse and show another device of this snapshot",
                    self._device_command(device),
                )
            yield SystemCommand(
                "Copy the Markdown report", "the report to paste into an issue, on the clipboard", self._copy_report
            )
        yield SystemCommand("Keys", "the keys of this tab (also: ?)", self.action_help)
        for command in super().get_system_commands(screen):
            if command.title != "Keys":
                yield command

    def _device_command(self, device: int) -> Callable[[], None]:
        return lambda: self.show_device(device)


def make_app(analysis: Analysis, snapshot: Snapshot, *, source: str) -> OomdoctorApp:
    """The app over an analysis already made (the CLI's demo and the tests use this)."""
    return OomdoctorApp(source=source, analysis=analysis, snapshot=snapshot, replay=replayer(snapshot, analysis.device))


def make_loading_app(loader: Loader, *, source: str) -> OomdoctorApp:
    """The app that runs `loader` in a worker behind a progress bar, then shows its analysis.

    A loader's `OomdoctorError` ends the app with that error's exit code and leaves the error in
    `app.error`, for the caller to print as one line once the terminal is restored.
    """
    return OomdoctorApp(source=source, loader=loader)
