"""Write a copy of a dump without personal details, fit to attach to an issue.

    oomdoctor redact oom-dumps/oom-rank0-gpu7-4242-20250101T000000Z.pickle shared.pickle

Frames' file names lose their home-directory and other absolute prefixes (a path keeps its part
after site-packages/ or under the project's root, otherwise its file name); in oomdoctor's metadata
the host becomes "<host>", the pid is dropped, and paths in argv and in the exception's message and
traceback are redacted the same way. Everything else, torch's keys included, is kept as it was, so
the copy still opens in oomdoctor and in pytorch.org/memory_viz and gives the same verdict.

OUT is written as a pickle (protocol 4) through a temporary file and a rename, and read back before
the rename to check that it loads. IN is never overwritten, nor an existing OUT unless --force.
"""

from __future__ import annotations

import argparse
import os
import pickle
import sys
from pathlib import Path

from oomdoctor.commands import max_bytes_argument
from oomdoctor.errors import LoadError, OomdoctorError

PICKLE_PROTOCOL = 4


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("input", metavar="IN", help="the dump or snapshot to redact")
    parser.add_argument("output", metavar="OUT", help="where to write the redacted dump")
    parser.add_argument("--force", action="store_true", help="replace OUT if it exists")
    parser.add_argument("--max-bytes", default=None, help="refuse files larger than this (e.g. 2GiB)")


def _same_file(first: Path, second: Path) -> bool:
    try:
        return first.resolve() == second.resolve() or (second.exists() and os.path.samefile(first, second))
    except OSError:
        return False


def run(args: argparse.Namespace) -> int:
    from oomdoctor.load import load, load_raw
    from oomdoctor.redact import redact_snapshot_data, redactor_for_data

    source, target = Path(args.input), Path(args.output)
    max_bytes = max_bytes_argument(args)
    if _same_file(source, target):
        raise OomdoctorError(f"{target}: is the input itself; write the redacted copy elsewhere")
    if target.is_dir():
        raise OomdoctorError(f"{target}: is a directory; name the file to write")
    if target.exists() and not args.force:
        raise OomdoctorError(f"{target}: already exists (--force replaces it)")
    if not target.parent.is_dir():
        raise OomdoctorError(f"{target.parent}: no such directory")

    data = load_raw(source, max_bytes=max_bytes)
    if not (isinstance(data, dict) and isinstance(data.get("segments"), list)) and not isinstance(data, list):
        raise LoadError(f"{source}: not a memory snapshot (expected a dict with 'segments' or a list of segments)")
    redact_snapshot_data(data, redactor_for_data(data))

    temporary = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        try:
            with open(temporary, "wb") as file:
                pickle.dump(data, file, protocol=PICKLE_PROTOCOL)
        except OSError as error:
            raise OomdoctorError(f"{target}: cannot write ({error.strerror or error})") from None
        except (pickle.PicklingError, RecursionError, TypeError) as error:
            raise OomdoctorError(f"{source}: cannot be written back as a pickle ({error})") from None
        try:
            load(temporary, max_bytes=None)
        except LoadError as error:
            raise LoadError(f"{source}: the redacted copy would not load ({str(error).split(': ', 1)[-1]})") from None
        os.replace(temporary, target)
    finally:
        if temporary.exists():
            temporary.unlink()
    print(f"wrote {target} (host and user names, path prefixes and the pid redacted)", file=sys.stderr)
    return 0
