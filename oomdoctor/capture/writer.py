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


def run_folder_name(run_id: str | None) -> str | None:
    """The sub-folder the dumps of one torchrun launch share: `run-{TORCHELASTIC_RUN_ID}`, or None.

    torchrun gives every rank of a launch the same run id (`--rdzv-id`, or a fresh UUID for a
    single-node launch), so the ranks' dumps land in one folder that `oomdoctor report` reads as a
    whole, apart from other launches. "none", torchrun's default id for a static multi-node
    rendezvous, is every such launch's id, so it names no folder.
    """
    if run_id is None:
        return None
    run_id = run_id.strip()
    if not run_id or run_id.lower() == "none":
        return None
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", run_id).strip(".")[:128]
    return f"run-{safe}" if safe else None


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


def write_new_dump(
    payload: Any, directory: Path, name: str, warn: Callable[[str], None], subfolder: str | None = None
) -> tuple[Path, int]:
    """Write a new dump in `directory` (in its `subfolder`, when given), or in the temp directory
    (the same sub-folder) when that fails, saying so."""
    target = directory / subfolder if subfolder else directory
    try:
        path = unique_path(target, name)
        return path, write_atomically(payload, path)
    except OSError as error:
        fallback = fallback_directory()
        if fallback == directory:
            raise
        reason = error.strerror or str(error)
        if subfolder:
            fallback = fallback / subfolder
        warn(f"cannot write to {display_path(target)} ({reason}); writing to {fallback} instead")
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
