"""The caching allocator's sizing rules (spec §4.1), for estimating what a request really occupied.

The rules and the parsing of the settings are `oomdoctor.allocator_rules`, shared with the loader
and the rehearsal simulator; this module hands them what analysis holds: roundup_power2_divisions
as the model's (MiB lower bound, divisions) pairs, and the raw configuration string.
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
    read_alloc_conf,
    segment_size,
)
from oomdoctor.allocator_rules import round_size as _round_size
from oomdoctor.model import AllocatorSettings

__all__ = [
    "LARGE_SEGMENT_BYTES",
    "MIN_BLOCK_BYTES",
    "MIN_LARGE_ALLOC_BYTES",
    "ROUND_LARGE_BYTES",
    "SMALL_REQUEST_BYTES",
    "SMALL_SEGMENT_BYTES",
    "large_segment_bytes",
    "pool_of",
    "round_size",
    "roundup_divisions",
    "segment_size",
]


def roundup_divisions(settings: AllocatorSettings | None) -> tuple[tuple[int, int], ...]:
    """The dump's roundup_power2_divisions for `round_size`; empty when no interval rounds."""
    divisions = settings.roundup_power2_divisions if settings is not None else ()
    return () if all(count <= 1 for _, count in divisions) else divisions


def round_size(size_bytes: int, divisions: tuple[tuple[int, int], ...] = ()) -> int:
    """The block size the allocator hands out for a request, before any unsplit remainder."""
    return _round_size(size_bytes, divisions_for(size_bytes, division_intervals(divisions)) if divisions else 0)


def large_segment_bytes(raw_conf: str | None) -> int:
    """`large_segment_size_mb` from PYTORCH_CUDA_ALLOC_CONF (torch 2.11+), else the 20 MiB default."""
    return read_alloc_conf(raw_conf or "").large_segment_size_bytes
