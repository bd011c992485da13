"""Which torch versions wrote a message, from its wording (reference spec §3.5, and the corpus).

Each clue narrows a range of (major, minor) versions; the era is their intersection. The exception
type is the weakest clue (wrappers re-raise under other names) and is dropped when it contradicts
the wording.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from oomdoctor.messages.model import OomMessage

Version = tuple[int, int]
_OPEN: tuple[Version | None, Version | None] = (None, None)


def _wording_clues(message: OomMessage) -> list[tuple[str, Version | None, Version | None]]:
    clues: list[tuple[str, Version | None, Version | None]] = []

    def add(text: str, low: Version | None, high: Version | None) -> None:
        clues.append((text, low, high))

    wording, hint = message.wording, message.hint or ""
    if message.kind == "legacy-thc":
        add("THC's 'cuda runtime error (2)': before the caching allocator's own message", None, (0, 4))
    if wording.startswith("0.4.1-1.4"):
        add("'cached' in the parenthesis", (0, 4), (1, 4))
    if wording.startswith("1.5-2.0"):
        add("'reserved in total by PyTorch'", (1, 5), (2, 0))
    if wording.startswith("0.4.1-2.0") or wording.startswith("1.5-2.0"):
        add("the parenthesised form", None, (2, 0))
    if "parenthesised" in wording or wording.startswith(("0.4.1", "1.5")):
        if hint == "max_split_size_mb":
            add("the max_split_size_mb hint", (1, 10), None)
    if "sentences" in wording:
        add("the sentence form ('GPU d has a total capacity of')", (2, 1), None)
    if "capacty" in wording:
        add("the 'capacty' typo", (2, 1), (2, 1))
    if "sentences" in wording and hint == "max_split_size_mb":
        add("the max_split_size_mb hint in the sentence form", (2, 1), (2, 1))
    if "expandable_segments" in hint:
        if hint.startswith("PYTORCH_ALLOC_CONF"):
            add("the hint's PYTORCH_ALLOC_CONF", (2, 10), (2, 10))
        else:
            add("the expandable_segments hint", (2, 2), None)
        if "docs.pytorch.org" in hint:
            add("the docs.pytorch.org link", (2, 11), None)
        elif "pytorch.org/docs/stable" in hint and not hint.startswith("PYTORCH_ALLOC_CONF"):
            add("the pytorch.org/docs link", None, (2, 9))
    if message.private_pool_bytes is not None:
        add("the private-pools clause", (2, 4), None)
    if message.kind == "preemptive-rejection":
        add("the preemptive rejection", (2, 12), None)
    return clues


def _type_clues(message: OomMessage) -> list[tuple[str, Version | None, Version | None]]:
    exception_type = message.exception_type or ""
    if exception_type == "torch.OutOfMemoryError":
        return [("torch.OutOfMemoryError", (2, 4), None)]
    if exception_type.endswith("OutOfMemoryError"):
        return [("OutOfMemoryError", (1, 13), None)]
    return []


def _intersect(clues) -> tuple[Version | None, Version | None] | None:
    low, high = _OPEN
    for _, clue_low, clue_high in clues:
        if clue_low is not None and (low is None or clue_low > low):
            low = clue_low
        if clue_high is not None and (high is None or clue_high < high):
            high = clue_high
    if low is not None and high is not None and low > high:
        return None
    return low, high


def _format(low: Version | None, high: Version | None) -> str | None:
    def name(version: Version) -> str:
        return f"{version[0]}.{version[1]}"

    if low is None and high is None:
        return None
    if low == high:
        return name(low)
    if low is None:
        return f"{name(high)} or earlier"
    if high is None:
        return f"{name(low)} or later"
    return f"{name(low)}-{name(high)}"


def era_of(message: OomMessage) -> tuple[str | None, tuple[str, ...]]:
    """('2.2-2.9', clues) or (None, ()) when the wording says nothing about the version."""
    clues = _wording_clues(message) + _type_clues(message)
    bounds = _intersect(clues)
    if bounds is None:
        clues = _wording_clues(message)
        bounds = _intersect(clues) or _OPEN
    return _format(*bounds), tuple(text for text, _, _ in clues)
