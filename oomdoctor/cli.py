"""The `oomdoctor` command line: parse arguments, hand to one verb, turn errors into exit codes.

Each verb lives in `oomdoctor/commands/<verb>.py` and exposes `add_arguments(parser)` and
`run(args) -> int`; its module docstring is its `--help`. VERBS lists them, imported explicitly: a
verb module that is missing or broken fails the import of the CLI, never silently drops the verb.
`main(argv)` is what tests call.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections.abc import Sequence
from types import ModuleType

from oomdoctor import __version__
from oomdoctor.commands import demo, diff, explain, info, redact, rehearse, report
from oomdoctor.commands import mcp as mcp_verb
from oomdoctor.commands import open as open_verb
from oomdoctor.commands import run as run_verb
from oomdoctor.errors import EXIT_BAD_INPUT, OomdoctorError
from oomdoctor.model import slashed
from oomdoctor.safetext import printable
from oomdoctor.views.wrap import reflow

DEBUG_ENV = "OOMDOCTOR_DEBUG"  # "1": an unforeseen exception shows its traceback (for bug reports)
# An error is one line: what comes from the file in it (a global's name, keys) is escaped and cut.
ERROR_LIMIT = 1000

# `--help` is as wide as the terminal, up to this (prose wider than 80 columns reads badly)
HELP_WIDTH = 80

# (name, module) in the order `oomdoctor --help` lists them
VERBS: tuple[tuple[str, ModuleType], ...] = (
    ("open", open_verb),
    ("report", report),
    ("diff", diff),
    ("info", info),
    ("explain", explain),
    ("redact", redact),
    ("demo", demo),
    ("rehearse", rehearse),
    ("run", run_verb),
    ("mcp", mcp_verb),
)


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """`--help` within the terminal's width (COLUMNS), at most HELP_WIDTH: the description (a verb's
    docstring) has its paragraphs rewrapped to it, its indented examples and tables kept as lines
    (oomdoctor.views.wrap.reflow); argparse wraps the rest."""

    def __init__(self, prog: str, **kwargs) -> None:
        columns = shutil.get_terminal_size().columns
        kwargs["width"] = max(min(columns, HELP_WIDTH) - 2, 20)
        super().__init__(prog, **kwargs)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return "".join(indent + line for line in reflow(text, width - len(indent)).splitlines(keepends=True))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="oomdoctor",
        description="Post-mortem debugger for PyTorch CUDA out-of-memory failures.",
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"oomdoctor {__version__}")
    subparsers = parser.add_subparsers(dest="verb", metavar="COMMAND")
    for verb, module in VERBS:
        doc = (module.__doc__ or "").strip()
        summary = doc.splitlines()[0] if doc else verb
        sub = subparsers.add_parser(
            verb,
            help=summary,
            description=doc,
            formatter_class=HelpFormatter,
        )
        module.add_arguments(sub)
        sub.set_defaults(_run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    if getattr(args, "_run", None) is None:
        parser.print_help()
        return EXIT_BAD_INPUT
    try:
        return int(args._run(args) or 0)
    except OomdoctorError as error:
        print(f"oomdoctor: {printable(str(error), ERROR_LIMIT)}", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
    except (Exception, RecursionError, MemoryError) as error:  # noqa: BLE001 - never a traceback
        if os.environ.get(DEBUG_ENV) == "1":
            raise
        print(f"oomdoctor: {printable(internal_error_line(args, error), ERROR_LIMIT)}", file=sys.stderr)
        return EXIT_BAD_INPUT


def internal_error_line(args: argparse.Namespace, error: BaseException) -> str:
    """One line for an error oomdoctor did not foresee: what failed, on which file, and a request."""
    verb = getattr(args, "verb", None) or "oomdoctor"
    source = getattr(args, "file", None)
    on = f" on {source}" if source else ""
    where = ""
    trace = error.__traceback__
    while trace is not None:  # the innermost frame of oomdoctor's own code, to put in a bug report
        filename = slashed(trace.tb_frame.f_code.co_filename)
        if "/oomdoctor/" in filename:
            where = f" at {filename.rsplit('/oomdoctor/', 1)[1]}:{trace.tb_lineno}"
        trace = trace.tb_next
    reason = " ".join(str(error).split())[:300]
    return (
        f"{verb}{on}: internal error ({type(error).__name__}{': ' + reason if reason else ''}{where}); "
        "the file may be damaged or hostile - please report this, with the file if you can share it"
    )


def entry() -> None:
    """The console script: the command runs in a watched child process (oomdoctor.supervise)."""
    from oomdoctor.supervise import run

    sys.exit(run(main))
