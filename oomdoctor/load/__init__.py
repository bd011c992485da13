"""Read any CUDA memory snapshot torch writes, safely, into the typed model.

    from oomdoctor.load import load
    snapshot = load("oom-dumps/oom-rank0-....pickle")          # or bytes, or a binary file

The container is recognised by content (pickle protocol 0–5, gzip, JSON, memory_viz HTML export),
the shape by its keys (snapshot dict, bare segment list, torch 2.0 per-block history). Pickles are
read only through an unpickler that refuses every global, and no more than `max_bytes` (default
4 GiB, or OOMDOCTOR_MAX_BYTES; gzip counts decompressed bytes) is read. Every problem is a
`LoadError` whose message is one line naming the file.

The cyclic garbage collector is paused while a file loads: a snapshot is acyclic, and the
collector's repeated passes over millions of freshly made dicts and lists otherwise cost about
twice as much as the unpickling itself. It is resumed (if it was on) before `load` returns.
"""

from __future__ import annotations

import os
import sys
import types
from collections.abc import Callable
from typing import Any

from oomdoctor.gcpause import cyclic_gc_paused
from oomdoctor.load.containers import (
    DEFAULT_MAX_BYTES,
    MAX_BYTES_ENV,
    parse_size,
    read_source,
)
from oomdoctor.load.convert import build_snapshot, freeze_builtins
from oomdoctor.load.safe_pickle import READ_PROGRESS
from oomdoctor.model import Snapshot

__all__ = [
    "DEFAULT_MAX_BYTES",
    "MAX_BYTES_ENV",
    "freeze_builtins",
    "load",
    "load_raw",
    "parse_size",
]


# The share of `load`'s work that reading (unpickling) takes; building the model takes the rest.
READ_SHARE = 0.8


def load(source: Any, *, max_bytes: int | None = None, progress: Callable[[float], None] | None = None) -> Snapshot:
    """The Snapshot in `source` (a path, bytes, or a binary file object). `progress` hears the
    fraction of the work done (0 to 1) as the file is read, about every percent, and at the end."""
    with cyclic_gc_paused():
        raw, container = _read(source, max_bytes, progress, READ_SHARE)
        snapshot = build_snapshot(raw, container, _describe(source))
        if progress is not None:
            progress(1.0)
        return snapshot


def load_raw(source: Any, *, max_bytes: int | None = None, progress: Callable[[float], None] | None = None) -> Any:
    """The plain data in `source` (dicts, lists, str, numbers), read as safely as `load` reads it;
    `progress` hears the fraction read, as `load`'s does (1.0 once read)."""
    with cyclic_gc_paused():
        return _read(source, max_bytes, progress, 1.0)[0]


def _read(
    source: Any, max_bytes: int | None, progress: Callable[[float], None] | None, share: float
) -> tuple[Any, str]:
    """`read_source(source, max_bytes)`, `progress` hearing the fraction read as a fraction of
    `share` (and `share` once it is read)."""
    if progress is None:
        return read_source(source, max_bytes)
    token = READ_PROGRESS.set(lambda fraction: progress(share * min(fraction, 1.0)))
    try:
        found = read_source(source, max_bytes)
    finally:
        READ_PROGRESS.reset(token)
    progress(share)
    return found


def _describe(source: Any) -> str:
    if isinstance(source, (bytes, bytearray, memoryview)):
        return "input"
    name = getattr(source, "name", None) if hasattr(source, "read") else source
    try:
        return os.fsdecode(name) if name is not None else "input"
    except TypeError:
        return "input"


class _CallableModule(types.ModuleType):
    """`oomdoctor.load(path)` is the package's documented call, but importing this subpackage
    (as the analysis, the views and the commands do) rebinds the attribute `oomdoctor.load` from
    that function to this module: calling the module is calling `load`."""

    def __call__(self, source: Any, **options: Any) -> Snapshot:
        return load(source, **options)


sys.modules[__name__].__class__ = _CallableModule
