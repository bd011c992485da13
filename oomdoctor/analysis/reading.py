"""Reading one device of a snapshot, the steps every analysis of a device starts with.

`read_device` gathers what the dump holds for the device (its trace and segments, the allocator's
settings, oomdoctor's registry, the phases, the placement of memory from before the trace),
`replay` walks its trace once and `place` puts a live set's blocks in components. `analyse`
reads the judged device this way and `devices` each of its peers, so a peer's row says what
`analyse(snapshot, device=d)` would.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from oomdoctor.analysis import attribution as _attribution
from oomdoctor.analysis.phases import PhaseIndex, build_spans, frame_windows, optimizer_annotation
from oomdoctor.analysis.replay import LiveHistory, ReplayState, columns, final_live_blocks, ring_buffer_wrapped, walk
from oomdoctor.analysis.results import LiveAllocation, LiveBlock, PhaseSpan
from oomdoctor.dump_metadata import DumpMetadata
from oomdoctor.metadata import COMPONENTS
from oomdoctor.model import DEFAULT_POOL, OOM, AllocatorSettings, DeviceTrace, Segment, Snapshot


@dataclass(frozen=True, slots=True)
class DeviceDump:
    """What the dump says about one device: its trace and segments, the allocator's settings,
    oomdoctor's registry of named tensors and the phases its events fall in."""

    index: int
    metadata: DumpMetadata
    trace: DeviceTrace
    segments: tuple[Segment, ...]
    settings: AllocatorSettings | None
    registry: _attribution.Registry
    pre_trace: dict[int, tuple[int, str, float]]  # allocations from before the trace, placed
    spans: list[PhaseSpan]
    phase_source: str
    phase_index: PhaseIndex
    ring_buffer_wrapped: bool  # older events are lost
    expandable_recorded: bool  # the dump's segments say whether each is expandable (Snapshot's)
    # an optimizer's step or zero_grad shows: among the process's annotations, or (without them) by
    # the stacks of the frees it made (`phases.frame_windows`: a step that allocated nothing)
    optimizer_annotated: bool
    # the torch that wrote the dump has expandable segments (torch 2.0, `legacy-history`, has not)
    expandable_available: bool = True
    ran_out: bool = False  # an `oom` event on any device's trace: the dump may cut a call short
    annotations_recorded: bool = True  # the file has `external_annotations` (torch >= 2.5)


def read_device(snapshot: Snapshot, metadata: DumpMetadata, device: int) -> DeviceDump:
    """What the dump holds for `device`."""
    trace = columns(snapshot.traces[device] if 0 <= device < len(snapshot.traces) else ())
    spans, phase_source = build_spans(trace, markers=metadata.markers, annotations=snapshot.annotations, device=device)
    recording = metadata.recording
    segments = snapshot.segments_on(device)
    registry = _attribution.Registry(metadata, device)
    phase_index = PhaseIndex(spans)
    return DeviceDump(
        index=device,
        metadata=metadata,
        trace=trace,
        segments=segments,
        settings=snapshot.allocator_settings,
        registry=registry,
        pre_trace=_attribution.pre_trace_placements(trace, final_live_blocks(segments), phase_index, registry),
        spans=spans,
        phase_source=phase_source,
        phase_index=phase_index,
        ring_buffer_wrapped=ring_buffer_wrapped(len(trace), recording.max_entries if recording is not None else None),
        expandable_recorded=snapshot.expandable_recorded,
        optimizer_annotated=any(optimizer_annotation(a.name) for a in snapshot.annotations)
        or bool(frame_windows(trace)[0]),
        expandable_available=snapshot.source_format != "legacy-history",
        ran_out=any(len(columns(t).positions(OOM)) for t in snapshot.traces),
        annotations_recorded=snapshot.annotations_recorded,
    )


def expandable_from_segments(dump: DeviceDump) -> bool | None:
    """Whether expandable segments were on, by the dump's own segments (when the allocator's
    settings are not recorded): on when one is expandable; off when every segment says whether it
    is and a segment of the default pool is not (a private pool's may not be, whatever the
    setting); else unknown."""
    if any(s.is_expandable for s in dump.segments):
        return True
    if dump.expandable_recorded and any(s.pool_id == DEFAULT_POOL for s in dump.segments):
        return False
    return None


def replay(dump: DeviceDump, series_points: int) -> ReplayState:
    """One pass over the trace: the series by component, the peak, the OOMs, the steps and the
    history of the live set."""
    _, component_of_pre_existing = _attribution.series_classifier(dump.registry, dump.pre_trace)
    return walk(
        dump.trace,
        dump.segments,
        dump.spans,
        dump.registry.by_address if dump.registry else None,
        component_of_pre_existing,
        len(COMPONENTS),
        _attribution.ACTIVATIONS,
        dump.settings.rounding_divisions if dump.settings is not None else (),
        series_points,
        _attribution.PHASE_COMPONENT,
        # oomdoctor's registry names DDP's buckets and FSDP's parameters already: reading every
        # allocation's stack for them is the plain snapshot's work
        {} if dump.registry else _attribution.components_by_own_stacks(dump.trace),
    )


def place(dump: DeviceDump, history: LiveHistory, live: Sequence[LiveAllocation], index: int | None) -> list[LiveBlock]:
    """The blocks of `live` (the live set right after event `index`; None: the dump's) placed in
    components, largest first."""
    return _attribution.attribute(
        live,
        trace=dump.trace,
        frames_of={a: b.frames for a, b in history.final_blocks.items()},
        phases=dump.phase_index,
        registry=dump.registry,
        target_index=index,
        pre_trace=dump.pre_trace,
        ran_out=dump.ran_out,
    )
