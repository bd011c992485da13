"""Attribution of live bytes to components (docs/definitions.md).

Exact from oomdoctor's registry of named tensors when the dump has one (its "input" entries name the
tensors a model's outermost forward was given); otherwise inferred from the phase an allocation was
made in, how long it has lived, its stack and whether its size matches a parameter's. Without a
registry, what was allocated before the first phase, is not model setup and lives into the first
forward (which begins right after it) counts as inputs: the batch a loop makes before its first
step. Each live block records the method that placed it and a confidence.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Mapping, Sequence

from oomdoctor.analysis.phases import PhaseIndex, classify_stack
from oomdoctor.analysis.results import (
    METHOD_FRAMES,
    METHOD_LIFETIME,
    METHOD_NONE,
    METHOD_PHASE,
    METHOD_REGISTRY,
    METHOD_SIZE_MATCH,
    PHASE_BACKWARD,
    PHASE_BEFORE,
    PHASE_BETWEEN,
    PHASE_FORWARD,
    PHASE_OPTIMIZER,
    PHASE_UNKNOWN,
    PHASE_ZERO_GRAD,
    ComponentShare,
    Group,
    LiveAllocation,
    LiveBlock,
)
from oomdoctor.dump_metadata import DumpMetadata
from oomdoctor.metadata import COMPONENTS
from oomdoctor.model import DeviceTrace, Stack

INDEX = {name: position for position, name in enumerate(COMPONENTS)}
PARAMETERS = INDEX["parameters"]
GRADIENTS = INDEX["gradients"]
OPTIMIZER_STATE = INDEX["optimizer_state"]
ACTIVATIONS = INDEX["activations"]
TEMPORARIES = INDEX["temporaries"]
INPUTS = INDEX["inputs"]
BUFFERS = INDEX["buffers"]
OTHER = INDEX["other"]
UNKNOWN = INDEX["unknown"]

_REGISTRY_COMPONENT = {
    "parameter": PARAMETERS,
    "gradient": GRADIENTS,
    "optimizer_state": OPTIMIZER_STATE,
    "buffer": BUFFERS,
    "input": INPUTS,
}

PHASE_COMPONENT = {
    PHASE_FORWARD: ACTIVATIONS,
    PHASE_BACKWARD: TEMPORARIES,
    PHASE_OPTIMIZER: TEMPORARIES,
    PHASE_ZERO_GRAD: TEMPORARIES,
    PHASE_BETWEEN: INPUTS,
    PHASE_BEFORE: OTHER,
    PHASE_UNKNOWN: UNKNOWN,
}

_TORCH_MARKERS = ("/torch/", "/site-packages/", "/dist-packages/", "<frozen", "/lib/python", "/oomdoctor/capture/")


class Registry:
    """oomdoctor's named tensors on one device: storage address -> (component index, name, bytes)."""

    def __init__(self, metadata: DumpMetadata | None, device: int):
        self.by_address: dict[int, tuple[int, str, int]] = {}
        for tensor in metadata.tensors if metadata is not None else ():
            component = _REGISTRY_COMPONENT.get(tensor.component) if tensor.component is not None else None
            if component is None or tensor.device not in (None, device):
                continue
            size = tensor.size_bytes if tensor.size_bytes is not None else 0
            self.by_address.setdefault(tensor.address, (component, tensor.name or "", size))

    def __bool__(self) -> bool:
        return bool(self.by_address)


def series_classifier(registry: Registry):
    """Component of an allocation as seen when it happens (for the memory-over-time series)."""
    by_address = registry.by_address
    phase_component = PHASE_COMPONENT

    def component_of_alloc(index: int, address: int, size: int, phase: str) -> int:
        if by_address:
            known = by_address.get(address)
            if known is not None and known[2] == size:
                return known[0]
        return phase_component.get(phase, UNKNOWN)

    def component_of_pre_existing(address: int, size: int) -> int:
        known = by_address.get(address)
        if known is not None:
            return known[0]
        return OTHER if by_address else PARAMETERS

    return component_of_alloc, component_of_pre_existing


def source_line(stack: Stack) -> str | None:
    """The innermost frame of the user's own Python code, as `file:line in function`.

    C++ frames (with `stacks="all"`) and frames inside torch or installed packages are skipped; when
    nothing else is left, the innermost Python frame stands in.
    """
    fallback = None
    for frame in stack:
        filename = frame.filename.replace("\\", "/")
        if not filename.endswith(".py"):
            continue
        if any(marker in filename for marker in _TORCH_MARKERS):
            fallback = fallback or frame
            continue
        return f"{filename}:{frame.line} in {frame.name}"
    if fallback is not None:
        return f"{fallback.filename}:{fallback.line} in {fallback.name}"
    return None


def _stack_mentions(stack: Stack, names: tuple[str, ...]) -> bool:
    return any(frame.name in names for frame in stack)


def attribute(
    live: Collection[LiveAllocation],
    *,
    trace: DeviceTrace,
    frames_of: Mapping[int, Stack],
    phases: PhaseIndex,
    registry: Registry,
    target_index: int | None,
) -> list[LiveBlock]:
    """Place every block live at the target (in `live`'s order, then largest first)."""
    exact = bool(registry)
    after_target = target_index if target_index is not None else len(trace) - 1
    parameter_sizes: set[int] = set()
    if not exact:
        for allocation in live:
            alloc_index = allocation.alloc_index
            if alloc_index is None:
                parameter_sizes.add(allocation.requested_bytes)
            else:
                span = phases.span_of(alloc_index)
                if (
                    span is not None
                    and span.phase == PHASE_BEFORE
                    and classify_stack(trace.frames_at(alloc_index)) == "module-setup"
                ):
                    parameter_sizes.add(allocation.requested_bytes)

    blocks: list[LiveBlock] = []
    for address, alloc_index, size, requested in live:  # LiveAllocation's fields
        span = phases.span_of(alloc_index) if alloc_index is not None else None
        phase = span.phase if span is not None else PHASE_BEFORE
        step = span.step if span is not None else None
        stack = trace.frames_at(alloc_index) if alloc_index is not None else frames_of.get(address, ())
        name = None
        known = registry.by_address.get(address)
        if known is not None:
            component, name, method, confidence = known[0], known[1], METHOD_REGISTRY, 1.0
        elif exact:
            component, method, confidence = PHASE_COMPONENT.get(phase, UNKNOWN), METHOD_PHASE, 0.9
            if alloc_index is None:
                component, method = OTHER, METHOD_LIFETIME
        else:
            component, method, confidence = _infer(
                alloc_index, phase, span, stack, requested, parameter_sizes, after_target
            )
            if component == OTHER and span is not None and _spans_first_forward(span, phases, after_target):
                component, method, confidence = INPUTS, METHOD_LIFETIME, 0.5
        blocks.append(
            LiveBlock(
                address=address,
                size_bytes=size,
                requested_bytes=requested,
                alloc_index=alloc_index,
                phase=phase if alloc_index is not None else "before_trace",
                step=step,
                component=COMPONENTS[component],
                method=method,
                confidence=confidence,
                name=name,
                frames=stack,
            )
        )
    blocks.sort(key=lambda b: -b.size_bytes)
    return blocks


def _spans_first_forward(span, phases: PhaseIndex, after_target: int) -> bool:
    """Whether a block allocated in `span` (before the first phase) lives into the forward after it.

    The block is live at the target, so it lives into that forward when the forward began at or
    before the target.
    """
    if span.phase != PHASE_BEFORE:
        return False
    following = phases.span_after(span)
    return following is not None and following.phase == PHASE_FORWARD and following.first_index <= after_target


def _infer(alloc_index, phase, span, stack, requested, parameter_sizes, after_target):
    if alloc_index is None:
        return PARAMETERS, METHOD_LIFETIME, 0.5
    stack_class = classify_stack(stack) if stack else "no-frames"
    span_over = span is not None and span.last_index < after_target
    if phase == PHASE_BEFORE:
        if stack_class == "module-setup":
            return PARAMETERS, METHOD_FRAMES, 0.8
        if stack_class == PHASE_OPTIMIZER:
            return OPTIMIZER_STATE, METHOD_FRAMES, 0.7
        if requested in parameter_sizes:
            return PARAMETERS, METHOD_SIZE_MATCH, 0.5
        return OTHER, METHOD_PHASE, 0.5
    if phase == PHASE_OPTIMIZER:
        if span_over:
            return OPTIMIZER_STATE, METHOD_LIFETIME, 0.8
        if stack and _stack_mentions(stack, ("_init_group", "zeros_like", "_init_state")):
            return OPTIMIZER_STATE, METHOD_FRAMES, 0.8
        if stack:
            return TEMPORARIES, METHOD_FRAMES, 0.6
        if span is not None and span.step == 0 and requested in parameter_sizes:
            return OPTIMIZER_STATE, METHOD_SIZE_MATCH, 0.5
        return TEMPORARIES, METHOD_PHASE, 0.4
    if phase == PHASE_BACKWARD:
        if requested in parameter_sizes:
            return GRADIENTS, METHOD_SIZE_MATCH, 0.7 if span_over else 0.6
        if span_over and not parameter_sizes:
            return GRADIENTS, METHOD_LIFETIME, 0.4
        return TEMPORARIES, METHOD_PHASE, 0.6
    if phase == PHASE_FORWARD:
        return ACTIVATIONS, METHOD_PHASE, 0.7
    if phase == PHASE_BETWEEN:
        if stack_class == "module-setup":
            return PARAMETERS, METHOD_FRAMES, 0.6
        return INPUTS, METHOD_PHASE, 0.6
    if phase == PHASE_ZERO_GRAD:
        return TEMPORARIES, METHOD_PHASE, 0.6
    return UNKNOWN, METHOD_NONE, 0.0


def _module_of(name: str) -> str:
    if ".forward arg " in name or ".forward kwarg " in name:  # an input: group by the argument
        return name
    for suffix in (".exp_avg_sq", ".exp_avg", ".max_exp_avg_sq", ".momentum_buffer", ".grad"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return name.rsplit(".", 1)[0] if "." in name else name


def shares(blocks: Sequence[LiveBlock], group_limit: int = 12) -> list[ComponentShare]:
    """Bytes per component in COMPONENTS order, with the placing method and groupings."""
    totals: dict[str, int] = defaultdict(int)
    counts: dict[str, int] = defaultdict(int)
    by_method: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    weighted: dict[str, float] = defaultdict(float)
    modules: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    lines: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    for block in blocks:
        component = block.component
        totals[component] += block.size_bytes
        counts[component] += 1
        by_method[component][block.method] += block.size_bytes
        weighted[component] += block.confidence * block.size_bytes
        if block.name:
            entry = modules[component][_module_of(block.name)]
            entry[0] += block.size_bytes
            entry[1] += 1
        line = source_line(block.frames)
        if line:
            entry = lines[component][line]
            entry[0] += block.size_bytes
            entry[1] += 1
    result = []
    for component in COMPONENTS:
        total = totals.get(component, 0)
        methods = by_method.get(component) or {}
        method = max(methods, key=methods.__getitem__) if methods else METHOD_NONE
        result.append(
            ComponentShare(
                name=component,
                bytes=total,
                block_count=counts.get(component, 0),
                method=method,
                confidence=round(weighted[component] / total, 2) if total else 0.0,
                by_module=_top(modules.get(component), group_limit),
                by_source_line=_top(lines.get(component), group_limit),
            )
        )
    return result


def _top(groups: Mapping[str, list[int]] | None, limit: int) -> tuple[Group, ...]:
    if not groups:
        return ()
    ranked = sorted(groups.items(), key=lambda item: -item[1][0])[:limit]
    return tuple(Group(key=key, bytes=value[0], block_count=value[1]) for key, value in ranked)
