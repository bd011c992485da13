"""Reading one device of a snapshot, the steps every analysis of a device starts with.

`read_device` gathers what the dump holds for the device (its trace and segments, the allocator's
settings, oomdoctor's registry, the phases, the placement of memory from before the trace),
`replay` walks its trace once and `place` puts a live set's blocks in components. `analyse`
reads the judged device this way and `devices` each of its peers, so a peer's row says what
`analyse(snapshot, device=d)` would.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from oomdoctor.allocator_rules import UNLIMITED, read_alloc_conf, unsplit_remainder_at_most
from oomdoctor.analysis import attribution as _attribution
from oomdoctor.analysis.phases import PhaseIndex, build_spans, frame_windows, optimizer_annotation
from oomdoctor.analysis.replay import (
    LiveHistory,
    ReplayState,
    columns,
    final_live_blocks,
    ring_buffer_wrapped,
    unsized_remainders,
    walk,
)
from oomdoctor.analysis.results import LiveAllocation, LiveBlock, PhaseSpan
from oomdoctor.dump_metadata import DumpMetadata
from oomdoctor.metadata import COMPONENTS
from oomdoctor.model import DEFAULT_POOL, OOM, AllocatorSettings, Block, DeviceTrace, Segment, Snapshot


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
    # the first event of each step whose start no mark shows (`phases.build_spans`): the step before
    # it ends where this one first allocates
    inferred_step_starts: frozenset[int] = frozenset()
    # the first event of each pass counted in the step before it though it may be a step of its own
    # (`phases.build_spans`: no optimizer step shows, and the gradients stay alive across it)
    unsplit_passes: tuple[int, ...] = ()
    # the line of Module._apply's buffers' loop in the torch that wrote the dump, where its blocks
    # show it (`attribution.trace_buffer_line`; None with a registry, which names the buffers)
    buffer_line: int | None = None
    # the dump's live blocks by address (`replay.final_live_blocks` of `segments`), found once
    final_blocks: dict[int, Block] = field(default_factory=dict)


def read_device(snapshot: Snapshot, metadata: DumpMetadata, device: int) -> DeviceDump:
    """What the dump holds for `device`."""
    trace = columns(snapshot.traces[device] if 0 <= device < len(snapshot.traces) else ())
    inferred: set[int] = set()
    unsplit: set[int] = set()
    read_windows: list[list[tuple[int, int, str]]] = []  # frame_windows', where build_spans read them
    spans, phase_source = build_spans(
        trace,
        markers=metadata.markers,
        annotations=snapshot.annotations,
        device=device,
        inferred=inferred,
        read_windows=read_windows,
        unsplit=unsplit,
    )
    recording = metadata.recording
    segments = snapshot.segments_on(device)
    registry = _attribution.Registry(metadata, device)
    phase_index = PhaseIndex(spans)
    final_blocks = final_live_blocks(segments)
    buffer_line = (
        None
        if registry
        else _attribution.trace_buffer_line(
            trace, [(block.frames, block.requested_size or block.size) for block in final_blocks.values()]
        )
    )
    return DeviceDump(
        index=device,
        metadata=metadata,
        trace=trace,
        segments=segments,
        settings=snapshot.allocator_settings,
        registry=registry,
        pre_trace=_attribution.pre_trace_placements(trace, final_blocks, phase_index, registry, buffer_line),
        spans=spans,
        phase_source=phase_source,
        phase_index=phase_index,
        ring_buffer_wrapped=ring_buffer_wrapped(len(trace), recording.max_entries if recording is not None else None),
        expandable_recorded=snapshot.expandable_recorded,
        optimizer_annotated=any(optimizer_annotation(a.name) for a in snapshot.annotations)
        or bool(read_windows[0] if read_windows else frame_windows(trace)[0]),
        expandable_available=snapshot.source_format != "legacy-history",
        ran_out=any(len(columns(t).positions(OOM)) for t in snapshot.traces),
        inferred_step_starts=frozenset(inferred),
        unsplit_passes=tuple(sorted(unsplit)),
        buffer_line=buffer_line,
        final_blocks=final_blocks,
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
        final_blocks=dump.final_blocks,
    )


def peak_unsized(dump: DeviceDump, state: ReplayState) -> tuple[int, int, bool] | None:
    """(bytes, blocks, assumed): how much more than the peak torch's max_memory_allocated may be
    over the trace, for the unsplit remainders its blocks freed before the dump may have held
    (`replay.unsized_remainders`); by the allocator's recorded settings, else the defaults (no
    max_split_size, no roundup_power2_divisions), with expandable segments on only where the
    settings or the dump's segments say so. `assumed`: the settings are not recorded (torch < 2.3),
    so the bound holds for the defaults only: a max_split_size leaves up to 20 MiB unsplit in a
    large block, and roundup_power2_divisions rounds a request up further than the peak's rule
    counts. Where oomdoctor's metadata records torch's own peak (`recorded_peak`) within that
    bound, how much more it is, with no block left unsized (0) and nothing assumed. None without a
    peak."""
    settings = dump.settings
    if settings is not None:
        expandable = settings.expandable_segments
        max_split = settings.max_split_size if 0 < settings.max_split_size < UNLIMITED else None
        # 2.11+: max_non_split_rounding defaults to large_segment_size; the larger one bounds either way
        non_split = max(
            read_alloc_conf(settings.raw_conf).max_non_split_rounding_bytes, settings.large_segment_size_bytes
        )
        divisions = settings.rounding_divisions
    else:
        expandable, max_split, non_split, divisions = bool(expandable_from_segments(dump)), None, 0, ()

    def at_most(rounded: int) -> int:
        return unsplit_remainder_at_most(
            rounded, max_split_bytes=max_split, max_non_split_rounding_bytes=non_split, expandable=expandable
        )

    found = unsized_remainders(dump.trace, state.history, state.peak_index, at_most, divisions, state.large_events)
    recorded = recorded_peak(dump, state)
    peak = state.peak_allocated_bytes
    if found is not None and recorded is not None and peak <= recorded <= peak + found[0]:
        return recorded - peak, 0, False  # torch's own peak, as capture recorded it: nothing left unknown
    return None if found is None else (*found, settings is None)


def recorded_peak(dump: DeviceDump, state: ReplayState) -> int | None:
    """torch's own peak of allocated bytes over the trace, where oomdoctor's metadata records it
    (memory_stats at the dump, for this device) and the trace holds the whole run: nothing from
    before it is live or freed in it, and the ring buffer did not wrap. Else None."""
    metadata = dump.metadata
    stats = metadata.memory_stats
    if stats is None or stats.peak_allocated_bytes is None or dump.ring_buffer_wrapped:
        return None
    if metadata.device is None or metadata.device.index != dump.index:
        return None
    history = state.history
    if history.pre_existing_frees or state.pre_existing_completions:
        return None
    if any(address not in history.live_at_end for address in history.final_blocks):
        return None
    return stats.peak_allocated_bytes


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
        buffer_line=dump.buffer_line,
    )
