"""The CLI's verbs, one module each; helpers here are what several verbs share: the arguments
they have in common (FILE, --format, --redact, --device, --max-bytes, --fail-if, --width), reading
--max-bytes back, checking --fail-if, the width text is wrapped to, a long read's progress on a
terminal, and writing a report out whole. Loading, analysing and rendering is oomdoctor.pipeline's.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import time
import unicodedata
from collections.abc import Callable, Iterator

from oomdoctor.errors import EXIT_FINDINGS, EXIT_OK, OomdoctorError

MAX_BYTES_HELP = "refuse files larger than this (e.g. 2GiB)"


def add_file_argument(parser: argparse.ArgumentParser, help: str, *, optional: bool = False) -> None:
    """FILE, the input a verb reads (`args.file`); `optional`: it may be left out."""
    parser.add_argument("file", metavar="FILE", nargs="?" if optional else None, help=help)


def add_format_argument(
    parser: argparse.ArgumentParser,
    choices: tuple[str, ...] = ("text", "json"),
    help: str = "output format (default: text)",
) -> None:
    """--format, one of `choices`, the first being the default."""
    parser.add_argument("--format", choices=choices, default=choices[0], help=help)


def add_redact_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--redact", action="store_true", help="leave out host and user names, path prefixes and the pid"
    )


def add_device_argument(parser: argparse.ArgumentParser, help: str) -> None:
    """--device N (None: the device that ran out of memory; oomdoctor.pipeline refuses one not there)."""
    parser.add_argument("--device", type=int, default=None, help=help)


def add_max_bytes_argument(
    parser: argparse.ArgumentParser, help: str = MAX_BYTES_HELP, *, parse_early: bool = False
) -> None:
    """--max-bytes SIZE, read back with `max_bytes_argument`. With `parse_early` the size is parsed
    with the other arguments (a bad one is a usage error) and shown as SIZE in the usage line."""
    if parse_early:
        parser.add_argument("--max-bytes", type=size_type, default=None, metavar="SIZE", help=help)
    else:
        parser.add_argument("--max-bytes", default=None, help=help)


def size_type(text: str) -> int:
    """An argparse type: '2GiB' -> bytes (oomdoctor.load.parse_size)."""
    from oomdoctor.load import parse_size

    try:
        return parse_size(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def max_bytes_argument(args: argparse.Namespace) -> int | None:
    """The --max-bytes a verb was given, in bytes (None when not given)."""
    if args.max_bytes is None or type(args.max_bytes) is int:  # not given, or parsed early
        return args.max_bytes
    from oomdoctor.load import parse_size

    try:
        return parse_size(args.max_bytes)
    except (ValueError, TypeError) as error:
        raise OomdoctorError(f"--max-bytes: {error}") from None


WIDTH_HELP = (
    "wrap text to N columns (default: COLUMNS if set, else the terminal's width on a terminal, "
    "else no wrapping; 0: never wrap)"
)


def add_width_argument(parser: argparse.ArgumentParser, help: str = WIDTH_HELP) -> None:
    """--width N, the width text output is wrapped to (read with `text_width`)."""
    parser.add_argument("--width", metavar="N", default=None, help=help)


def text_width(args: argparse.Namespace) -> int | None:
    """The columns text output wraps to, None for whole lines: --width N (0: None); else the
    COLUMNS environment variable, as shutil.get_terminal_size reads it; else, when standard output
    is a terminal, its width; else None, so that a pipe, a file or grep sees whole lines."""
    given = getattr(args, "width", None)
    if given is not None:
        try:
            width = int(given)
        except (TypeError, ValueError):
            raise OomdoctorError(f"--width: not a number of columns: {given!r}") from None
        if width < 0:
            raise OomdoctorError(f"--width: not a number of columns: {given!r}")
        return width or None
    try:
        columns = int(os.environ.get("COLUMNS", ""))
    except ValueError:
        columns = 0
    if columns > 0:
        return columns
    try:
        if sys.stdout.isatty():
            return shutil.get_terminal_size().columns
    except (AttributeError, ValueError, OSError):
        pass
    return None


def wrapped(data: bytes, args: argparse.Namespace) -> bytes:
    """A text report (`data`) wrapped to `text_width(args)` (oomdoctor.views.wrap)."""
    width = text_width(args)
    if width is None:
        return data
    from oomdoctor.views.wrap import wrap_text

    return wrap_text(data.decode(), width).encode()


class ReadProgress:
    """How far the work on one file (or folder) has got, on one line of standard error that is
    rewritten in place and blanked when the work is done: `oomdoctor: reading NAME  42%`, then
    (with `then`, say "analysing") `oomdoctor: analysing NAME`. Called with the fraction of the
    load done (`oomdoctor.load.load`'s `progress`: 1.0 once the model is built), or of a folder's
    or two files' reading; `stage` names a later stage of the work. NAME is the file's (folder's)
    name, or with `other` both names: `a.pickle and b.pickle`. Nothing is drawn in the first
    DELAY_SECONDS, so that a file read at once leaves no trace, nor more often than every
    INTERVAL_SECONDS. Within a stage the percentage never goes back (a file read again, after its
    worker died or failed, starts over)."""

    DELAY_SECONDS = 0.5
    INTERVAL_SECONDS = 0.1

    def __init__(
        self,
        path: str,
        stream,
        *,
        then: str | None = "analysing",
        other: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._name = _shown_name(path) if other is None else f"{_shown_name(path)} and {_shown_name(other)}"
        self._verb = "reading"
        self._then = then
        self._stream = stream
        self._clock = clock
        self._start = clock()
        self._next = self._start + self.DELAY_SECONDS
        self._drawn = 0  # the columns the line on screen takes
        self._last = ""
        self._most = 0.0  # the most of this stage's fractions

    def __call__(self, fraction: float) -> None:
        now = self._clock()
        self._most = fraction = max(fraction, self._most)
        done = fraction >= 1.0
        # `_next` is never before the delay's end, and a line is drawn only after it
        if now < self._next and not (done and self._drawn):
            return
        self._next = now + self.INTERVAL_SECONDS
        if done and self._then is None:
            self.clear()
            return
        if done:
            line = f"oomdoctor: {self._then} {self._name}"
        else:
            line = f"oomdoctor: {self._verb} {self._name} {int(fraction * 100):3d}%"
        if line != self._last:
            self._draw(line)

    def stage(self, verb: str, *, then: str | None = None) -> None:
        """A new stage of the work: `oomdoctor: VERB NAME` now (once DELAY_SECONDS have passed),
        and VERB for the fractions it is called with from here; at 1.0 `then`, or the line blanked."""
        self._verb, self._then, self._most = verb, then, 0.0
        now = self._clock()
        if now < self._start + self.DELAY_SECONDS:
            return
        self._next = now + self.INTERVAL_SECONDS
        self._draw(f"oomdoctor: {verb} {self._name}")

    def _draw(self, line: str) -> None:
        line = _clip_cells(line, _columns(self._stream) - 1)
        cells = _cells(line)
        self._write("\r" + line + " " * max(self._drawn - cells, 0) + "\r")
        self._drawn = cells
        self._last = line

    def clear(self) -> None:
        """Blank the line, if anything was drawn, and leave the cursor at its start."""
        if self._drawn:
            self._write("\r" + " " * self._drawn + "\r")
            self._drawn = 0
            self._last = ""

    def _write(self, text: str) -> None:
        try:
            self._stream.write(text)
            self._stream.flush()
        except (OSError, ValueError):  # a closed or broken terminal: no progress, the work goes on
            pass


def _shown_name(path: str) -> str:
    """A file's or folder's name on the progress line: its last part, as data (`printable`), cut."""
    from oomdoctor.safetext import printable

    return printable(os.path.basename(os.path.normpath(os.fsdecode(path))) or os.fsdecode(path), 60)


@contextlib.contextmanager
def read_progress(
    path: str, *, then: str | None = "analysing", other: str | None = None
) -> Iterator[ReadProgress | None]:
    """A `ReadProgress` for `path` (and `other`) on standard error while it is a terminal (else
    None), blanked when the block ends, before anything else is written there or to standard
    output."""
    stream = sys.stderr
    try:
        terminal = stream is not None and stream.isatty() and os.environ.get("TERM") != "dumb"
    except (AttributeError, ValueError, OSError):
        terminal = False
    if not terminal:
        yield None
        return
    progress = ReadProgress(path, stream, then=then, other=other)
    try:
        yield progress
    finally:
        progress.clear()


def _columns(stream) -> int:
    try:
        return os.get_terminal_size(stream.fileno()).columns or 80
    except (AttributeError, ValueError, OSError):
        return 80


def _cells(text: str) -> int:
    """The terminal columns `text` takes (wide East Asian characters take two)."""
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def _clip_cells(text: str, cells: int) -> str:
    while text and _cells(text) > max(cells, 0):
        text = text[:-1]
    return text


def write_output(data: bytes) -> None:
    """All of `data` to standard output: one write() call sends at most about 2 GiB on Linux, and
    a report cut short there must not look complete."""
    out = sys.stdout.buffer
    sys.stdout.flush()
    view = memoryview(data)
    step = 1 << 30
    for start in range(0, len(view), step):
        chunk = view[start : start + step]
        while chunk:
            written = out.write(chunk)
            if written is None:  # a non-blocking stream that took nothing yet
                continue
            chunk = chunk[written:]
    out.flush()


FAIL_IF_HELP = (
    "exit 1 when this condition on named figures holds, e.g. 'peak > 20GiB' or "
    "'activations_growth > 50%%' (docs/gate.md lists the figures); a bad expression exits 2"
)


def add_fail_if_argument(parser: argparse.ArgumentParser) -> None:
    """--fail-if EXPR (oomdoctor.analysis.gate), read with `check_gate`."""
    parser.add_argument("--fail-if", metavar="EXPR", default=None, help=FAIL_IF_HELP)


def check_gate(condition, figures, *, who: str | None = None) -> int:
    """EXIT_FINDINGS, with one line on stderr per bound crossed (`who`: whose figures, a rank),
    when `condition` holds over `figures`; else EXIT_OK."""
    from oomdoctor.analysis.gate import evaluate
    from oomdoctor.safetext import printable
    from oomdoctor.views.gate import crossing

    crossed = evaluate(condition, figures)
    for item in crossed:
        print(f"oomdoctor: {printable(crossing(item, who))}", file=sys.stderr)
    return EXIT_FINDINGS if crossed else EXIT_OK
