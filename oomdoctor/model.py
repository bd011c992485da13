"""The typed, immutable picture of a snapshot.

Only `oomdoctor.load` builds these objects and only it knows torch's raw key names and legacy
shapes; everything downstream (analysis, views) reads attributes of the classes below. Sizes are
int bytes. Frames are shared objects, as in torch's own snapshots: a million events that share a
stack hold references to one tuple of `Frame`s, not a million copies.

A device's trace (`Snapshot.traces[d]`, a `DeviceTrace`) is stored as columns, one tuple per field,
because a real trace has up to millions of events and one object per event would cost more than
reading the file. It is still a `Sequence[TraceEvent]`: indexing or iterating builds `TraceEvent`
objects on the fly (about a microsecond each). The fastest way over a whole trace is the columns:

    trace = snapshot.traces[device]
    for index, (action, addr, size) in enumerate(zip(trace.actions, trace.addrs, trace.sizes)):
        if action == ALLOC:  # actions are interned, so this compares identical objects
            ...
    stack = trace.frames_at(index)  # only where a stack is needed; converted once, then shared

`actions`, `addrs`, `sizes`, `streams` always have one entry per event; `times_us`,
`compile_contexts`, `user_metadata` and `pool_ids` are None when the file has no such field
(older torch), and `device_free` maps the index of each `oom` event to its free bytes.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Iterator, Mapping, MutableSequence, Sequence
from dataclasses import dataclass, field
from itertools import compress, count, islice, repeat
from typing import TYPE_CHECKING, Any, TypeVar, overload

from oomdoctor.allocator_rules import LARGE_SEGMENT_BYTES
from oomdoctor.records import pickled_by_fields
from oomdoctor.vocabulary import Action, BlockState

if TYPE_CHECKING:
    from oomdoctor.dump_metadata import DumpMetadata

# Block states as torch emits them (plain-string aliases of oomdoctor.vocabulary, where they are
# defined); the loader maps the documented alias `active_awaiting_free` onto ACTIVE_PENDING_FREE.
ACTIVE_ALLOCATED = BlockState.ACTIVE_ALLOCATED.value
ACTIVE_PENDING_FREE = BlockState.ACTIVE_PENDING_FREE.value
INACTIVE = BlockState.INACTIVE.value

# Trace actions (spec §1.6).
ALLOC = Action.ALLOC.value
FREE_REQUESTED = Action.FREE_REQUESTED.value
FREE_COMPLETED = Action.FREE_COMPLETED.value
SEGMENT_ALLOC = Action.SEGMENT_ALLOC.value
SEGMENT_FREE = Action.SEGMENT_FREE.value
SEGMENT_MAP = Action.SEGMENT_MAP.value
SEGMENT_UNMAP = Action.SEGMENT_UNMAP.value
SNAPSHOT = Action.SNAPSHOT.value
OOM = Action.OOM.value
ANNOTATE = Action.ANNOTATE.value

DEFAULT_POOL: tuple[int, int] = (0, 0)


class FrozenDict(dict):  # type: ignore[type-arg]
    """A dict that refuses changes: read-only plain data (oomdoctor's metadata key, settings).

    Still a dict for isinstance checks, json and orjson, and it pickles; `dict(d)` is a mutable copy.
    """

    __slots__ = ()

    def _read_only(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("this mapping is read-only; dict(it) gives a mutable copy")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = __ior__ = _read_only  # type: ignore[assignment]

    def __reduce__(self) -> tuple[Any, ...]:
        return (FrozenDict, (dict(self),))

    def __repr__(self) -> str:
        return f"FrozenDict({dict.__repr__(self)})"


def slashed(path: str) -> str:
    """A file path with forward slashes. Windows writes its paths with backslashes; every match of a
    file against a known path (torch's own, a library's, a module's) reads it this way."""
    return path.replace("\\", "/")


@dataclass(frozen=True, slots=True)
class Frame:
    filename: str
    line: int
    name: str
    # the frame's file with forward slashes (`slashed`), what every rule matches: made once, since
    # the loader makes one Frame per distinct frame and the rules read it in every stack that has it
    path: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", slashed(self.filename))


Stack = tuple[Frame, ...]  # innermost frame first, as torch writes it
NO_STACK: Stack = ()
# A stack is keyed by its frames' identities for each event or block that refers to its list. For
# lists of up to this many frames (on average, for a trace's events) that costs little; longer ones
# are keyed once a list, however many refer to it: a pickle can share one deep list among a million
# events, where torch gives each event its own.
KEYED_PER_REFERENCE_FRAMES = 64


@dataclass(frozen=True, slots=True)
class Block:
    address: int
    size: int
    requested_size: int  # meaningful only while active; stale or 0 on inactive blocks
    state: str
    frames: Stack = NO_STACK

    @property
    def is_allocated(self) -> bool:
        return self.state == ACTIVE_ALLOCATED

    @property
    def is_active(self) -> bool:
        return self.state != INACTIVE


@dataclass(frozen=True, slots=True)
class Segment:
    device: int
    address: int
    total_size: int
    stream: int
    segment_type: str  # "small" or "large"
    blocks: tuple[Block, ...]
    pool_id: tuple[int, int] = DEFAULT_POOL
    is_expandable: bool = False
    frames: Stack = NO_STACK

    @property
    def allocated_bytes(self) -> int:
        return sum(b.size for b in self.blocks if b.state == ACTIVE_ALLOCATED)

    @property
    def active_bytes(self) -> int:
        return sum(b.size for b in self.blocks if b.state != INACTIVE)

    @property
    def requested_bytes(self) -> int:
        return sum(b.requested_size for b in self.blocks if b.state == ACTIVE_ALLOCATED)

    @property
    def free_bytes(self) -> int:
        return sum(b.size for b in self.blocks if b.state == INACTIVE)

    @property
    def pending_free_bytes(self) -> int:
        """Freed by their tensor but waiting for other streams' work (active_pending_free)."""
        return sum(b.size for b in self.blocks if b.state == ACTIVE_PENDING_FREE)


@dataclass(frozen=True, slots=True)
class TraceEvent:
    action: str
    addr: int  # 0 for `oom` events, which carry device_free instead
    size: int  # requested bytes for alloc/free_*, segment bytes for segment_*, rounded for oom
    stream: int = 0
    frames: Stack = NO_STACK  # NO_STACK when torch recorded none
    time_us: int | None = None  # absent before torch 2.2
    device_free: int | None = None  # `oom` only
    compile_context: str | None = None
    user_metadata: str | None = None
    pool_id: tuple[int, int] | None = None


_Indices = TypeVar("_Indices", bound="MutableSequence[int]")


def indices_of(values: tuple[Any, ...], wanted: Any, found: _Indices) -> _Indices:
    """`found` with the indices of `values` equal to `wanted` appended, in order: found by
    tuple.index, which compares in C without a call per value."""
    find = values.index
    index = -1
    try:
        while True:
            index = find(wanted, index + 1)
            found.append(index)
    except ValueError:
        return found


class DeviceTrace(Sequence[TraceEvent]):
    """One device's trace events, oldest first, held as columns (see the module docstring).

    Built by the loader; treat every attribute as read-only. `frames_at(i)` converts the raw stack
    of event i on first use and shares the result with every other event that has the same frames.
    """

    __slots__ = (
        "device",
        "actions",
        "addrs",
        "sizes",
        "streams",
        "times_us",
        "compile_contexts",
        "user_metadata",
        "pool_ids",
        "device_free",
        "forward_frames",
        "_raw_stacks",
        "_stack_of",
        "_stack_numbers",
        "_numbering",
        "_stack_by_number",
        "_next_number",
        "_positions",
        "_stacks_of_positions",
        "_times_or_zero",
    )

    def __init__(
        self,
        device: int,
        actions: tuple[str, ...],
        addrs: tuple[int, ...],
        sizes: tuple[int, ...],
        streams: tuple[int, ...],
        times_us: tuple[int | None, ...] | None = None,
        compile_contexts: tuple[str | None, ...] | None = None,
        user_metadata: tuple[str | None, ...] | None = None,
        pool_ids: tuple[tuple[int, int] | None, ...] | None = None,
        device_free: Mapping[int, int] | None = None,
        forward_frames: Mapping[int, tuple[str, ...]] | None = None,
        raw_stacks: Sequence[Any] | None = None,
        stack_of: Callable[[Any], Stack] | None = None,
        times_complete: bool = False,
    ) -> None:
        self.device = device
        self.actions = actions
        self.addrs = addrs
        self.sizes = sizes
        self.streams = streams
        self.times_us = times_us
        self.compile_contexts = compile_contexts
        self.user_metadata = user_metadata
        self.pool_ids = pool_ids
        self.device_free = device_free if device_free is not None else FrozenDict()
        self.forward_frames = forward_frames if forward_frames is not None else FrozenDict()
        self._raw_stacks = raw_stacks
        self._stack_of = stack_of
        self._stack_numbers: array[int] | None = None  # each event's stack number, -1: not yet
        self._numbering: dict[tuple[int, ...], int] = {}  # a stack's frame identities -> its number
        self._stack_by_number: dict[int, Stack] = {}
        self._next_number = 0
        self._positions: dict[str, array[int]] = {}  # action -> the indices of its events
        # action -> stacks_at(positions(action)), asked for again and again (the allocations')
        self._stacks_of_positions: dict[str, tuple[list[int], dict[int, Stack]]] = {}
        # times_us with 0 for an event without a time; the loader says when every event has one
        self._times_or_zero: Sequence[int] | None = times_us if times_complete else None  # type: ignore[assignment]

    @classmethod
    def from_events(cls, device: int, events: Sequence[TraceEvent]) -> DeviceTrace:
        """A trace from ready-made events (tests, synthetic data); the loader builds columns directly."""
        events = tuple(events)
        stacks = tuple(e.frames for e in events)

        def optional(values: tuple[Any, ...]) -> tuple[Any, ...] | None:
            return values if any(v is not None for v in values) else None

        return cls(
            device=device,
            actions=tuple(e.action for e in events),
            addrs=tuple(e.addr for e in events),
            sizes=tuple(e.size for e in events),
            streams=tuple(e.stream for e in events),
            times_us=optional(tuple(e.time_us for e in events)),
            compile_contexts=optional(tuple(e.compile_context for e in events)),
            user_metadata=optional(tuple(e.user_metadata for e in events)),
            pool_ids=optional(tuple(e.pool_id for e in events)),
            device_free=FrozenDict({i: e.device_free for i, e in enumerate(events) if e.device_free is not None}),
            raw_stacks=stacks,
            stack_of=_identity_stack,
        )

    def __len__(self) -> int:
        return len(self.actions)

    def times_or_zero(self) -> Sequence[int]:
        """The events' times with 0 for an event without one (what bisecting by time reads), made
        once; empty without times."""
        known = self._times_or_zero
        if known is not None:
            return known
        times = self.times_us or ()
        found: Sequence[int] = [t if t is not None else 0 for t in times] if None in times else times  # type: ignore[assignment]
        self._times_or_zero = found
        return found

    def positions(self, action: str) -> array[int]:
        """The indices of the events of `action`, in order (found once per action, then shared: do
        not change them). Found by tuple.index, which compares in C without a call per event, and
        kept as 8-byte integers."""
        found = self._positions.get(action)
        if found is None:
            found = self._positions[action] = indices_of(self.actions, action, array("q"))
        return found

    def positions_in(self, action: str, first: int, stop: int, limit: int | None = None) -> Sequence[int]:
        """The indices i of the events of `action` with first <= i < stop, in order (the first
        `limit` of them): looked up when `positions(action)` was asked for, else found in the range."""
        found = self._positions.get(action)
        if found is not None:
            start = bisect_left(found, first)
            end = bisect_left(found, stop)
            return found[start : end if limit is None else min(end, start + limit)]
        first = max(first, 0)
        matches = compress(range(first, stop), map(action.__eq__, self.actions[first:stop]))
        return list(matches if limit is None else islice(matches, limit))

    def frames_at(self, index: int) -> Stack:
        """The stack of event `index` (innermost frame first), or NO_STACK when none was recorded."""
        if self._raw_stacks is None:
            return NO_STACK
        raw = self._raw_stacks[index]
        if not raw:
            return NO_STACK
        return self._stack_of(raw)  # type: ignore[misc]

    def stacks_at(self, indices: Sequence[int]) -> tuple[list[int], dict[int, Stack]]:
        """The stacks of the events `indices`, each distinct one converted once: a number per event
        and the stack of each number (equal numbers, equal stacks). Events that share their frame
        objects, as torch's share them, share a number, and an event keeps its number from call to
        call (it is remembered in one integer array); the per-event work is done in C. For the
        events of one action (`positions(action)` itself) the answer is made once and shared: do not
        change it."""
        if self._raw_stacks is None:
            return [0] * len(indices), {0: NO_STACK}
        for action, found in self._positions.items():
            if indices is found:
                shared = self._stacks_of_positions.get(action)
                if shared is None:
                    shared = self._stacks_of_positions[action] = self._stacks_at(indices)
                return shared
        return self._stacks_at(indices)

    def _stacks_at(self, indices: Sequence[int]) -> tuple[list[int], dict[int, Stack]]:
        assert self._raw_stacks is not None
        known = self._stack_numbers
        if known is None:  # the first call: none numbered yet
            known = self._stack_numbers = array("q", [-1]) * len(self._raw_stacks)
            numbers = self._number_stacks(indices)
            deque(map(known.__setitem__, indices, numbers), maxlen=0)
        else:
            numbers = list(map(known.__getitem__, indices))
            if numbers and max(numbers) < 0:  # none of these numbered yet
                numbers = self._number_stacks(indices)
                deque(map(known.__setitem__, indices, numbers), maxlen=0)
            elif numbers and min(numbers) < 0:
                missing = list(compress(indices, map((-1).__eq__, numbers)))
                deque(map(known.__setitem__, missing, self._number_stacks(missing)), maxlen=0)
                numbers = list(map(known.__getitem__, indices))
        stack_of = self._stack_by_number
        return numbers, {number: stack_of[number] for number in set(numbers)}

    def _number_stacks(self, indices: Sequence[int]) -> list[int]:
        """New or known numbers for the stacks of `indices` (none numbered yet)."""
        assert self._raw_stacks is not None
        raws = list(map(self._raw_stacks.__getitem__, indices))
        kinds = set(map(type, raws))
        if type(None) in kinds:  # events without frames (older torch): no stack
            raws = [raw if raw is not None else () for raw in raws]
            kinds.discard(type(None))
            kinds.add(tuple)
        base = self._next_number
        odd = not kinds.issubset((list, tuple))
        sources = raws  # a number new in this call is base + the position in here where its stack first occurs
        if odd:  # something odd where a frame list belongs (frames_at makes it no stack): one number each
            numbers = list(range(base, base + len(raws)))
        elif sum(map(len, raws)) <= KEYED_PER_REFERENCE_FRAMES * len(raws):
            # a stack's key is the identities of its frames; a new key is numbered by where it first occurs
            numbering = self._numbering
            numbers = list(map(numbering.setdefault, map(tuple, map(map, repeat(id), raws)), count(base)))
        else:
            # deep stacks, or frame lists a pickle shares among many events (torch gives each event
            # its own): the key is made once a list, the work bounded by what the file holds
            ids = list(map(id, raws))
            by_id = dict(zip(ids, raws))  # each list once, in the order of its first event
            sources = list(by_id.values())
            keys = map(tuple, map(map, repeat(id), sources))
            number_of = dict(zip(by_id, map(self._numbering.setdefault, keys, count(base))))
            numbers = list(map(number_of.__getitem__, ids))
        self._next_number = base + len(raws)
        stack_of = self._stack_by_number
        for number in sorted(number for number in set(numbers) if number >= base):
            raw = sources[number - base]
            stack_of[number] = self._stack_of(raw) if raw else NO_STACK  # type: ignore[misc]  # as frames_at
        if odd and len(set(indices)) < len(indices):  # an event asked twice keeps the last number given
            last = dict(zip(indices, numbers))
            numbers = list(map(last.__getitem__, indices))
        return numbers

    def has_frames_at(self, index: int) -> bool:
        return self._raw_stacks is not None and bool(self._raw_stacks[index])

    def with_frames(self, indices: Sequence[int]) -> list[int]:
        """Those of `indices` whose events carry a non-empty stack, in order (`has_frames_at` of
        each, picked in C)."""
        if self._raw_stacks is None:
            return []
        return list(compress(indices, map(bool, map(self._raw_stacks.__getitem__, indices))))

    @property
    def any_frames(self) -> bool:
        """Whether any event carries a non-empty stack (stops at the first that does)."""
        return self._raw_stacks is not None and any(self._raw_stacks)

    @property
    def events_with_frames(self) -> int:
        """How many events carry a non-empty stack (cheap: nothing is converted)."""
        if self._raw_stacks is None:
            return 0
        return sum(map(bool, self._raw_stacks))

    def _event(self, i: int) -> TraceEvent:
        return TraceEvent(
            self.actions[i],
            self.addrs[i],
            self.sizes[i],
            self.streams[i],
            self.frames_at(i),
            None if self.times_us is None else self.times_us[i],
            self.device_free.get(i),
            None if self.compile_contexts is None else self.compile_contexts[i],
            None if self.user_metadata is None else self.user_metadata[i],
            None if self.pool_ids is None else self.pool_ids[i],
        )

    @overload
    def __getitem__(self, index: int) -> TraceEvent: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[TraceEvent, ...]: ...

    def __getitem__(self, index: int | slice) -> TraceEvent | tuple[TraceEvent, ...]:
        if isinstance(index, slice):
            return tuple(self._event(i) for i in range(*index.indices(len(self))))
        count = len(self.actions)
        if index < 0:
            index += count
        if not 0 <= index < count:
            raise IndexError("trace event index out of range")
        return self._event(index)

    def __iter__(self) -> Iterator[TraceEvent]:
        event = self._event
        return (event(i) for i in range(len(self.actions)))

    def __repr__(self) -> str:
        return f"DeviceTrace(device={self.device}, events={len(self)})"


def _identity_stack(stack: Stack) -> Stack:
    return stack


@dataclass(frozen=True, slots=True)
class Device:
    """One device's part of a snapshot (`Snapshot.device(index)`): its segments and its trace."""

    index: int
    segments: tuple[Segment, ...]  # in address order, as torch lists them
    trace: DeviceTrace

    @property
    def reserved_bytes(self) -> int:
        return sum(s.total_size for s in self.segments)

    @property
    def allocated_bytes(self) -> int:
        return sum(s.allocated_bytes for s in self.segments)

    @property
    def requested_bytes(self) -> int:
        return sum(s.requested_bytes for s in self.segments)

    @property
    def active_bytes(self) -> int:
        return sum(s.active_bytes for s in self.segments)


@dataclass(frozen=True, slots=True)
class Annotation:
    """A `record_function` START/END from `external_annotations` (torch 2.5+)."""

    name: str
    stage: str  # "START" or "END"
    device: int
    time_us: int


@dataclass(frozen=True, slots=True)
class AllocatorSettings:
    """The allocator's settings a snapshot records, typed by the loader with
    `allocator_rules.recorded_settings`: analysis reads these fields, never the conf string."""

    raw_conf: str = ""  # PYTORCH_CUDA_ALLOC_CONF as recorded: for showing, not for parsing past load
    max_split_size: int = -1  # -1: unlimited
    expandable_segments: bool = False
    garbage_collection_threshold: float = 0.0
    roundup_power2_divisions: tuple[tuple[int, int], ...] = ()  # (MiB lower bound, divisions), by bound
    large_segment_size_bytes: int = LARGE_SEGMENT_BYTES  # large_segment_size_mb from the conf (torch 2.11+)
    extra: Mapping[str, Any] = field(default_factory=FrozenDict)  # every other key, read-only

    @property
    def rounding_divisions(self) -> tuple[tuple[int, int], ...]:
        """The roundup_power2_divisions table for request rounding; () when no interval rounds."""
        table = self.roundup_power2_divisions
        return () if all(count <= 1 for _, count in table) else table


@dataclass(frozen=True, slots=True)
class Snapshot:
    segments: tuple[Segment, ...]
    traces: tuple[DeviceTrace, ...]  # index = device ordinal, oldest event first
    allocator_settings: AllocatorSettings | None = None  # None: not recorded (torch < 2.3)
    annotations: tuple[Annotation, ...] = ()
    # the file has the `external_annotations` key (torch >= 2.5): no optimizer annotation among them
    # says something; without the key (older torch, a bare segment list) it says nothing
    annotations_recorded: bool = True
    # oomdoctor's own metadata key (DESIGN §4, oomdoctor/metadata.py), typed and validated by the
    # loader (oomdoctor/dump_metadata.py); None for plain torch dumps or when it is malformed
    oomdoctor: DumpMetadata | None = None
    # the same key as written, as read-only plain data (dicts are FrozenDicts, lists tuples), for
    # what needs it as written (info, redact); None exactly when `oomdoctor` is None
    oomdoctor_raw: Mapping[str, Any] | None = None
    source_format: str = "dict"  # shape: dict | segment-list | legacy-history (torch 2.0 blocks)
    era_hints: tuple[str, ...] = ()  # e.g. "time_us on trace events: torch >= 2.2", from the keys
    container: str = "pickle"  # how the bytes held it: pickle-protocol-N, gzip, json, html (memory_viz)
    torch_version_hint: str = ""  # e.g. "2.8 to 2.9", ">= 2.10", from the keys present; "" unknown
    notes: tuple[str, ...] = ()  # what the loader dropped as untrustworthy, one sentence each
    # whether each segment is expandable is known: every segment carries `is_expandable` (torch >=
    # 2.1), a False there written, not defaulted; or torch 2.0 wrote them (`legacy-history`), which
    # had no expandable segments
    expandable_recorded: bool = False

    @property
    def devices(self) -> tuple[int, ...]:
        found = {s.device for s in self.segments}
        found.update(i for i, t in enumerate(self.traces) if len(t))
        return tuple(sorted(found))

    def segments_on(self, device: int) -> tuple[Segment, ...]:
        return tuple(s for s in self.segments if s.device == device)

    def segment_stacks(self) -> list[Stack]:
        """The stacks of the segments and their blocks, each once however many hold it (the loader
        gives a stack one tuple wherever it recurs), empty ones included."""
        stacks: dict[int, Stack] = {}
        for segment in self.segments:
            stacks[id(segment.frames)] = segment.frames
            stacks.update((id(block.frames), block.frames) for block in segment.blocks)
        return list(stacks.values())

    def device(self, index: int) -> Device:
        return Device(index, self.segments_on(index), self.trace_of(index))

    def trace_of(self, device: int) -> DeviceTrace:
        """The trace of `device`; an empty one when the file has none for it (segment lists)."""
        if 0 <= device < len(self.traces):
            return self.traces[device]
        return DeviceTrace(device, (), (), (), ())


pickled_by_fields(globals())  # sent from a folder's worker processes to their parent: each class pickles fast
