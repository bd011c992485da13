"""The `oomdoctor` command line: parse arguments, hand to one verb, turn errors into exit codes.

Each verb lives in `oomdoctor/commands/<verb>.py` and exposes `add_arguments(parser)` and
`run(args) -> int`; its module docstring is its `--help`. `main(argv)` is what tests call.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Sequence

from oomdoctor import __version__
from oomdoctor.errors import EXIT_BAD_INPUT, OomdoctorError

VERBS = ("open", "report", "info", "explain", "diff", "redact", "demo", "rehearse")


def _available_verbs() -> list[tuple[str, object]]:
    found = []
    for verb in VERBS:
        try:
            module = importlib.import_module(f"oomdoctor.commands.{verb}")
        except ModuleNotFoundError as error:
            if error.name == f"oomdoctor.commands.{verb}":
                continue
            raise
        found.append((verb, module))
    return found


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="oomdoctor",
        description="Post-mortem debugger for PyTorch CUDA out-of-memory failures.",
    )
    parser.add_argument("--version", action="version", version=f"oomdoctor {__version__}")
    subparsers = parser.add_subparsers(dest="verb", metavar="COMMAND")
    for verb, module in _available_verbs():
        doc = (module.__doc__ or "").strip()
        summary = doc.splitlines()[0] if doc else verb
        sub = subparsers.add_parser(
            verb,
            help=summary,
            description=doc,
            formatter_class=argparse.RawDescriptionHelpFormatter,
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
        print(f"oomdoctor: {error}", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


def entry() -> None:
    sys.exit(main())
