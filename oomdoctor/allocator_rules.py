"""The CUDA caching allocator's sizing rules (spec §4.1), in one place for analysis and rehearsal.

Pure Python and free of any view of the configuration: callers pass the roundup_power2_divisions
that apply to a request and the large segment size, each from its own source (a dump's recorded
settings, or the simulator's parsed configuration).
"""

from __future__ import annotations

from oomdoctor.units import MIB

MIN_BLOCK_BYTES = 512  # kMinBlockSize
SMALL_REQUEST_BYTES = 1 * MIB  # kSmallSize: the largest request served by the small pool
SMALL_SEGMENT_BYTES = 2 * MIB  # kSmallBuffer
MIN_LARGE_ALLOC_BYTES = 10 * MIB  # kMinLargeAlloc
LARGE_SEGMENT_BYTES = 20 * MIB  # kLargeBuffer, default large_segment_size
ROUND_LARGE_BYTES = 2 * MIB  # kRoundLarge


def round_size(size_bytes: int, divisions: int = 0) -> int:
    """The block size a request gets (torch's round_size), given the divisions for its size."""
    if size_bytes < MIN_BLOCK_BYTES:
        return MIN_BLOCK_BYTES
    if divisions > 1 and size_bytes > MIN_BLOCK_BYTES * divisions:
        return roundup_power2_next_division(size_bytes, divisions)
    return -(-size_bytes // MIN_BLOCK_BYTES) * MIN_BLOCK_BYTES


def roundup_power2_next_division(size_bytes: int, divisions: int) -> int:
    """Round up to the next of `divisions` equal steps between the powers of two around size."""
    if size_bytes & (size_bytes - 1) == 0:
        return size_bytes
    power2_floor = 1 << (size_bytes.bit_length() - 1)
    step = power2_floor >> (divisions.bit_length() - 1)
    if step == 0:
        return power2_floor << 1
    floor = size_bytes & ~(step - 1)
    return size_bytes if floor == size_bytes else floor + step


def segment_size(rounded_bytes: int, large_segment_bytes: int = LARGE_SEGMENT_BYTES) -> int:
    """What cudaMalloc is asked for when no cached block fits (get_allocation_size); an OOM
    message's "Tried to allocate" figure."""
    if rounded_bytes <= SMALL_REQUEST_BYTES:
        return SMALL_SEGMENT_BYTES
    if rounded_bytes < MIN_LARGE_ALLOC_BYTES:
        return large_segment_bytes
    return -(-rounded_bytes // ROUND_LARGE_BYTES) * ROUND_LARGE_BYTES


def pool_of(rounded_bytes: int) -> str:
    """'small' or 'large': the pool a block of this rounded size comes from."""
    return "small" if rounded_bytes <= SMALL_REQUEST_BYTES else "large"
