"""Compare two dumps, two steps of one dump, or two ranks of a folder: what changed, and where.

    oomdoctor diff a.pickle b.pickle              # config A against config B
    oomdoctor diff dump.pickle --steps 0 1        # what step 1 adds to step 0
    oomdoctor diff oom-dumps/ --ranks 0 5         # why rank 5 and not rank 0
    oomdoctor diff a.pickle b.pickle --format md  # to paste into an issue
    oomdoctor diff a.pickle b.pickle --fail-if "peak_growth > 10%"  # a CI gate

A one-paragraph summary comes first: how much higher or lower B peaks than A, the component and the
allocation site that changed most, whether the verdict changed, and what the dumps record that may
explain it (an input tensor whose shape changed, per oomdoctor's registry; a command-line argument
that differs). Then, at each side's peak (for --steps, each step's peak) and at each side's target
(the OOM, else the moment the dump describes; for --steps, the step's OOM or its last event):
allocated, reserved, free cached and fragmented memory, every component that changed, and the
allocation sites (source line and module path, within a component) that appeared, went, grew or
shrank, largest change first. Each side's verdict is judged at its target.

On a terminal, reading that takes more than half a second says how far it has got (two files, or
a folder's files, each weighted by its size), on one line of stderr, blanked before the diff is
printed.

Steps are numbered as reports number them (the first step is 0). Ranks are the ones the dumps
record (else the file names state). The JSON (`--format json`) follows docs/schema/diff.schema.json.

--fail-if EXPR exits 1 when the condition holds (after printing the diff) and says on stderr which
figure crossed which bound; see docs/gate.md for the figures (peak, reserved, a component, their
_change in bytes and _growth in percent). Exit codes: 0 the diff was made (and no --fail-if
condition held), 1 a --fail-if condition held, 2 bad input or a bad expression.
"""

from __future__ import annotations

import argparse
import os

from oomdoctor.commands import (
    add_device_argument,
    add_fail_if_argument,
    add_format_argument,
    add_max_bytes_argument,
    add_redact_argument,
    add_width_argument,
    check_gate,
    max_bytes_argument,
    read_progress,
    wrapped,
    write_output,
)
from oomdoctor.errors import OomdoctorError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "file", metavar="A", help="a dump or snapshot (with --steps), or a folder of ranks (with --ranks)"
    )
    parser.add_argument("other", metavar="B", nargs="?", default=None, help="the dump or snapshot to compare A with")
    parser.add_argument("--steps", nargs=2, type=int, metavar=("I", "J"), help="compare step I with step J of A")
    parser.add_argument("--ranks", nargs=2, type=int, metavar=("R", "S"), help="compare rank R with rank S of folder A")
    add_format_argument(parser, ("text", "md", "json"))
    add_redact_argument(parser)
    add_device_argument(parser, "compare this device instead of the failing one (files and steps)")
    add_max_bytes_argument(parser)
    add_fail_if_argument(parser)
    add_width_argument(parser)


def run(args: argparse.Namespace) -> int:
    from oomdoctor import pipeline
    from oomdoctor.analysis.gate import DIFF_FIGURE_NAMES, diff_figures, parse

    condition = (
        parse(args.fail_if, DIFF_FIGURE_NAMES) if args.fail_if is not None else None
    )  # a bad one fails before loading
    max_bytes = max_bytes_argument(args)
    redact = getattr(args, "redact", False)
    if args.steps is not None and args.ranks is not None:
        raise OomdoctorError("diff: --steps and --ranks do not go together")
    if args.steps is not None or args.ranks is not None:
        if args.other is not None:
            raise OomdoctorError(
                f"diff: with {'--steps' if args.steps else '--ranks'}, give one {'file' if args.steps else 'folder'}, not two"
            )
    elif args.other is None:
        raise OomdoctorError("diff: give two files, or one file with --steps I J, or a folder with --ranks R S")
    if args.ranks is not None:
        if not os.path.isdir(args.file):
            raise OomdoctorError(f"{args.file}: --ranks compares the files of a folder; this is not one")
        if args.device is not None:
            raise OomdoctorError(
                f"{args.file}: --device applies to files; in a folder each rank is judged on its failing device"
            )
        with read_progress(args.file, then="comparing") as progress:
            result = pipeline.diff_ranks(args.file, *args.ranks, redact=redact, max_bytes=max_bytes, progress=progress)
    else:
        for path in (args.file, args.other):
            if path is not None and os.path.isdir(path):
                raise OomdoctorError(
                    f"{path}: a folder; compare two of its ranks with: oomdoctor diff {path} --ranks R S"
                )
        if args.steps is not None:
            with read_progress(args.file) as progress:
                result = pipeline.diff_steps(
                    args.file, *args.steps, device=args.device, redact=redact, max_bytes=max_bytes, progress=progress
                )
        else:
            with read_progress(args.file, then="comparing", other=args.other) as progress:
                result = pipeline.diff_files(
                    args.file, args.other, device=args.device, redact=redact, max_bytes=max_bytes, progress=progress
                )
    rendered = pipeline.render_diff(result, args.format)
    write_output(wrapped(rendered, args) if args.format == "text" else rendered)
    return check_gate(condition, diff_figures(result)) if condition is not None else 0
