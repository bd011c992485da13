"""A time limit on the work that runs inside CPython's unpickler, for processes that may be killed.

Some hostile pickles make the C unpickler itself work without bound, where no Python code runs and
no exception can be raised: inserting a dict key hashes it, and a tuple's hash visits every nested
element without caching or a recursion check (a 532-byte file of memoised tuples nested forty deep
costs 2**40 steps and ignores Ctrl-C; a million nested tuples overflow the C stack). A pre-scan of
the opcodes in Python would cost several times the unpickling itself on every real file, so the
command line instead reads files in a process it can afford to lose (`oomdoctor.supervise`, the
folder reader's workers): there, `unpickling(describe, size)` arms an alarm whose default action
ends the process, and records what was being read in memory shared with the watching parent, which
turns the death into one line. In any other process (the library called from user code) it does
nothing: it never kills a process that did not ask for it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import struct
from collections.abc import Iterator
from typing import Any

READ_SECONDS_ENV = "OOMDOCTOR_READ_SECONDS"
# The limit for one file: this many seconds, plus one for every READ_BYTES_PER_SECOND of pickle.
# Real snapshots unpickle at 30 to 100 MB/s; the limit allows a machine several times slower.
DEFAULT_READ_SECONDS = 10.0
READ_BYTES_PER_SECOND = 4 * 1024**2

STATUS_BYTES = 4096
_HEADER = struct.Struct("<dI")  # limit in seconds, length of the UTF-8 name that follows

_enabled = False
_status: Any = None  # a shared mmap the supervising parent reads after the child's death
_status_pid: int | None = None


def enable(status: Any = None) -> None:
    """Arm the limit in this process (it may be killed); `status`: shared memory for the parent."""
    global _enabled, _status, _status_pid
    _enabled = True
    _status = status
    _status_pid = os.getpid() if status is not None else None
    if hasattr(signal, "SIGALRM"):
        try:
            signal.signal(signal.SIGALRM, signal.SIG_DFL)
        except ValueError:  # not the main thread: SIGALRM keeps its disposition (the default)
            pass


def enabled() -> bool:
    return _enabled and hasattr(signal, "setitimer")


def limit_seconds(size_bytes: int) -> float:
    try:
        base = float(os.environ.get(READ_SECONDS_ENV) or DEFAULT_READ_SECONDS)
    except ValueError:
        base = DEFAULT_READ_SECONDS
    if not base > 0:
        base = DEFAULT_READ_SECONDS
    return min(base + size_bytes / READ_BYTES_PER_SECOND, 1e7)


@contextlib.contextmanager
def unpickling(describe: str, size_bytes: int) -> Iterator[None]:
    """Within the block, the process ends (SIGALRM) once the limit for `size_bytes` has passed."""
    if not enabled():
        yield
        return
    limit = limit_seconds(size_bytes)
    _write_status(limit, describe)
    signal.setitimer(signal.ITIMER_REAL, limit)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        _write_status(0.0, "")


def _write_status(limit: float, describe: str) -> None:
    if _status is None or os.getpid() != _status_pid:  # a forked worker: its death is its pool's
        return
    name = describe.encode("utf-8", "replace")[: STATUS_BYTES - _HEADER.size]
    _status.seek(0)
    _status.write(_HEADER.pack(limit, len(name)) + name)


def read_status(status: Any) -> tuple[float, str] | None:
    """(limit, file) the child was unpickling when it died, or None when it was not."""
    limit, length = _HEADER.unpack_from(status, 0)
    if length == 0 or length > STATUS_BYTES - _HEADER.size:
        return None
    name = bytes(status[_HEADER.size : _HEADER.size + length]).decode("utf-8", "replace")
    return limit, name


__all__ = [
    "DEFAULT_READ_SECONDS",
    "READ_SECONDS_ENV",
    "enable",
    "enabled",
    "limit_seconds",
    "read_status",
    "unpickling",
]
