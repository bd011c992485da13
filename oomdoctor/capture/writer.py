"""Writing dump files: names, atomic replacement, the temp-directory fallback, the note on stderr.

A dump is pickled with protocol 4, the highest memory_viz reads, into a temporary file beside the
target and renamed over it, so a reader never sees half a file, and a rewrite (adding the exception
once it surfaces) replaces the whole file at once.
"""

from __future__ import annotations

import os
import pickle
import re
import sys
import tempfile
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from oomdoctor.units import human_size

PICKLE_PROTOCOL = 4
FALLBACK_DIR_NAME = "oom-dumps"


def dump_file_name(kind: str, rank: int | None, host: str, pid: int, when: datetime | None = None) -> str:
    """`oom-rank{R}-{host}-{pid}-{UTC time}.pickle`: sorts by rank, host, process, then time."""
    when = when or datetime.now(timezone.utc)
    safe_host = re.sub(r"[^A-Za-z0-9._-]+", "_", host) or "unknown"
    stamp = when.astimezone(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"{kind}-rank{0 if rank is None else rank}-{safe_host}-{pid}-{stamp}.pickle"


def unique_path(directory: Path, name: str) -> Path:
    path = directory / name
    stem, suffix = name[: -len(".pickle")], ".pickle"
    number = 2
    while path.exists():
        path = directory / f"{stem}-{number}{suffix}"
        number += 1
    return path


def write_atomically(payload: Any, path: Path) -> int:
    """Pickle `payload` to `path` via a temporary file and a rename; returns the file's size in bytes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(temporary, "wb") as file:
            pickle.dump(payload, file, protocol=PICKLE_PROTOCOL)
            file.flush()
        size_bytes = temporary.stat().st_size
        os.replace(temporary, path)
    except BaseException:
        try:
            temporary.unlink()
        except OSError:
            pass
        raise
    return size_bytes


def fallback_directory() -> Path:
    return Path(tempfile.gettempdir()) / FALLBACK_DIR_NAME


def write_new_dump(payload: Any, directory: Path, name: str, warn: Callable[[str], None]) -> tuple[Path, int]:
    """Write a new dump in `directory`, or in the temp directory when that fails (saying so)."""
    try:
        path = unique_path(directory, name)
        return path, write_atomically(payload, path)
    except OSError as error:
        fallback = fallback_directory()
        if fallback == directory:
            raise
        reason = error.strerror or str(error)
        warn(f"cannot write to {display_path(directory)} ({reason}); writing to {fallback} instead")
        path = unique_path(fallback, name)
        return path, write_atomically(payload, path)


def display_path(path: Path) -> str:
    """Relative to the working directory when inside it (what the user would type), else absolute."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except (ValueError, OSError):
        return str(path)


def dump_note(path: Path, size_bytes: int) -> str:
    shown = display_path(path)
    return (
        f"wrote {shown} ({human_size(size_bytes, decimals=1)}) — explain it with: oomdoctor report {shown}"
        f"  (or browse it with: oomdoctor open {shown})"
    )


def say(message: str) -> None:
    """One line on stderr, prefixed; never raises (stderr may be closed at interpreter exit)."""
    try:
        print(f"oomdoctor: {message}", file=sys.stderr, flush=True)
    except Exception:
        pass
