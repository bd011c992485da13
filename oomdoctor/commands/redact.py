"""Write a copy of a dump without personal details, fit to attach to an issue.

    oomdoctor redact oom-dumps/oom-rank0-gpu7-4242-20250101T000000Z.pickle \\
        shared.pickle.gz

Frames' file names lose their home-directory and other absolute prefixes (a path keeps its part
after site-packages/ or under the project's root, otherwise its file name); in oomdoctor's metadata
the host becomes "<host>" and the pid is dropped. Every other string torch or oomdoctor writes
(function names, argv, the exception's message and traceback, user_metadata, compile_context,
annotation names, forward_frames, pinned-host frames) has its paths, host and user names and process
ids redacted the same way; a string under a key neither writes becomes "<redacted>". Fixed
vocabulary (actions, block states, segment types, stages, phases) and numbers are kept, so the copy
still opens in oomdoctor and in pytorch.org/memory_viz and gives the same verdict.

OUT is written as a pickle (protocol 4), gzip-compressed when its name ends in .gz or IN is gzip
(GitHub accepts .gz attachments up to 25 MB, not .pickle; gunzip the file before dropping it into
pytorch.org/memory_viz, which reads plain pickles), through a new temporary file and a rename, and
read back before the rename to check that it loads. IN is never overwritten, nor anything at OUT (a dangling
symbolic link included) unless --force, which replaces the link itself, never what it points to.

On a terminal, a dump that takes more than half a second to read says on one line of stderr which
stage the work is at (reading, redacting, writing, checking the copy), blanked when it is done.
"""

from __future__ import annotations

import argparse
import gzip
import os
import pickle
import sys
from pathlib import Path

from oomdoctor.commands import ReadProgress, add_max_bytes_argument, max_bytes_argument, read_progress
from oomdoctor.errors import LoadError, OomdoctorError
from oomdoctor.gcpause import cyclic_gc_paused
from oomdoctor.safetext import printable

PICKLE_PROTOCOL = 4
GZIP_MAGIC = b"\x1f\x8b"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("input", metavar="IN", help="the dump or snapshot to redact")
    parser.add_argument("output", metavar="OUT", help="where to write the redacted dump")
    parser.add_argument("--force", action="store_true", help="replace OUT if it exists")
    add_max_bytes_argument(parser)


def _same_file(first: Path, second: Path) -> bool:
    try:
        return first.resolve() == second.resolve() or (second.exists() and os.path.samefile(first, second))
    except OSError:
        return False


def _snapshot_shaped(data: object) -> bool:
    """A dict with a list of segments, or a list of segment dicts (the shapes the loader reads)."""
    if isinstance(data, dict):
        return isinstance(data.get("segments"), list)
    return isinstance(data, list) and all(isinstance(segment, dict) for segment in data)


def _shape(data: object) -> str:
    """What the file holds instead, in a few words: "a list of lists", "an int"."""
    if isinstance(data, dict):
        return "a dict without a list under 'segments'"
    if isinstance(data, list):
        odd = next(item for item in data if not isinstance(item, dict))
        return f"a list holding {_a(type(odd).__name__)}"
    return _a(type(data).__name__)


def _is_gzip(path: Path) -> bool:
    try:
        with open(path, "rb") as file:
            return file.read(2) == GZIP_MAGIC
    except OSError:
        return False


def _a(name: str) -> str:
    return f"{'an' if name[:1] in tuple('aeiou') else 'a'} {name}"


def run(args: argparse.Namespace) -> int:
    source, target = Path(args.input), Path(args.output)
    max_bytes = max_bytes_argument(args)
    if _same_file(source, target):
        raise OomdoctorError(f"{target}: is the input itself; write the redacted copy elsewhere")
    if target.is_dir():
        raise OomdoctorError(f"{target}: is a directory; name the file to write")
    if os.path.lexists(target) and not args.force:
        raise OomdoctorError(f"{target}: already exists (--force replaces it)")
    if not target.parent.is_dir():
        raise OomdoctorError(f"{target.parent}: no such directory")
    # reading, redacting and writing a dump make millions of objects, no cycles
    with cyclic_gc_paused(), read_progress(args.input, then="redacting") as progress:
        _redact_file(source, target, max_bytes, progress)
    return 0


# gzip's own default level (`gzip FILE`): on a million-event dump it writes 2% more bytes than level
# 9, GzipFile's default, in a seventh of the time (0.6 s against 4.3 s for 96 MB of pickle).
GZIP_LEVEL = 6


def _redact_file(source: Path, target: Path, max_bytes: int | None, progress: ReadProgress | None = None) -> None:
    """Redact `source` into `target`: written beside it first, loaded back to check it, then moved
    there (`progress`: the stages said on a terminal)."""
    from oomdoctor.load import load, load_raw
    from oomdoctor.redact import redact_data

    data = load_raw(source, max_bytes=max_bytes, progress=progress)
    if not _snapshot_shaped(data):
        raise LoadError(
            f"{source}: not a memory snapshot (expected a dict with 'segments' or a list of segments, not {_shape(data)})"
        )
    redact_data(data)
    if progress is not None:
        progress.stage("writing")
    compress = target.name.lower().endswith(".gz") or _is_gzip(source)

    temporary = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    created = False
    try:
        try:
            with open(temporary, "xb") as file:  # a new file: never through a link someone left there
                created = True
                if compress:  # no name or time in the header: the same input gives the same bytes
                    with gzip.GzipFile(
                        filename="", mode="wb", fileobj=file, mtime=0, compresslevel=GZIP_LEVEL
                    ) as packed:
                        pickle.dump(data, packed, protocol=PICKLE_PROTOCOL)
                else:
                    pickle.dump(data, file, protocol=PICKLE_PROTOCOL)
        except OSError as error:
            raise OomdoctorError(f"{target}: cannot write ({error.strerror or error})") from None
        except (pickle.PicklingError, RecursionError, TypeError) as error:
            raise OomdoctorError(f"{source}: cannot be written back as a pickle ({error})") from None
        del data  # written: the check below loads the copy beside nothing else of this size
        if progress is not None:
            progress.stage("checking the copy of")
        try:
            load(temporary, max_bytes=None, progress=progress)
        except LoadError as error:
            raise LoadError(f"{source}: the redacted copy would not load ({str(error).split(': ', 1)[-1]})") from None
        os.replace(temporary, target)
    finally:
        if created and os.path.lexists(temporary):
            temporary.unlink()
    note = "; gzip: gunzip it before opening it in pytorch.org/memory_viz" if compress else ""
    print(
        f"wrote {printable(str(target))} (host and user names, path prefixes and the pid redacted{note})",
        file=sys.stderr,
    )
