"""Strings from a file are data: made printable, bounded, and never read as markup.

Every string that comes from a dump (frame file names and function names, tensor names, versions,
argv, exception texts, settings, file names in a folder) passes through `printable` before a view
shows it, so that no control sequence reaches a terminal: C0 and C1 controls, DEL, the Unicode
line and paragraph separators and the bidirectional overrides are written as `\\xNN` / `\\uNNNN`
escapes. `clip` bounds a string's length, `describe_value` formats any value from a file in
bounded time and space (a shared-list "billion laughs" is never expanded).

Pure Python; every layer may use it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

# C0 controls (tab and newline included: a report line must stay one line), DEL, C1 controls,
# line/paragraph separators, bidirectional embeddings, overrides and isolates, and the BOM.
# Lone surrogates too: a pickle can carry them, and no encoder can write them to a terminal.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ufeff\ud800-\udfff]")

DEFAULT_LIMIT = 4096


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: Any, limit: int | None = DEFAULT_LIMIT) -> str:
    """`text` with every control character escaped, cut to about `limit` characters (None: no cut)."""
    if isinstance(text, str):
        text = str.__str__(text)  # a str enum member (a verdict) as its plain value
    else:
        text = describe_value(text)
    if limit is not None and len(text) > limit:
        text = clip(text, limit)
    if _UNSAFE.search(text) is None:
        return text
    return _UNSAFE.sub(_escape, text)


def is_printable(text: str) -> bool:
    """True when `printable` would leave `text` as it is (apart from its length)."""
    return _UNSAFE.search(text) is None


def clip(text: str, limit: int) -> str:
    """`text` cut to `limit` characters, saying how many were left out."""
    if len(text) <= limit:
        return text
    left_out = len(text) - limit
    return f"{text[:limit]}… ({left_out:,} more characters)"


_SCALARS = (int, float, bool, type(None))


def describe_value(value: Any, limit: int = 200) -> str:
    """A short, bounded text for any value read from a file: scalars as themselves, strings
    quoted and clipped, containers by their type and length (never expanded)."""
    kind = type(value)
    if kind is str:
        return repr(clip(value, limit))
    if kind is int:
        if -(10**18) < value < 10**18:
            return str(value)
        return f"an integer of {value.bit_length()} bits"
    if kind in _SCALARS:
        return repr(value)
    if kind in (list, tuple, dict, set, frozenset):
        return f"a {kind.__name__} of {len(value)} items"
    if kind in (bytes, bytearray):
        return f"{kind.__name__} of length {len(value)}"
    return f"a {kind.__name__}"


# UTF-8 of what JSON encoders leave raw but a terminal may act on: C1 controls, the line and
# paragraph separators, bidirectional controls, the BOM (C0 controls are escaped by the encoders).
_JSON_UNSAFE = re.compile(rb"\xc2[\x80-\x9f]|\xe2\x80[\xa8-\xae]|\xe2\x81[\xa6-\xa9]|\xef\xbb\xbf")


def _json_escape(match: re.Match[bytes]) -> bytes:
    return b"\\u%04x" % ord(match.group().decode("utf-8"))


def json_printable(encoded: bytes) -> bytes:
    """JSON text with the characters above written as \\uXXXX escapes: the same data when parsed,
    inert when printed. Outside strings JSON is ASCII, so only string contents change."""
    if _JSON_UNSAFE.search(encoded) is None:
        return encoded
    return _JSON_UNSAFE.sub(_json_escape, encoded)


LINE_LIMIT = 8192  # a line of a text view: longer ones (a stranger's 1 MB frame name) are cut


def printable_lines(lines: Iterable[str]) -> str:
    """Lines of a text view joined with newlines, each through `printable` (cut at LINE_LIMIT)."""
    return "\n".join(printable(line, LINE_LIMIT) for line in lines)


__all__ = [
    "DEFAULT_LIMIT",
    "LINE_LIMIT",
    "printable_lines",
    "clip",
    "describe_value",
    "is_printable",
    "json_printable",
    "printable",
]
