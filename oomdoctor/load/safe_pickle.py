"""Unpickling that runs no code from the file and reads no more than a cap.

torch's snapshots hold only dicts, lists, tuples, strings, numbers, bools and None, so a pickle
that names any global (a class, a function such as `os.system`) is not a snapshot torch wrote.
`RestrictedUnpickler.find_class` refuses every global, which also refuses the opcodes that could
call one (REDUCE, INST, OBJ, NEWOBJ, BUILD on an object, the copyreg extension registry), since
none of them has anything to call without a global. Persistent ids and out-of-band buffers are
refused by the C unpickler itself, because neither `persistent_load` nor `buffers` is given.
"""

from __future__ import annotations

import contextlib
import contextvars
import io
import os
import pickle
import sys
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO

try:
    import resource
except ImportError:  # not on Windows
    resource = None  # type: ignore[assignment]

from oomdoctor.errors import LoadError
from oomdoctor.load import guard


class RefusedGlobal(pickle.UnpicklingError):
    """The pickle asked for a global; nothing was looked up or called."""

    def __init__(self, module: str, name: str) -> None:
        super().__init__(f"{module}.{name}")
        self.qualified_name = f"{module}.{name}"


class RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise RefusedGlobal(str(module)[:200], str(name)[:200])


class SizeLimitExceeded(Exception):
    def __init__(self, limit_bytes: int, what: str) -> None:
        super().__init__(what)
        self.limit_bytes = limit_bytes
        self.what = what


# Who hears how far the current read has got (a fraction of the input, 0 to 1): `load(progress=)`.
READ_PROGRESS: contextvars.ContextVar[Callable[[float], None] | None] = contextvars.ContextVar(
    "read_progress", default=None
)


class CappedReader(io.RawIOBase):
    """A read-only stream over `inner` that fails once more than `limit_bytes` were read.

    Reads are clamped to what is left under the limit, so that a length field in a hostile pickle
    cannot make the unpickler ask the underlying file for gigabytes in one call. `peek` is kept,
    because the C unpickler prefetches through it when the data is not framed (protocol 2–3).
    """

    def __init__(self, inner: BinaryIO, limit_bytes: int, what: str) -> None:
        super().__init__()
        self._inner = inner
        self._left = limit_bytes
        self._limit_bytes = limit_bytes
        self._what = what
        self._peek = getattr(inner, "peek", None)
        self._progress = READ_PROGRESS.get()
        self._next_report = 0

    def readable(self) -> bool:
        return True

    def _take(self, data: bytes) -> bytes:
        self._left -= len(data)
        if self._left < 0:
            raise SizeLimitExceeded(self._limit_bytes, self._what)
        if self._progress is not None:
            done = self._limit_bytes - self._left
            if done >= self._next_report:
                self._next_report = done + max(self._limit_bytes >> 7, 1)
                self._progress(done / self._limit_bytes if self._limit_bytes else 1.0)
        return data

    def read(self, size: int | None = -1) -> bytes:
        if size is None or size < 0 or size > self._left:
            # one byte past the limit tells "exactly at the limit" from "over it"
            size = self._left + 1
        return self._take(self._inner.read(size))

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def readline(self, size: int | None = -1) -> bytes:
        if size is None or size < 0 or size > self._left:
            size = self._left + 1
        return self._take(self._inner.readline(size))

    def peek(self, size: int = 0) -> bytes:
        if self._peek is None:
            return b""
        return self._peek(min(max(size, 1), self._left + 1))


# CPython 3.11 prints this when BYTEARRAY8 asks for more memory than malloc gives (the new object's
# export count is read before it is set); the MemoryError that follows is what we report.
_CPYTHON_BYTEARRAY_NOISE = "SystemError: deallocated bytearray object has exported buffers\n"


class _HeldStderr:
    """Holds what is written to stderr during unpickling, to pass it on without CPython's noise."""

    def __init__(self, target: Any) -> None:
        self._target = target
        self._parts: list[str] = []

    def write(self, text: str) -> int:
        self._parts.append(text)
        return len(text)

    def flush(self) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target, name)

    def release(self) -> None:
        text = "".join(self._parts).replace(_CPYTHON_BYTEARRAY_NOISE, "")
        if text and self._target is not None:
            self._target.write(text)


# Memory the unpickler may take beyond what the process already maps: real snapshots need about
# 5x their pickled size. The C unpickler can be made to touch 16 bytes per unit of a LONG_BINPUT
# index (its memo table), up to 64 GiB from a 5-byte opcode, or ~70 bytes per input byte of empty
# dicts; this keeps such a file to a MemoryError instead of the machine's OOM killer.
MEMORY_ALLOWANCE_FACTOR = 32
MIN_MEMORY_ALLOWANCE_BYTES = 2 * 1024**3


def _mapped_bytes() -> int | None:
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


@contextlib.contextmanager
def address_space_cap(size_hint_bytes: int) -> Iterator[None]:
    """Lower RLIMIT_AS for the duration of one unpickling or JSON parse (Linux; elsewhere a no-op)."""
    mapped = _mapped_bytes() if resource is not None else None  # type: ignore[redundant-expr]
    if mapped is None:
        yield
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = mapped + max(MIN_MEMORY_ALLOWANCE_BYTES, MEMORY_ALLOWANCE_FACTOR * size_hint_bytes)
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    if soft != resource.RLIM_INFINITY and soft <= cap:
        yield
        return
    try:
        resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    except (ValueError, OSError):
        yield
        return
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def unpickle_stream(stream: BinaryIO, describe: str, size_hint_bytes: int) -> Any:
    """Restricted-unpickle one object from `stream`; every failure becomes a one-line LoadError.

    `size_hint_bytes` is the size of the pickle (decompressed); memory is capped relative to it.
    """
    held = _HeldStderr(sys.stderr)
    sys.stderr = held
    try:
        with address_space_cap(size_hint_bytes), guard.unpickling(describe, size_hint_bytes):
            return _unpickle(stream, describe)
    finally:
        if sys.stderr is held:
            sys.stderr = held._target
        held.release()


def _unpickle(stream: BinaryIO, describe: str) -> Any:
    try:
        return RestrictedUnpickler(stream).load()
    except RefusedGlobal as refused:
        raise LoadError(
            f"{describe}: refused to load: the pickle asks for the global "
            f"'{refused.qualified_name}', and memory snapshots never contain globals "
            "(nothing from the file was run)"
        ) from None
    except SizeLimitExceeded:
        raise
    except EOFError:
        raise LoadError(f"{describe}: truncated file: the pickle ends before it is complete") from None
    except MemoryError:
        raise LoadError(
            f"{describe}: not a readable snapshot: unpickling it ran out of memory (a damaged or hostile "
            "file can ask for far more than its size; a real snapshot needs about 5 times its size)"
        ) from None
    except RecursionError:
        raise LoadError(f"{describe}: not a readable snapshot: the pickle is nested too deeply") from None
    except Exception as error:  # the C unpickler raises many types on corrupt input
        reason = " ".join(str(error).split())[:200] or type(error).__name__
        if "truncated" in reason or "ran out of input" in reason.lower():
            raise LoadError(f"{describe}: truncated file: the pickle ends before it is complete") from None
        raise LoadError(f"{describe}: not a valid pickle ({reason})") from None
