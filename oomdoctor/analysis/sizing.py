"""The caching allocator's sizing rules (spec §4.1), for estimating what a request really occupied.

The rules and the parsing of the settings are `oomdoctor.allocator_rules`, shared with the loader
and the rehearsal simulator; this module hands them what analysis holds: roundup_power2_divisions
as the model's (MiB lower bound, divisions) pairs. The settings reach analysis typed by the loader
(`model.AllocatorSettings`: `rounding_divisions`, `large_segment_size_bytes`); no conf string is
parsed past load.
"""

from __future__ import annotations

from oomdoctor.allocator_rules import (
    LARGE_SEGMENT_BYTES,
    MIN_BLOCK_BYTES,
    MIN_LARGE_ALLOC_BYTES,
    ROUND_LARGE_BYTES,
    SMALL_REQUEST_BYTES,
    SMALL_SEGMENT_BYTES,
    division_intervals,
    divisions_for,
    pool_of,
    segment_size,
)
from oomdoctor.allocator_rules import round_size as _round_size

__all__ = [
    "LARGE_SEGMENT_BYTES",
    "MIN_BLOCK_BYTES",
    "MIN_LARGE_ALLOC_BYTES",
    "ROUND_LARGE_BYTES",
    "SMALL_REQUEST_BYTES",
    "SMALL_SEGMENT_BYTES",
    "pool_of",
    "round_size",
    "segment_size",
]


def round_size(size_bytes: int, divisions: tuple[tuple[int, int], ...] = ()) -> int:
    """The block size the allocator hands out for a request, before any unsplit remainder."""
    return _round_size(size_bytes, divisions_for(size_bytes, division_intervals(divisions)) if divisions else 0)
