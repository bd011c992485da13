"""The CUDA caching allocator's rules and settings (spec §4.1), in one place for every layer.

Pure Python, no torch: analysis, rehearsal and the loader all read the allocator through this module.

* Sizing: request rounding (`round_size`, with roundup_power2_divisions), the pool a block comes
  from (`pool_of`), and the segment cudaMalloc is asked for (`segment_size`).
* Settings: `parse_alloc_conf` reads a `PYTORCH_CUDA_ALLOC_CONF`-style string with torch 2.13's
  rules into an `AllocatorConfig`. It follows c10's ConfigTokenizer: `key:value` pairs separated by
  commas, a value may be a bracketed list (`roundup_power2_divisions:[256:1,512:2,>:4]`). Options
  that only concern the pinned host allocator are accepted and echoed in `allocator_settings`;
  unknown keys raise AllocatorConfigError (torch rejects them too), so a typo is not silently ignored.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache

from oomdoctor.units import MIB

MIN_BLOCK_BYTES = 512  # kMinBlockSize
SMALL_REQUEST_BYTES = 1 * MIB  # kSmallSize: the largest request served by the small pool
SMALL_SEGMENT_BYTES = 2 * MIB  # kSmallBuffer
MIN_LARGE_ALLOC_BYTES = 10 * MIB  # kMinLargeAlloc
LARGE_SEGMENT_BYTES = 20 * MIB  # kLargeBuffer, default large_segment_size
ROUND_LARGE_BYTES = 2 * MIB  # kRoundLarge
ROUNDUP_INTERVALS = 16  # power-of-two intervals from 1 MiB, the last one open-ended
UNLIMITED = (1 << 64) - 1  # SIZE_MAX, what torch stores for "no max_split_size"


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


def divisions_for(size_bytes: int, intervals: Sequence[int]) -> int:
    """The roundup_power2_divisions that apply to a request, from the divisions of each interval.

    torch's interval index is clamp(floor(log2 size) - 20, 0, 15): interval k starts at 2**k MiB,
    the first one also covers every request below 1 MiB and the last one is open-ended.
    """
    return intervals[min(max(size_bytes.bit_length() - 21, 0), ROUNDUP_INTERVALS - 1)]


@lru_cache(maxsize=64)
def division_intervals(table: tuple[tuple[int, int], ...]) -> tuple[int, ...]:
    """A dump's roundup_power2_divisions table as the divisions of each of the 16 intervals.

    The table is (MiB lower bound, divisions) pairs as `allocator_settings` records them (torch
    writes one per interval, keyed 2**k). Interval k takes the divisions of the last pair whose
    bound is at most 2**k MiB, 0 when there is none. Linear in the table, however long it is.
    """
    last_from: dict[int, tuple[int, int]] = {}  # first interval a pair covers -> (position, divisions)
    for position, (lower_mib, divisions) in enumerate(table):
        first = 0 if lower_mib <= 1 else (lower_mib - 1).bit_length()
        if first < ROUNDUP_INTERVALS:
            last_from[first] = (position, divisions)
    intervals = []
    latest = (-1, 0)
    for index in range(ROUNDUP_INTERVALS):
        latest = max(latest, last_from.get(index, latest))
        intervals.append(latest[1])
    return tuple(intervals)


# ------------------------------------------------------------------ settings


class AllocatorConfigError(ValueError):
    """The allocator configuration string is malformed or holds a value torch would reject."""


@dataclass
class AllocatorConfig:
    """A `PYTORCH_CUDA_ALLOC_CONF` as torch 2.13 applies it (`parse_alloc_conf`); sizes in bytes."""

    raw: str = ""
    max_split_size_bytes: int = UNLIMITED
    max_non_split_rounding_bytes: int = LARGE_SEGMENT_BYTES
    large_segment_size_bytes: int = LARGE_SEGMENT_BYTES
    garbage_collection_threshold: float = 0.0
    expandable_segments: bool = False
    roundup_power2_divisions: list[int] = field(default_factory=lambda: [0] * ROUNDUP_INTERVALS)
    per_process_memory_fraction: float | None = None
    release_lock_on_cudamalloc: bool = False
    pinned_use_cuda_host_register: bool = False
    pinned_num_register_threads: int = 1
    graph_capture_record_stream_reuse: bool = False
    pinned_max_round_threshold_bytes: int = -1
    pinned_max_cached_size_bytes: int = -1

    def round_size(self, nbytes: int) -> int:
        """The block size a request of nbytes gets under this configuration (torch's round_size)."""
        return round_size(nbytes, divisions_for(nbytes, self.roundup_power2_divisions))

    def allocation_size(self, rounded_bytes: int) -> int:
        """The segment size cudaMalloc is asked for when no cached block fits (get_allocation_size)."""
        return segment_size(rounded_bytes, self.large_segment_size_bytes)

    def settings_dict(self) -> dict:
        """torch 2.13's `allocator_settings` snapshot entry."""
        max_split = -1 if self.max_split_size_bytes == UNLIMITED else self.max_split_size_bytes
        return {
            "PYTORCH_CUDA_ALLOC_CONF": self.raw,
            "max_split_size": max_split,
            "garbage_collection_threshold": self.garbage_collection_threshold,
            "expandable_segments": self.expandable_segments,
            "pinned_num_register_threads": self.pinned_num_register_threads,
            "release_lock_on_cudamalloc": self.release_lock_on_cudamalloc,
            "pinned_use_cuda_host_register": self.pinned_use_cuda_host_register,
            "graph_capture_record_stream_reuse": self.graph_capture_record_stream_reuse,
            "max_round_threshold": self.pinned_max_round_threshold_bytes,
            "max_cached_size": self.pinned_max_cached_size_bytes,
            "roundup_power2_divisions": {
                str(1 << index): divisions for index, divisions in enumerate(self.roundup_power2_divisions)
            },
        }


def _is_power_of_two(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


class _Tokens:
    def __init__(self, text: str) -> None:
        self.items = [t for t in re.findall(r"[\[\]:,]|[^\[\]:,\s]+", text)]
        self.position = 0

    def peek(self) -> str | None:
        return self.items[self.position] if self.position < len(self.items) else None

    def take(self) -> str:
        token = self.peek()
        if token is None:
            raise AllocatorConfigError("allocator config ends early")
        self.position += 1
        return token

    def expect(self, token: str, after: str) -> None:
        found = self.take()
        if found != token:
            raise AllocatorConfigError(f"allocator config: expected '{token}' after {after}, found '{found}'")

    def take_int(self, key: str) -> int:
        token = self.take()
        if not (token.isascii() and token.isdigit()) or len(token) > 18:
            raise AllocatorConfigError(f"allocator config: {key} needs a whole number, got '{token}'")
        return int(token)

    def take_float(self, key: str) -> float:
        token = self.take()
        try:
            return float(token)
        except ValueError:
            raise AllocatorConfigError(f"allocator config: {key} needs a number, got '{token}'") from None

    def take_bool(self, key: str) -> bool:
        token = self.take()
        if token in ("True", "true", "1"):
            return True
        if token in ("False", "false", "0"):
            return False
        raise AllocatorConfigError(f"allocator config: {key} needs True or False, got '{token}'")


def _parse_divisions(tokens: _Tokens, divisions: list[int]) -> None:
    if tokens.peek() != "[":
        value = tokens.take_int("roundup_power2_divisions")
        if not _is_power_of_two(value):
            raise AllocatorConfigError("roundup_power2_divisions: the divisions have to be a power of 2")
        divisions[:] = [value] * ROUNDUP_INTERVALS
        return
    tokens.take()
    first_value = True
    last_index = 0
    while tokens.peek() != "]":
        boundary = tokens.take()
        tokens.expect(":", f"roundup_power2_divisions boundary {boundary}")
        value = tokens.take_int("roundup_power2_divisions")
        if value != 0 and not _is_power_of_two(value):
            raise AllocatorConfigError("roundup_power2_divisions: divisions must be a power of 2, or 0 to disable")
        if boundary == ">":
            divisions[last_index + 1 :] = [value] * (ROUNDUP_INTERVALS - last_index - 1)
        else:
            if (
                not (boundary.isascii() and boundary.isdigit())
                or len(boundary) > 18
                or not _is_power_of_two(int(boundary))
            ):
                raise AllocatorConfigError("roundup_power2_divisions: the intervals have to be powers of 2 (MiB)")
            index = min(int(boundary).bit_length() - 1, ROUNDUP_INTERVALS - 1)
            if first_value:
                divisions[:index] = [value] * index
                first_value = False
            divisions[index] = value
            last_index = index
        if tokens.peek() == ",":
            tokens.take()
    tokens.expect("]", "roundup_power2_divisions list")


def parse_alloc_conf(text: str) -> AllocatorConfig:
    """Parse a `PYTORCH_CUDA_ALLOC_CONF` string the way torch 2.13 does."""
    config = AllocatorConfig(raw=text)
    tokens = _Tokens(text)
    while tokens.peek() is not None:
        key = tokens.take()
        tokens.expect(":", f"key {key}")
        if key == "max_split_size_mb":
            value = tokens.take_int(key)
            if value < LARGE_SEGMENT_BYTES // MIB:
                raise AllocatorConfigError("max_split_size_mb too small, must be >= 20")
            config.max_split_size_bytes = value * MIB
        elif key == "max_non_split_rounding_mb":
            value = tokens.take_int(key)
            if value < LARGE_SEGMENT_BYTES // MIB:
                raise AllocatorConfigError("max_non_split_rounding_mb too small, must be >= 20")
            config.max_non_split_rounding_bytes = value * MIB
        elif key == "large_segment_size_mb":
            value = tokens.take_int(key)
            if value <= MIN_LARGE_ALLOC_BYTES // MIB:
                raise AllocatorConfigError("large_segment_size_mb must be larger than 10")
            config.large_segment_size_bytes = value * MIB
        elif key == "garbage_collection_threshold":
            value = tokens.take_float(key)
            if not 0.0 < value < 1.0:
                raise AllocatorConfigError("garbage_collection_threshold must be in (0.0, 1.0)")
            config.garbage_collection_threshold = value
        elif key == "roundup_power2_divisions":
            _parse_divisions(tokens, config.roundup_power2_divisions)
        elif key == "expandable_segments":
            config.expandable_segments = tokens.take_bool(key)
        elif key == "per_process_memory_fraction":
            value = tokens.take_float(key)
            if not 0.0 <= value <= 1.0:
                raise AllocatorConfigError("per_process_memory_fraction must be in [0.0, 1.0]")
            config.per_process_memory_fraction = value
        elif key == "backend":
            value = tokens.take()
            if value != "native":
                raise AllocatorConfigError(f"the simulator models the native allocator only, not backend:{value}")
        elif key == "release_lock_on_cudamalloc":
            config.release_lock_on_cudamalloc = tokens.take_bool(key)
        elif key == "pinned_use_cuda_host_register":
            config.pinned_use_cuda_host_register = tokens.take_bool(key)
        elif key == "graph_capture_record_stream_reuse":
            config.graph_capture_record_stream_reuse = tokens.take_bool(key)
        elif key in ("pinned_use_background_threads", "throw_on_cudamalloc_oom"):
            tokens.take_bool(key)
        elif key == "pinned_num_register_threads":
            config.pinned_num_register_threads = tokens.take_int(key)
        elif key == "pinned_max_round_threshold_mb":
            config.pinned_max_round_threshold_bytes = tokens.take_int(key) * MIB
        elif key == "pinned_max_cached_size_mb":
            config.pinned_max_cached_size_bytes = tokens.take_int(key) * MIB
        else:
            raise AllocatorConfigError(f"unrecognized allocator config key '{key}'")
        if tokens.peek() is not None:
            tokens.expect(",", f"the value of {key}")
    return config
