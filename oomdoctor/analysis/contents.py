"""What a snapshot file holds, counted: segments, blocks and bytes, trace events, OOM events, stacks,
settings and metadata, over all devices and per device (what `oomdoctor info` shows).

    contents = describe(snapshot, "dump.pickle")
    contents.totals.reserved_bytes, contents.devices[0].actions, contents.ooms, contents.stack_kinds

Byte totals follow torch's own accounting (`torch.cuda._memory_viz.segsum`, spec §1.10):

    reserved_bytes   = Σ segment total_size                     (segsum total_reserved)
    allocated_bytes  = Σ size of active_allocated blocks        (memory_stats allocated_bytes)
    requested_bytes  = Σ requested_size of those blocks         (segsum total_allocated)
    rounding_bytes   = allocated_bytes − requested_bytes        (free inside allocated blocks)
    free_bytes       = reserved_bytes − allocated_bytes         (cached, not allocated)
    active_bytes     = allocated + active_pending_free blocks   (memory_stats active_bytes)

so segsum's total_free, which counts rounding inside allocated blocks as free, is
free_bytes + rounding_bytes. A pure function of the snapshot; oomdoctor.views.info renders it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from oomdoctor.model import ACTIVE_ALLOCATED, INACTIVE, OOM, AllocatorSettings, Segment, Snapshot, Stack

_STACK_SAMPLE_EVENTS = 256
# the fields of oomdoctor's metadata key that `info` shows, when they are scalars
METADATA_FIELDS = ("schema_version", "reason", "host", "pid", "rank", "world_size")


@dataclass(frozen=True, slots=True)
class ByteTotals:
    segments: int
    blocks: int
    reserved_bytes: int
    allocated_bytes: int
    requested_bytes: int
    active_bytes: int

    @property
    def rounding_bytes(self) -> int:
        return self.allocated_bytes - self.requested_bytes

    @property
    def free_bytes(self) -> int:
        return self.reserved_bytes - self.allocated_bytes


@dataclass(frozen=True, slots=True)
class DeviceContents:
    device: int
    totals: ByteTotals
    trace_events: int
    actions: tuple[tuple[str, int], ...]  # (action, events) by action name
    events_with_stacks: int
    first_time_us: int | None
    last_time_us: int | None


@dataclass(frozen=True, slots=True)
class OomEvent:
    """An `oom` event of a device's trace, as recorded."""

    device: int
    event_index: int
    request_bytes: int
    device_free_bytes: int | None
    stream: int
    time_us: int | None


@dataclass(frozen=True, slots=True)
class MetadataSummary:
    """oomdoctor's metadata key: every key it has, and the METADATA_FIELDS that are scalars."""

    keys: tuple[str, ...]  # sorted
    fields: tuple[tuple[str, Any], ...]  # (name, str | int | float | bool) in METADATA_FIELDS order

    def get(self, name: str) -> Any:
        return dict(self.fields).get(name)


@dataclass(frozen=True, slots=True)
class Contents:
    file: str
    container: str
    format: str  # the snapshot's shape: dict | segment-list | legacy-history
    torch_version_hint: str | None
    era_hints: tuple[str, ...]
    torch_version: str | None  # as oomdoctor's metadata recorded it
    totals: ByteTotals
    trace_events: tuple[int, ...]  # events per recorded trace
    time_span_us: tuple[int, int] | None  # (first, last) clock reading over all devices
    stack_kinds: tuple[str, ...]  # "c++", "python": what the recorded stacks hold, sorted
    ooms: tuple[OomEvent, ...]
    annotations: int
    allocator_settings: AllocatorSettings | None
    metadata: MetadataSummary | None
    devices: tuple[DeviceContents, ...]

    @property
    def device_list(self) -> tuple[int, ...]:
        return tuple(row.device for row in self.devices)


def byte_totals(segments: list[Segment] | tuple[Segment, ...]) -> ByteTotals:
    reserved = allocated = requested = active = blocks = 0
    for segment in segments:
        reserved += segment.total_size
        blocks += len(segment.blocks)
        for block in segment.blocks:
            state = block.state
            if state == ACTIVE_ALLOCATED:
                allocated += block.size
                requested += block.requested_size
                active += block.size
            elif state != INACTIVE:
                active += block.size
    return ByteTotals(len(segments), blocks, reserved, allocated, requested, active)


def _stack_kind(stack: Stack, kinds: set[str]) -> None:
    for frame in stack:
        filename = frame.filename
        if filename.endswith(".py") or filename.startswith("<"):
            kinds.add("python")
        elif filename == "??" or "::" in frame.name or filename.endswith((".cpp", ".h", ".cc", ".cu", ".hpp", ".so")):
            kinds.add("c++")
        else:
            kinds.add("python")


def describe(snapshot: Snapshot, name: str) -> Contents:
    """What `snapshot` (shown as `name`) holds."""
    devices = []
    ooms = []
    stack_kinds: set[str] = set()
    first_times: list[int] = []
    last_times: list[int] = []
    # each stack once, however many segments, blocks and events share it
    stacks = {id(frames): frames for frames in snapshot.segment_stacks()}
    for device in snapshot.devices:
        part = snapshot.device(device)
        trace = part.trace
        count = len(trace)
        actions = dict(sorted(Counter(trace.actions).items())) if count else {}
        times = [t for t in trace.times_us if t is not None] if count and trace.times_us else []
        first_time = min(times) if times else None
        last_time = max(times) if times else None
        if first_time is not None and last_time is not None:
            first_times.append(first_time)
            last_times.append(last_time)
        if count:
            step = max(1, count // _STACK_SAMPLE_EVENTS)
            stacks.update((id(frames), frames) for frames in map(trace.frames_at, range(0, count, step)))
            if OOM in actions:
                for index, action in enumerate(trace.actions):
                    if action == OOM:
                        ooms.append(
                            OomEvent(
                                device=device,
                                event_index=index,
                                request_bytes=trace.sizes[index],
                                device_free_bytes=trace.device_free.get(index),
                                stream=trace.streams[index],
                                time_us=trace.times_us[index] if trace.times_us else None,
                            )
                        )
        devices.append(
            DeviceContents(
                device=device,
                totals=byte_totals(part.segments),
                trace_events=count,
                actions=tuple(actions.items()),
                events_with_stacks=trace.events_with_frames if count else 0,
                first_time_us=first_time,
                last_time_us=last_time,
            )
        )
    for stack in stacks.values():
        _stack_kind(stack, stack_kinds)
    return Contents(
        file=name,
        container=snapshot.container,
        format=snapshot.source_format,
        torch_version_hint=snapshot.torch_version_hint or None,
        era_hints=tuple(snapshot.era_hints),
        torch_version=_recorded_torch_version(snapshot),
        totals=byte_totals(snapshot.segments),
        trace_events=tuple(len(t) for t in snapshot.traces),
        time_span_us=(min(first_times), max(last_times)) if first_times else None,
        stack_kinds=tuple(sorted(stack_kinds)),
        ooms=tuple(ooms),
        annotations=len(snapshot.annotations),
        allocator_settings=snapshot.allocator_settings,
        metadata=_metadata_summary(snapshot),
        devices=tuple(devices),
    )


def _recorded_torch_version(snapshot: Snapshot) -> str | None:
    meta = snapshot.oomdoctor_raw  # the key as written: info shows what the file holds
    versions = meta.get("versions") if meta else None
    version = versions.get("torch") if isinstance(versions, Mapping) else None
    return version if isinstance(version, str) else None


def _metadata_summary(snapshot: Snapshot) -> MetadataSummary | None:
    meta = snapshot.oomdoctor_raw
    if meta is None:
        return None
    fields = []
    for key in METADATA_FIELDS:
        value = meta.get(key)
        if isinstance(value, (str, int, float, bool)):
            fields.append((key, value))
    return MetadataSummary(tuple(sorted(meta)), tuple(fields))
