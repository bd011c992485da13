"""Explain an OOM dump: the verdict, the evidence that proves it, and what to change.

    oomdoctor report oom-dumps/oom-rank0-host-123-20250101T000000Z.pickle
    oomdoctor report dump.pickle --format json > report.json
    oomdoctor report dump.pickle --format md --redact > issue.md

FILE is an oomdoctor dump or any torch memory snapshot (pickle, gzip, JSON, memory_viz HTML).
Text leads with the verdict; Markdown is the same story laid out to paste into a GitHub issue, with
the environment (torch, CUDA, GPU) and the largest live blocks' stacks in a collapsed section; JSON
holds the full result (`verdict`, `confidence`, `components` in bytes, `evidence`,
`recommendations`, `what_if`, `environment`, `schema_version`, ...). With several devices the one
that ran out of memory is judged, unless --device says otherwise.

On a terminal, a file that takes more than half a second to read says how far the read has got,
then that it is being analysed, on one line of stderr, blanked before the report is printed. A
folder says how far the reading of its files has got (each file weighted by its size), then that
its ranks are being compared.

--redact replaces, in any format, the host name, user names, home directories and other absolute
path prefixes (a path keeps its part after site-packages/ or under the project's root, otherwise its
file name), paths in the command line and in frames' function names, and process ids (also in
torch's "Process N has ..." text), so the report can be shared. `oomdoctor redact`
does the same to the dump itself.

A folder (every rank of a torchrun, DDP, FSDP or DeepSpeed job dumps its own file into one) is
read in parallel processes: the report says which rank ran out first (by the OOM's time), gives
one row per rank (verdict, step and phase, allocated and reserved bytes, request, largest
component), says how the ranks differ (ranks whose memory or components stand out from the
median, whether the verdicts agree), then the full report of the rank that ran out first. Files
that are not snapshots are skipped with a note.

    oomdoctor report oom-dumps/
    oomdoctor report oom-dumps/ --format json
    oomdoctor report outputs/memory_snapshot/ --recursive

--recursive also reads the folder's sub-folders, every level (not following links to folders,
nor links to files outside it): torchtitan's `iteration_10/` and `..._exit/` folders, capture's
`run-{id}/` folders. The folders are read in turn, those named for an OOM first (oomdoctor's `oom-`
dumps, torchtitan's `_exit` folders), then the latest step, then the newest files, until one holds
a rank that ran out; its ranks are compared and the notes list the other folders.

--fail-if EXPR exits 1 when the condition holds (after printing the report) and says on stderr
which figure crossed which bound, e.g. `--fail-if "peak > 20GiB or activations > 8GiB"`; in a
folder it holds when it holds for any rank. The figures (peak, allocated, reserved, free_cached,
fragmented, each component) are listed in docs/gate.md. Exit codes: 0 the report was made (and no
--fail-if condition held), 1 a --fail-if condition held, 2 bad input or a bad expression.
"""

from __future__ import annotations

import argparse
import os

from oomdoctor.commands import (
    add_device_argument,
    add_fail_if_argument,
    add_file_argument,
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
    add_file_argument(parser, "the dump or snapshot to explain, or a folder of per-rank dumps")
    add_format_argument(parser, ("text", "md", "json"))
    add_redact_argument(parser)
    add_device_argument(parser, "judge this device instead of the failing one")
    add_max_bytes_argument(parser)
    add_fail_if_argument(parser)
    add_width_argument(parser)
    parser.add_argument(
        "--recursive",
        "-r",
        action="store_true",
        help="with a folder, also read its sub-folders and compare the ranks of the one holding the OOM",
    )


def _recursive(args: argparse.Namespace) -> bool:
    recursive = bool(getattr(args, "recursive", False))
    if recursive and not os.path.isdir(args.file):
        raise OomdoctorError(f"{args.file}: --recursive applies to a folder of dumps")
    return recursive


def run(args: argparse.Namespace) -> int:
    from oomdoctor import pipeline

    fail_if = getattr(args, "fail_if", None)
    if fail_if is not None:
        return _run_gated(args, fail_if)
    max_bytes = max_bytes_argument(args)
    redact = getattr(args, "redact", False)
    recursive = _recursive(args)
    if os.path.isdir(args.file):
        if args.device is not None:
            raise OomdoctorError(
                f"{args.file}: --device applies to one file; in a folder each rank is judged on its failing device"
            )
        with read_progress(args.file, then="comparing") as progress:
            report = pipeline.report_folder(
                args.file, args.format, redact=redact, max_bytes=max_bytes, recursive=recursive, progress=progress
            )
        write_output(_wrapped(report, args))
        return 0
    with read_progress(args.file) as progress:
        report = pipeline.report_file(
            args.file, args.format, redact=redact, device=args.device, max_bytes=max_bytes, progress=progress
        )
    write_output(_wrapped(report, args))
    return 0


def _run_gated(args: argparse.Namespace, fail_if: str) -> int:
    """The report, then exit 1 when the --fail-if condition holds (for any rank of a folder)."""
    from oomdoctor import pipeline
    from oomdoctor.analysis.gate import REPORT_FIGURE_NAMES, parse, report_figures
    from oomdoctor.errors import EXIT_FINDINGS, EXIT_OK

    condition = parse(fail_if, REPORT_FIGURE_NAMES)  # a bad expression fails before loading
    max_bytes = max_bytes_argument(args)
    redact = getattr(args, "redact", False)
    recursive = _recursive(args)
    if os.path.isdir(args.file):
        if args.device is not None:
            raise OomdoctorError(
                f"{args.file}: --device applies to one file; in a folder each rank is judged on its failing device"
            )
        with read_progress(args.file, then="comparing") as progress:
            rendered, folder = pipeline.report_folder_read(
                args.file, args.format, redact=redact, max_bytes=max_bytes, recursive=recursive, progress=progress
            )
        write_output(_wrapped(rendered, args))
        codes = [check_gate(condition, report_figures(dump.analysis), who=_rank_name(dump)) for dump in folder.dumps]
        return EXIT_FINDINGS if EXIT_FINDINGS in codes else EXIT_OK
    with read_progress(args.file) as progress:
        rendered, analysis = pipeline.report_file_analysed(
            args.file, args.format, redact=redact, device=args.device, max_bytes=max_bytes, progress=progress
        )
    write_output(_wrapped(rendered, args))
    return check_gate(condition, report_figures(analysis))


def _wrapped(rendered: bytes, args: argparse.Namespace) -> bytes:
    """The text report wrapped to the terminal (--width); Markdown and JSON as they are."""
    return wrapped(rendered, args) if args.format == "text" else rendered


def _rank_name(dump) -> str:
    return f"rank {dump.rank}" if dump.rank is not None else dump.file
