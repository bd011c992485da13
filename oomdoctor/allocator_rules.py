"""The CUDA caching allocator's rules and settings (spec §4.1), in one place for every layer.

Pure Python, no torch: the loader, analysis and rehearsal all read the allocator through this module.

* Sizing: request rounding (`round_size`, with the roundup_power2_divisions `divisions_for` picks
  for a request's interval), the pool a block comes from (`pool_of`), and the segment cudaMalloc is
  asked for (`segment_size`).
* Settings: `parse_alloc_conf` reads a `PYTORCH_CUDA_ALLOC_CONF`-style string with torch 2.13's
  rules into an `AllocatorConfig`. It follows c10's ConfigTokenizer: `key:value` pairs separated by
  commas, a value may be a bracketed list (`roundup_power2_divisions:[256:1,512:2,>:4]`, or one
  number for every interval). Options that only concern the pinned host allocator are accepted
  and echoed in `allocator_settings`; unknown keys raise AllocatorConfigError (torch rejects them
  too), so a typo is not silently ignored. Numbers must be ASCII and of bounded length.
* A dump's settings: `read_alloc_conf` reads a recorded conf string without ever refusing it, and
  `recorded_settings` turns a snapshot's raw `allocator_settings` entry into `RecordedSettings`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

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


def unsplit_remainder_at_most(
    rounded_bytes: int,
    *,
    max_split_bytes: int | None = None,
    max_non_split_rounding_bytes: int = LARGE_SEGMENT_BYTES,
    expandable: bool = False,
) -> int:
    """The most the allocator may have left unsplit inside a block handed out for a request of
    `rounded_bytes` (spec §4.3): nothing in the small pool or with expandable segments (a
    remainder of 512 bytes or more is split off, and sizes are multiples of 512); in the large
    pool up to 1 MiB (only a remainder above 1 MiB is split off); a block at or above
    `max_split_bytes` (when set) is never split, and a cached one is taken only when less than
    `max_non_split_rounding_bytes` larger (spec §4.2)."""
    if expandable or rounded_bytes <= SMALL_REQUEST_BYTES:
        return 0
    if max_split_bytes is not None and rounded_bytes >= max_split_bytes:
        return max(SMALL_REQUEST_BYTES, max_non_split_rounding_bytes - MIN_BLOCK_BYTES)
    return SMALL_REQUEST_BYTES


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


_TOKEN = re.compile(r"[\[\]:,]|[^\[\]:,\s]+")
_ITEM_MAX_TOKENS = 256  # torch's longest item, a full roundup_power2_divisions list, has about 70
_CONF_MAX_CHARS = 128 * 1024  # MAX_ARG_STRLEN: the longest environment string Linux passes a process


class _Tokens:
    """c10's ConfigTokenizer over a string (read lazily) or a list of tokens: one token of lookahead."""

    def __init__(self, source: str | list[str]) -> None:
        self._tokens = iter(source) if isinstance(source, list) else (m.group() for m in _TOKEN.finditer(source))
        self._next = next(self._tokens, None)

    def peek(self) -> str | None:
        return self._next

    def take(self) -> str:
        token = self._next
        if token is None:
            raise AllocatorConfigError("allocator config ends early")
        self._next = next(self._tokens, None)
        return token

    def expect(self, token: str, after: str) -> None:
        found = self.take()
        if found != token:
            raise AllocatorConfigError(f"allocator config: expected '{token}' after {after}, found '{found}'")

    def take_int(self, key: str) -> int:
        token = self.take()
        # ASCII digits only ("²".isdigit() is true), and few enough for a 64-bit value
        if not (token.isascii() and token.isdigit()) or len(token) > 18:
            raise AllocatorConfigError(f"allocator config: {key} needs a whole number, got '{token}'")
        return int(token)

    def take_float(self, key: str) -> float:
        token = self.take()
        try:
            if not token.isascii():  # float() reads other scripts' digits too ("１.５")
                raise ValueError(token)
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


def _parse_divisions(tokens: _Tokens, current: list[int]) -> list[int]:
    """The intervals' divisions after a roundup_power2_divisions value (current: before it)."""
    divisions = list(current)
    if tokens.peek() != "[":
        value = tokens.take_int("roundup_power2_divisions")
        if not _is_power_of_two(value):
            raise AllocatorConfigError("roundup_power2_divisions: the divisions have to be a power of 2")
        return [value] * ROUNDUP_INTERVALS
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
    return divisions


def _read_item(tokens: _Tokens, config: AllocatorConfig) -> tuple[str, dict[str, Any]]:
    """One `key:value` item: its key and the fields it sets, validated as torch 2.13 validates them."""
    key = tokens.take()
    tokens.expect(":", f"key {key}")
    if key == "max_split_size_mb":
        value = tokens.take_int(key)
        if value < LARGE_SEGMENT_BYTES // MIB:
            raise AllocatorConfigError("max_split_size_mb too small, must be >= 20")
        return key, {"max_split_size_bytes": value * MIB}
    if key == "max_non_split_rounding_mb":
        value = tokens.take_int(key)
        if value < LARGE_SEGMENT_BYTES // MIB:
            raise AllocatorConfigError("max_non_split_rounding_mb too small, must be >= 20")
        return key, {"max_non_split_rounding_bytes": value * MIB}
    if key == "large_segment_size_mb":
        value = tokens.take_int(key)
        if value <= MIN_LARGE_ALLOC_BYTES // MIB:
            raise AllocatorConfigError("large_segment_size_mb must be larger than 10")
        return key, {"large_segment_size_bytes": value * MIB}
    if key == "garbage_collection_threshold":
        value = tokens.take_float(key)
        if not 0.0 < value < 1.0:
            raise AllocatorConfigError("garbage_collection_threshold must be in (0.0, 1.0)")
        return key, {"garbage_collection_threshold": value}
    if key == "roundup_power2_divisions":
        return key, {"roundup_power2_divisions": _parse_divisions(tokens, config.roundup_power2_divisions)}
    if key == "per_process_memory_fraction":
        value = tokens.take_float(key)
        if not 0.0 <= value <= 1.0:
            raise AllocatorConfigError("per_process_memory_fraction must be in [0.0, 1.0]")
        return key, {"per_process_memory_fraction": value}
    if key == "backend":
        value = tokens.take()
        if value != "native":
            raise AllocatorConfigError(f"the simulator models the native allocator only, not backend:{value}")
        return key, {}
    if key in _BOOL_FIELDS:
        value = tokens.take_bool(key)
        return key, {_BOOL_FIELDS[key]: value} if _BOOL_FIELDS[key] else {}
    if key == "pinned_num_register_threads":
        return key, {"pinned_num_register_threads": tokens.take_int(key)}
    if key == "pinned_max_round_threshold_mb":
        return key, {"pinned_max_round_threshold_bytes": tokens.take_int(key) * MIB}
    if key == "pinned_max_cached_size_mb":
        return key, {"pinned_max_cached_size_bytes": tokens.take_int(key) * MIB}
    raise AllocatorConfigError(f"unrecognized allocator config key '{key}'")


_BOOL_FIELDS = {  # key -> the field it sets ("": accepted, not modelled)
    "expandable_segments": "expandable_segments",
    "release_lock_on_cudamalloc": "release_lock_on_cudamalloc",
    "pinned_use_cuda_host_register": "pinned_use_cuda_host_register",
    "graph_capture_record_stream_reuse": "graph_capture_record_stream_reuse",
    "pinned_use_background_threads": "",
    "throw_on_cudamalloc_oom": "",
}


_KEYS = frozenset(
    (
        "max_split_size_mb",
        "max_non_split_rounding_mb",
        "large_segment_size_mb",
        "garbage_collection_threshold",
        "roundup_power2_divisions",
        "per_process_memory_fraction",
        "backend",
        "pinned_num_register_threads",
        "pinned_max_round_threshold_mb",
        "pinned_max_cached_size_mb",
        *_BOOL_FIELDS,
    )
)


def _set(config: AllocatorConfig, fields: dict[str, Any]) -> None:
    for name, value in fields.items():
        setattr(config, name, value)


def parse_alloc_conf(text: str) -> AllocatorConfig:
    """Parse a `PYTORCH_CUDA_ALLOC_CONF` string the way torch 2.13 does; AllocatorConfigError if it would refuse it."""
    config = AllocatorConfig(raw=text)
    tokens = _Tokens(text)
    while tokens.peek() is not None:
        key, fields = _read_item(tokens, config)
        _set(config, fields)
        if tokens.peek() is not None:
            tokens.expect(",", f"the value of {key}")
    return config


def read_alloc_conf(text: str) -> AllocatorConfig:
    """A `PYTORCH_CUDA_ALLOC_CONF` as a dump records it, read and never refused.

    Each comma-separated item is read on its own with `parse_alloc_conf`'s rules; one that torch
    2.13 would refuse (malformed, out of range, non-ASCII digits, a key it does not know, another
    backend, more than a few hundred tokens) is left out and the default stands; a list left open
    runs to the end of the string. A string torch accepts reads exactly as `parse_alloc_conf` reads
    it. One longer than any environment variable (128 KiB) reads as all defaults, so a hostile
    dump's string costs a bounded time. `recorded_settings` also counts the items left out.
    """
    return _read_alloc_conf(text)[0]


def _read_alloc_conf(text: str) -> tuple[AllocatorConfig, int]:
    """`read_alloc_conf`'s config, and how many items it left out (an overlong string counts one)."""
    config = AllocatorConfig(raw=text)
    if len(text) > _CONF_MAX_CHARS:
        return config, 1
    left_out = 0
    item: list[str] = []
    in_list = False  # inside a bracketed value, where commas separate the list's entries
    for match in _TOKEN.finditer(text):
        token = match.group()
        if token == "," and not in_list:
            left_out += not _read_lenient(item, config, last=False)
            item = []
            continue
        if token == "[" and len(item) == 2 and item[1] == ":":  # a list opens only as a value
            in_list = True
        elif token == "]":
            in_list = False
        if len(item) <= _ITEM_MAX_TOKENS:
            item.append(token)
    left_out += not _read_lenient(item, config, last=True)
    return config, left_out


def _read_lenient(item: list[str], config: AllocatorConfig, *, last: bool) -> bool:
    """Apply one item to config if torch would accept it; whether it did (an empty last item, after
    a trailing comma or in an empty string, is accepted as torch accepts it)."""
    if not item:
        return last
    if not 3 <= len(item) <= _ITEM_MAX_TOKENS or item[0] not in _KEYS or item[1] != ":":
        return False
    tokens = _Tokens(item)
    try:
        _, fields = _read_item(tokens, config)
    except AllocatorConfigError:
        return False
    if tokens.peek() is not None:
        return False
    _set(config, fields)
    return True


# ------------------------------------------------------- a dump's recorded settings

_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


@dataclass(frozen=True, slots=True)
class RecordedSettings:
    """The allocator settings a snapshot records (its `allocator_settings`), as typed values."""

    raw_conf: str = ""  # PYTORCH_CUDA_ALLOC_CONF as the allocator last parsed it
    max_split_size: int = -1  # bytes; -1: unlimited
    expandable_segments: bool = False
    garbage_collection_threshold: float = 0.0
    roundup_power2_divisions: tuple[tuple[int, int], ...] = ()  # (MiB lower bound, divisions), by bound
    large_segment_size_bytes: int = LARGE_SEGMENT_BYTES  # from the conf string: torch records no field for it
    conf_items_left_out: int = 0  # items of the conf string torch 2.13 would refuse, read as the defaults


def recorded_divisions(table: Any) -> tuple[tuple[int, int], ...]:
    """A snapshot's `roundup_power2_divisions` table as (MiB lower bound, divisions), by bound: the
    entries keyed by ASCII digits ("²".isdigit() is true; at most 18 digits, since int() refuses over
    4300 and no interval bound is that large) with a 64-bit int value; nothing else."""
    if type(table) is not dict:
        return ()
    divisions = []
    for key, value in table.items():
        if (
            type(key) is str
            and key.isascii()
            and key.isdigit()
            and len(key) <= 18
            and type(value) is int
            and _INT64_MIN <= value <= _INT64_MAX
        ):
            divisions.append((int(key), value))
    return tuple(sorted(divisions))


def recorded_settings(raw: Mapping[str, Any]) -> RecordedSettings:
    """A snapshot's `allocator_settings` entry (plain data, as unpickled) as the values analysis needs.

    The recorded fields are taken as torch wrote them, the defaults where one is missing or not of
    the type torch writes (an int outside 64 bits is not one); what only the conf string holds
    (large_segment_size_mb, torch 2.11+) is read from it with `read_alloc_conf`, which counts the
    items it leaves out (`conf_items_left_out`: for the loader's note). The divisions table
    keeps the entries keyed by ASCII digits (at most 18: a longer bound covers no interval) with a
    64-bit int value, sorted by bound. Never raises; checking the entry's structure is the loader's.
    """
    raw_conf = raw.get("PYTORCH_CUDA_ALLOC_CONF", "")
    raw_conf = raw_conf if type(raw_conf) is str else ""
    max_split_size = raw.get("max_split_size", -1)
    threshold = raw.get("garbage_collection_threshold", 0.0)
    conf, left_out = _read_alloc_conf(raw_conf)
    if type(threshold) is int and _INT64_MIN <= threshold <= _INT64_MAX:
        threshold = float(threshold)
    return RecordedSettings(
        raw_conf=raw_conf,
        max_split_size=max_split_size
        if type(max_split_size) is int and _INT64_MIN <= max_split_size <= _INT64_MAX
        else -1,
        expandable_segments=bool(raw.get("expandable_segments", False)),
        garbage_collection_threshold=threshold if type(threshold) is float else 0.0,
        roundup_power2_divisions=recorded_divisions(raw.get("roundup_power2_divisions")),
        large_segment_size_bytes=conf.large_segment_size_bytes,
        conf_items_left_out=left_out,
    )
