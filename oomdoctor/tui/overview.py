"""The Overview tab: the verdict, its evidence, what to change and the memory at the OOM."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static

from oomdoctor.analysis.results import Analysis
from oomdoctor.tui.content import overview_sections


class OverviewPane(VerticalScroll, can_focus=True):
    """One block of text per section, verdict first; scrolls with the arrow keys."""

    def __init__(self, analysis: Analysis, source: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.sections = overview_sections(analysis, source)

    def compose(self) -> ComposeResult:
        for number, section in enumerate(self.sections):
            body = Text()
            body.append(section.title + "\n", style="bold reverse" if number == 0 else "bold")
            body.append("\n".join(section.lines))
            yield Static(body, classes="overview-section verdict" if number == 0 else "overview-section")
