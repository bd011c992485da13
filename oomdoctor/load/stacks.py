"""Raw frame lists to shared `Frame` tuples, converted once and never copied.

torch writes one dict per distinct frame and reuses it in every stack that contains it; a stack is
a list of such dicts. `StackTable` keeps that sharing: each raw frame dict becomes one `Frame`
(found again by the dict's identity, or by value for files such as JSON where nothing is shared),
and each distinct sequence of frames becomes one tuple, whichever event or block asks for it.
Conversion is tolerant: a malformed frame becomes `Frame("??", 0, "??")` instead of an error,
because it happens lazily, long after the file was accepted. A file or function name longer than
`FRAME_TEXT_LIMIT` is shortened in its middle, saying how many characters were left out: no path a
system can open is that long (Linux's PATH_MAX is 4096) nor any C++ name torch records, while every
rule that reads a frame reads it wherever the frame recurs, so a hostile name of megabytes shared
by thousands of frames would cost its length times theirs.
"""

from __future__ import annotations

from typing import Any

from oomdoctor.model import KEYED_PER_REFERENCE_FRAMES, NO_STACK, Frame, Stack

UNKNOWN_FRAME = Frame("??", 0, "??")
FRAME_TEXT_LIMIT = 16384  # characters of a frame's file or function name


def shortened(text: str, limit: int = FRAME_TEXT_LIMIT) -> str:
    """`text`, or its start and end around a note of how many characters were left out (its end
    kept: a file name's suffix and base name are what the rules and a reader look at)."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}… ({len(text) - 2 * half:,} characters left out) …{text[-half:]}"


class StackTable:
    __slots__ = (
        "_frame_by_id",
        "_raw_frames",
        "_frame_by_value",
        "_stack_by_list",
        "_stack_by_ids",
        "_stack_by_frames",
    )

    def __init__(self) -> None:
        self._frame_by_id: dict[int, Frame] = {}  # id(raw dict) -> its Frame
        self._raw_frames: list[Any] = []  # the raw dicts converted, kept so that their ids stay theirs
        self._frame_by_value: dict[tuple[Any, ...], Frame] = {}
        # id(raw list) -> (the list, kept so that its id stays its own; its stack), for lists longer
        # than KEYED_PER_REFERENCE_FRAMES: one a pickle shares among many blocks or events is read
        # once, not once each (`forget_lists`)
        self._stack_by_list: dict[int, tuple[Any, Stack]] = {}
        self._stack_by_ids: dict[tuple[int, ...], tuple[list[Any], Stack]] = {}
        # the ids of a stack's Frames -> the stack: one Frame per distinct value here, so equal ids are
        # equal frames (and a Frame's own hash, made in Python, is never needed)
        self._stack_by_frames: dict[tuple[int, ...], Stack] = {}

    def __reduce__(self) -> tuple[Any, ...]:
        # identities mean nothing in another process: start empty there
        return (StackTable, ())

    def frame_of(self, raw: Any) -> Frame:
        known = self._frame_by_id.get(id(raw))
        if known is not None:
            return known
        frame = self._convert_frame(raw)
        self._frame_by_id[id(raw)] = frame
        self._raw_frames.append(raw)
        return frame

    def _convert_frame(self, raw: Any) -> Frame:
        if type(raw) is not dict:
            return UNKNOWN_FRAME
        filename = raw.get("filename", "??")
        line = raw.get("line", 0)
        name = raw.get("name", "??")
        if type(filename) is not str:
            filename = "??"
        if type(line) is not int or not -(2**63) <= line < 2**63:
            line = 0
        if type(name) is not str:
            name = "??"
        if len(filename) > FRAME_TEXT_LIMIT or len(name) > FRAME_TEXT_LIMIT:
            filename, name = shortened(filename), shortened(name)
        key = (filename, line, name)
        frame = self._frame_by_value.get(key)
        if frame is None:
            frame = self._frame_by_value[key] = Frame(filename, line, name)
        return frame

    def forget_lists(self) -> None:
        """Let go of the raw lists met so far (the blocks', once they are built: nothing else holds
        them), keeping their stacks."""
        self._stack_by_list.clear()

    def stack_of(self, raw: Any) -> Stack:
        """The shared Stack for a raw list of frame dicts (innermost first); NO_STACK when empty."""
        if not raw or type(raw) not in (list, tuple):
            return NO_STACK
        long = len(raw) > KEYED_PER_REFERENCE_FRAMES
        if long:
            known = self._stack_by_list.get(id(raw))
            if known is not None:
                return known[1]
        ids = tuple(map(id, raw))
        known = self._stack_by_ids.get(ids)
        if known is not None:
            if long:
                self._stack_by_list[id(raw)] = (raw, known[1])
            return known[1]
        # the frames met before are found in C, and only new ones converted one by one
        found = tuple(map(self._frame_by_id.get, ids))
        if not all(found):  # (a Frame is always true)
            for frame, item in zip(found, raw):
                if frame is None:
                    self.frame_of(item)
            found = tuple(map(self._frame_by_id.get, ids))
        frames: Stack = found  # type: ignore[assignment]  # every one found now
        stack = self._stack_by_frames.setdefault(tuple(map(id, frames)), frames)
        self._stack_by_ids[ids] = (raw, stack)
        if long:
            self._stack_by_list[id(raw)] = (raw, stack)
        return stack
