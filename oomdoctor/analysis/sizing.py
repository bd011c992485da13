"""The caching allocator's sizing rules (spec §4.1), for estimating what a request really occupied."""

from __future__ import annotations

MIN_BLOCK_BYTES = 512
SMALL_REQUEST_BYTES = 1 << 20  # requests up to this size use the small pool
SMALL_SEGMENT_BYTES = 2 << 20
MIN_LARGE_ALLOC_BYTES = 10 << 20
LARGE_SEGMENT_BYTES = 20 << 20
ROUND_LARGE_BYTES = 2 << 20


def _divisions_for(size_bytes: int, divisions: tuple[tuple[int, int], ...]) -> int:
    found = 0
    size_mib = size_bytes >> 20
    for lower_mib, count in divisions:
        if size_mib >= lower_mib:
            found = count
    return found


def round_size(size_bytes: int, divisions: tuple[tuple[int, int], ...] = ()) -> int:
    """The block size the allocator hands out for a request, before any unsplit remainder."""
    if size_bytes < MIN_BLOCK_BYTES:
        return MIN_BLOCK_BYTES
    count = _divisions_for(size_bytes, divisions) if divisions else 0
    if count > 1 and size_bytes > MIN_BLOCK_BYTES * count:
        if size_bytes & (size_bytes - 1) == 0:
            return size_bytes
        floor_power = 1 << (size_bytes.bit_length() - 1)
        step = floor_power >> (count.bit_length() - 1)
        if step == 0:
            return floor_power << 1
        rounded = size_bytes & ~(step - 1)
        return rounded if rounded == size_bytes else rounded + step
    return -(-size_bytes // MIN_BLOCK_BYTES) * MIN_BLOCK_BYTES


def segment_size(rounded_bytes: int, large_segment_bytes: int = LARGE_SEGMENT_BYTES) -> int:
    """What the allocator asks cudaMalloc for, and what an OOM message calls "Tried to allocate"."""
    if rounded_bytes <= SMALL_REQUEST_BYTES:
        return SMALL_SEGMENT_BYTES
    if rounded_bytes < MIN_LARGE_ALLOC_BYTES:
        return large_segment_bytes
    return -(-rounded_bytes // ROUND_LARGE_BYTES) * ROUND_LARGE_BYTES


def pool_of(rounded_bytes: int) -> str:
    return "small" if rounded_bytes <= SMALL_REQUEST_BYTES else "large"


def large_segment_bytes(raw_conf: str | None) -> int:
    """`large_segment_size_mb` from PYTORCH_CUDA_ALLOC_CONF (torch 2.11+), else the 20 MiB default."""
    for part in (raw_conf or "").split(","):
        key, _, value = part.partition(":")
        if key.strip() == "large_segment_size_mb" and value.strip().isdigit():
            return int(value.strip()) << 20
    return LARGE_SEGMENT_BYTES
