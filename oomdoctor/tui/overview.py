"""The Overview tab: the verdict, its evidence, what to change and the memory at the OOM.

The evidence is a list: Enter (or a click) on an item that names an event or a block goes there
(the timeline cursor to the event, the block selected where it is shown).
"""

from __future__ import annotations

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.message import Message
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option

from oomdoctor.analysis.results import Analysis
from oomdoctor.tui.content import EvidencePlace, Section, evidence_places_of, overview_sections
from oomdoctor.tui.guard import GuardedPane, guarded
from oomdoctor.tui.safe import lines, plain

EVIDENCE_TITLE = "Evidence"


class OverviewPane(GuardedPane, VerticalScroll, can_focus=True):
    """One block of text per section, verdict first; scrolls with the arrow keys."""

    TAB_TITLE = "Overview"

    def __init__(self, analysis: Analysis, source: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.analysis = analysis
        self.source = source
        self.sections: list[Section] = []
        self.places: list[EvidencePlace] = []

    def build(self) -> ComposeResult:
        self.sections = overview_sections(self.analysis, self.source)
        self.places = evidence_places_of(self.analysis)
        for number, section in enumerate(self.sections):
            body = Text()
            body.append_text(plain(section.title, style="bold reverse" if number == 0 else "bold"))
            if section.title == EVIDENCE_TITLE and any(place.goes_somewhere for place in self.places):
                body.append_text(plain("  (tab, then Enter on an item: go to its event or block)", style="dim"))
                yield Static(body, classes="overview-title")
                options = [
                    Option(plain(place.line, style="" if place.goes_somewhere else "dim"), id=str(position))
                    for position, place in enumerate(self.places)
                ]
                yield OptionList(*options, id="evidence-list", classes="overview-section")
                continue
            body.append("\n")
            body.append_text(lines(section.lines))
            yield Static(body, classes="overview-section verdict" if number == 0 else "overview-section")

    class GoTo(Message):
        """Show where a piece of evidence was read (the Browser moves the tabs there)."""

        def __init__(self, event_index: int | None, address: int | None) -> None:
            super().__init__()
            self.event_index = event_index
            self.address = address

    @on(OptionList.OptionSelected, "#evidence-list")
    @guarded
    def _selected(self, message: OptionList.OptionSelected) -> None:
        place = self.places[int(message.option.id or 0)]
        if place.goes_somewhere:
            self.post_message(self.GoTo(place.event_index, place.address))
