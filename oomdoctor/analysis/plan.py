"""A memory plan for a rehearsed run that fits: its peaks by phase and by step, and what they hold.

`memory_plan(analysis, analyse_at, ...)` reads the dump `oomdoctor rehearse` writes at the end of a
run that ran to completion. `analysis` is `analyse(snapshot, series_points=...)` with at least as
many points as the trace has events, so that every event is a point of the series and the phase and
step peaks are exact; `analyse_at(event_index)` is the full analysis (components, verdict,
recommendations) of one moment, `analyse(snapshot, at_event=event_index)`: the peak, and each phase's
peak (the plan reads their components, which the series' points do not change).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from oomdoctor.analysis.results import Analysis, SeriesPoint

OPTIMIZER_STATE = "optimizer_state"
_PASSES = frozenset({"forward", "backward"})


@dataclass(frozen=True, slots=True)
class PhasePeak:
    """The highest point of one phase (over every step that ran it)."""

    phase: str
    step: int  # the step that reached it
    allocated_bytes: int
    reserved_bytes: int
    components: tuple[tuple[str, int], ...]  # largest first, only those holding any bytes


@dataclass(frozen=True, slots=True)
class StepPeak:
    step: int
    allocated_bytes: int
    reserved_bytes: int
    optimizer_state_bytes: int  # at the step's peak


@dataclass(frozen=True, slots=True)
class MemoryPlan:
    device_memory_bytes: int
    outside_bytes: int  # held outside PyTorch (other processes, the CUDA context)
    peak_allocated_bytes: int  # the allocator's own peaks (torch.cuda.max_memory_*)
    peak_reserved_bytes: int
    headroom_bytes: int  # device - outside - peak reserved
    phases: tuple[PhasePeak, ...]  # in the order they first ran
    steps: tuple[StepPeak, ...]
    # step 1's forward-and-backward peak minus step 0's, when both ran: what the optimizer state made
    # in step 0's optimizer step adds to every later pass
    step_two_jump_bytes: int | None
    peak_components: tuple[tuple[str, int], ...]  # at the analysis' peak, largest first
    dominant: str | None  # the component holding the most at the peak
    analysis: Analysis  # of the peak


def _components(analysis: Analysis) -> tuple[tuple[str, int], ...]:
    named = [(share.name, share.bytes) for share in analysis.components if share.bytes > 0]
    return tuple(sorted(named, key=lambda item: -item[1]))


def memory_plan(
    analysis: Analysis,
    analyse_at: Callable[[int], Analysis],
    *,
    device_memory_bytes: int,
    outside_bytes: int,
    peak_allocated_bytes: int,
    peak_reserved_bytes: int,
) -> MemoryPlan:
    spans = analysis.phases
    series = analysis.replay.series
    phase_best: dict[str, tuple[SeriesPoint, int]] = {}
    order: list[str] = []
    step_best: dict[int, tuple[int, int, SeriesPoint]] = {}
    passes: dict[int, int] = {}  # step -> its forward and backward peak
    position = 0
    for point in series:
        while position < len(spans) and spans[position].last_index < point.event_index:
            position += 1
        if position >= len(spans) or spans[position].first_index > point.event_index:
            continue
        span = spans[position]
        if span.phase not in phase_best:
            order.append(span.phase)
        best = phase_best.get(span.phase)
        if best is None or point.allocated_bytes > best[0].allocated_bytes:
            phase_best[span.phase] = (point, span.step)
        if span.phase in _PASSES:
            passes[span.step] = max(passes.get(span.step, 0), point.allocated_bytes)
        current = step_best.get(span.step)
        if current is None:
            step_best[span.step] = (point.allocated_bytes, point.reserved_bytes, point)
        else:
            peak_point = point if point.allocated_bytes > current[0] else current[2]
            step_best[span.step] = (
                max(current[0], point.allocated_bytes),
                max(current[1], point.reserved_bytes),
                peak_point,
            )
    judged: dict[int, Analysis] = {}

    def at(index: int) -> Analysis:
        if index not in judged:
            judged[index] = analyse_at(index)
        return judged[index]

    phases = tuple(
        PhasePeak(
            phase=phase,
            step=phase_best[phase][1],
            allocated_bytes=phase_best[phase][0].allocated_bytes,
            reserved_bytes=phase_best[phase][0].reserved_bytes,
            components=_components(at(phase_best[phase][0].event_index)),
        )
        for phase in order
    )
    steps = tuple(
        StepPeak(
            step=step,
            allocated_bytes=allocated,
            reserved_bytes=reserved,
            optimizer_state_bytes=at(point.event_index).component_bytes().get(OPTIMIZER_STATE, 0),
        )
        for step, (allocated, reserved, point) in sorted(step_best.items())
    )
    peak_index = analysis.replay.peak_index
    peak = at(peak_index) if peak_index is not None else analysis
    jump = passes[1] - passes[0] if 0 in passes and 1 in passes else None
    peak_components = _components(peak)
    return MemoryPlan(
        device_memory_bytes=device_memory_bytes,
        outside_bytes=outside_bytes,
        peak_allocated_bytes=peak_allocated_bytes,
        peak_reserved_bytes=peak_reserved_bytes,
        headroom_bytes=max(0, device_memory_bytes - outside_bytes - peak_reserved_bytes),
        phases=phases,
        steps=steps,
        step_two_jump_bytes=jump,
        peak_components=peak_components,
        dominant=peak_components[0][0] if peak_components else None,
        analysis=peak,
    )
