"""Plain snapshot data (dicts and lists as torch writes them) to the typed model.

This module is the only place that knows torch's raw key names and legacy shapes (spec §1, §7.7):
the torch 2.0 per-block `history`, the bare list of segments, `active_awaiting_free`, trace events
without `frames` or `time_us`, `oom` events without `addr`, pool ids as tuples or lists.

Traces are converted column by column with C-level passes (`map(dict.get, ...)`, `set(map(type,
...))`) rather than an object per event, and each device's raw events are released as soon as its
columns exist, so that loading costs little more than unpickling.
"""

from __future__ import annotations

import operator
import sys
from array import array
from collections.abc import Callable, Iterator, Mapping
from itertools import chain, islice, repeat
from typing import Any

from oomdoctor.allocator_rules import recorded_settings
from oomdoctor.errors import LoadError
from oomdoctor.load.metadata import parse_metadata
from oomdoctor.load.stacks import StackTable
from oomdoctor.metadata import METADATA_KEY
from oomdoctor.model import (
    ACTIVE_ALLOCATED,
    ACTIVE_PENDING_FREE,
    ANNOTATE,
    DEFAULT_POOL,
    INACTIVE,
    OOM,
    AllocatorSettings,
    Annotation,
    Block,
    DeviceTrace,
    FrozenDict,
    Segment,
    Snapshot,
    indices_of,
)
from oomdoctor.safetext import describe_value
from oomdoctor.units import plural

_NONE_TYPE = type(None)
_STATE_ALIASES = {
    ACTIVE_ALLOCATED: ACTIVE_ALLOCATED,
    ACTIVE_PENDING_FREE: ACTIVE_PENDING_FREE,
    "active_awaiting_free": ACTIVE_PENDING_FREE,
    INACTIVE: INACTIVE,
}
_NAMED_SETTINGS = (
    "PYTORCH_CUDA_ALLOC_CONF",
    "max_split_size",
    "expandable_segments",
    "garbage_collection_threshold",
    "roundup_power2_divisions",
)
_FREEZE_MAX_DEPTH = 32
# Newest torch minor release whose snapshot keys the spec describes (2.14).
_NEWEST_KNOWN_MINOR = 14


def _shape_error(describe: str, what: str) -> LoadError:
    return LoadError(f"{describe}: wrong structure: {what}; not a torch memory snapshot")


def _type_name(value: Any) -> str:
    return "None" if value is None else type(value).__name__


class _Era:
    """Which torch releases could have written this file, from the keys it has (spec §1.9)."""

    def __init__(self) -> None:
        self.lowest_minor = 0
        self.highest_minor: int | None = None
        self.hints: list[str] = []

    def at_least(self, minor: int, evidence: str) -> None:
        self.hints.append(f"{evidence}: torch >= 2.{minor}")
        self.lowest_minor = max(self.lowest_minor, minor)

    def at_most(self, minor: int, evidence: str) -> None:
        self.hints.append(f"{evidence}: torch <= 2.{minor}")
        if self.highest_minor is None or minor < self.highest_minor:
            self.highest_minor = minor

    def describe(self) -> str:
        low, high = self.lowest_minor, self.highest_minor
        if high is not None and high < low:
            return "inconsistent keys"
        if high is None:
            return f">= 2.{low}"
        if high == low:
            return f"2.{low}"
        return f"2.{low} to 2.{high}"


def build_snapshot(raw: Any, container: str, describe: str = "input") -> Snapshot:
    """The typed Snapshot of `raw`. Consumes `raw`: its trace lists are emptied as they convert."""
    era = _Era()
    notes: list[str] = []
    if type(raw) is list:
        if raw and type(raw[0]) is not dict:
            hint = " (export_memory_timeline rows from the profiler?)" if type(raw[0]) is list else ""
            raise _shape_error(
                describe, f"the file holds a list of {_type_name(raw[0])}s, not a list of segments{hint}"
            )
        source_format = "segment-list"
        raw_segments: Any = raw
        raw_traces: Any = []
        top: dict[str, Any] = {}
    elif type(raw) is dict:
        top = raw
        raw_segments = raw.get("segments")
        if raw_segments is None:
            keys = ", ".join(describe_value(k, 40) for k in list(raw)[:6])
            raise _shape_error(describe, f"a dict without 'segments' (keys: {keys or 'none'})")
        raw_traces = raw.get("device_traces")
        if raw_traces is None:
            raw_traces = raw.get("traces", [])  # `_memory_viz._read` wraps bare lists this way
        source_format = "dict"
    else:
        raise _shape_error(describe, f"the file holds a {_type_name(raw)}, not a dict or a list of segments")
    if type(raw_segments) is not list:
        raise _shape_error(describe, f"'segments' is a {_type_name(raw_segments)}, not a list")
    if type(raw_traces) is not list:
        raise _shape_error(describe, f"'device_traces' is a {_type_name(raw_traces)}, not a list")

    _refuse_shared(raw_traces, "device {}'s trace is the same list as device {}'s", describe)
    _refuse_shared(
        [seg.get("blocks") if type(seg) is dict else None for seg in raw_segments],
        "segment {}'s blocks are the same list as segment {}'s",
        describe,
    )
    stacks = StackTable()
    segments, legacy = _build_segments(raw_segments, stacks, describe)
    stacks.forget_lists()  # the raw segments go with `raw`; the events' lists stay with their traces
    expandable_recorded = bool(raw_segments) and all("is_expandable" in s for s in raw_segments)
    # torch 2.0 (its per-block history) had no expandable segments: none of its segments is one
    expandable_recorded = expandable_recorded or (legacy and bool(raw_segments))
    if legacy:
        source_format = "legacy-history"
        era.at_most(0, "per-block 'history'")
    elif any("segment_pool_id" in s or "is_expandable" in s for s in raw_segments):
        era.at_least(1, "segment_pool_id on segments")
    elif raw_segments and "device_traces" in top:
        era.at_most(0, "no segment_pool_id on segments")

    traces = []
    for device, events in enumerate(raw_traces):
        if type(events) is not list:
            raise _shape_error(describe, f"the trace of device {device} is a {_type_name(events)}, not a list")
        traces.append(_build_trace(device, events, stacks, describe, era))
        raw_traces[device] = None  # release the raw events of this device now
    full_dict = "device_traces" in top
    if full_dict:
        _era_from_top_level(top, era)

    metadata = _build_metadata(top.get(METADATA_KEY), notes)
    return Snapshot(
        segments=segments,
        traces=tuple(traces),
        allocator_settings=_build_allocator_settings(top.get("allocator_settings"), describe, era, notes),
        annotations=_build_annotations(top.get("external_annotations"), describe),
        annotations_recorded="external_annotations" in top,
        oomdoctor=parse_metadata(metadata),
        oomdoctor_raw=metadata,
        source_format=source_format,
        era_hints=tuple(era.hints),
        container=container,
        torch_version_hint=era.describe() if (era.hints or full_dict) else "",
        notes=tuple(notes),
        expandable_recorded=expandable_recorded,
    )


_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
# An array of C longs where they are 64 bits wide (Linux, macOS): it takes the same values as one of
# long longs ('q'), and converts an int of more than one 30-bit digit (an address, a time in us)
# without the byte-by-byte path that 'q' takes, about a third faster.
_INT64_TYPECODE = "l" if array("l").itemsize == 8 else "q"


def _int(value: Any, describe: str, what: str) -> int:
    if type(value) is not int:
        raise _shape_error(describe, f"{what} is a {_type_name(value)}, not an int")
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise _shape_error(describe, f"{what} does not fit in 64 bits")
    return value


def _refuse_shared(lists: list[Any], what: str, describe: str) -> None:
    """Refuse a non-empty list met twice among `lists` (each device's trace, each segment's blocks);
    `what` names the later and the earlier place. torch writes each its own list; a pickle can
    share one under thousands of devices or segments, and a file of a megabyte would then ask for
    its events or blocks to be read a thousand million times."""
    first: dict[int, int] = {}
    for index, value in enumerate(lists):
        if type(value) is list and value:
            earlier = first.setdefault(id(value), index)
            if earlier != index:
                raise _shape_error(describe, what.format(index, earlier) + " (the pickle shares it)")


def _build_segments(raw_segments: list[Any], stacks: StackTable, describe: str) -> tuple[tuple[Segment, ...], bool]:
    segments = []
    legacy = False
    for index, seg in enumerate(raw_segments):
        where = f"segment {index}"
        if type(seg) is not dict:
            raise _shape_error(describe, f"{where} is a {_type_name(seg)}, not a dict")
        address = _int(seg.get("address"), describe, f"{where} 'address'")
        total_size = _int(seg.get("total_size"), describe, f"{where} 'total_size'")
        device = _int(seg.get("device", 0), describe, f"{where} 'device'")
        if device < 0:
            raise _shape_error(describe, f"{where} 'device' is negative ({device})")
        stream = _int(seg.get("stream", 0), describe, f"{where} 'stream'")
        segment_type = seg.get("segment_type", "large")
        if type(segment_type) is not str:
            raise _shape_error(describe, f"{where} 'segment_type' is a {_type_name(segment_type)}")
        raw_blocks = seg.get("blocks")
        if type(raw_blocks) is not list:
            raise _shape_error(describe, f"{where} 'blocks' is a {_type_name(raw_blocks)}, not a list")
        blocks = []
        offset = 0
        for block_index, raw_block in enumerate(raw_blocks):
            block, is_legacy = _build_block(raw_block, address + offset, stacks, describe, index, block_index)
            legacy = legacy or is_legacy
            offset += block.size
            blocks.append(block)
        is_expandable = seg.get("is_expandable", False)
        if type(is_expandable) not in (bool, int):
            raise _shape_error(describe, f"{where} 'is_expandable' is a {_type_name(is_expandable)}")
        segments.append(
            Segment(
                device=device,
                address=address,
                total_size=total_size,
                stream=stream,
                segment_type=sys.intern(segment_type),
                blocks=tuple(blocks),
                pool_id=_pool_id(seg.get("segment_pool_id"), describe, f"{where} 'segment_pool_id'"),
                is_expandable=bool(is_expandable),
                frames=stacks.stack_of(seg.get("frames")),
            )
        )
    return tuple(segments), legacy


def _build_block(
    raw: Any, default_address: int, stacks: StackTable, describe: str, segment: int, number: int
) -> tuple[Block, bool]:
    """Block `number` of segment `segment`. A message naming the block is made only for a bad value
    (`_block_int`): a dump can hold a hundred thousand blocks."""
    if type(raw) is not dict:
        raise _shape_error(describe, f"{_block_where(segment, number)} is a {_type_name(raw)}, not a dict")
    size = _block_int(raw.get("size"), describe, segment, number, "size")
    state = raw.get("state")
    if type(state) is not str:
        raise _shape_error(describe, f"{_block_where(segment, number)} 'state' is a {_type_name(state)}, not a str")
    state = _STATE_ALIASES.get(state) or sys.intern(state)
    address = _block_int(raw.get("address", default_address), describe, segment, number, "address")
    history = raw.get("history") if "frames" not in raw else None
    if history is not None and type(history) is not list:
        raise _shape_error(
            describe, f"{_block_where(segment, number)} 'history' is a {_type_name(history)}, not a list"
        )
    if history:
        where = _block_where(segment, number)
        # torch 2.0: the newest allocation of the block is history[0] (as _memory_viz reads it)
        latest = history[0]
        if type(latest) is not dict:
            raise _shape_error(describe, f"{where} 'history' entry is a {_type_name(latest)}, not a dict")
        requested_size = _int(latest.get("real_size", size), describe, f"{where} 'real_size'")
        return Block(address, size, requested_size, state, stacks.stack_of(latest.get("frames"))), True
    requested_size = _block_int(raw.get("requested_size", size), describe, segment, number, "requested_size")
    return Block(address, size, requested_size, state, stacks.stack_of(raw.get("frames"))), "history" in raw


def _block_where(segment: int, number: int) -> str:
    return f"segment {segment} block {number}"


def _block_int(value: Any, describe: str, segment: int, number: int, key: str) -> int:
    """`_int` for a block's `key`, the message naming the block made only when the value is bad."""
    if type(value) is int and _INT64_MIN <= value <= _INT64_MAX:
        return value
    return _int(value, describe, f"{_block_where(segment, number)} '{key}'")  # raises


def _pool_id(value: Any, describe: str, what: str) -> tuple[int, int]:
    if value is None:
        return DEFAULT_POOL
    if type(value) not in (tuple, list) or len(value) != 2 or any(type(v) is not int for v in value):
        raise _shape_error(describe, f"{what} is not a pair of ints")
    _int(value[0], describe, what)
    _int(value[1], describe, what)
    return DEFAULT_POOL if tuple(value) == DEFAULT_POOL else (value[0], value[1])


def _bad_value_error(
    values: tuple[Any, ...], allowed: tuple[type, ...], describe: str, device: int, key: str
) -> LoadError:
    index = next(i for i, v in enumerate(values) if type(v) not in allowed)
    found = "missing" if values[index] is None else f"a {_type_name(values[index])}"
    return _shape_error(describe, f"device {device} trace event {index}: '{key}' is {found}")


def _int_column(
    values: tuple[Any, ...], describe: str, device: int, key: str, *, missing: int | None = None, ranged: bool = False
) -> tuple[int, ...]:
    """`values` checked to be ints (None replaced by `missing` when given), within int64 if `ranged`."""
    if ranged and _all_int64(values):
        return values
    kinds = set(map(type, values))
    if kinds != {int}:
        allowed = (int, _NONE_TYPE) if missing is not None else (int,)
        if not kinds.issubset(allowed):
            raise _bad_value_error(values, allowed, describe, device, key)
        filled = list(values)
        index = -1
        try:
            while True:  # list.index compares in C: None equals None only
                index = filled.index(None, index + 1)
                filled[index] = missing
        except ValueError:
            pass
        values = tuple(filled)
    if ranged:
        _check_int64(values, describe, device, key)
    return values


def _all_int64(values: tuple[Any, ...]) -> bool:
    """Whether every one of `values` (not empty) is an int, never a bool, that fits in 64 bits.

    An int64 array refuses, in one C pass, every value that is not an int or a bool in range
    (nothing else a snapshot holds has __index__). Only bools are left to tell apart, and a bool
    is stored as a word equal to 0 or 1: those words are searched for in the array's bytes (in C)
    and the values there typed one by one; where there are too many to look at, the smallest value
    says whether a 0 or a 1 is there at all (none: no bool), or else the type of every value is
    read. False says only that the full checks must run: they name the first bad value, as they
    always have."""
    try:
        words = array(_INT64_TYPECODE, values).tobytes()
    except (TypeError, OverflowError):
        return False
    zeros = _typed_at_word(values, words, _WORD_0)
    ones = _typed_at_word(values, words, _WORD_1)
    if zeros is False or ones is False:
        return False
    if zeros is None or ones is None:  # a search gave up
        smallest = min(values)
        if not (smallest > 1 or (smallest == 1 and ones)):
            return set(map(type, values)) == {int}
    return True


_WORD_0 = array(_INT64_TYPECODE, [0]).tobytes()
_WORD_1 = array(_INT64_TYPECODE, [1]).tobytes()
# How many values equal to `word` are typed one by one, and how many matches across two words are
# stepped over, before `_typed_at_word` gives up.
_TYPED_MAX = 4096
_STRADDLING_MAX = 64


def _typed_at_word(values: tuple[Any, ...], words: bytes, word: bytes) -> bool | None:
    """Whether every value stored as `word` in `words` (the bytes of an array of `values`) is an
    int: True, False, or None when there were too many matches to look at."""
    size = len(word)
    typed = straddling = 0
    at = words.find(word)
    while at >= 0:
        if at % size:  # the end of one word and the start of the next: go on from the next word
            straddling += 1
            if straddling > _STRADDLING_MAX:
                return None
            at = words.find(word, at - at % size + size)
            continue
        typed += 1
        if typed > _TYPED_MAX:
            return None
        if type(values[at // size]) is not int:
            return False
        at = words.find(word, at + size)
    return True


def _check_int64(values: tuple[int, ...], describe: str, device: int, key: str) -> None:
    """Raise unless every one of `values` (ints, never bools) fits in 64 bits: one C pass (an
    int64 array refuses the first that does not), where min and max took two."""
    try:
        array(_INT64_TYPECODE, values)
    except OverflowError:
        index = next(i for i, v in enumerate(values) if not _INT64_MIN <= v <= _INT64_MAX)
        raise _shape_error(describe, f"device {device} trace event {index}: '{key}' does not fit in 64 bits") from None


def _distinct(
    values: tuple[Any, ...], allowed: tuple[type, ...], describe: str, device: int, key: str, usual: Any = None
) -> set[Any]:
    """The distinct values of a column with few of them (actions, streams, contexts), type-checked.

    The types are checked before any value is hashed: hashing a deeply nested or self-sharing tuple
    from a hostile file would overflow the C stack or take exponential time. `usual`: a value that
    is often the only one, counted first (in C, comparing without hashing): stream 0, which among
    ints and None only an int 0 equals."""
    kinds = set(map(type, values))
    if not kinds.issubset(allowed):
        raise _bad_value_error(values, allowed, describe, device, key)
    if type(usual) in kinds and values.count(usual) == len(values):
        return {usual}
    try:
        distinct = set(values)
    except TypeError:  # an unhashable value: a list or dict where a str or int belongs
        raise _bad_value_error(values, allowed, describe, device, key) from None
    if any(type(v) not in allowed for v in distinct):
        raise _bad_value_error(values, allowed, describe, device, key)
    return distinct


def _shared_strings(values: tuple[Any, ...], distinct: set[Any]) -> tuple[Any, ...]:
    """The same values with equal strings made one (interned) object, when they are not already."""
    sample = values[:4096]
    if len(set(map(id, sample))) <= len(set(sample)):
        return values  # already one object per value, as in torch's pickles
    table = {v: sys.intern(v) if type(v) is str else v for v in distinct}
    if len(table) == 1:  # one value throughout (compile_context 'N/A', say): no lookup per value
        return tuple(table.values()) * len(values)
    return tuple(map(table.__getitem__, values))


def _column_reader(events: list[Any]) -> Callable[..., tuple[Any, ...]]:
    """`column(key)`: the value of `key` in every event (None where it is missing). One C-level
    pass with an itemgetter (a little faster than dict.get), which refuses a missing key or an
    event that is no dict; then a pass with dict.get decides (None for a missing key, TypeError
    for an event that is no dict). `column(key, always=False)`: a key some events lack (`addr`,
    which `oom` events have not): dict.get at once."""
    get = dict.get

    def column(key: str, always: bool = True) -> tuple[Any, ...]:
        if always:
            try:
                return tuple(map(operator.itemgetter(key), events))
            except (KeyError, TypeError, IndexError):
                pass
        return tuple(map(get, events, repeat(key)))

    return column


_ADDR = operator.itemgetter("addr")
_OOM_ADDR = operator.methodcaller("get", "addr", 0)
# Up to this many `oom` events in a trace, its addr column is read in runs between them.
_OOM_RUNS_MAX = 1024


def _addr_column(events: list[Any], column: Callable[..., tuple[Any, ...]], oom_indices: list[int]) -> tuple[Any, ...]:
    """The addr of every event (all dicts by now). torch writes none on `oom` events: those are read
    with dict.get (0 when missing, as `_int_column` fills it), the runs between them with an
    itemgetter, a little faster than dict.get; an event elsewhere without one sends the whole column
    to dict.get (None where missing)."""
    if not oom_indices:
        return column("addr")
    if len(oom_indices) <= _OOM_RUNS_MAX:
        rest = iter(events)
        runs: list[Iterator[Any]] = []
        start = 0
        for index in oom_indices:  # consumed in order by chain: each run takes its events from `rest`
            runs.append(map(_ADDR, islice(rest, index - start)))
            runs.append(map(_OOM_ADDR, islice(rest, 1)))
            start = index + 1
        runs.append(map(_ADDR, rest))
        try:
            return tuple(chain.from_iterable(runs))
        except KeyError:
            pass
    return column("addr", always=False)


def _present(events: list[Any], key: str) -> bool:
    """torch writes a key on every event of a trace or on none (spec §1.9); look at both ends."""
    return key in events[0] or key in events[-1]


def _build_trace(device: int, events: list[Any], stacks: StackTable, describe: str, era: _Era) -> DeviceTrace:
    if not events:
        return DeviceTrace(device, (), (), (), ())
    column = _column_reader(events)

    try:
        actions = column("action")
    except TypeError:  # dict.get refuses anything but a dict
        bad = next(e for e in events if type(e) is not dict)
        raise _shape_error(describe, f"a trace event of device {device} is a {_type_name(bad)}, not a dict") from None
    distinct_actions = _distinct(actions, (str,), describe, device, "action")
    actions = _shared_strings(actions, distinct_actions)

    oom_indices: list[int] = indices_of(actions, OOM, []) if OOM in distinct_actions else []

    sizes = _int_column(column("size"), describe, device, "size", ranged=True)
    addr_values = _addr_column(events, column, oom_indices)
    addrs = _int_column(addr_values, describe, device, "addr", missing=0, ranged=True)
    streams = column("stream")
    if _distinct(streams, (int, _NONE_TYPE), describe, device, "stream", usual=0) != {0}:
        streams = _int_column(streams, describe, device, "stream", missing=0, ranged=True)

    times_us = None
    times_complete = False  # every event has a time
    if _present(events, "time_us"):
        values = column("time_us")
        if _all_int64(values):
            times_us, times_complete = values, True
        else:
            kinds = set(map(type, values))
            if not kinds.issubset((int, _NONE_TYPE)):
                raise _bad_value_error(values, (int, _NONE_TYPE), describe, device, "time_us")
            present = values if _NONE_TYPE not in kinds else tuple(v for v in values if v is not None)
            if present:  # ints by now: only their range is left to check
                _check_int64(present, describe, device, "time_us")
                times_us = values
    if times_us is not None:
        _note_once(era, "time_us on trace events", 2)
    else:
        _note_once(era, "no time_us on trace events", 1, upper=True)

    compile_contexts = _optional_text_column(events, column, "compile_context", describe, device, era, 8, 7)
    user_metadata = _optional_text_column(events, column, "user_metadata", describe, device, era, 10, 9)
    pool_ids = _optional_pool_column(events, column, describe, device, era)
    raw_stacks = column("frames")  # checked lazily: StackTable turns anything odd into no stack

    device_free: dict[int, int] = {}
    for index in oom_indices:
        free = events[index].get("device_free")
        if free is not None:
            device_free[index] = _int(free, describe, f"device {device} trace event {index} 'device_free'")
    if ANNOTATE in distinct_actions:
        _note_once(era, "'annotate' trace events", 14)

    forward_frames: dict[int, tuple[str, ...]] = {}
    # anomaly-mode forward_frames exist from torch 2.11 on, whose events all carry user_metadata;
    # an event that has them has more keys than the columns above account for
    known_keys = 6 + sum(c is not None for c in (times_us, compile_contexts, user_metadata, pool_ids))
    if (
        user_metadata is not None
        and max(map(len, events)) >= known_keys
        and any(map(operator.contains, events, repeat("forward_frames")))
    ):
        _note_once(era, "forward_frames on trace events", 11)
        converted: dict[int, tuple[str, ...]] = {}  # each list once, however many events share it
        for index, event in enumerate(events):
            lines = event.get("forward_frames")
            if lines:
                if type(lines) not in (list, tuple):
                    forward_frames[index] = ()
                    continue
                done = converted.get(id(lines))
                if done is None:
                    done = converted[id(lines)] = tuple(
                        line if type(line) is str else describe_value(line) for line in lines
                    )
                forward_frames[index] = done

    return DeviceTrace(
        device=device,
        actions=actions,
        addrs=addrs,
        sizes=sizes,
        streams=streams,
        times_us=times_us,
        compile_contexts=compile_contexts,
        user_metadata=user_metadata,
        pool_ids=pool_ids,
        device_free=FrozenDict(device_free),
        forward_frames=FrozenDict(forward_frames),
        raw_stacks=raw_stacks,
        stack_of=stacks.stack_of,
        times_complete=times_complete,
    )


def _note_once(era: _Era, evidence: str, minor: int, upper: bool = False) -> None:
    if any(h.startswith(evidence + ":") for h in era.hints):
        return
    if upper:
        era.at_most(minor, evidence)
    else:
        era.at_least(minor, evidence)


def _optional_text_column(
    events: list[Any],
    read: Callable[..., tuple[Any, ...]],
    key: str,
    describe: str,
    device: int,
    era: _Era,
    since_minor: int,
    before_minor: int,
) -> tuple[str | None, ...] | None:
    if not _present(events, key):
        _note_once(era, f"no {key} on trace events", before_minor, upper=True)
        return None
    values = read(key)
    first = values[0]
    # one str on every event, as torch often writes these (count compares in C and hashes
    # nothing; only a str equals a str), else each value's type checked
    if type(first) is str and values.count(first) == len(values):
        distinct: set[Any] = {first}
    else:
        distinct = _distinct(values, (str, _NONE_TYPE), describe, device, key)
    _note_once(era, f"{key} on trace events", since_minor)
    return _shared_strings(values, distinct)


def _optional_pool_column(
    events: list[Any], read: Callable[..., tuple[Any, ...]], describe: str, device: int, era: _Era
) -> tuple[Any, ...] | None:
    if not _present(events, "pool_id"):
        _note_once(era, "no pool_id on trace events", 11, upper=True)
        return None
    values = read("pool_id")
    _note_once(era, "pool_id on trace events", 12)
    fast = _pool_column_of_pairs(values)
    if fast is not None:
        return fast
    table: dict[Any, tuple[int, int]] = {}
    column: list[Any] = []
    for index, value in enumerate(values):
        if value is None:
            column.append(None)
            continue
        if (
            type(value) not in (tuple, list)
            or len(value) != 2
            or type(value[0]) is not int
            or type(value[1]) is not int
        ):
            raise _shape_error(describe, f"device {device} trace event {index}: 'pool_id' is not a pair of ints")
        key = (value[0], value[1])  # hashed only once known to be two ints
        pool = table.get(key)
        if pool is None:
            pool = _pool_id(value, describe, f"device {device} trace event {index} 'pool_id'")
            table[key] = pool
        column.append(pool)
    return tuple(column)


def _pool_column_of_pairs(values: tuple[Any, ...]) -> tuple[tuple[int, int], ...] | None:
    """The pool column in C-level passes when every value is a pair of int64s (as torch writes
    them); None when any is not (None, another shape: the checking loop decides)."""
    if values.count(DEFAULT_POOL) == len(values):  # all the default pool (compared safely: no hashing)
        # equal to a tuple means a tuple (a list never equals one), and equal to (0, 0) a pair of
        # zeros, but False and 0.0 equal 0 too
        kinds = set(map(type, map(operator.itemgetter(0), values)))
        kinds.update(map(type, map(operator.itemgetter(1), values)))
        if kinds == {int}:
            return (DEFAULT_POOL,) * len(values)
        return None
    if not set(map(type, values)).issubset((tuple, list)) or set(map(len, values)) != {2}:
        return None
    firsts = tuple(map(operator.itemgetter(0), values))
    seconds = tuple(map(operator.itemgetter(1), values))
    for part in (firsts, seconds):
        if set(map(type, part)) != {int} or min(part) < _INT64_MIN or max(part) > _INT64_MAX:
            return None
    table = {key: DEFAULT_POOL if key == DEFAULT_POOL else key for key in set(zip(firsts, seconds))}
    if len(table) == 1:  # one pool for the whole trace, as in most runs
        return tuple(table.values()) * len(values)
    return tuple(map(table.__getitem__, zip(firsts, seconds)))


def _era_from_top_level(top: Mapping[str, Any], era: _Era) -> None:
    if "allocator_settings" in top:
        era.at_least(3, "allocator_settings")
    else:
        era.at_most(2, "no allocator_settings")
    if "external_annotations" in top:
        era.at_least(5, "external_annotations")
    elif "allocator_settings" in top:
        era.at_most(4, "no external_annotations")
    if "host_segments" in top or "host_traces" in top:
        era.at_least(14, "host_segments")


def _build_annotations(raw: Any, describe: str) -> tuple[Annotation, ...]:
    if raw is None:
        return ()
    if type(raw) is not list:
        raise _shape_error(describe, f"'external_annotations' is a {_type_name(raw)}, not a list")
    annotations = []
    for index, entry in enumerate(raw):
        if type(entry) is not dict:
            raise _shape_error(describe, f"annotation {index} is a {_type_name(entry)}, not a dict")
        name, stage = entry.get("name", ""), entry.get("stage", "")
        device, time_us = entry.get("device", 0), entry.get("time_us", 0)
        if type(name) is not str or type(stage) is not str:
            raise _shape_error(describe, f"annotation {index} has a name or stage that is not a str")
        if not (  # as _int checks them, without making its messages for each of thousands of annotations
            type(device) is int
            and type(time_us) is int
            and _INT64_MIN <= device <= _INT64_MAX
            and _INT64_MIN <= time_us <= _INT64_MAX
        ):
            _int(device, describe, f"annotation {index} 'device'")
            _int(time_us, describe, f"annotation {index} 'time_us'")
        annotations.append(Annotation(name, sys.intern(stage), device, time_us))
    return tuple(annotations)


def _build_allocator_settings(raw: Any, describe: str, era: _Era, notes: list[str]) -> AllocatorSettings | None:
    if raw is None:
        return None
    if type(raw) is not dict:
        raise _shape_error(describe, f"'allocator_settings' is a {_type_name(raw)}, not a dict")
    if "graph_capture_record_stream_reuse" in raw:
        era.at_least(9, "graph_capture_record_stream_reuse in allocator_settings")
    else:
        era.at_most(8, "no graph_capture_record_stream_reuse in allocator_settings")
    if "max_round_threshold" in raw or "max_cached_size" in raw:
        era.at_least(13, "max_round_threshold in allocator_settings")
    else:
        era.at_most(12, "no max_round_threshold in allocator_settings")
    # the entry's shape is checked here; its values are typed by the one reader of allocator settings
    _int(raw.get("max_split_size", -1), describe, "allocator_settings 'max_split_size'")
    gc_threshold = raw.get("garbage_collection_threshold", 0.0)
    if type(gc_threshold) is int:
        _int(gc_threshold, describe, "allocator_settings 'garbage_collection_threshold'")
    elif type(gc_threshold) is not float:
        raise _shape_error(describe, "allocator_settings 'garbage_collection_threshold' is not a number")
    recorded = recorded_settings(raw)
    if recorded.conf_items_left_out:
        notes.append(ALLOC_CONF_ITEMS_LEFT_OUT_NOTE.format(items=plural(recorded.conf_items_left_out, "item")))
    extra = {k: v for k, v in raw.items() if k not in _NAMED_SETTINGS and type(k) is str}
    frozen_extra = freeze_builtins(extra)
    return AllocatorSettings(
        raw_conf=recorded.raw_conf,
        max_split_size=recorded.max_split_size,
        expandable_segments=recorded.expandable_segments,
        garbage_collection_threshold=recorded.garbage_collection_threshold,
        roundup_power2_divisions=recorded.roundup_power2_divisions,
        large_segment_size_bytes=recorded.large_segment_size_bytes,
        extra=frozen_extra if isinstance(frozen_extra, Mapping) else FrozenDict({}),
    )


ALLOC_CONF_ITEMS_LEFT_OUT_NOTE = (
    "the recorded PYTORCH_CUDA_ALLOC_CONF holds {items} torch 2.13 would refuse (malformed, out of "
    "range or an unknown key) and they were left out: the allocator's defaults stand for them"
)


class _Malformed(Exception):
    pass


# What a frozen value may cost when expanded (nodes, plus a node per 64 characters of string), with
# shared sub-objects counted each time they are referenced: whatever later formats or serialises
# the value (str(), JSON) does that expansion, and a 500-byte pickle of self-sharing lists expands
# to billions of nodes. oomdoctor's own metadata for a large model costs well under a million.
FREEZE_MAX_EXPANDED = 8_000_000


def freeze_builtins(value: Any) -> Any:
    """A read-only copy of plain data: dicts become FrozenDicts, lists tuples.

    Raises nothing: returns None when `value` holds anything but str-keyed dicts, lists, tuples,
    str, int, float, bool and None, is nested deeper than 32 levels, contains itself, holds an int
    outside 64 bits, or would expand (shared sub-objects counted at every reference) beyond
    FREEZE_MAX_EXPANDED. Shared sub-objects are frozen once (a pickle can share one list a million
    times).
    """
    try:
        frozen, _ = _freeze(value, 0, {})
        return frozen
    except (_Malformed, RecursionError):
        return None


def _freeze(value: Any, depth: int, done: dict[int, Any]) -> tuple[Any, int]:
    kind = type(value)
    if kind is str:
        return value, 1 + (len(value) >> 6)
    if kind is int:
        if not _INT64_MIN <= value <= _INT64_MAX:
            raise _Malformed
        return value, 1
    if kind in (float, bool, _NONE_TYPE):
        return value, 1
    if depth >= _FREEZE_MAX_DEPTH:
        raise _Malformed
    known = done.get(id(value), done)
    if known is not done:
        if known is None:  # still being frozen: the value contains itself
            raise _Malformed
        return known
    done[id(value)] = None
    cost = 1
    if kind is dict:
        frozen_items = {}
        for key, item in value.items():
            if type(key) is not str:
                raise _Malformed
            frozen_items[key], item_cost = _freeze(item, depth + 1, done)
            cost += item_cost + 1 + (len(key) >> 6)
        frozen: Any = FrozenDict(frozen_items)
    elif kind in (list, tuple):
        items = []
        for item in value:
            frozen_item, item_cost = _freeze(item, depth + 1, done)
            items.append(frozen_item)
            cost += item_cost
        frozen = tuple(items)
    else:
        raise _Malformed
    if cost > FREEZE_MAX_EXPANDED:
        raise _Malformed
    done[id(value)] = (frozen, cost)
    return frozen, cost


METADATA_DROPPED_NOTE = (
    "oomdoctor's metadata in this file is malformed (a value of the wrong kind, an int outside 64 bits, "
    "nesting too deep or too large) and was ignored: the file is read as a plain torch snapshot"
)


def _build_metadata(raw: Any, notes: list[str]) -> Mapping[str, Any] | None:
    if raw is None:
        return None
    frozen = freeze_builtins(raw) if type(raw) is dict else None
    if not isinstance(frozen, Mapping):
        notes.append(METADATA_DROPPED_NOTE)
        return None
    return frozen


__all__ = ["build_snapshot", "freeze_builtins"]
