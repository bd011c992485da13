"""Say what a snapshot file holds: format, devices, segments, bytes, trace events, OOMs, settings.

    oomdoctor info FILE [--format text|json] [--max-bytes SIZE]

Reads any snapshot torch writes (pickle, gzip, JSON, memory_viz HTML export, the bare segment list
of memory_snapshot(), torch 2.0's per-block history) without running anything from the file.

Byte totals, over all devices and per device:
  reserved_bytes    sum of segment sizes
  allocated_bytes   sum of `size` of allocated blocks (what torch calls allocated)
  requested_bytes   sum of their `requested_size` (what the tensors asked for)
  rounding_bytes    allocated - requested: rounding inside allocated blocks
  active_bytes      allocated plus blocks freed but waiting on other streams
  free_bytes        reserved - allocated: cached, not allocated
(torch.cuda._memory_viz's "total_free" is free_bytes + rounding_bytes.)

On a terminal, a file (or folder) that takes more than half a second to read says how far the read
has got on one line of stderr, blanked before the answer is printed.

Files larger than --max-bytes (default 4GiB, or OOMDOCTOR_MAX_BYTES; decompressed size for gzip)
are refused. Sizes: 4GiB, 512MiB, 1.5GB (GB, MB: powers of 1000; GiB, G: powers of 1024), or bytes.

Given a folder of per-rank dumps, one line per file (rank, container, torch, devices, reserved,
allocated, events, OOMs), files read in parallel processes; files that are not snapshots are
listed as skipped. --format json gives every file's full info. With --recursive, also every file
of its sub-folders, every level (links to folders, and to files outside it, are not followed), named
by its path under the folder.

Exit status: 0 read, 2 not a readable snapshot (one line on stderr says why).
"""

from __future__ import annotations

import argparse
import os
import sys

from oomdoctor.commands import (
    add_file_argument,
    add_format_argument,
    add_max_bytes_argument,
    add_width_argument,
    max_bytes_argument,
    read_progress,
    text_width,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_file_argument(parser, "snapshot file, or a folder of per-rank dumps")
    add_format_argument(parser, help="output format (default text)")
    add_max_bytes_argument(parser, "refuse larger files (default 4GiB)", parse_early=True)
    add_width_argument(parser)
    parser.add_argument("--recursive", "-r", action="store_true", help="with a folder, also read its sub-folders")


def run(args: argparse.Namespace) -> int:
    from oomdoctor import pipeline
    from oomdoctor.errors import OomdoctorError

    max_bytes = max_bytes_argument(args)
    recursive = bool(getattr(args, "recursive", False))
    if os.path.isdir(args.file):
        with read_progress(args.file, then=None) as progress:
            text = pipeline.info_folder(
                args.file, args.format, max_bytes=max_bytes, recursive=recursive, progress=progress
            )
    elif recursive:
        raise OomdoctorError(f"{args.file}: --recursive applies to a folder of dumps")
    else:
        with read_progress(args.file, then=None) as progress:
            text = pipeline.info_file(args.file, args.format, max_bytes=max_bytes, progress=progress)
    if args.format == "text":
        from oomdoctor.views.wrap import wrap_text

        text = wrap_text(text, text_width(args))
    sys.stdout.write(text)
    return 0
