"""Steps and phases of every event, from the most trusted source the dump offers.

Sources, in order of trust: oomdoctor's markers, `external_annotations` windows aligned by
`time_us`, `user_metadata` strings, and the allocation stacks (spec §6.3). The result is a run of
`PhaseSpan`s covering every event index exactly once, so the phase of any event is one bisect away.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from oomdoctor.analysis.results import (
    PHASE_BACKWARD,
    PHASE_BEFORE,
    PHASE_BETWEEN,
    PHASE_FORWARD,
    PHASE_OPTIMIZER,
    PHASE_UNKNOWN,
    PHASE_ZERO_GRAD,
    SOURCE_ANNOTATIONS,
    SOURCE_FRAMES,
    SOURCE_MARKERS,
    SOURCE_NONE,
    SOURCE_USER_METADATA,
    PhaseSpan,
)
from oomdoctor.dump_metadata import Marker
from oomdoctor.model import ALLOC, OOM, Annotation, DeviceTrace, Stack

# Stack classes, from the innermost frame that says something (spec §6.3).
_CLASS_FORWARD = PHASE_FORWARD
_CLASS_BACKWARD = PHASE_BACKWARD
_CLASS_OPTIMIZER = PHASE_OPTIMIZER
_CLASS_ZERO_GRAD = PHASE_ZERO_GRAD
_CLASS_USER = "user"
_CLASS_NO_FRAMES = "no-frames"
_CLASS_MODULE_SETUP = "module-setup"  # parameters being created or moved (`.to`, `.cuda`, `__init__`)

_FORWARD_FUNCTIONS = frozenset({"_wrapped_call_impl", "_call_impl"})
_BACKWARD_FUNCTIONS = frozenset({"backward", "_engine_run_backward", "grad", "run_backward"})
_SETUP_FUNCTIONS = frozenset({"_apply", "to", "cuda", "convert", "load_state_dict", "reset_parameters"})


def _norm(filename: str) -> str:
    return filename.replace("\\", "/")


def classify_stack(stack: Stack) -> str:
    if not stack:
        return _CLASS_NO_FRAMES
    setup = False
    python = False
    for frame in stack:
        filename = _norm(frame.filename)
        name = frame.name
        if not filename.endswith(".py"):
            if "autograd::Engine" in name or "AccumulateGrad" in name or "Backward" in name:
                return _CLASS_BACKWARD
            continue
        python = True
        if "torch/optim/" in filename:
            return _CLASS_ZERO_GRAD if name == "zero_grad" else _CLASS_OPTIMIZER
        if filename.endswith("torch/nn/modules/module.py"):
            if name in _FORWARD_FUNCTIONS:
                return _CLASS_FORWARD
            if name in _SETUP_FUNCTIONS:
                setup = True
        elif "torch/autograd/" in filename and name in _BACKWARD_FUNCTIONS:
            return _CLASS_BACKWARD
        elif filename.endswith("torch/_tensor.py") and name == "backward":
            return _CLASS_BACKWARD
        elif "torch/nn/modules/" in filename or "torch/nn/parameter.py" in filename:
            setup = True
    if not python:
        return _CLASS_NO_FRAMES
    return _CLASS_MODULE_SETUP if setup else _CLASS_USER


def _phase_from_metadata(text: str | None) -> str | None:
    if not text:
        return None
    lowered = text.lower()
    if "backward" in lowered:
        return PHASE_BACKWARD
    if "zero_grad" in lowered:
        return PHASE_ZERO_GRAD
    if "optim" in lowered:
        return PHASE_OPTIMIZER
    if "forward" in lowered:
        return PHASE_FORWARD
    return None


def _times_usable(trace: DeviceTrace) -> bool:
    times = trace.times_us
    return times is not None and bool(times) and times[0] is not None and times[-1] is not None


def _time_key(time_us: int | None) -> int:
    return time_us if time_us is not None else 0


def _index_window(trace: DeviceTrace, start_us: int, end_us: int) -> tuple[int, int]:
    times = trace.times_us or ()
    first = bisect.bisect_left(times, start_us, key=_time_key)
    last = bisect.bisect_right(times, end_us, key=_time_key) - 1
    return first, last


def _fill(windows: list[tuple[int, int, str, int, str]], event_count: int) -> list[PhaseSpan]:
    """Spans for the windows (sorted, non-overlapping after clipping) and for the gaps between them."""
    spans: list[PhaseSpan] = []
    cursor = 0
    step = 0
    seen_phase = False
    for first, last, phase, window_step, source in sorted(windows, key=lambda w: (w[0], w[1])):
        first = max(first, cursor)
        last = min(last, event_count - 1)
        if last < first:  # no event inside (an optimizer step that allocated nothing): still counts
            seen_phase = True
            step = window_step + 1 if phase == PHASE_OPTIMIZER else max(step, window_step)
            continue
        if first > cursor:
            gap_phase = PHASE_BETWEEN if seen_phase else PHASE_BEFORE
            spans.append(PhaseSpan(cursor, first - 1, gap_phase, step, source))
        spans.append(PhaseSpan(first, last, phase, window_step, source))
        seen_phase = True
        step = window_step + 1 if phase == PHASE_OPTIMIZER else window_step
        cursor = last + 1
    if cursor < event_count:
        gap_phase = PHASE_BETWEEN if seen_phase else PHASE_BEFORE
        source = spans[-1].source if spans else SOURCE_NONE
        spans.append(PhaseSpan(cursor, event_count - 1, gap_phase, step, source))
    return spans


def spans_from_markers(trace: DeviceTrace, markers: Sequence[Marker]) -> list[PhaseSpan] | None:
    if not markers or not _times_usable(trace):
        return None
    usable = [m for m in markers if m.time_us is not None]
    open_starts: dict[str, tuple[int, int]] = {}
    windows: list[tuple[int, int, str, int, str]] = []
    for marker in sorted(usable, key=lambda m: _time_key(m.time_us)):
        phase = marker.phase
        time_us = marker.time_us
        if phase is None or time_us is None:  # (usable markers all have a time)
            continue
        step = marker.step if marker.step is not None else 0
        if marker.edge == "start":
            open_starts[phase] = (time_us, step)
        elif marker.edge == "end" and phase in open_starts:
            start_us, start_step = open_starts.pop(phase)
            first, last = _index_window(trace, start_us, time_us)
            windows.append((first, last, phase, start_step, SOURCE_MARKERS))
    for phase, (start_us, start_step) in open_starts.items():  # still open at the dump: the OOM's phase
        first, last = _index_window(trace, start_us, start_us)
        windows.append((first, len(trace) - 1, phase, start_step, SOURCE_MARKERS))
    if not windows:
        return None
    return _fill(windows, len(trace))


def _annotation_phase(name: str) -> str | None:
    if name.startswith("Optimizer.step#"):
        return PHASE_OPTIMIZER
    if name.startswith("Optimizer.zero_grad#"):
        return PHASE_ZERO_GRAD
    lowered = name.lower()
    if "backward" in lowered:
        return PHASE_BACKWARD
    if "forward" in lowered:
        return PHASE_FORWARD
    return None


def annotation_windows(
    trace: DeviceTrace, annotations: Sequence[Annotation], device: int
) -> tuple[list[tuple[int, int, str]], list[int]]:
    """Phase windows as event-index ranges, and the index where each optimizer step's successor
    begins (windows of optimizer steps that allocated nothing are empty but still end a step)."""
    if not annotations or not _times_usable(trace):
        return [], []
    on_device = [a for a in annotations if a.device == device] or list(annotations)
    open_starts: dict[str, list[int]] = {}
    windows: list[tuple[int, int, str]] = []
    step_starts: list[int] = []
    for annotation in sorted(on_device, key=lambda a: a.time_us):
        phase = _annotation_phase(annotation.name)
        if phase is None:
            continue
        if annotation.stage == "START":
            open_starts.setdefault(annotation.name, []).append(annotation.time_us)
        elif annotation.stage == "END" and open_starts.get(annotation.name):
            start_us = open_starts[annotation.name].pop()
            first, last = _index_window(trace, start_us, annotation.time_us)
            if last >= first:
                windows.append((first, last, phase))
            if phase == PHASE_OPTIMIZER:
                step_starts.append(last + 1)
    for name, starts in open_starts.items():
        phase = _annotation_phase(name)
        for start_us in starts:
            first, _ = _index_window(trace, start_us, start_us)
            if first < len(trace) and phase is not None:
                windows.append((first, len(trace) - 1, phase))
    return windows, sorted(step_starts)


def _frame_phases(trace: DeviceTrace) -> tuple[list[tuple[int, str, str]], bool]:
    """(index, phase, source) where the phase changes, walking the allocation stacks; and whether
    any allocation carried a stack at all."""
    classes: dict[int, str] = {}
    changes: list[tuple[int, str, str]] = []
    current = PHASE_BEFORE
    any_frames = False
    seen_work = False
    metadata = trace.user_metadata
    frames_at = trace.frames_at
    for index, action in enumerate(trace.actions):
        # an `oom` event carries the failing allocation's stack: it decides the OOM's own phase
        if action != ALLOC and action != OOM:
            continue
        phase_hint = _phase_from_metadata(metadata[index]) if metadata is not None and metadata[index] else None
        if phase_hint is not None:
            if phase_hint != current:
                changes.append((index, phase_hint, SOURCE_USER_METADATA))
                current = phase_hint
            seen_work = True
            continue
        stack = frames_at(index)
        key = id(stack)
        cls = classes.get(key)
        if cls is None:
            cls = classify_stack(stack)
            classes[key] = cls
        if stack:
            any_frames = True
        if cls == _CLASS_NO_FRAMES:
            # Backward runs on autograd threads that record no Python frames (spec §6.3).
            new = PHASE_BACKWARD if current in (PHASE_FORWARD, PHASE_BACKWARD) else current
        elif cls in (_CLASS_USER, _CLASS_MODULE_SETUP):
            new = PHASE_BETWEEN if seen_work else PHASE_BEFORE
        else:
            new = cls
            seen_work = True
        if new != current:
            changes.append((index, new, SOURCE_FRAMES))
            current = new
    return changes, any_frames


def build_spans(
    trace: DeviceTrace,
    *,
    markers: Sequence[Marker] | None,
    annotations: Sequence[Annotation],
    device: int,
) -> tuple[list[PhaseSpan], str]:
    """Phase spans covering every event of `trace`, and the most trusted source that decided them."""
    count = len(trace)
    if count == 0:
        return [], SOURCE_NONE
    from_markers = spans_from_markers(trace, markers or ())
    if from_markers:
        return from_markers, SOURCE_MARKERS

    changes, any_frames = _frame_phases(trace)
    windows, step_starts = annotation_windows(trace, annotations, device)
    if not windows and not changes:
        return [PhaseSpan(0, count - 1, PHASE_UNKNOWN, 0, SOURCE_NONE)], SOURCE_NONE

    # Lay the frame-derived phases out per event range, then let annotation windows override.
    starts = [c[0] for c in changes]
    pieces: list[tuple[int, int, str, str]] = []
    first_phase = PHASE_BEFORE if changes else PHASE_UNKNOWN
    if not changes or starts[0] > 0:
        pieces.append(
            (0, (starts[0] - 1) if changes else count - 1, first_phase, SOURCE_FRAMES if any_frames else SOURCE_NONE)
        )
    for position, (index, phase, source) in enumerate(changes):
        end = starts[position + 1] - 1 if position + 1 < len(starts) else count - 1
        pieces.append((index, end, phase, source))
    for first, last, phase in sorted(windows):
        pieces = _overlay(pieces, first, last, phase)
    spans = _number_steps(pieces, step_starts if step_starts else None)
    source = SOURCE_ANNOTATIONS if windows else (SOURCE_FRAMES if any_frames else SOURCE_USER_METADATA)
    return spans, source


def _overlay(
    pieces: list[tuple[int, int, str, str]], first: int, last: int, phase: str
) -> list[tuple[int, int, str, str]]:
    result: list[tuple[int, int, str, str]] = []
    for p_first, p_last, p_phase, p_source in pieces:
        if p_last < first or p_first > last:
            result.append((p_first, p_last, p_phase, p_source))
            continue
        if p_first < first:
            result.append((p_first, first - 1, p_phase, p_source))
        if p_last > last:
            result.append((last + 1, p_last, p_phase, p_source))
    result.append((first, last, phase, SOURCE_ANNOTATIONS))
    result.sort()
    return result


def _number_steps(pieces: list[tuple[int, int, str, str]], step_starts: list[int] | None) -> list[PhaseSpan]:
    """Merge equal neighbours and count completed optimizer steps before each span.

    With `step_starts` (from annotations) a new step begins at each of those indices, splitting a
    span if need be; without, a step ends wherever an optimizer span does.
    """
    if step_starts is not None:
        cut: list[tuple[int, int, str, str]] = []
        for first, last, phase, source in pieces:
            for boundary in step_starts:
                if first < boundary <= last:
                    cut.append((first, boundary - 1, phase, source))
                    first = boundary
            cut.append((first, last, phase, source))
        pieces = cut
    spans: list[PhaseSpan] = []
    step = 0
    position = 0
    backward_open = False  # a backward ran and no optimizer span followed it yet
    for first, last, phase, source in pieces:
        if step_starts is not None:
            while position < len(step_starts) and step_starts[position] <= first:
                position += 1
            new_step = position
        else:
            new_step = step
            if spans and spans[-1].phase == PHASE_OPTIMIZER and phase != PHASE_OPTIMIZER:
                new_step = step + 1
            elif phase == PHASE_FORWARD and backward_open:
                # forward again after a backward with no optimizer allocation between: an optimizer
                # that updates in place (SGD, foreach) allocates nothing, yet a step was taken
                new_step = step + 1
            if phase == PHASE_BACKWARD:
                backward_open = True
            elif phase in (PHASE_OPTIMIZER, PHASE_FORWARD):
                backward_open = False
        if (
            spans
            and new_step == step
            and spans[-1].phase == phase
            and spans[-1].source == source
            and spans[-1].last_index + 1 == first
        ):
            previous = spans[-1]
            spans[-1] = PhaseSpan(previous.first_index, last, phase, previous.step, source)
            continue
        step = new_step
        spans.append(PhaseSpan(first, last, phase, step, source))
    return spans


class PhaseIndex:
    """Look up the span of any event index in O(log spans)."""

    def __init__(self, spans: Sequence[PhaseSpan]):
        self.spans = tuple(spans)
        self._starts = [s.first_index for s in self.spans]

    def span_of(self, index: int) -> PhaseSpan | None:
        if not self.spans:
            return None
        position = bisect.bisect_right(self._starts, index) - 1
        return self.spans[max(position, 0)]

    def span_after(self, span: PhaseSpan) -> PhaseSpan | None:
        position = bisect.bisect_right(self._starts, span.first_index)
        return self.spans[position] if position < len(self.spans) else None
