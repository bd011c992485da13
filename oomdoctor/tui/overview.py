"""The Overview tab: the verdict, its evidence, what to change and the memory at the OOM."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static

from oomdoctor.analysis.results import Analysis
from oomdoctor.tui.content import Section, overview_sections
from oomdoctor.tui.guard import GuardedPane
from oomdoctor.tui.safe import lines, plain


class OverviewPane(GuardedPane, VerticalScroll, can_focus=True):
    """One block of text per section, verdict first; scrolls with the arrow keys."""

    TAB_TITLE = "Overview"

    def __init__(self, analysis: Analysis, source: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.analysis = analysis
        self.source = source
        self.sections: list[Section] = []

    def build(self) -> ComposeResult:
        self.sections = overview_sections(self.analysis, self.source)
        for number, section in enumerate(self.sections):
            body = Text()
            body.append_text(plain(section.title, style="bold reverse" if number == 0 else "bold"))
            body.append("\n")
            body.append_text(lines(section.lines))
            yield Static(body, classes="overview-section verdict" if number == 0 else "overview-section")
