"""Bytes to plain data: recognise the container by content, never by the file's name.

Recognised: pickles (protocol 2–5, and 0–1 for good measure), gzip around any of these, JSON
snapshots, and memory_viz HTML exports (a base64 pickle inside a script). Everything is read under
a size cap, and pickles only through the restricted unpickler.
"""

from __future__ import annotations

import base64
import binascii
import contextvars
import gzip
import io
import os
import re
import zlib
from typing import Any

import orjson

from oomdoctor.errors import LoadError
from oomdoctor.load.access import access_error
from oomdoctor.load.safe_pickle import CappedReader, SizeLimitExceeded, address_space_cap, unpickle_stream
from oomdoctor.units import parse_size

DEFAULT_MAX_BYTES = 4 * 1024**3
MAX_BYTES_ENV = "OOMDOCTOR_MAX_BYTES"

_PICKLE_0_1_FIRST_BYTES = b"(}]c"  # MARK, EMPTY_DICT, EMPTY_LIST, GLOBAL (hostile, refused)
_WHITESPACE = b" \t\r\n\xef\xbb\xbf"  # and the UTF-8 byte order mark
_BASE64_FIELD = re.compile(rb'"base64"\s*:\s*"([A-Za-z0-9+/=\s\\]*)"')
# Whether the size limit of the current read was chosen (argument or environment), not the default.
_LIMIT_CHOSEN: contextvars.ContextVar[bool] = contextvars.ContextVar("limit_chosen", default=False)


def resolve_max_bytes(max_bytes: int | None) -> int:
    _LIMIT_CHOSEN.set(max_bytes is not None or bool(os.environ.get(MAX_BYTES_ENV)))
    if max_bytes is not None:
        return max_bytes
    configured = os.environ.get(MAX_BYTES_ENV)
    if not configured:
        return DEFAULT_MAX_BYTES
    try:
        return parse_size(configured)
    except ValueError as error:
        raise LoadError(f"{MAX_BYTES_ENV}: {error}") from None


def format_limit(limit_bytes: int) -> str:
    for unit, factor in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if limit_bytes >= factor:
            return f"{limit_bytes / factor:.4g} {unit}"
    return f"{limit_bytes} bytes"


def too_large_error(describe: str, what: str, limit_bytes: int, *, raise_with: str | None = None) -> LoadError:
    raise_with = raise_with or f"--max-bytes, {MAX_BYTES_ENV}, or load(..., max_bytes=N)"
    return LoadError(
        f"{describe}: {what} is larger than the {format_limit(limit_bytes)} limit (raise it with {raise_with})"
    )


# One pickle frame (64 KiB): the C unpickler peeks for 128 KiB and a BufferedReader's peek copies its
# whole buffer, so a larger buffer costs a fresh bytes object of that size per frame or two (a 1 MiB
# buffer made 36% more page faults than the file's bytes need and cost about a tenth of the unpickling)
_BUFFER_BYTES = 64 * 1024
# What a pipe or device is taken to hold when sizing the memory cap of its unpickling (its length
# is not known before it is read).
_UNKNOWN_SIZE_HINT = 64 * 1024**2


def read_source(source: Any, max_bytes: int | None = None) -> tuple[Any, str]:
    """Plain data from a path, bytes or binary file, and the container it came in."""
    limit_bytes = resolve_max_bytes(max_bytes)
    if isinstance(source, (bytes, bytearray, memoryview)):
        return _guarded(bytes(source), "input", limit_bytes)
    if hasattr(source, "read"):
        describe = str(getattr(source, "name", "input"))
        return _guarded(_read_capped(source, describe, limit_bytes, "the input"), describe, limit_bytes)
    try:
        path = os.fspath(source)
    except TypeError:
        raise LoadError(f"cannot read {source!r}: expected a path or bytes") from None
    describe = os.fsdecode(path)
    try:
        handle = open(path, "rb", buffering=_BUFFER_BYTES)
    except OSError as error:
        raise access_error(describe, error) from None
    with handle:
        try:
            size = os.fstat(handle.fileno()).st_size
            regular = os.path.isfile(path)
            if not regular:  # a pipe or device: its length is unknown; sniffed before more is read
                return _guarded(handle, describe, limit_bytes, None)
            if size > limit_bytes:
                raise too_large_error(describe, f"the file ({size} bytes)", limit_bytes)
            return _guarded(handle, describe, limit_bytes, size)
        except OSError as error:
            raise LoadError(f"{describe}: cannot read ({error.strerror or error})") from None


def _guarded(source: Any, describe: str, limit_bytes: int, size: int | None = None) -> tuple[Any, str]:
    """Read through a CappedReader, so that no read asks for more than is left in the input."""
    if isinstance(source, bytes):
        size = len(source)
        if size > limit_bytes:
            raise too_large_error(describe, "the input", limit_bytes)
        source = io.BufferedReader(io.BytesIO(source), buffer_size=_BUFFER_BYTES)
    try:
        if size is None:  # a stream of unknown length: read up to the limit, sized as a modest file
            return _from_stream(
                CappedReader(source, limit_bytes, "the input"), describe, limit_bytes, _UNKNOWN_SIZE_HINT
            )
        return _from_stream(CappedReader(source, size, "the input"), describe, limit_bytes, size)
    except SizeLimitExceeded as exceeded:
        raise too_large_error(describe, exceeded.what, exceeded.limit_bytes) from None


def _from_stream(stream: Any, describe: str, limit_bytes: int, size_bytes: int, depth: int = 0) -> tuple[Any, str]:
    """`size_bytes`: the length of the stream, or an estimate of it (decompressed gzip)."""
    head = stream.peek(64)[:64]
    if not head:
        raise LoadError(f"{describe}: empty file")
    if head[:2] == b"\x1f\x8b":
        return _from_gzip(stream, describe, limit_bytes, size_bytes, depth, _LIMIT_CHOSEN.get())
    if head[0] == 0x80:
        protocol = head[1] if len(head) > 1 else -1
        data = unpickle_stream(stream, describe, size_bytes)
        return data, f"pickle-protocol-{protocol}"
    stripped = head.lstrip(_WHITESPACE)
    if stripped[:1] in (b"{", b"[") or not stripped:
        return _from_json(_read_capped(stream, describe, limit_bytes, "the file"), describe)
    if stripped[:1] == b"<":
        return _from_html(_read_capped(stream, describe, limit_bytes, "the file"), describe, limit_bytes, depth)
    if head[:1] in _PICKLE_0_1_FIRST_BYTES:
        return unpickle_stream(stream, describe, size_bytes), "pickle-protocol-0-1"
    raise LoadError(
        f"{describe}: not a snapshot: the content is not a pickle, gzip, JSON or memory_viz HTML "
        f"file (it starts with {head[:8]!r})"
    )


def _from_stream_of_bytes(data: bytes, describe: str, limit_bytes: int, depth: int) -> tuple[Any, str]:
    stream = io.BufferedReader(io.BytesIO(data), buffer_size=_BUFFER_BYTES)
    return _from_stream(CappedReader(stream, len(data), "the embedded data"), describe, limit_bytes, len(data), depth)


def _read_capped(stream: Any, describe: str, limit_bytes: int, what: str) -> bytes:
    data = stream.read(limit_bytes + 1)
    if len(data) > limit_bytes:
        raise too_large_error(describe, what, limit_bytes)
    return data


# Snapshot pickles compress about 5-15 times; the memory cap while unpickling is relative to this.
_GZIP_RATIO_ESTIMATE = 25


GZIP_MAX_RATIO = 100
GZIP_MIN_EXPANDED_BYTES = 256 * 1024**2


def _from_gzip(
    stream: Any, describe: str, limit_bytes: int, size_bytes: int, depth: int, limit_chosen: bool = False
) -> tuple[Any, str]:
    if depth > 1:
        raise LoadError(f"{describe}: not a snapshot: compressed more than twice")
    # A compression bomb (0.5 MB of gzip that is 512 MiB of "0,") is refused by its ratio before it
    # is parsed, unless the user chose the limit; real snapshots compress 5 to 30 times.
    ratio_capped = False
    if not limit_chosen and max(GZIP_MIN_EXPANDED_BYTES, GZIP_MAX_RATIO * size_bytes) < limit_bytes:
        limit_bytes, ratio_capped = max(GZIP_MIN_EXPANDED_BYTES, GZIP_MAX_RATIO * size_bytes), True
    gunzipped: Any = gzip.GzipFile(fileobj=stream, mode="rb")
    decompressed = CappedReader(gunzipped, limit_bytes, "the decompressed data")
    buffered = io.BufferedReader(decompressed, buffer_size=_BUFFER_BYTES)
    try:
        estimate = min(limit_bytes, size_bytes * _GZIP_RATIO_ESTIMATE)
        capped = CappedReader(buffered, limit_bytes, "the decompressed data")
        data, container = _from_stream(capped, describe, limit_bytes, estimate, depth + 1)
    except SizeLimitExceeded as exceeded:
        if ratio_capped:
            raise LoadError(
                f"{describe}: the gzip data expands to more than {format_limit(limit_bytes)}, over "
                f"{GZIP_MAX_RATIO} times its compressed size: refused as a likely compression bomb (to "
                f"read it anyway, set a limit with --max-bytes or {MAX_BYTES_ENV})"
            ) from None
        raise too_large_error(describe, exceeded.what, exceeded.limit_bytes) from None
    except (EOFError, OSError, ValueError, zlib.error) as error:  # BadGzipFile is an OSError
        reason = " ".join(str(error).split())[:160] or type(error).__name__
        raise LoadError(f"{describe}: corrupt or truncated gzip data ({reason})") from None
    return data, f"gzip+{container}"


def _from_json(data: bytes, describe: str) -> tuple[Any, str]:
    try:
        with address_space_cap(len(data)):
            return orjson.loads(data), "json"
    except MemoryError:
        raise LoadError(
            f"{describe}: not a readable snapshot: parsing its JSON ran out of memory (the cap is "
            "relative to the file's size; a real snapshot needs a few times its size)"
        ) from None
    except orjson.JSONDecodeError as error:
        reason = str(error).split(":")[0][:160]
        if "end of" in str(error).lower() or "EOF" in str(error):
            raise LoadError(f"{describe}: truncated file: the JSON ends before it is complete") from None
        raise LoadError(f"{describe}: not valid JSON ({reason})") from None
    except RecursionError:
        raise LoadError(f"{describe}: not a readable snapshot: the JSON is nested too deeply") from None


def _from_html(data: bytes, describe: str, limit_bytes: int, depth: int) -> tuple[Any, str]:
    if depth > 1:
        raise LoadError(f"{describe}: not a snapshot: HTML nested inside another container")
    match = _BASE64_FIELD.search(data)
    if match is None:
        raise LoadError(f"{describe}: an HTML file without an embedded snapshot (not a memory_viz export)")
    encoded = match.group(1).replace(b"\\n", b"").replace(b"\\", b"")
    try:
        payload = base64.b64decode(b"".join(encoded.split()))
    except (binascii.Error, ValueError):
        raise LoadError(f"{describe}: the snapshot embedded in this HTML file is not valid base64") from None
    if not payload.strip(b"\x00"):
        raise LoadError(f"{describe}: the snapshot embedded in this HTML file is empty")
    inner, container = _from_stream_of_bytes(payload, describe, limit_bytes, depth + 1)
    return inner, f"html+{container}"
