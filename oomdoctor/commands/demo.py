"""Explain an example OOM dump shipped with oomdoctor: the quickest way to see what it does.

    oomdoctor demo
    oomdoctor demo --format json

The example is a real PyTorch training script (an MLP with Adam) rehearsed on a simulated 240 MiB
GPU: it runs out of memory inside the first optimizer.step(), while Adam creates its state. The
report is the same one `oomdoctor report` prints for your own dumps.
"""

from __future__ import annotations

import argparse

from oomdoctor.commands import report


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--format", choices=("text", "json"), default="text", help="output format (default: text)")


def run(args: argparse.Namespace) -> int:
    from oomdoctor.examples import EXAMPLE_DUMP

    return report.run(argparse.Namespace(file=str(EXAMPLE_DUMP), format=args.format, device=None, max_bytes=None))
