"""Steps and phases of every event, from the most trusted source the dump offers.

Sources, in order of trust: oomdoctor's markers, `external_annotations` windows aligned by
`time_us`, `user_metadata` strings, and the allocation stacks (spec §6.3). The result is a run of
`PhaseSpan`s covering every event index exactly once, so the phase of any event is one bisect away.

Stacks are read the way frameworks shape them: the innermost meaningful frame decides
(`_stack_class`: Lightning's training step inside the optimizer's closure is no optimizer step, a
`torch.autograd.grad` inside a forward no backward, torch.compile's Python backward a backward);
code whose stack names no phase takes it from where it lies (`_gap_phase`: loss code is the
forward's); and a step ends only after a completed backward or optimizer step, or at the loop's
annotations (without them, the stacks of the frees `zero_grad` and the optimizer's step make:
`frame_windows`), when more allocations follow (`_number_steps`).
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Mapping, Sequence
from itertools import chain, compress, groupby
from typing import Any

from oomdoctor.analysis.frame_kinds import in_torch_optim, per_stack
from oomdoctor.analysis.results import (
    FORWARD_PASSES,
    PHASE_BACKWARD,
    PHASE_BEFORE,
    PHASE_BETWEEN,
    PHASE_EVALUATION,
    PHASE_FORWARD,
    PHASE_OPTIMIZER,
    PHASE_UNKNOWN,
    PHASE_ZERO_GRAD,
    SOURCE_ANNOTATIONS,
    SOURCE_FRAMES,
    SOURCE_MARKERS,
    SOURCE_NONE,
    SOURCE_USER_METADATA,
    TRAINING_PHASES,
    PhaseSpan,
)
from oomdoctor.dump_metadata import Marker
from oomdoctor.model import ALLOC, FREE_REQUESTED, OOM, Annotation, DeviceTrace, Stack

# Stack classes, from the innermost frame that says something (spec §6.3).
_CLASS_FORWARD = PHASE_FORWARD
_CLASS_BACKWARD = PHASE_BACKWARD
_CLASS_OPTIMIZER = PHASE_OPTIMIZER
_CLASS_ZERO_GRAD = PHASE_ZERO_GRAD
# a module's forward called from an evaluation loop's function: a pass that does not train
_CLASS_EVALUATION = PHASE_EVALUATION
_CLASS_EVALUATION_CODE = "evaluation-code"  # an evaluation loop's code outside modules (by its function)
_CLASS_USER = "user"
_CLASS_NO_FRAMES = "no-frames"
_CLASS_MODULE_SETUP = "module-setup"  # parameters being created or moved (`.to`, `.cuda`, `__init__`)
# an optimizer building or loading its state outside a step (`load_state_dict`, eager `__init__`):
# optimizer state for attribution, but no step was taken
_CLASS_OPTIMIZER_SETUP = "optimizer-setup"
# a forward that called `torch.autograd.grad` (a gradient penalty, a jvp): the forward's
_CLASS_FORWARD_GRAD = "forward-grad"
# the autograd engine's own thread (no caller on the main thread): a backward's, unless a forward's
# nested grad is running
_CLASS_ENGINE = "engine"

# What one frame says, read from the outermost frame inwards (`_stack_class`).
_KIND_FORWARD = "forward"
_KIND_BACKWARD = "backward"
_KIND_OPTIMIZER = "optimizer"
_KIND_OPTIMIZER_SETUP = "optimizer-setup"
_KIND_ZERO_GRAD = "zero_grad"
_KIND_CLOSURE = "closure"
_KIND_SETUP = "setup"
_KIND_EVALUATION = "evaluation"  # an evaluation loop's function (by its name)

_FORWARD_FUNCTIONS = frozenset({"_wrapped_call_impl", "_call_impl"})
_AUTOGRAD_FUNCTIONS = frozenset({"backward", "_engine_run_backward", "grad", "run_backward"})
# a frame of this name in any file runs a backward: torch's own (`Tensor.backward`), a custom
# autograd.Function's, AOTAutograd's compiled backward (`torch/_functorch/_aot_autograd`), a
# framework's wrapper (Lightning's `LightningModule.backward`, accelerate, DeepSpeed)
_BACKWARD_NAMES = frozenset({"backward", "_backward_impl"})
# the training step an optimizer runs as its closure (`optimizer.step(closure)`: Lightning's
# automatic optimization, LBFGS): what runs inside it is the step's forward and backward
_CLOSURE_NAMES = frozenset({"closure", "_wrap_closure"})
_SETUP_FUNCTIONS = frozenset({"_apply", "to", "cuda", "convert", "load_state_dict", "reset_parameters"})
# the words of a function's name that make it an evaluation loop (`evaluate`, `run_eval`,
# `validation_step`, `_evaluation_loop`, `prediction_step`, `predict_step`, `infer`); a name that
# also says train (`train_and_evaluate`) is not one, nor is a test (pytest's `test_*`)
_EVALUATION_WORDS = frozenset(
    {"eval", "evaluate", "evaluation", "validate", "validation", "val", "predict", "prediction", "inference", "infer"}
)
_EVALUATION_NAMES = frozenset({"generate", "test_step", "test_loop"})  # Lightning's test loop; transformers' generate
_OPTIMIZER_SETUP_FUNCTIONS = frozenset(
    {"__init__", "add_param_group", "load_state_dict", "_process_value_according_to_param_policy", "__setstate__"}
)
# `Optimizer.state_dict()` (its `pack_group` too) copies nothing and steps nothing: what its hooks
# allocate (a sharded optimizer's state gathered to save a checkpoint) is no optimizer step's
_OPTIMIZER_STATE_DICT_FUNCTIONS = frozenset({"state_dict", "pack_group"})


def _is_evaluation_name(name: str) -> bool:
    if name in _EVALUATION_NAMES:
        return True
    words = set(name.lower().split("_"))
    return not words.isdisjoint(_EVALUATION_WORDS) and "train" not in words and "training" not in words


@functools.lru_cache(maxsize=65536)
def _frame_kind(filename: str, name: str) -> str | None:
    """What one frame says about the phase, or None when it says nothing (read once per distinct
    frame: a frame recurs in every stack that holds it)."""
    if not filename.endswith(".py"):  # a C++ frame (stacks="all"); the autograd engine's thread
        if "autograd::Engine" in name or "AccumulateGrad" in name or "Backward" in name:
            return _KIND_BACKWARD
        return None
    if in_torch_optim(filename):
        # a scheduler allocates nothing of the optimizer's; swa_utils' AveragedModel is a copy of
        # the model (an EMA of its weights), made by deepcopy and updated between steps
        if "lr_scheduler" in filename or "swa_utils" in filename:
            return None
        if name == "zero_grad":
            return _KIND_ZERO_GRAD
        if name in _OPTIMIZER_STATE_DICT_FUNCTIONS:
            return None
        return _KIND_OPTIMIZER_SETUP if name in _OPTIMIZER_SETUP_FUNCTIONS else _KIND_OPTIMIZER
    if filename.endswith("torch/nn/modules/module.py"):
        if name in _FORWARD_FUNCTIONS:
            return _KIND_FORWARD
        return _KIND_SETUP if name in _SETUP_FUNCTIONS else None
    if name in _BACKWARD_NAMES:
        return _KIND_BACKWARD
    if "torch/autograd/" in filename:
        return _KIND_BACKWARD if name in _AUTOGRAD_FUNCTIONS else None
    if "torch/_dynamo/compiled_autograd" in filename:  # compiled autograd runs the backward as Python
        return _KIND_BACKWARD
    if name == "forward":  # a module's forward, whether called through `__call__` or directly
        return _KIND_FORWARD
    if name in _CLOSURE_NAMES:
        return _KIND_CLOSURE
    if "torch/nn/modules/" in filename or "torch/nn/parameter.py" in filename:
        return _KIND_SETUP
    if _is_evaluation_name(name) and "/torch/" not in filename:
        return _KIND_EVALUATION
    return None


@per_stack
def _stack_class(stack: Stack) -> str:
    """The class of an allocation's stack: walk it from the outermost frame in, so that each phase
    frame decides for what runs inside it, with two exceptions that make it survive frameworks:

    - the optimizer decides only for its own code: a closure it calls (Lightning runs the whole
      training step inside `optimizer.step(closure)`) and a forward or backward inside it decide
      for themselves;
    - a backward inside a forward (`torch.autograd.grad` for a gradient penalty or a jvp) belongs
      to the forward, and a forward inside a backward (activation-checkpoint recomputation,
      torch.compile's backward showing the model's source lines) to the backward.
    """
    if not stack:
        return _CLASS_NO_FRAMES
    state: str | None = None
    setup = False
    python = False
    nested_grad = False
    # outside any phase, a function named for evaluation. (A no_grad-decorated function's frame,
    # `decorate_context`, is no evidence: torch.enable_grad() decorates with the same one, as
    # Lightning's training-step closure is.)
    evaluating = False
    for frame in reversed(stack):
        filename = frame.path
        if filename.endswith(".py"):
            python = True
        kind = _frame_kind(filename, frame.name)
        if kind is None:
            continue
        if kind == _KIND_EVALUATION:
            evaluating = evaluating or state is None
        elif kind == _KIND_FORWARD:
            if state != _KIND_BACKWARD:
                state = _KIND_FORWARD
        elif kind == _KIND_BACKWARD:
            if state == _KIND_FORWARD:
                nested_grad = True
            else:
                state = _KIND_BACKWARD
        elif kind == _KIND_CLOSURE:
            if state in (_KIND_OPTIMIZER, _KIND_OPTIMIZER_SETUP):
                state = None
        elif kind == _KIND_SETUP:
            if state is None:
                setup = True
        else:  # optimizer, its setup, zero_grad: whatever they run inside
            state = kind
    if state == _KIND_FORWARD:
        if nested_grad:
            return _CLASS_FORWARD_GRAD
        return _CLASS_EVALUATION if evaluating else _CLASS_FORWARD
    if state == _KIND_BACKWARD:
        return _CLASS_BACKWARD if python else _CLASS_ENGINE
    if state == _KIND_OPTIMIZER:
        return _CLASS_OPTIMIZER
    if state == _KIND_OPTIMIZER_SETUP:
        return _CLASS_OPTIMIZER_SETUP
    if state == _KIND_ZERO_GRAD:
        return _CLASS_ZERO_GRAD
    if not python:
        return _CLASS_NO_FRAMES
    if setup:
        return _CLASS_MODULE_SETUP
    # the evaluation loop's own code (gathering outputs, a metric)
    return _CLASS_EVALUATION_CODE if evaluating else _CLASS_USER


def classify_stack(stack: Stack) -> str:
    """The phase an allocation's stack names ("forward", "backward", "optimizer_step",
    "zero_grad", "evaluation"), else "module-setup" (parameters created or moved), "user" (code outside any of
    them: a loss, data, functional code) or "no-frames"."""
    return _PUBLIC_CLASS.get(_stack_class(stack), _CLASS_USER)


def in_module_forward(stack: Stack) -> bool:
    """Whether an allocation's stack runs inside a module's forward (training or not), not in the
    loop's own code around the passes."""
    return _stack_class(stack) in (_CLASS_FORWARD, _CLASS_EVALUATION, _CLASS_FORWARD_GRAD)


# The frameworks' name for the function that runs one training step (Lightning's
# `LightningModule.training_step`, transformers' `Trainer.training_step`): what runs inside it
# trains. A script's own names (`train_step`, `train`) say less: an evaluation helper is called
# from a `train()` loop too
_TRAINING_STEP_NAMES = frozenset({"training_step"})


def trains_by_frames(stack: Stack) -> bool:
    """Whether a stack runs inside a training step by its frames: a closure an optimizer's step
    calls (`optimizer.step(closure)`: Lightning's automatic optimization, LBFGS), or a Python
    function named as the frameworks name the step. A forward there trains, even before any backward."""
    in_optimizer = False
    for frame in reversed(stack):
        filename = frame.path
        if frame.name in _TRAINING_STEP_NAMES and filename.endswith(".py"):
            return True
        kind = _frame_kind(filename, frame.name)
        if kind == _KIND_OPTIMIZER:
            in_optimizer = True
        elif kind == _KIND_CLOSURE and in_optimizer:
            return True
    return False


_PUBLIC_CLASS = {
    _CLASS_FORWARD: _CLASS_FORWARD,
    _CLASS_EVALUATION: _CLASS_EVALUATION,
    _CLASS_EVALUATION_CODE: _CLASS_EVALUATION,
    _CLASS_FORWARD_GRAD: _CLASS_FORWARD,
    _CLASS_BACKWARD: _CLASS_BACKWARD,
    _CLASS_ENGINE: _CLASS_BACKWARD,
    _CLASS_OPTIMIZER: _CLASS_OPTIMIZER,
    _CLASS_OPTIMIZER_SETUP: _CLASS_OPTIMIZER,
    _CLASS_ZERO_GRAD: _CLASS_ZERO_GRAD,
    _CLASS_USER: _CLASS_USER,
    _CLASS_NO_FRAMES: _CLASS_NO_FRAMES,
    _CLASS_MODULE_SETUP: _CLASS_MODULE_SETUP,
}


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


def _index_window(times: Sequence[int], start_us: int, end_us: int) -> tuple[int, int]:
    first = bisect.bisect_left(times, start_us)
    last = bisect.bisect_right(times, end_us) - 1
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
    times = trace.times_or_zero()
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
            first, last = _index_window(times, start_us, time_us)
            windows.append((first, last, phase, start_step, SOURCE_MARKERS))
    for phase, (start_us, start_step) in open_starts.items():  # still open at the dump: the OOM's phase
        first, last = _index_window(times, start_us, start_us)
        windows.append((first, len(trace) - 1, phase, start_step, SOURCE_MARKERS))
    if not windows:
        return None
    return _fill(windows, len(trace))


def optimizer_annotation(name: str) -> bool:
    """Whether a `record_function` annotation is torch's window of an optimizer's step or zero_grad
    (a run that has them trains)."""
    return _annotation_phase(name) in (PHASE_OPTIMIZER, PHASE_ZERO_GRAD)


def _annotation_phase(name: str) -> str | None:
    """The phase a `record_function` window names: torch's optimizer windows, a backward, an
    evaluation (a window named as an evaluation function is: `evaluate`, Lightning's profiler's
    `[LightningModule]Model.validation_step`), a forward."""
    if name.startswith("Optimizer.step#"):
        return PHASE_OPTIMIZER
    if name.startswith("Optimizer.zero_grad#"):
        return PHASE_ZERO_GRAD
    lowered = name.lower()
    if "backward" in lowered:
        return PHASE_BACKWARD
    function = lowered.rsplit("]", 1)[-1].rsplit("#", 1)[-1].rsplit(".", 1)[-1].strip()
    if _is_evaluation_name(function):
        return PHASE_EVALUATION
    if "forward" in lowered:
        return PHASE_FORWARD
    return None


def _nested_in_evaluation(windows: list[tuple[int, int, str]]) -> list[tuple[int, int, str]]:
    """The windows without the forwards and evaluations inside an evaluation window (the model's
    forward that a `validation_step` window runs, the module's window inside the strategy's): they
    are part of that evaluation, one pass. One sweep in order of start: a window is inside one when
    an evaluation window that began no later reaches at least as far."""
    kept: list[tuple[int, int, str]] = []
    reach = -1  # the furthest end of the evaluation windows begun so far
    for first, last, phase in sorted(windows, key=lambda w: (w[0], w[2] != PHASE_EVALUATION, -w[1])):
        if phase in (PHASE_EVALUATION, PHASE_FORWARD) and last <= reach:
            continue
        if phase == PHASE_EVALUATION:
            reach = last
        kept.append((first, last, phase))
    return kept


def annotation_windows(
    trace: DeviceTrace, annotations: Sequence[Annotation], device: int
) -> tuple[list[tuple[int, int, str]], list[int]]:
    """Phase windows as event-index ranges, and the index where each optimizer step's successor
    begins (windows of optimizer steps that allocated nothing are empty but still end a step)."""
    if not annotations or not _times_usable(trace):
        return [], []
    on_device = [a for a in annotations if a.device == device] or list(annotations)
    times = trace.times_or_zero()
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
            first, last = _index_window(times, start_us, annotation.time_us)
            if last >= first:
                windows.append((first, last, phase))
            if phase == PHASE_OPTIMIZER:
                step_starts.append(last + 1)
    for name, starts in open_starts.items():
        phase = _annotation_phase(name)
        for start_us in starts:
            first, _ = _index_window(times, start_us, start_us)
            if first < len(trace) and phase is not None:
                windows.append((first, len(trace) - 1, phase))
    return _nested_in_evaluation(windows), sorted(step_starts)


_ANCHORS = frozenset({PHASE_FORWARD, PHASE_BACKWARD, PHASE_OPTIMIZER, PHASE_ZERO_GRAD, PHASE_EVALUATION})
_WORK = frozenset({PHASE_FORWARD, PHASE_BACKWARD, PHASE_OPTIMIZER})


def _gap_phase(cls: str, before: str | None, after: str | None, work_seen: bool, has_optimizer: bool) -> str:
    """The phase of an allocation whose stack names none (user code, module setup), from where it
    lies: `before` and `after` are the phases named nearest before and after it (None: none, or a
    step boundary between), `work_seen` whether any phase was named before it."""
    if cls == _CLASS_MODULE_SETUP:
        return PHASE_BETWEEN if work_seen else PHASE_BEFORE
    if before == PHASE_FORWARD:  # the pass's own code outside modules: the loss, post-processing
        return PHASE_FORWARD
    # an evaluation's code after its pass: between two passes, or in the loop's function after the
    # last (a concatenation of what it kept); before its first pass it is the loop's batch, as a step's
    if before == PHASE_EVALUATION and (after == PHASE_EVALUATION or cls == _CLASS_EVALUATION_CODE):
        return PHASE_EVALUATION
    if before == PHASE_BACKWARD:
        if after == PHASE_OPTIMIZER:  # between backward() and step(): clipping, unscaling
            return PHASE_BACKWARD
        if not has_optimizer:  # the backward completed a step whose optimizer allocates nothing
            return PHASE_BETWEEN
        # gradient accumulation: the next micro-batch's own code up to its backward, else the tail
        return PHASE_FORWARD if after in (PHASE_FORWARD, PHASE_BACKWARD) else PHASE_BACKWARD
    if before == PHASE_OPTIMIZER and after == PHASE_OPTIMIZER:  # between two optimizers' steps
        return PHASE_OPTIMIZER
    if after == PHASE_BACKWARD:  # from a step's start up to backward(): its forward, outside modules
        return PHASE_FORWARD
    return PHASE_BETWEEN if work_seen else PHASE_BEFORE


class _FramePhases:
    """The allocations' phases read from their stacks (or `user_metadata`), as runs in trace order."""

    __slots__ = ("indices", "runs", "seen", "any_frames", "boundaries", "returns")

    def __init__(self) -> None:
        self.indices: Sequence[int] = []  # event index of each allocation (and `oom`)
        # (position in `indices` where the run starts, phase, source, whether a new forward pass starts)
        self.runs: list[tuple[int, str, str, bool]] = []
        self.seen: set[str] = set()  # the phases of the runs
        self.any_frames = False
        self.boundaries: list[int] = []  # the loop's marks that started steps (only in a run that trains)
        # where the loop's own code allocates again after an optimizer's step ran its closure's work
        # (`_step_returns`): the step had returned, though no mark shows where
        self.returns: list[int] = []


def _split_at_returns(
    trace: DeviceTrace, indices: Sequence[int], raw: list[list[Any]], by_stack: dict[int, tuple[str, str]]
) -> set[int]:
    """Positions (in `indices`) where a forward run of allocations is two passes: between two of its
    allocations the user's own code, outside any module, freed a tensor (a benchmark's `out =
    model(x)` dropping the previous output), so the first pass had returned. Nothing else is
    allocated between back-to-back passes, and no frame of a pass's own allocations tells them
    apart. The runs are split there (`raw` is changed in place); only frees inside forward runs are
    read, each distinct stack classified once."""
    starts: set[int] = set()
    # the frees inside each forward run, latest run first; their stacks are numbered in one call
    runs: list[tuple[int, int, int, Sequence[int]]] = []  # (run number, position, end, frees)
    for number in range(len(raw) - 1, -1, -1):
        position, cls, _source = raw[number]
        end = raw[number + 1][0] if number + 1 < len(raw) else len(indices)
        if cls not in (_CLASS_FORWARD, _CLASS_EVALUATION) or end - position < 2:
            continue
        frees = trace.positions_in(FREE_REQUESTED, indices[position], indices[end - 1])
        if frees:
            runs.append((number, position, end, frees))
    if not runs:
        return starts
    all_numbers, stacks = trace.stacks_at(list(chain.from_iterable(run[3] for run in runs)))
    classes = {}
    class_of: dict[int, str] = {label_id: label[0] for label_id, label in by_stack.items()}  # id(stack) -> class
    for stack_number, stack in stacks.items():
        cls = class_of.get(id(stack))
        if cls is None:
            cls = class_of[id(stack)] = _stack_class(stack)
        classes[stack_number] = cls
    offset = 0
    for number, position, end, run_frees in runs:  # the runs after one are split before it is
        numbers = all_numbers[offset : offset + len(run_frees)]
        offset += len(run_frees)
        cuts = set()
        for index, stack_number in zip(run_frees, numbers):
            if classes[stack_number] in (_CLASS_USER, _CLASS_EVALUATION_CODE):
                cut = bisect.bisect_right(indices, index, position, end)
                if position < cut < end and _same_call_site(trace, indices[cut - 1], indices[cut]):
                    cuts.add(cut)
        for cut in sorted(cuts, reverse=True):
            raw.insert(number + 1, [cut, raw[number][1], raw[number][2]])
        starts |= cuts
    return starts


def _step_returns(
    numbers: Sequence[int], stacks: Mapping[int, Stack], label_of: Mapping[int, tuple[str, str]]
) -> list[int]:
    """Positions (in the allocations `numbers` number the stacks of) where an optimizer's step that
    ran a closure had returned: `optimizer.step(closure)` (Lightning's automatic optimization)
    runs the step's forward and backward inside the step's frames, and where an in-place optimizer
    allocates nothing itself, nothing else shows where the step ended. The latest allocation with
    Python frames ran inside a step (a frame of the optimizer's step) but was not the optimizer's
    own (the closure's work: an optimizer's own allocations end its step by their phase), and this
    one runs outside any step, called from the same outermost frame (the same thread's code: a
    DataParallel replica's worker thread has its own): the loop's own code, after the step. What
    the step freed before it returned is not told apart from what the loop freed after it."""
    where: dict[int, tuple[bool, Any] | None] = {}  # stack number -> (inside a step, outermost frame)
    closure_seen = False
    for number, stack in stacks.items():
        python = [frame for frame in stack if frame.filename.endswith(".py")]
        if not python:
            where[number] = None  # the autograd engine's thread, or nothing recorded: no evidence
            continue
        inside = any(_frame_kind(frame.path, frame.name) == _KIND_OPTIMIZER for frame in python)
        where[number] = (inside, python[-1])
        closure_seen = closure_seen or (inside and label_of[number][0] not in _OPTIMIZER_OWN)
    if not closure_seen:
        return []
    returns: list[int] = []
    step_caller = None  # the outermost frame of the latest allocation, when it was a closure's inside a step
    for position, number in enumerate(numbers):
        here = where[number]
        if here is None:
            continue
        inside, outermost = here
        if inside:
            step_caller = outermost if label_of[number][0] not in _OPTIMIZER_OWN else None
            continue
        if step_caller is not None and outermost == step_caller:
            returns.append(position)
        step_caller = None
    return returns


# the classes of an optimizer's own allocations (its update, its state), not its closure's
_OPTIMIZER_OWN = frozenset({_CLASS_OPTIMIZER, _CLASS_OPTIMIZER_SETUP, _CLASS_ZERO_GRAD})


def _call_site(stack: Stack) -> tuple[str, int, str] | None:
    """The user's frame that called the outermost module of an allocation's stack (where `out =
    model(x)` is), or None when no module was called from Python."""
    caller = None
    for frame in reversed(stack):  # outermost first
        if frame.name in _FORWARD_FUNCTIONS and frame.path.endswith("torch/nn/modules/module.py"):
            return (frame.filename, frame.line, frame.name) if caller is None else caller
        if frame.filename.endswith(".py"):
            caller = (frame.filename, frame.line, frame.name)
    return None


def _same_call_site(trace: DeviceTrace, before: int, after: int) -> bool:
    """The allocations at events `before` and `after` come from modules called at the same line:
    the same loop's call again, not the loss module after the model."""
    site = _call_site(trace.frames_at(before))
    return site is not None and site == _call_site(trace.frames_at(after))


def _frame_phases(
    trace: DeviceTrace,
    boundaries: Sequence[int] = (),
    *,
    optimizer_annotated: bool = False,
    trains: bool = False,
    step_returns: bool = False,
) -> _FramePhases:
    """The phase of every allocation, walking the allocation stacks. A stack that names a phase
    decides it (`_stack_class`); an allocation on the autograd thread (no Python frames) during a
    forward or backward is the backward's, or the forward's while a nested grad runs; any other
    allocation takes its phase from where it lies (`_gap_phase`). In a run that trains (`trains`,
    or a backward, optimizer step or zero_grad among the stacks), `boundaries` (event indices where
    the loop starts an iteration, from annotations) end what lies before them; `result.boundaries`
    keeps those that were used. With `step_returns` (no annotation shows where an optimizer's step
    ended), the loop's code allocating again after a step's closure did is where that step had
    returned (`_step_returns`): what lies before it is that step's, and `result.returns` keeps them."""
    result = _FramePhases()
    # an `oom` event carries the failing allocation's stack: it decides the OOM's own phase
    ooms = trace.positions(OOM)
    indices = result.indices = sorted(chain(trace.positions(ALLOC), ooms)) if ooms else trace.positions(ALLOC)
    # each distinct stack is classified once; per allocation there is only a lookup
    numbers, stacks = trace.stacks_at(indices)
    by_stack: dict[int, tuple[str, str]] = {}  # id(stack) -> (class, source)
    label_of: dict[int, tuple[str, str]] = {}  # stack number -> (class, source)
    for number, stack in stacks.items():
        label = by_stack.get(id(stack))
        if label is None:
            label = by_stack[id(stack)] = (_stack_class(stack), SOURCE_FRAMES)
        label_of[number] = label
    labels = list(map(label_of.__getitem__, numbers))
    used = set(numbers)
    metadata = trace.user_metadata
    if metadata is not None:
        texts = list(map(metadata.__getitem__, indices))
        hint_of = {text: _phase_from_metadata(text) for text in set(texts)}
        if any(hint_of.values()):
            hint_label = {hint: (hint, SOURCE_USER_METADATA) for hint in hint_of.values() if hint is not None}
            hints = list(map(hint_of.__getitem__, texts))
            labels = [label if hint is None else hint_label[hint] for label, hint in zip(labels, hints)]
            used = {number for number, hint in zip(numbers, hints) if hint is None}
    result.any_frames = any(stacks[number] for number in used)
    raw: list[list[Any]] = []  # runs of equal class: [position of the first, class or named phase, source]
    position = 0
    for (cls, source), run in groupby(labels):
        raw.append([position, cls, source])
        position += len(list(run))
    classes_seen = {run[1] for run in raw}
    has_optimizer = optimizer_annotated or _CLASS_OPTIMIZER in classes_seen
    trains_here = trains or bool(classes_seen & (TRAINING_PHASES | {_CLASS_ENGINE}))
    if trains_here:
        result.boundaries = sorted(boundaries)
    returned = _step_returns(numbers, stacks, label_of) if step_returns else []
    result.returns = [indices[position] for position in returned]
    marks = {bisect.bisect_left(indices, boundary) for boundary in result.boundaries}
    marks.update(returned)
    # a run the loop's mark, or a step's return, falls inside is split there
    for position in sorted(marks):
        at = bisect.bisect_right(raw, position, key=lambda run: run[0]) - 1
        if position < len(indices) and at >= 0 and raw[at][0] != position:
            raw.insert(at + 1, [position, raw[at][1], raw[at][2]])
    pass_starts = _split_at_returns(trace, indices, raw, by_stack)

    phases, gaps = _walk(raw, marks, has_optimizer, pass_starts)
    if trains_here and _untrained_loops(trace, indices, raw, phases, gaps, pass_starts):
        phases, gaps = _walk(raw, marks, has_optimizer, pass_starts)  # the loops' code after them, again

    runs = result.runs
    for number, (position, _cls, source) in enumerate(raw):
        phase = phases[number]
        assert phase is not None
        # a forward entered from code outside any module: another pass (an evaluation loop's next batch)
        new_pass = phase in FORWARD_PASSES and not gaps[number] and number > 0 and gaps[number - 1]
        new_pass = new_pass and phases[number - 1] == phase
        # or the user's code freed something between two of its allocations: the pass had returned
        new_pass = new_pass or (phase in FORWARD_PASSES and position in pass_starts)
        if runs and not new_pass and runs[-1][1] == phase and runs[-1][2] == source:
            continue
        runs.append((position, phase, source, new_pass))
        result.seen.add(phase)
    return result


def _walk(
    raw: list[list[Any]], marks: set[int], has_optimizer: bool, pass_starts: set[int]
) -> tuple[list[str], list[bool]]:
    """The phase of each run of `raw` (a stack's class decides it, or where it lies: `_gap_phase`),
    and whether it was placed by where it lies; passes that a backward follows trained
    (`_trained_passes`)."""
    phases: list[str | None] = [None] * len(raw)
    gaps = [False] * len(raw)  # placed by where it lies, not by its stack
    pending: list[int] = []
    before: str | None = None
    work_seen = False
    nested_grad = False  # a forward's torch.autograd.grad is running on the engine's thread

    def settle(after: str | None) -> None:
        for number in pending:
            phases[number] = _gap_phase(raw[number][1], before, after, work_seen, has_optimizer)
            gaps[number] = True
        pending.clear()

    for number, (position, cls, _source) in enumerate(raw):
        if position in marks:
            settle(None)
            before = None
        if cls == _CLASS_FORWARD_GRAD:
            cls, nested_grad = PHASE_FORWARD, True
        elif cls in (_CLASS_ENGINE, _CLASS_NO_FRAMES):
            if nested_grad:
                cls = PHASE_FORWARD
            elif cls == _CLASS_ENGINE or before in (PHASE_FORWARD, PHASE_BACKWARD):
                cls = PHASE_BACKWARD  # backward runs on autograd threads that record no Python frames
            elif before is not None:  # nothing recorded (an `oom` entry without frames): the phase goes on
                cls = before
        else:  # the main thread allocates again: any nested grad has returned
            nested_grad = False
        if cls == _CLASS_OPTIMIZER_SETUP:  # state built or loaded outside a step: setup, like a module's
            cls = _CLASS_MODULE_SETUP
        if cls in _ANCHORS:
            settle(cls)
            phases[number] = cls
            before = cls
            work_seen = True
        elif cls == _CLASS_MODULE_SETUP:  # a model built or moved: no pass is running
            settle(None)
            phases[number] = _gap_phase(cls, before, None, work_seen, has_optimizer)
            before = None
        else:
            pending.append(number)
    settle(None)
    _trained_passes(raw, phases, gaps, pass_starts)
    return phases, gaps  # type: ignore[return-value]  # every run is placed


# a pass that holds less than this share of what it allocated kept its outputs, not a graph (under
# no_grad every intermediate is freed once used; with autograd on, the tensors saved for backward stay)
KEPT_GRAPHS_OF_PASSES = 0.25


def _untrained_loops(
    trace: DeviceTrace,
    indices: Sequence[int],
    raw: list[list[Any]],
    phases: Sequence[str],
    gaps: Sequence[bool],
    pass_starts: set[int],
) -> bool:
    """In a run that trains, a loop of forward passes that ran without autograd is an evaluation:
    two or more passes in a row with no backward (or other phase) between them or after the last,
    each holding, once its modules returned, less than KEPT_GRAPHS_OF_PASSES of what it allocated
    (the inline `with torch.no_grad(): for batch in loader: model(batch)` of a training script, whose
    frames name no evaluation function). A pass the trace ends in before its modules returned is
    the loop's when the passes before it are. Their module runs become evaluation runs (`raw` is
    changed in place); True when any did."""
    count = len(raw)
    passes: list[tuple[int, int, int]] = []  # (first run, last module run, end run): one forward pass each
    number = 0
    while number < count:
        if phases[number] != PHASE_FORWARD or gaps[number]:
            number += 1
            continue
        first = last_module = number
        number += 1
        while number < count and phases[number] == PHASE_FORWARD:
            if not gaps[number]:
                if gaps[number - 1] or raw[number][0] in pass_starts:
                    break  # entered from code outside any module, or after the previous pass returned
                last_module = number
            number += 1
        passes.append((first, last_module, number))
    changed = False
    chain: list[tuple[int, int, int]] = []
    for position, one in enumerate(passes):
        chain.append(one)
        follows = passes[position + 1][0] if position + 1 < len(passes) else None
        if follows == one[2]:
            continue  # the next pass follows at once: the loop goes on
        if one[2] < count and phases[one[2]] in TRAINING_PHASES:
            chain.pop()  # this pass trained; the ones before it in a row did not (a teacher's)
        changed |= _relabel_if_untrained(trace, indices, raw, chain)
        chain = []
    return changed


def _relabel_if_untrained(
    trace: DeviceTrace, indices: Sequence[int], raw: list[list[Any]], chain: Sequence[tuple[int, int, int]]
) -> bool:
    """Relabel the module runs of `chain` (consecutive passes, none followed by a backward) as an
    evaluation when at least two of them are measured and each measured one holds only its outputs."""
    if len(chain) < 2:
        return False
    measured = 0
    for first, last_module, _end in chain:
        if last_module + 1 >= len(raw):
            continue  # the trace ends in this pass's modules: it continues the loop
        low, stop = indices[raw[first][0]], indices[raw[last_module + 1][0]]
        allocated, held = _pass_memory(trace, low, stop)
        if not allocated or held >= KEPT_GRAPHS_OF_PASSES * allocated:
            return False
        measured += 1
    if measured < 2:
        return False
    for first, last_module, _end in chain:
        for number in range(first, last_module + 1):
            if raw[number][1] == _CLASS_FORWARD:
                raw[number][1] = _CLASS_EVALUATION
    return True


def _pass_memory(trace: DeviceTrace, low: int, stop: int) -> tuple[int, int]:
    """The bytes allocated by the events low..stop-1 and, of them, those still allocated at stop."""
    allocs = trace.positions_in(ALLOC, low, stop)
    frees = trace.positions_in(FREE_REQUESTED, low, stop)
    addrs, sizes = trace.addrs, trace.sizes
    live: dict[int, int] = {}
    allocated = 0
    for index in sorted(chain(allocs, frees)):
        address = addrs[index]
        if trace.actions[index] == ALLOC:
            live[address] = sizes[index]
            allocated += sizes[index]
        else:
            live.pop(address, None)
    return allocated, sum(live.values())


def _trained_passes(
    raw: Sequence[Sequence[Any]], phases: list[str | None], gaps: Sequence[bool], pass_starts: set[int]
) -> None:
    """An evaluation pass that a backward follows trained after all (a forward called from a function
    named for evaluation whose result is backpropagated): its runs become the forward's (`phases` is
    changed in place). Passes before it keep their phase (a teacher's)."""
    following: str | None = None
    trained = False  # relabelling the runs of one pass, latest first
    for number in range(len(raw) - 1, -1, -1):
        if gaps[number]:
            trained = False
            continue
        phase = phases[number]
        if phase == PHASE_EVALUATION and (following == PHASE_BACKWARD or trained):
            phases[number] = PHASE_FORWARD
            trained = raw[number][0] not in pass_starts  # a pass that starts here: the one before is another
        else:
            trained = False
        following = phases[number]


def _is_boundary_annotation(name: str) -> bool:
    """A zero-width mark of the training loop's step: `optimizer.zero_grad()` or the DataLoader
    handing over the next batch (torch records both as `record_function`s)."""
    return name.startswith("Optimizer.zero_grad#") or ("DataLoader" in name and name.endswith("__next__"))


def boundary_indices(trace: DeviceTrace, annotations: Sequence[Annotation], device: int) -> list[int]:
    """Event indices where an annotation marks the start of a loop iteration (`zero_grad`, the
    DataLoader's `__next__`): the first event at or after each START."""
    if not annotations or not _times_usable(trace):
        return []
    on_device = [a for a in annotations if a.device == device] or list(annotations)
    times = trace.times_or_zero()
    starts = {
        bisect.bisect_left(times, a.time_us)
        for a in on_device
        if a.stage == "START" and _is_boundary_annotation(a.name)
    }
    return sorted(i for i in starts if i < len(trace))


def _optimizer_calls_annotated(trace: DeviceTrace, annotations: Sequence[Annotation], device: int) -> bool:
    """Whether torch annotated the optimizer's calls while this trace was recorded: an optimizer
    annotation (`Optimizer.step#`, `Optimizer.zero_grad#`) of the device, as `annotation_windows`
    picks them, timed within the trace. torch.optim annotates every step and zero_grad of every
    optimizer then, so whatever they did is in the annotations' windows."""
    if not annotations or not _times_usable(trace):
        return False
    times = trace.times_us or ()
    first, last = times[0], times[-1]
    if first is None or last is None:
        return False
    on_device = [a for a in annotations if a.device == device] or list(annotations)
    return any(optimizer_annotation(a.name) and first <= a.time_us <= last for a in on_device)


def frame_windows(trace: DeviceTrace) -> tuple[list[tuple[int, int, str]], list[int]]:
    """The windows `annotation_windows` reads from the `Optimizer.zero_grad#` and `Optimizer.step#`
    annotations, read instead from the stacks of the frees those calls make, for a snapshot without
    them (torch < 2.5, or annotations recorded on another thread). A free carries where it was
    freed when the history records every stack (torch's default, context="all"):

    - a run of frees (between the same two allocations) whose own stack is the optimizer's
      `zero_grad` is a zero_grad window (zero_grad allocates nothing: its frees are all it leaves);
    - a run whose stack is inside the optimizer's step, where neither the allocation before nor the
      one after is the optimizer's, is the window of a step that allocated nothing (in-place SGD run
      as `optimizer.step(closure)` frees the closure's loss inside it), and its successor begins
      after it. A step that allocates has its allocations to tell it;
    - where no free carries zero_grad's stack (torch 2.0 gave each free its allocation's), the
      gradients it releases after a backward returned are its windows (`_gradients_released`).

    Returns (windows, where each such step's successor begins), as `annotation_windows` does."""
    frees = trace.positions(FREE_REQUESTED)
    if not frees:
        return [], []
    numbers, stacks = trace.stacks_at(frees)
    class_of = {number: _stack_class(stack) for number, stack in stacks.items()}
    allocations = trace.positions(ALLOC)
    released = []  # without zero_grad's own stacks: the gradients it releases
    if _CLASS_ZERO_GRAD not in class_of.values():
        alloc_numbers, alloc_stacks = trace.stacks_at(allocations)  # read once for both
        if _frees_carry_allocation_stacks(numbers, stacks, alloc_stacks):
            released = _gradients_released(frees, numbers, stacks, class_of, allocations, alloc_numbers, alloc_stacks)
    runs: dict[tuple[int, str], list[int]] = {}  # (allocations before, class) -> [first, last] free
    # only the frees of those two classes are walked (found in C: most traces have none)
    wanted = {number for number, cls in class_of.items() if cls in (_CLASS_ZERO_GRAD, _CLASS_OPTIMIZER)}
    kept = list(map(wanted.__contains__, numbers)) if wanted else []
    for index, number in zip(compress(frees, kept), compress(numbers, kept)):
        cls = class_of[number]
        run = runs.setdefault((bisect.bisect_left(allocations, index), cls), [index, index])
        run[1] = index
    around = sorted({p for before, cls in runs if cls == _CLASS_OPTIMIZER for p in (before - 1, before)})
    around = [p for p in around if 0 <= p < len(allocations)]
    alloc_numbers, alloc_stacks = trace.stacks_at([allocations[p] for p in around])
    allocating = {p for p, n in zip(around, alloc_numbers) if _stack_class(alloc_stacks[n]) == _CLASS_OPTIMIZER}
    windows: list[tuple[int, int, str]] = []
    step_starts: list[int] = []
    for (before, cls), (first, last) in sorted(runs.items(), key=lambda item: item[1][0]):
        if cls == _CLASS_ZERO_GRAD:
            windows.append((first, last, PHASE_ZERO_GRAD))
        elif before - 1 not in allocating and before not in allocating:
            windows.append((first, last, PHASE_OPTIMIZER))
            step_starts.append(last + 1)
    return sorted(windows + released), step_starts


# a trace whose frees carry their own stacks (context="all") may still have a few that match an
# allocation's: a hundredth of them or fewer with stacks no allocation has tell it
FOREIGN_FREE_STACKS_PART = 100


def _frees_carry_allocation_stacks(
    numbers: Sequence[int], stacks: Mapping[int, Stack], alloc_stacks: Mapping[int, Stack]
) -> bool:
    """Whether the frees carry their blocks' allocation stacks (torch 2.0, or a history recorded with
    context="alloc"), not where they were freed: all but a hundredth of them have a stack some
    allocation has. Only then can zero_grad's frees be missing their own stacks."""
    allocation_stacks = set(alloc_stacks.values())
    foreign = {number for number, stack in stacks.items() if stack not in allocation_stacks}
    if not foreign:
        return True
    return sum(map(foreign.__contains__, numbers)) * FOREIGN_FREE_STACKS_PART <= len(numbers)


def _gradients_released(
    frees: Sequence[int],
    numbers: Sequence[int],
    free_stacks: Mapping[int, Stack],
    class_of: dict[int, str],
    allocations: Sequence[int],
    alloc_numbers: Sequence[int],
    alloc_stacks: Mapping[int, Stack],
) -> list[tuple[int, int, str]]:
    """zero_grad's windows where no free carries the stack of its own call (torch 2.0 recorded each
    free with its allocation's stack): after a backward returned (the free of the loss's initial
    gradient, which `Tensor.backward` makes in `_make_grads`) and before the next backward
    allocates, a run of frees of blocks a backward made (the engine's, or a custom Function's
    backward) releases gradients that outlived their backward: set_to_none's zero_grad, or its
    like. That is before the next forward (`step(); zero_grad()`) or after it (`loss = model(x);
    zero_grad(); loss.backward()`, and `optimizer.step(closure)` as Lightning runs it): a forward
    frees none of what a backward made. Accumulated gradients stay, so micro-batches are not cut."""
    alloc_class = {number: _stack_class(stack) for number, stack in alloc_stacks.items()}
    # the loss's initial gradient, which `Tensor.backward` makes (`_make_grads`) and frees as it returns
    initial_gradients = {
        number
        for number, stack in free_stacks.items()
        if any(frame.name == "_make_grads" and "torch/autograd/" in frame.path for frame in stack)
    }
    windows: list[tuple[int, int, str]] = []
    returned = False
    run: list[int] | None = None  # [first, last] free of the current run
    position = 0  # allocations before the current free
    for index, number in zip(frees, numbers):
        while position < len(allocations) and allocations[position] < index:
            cls = alloc_class[alloc_numbers[position]]
            if cls in (_CLASS_BACKWARD, _CLASS_ENGINE, _CLASS_NO_FRAMES):
                returned = False  # a backward began: what follows is no longer after the return
            run = None
            position += 1
        cls = class_of[number]
        if number in initial_gradients:
            returned = True
        elif returned and cls in (_CLASS_ENGINE, _CLASS_NO_FRAMES, _CLASS_BACKWARD):
            if run is None:
                run = [index, index]
                windows.append((index, index, PHASE_ZERO_GRAD))
            run[1] = index
            windows[-1] = (run[0], run[1], PHASE_ZERO_GRAD)
    return windows


def build_spans(
    trace: DeviceTrace,
    *,
    markers: Sequence[Marker] | None,
    annotations: Sequence[Annotation],
    device: int,
    inferred: set[int] | None = None,
    read_windows: list[list[tuple[int, int, str]]] | None = None,
    unsplit: set[int] | None = None,
) -> tuple[list[PhaseSpan], str]:
    """Phase spans covering every event of `trace`, and the most trusted source that decided them.
    `inferred`, when given, receives the first event of each step whose start no mark shows (see
    `_number_steps`); `read_windows` the windows `frame_windows` read, where it was asked (no
    markers, no optimizer annotations), so that nobody reads them twice; `unsplit` the first event
    of each pass counted in the step before it though it may be a step of its own (no optimizer
    step shows, and the gradients stay alive across it: `_StepGradients`)."""
    count = len(trace)
    if count == 0:
        return [], SOURCE_NONE
    from_markers = spans_from_markers(trace, markers or ())
    if from_markers:
        return from_markers, SOURCE_MARKERS

    windows, step_starts = annotation_windows(trace, annotations, device)
    window_source = SOURCE_ANNOTATIONS
    boundaries = boundary_indices(trace, annotations, device)
    # no optimizer windows: the stacks of the frees its calls made tell the same, unless torch
    # annotated the optimizer's calls over this trace (then a zero_grad that freed nothing and no
    # step is all there was: the frees cannot show a call the annotations missed)
    if not windows and not step_starts and not _optimizer_calls_annotated(trace, annotations, device):
        windows, step_starts = frame_windows(trace)
        if read_windows is not None:
            read_windows.append(windows)
        window_source = SOURCE_FRAMES
        if not boundaries:
            boundaries = [first for first, _, phase in windows if phase == PHASE_ZERO_GRAD]
    # an optimizer step's window: a closure may run the step's forward and backward inside it
    stepping = _Interiors([(first, last) for first, last, phase in windows if phase == PHASE_OPTIMIZER])
    # the loop's own marks count as step boundaries only in a run that trains, and not inside a step
    marks = [b for b in boundaries if b not in stepping]
    found = _frame_phases(
        trace,
        sorted(set(marks) | set(step_starts)),
        optimizer_annotated=bool(step_starts),
        trains=any(a.name.startswith("Optimizer.") for a in annotations) or bool(windows),
        step_returns=window_source == SOURCE_FRAMES,
    )
    # a phase was named when some allocation lies after the start of the first step
    named = bool(found.seen - {PHASE_BEFORE})
    # an optimizer step that allocated nothing leaves no window, but its annotation still ends a step
    if not windows and not named and not step_starts:
        return [PhaseSpan(0, count - 1, PHASE_UNKNOWN, 0, SOURCE_NONE)], SOURCE_NONE

    # Lay the frame-derived phases out per event range (each allocation's phase lasts until the
    # next allocation), then let annotation windows override.
    indices = found.indices if named else []
    runs = found.runs if named else []
    starts = [indices[run[0]] for run in runs]
    pieces: list[tuple[int, int, str, str, bool]] = []
    if not starts or starts[0] > 0:
        first_phase = PHASE_BEFORE if starts else PHASE_UNKNOWN
        pieces.append((0, (starts[0] - 1) if starts else count - 1, first_phase, _base_source(found), False))
    for number, (_position, phase, source, new_pass) in enumerate(runs):
        last = starts[number + 1] - 1 if number + 1 < len(starts) else count - 1
        pieces.append((starts[number], last, phase, source, new_pass))
    if windows:
        pieces = _joined(_overlay_windows(pieces, windows, window_source))
    has_optimizer = bool(step_starts) or PHASE_OPTIMIZER in found.seen
    # no annotation counts the optimizer's steps: whether the steps the stacks show made state
    # alone, so that its steps which make none may leave nothing (`_optimizer_steps_may_go_unseen`)
    unseen = window_source == SOURCE_FRAMES and has_optimizer and _optimizer_steps_may_go_unseen(trace, pieces)
    spans = _number_steps(
        pieces,
        sorted(set(step_starts) | set(found.boundaries)),
        # every allocation, named or not: a trace without stacks (context="state") still counts
        # the steps its optimizer annotations end
        allocations=found.indices,
        has_optimizer=has_optimizer,
        optimizer_may_go_unseen=unseen,
        stepping=stepping,
        loop_marks=frozenset(found.boundaries) - frozenset(step_starts),
        returns=frozenset(found.returns),
        inferred=inferred,
        gradients=_StepGradients(trace),
        # where a zero_grad shows freeing the gradients, the loop frees them each step: a pass
        # after which it did not run (the gradients stayed) is a micro-batch, not unknown
        unsplit=unsplit if not any(phase == PHASE_ZERO_GRAD for _, _, phase in windows) else None,
    )
    if windows or not named:  # (not named: the optimizer annotations alone count the steps)
        source = window_source
    else:
        source = SOURCE_FRAMES if found.any_frames else SOURCE_USER_METADATA
    return spans, source


def _optimizer_steps_may_go_unseen(trace: DeviceTrace, pieces: Sequence[tuple[int, int, str, str, bool]]) -> bool:
    """Whether the optimizer may take steps that leave nothing in the trace: each step its stacks
    show (pieces of the optimizer's phase with no backward between them) made blocks that outlived
    it and freed none it made, so each is a step that made state: SGD's momentum buffers and a
    fused Adam's moments, made in the first step and updated in place after (or made later, for
    parameters whose first gradient came later). Such steps say nothing of the steps that make no
    state. A step that freed a block it made (a temporary of its arithmetic, which each step makes
    again: foreach and for-loop Adam, AdamW, Adagrad, RMSprop, SGD with weight decay), or that made
    nothing at all and still shows (by what it freed), shows what every step leaves: then a pass
    after a backward with no optimizer step between is a micro-batch. Reads only the events inside
    the optimizer's pieces, and stops at the first step that shows so."""
    steps = 0
    backward_since = True  # a backward ran since the last optimizer piece (the first counts)
    made: set[int] = set()  # addresses the current optimizer step allocated
    addrs, actions = trace.addrs, trace.actions
    for first, last, phase, _source, _new_pass in pieces:
        if phase == PHASE_BACKWARD:
            backward_since = True
            continue
        if phase != PHASE_OPTIMIZER:
            continue
        if backward_since:
            if steps and not made:
                return False  # the step before made nothing, and showed
            steps += 1
            backward_since = False
            made.clear()
        events = chain(trace.positions_in(ALLOC, first, last + 1), trace.positions_in(FREE_REQUESTED, first, last + 1))
        for index in sorted(events):
            if actions[index] == ALLOC:
                made.add(addrs[index])
            elif addrs[index] in made:
                return False
    return bool(made)


def _base_source(found: _FramePhases) -> str:
    return SOURCE_FRAMES if found.any_frames else SOURCE_NONE


_CLOSURE_PHASES = frozenset({PHASE_FORWARD, PHASE_BACKWARD})


class _Interiors:
    """The events inside any of some windows, after each one's first event, as sorted disjoint
    ranges: `index in interiors` is a bisection, however many windows there are."""

    __slots__ = ("_starts", "_ends")

    def __init__(self, windows: Sequence[tuple[int, int]] = ()) -> None:
        self._starts: list[int] = []
        self._ends: list[int] = []
        for first, last in sorted(windows):
            if first + 1 > last:
                continue
            if self._ends and first + 1 <= self._ends[-1] + 1:
                self._ends[-1] = max(self._ends[-1], last)
            else:
                self._starts.append(first + 1)
                self._ends.append(last)

    def __contains__(self, index: int) -> bool:
        position = bisect.bisect_right(self._starts, index) - 1
        return position >= 0 and index <= self._ends[position]


def _overlay(
    pieces: list[tuple[int, int, str, str, bool]],
    first: int,
    last: int,
    phase: str,
    keep: frozenset[str],
    *,
    new_pass: bool = False,
    source: str = SOURCE_ANNOTATIONS,
) -> list[tuple[int, int, str, str, bool]]:
    """The pieces with events first..last given the window's phase, except pieces whose phase is in
    `keep`; with `new_pass`, the window is a pass of its own (not merged with one just before it).
    `source`: what told the window (annotations, or the stacks of the frees: `frame_windows`)."""
    result: list[tuple[int, int, str, str, bool]] = []
    for piece in pieces:
        p_first, p_last = piece[0], piece[1]
        if p_last < first or p_first > last or piece[2] in keep:
            result.append(piece)
            continue
        if p_first < first:
            result.append((p_first, first - 1, *piece[2:]))
        result.append((max(first, p_first), min(last, p_last), phase, source, new_pass and p_first <= first))
        if p_last > last:
            # what follows the window up to the piece's next allocation allocates nothing (pieces
            # the stacks named begin at allocations): after an optimizer step or zero_grad the step
            # is over (a loop's frees, empty_cache), not back in the phase the piece's allocation
            # began (a trace whose stacks name nothing is one unknown piece, allocations and all)
            over = phase in (PHASE_OPTIMIZER, PHASE_ZERO_GRAD) and piece[2] != PHASE_UNKNOWN
            after = PHASE_BETWEEN if over else piece[2]
            result.append((last + 1, p_last, after, piece[3], False))
    return result


def _overlay_windows(
    pieces: list[tuple[int, int, str, str, bool]],
    windows: Sequence[tuple[int, int, str]],
    source: str = SOURCE_ANNOTATIONS,
) -> list[tuple[int, int, str, str, bool]]:
    """The pieces with each window laid over them in order of start (`_overlay`). One sweep: what
    ends before a window begins is final, so each window is laid over the pieces it covers only,
    and many windows over a long trace cost what the pieces and windows do, not their product."""
    done: list[tuple[int, int, str, str, bool]] = []
    open_pieces: list[tuple[int, int, str, str, bool]] = []  # laid by a window, a later one may cover them
    position = 0
    for first, last, phase in sorted(windows):
        ended = 0
        while ended < len(open_pieces) and open_pieces[ended][1] < first:
            ended += 1
        done += open_pieces[:ended]
        covered = open_pieces[ended:]
        if not covered:
            while position < len(pieces) and pieces[position][1] < first:
                done.append(pieces[position])
                position += 1
        while position < len(pieces) and pieces[position][0] <= last:
            covered.append(pieces[position])
            position += 1
        if phase == PHASE_EVALUATION and any(first <= p[0] <= last and p[2] in TRAINING_PHASES for p in covered):
            open_pieces = covered  # an evaluation window in which a backward began trained: the stacks' phases stand
            continue
        # the stacks' forward and backward inside an optimizer step are its closure's; each
        # evaluation window is a pass of its own
        keep = _CLOSURE_PHASES if phase == PHASE_OPTIMIZER else frozenset()
        open_pieces = _overlay(covered, first, last, phase, keep, new_pass=phase == PHASE_EVALUATION, source=source)
    return done + open_pieces + pieces[position:]


def _joined(pieces: list[tuple[int, int, str, str, bool]]) -> list[tuple[int, int, str, str, bool]]:
    """One phase's contiguous pieces as one, before the steps are numbered: a window that began at
    its first allocation's segment_alloc left a piece without an allocation first, which is the same
    step's as the rest of the window. Contiguous forward pieces are one whatever told each (the
    stacks or a window): windows of hooks inside a forward (FSDP's `FSDP::pre_forward (layer)`)
    cut it into pieces of both, and a pass is read from each span; a new pass is marked (`new_pass`)."""
    joined: list[tuple[int, int, str, str, bool]] = []
    for piece in pieces:
        same = joined and (joined[-1][2:4] == piece[2:4] or joined[-1][2] == piece[2] == PHASE_FORWARD)
        if same and not piece[4] and joined[-1][1] + 1 == piece[0]:
            joined[-1] = (joined[-1][0], piece[1], *joined[-1][2:])
        else:
            joined.append(piece)
    return joined


def _number_steps(
    pieces: list[tuple[int, int, str, str, bool]],
    boundaries: list[int],
    *,
    allocations: Sequence[int],
    has_optimizer: bool,
    optimizer_may_go_unseen: bool = False,
    stepping: _Interiors,
    loop_marks: frozenset[int] = frozenset(),
    returns: frozenset[int] = frozenset(),
    inferred: set[int] | None = None,
    gradients: _StepGradients | None = None,
    unsplit: set[int] | None = None,
) -> list[PhaseSpan]:
    """Merge equal neighbours and number the steps.

    A step ends after a completed top-level optimizer step, or, in a run whose optimizer never
    allocates (in-place SGD), after a completed backward where what it left alive (its gradients)
    was freed before the next backward (`gradients`: a `zero_grad` that set them to None,
    whatever its frames say). Where they stay alive the next pass added into them: a micro-batch of
    the same step (gradient accumulation), or a step of an optimizer that leaves no trace in a loop
    that never frees them, which nothing in the file tells apart: the pass is counted in the step
    before it, not as a step of its own, and its first event goes into `unsplit` (an evaluation
    adds into no gradients, and begins a step as before). Where the trace shows a `zero_grad`
    freeing the gradients elsewhere, `unsplit` is None: the loop frees them each step, so a pass
    they stayed alive into is a micro-batch of the same step. The same holds after the first
    optimizer step the stacks show where its steps may leave nothing (`optimizer_may_go_unseen`:
    each step shown made state alone, as SGD's momentum is made in its first step); passes before
    it are micro-batches (a step before it would have made the state). No step ends
    inside an `Optimizer.step` window (`stepping`: its closure runs forward and backward); `boundaries` (annotations: the end of an
    `Optimizer.step`, `zero_grad`, the DataLoader's next batch) end one too. Each takes effect only
    where the step so far did some work (a forward, backward or optimizer allocation) and a later
    allocation follows: a tail of frees is no step of its own. A loop's mark (`loop_marks`: a
    `zero_grad`, a DataLoader's next batch) between a forward and the backward that comes next is
    inside that iteration (`loss = model(x); optimizer.zero_grad(); loss.backward()`, a loader that
    fetches the next batch before the backward): a backward is never the first phase of a step.
    A step that ends by its phases alone (no mark) ends where the next step first allocates, so the
    frees between are the ending step's, though they may be the next one's (a loop's `del`, a
    `zero_grad` whose frees do not show it): such a step's first event goes into `inferred`. So does
    a step that ends at one of `returns` (the loop's code allocating after a step ran its closure:
    `_step_returns`), which ends it as a mark does, but with no mark of where.
    """
    cuts = sorted(set(boundaries) | returns)
    if cuts:
        cut: list[tuple[int, int, str, str, bool]] = []
        for first, last, phase, source, new_pass in pieces:
            # the cuts inside the piece, after its first event (`cuts` is sorted)
            low, high = bisect.bisect_right(cuts, first), bisect.bisect_right(cuts, last)
            for boundary in cuts[low:high]:
                cut.append((first, boundary - 1, phase, source, new_pass))
                first, new_pass = boundary, False
            cut.append((first, last, phase, source, new_pass))
        pieces = cut
    marks = set(boundaries)
    last_allocation = allocations[-1] if allocations else -1
    allocating: list[bool] = []  # whether each piece allocates
    position = 0
    for first, last, *_ in pieces:
        position = bisect.bisect_left(allocations, first, position)  # (in order: the first from here on)
        allocating.append(position < len(allocations) and allocations[position] <= last)
    coming: list[str | None] = [None] * len(pieces)  # the phase of the first allocating piece from each on
    # the first event of the next allocating backward piece after each (the trace's end: none), and
    # the phase of the first allocating pass (a forward or an evaluation) from each on
    next_backward = [pieces[-1][1] + 1 if pieces else 0] * len(pieces)
    next_pass: list[str | None] = [None] * len(pieces)
    for number in range(len(pieces) - 1, -1, -1):
        coming[number] = (
            pieces[number][2] if allocating[number] else (coming[number + 1] if number + 1 < len(pieces) else None)
        )
        passing = allocating[number] and pieces[number][2] in FORWARD_PASSES
        next_pass[number] = (
            pieces[number][2] if passing else next_pass[number + 1] if number + 1 < len(pieces) else None
        )
        if number + 1 < len(pieces):
            following = pieces[number + 1]
            backward = allocating[number + 1] and following[2] == PHASE_BACKWARD
            next_backward[number] = following[0] if backward else next_backward[number + 1]
    spans: list[PhaseSpan] = []
    step = 0
    stepped = False  # an optimizer piece was passed
    work = False  # the current step has done something
    previous: str | None = None  # the phase of the latest piece that allocated
    for number, (first, last, phase, source, new_pass) in enumerate(pieces):
        allocates = allocating[number]
        # a completed optimizer step ends its step even where only frees follow it (a dump written
        # after the run's last step); a loop's mark needs a later allocation
        ends_step = (first in marks and (first <= last_allocation or first not in loop_marks)) or first in returns
        if ends_step and first in loop_marks and previous == PHASE_FORWARD and coming[number] == PHASE_BACKWARD:
            ends_step = False  # a mark between a forward and its backward
        # inside an optimizer step's window the closure's phases change, but the step goes on
        if allocates and previous is not None and previous != phase and first not in stepping:
            if previous == PHASE_OPTIMIZER:
                ends_step = True
            elif (
                previous == PHASE_BACKWARD
                and (not has_optimizer or (optimizer_may_go_unseen and stepped))
                and phase != PHASE_OPTIMIZER
            ):
                # an evaluation adds into no gradients: it is no micro-batch of the step before
                if (
                    gradients is None
                    or next_pass[number] == PHASE_EVALUATION
                    or not gradients.stay(first, next_backward[number])
                ):
                    ends_step = True
                elif work and not ends_step and unsplit is not None:
                    unsplit.add(first)
        if ends_step and work:
            step += 1
            work = False
            # the gradients an optimizer's step read stay the ones later backwards add into until
            # something frees them (`stay`): a step whose optimizer may go unseen is told by them
            if gradients is not None and previous != PHASE_OPTIMIZER:
                gradients.reset()
            if inferred is not None and first not in marks:
                inferred.add(first)
        if phase == PHASE_BACKWARD and gradients is not None:
            gradients.backward(first, last)
        stepped = stepped or phase == PHASE_OPTIMIZER
        if allocates:
            previous = phase
            if phase in _WORK or phase == PHASE_UNKNOWN:  # unknown: a trace whose stacks name no phase
                work = True
        elif phase == PHASE_OPTIMIZER and source == SOURCE_ANNOTATIONS:
            work = True  # an optimizer step that allocated nothing is still a step
        if (
            spans
            and not new_pass
            and spans[-1].step == step
            and spans[-1].phase == phase
            and spans[-1].source == source
            and spans[-1].last_index + 1 == first
        ):
            previous_span = spans[-1]
            spans[-1] = PhaseSpan(previous_span.first_index, last, phase, previous_span.step, source)
            continue
        spans.append(PhaseSpan(first, last, phase, step, source))
    return spans


# a backward's gradients were freed before the next backward (a new step) when at least this share of
# what it left alive was
GRADIENTS_FREED_PART = 0.5


class _StepGradients:
    """What the backwards of the current step left alive, kept up to date as `_number_steps` walks
    the trace once (each event is read once, however many passes a step has), to tell whether the
    next pass began a step (`stay`)."""

    __slots__ = ("_trace", "_cursor", "_left", "_total")

    def __init__(self, trace: DeviceTrace) -> None:
        self._trace = trace
        self._cursor = 0  # events before it are read
        self._left: dict[int, int] = {}  # address -> bytes, of the step's backwards, not freed yet
        self._total = 0

    def _free_until(self, stop: int) -> None:
        """Read the frees of events cursor..stop-1."""
        addrs = self._trace.addrs
        for index in self._trace.positions_in(FREE_REQUESTED, self._cursor, stop):
            self._total -= self._left.pop(addrs[index], 0)
        self._cursor = max(self._cursor, stop)

    def backward(self, first: int, last: int) -> None:
        """A backward piece of the step: what it allocates joins what the step's backwards made."""
        self._free_until(first)
        trace = self._trace
        addrs, sizes, actions = trace.addrs, trace.sizes, trace.actions
        stop = max(self._cursor, last + 1)
        events = chain(
            trace.positions_in(ALLOC, self._cursor, stop), trace.positions_in(FREE_REQUESTED, self._cursor, stop)
        )
        for index in sorted(events):
            if actions[index] == ALLOC:
                self._total += sizes[index] - self._left.get(addrs[index], 0)
                self._left[addrs[index]] = sizes[index]
            else:
                self._total -= self._left.pop(addrs[index], 0)
        self._cursor = stop

    def reset(self) -> None:
        """A step ended: its backwards' blocks are no longer the next step's."""
        self._left.clear()
        self._total = 0

    def stay(self, next_first: int, until: int) -> bool:
        """Whether what the step's backwards made and had not freed when the next pass began (at
        `next_first`: the gradients AccumulateGrad stored, which later micro-batches add into in
        place) is, for more than GRADIENTS_FREED_PART of its bytes, not freed before `until` (the
        next backward's first event, or the trace's end). Where nothing they made was alive then
        (a `zero_grad` set the gradients to None before the next forward), or most of it is freed
        before the next backward (a `zero_grad` after the forward), the next pass began a step;
        where the gradients went into tensors from before the trace, nothing shows they stay, and
        the pass is a step, as it was read before."""
        self._free_until(next_first)
        if self._total <= 0:
            return False
        addrs, left = self._trace.addrs, self._left
        freed = sum(left.get(addrs[index], 0) for index in self._trace.positions_in(FREE_REQUESTED, next_first, until))
        return freed < GRADIENTS_FREED_PART * self._total


class PhaseIndex:
    """Look up the span of any event index in O(log spans)."""

    def __init__(self, spans: Sequence[PhaseSpan]):
        self.spans = tuple(spans)
        self._starts = [s.first_index for s in self.spans]

    def span_of(self, index: int) -> PhaseSpan | None:
        """The span holding event `index` (the first span for an index before it); None without spans."""
        spans = self.spans
        if not spans:
            return None
        after = bisect.bisect_right(self._starts, index)  # the spans starting at or before it
        return spans[after - 1] if after else spans[0]

    def span_after(self, span: PhaseSpan) -> PhaseSpan | None:
        position = bisect.bisect_right(self._starts, span.first_index)
        return self.spans[position] if position < len(self.spans) else None
