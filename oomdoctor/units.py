"""Sizes in bytes to and from text: what users type, torch's OOM-message style, and the views' style;
and a count with its noun ("1 block", "2 blocks"), which every layer words the same way.

Pure Python, shared by every layer (capture, load, analysis, views, rehearse).
"""

from __future__ import annotations

import re
from fractions import Fraction

KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB

_UNITS = {
    "": 1, "b": 1,
    "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4,
    "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
}  # fmt: skip
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str) -> int:
    """'24GiB' -> 25769803776; GB/MB/KB are decimal, GiB/G and friends binary; a bare number is bytes.

    Raises ValueError, with a message fit to show the user, for anything else.
    """
    match = _SIZE.match(text or "")
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _UNITS:
        raise ValueError(f"not a size: {text!r} (try 24GiB, 512MiB, 1.5GB or a number of bytes)")
    return int(Fraction(match.group(1)) * _UNITS[unit])  # exact: a 400-digit number is no overflow


def format_size(size_bytes: int) -> str:
    """c10's format_size, as used in torch's OutOfMemoryError message ('20.00 MiB')."""
    if size_bytes <= KIB:
        return f"{size_bytes} bytes"
    if size_bytes <= MIB:
        return f"{size_bytes / 1024.0:.2f} KiB"
    if size_bytes <= GIB:
        return f"{size_bytes / 1048576.0:.2f} MiB"
    try:
        return f"{size_bytes / 1073741824.0:.2f} GiB"
    except OverflowError:
        return f"{size_bytes >> 30} GiB"


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """'1 block', '0 blocks', '3 blocks'; `nouns` when the plural is not the noun with an s
    ('1 entry', '2 entries')."""
    return f"{count} {noun if count == 1 else (nouns or noun + 's')}"


def human_size(size_bytes: int | None, decimals: int = 2) -> str:
    """'1.50 KiB', '-3.00 GiB', '1023 bytes'; 'unknown' for None. Units step at 1024, up to TiB."""
    if size_bytes is None:
        return "unknown"
    try:
        value = float(size_bytes)
    except OverflowError:  # beyond any float: no real size, but still a number to show
        return f"{'-' if size_bytes < 0 else ''}{abs(size_bytes) >> 40} TiB"
    sign = "-" if value < 0 else ""
    value = abs(value)
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{sign}{plural(int(value), 'byte')}" if unit == "bytes" else f"{sign}{value:.{decimals}f} {unit}"
        value /= 1024
    return f"{sign}{value:.{decimals}f} TiB"


def human_sizes_apart(smaller: int | None, larger: int | None) -> tuple[str, str]:
    """Two sizes as `human_size` writes them, with as many more decimals as it takes (up to six,
    then in bytes) for two different sizes not to read the same: a free block of 4,190,208 bytes
    beside a 4 MiB request is '3.996 MiB', not '4.00 MiB'."""
    first, second = human_size(smaller), human_size(larger)
    if smaller is None or larger is None or smaller == larger or first != second:
        return first, second
    for decimals in range(3, 7):
        first, second = human_size(smaller, decimals), human_size(larger, decimals)
        if first != second:
            return first, second
    return f"{smaller:,} bytes", f"{larger:,} bytes"
