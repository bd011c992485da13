"""Which frames of an allocation stack to show: the user's code first, the machinery hidden.

A stack recorded with `stacks="all"` holds a few hundred frames: the unwinder and the caching
allocator, torch's C++ operators and autograd, CPython's eval loop between every two Python
frames, torch's `Module.__call__`, a framework's trainer. The user's own line can be the 50th
frame, or missing from the first 40. Like torch's `_memory_viz` (its frame filter) and memray
(its "uninteresting" frames), the stack shown by default starts at the user's line
(`analysis.attribution.source_line`, the line the block is labelled with), followed by the
user's frames that called it; what is left out is counted, and `all_frames` shows it all.

Without a frame of the user's (a library's own entry point, a backward on autograd's thread)
the stack falls back to the model library's frames, then to every Python frame, then to the C++
frames past the unwinder and the interpreter: it is never empty when the stack is not.
Strings are the file's own, as they are: the views make them printable.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from oomdoctor.analysis.frame_kinds import (
    INTERPRETER,
    LIBRARY,
    NATIVE,
    PYTHON_KINDS,
    STDLIB,
    TORCH,
    UNWINDER,
    USER,
    frame_kind,
    lead_frame_index,
)
from oomdoctor.model import Frame, Stack

# What a hidden frame is called in a note ("12 torch, library and C++ frames hidden").
_KIND_WORDS = {
    TORCH: "torch",
    LIBRARY: "library",
    STDLIB: "library",
    NATIVE: "C++",
    INTERPRETER: "C++",
    UNWINDER: "C++",
    USER: "other",
}
_WORD_ORDER = ("torch", "library", "C++", "other")
# What the frames shown are, when they are not the user's (for the note).
BASIS_USER = "user"
BASIS_LIBRARY = "library"
BASIS_PYTHON = "python"
BASIS_NATIVE = "native"
BASIS_ALL = "all"
BASIS_WORDS = {
    BASIS_USER: "your code's frames",
    BASIS_LIBRARY: "the model library's frames",
    BASIS_PYTHON: "the Python frames",
    BASIS_NATIVE: "the C++ frames",
    BASIS_ALL: "every frame",
}


@dataclass(frozen=True)
class ShownStack:
    """The frames to show, innermost first, and what was left out of the stack."""

    frames: tuple[Frame, ...]
    hidden: int  # frames of the stack not in `frames`
    hidden_kinds: tuple[str, ...]  # their frame kinds (frame_kinds), most frequent first
    basis: str  # BASIS_*: whose frames `frames` are
    total: int  # frames in the stack

    def hidden_words(self) -> str:
        """'12 torch, library and C++ frames' (empty when nothing is hidden)."""
        if not self.hidden:
            return ""
        words = {_KIND_WORDS[kind] for kind in self.hidden_kinds}
        named = [word for word in _WORD_ORDER if word in words]
        listed = ", ".join(named[:-1]) + (" and " if len(named) > 1 else "") + named[-1]
        return f"{self.hidden} {listed} frame{'' if self.hidden == 1 else 's'}"


def without_user_code(shown: ShownStack) -> str:
    """'no frame of your code: the C++ frames shown' when the frames shown are not the user's."""
    if shown.basis in (BASIS_USER, BASIS_ALL) or not shown.frames:
        return ""
    return f"no frame of your code: {BASIS_WORDS[shown.basis]} shown"


def shown_frames(stack: Stack, *, all_frames: bool = False) -> ShownStack:
    """The frames of `stack` to show: by default from the user's line outwards, the user's only
    (see the module docstring); with `all_frames`, every frame, innermost first."""
    if all_frames or not stack:
        return ShownStack(tuple(stack), 0, (), BASIS_ALL, len(stack))
    kinds = [frame_kind(frame) for frame in stack]
    lead = lead_frame_index(stack)
    keep: list[int]
    if lead is not None:
        lead_kind = kinds[lead]
        if lead_kind == USER:
            wanted, basis = {USER}, BASIS_USER
        elif lead_kind == LIBRARY:  # a notebook's model library, or a stack with no user frame
            wanted = {USER, LIBRARY}
            basis = BASIS_USER if USER in kinds[lead:] else BASIS_LIBRARY
        else:
            wanted, basis = set(PYTHON_KINDS), BASIS_PYTHON
        keep = [lead, *(position for position in range(lead + 1, len(stack)) if kinds[position] in wanted)]
    else:
        keep = [position for position, kind in enumerate(kinds) if kind == NATIVE]
        basis = BASIS_NATIVE
    if not keep:  # only the unwinder and the interpreter, or generated code: all of it, then
        keep, basis = list(range(len(stack))), BASIS_ALL
    kept = set(keep)
    hidden = Counter(kind for position, kind in enumerate(kinds) if position not in kept)
    return ShownStack(
        tuple(stack[position] for position in keep),
        len(stack) - len(keep),
        tuple(kind for kind, _ in hidden.most_common()),
        basis,
        len(stack),
    )


def user_frames(stack: Stack) -> list[Frame]:
    """The frames of the user's own code among those shown by default."""
    return [frame for frame in shown_frames(stack).frames if frame_kind(frame) == USER]
