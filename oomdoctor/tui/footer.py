"""The footer: Textual's, rebuilt only when the keys it shows change, and then only those keys.

Textual's Footer rebuilds itself (removes and mounts a widget per key, each restyled three times)
every time the screen's bindings are refreshed, after the screen is painted, and a tab switch
refreshes them three times (the tab shown, the focus moved, the focus's own refresh after it):
~50 ms of a switch at 160x50, for keys that are the same on most tabs, and a second layout of the
screen for the ones that are not. This one rebuilds once per burst of refreshes, before the screen
is next painted (one layout for the tab and its keys), not at all when what it would show is what
it shows, and otherwise removes and mounts only the keys that differ.
"""

from __future__ import annotations

from collections.abc import Hashable

from textual.app import ComposeResult
from textual.compose import compose
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import Footer as TextualFooter
from textual.widgets._footer import FooterKey


def _looks(key: FooterKey) -> Hashable:
    """All that a key was made with: two keys alike show the same and do the same. (Its `compact`
    sets the -compact class once it is mounted: the one is compared, not the other.)"""
    classes = frozenset(key.classes - {"-compact"})
    return (key.key, key.key_display, key.description, key.action, key._disabled, key.tooltip, classes, key.compact)


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
        for widget in super().compose():
            if isinstance(widget, FooterKey) and not widget.has_class("-command-palette"):
                # Bound to the footer's `compact`, but made compact: restyled once mounted to be
                # so, then again when the binding makes it not. Made as the footer is, it is not.
                widget.set_reactive(FooterKey.compact, self.compact)
            yield widget

    def bindings_changed(self, screen: Screen) -> None:
        self._bindings_ready = True
        if not screen.app.app_focus:
            return
        if self.is_attached and screen is self.screen and not self._rebuild_pending:
            self._rebuild_pending = True
            self.call_later(self._rebuild)

    async def _rebuild(self) -> None:
        self._rebuild_pending = False
        if not self.is_attached or self._pruning or self._keys() == self._shown:
            return
        shown = list(self.children)
        wanted = compose(self)
        if not all(isinstance(widget, FooterKey) for widget in (*shown, *wanted)):  # binding groups
            async with self.batch():
                await self.remove_children()
                await self.mount_all(wanted)
            return
        # the keys shown that are wanted again, in order, stay; the others go, the new ones come
        kept: dict[int, FooterKey] = {}  # position in `wanted` -> the shown key that stays for it
        start = 0
        for position, key in enumerate(wanted):
            looks = _looks(key)
            for index in range(start, len(shown)):
                if _looks(shown[index]) == looks:
                    kept[position] = shown[index]
                    start = index + 1
                    break
        staying = set(kept.values())
        async with self.batch():
            await self.remove_children([widget for widget in shown if widget not in staying])
            new: list[Widget] = []
            for position, key in enumerate(wanted):
                if position not in kept:
                    new.append(key)
                elif new:
                    await self.mount_all(new, before=kept[position])
                    new = []
            if new:
                await self.mount_all(new)
