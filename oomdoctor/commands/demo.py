"""Open an example OOM dump shipped with oomdoctor: the quickest way to see what it does.

    oomdoctor demo
    oomdoctor demo --text
    oomdoctor demo --format json

The example is a real PyTorch training script (an MLP with Adam) rehearsed on a simulated 240 MiB
GPU: it runs out of memory inside the first optimizer.step(), while Adam creates its state. In a
terminal it opens in the same app `oomdoctor open` shows for your own dumps; otherwise (or with
--text) it prints the report `oomdoctor report` would.
"""

from __future__ import annotations

import argparse
import sys

from oomdoctor.commands import add_format_argument, add_width_argument, report


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_format_argument(parser, help="report format when printing (default: text)")
    parser.add_argument("--text", action="store_true", help="print the text report even in a terminal")
    add_width_argument(parser)


def opens_app(args: argparse.Namespace) -> bool:
    """The app opens only for the default text output, and only in a terminal."""
    return args.format == "text" and not args.text and sys.stdin.isatty() and sys.stdout.isatty()


def run(args: argparse.Namespace) -> int:
    from oomdoctor.examples import EXAMPLE_DUMP

    if opens_app(args):
        try:
            from oomdoctor.tui.app import make_app
        except ImportError:
            pass  # no Textual: the report below says the same
        else:
            from oomdoctor.pipeline import load_and_analyse

            snapshot, analysis = load_and_analyse(EXAMPLE_DUMP)
            make_app(analysis, snapshot, source=EXAMPLE_DUMP.name).run()
            return 0
    return report.run(
        argparse.Namespace(
            file=str(EXAMPLE_DUMP), format=args.format, device=None, max_bytes=None, width=getattr(args, "width", None)
        )
    )
