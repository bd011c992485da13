"""The typed, immutable picture of a snapshot.

Only `oomdoctor.load` builds these objects and only it knows torch's raw key names and legacy
shapes; everything downstream (analysis, views) reads attributes of the classes below. Sizes are
int bytes. Frames are shared objects, as in torch's own snapshots: a million events that share a
stack hold a million references to one tuple of `Frame`s, not a million copies.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

# Block states as torch emits them; the loader maps the documented alias
# `active_awaiting_free` onto ACTIVE_PENDING_FREE.
ACTIVE_ALLOCATED = "active_allocated"
ACTIVE_PENDING_FREE = "active_pending_free"
INACTIVE = "inactive"

# Trace actions (spec §1.6).
ALLOC = "alloc"
FREE_REQUESTED = "free_requested"
FREE_COMPLETED = "free_completed"
SEGMENT_ALLOC = "segment_alloc"
SEGMENT_FREE = "segment_free"
SEGMENT_MAP = "segment_map"
SEGMENT_UNMAP = "segment_unmap"
SNAPSHOT = "snapshot"
OOM = "oom"
ANNOTATE = "annotate"

DEFAULT_POOL: tuple[int, int] = (0, 0)


@dataclass(frozen=True, slots=True)
class Frame:
    filename: str
    line: int
    name: str


Stack = tuple[Frame, ...]  # innermost frame first, as torch writes it
NO_STACK: Stack = ()


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


@dataclass(frozen=True, slots=True)
class Annotation:
    """A `record_function` START/END from `external_annotations` (torch 2.5+)."""

    name: str
    stage: str  # "START" or "END"
    device: int
    time_us: int


@dataclass(frozen=True, slots=True)
class AllocatorSettings:
    raw_conf: str = ""
    max_split_size: int = -1  # -1: unlimited
    expandable_segments: bool = False
    garbage_collection_threshold: float = 0.0
    roundup_power2_divisions: tuple[tuple[int, int], ...] = ()  # (MiB lower bound, divisions)
    extra: Mapping[str, Any] = field(default_factory=dict)  # every other key, untouched


@dataclass(frozen=True, slots=True)
class Snapshot:
    segments: tuple[Segment, ...]
    traces: tuple[Sequence[TraceEvent], ...]  # index = device ordinal, oldest event first
    allocator_settings: AllocatorSettings | None = None  # None: not recorded (torch < 2.3)
    annotations: tuple[Annotation, ...] = ()
    oomdoctor: Mapping[str, Any] | None = None  # oomdoctor's own metadata key (DESIGN §4)
    source_format: str = "dict"  # dict | segment-list | legacy-history | json | html | ...
    era_hints: tuple[str, ...] = ()  # e.g. "torch>=2.2 (time_us)", from the keys present

    @property
    def devices(self) -> tuple[int, ...]:
        found = {s.device for s in self.segments}
        found.update(i for i, t in enumerate(self.traces) if len(t))
        return tuple(sorted(found))

    def segments_on(self, device: int) -> tuple[Segment, ...]:
        return tuple(s for s in self.segments if s.device == device)
