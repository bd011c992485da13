"""Browse an OOM dump in the terminal: the verdict, a timeline of memory, segments, components, blocks.

    oomdoctor open oom-dumps/oom-rank0-host-123-20250101T000000Z.pickle
    oomdoctor open a.pickle --compare b.pickle

FILE is an oomdoctor dump or any torch memory snapshot (pickle, gzip, JSON, memory_viz HTML).
The file is read and analysed in the background behind a progress bar; then five tabs open:

  1 Overview      the verdict, its evidence, what to change, memory at the OOM;
                  Enter on an evidence item goes to its event or block
  2 Timeline      memory by component over the recorded events, steps (s0, s1, ...)
                  and phases (F forward, B backward, O optimizer step, Z zero_grad,
                  E evaluation, · between steps) under it; left/right move a cursor
                  (shift: ten times as far, [ and ]: one event, o: the OOM, p: the
                  peak) and show what was live after that event; e lists the events
                  around it instead (Enter moves the cursor to one)
  3 Segments      the segments at the cursor's event, a bar of each one's blocks;
                  a block's stack
  4 Components    parameters, gradients, optimizer state, ... down to module paths,
                  source lines and single blocks, at the cursor's event
  5 Allocations   every block live at the cursor's event; type to search names,
                  files and functions (Esc leaves the search)

Segments, Components and Allocations show the OOM until the timeline cursor moves;
away from it a block the analysis did not place is "not attributed", and t goes
back to the OOM.

--compare B shows FILE (A) against dump B instead: both timelines one above the
other, drawn to one scale so that their heights compare, the allocation sites
that appeared, went, grew or shrank at the peak, largest first, and the summary
that `oomdoctor diff A B` opens with.

Keys: 1-5 switch tabs, ? lists the keys of the tab, g goes to an event, f shows
all frames of a stack (or only yours), d another device (when the file has
several), ctrl+p the commands (go to the OOM or the peak, copy the Markdown
report), tab moves between widgets, q quits; the mouse works too. For a report to
paste or pipe, use `oomdoctor report FILE`. Exit status: 0 closed normally, 2
unreadable input (in either file, with --compare), or a file the app could not
analyse or show (one line on stderr says why, after the terminal is restored).
"""

from __future__ import annotations

import argparse
import os
import sys

from oomdoctor.commands import add_device_argument, add_file_argument, add_max_bytes_argument, max_bytes_argument
from oomdoctor.errors import LoadError, OomdoctorError
from oomdoctor.safetext import is_printable, printable


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_file_argument(parser, "the dump or snapshot to browse")
    parser.add_argument(
        "--compare",
        metavar="B",
        default=None,
        help="compare FILE with dump B: both timelines, the sites that changed",
    )
    add_device_argument(parser, "show this device instead of the failing one")
    add_max_bytes_argument(parser)


def check_readable(path: str, max_bytes: int | None) -> None:
    """The errors a file can be seen to have without reading it, raised before the app starts."""
    from oomdoctor.load.access import access_error
    from oomdoctor.load.containers import resolve_max_bytes, too_large_error

    try:
        with open(path, "rb") as handle:
            size_bytes = os.fstat(handle.fileno()).st_size
            regular = os.path.isfile(path)
    except OSError as error:
        folder_hint = (
            f"is a directory; oomdoctor open reads one dump file (for a folder of rank dumps: oomdoctor report {path})"
        )
        raise access_error(path, error, wrong_kind=folder_hint) from None
    if not regular:
        return
    if size_bytes == 0:
        raise LoadError(f"{path}: the file is empty")
    limit_bytes = resolve_max_bytes(max_bytes)
    if size_bytes > limit_bytes:
        raise too_large_error(path, f"the file ({size_bytes} bytes)", limit_bytes, raise_with="--max-bytes")


def loader_for(path: str, *, device: int | None, max_bytes: int | None):
    """The loader the app runs in its worker: read the file, then analyse the chosen device
    (oomdoctor.pipeline.load_and_analyse)."""
    from oomdoctor.pipeline import load_and_analyse

    def loader(report):
        return load_and_analyse(
            path,
            device=device,
            max_bytes=max_bytes,
            enter_stage=report,
            progress=lambda fraction: report(fraction=fraction),
        )

    return loader


def compare_loader_for(path_a: str, path_b: str, *, device: int | None, max_bytes: int | None):
    """The loader of `open A --compare B`: both files read and analysed, then compared as
    `oomdoctor diff A B` compares them (oomdoctor.pipeline.compare_files)."""
    from oomdoctor.pipeline import compare_files

    def loader(report):
        return compare_files(
            path_a,
            path_b,
            device=device,
            max_bytes=max_bytes,
            enter_stage=report,
            progress=lambda fraction: report(fraction=fraction),
        )

    return loader


def run(args: argparse.Namespace) -> int:
    max_bytes = max_bytes_argument(args)
    other = getattr(args, "compare", None)
    check_readable(args.file, max_bytes)
    if other is not None:
        check_readable(other, max_bytes)
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise OomdoctorError(f"oomdoctor open needs a terminal; for a text report use: oomdoctor report {args.file}")
    try:
        from oomdoctor.tui.app import make_loading_app
        from oomdoctor.tui.compare import make_compare_app
    except ImportError as error:
        raise OomdoctorError(
            f"the terminal app needs Textual ({error}); install it with: pip install textual"
        ) from None

    if other is not None:
        loader = compare_loader_for(args.file, other, device=args.device, max_bytes=max_bytes)
        app = make_compare_app(loader, source_a=args.file, source_b=other)
    else:
        app = make_loading_app(loader_for(args.file, device=args.device, max_bytes=max_bytes), source=args.file)
    try:
        app.run()
    except Exception as error:  # whatever got past the app's own handling: one line, never a traceback
        from oomdoctor.tui.guard import internal_error

        raise internal_error(args.file, "run the terminal app on it", error) from None
    if app.error is not None:
        raise _printable_error(app.error)
    return app.return_code or 0


def _printable_error(error: OomdoctorError) -> OomdoctorError:
    """`error`, or one with the same exit code whose text has its control characters escaped: a
    loader's message can quote the file (its name, a refused global's name)."""
    text = str(error)
    if is_printable(text):
        return error
    clean = OomdoctorError(printable(text))
    clean.exit_code = error.exit_code
    return clean
