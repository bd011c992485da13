"""Analysis: pure functions from a `Snapshot` to an `Analysis` result (DESIGN §5).

`analyse(snapshot)` judges one device (the failing one unless `device` is given): it replays the
trace back to the fatal OOM (or the peak), accounts for every byte there, measures fragmentation,
assigns each event a step and phase and each live byte a component, and picks a verdict with its
evidence, recommendations and a what-if for the batch size. No I/O, no printing.

    analysis = analyse(snapshot)
    analysis.verdict, analysis.confidence, analysis.summary, analysis.evidence
    analysis.component_bytes()              # {"parameters": ..., ...} at the OOM (or peak, or dump)
    analysis.accounting, analysis.fragmentation, analysis.what_if, analysis.recommendations
    analysis.what_if.fits_at(0.5)           # the model every "would fit on its own" agrees with
    analysis.replay.series                  # downsampled memory over time, by component
    analysis.phases                         # PhaseSpan runs covering every event, with their source
    analysis.live_blocks                    # every live block: component, method, confidence, frames

    replayer(snapshot, device).state_at(i)  # EventState after event i: live blocks, segment layout

The verdict set and each verdict's test are documented in docs/verdicts.md, with the requirement
(`recommendations.requirement`: shortfall at the OOM, projected model states, placement failures) that the
recommendations' "would fit on its own" and the what-if are both judged against.
"""

from __future__ import annotations

from collections.abc import Sequence

from oomdoctor.analysis import accounting as _accounting
from oomdoctor.analysis import attribution as _attribution
from oomdoctor.analysis.phases import PhaseIndex, build_spans
from oomdoctor.analysis.recommendations import recommend, requirement
from oomdoctor.analysis.replay import (
    columns,
    event_state,
    lay_out,
    ooms_of,
    ring_buffer_wrapped,
    segments_at,
    walk,
)
from oomdoctor.analysis.results import (
    PHASE_BETWEEN,
    PHASE_UNKNOWN,
    SOURCE_NONE,
    Analysis,
    EventState,
    ReplaySummary,
    StepSummary,
)
from oomdoctor.analysis.sizing import large_segment_bytes, roundup_divisions
from oomdoctor.analysis.timeline import Replayer
from oomdoctor.analysis.verdicts import Context, diagnose
from oomdoctor.analysis.whatif import request_scales, scalable_bytes, what_if
from oomdoctor.dump_metadata import NO_METADATA, DumpMetadata, Marker
from oomdoctor.metadata import COMPONENTS
from oomdoctor.model import ACTIVE_ALLOCATED, OOM, DeviceTrace, Snapshot
from oomdoctor.units import human_size

__all__ = ["analyse", "replayer", "Analysis", "Replayer", "RESULT_SCHEMA_VERSION"]

RESULT_SCHEMA_VERSION = 1


def _pick_device(snapshot: Snapshot, metadata: DumpMetadata) -> int:
    oom = metadata.oom
    if oom is not None and oom.device is not None and oom.device in snapshot.devices:
        return oom.device
    latest: tuple[int, int] | None = None
    for device, trace in enumerate(snapshot.traces):
        trace = columns(trace)
        if OOM not in trace.actions:
            continue
        index = len(trace.actions) - 1 - trace.actions[::-1].index(OOM)
        moment = trace.times_us[index] or 0 if trace.times_us is not None else 0
        if latest is None or moment > latest[0]:
            latest = (moment, device)
    if latest is not None:
        return latest[1]
    reserved: dict[int, int] = {}
    for segment in snapshot.segments:
        reserved[segment.device] = reserved.get(segment.device, 0) + segment.total_size
    if reserved:
        return max(reserved, key=reserved.get)
    devices = snapshot.devices
    return devices[0] if devices else 0


def _fatal_oom(trace: DeviceTrace, oom_indices: list[int], metadata: DumpMetadata) -> int | None:
    if not oom_indices:
        return None
    oom = metadata.oom
    times = trace.times_us
    if oom is not None and oom.time_us is not None and times is not None:
        wanted = oom.time_us
        return min(oom_indices, key=lambda i: (abs((times[i] or 0) - wanted), -i))
    return oom_indices[-1]


def _optimizer_kind(registry: _attribution.Registry, blocks) -> str | None:
    for _, name, _ in registry.by_address.values():
        if name.endswith("exp_avg") or name.endswith("exp_avg_sq"):
            return "adam"
        if name.endswith("momentum_buffer"):
            return "sgd"
    for block in blocks:
        for frame in block.frames:
            filename = frame.filename.replace("\\", "/")
            if "torch/optim/" in filename:
                if "adam" in filename:
                    return "adam"
                if "sgd" in filename:
                    return "sgd"
    return None


def replayer(snapshot: Snapshot, device: int) -> Replayer:
    """A `Replayer` for one device: `replayer(s, d).state_at(i)` is the state right after event i."""
    divisions = roundup_divisions(snapshot.allocator_settings)
    trace = snapshot.traces[device] if 0 <= device < len(snapshot.traces) else ()
    return Replayer(trace, snapshot.segments_on(device), divisions)


def analyse(snapshot: Snapshot, *, device: int | None = None, series_points: int = 480) -> Analysis:
    metadata = snapshot.oomdoctor if snapshot.oomdoctor is not None else NO_METADATA
    if device is None:
        device = _pick_device(snapshot, metadata)
    trace = columns(snapshot.traces[device] if 0 <= device < len(snapshot.traces) else ())
    segments = snapshot.segments_on(device)
    settings = snapshot.allocator_settings
    divisions = roundup_divisions(settings)
    unknowns: list[str] = []

    registry = _attribution.Registry(metadata, device)
    markers = metadata.markers
    spans, phase_source = build_spans(trace, markers=markers, annotations=snapshot.annotations, device=device)
    phase_index = PhaseIndex(spans)
    component_of_alloc, component_of_pre_existing = _attribution.series_classifier(registry)
    state = walk(
        trace,
        segments,
        spans,
        component_of_alloc if registry else None,
        component_of_pre_existing,
        len(COMPONENTS),
        _attribution.ACTIVATIONS,
        divisions,
        series_points,
        _attribution.PHASE_COMPONENT,
    )

    recording = metadata.recording
    wrapped = ring_buffer_wrapped(len(trace), recording.max_entries if recording is not None else None)
    fatal_index = _fatal_oom(trace, state.oom_indices, metadata)
    final_blocks = {b.address: b for s in segments for b in s.blocks if b.state == ACTIVE_ALLOCATED}
    reason = metadata.reason
    if fatal_index is not None:
        target_index, target_kind = fatal_index, "oom"
    elif (
        state.peak_index is not None
        and reason not in ("peak", "manual")
        and state.peak_allocated_bytes > sum(b.size for b in final_blocks.values())
    ):
        target_index, target_kind = state.peak_index, "peak"
    else:
        target_index, target_kind = None, "dump"

    after = len(trace) - 1 - target_index if target_index is not None else 0
    frames_of = {a: b.frames for a, b in final_blocks.items()}
    at_target, note = _state_at_target(trace, segments, state.history, target_index)
    layout = at_target.segments
    unknowns.extend(note)

    large_segment = large_segment_bytes(settings.raw_conf if settings is not None else None)
    oom_events = ooms_of(trace, state.oom_indices, fatal_index, large_segment)
    fatal = next((o for o in oom_events if o.fatal), None)
    device_total = _accounting.device_total(metadata)
    device_free = fatal.device_free_bytes if fatal is not None else None
    if device_free is None and fatal is not None and metadata.oom is not None:
        device_free = metadata.oom.device_free_bytes
    if device_free is None and target_index is None and metadata.mem_get_info is not None:
        device_free = metadata.mem_get_info.free_bytes
    if device_free is not None and device_total is not None:
        # Under set_per_process_memory_fraction torch reports the allowed bytes as the total but the
        # whole GPU's free memory: what PyTorch could still get is what the fraction leaves.
        device_free = min(device_free, max(0, device_total - sum(s.total_size for s in layout)))
    request = fatal.request_bytes if fatal is not None else None
    request_stream = trace.streams[fatal.event_index] if fatal is not None else None
    fragmentation = _accounting.fragmentation_of(
        layout, request_bytes=request, request_stream=request_stream, settings=settings, device_free_bytes=device_free
    )
    accounting = _accounting.account(
        layout,
        request_bytes=request,
        device_free_bytes=device_free,
        device_total_bytes=device_total,
        request_stream=request_stream,
        fragmentation=fragmentation,
        large_segment=large_segment,
    )

    blocks = _attribution.attribute(
        at_target.live,
        trace=trace,
        frames_of=frames_of,
        phases=phase_index,
        registry=registry,
        target_index=target_index,
    )
    shares = _attribution.shares(blocks)
    components = {s.name: s.bytes for s in shares}

    if target_index is not None:
        target_span = phase_index.span_of(target_index)
    else:
        target_span = spans[-1] if spans else None
    target_phase = target_span.phase if target_span is not None else PHASE_UNKNOWN
    target_step = target_span.step if target_span is not None and phase_source != SOURCE_NONE else None
    if target_index is None and markers:
        target_phase, target_step = _phase_after_markers(markers, target_phase, target_step)

    steps = (
        tuple(
            StepSummary(
                step,
                s.first_index,
                s.last_index,
                s.peak_allocated_bytes,
                s.end_allocated_bytes,
                s.peak_activation_bytes,
            )
            for step, s in sorted(state.steps.items())
        )
        if phase_source != SOURCE_NONE
        else ()
    )

    capacity = None
    if device_free is not None:
        capacity = accounting.reserved_bytes + device_free
    elif device_total is not None:
        capacity = device_total

    ctx = Context(
        oom=fatal,
        accounting=accounting,
        fragmentation=fragmentation,
        components=components,
        live_blocks=blocks,
        phases=spans,
        phase_source=phase_source,
        target_phase=target_phase,
        target_step=target_step,
        target_index=target_index,
        steps=steps,
        optimizer_kind=_optimizer_kind(registry, blocks),
        exact=bool(registry),
        expandable_on=fragmentation.expandable_segments,
        capacity_bytes=capacity,
        large_segment_bytes=large_segment,
        scalable_bytes=scalable_bytes(blocks),
        request_scales=request_scales(target_phase, request or 0, blocks),
    )
    primary, secondary = diagnose(ctx)
    verdicts = {primary.verdict, *(f.verdict for f in secondary)}
    need = requirement(ctx, verdicts)
    peak_step = _peak_step(steps, sum(components.values())) if fatal is None and target_kind == "dump" else None
    if peak_step is not None:
        # the dump came after the peak (between steps, say): scale the recorded peak, not the dump
        whatif = what_if(
            {"peak": peak_step.peak_allocated_bytes},
            scalable_bytes=peak_step.peak_activation_bytes,
            request_bytes=0,
            target_phase=PHASE_BETWEEN,
            capacity_bytes=capacity,
            basis=f"from step {peak_step.step}'s peak ({human_size(peak_step.peak_allocated_bytes)} allocated, activations up to {human_size(peak_step.peak_activation_bytes)})",
        )
    else:
        whatif = what_if(
            components,
            scalable_bytes=ctx.scalable_bytes,
            request_bytes=request or 0,
            target_phase=target_phase,
            capacity_bytes=capacity,
            shortfall_bytes=need.shortfall_bytes,
            projected_need_bytes=need.projected_need_bytes,
            scales_request=ctx.request_scales,
            placement_limit=need.placement_limit,
        )
    recommendations = recommend(ctx, verdicts, need, whatif)

    if not trace:
        unknowns.append("no allocation history was recorded: phases, steps, the OOM event and the series are unknown")
    elif not state.has_frames:
        unknowns.append("no stack frames were recorded: phases come from markers or annotations only")
    if phase_source == SOURCE_NONE and trace:
        unknowns.append("no markers, annotations or frames mark the phases, so steps and phases are unknown")
    if not registry:
        unknowns.append("no oomdoctor registry of named tensors: components are inferred, not exact")
    if wrapped:
        unknowns.append(
            f"the trace holds {len(trace)} events, as many as the ring buffer keeps: it wrapped, and older events are lost"
        )
    if state.history.pre_existing_frees or any(b.alloc_index is None for b in blocks):
        pre_count = len(state.history.pre_existing_frees) + sum(1 for b in blocks if b.alloc_index is None)
        unknowns.append(f"{pre_count} allocations predate the trace; their phase and stack are unknown")
    unknowns.extend(accounting.unknowns)
    if fatal is not None and metadata.oom is not None and metadata.oom.surfaced is False:
        unknowns.append(
            "torch caught and retried this OOM internally (as cuDNN's workspace search does): it may not be what stopped the run"
        )

    replay = ReplaySummary(
        device=device,
        event_count=len(trace),
        target_index=target_index,
        target_kind=target_kind,
        peak_index=state.peak_index,
        peak_allocated_bytes=state.peak_allocated_bytes,
        ooms=oom_events,
        series=tuple(state.series),
        events_after_target=after,
        pre_existing_allocations=len(state.history.pre_existing_frees)
        + sum(1 for b in blocks if b.alloc_index is None),
        pre_existing_bytes=sum(s for _, _, s in state.history.pre_existing_frees)
        + sum(b.size_bytes for b in blocks if b.alloc_index is None),
        ring_buffer_wrapped=wrapped,
        has_frames=state.has_frames,
        has_time=state.has_time,
    )
    return Analysis(
        schema_version=RESULT_SCHEMA_VERSION,
        device=device,
        devices=snapshot.devices,
        source_format=snapshot.source_format,
        replay=replay,
        accounting=accounting,
        fragmentation=fragmentation,
        phase_source=phase_source,
        phases=tuple(spans),
        target_phase=target_phase,
        target_step=target_step,
        steps=steps,
        components=tuple(shares),
        live_blocks=tuple(blocks),
        verdict=primary.verdict,
        confidence=primary.confidence,
        summary=primary.summary,
        evidence=primary.evidence,
        secondary=secondary,
        recommendations=recommendations,
        what_if=whatif,
        unknowns=tuple(unknowns),
    )


def _peak_step(steps: tuple[StepSummary, ...], allocated_bytes: int) -> StepSummary | None:
    """The step with the highest recorded peak, when that peak is above what the dump holds."""
    peak = max(steps, key=lambda s: s.peak_allocated_bytes, default=None)
    if peak is None or peak.peak_allocated_bytes <= allocated_bytes or not peak.peak_activation_bytes:
        return None
    return peak


def _touches_blocks(trace: DeviceTrace, target_index: int) -> bool:
    later = trace.actions[target_index + 1 :]
    return "alloc" in later or "free_requested" in later or "free_completed" in later


def _phase_after_markers(markers: Sequence[Marker], phase: str, step: int | None) -> tuple[str, int | None]:
    """The phase at dump time: the markers may have moved on after the last recorded event."""
    timed = [m for m in markers if m.time_us is not None and m.phase is not None]
    if not timed:
        return phase, step
    last = max(timed, key=lambda m: m.time_us)
    last_step = last.step if last.step is not None else step
    if last.edge == "start":
        return last.phase, last_step
    if last.phase == "optimizer_step" and last_step is not None:
        last_step += 1
    return PHASE_BETWEEN, last_step


def _state_at_target(trace, segments, history, target_index) -> tuple[EventState, list[str]]:
    """(state, notes): the state right after the target; the dump's own when nothing was allocated
    or freed after it, otherwise replayed back from the final state."""
    notes: list[str] = []
    if target_index is None:
        return event_state(len(trace) - 1, list(segments), history.at_end(), exact=True), notes
    if not _touches_blocks(trace, target_index):
        live = history.at_end()
        layout, exact = segments_at(trace, segments, target_index)
        if not exact:
            layout = lay_out(layout, live.values(), {})
    else:
        live, pending = history.at(target_index)
        seg_list, _ = segments_at(trace, segments, target_index)
        layout, exact = lay_out(seg_list, live.values(), pending), False
        after = len(trace) - 1 - target_index
        notes.append(
            f"the dump was written {after} events after the target; block sizes freed since then are estimated from their requests"
        )
    state = event_state(target_index, layout, live, exact)
    unplaced = len(live) - len(state.live)
    if unplaced:
        notes.append(f"{unplaced} blocks live at the target lie in no segment the replay could rebuild; left out")
    return state, notes
