"""Short labels that keep the part that tells two apart: `file:line`, a name's tail.

Real paths are long and alike (`/teamspace/studios/this_studio/project/src/models/dit.py`), so
a label cut at its end shows only the prefix every label shares. Here the directory every user
file of a dump lies under is stripped (computed once per analysis, from the frames shown), an
installed package's file is shown from its package (`torch/nn/modules/module.py`), and what is
still too long loses characters from its middle (`…`): a path keeps its file name and line, a
registry name (`model.body.2.weight.exp_avg_sq`) its tail.

Plain strings; every one from the file is made printable before it is cut.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from oomdoctor.analysis.frame_kinds import PYTHON_KINDS, USER, frame_kind
from oomdoctor.model import Frame, Stack, slashed
from oomdoctor.safetext import printable
from oomdoctor.views.frames import shown_frames

ELLIPSIS = "…"


def is_python_frame(frame: Frame) -> bool:
    return frame_kind(frame) in PYTHON_KINDS


# An installed package's or the standard library's file, shown from the package (or module) on.
_INSTALLED = (re.compile(r"/(?:site|dist)-packages/"), re.compile(r"/lib/python\d+(?:\.\d+)?/"))


def elide_middle(text: str, width: int, tail_share: float = 0.5) -> str:
    """`text` cut to `width` characters by replacing its middle with `…`; `tail_share` of what is
    kept comes from the end."""
    if width <= 0 or len(text) <= width:
        return text
    room = width - 1
    tail = min(room, max(1, round(room * tail_share))) if room else 0
    return text[: room - tail] + ELLIPSIS + text[len(text) - tail :]


def shorten_name(name: str, width: int) -> str:
    """A registry or module name cut from its middle, keeping more of its distinguishing tail."""
    return elide_middle(printable(name), width, tail_share=2 / 3)


def common_directory(paths: Iterable[str]) -> str:
    """The directory all of `paths` lie under, with its trailing `/` ("" when they share none, or
    only the root)."""
    common: list[str] | None = None
    for path in paths:
        parts = slashed(path).split("/")[:-1]
        if common is None:
            common = parts
        else:
            same = 0
            for mine, theirs in zip(common, parts):
                if mine != theirs:
                    break
                same += 1
            common = common[:same]
        if not common:
            return ""
    if not common or not "".join(common):
        return ""
    return "/".join(common) + "/"


@dataclass(frozen=True)
class PathStyle:
    """How file names are shown: `prefix` (a directory, ending in `/`) stripped from the user's."""

    prefix: str = ""

    @classmethod
    def of_stacks(cls, stacks: Iterable[Stack]) -> PathStyle:
        """The style whose prefix is the directory shared by every user file the stacks show."""
        seen: set[int] = set()
        files: set[str] = set()
        for stack in stacks:
            if id(stack) in seen:  # blocks of one call site share their stack
                continue
            seen.add(id(stack))
            files.update(f.filename for f in shown_frames(stack).frames if frame_kind(f) == USER)
        return cls(common_directory(files) if files else "")

    def path(self, filename: str) -> str:
        """`filename` without the shared prefix, or from its package on; printable."""
        forward = slashed(filename)
        if self.prefix and forward.startswith(self.prefix) and len(forward) > len(self.prefix):
            return printable(forward[len(self.prefix) :])
        for installed in _INSTALLED:
            starts = [match.end() for match in installed.finditer(forward)]
            if starts and starts[-1] < len(forward):
                return printable(forward[starts[-1] :])
        return printable(filename)

    def frame(self, frame: Frame, width: int | None = None) -> str:
        """`path:line in function`, cut to `width` (see `frame_label`)."""
        return frame_label(self.path(frame.filename), frame.line, printable(frame.name), width)


def frame_label(path: str, line: int, name: str, width: int | None = None) -> str:
    """`path:line in name` in at most `width` characters: the directory loses its middle first,
    then the function name; the file name and line stay whole, even past `width`."""
    directory, slash, file = path.rpartition("/")
    end = f"{file}:{printable(line)}"
    full = f"{path}:{printable(line)} in {name}"
    if width is None or len(full) <= width:
        return full
    function = f" in {name}"
    room = width - len(end) - len(function) - len(slash)
    if directory and room >= 1:
        return f"{_elide_directory(directory, room)}/{end}{function}"
    lead = f"{ELLIPSIS}/" if directory else ""
    room = width - len(lead) - len(end) - len(" in ")
    if room >= 3:
        return f"{lead}{end} in {elide_middle(name, room)}"
    return f"{lead}{end}"


def _elide_directory(directory: str, width: int) -> str:
    """`directory` in `width` characters, whole folders left out of its middle: as many of the
    folders nearest the file as fit, with the first one when it fits too (`models/…/nets`)."""
    parts = directory.split("/")
    for tail in range(len(parts) - 1, -1, -1):
        for head in (1, 0):
            if head + tail >= len(parts):
                continue
            text = "/".join([*parts[:head], ELLIPSIS, *parts[len(parts) - tail :]])
            if len(text) <= width:
                return text
    return elide_middle(directory, width)


def frame_text(frame: Frame, paths: PathStyle, width: int | None = None) -> str:
    """One frame as a line of a stack: `path:line in function` for Python, `function (file)` for
    C++ (whose line torch records as 0); printable."""
    if is_python_frame(frame):
        return paths.frame(frame, width)
    filename = printable(frame.filename)
    where = "" if filename in ("", "??") else f" ({filename}{f':{frame.line}' if frame.line else ''})"
    return printable(frame.name) + where
