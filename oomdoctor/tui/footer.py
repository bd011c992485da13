"""The footer: Textual's, rebuilt only when the keys it shows change.

Textual's Footer rebuilds itself (removes and mounts a widget per key, each restyled twice) every
time the screen's bindings are refreshed, and a tab switch refreshes them three times (the tab
shown, the focus moved, the focus's own refresh after it): ~50 ms of a switch at 160x50, for keys
that are the same on most tabs. This one rebuilds once per burst of refreshes, and not at all when
what it would show is what it shows.
"""

from __future__ import annotations

from collections.abc import Hashable

from textual.app import ComposeResult
from textual.screen import Screen
from textual.widgets import Footer as TextualFooter


class Footer(TextualFooter):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._shown: Hashable = None  # what the last compose showed (None: nothing yet)
        self._rebuild_pending = False

    def _keys(self) -> Hashable:
        """Everything Footer.compose reads: the shown bindings (with their enabled state, tooltip
        and key display), the command palette's, and the footer's own settings."""
        if not self._bindings_ready:
            return None
        app = self.app
        return (
            tuple(
                (binding, enabled, tooltip, app.get_key_display(binding))
                for (_, binding, enabled, tooltip) in self.screen.active_bindings.values()
                if binding.show or binding.key == app.COMMAND_PALETTE_BINDING
            ),
            self.show_command_palette,
            app.ENABLE_COMMAND_PALETTE,
            self.compact,
        )

    def compose(self) -> ComposeResult:
        self._shown = self._keys()  # every rebuild comes here, whoever asked for it
        yield from super().compose()

    def bindings_changed(self, screen: Screen) -> None:
        self._bindings_ready = True
        if not screen.app.app_focus:
            return
        if self.is_attached and screen is self.screen and not self._rebuild_pending:
            self._rebuild_pending = True
            self.call_after_refresh(self._rebuild)

    async def _rebuild(self) -> None:
        self._rebuild_pending = False
        if self.is_attached and self._keys() != self._shown:
            await self.recompose()
