"""Attribution of live bytes to components (docs/definitions.md).

Exact from oomdoctor's registry of named tensors when the dump has one (its "input" entries name the
tensors a model's outermost forward was given); otherwise inferred from the phase an allocation was
made in, how long it has lived, its stack and whether its size matches a parameter's. Without a
registry, what was allocated before the first phase, is not model setup and lives into the first
forward (which begins right after it) counts as inputs: the batch a loop makes before its first
step. Each live block records the method that placed it and a confidence.
"""

from __future__ import annotations

import bisect
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import replace
from itertools import compress

from oomdoctor.analysis.checkpointing import save_frame
from oomdoctor.analysis.frame_kinds import (
    LIBRARY,
    PYTHON_KINDS,
    TORCH,
    USER,
    frame_kind,
    in_torch_optim,
    is_python_source,
    lead_frame_index,
    per_stack,
)
from oomdoctor.analysis.phases import PhaseIndex, classify_stack, trains_by_frames
from oomdoctor.analysis.results import (
    FORWARD_PASSES,
    METHOD_FRAMES,
    METHOD_LIFETIME,
    METHOD_NAMES,
    METHOD_NONE,
    METHOD_PHASE,
    METHOD_REGISTRY,
    METHOD_SIZE_MATCH,
    METHOD_SIZE_OUTWEIGHS,
    PHASE_BACKWARD,
    PHASE_BEFORE,
    PHASE_BETWEEN,
    PHASE_EVALUATION,
    PHASE_FORWARD,
    PHASE_OPTIMIZER,
    PHASE_UNKNOWN,
    PHASE_ZERO_GRAD,
    ComponentShare,
    Group,
    LiveAllocation,
    LiveBlock,
    PhaseSpan,
)
from oomdoctor.analysis.sizing import MIN_BLOCK_BYTES
from oomdoctor.dump_metadata import DumpMetadata
from oomdoctor.metadata import COMPONENTS
from oomdoctor.model import ALLOC, FREE_COMPLETED, FREE_REQUESTED, OOM, Block, DeviceTrace, Frame, Stack, slashed

INDEX = {name: position for position, name in enumerate(COMPONENTS)}
PARAMETERS = INDEX["parameters"]
GRADIENTS = INDEX["gradients"]
OPTIMIZER_STATE = INDEX["optimizer_state"]
ACTIVATIONS = INDEX["activations"]
TEMPORARIES = INDEX["temporaries"]
INPUTS = INDEX["inputs"]
BUFFERS = INDEX["buffers"]
WORKSPACE = INDEX["workspace"]
PREALLOCATED = INDEX["preallocated"]
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
    PHASE_EVALUATION: ACTIVATIONS,  # under no_grad a pass keeps its outputs only: still the pass's
    PHASE_BACKWARD: TEMPORARIES,
    PHASE_OPTIMIZER: TEMPORARIES,
    PHASE_ZERO_GRAD: TEMPORARIES,
    PHASE_BETWEEN: INPUTS,
    PHASE_BEFORE: OTHER,
    PHASE_UNKNOWN: UNKNOWN,
}


class Registry:
    """oomdoctor's named tensors on one device: storage address -> (component index, name, bytes)."""

    def __init__(self, metadata: DumpMetadata | None, device: int):
        self.by_address: dict[int, tuple[int, str, int]] = {}
        # parameters' storages by whether they train: an address is frozen where every parameter
        # entry there says requires_grad False (a LoRA base), else it trains where one says True
        training: dict[int, bool] = {}
        for tensor in metadata.tensors if metadata is not None else ():
            component = _REGISTRY_COMPONENT.get(tensor.component) if tensor.component is not None else None
            if component is None or tensor.device not in (None, device):
                continue
            size = tensor.size_bytes if tensor.size_bytes is not None else 0
            self.by_address.setdefault(tensor.address, (component, tensor.name or "", size))
            if component == PARAMETERS and tensor.requires_grad is not None:
                training[tensor.address] = training.get(tensor.address, False) or tensor.requires_grad
        self.frozen: frozenset[int] = frozenset(address for address, trains in training.items() if not trains)
        # the registry says, parameter by parameter, whether they train (dumps before it did: not)
        self.says_training = bool(training)

    def __bool__(self) -> bool:
        return bool(self.by_address)


_UNPLACED = (UNKNOWN, METHOD_NONE, 0.0)


def series_classifier(registry: Registry, pre_trace: Mapping[int, tuple[int, str, float]]):
    """Component of an allocation as seen when it happens (for the memory-over-time series), and
    of one made before the trace (the registry's, else `pre_trace_placements`')."""
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
        if by_address:
            return OTHER
        return pre_trace.get(address, _UNPLACED)[0]

    return component_of_alloc, component_of_pre_existing


@per_stack
def source_line(stack: Stack) -> str | None:
    """The innermost frame of the user's own Python code, as `file:line in function`.

    C++ frames (with `stacks="all"`) and frames inside torch or installed packages are skipped; in
    a notebook, and when the stack has no frame of the user's, the innermost frame of a model
    library stands in, else the innermost Python frame (`frame_kinds.lead_frame_index`).
    """
    position = lead_frame_index(stack)
    if position is None:
        return None
    frame = stack[position]
    filename = frame.filename
    if frame_kind(frame) == USER and filename.endswith(".py"):
        filename = slashed(filename)
    return f"{filename}:{frame.line} in {frame.name}"


def _stack_mentions(stack: Stack, names: tuple[str, ...]) -> bool:
    return any(frame.name in names for frame in stack)


# The functions in which an optimizer makes its state (torch.optim's lazy init in the first step)
_STATE_INIT_FUNCTIONS = ("_init_group", "zeros_like", "_init_state")


# ---- blocks from before the trace -------------------------------------------------------------
#
# A block allocated before recording began has no alloc event: what it is comes, in order of trust,
# from its own frames (the dump's segments keep the stack of each live block; torch 2.0 keeps a
# per-block history), from what the trace does to it (freed by zero_grad: a gradient; freed by
# the optimizer step that replaces it: optimizer state), and from the shapes of the frame-less
# blocks taken together (a model's parameter shapes repeat once per copy of the model states).
# Nothing else makes it a parameter: without evidence it is "unknown".

# torch's default cuBLAS workspace before Hopper (CUBLAS_WORKSPACE_CONFIG ":4096:2:16:8"): one per
# handle and stream, allocated through the caching allocator at the first matmul and never freed.
CUBLAS_DEFAULT_WORKSPACE_BYTES = 4096 * 1024 * 2 + 16 * 1024 * 8
STATE_SITE_FRAMES = 1  # a user-written optimizer's allocation site: its innermost frame of user or library code
_WORKSPACE_FRAME_WORD = "workspace"  # in the C++ frame that allocates one (cuBLAS getNewWorkspace, cuDNN Workspace)
# Words in the names of user code that allocates a kind of memory (frameworks name them so).
_PREALLOCATED_WORDS = re.compile(r"kv_?cache|cache_engine|allocate_cache|init_cache|static_?cache|mem(ory_)?pool")
# Whole words of a name (split at "_", "." and digits): a word inside another (`hyperparam`,
# `optimized`, `million`, `gradio`, `upgrade`) says nothing.
_OPTIMIZER_WORDS = frozenset(
    {"optim", "optimizer", "optimizers", "adam", "adamw", "sgd", "lion", "adafactor", "lamb", "shampoo", "muon"}
    | {"sophia", "adagrad", "rmsprop", "nadam", "nadamw", "radam", "adamp", "adamax", "adabelief", "lars"}
    | {"novograd", "prodigy", "adan"}
)
_PARAMETER_WORDS = frozenset({"weight", "weights", "param", "params", "parameter", "parameters"})
_PARAMETER_PHRASES = re.compile(r"load_state_dict|from_pretrained|load_model|model_provider")
_GRADIENT_WORDS = frozenset({"grad", "grads", "gradient", "gradients"})
_WORD_SPLIT = re.compile(r"[^a-z]+")
_CAMEL_CASE = re.compile(r"(?<=[a-z])(?=[A-Z])")  # initWeights, AdamOptimizer: words too


def _words(name: str) -> set[str]:
    return set(_WORD_SPLIT.split(_CAMEL_CASE.sub("_", name).lower()))


_DATA_WORDS = re.compile(r"batch|collate|__next__|data_?loader|pin_memory|prefetch|^to$|^cuda$|^to_device$")
_NAME_CONFIDENCE = 0.4  # a kind read from the names of the user's functions and files
_WEIGHT_READER_CONFIDENCE = 0.5  # weights read from a file by a library that does so
_USER_FRAMES_READ = 4  # innermost user frames whose names are read
# Copies of one parameter set that the frame-less blocks may hold: parameters, gradients and the
# two moments of Adam-like optimizers (in that order of likelihood).
_MODEL_STATE_KINDS = ("parameters", "gradients", "optimizer_state", "optimizer_state")
# Copies of the parameters beyond the model states the optimizer explains: an EMA of the weights, or
# fp32 masters beside a half-precision model. Read only where the trace names the optimizer, so the
# moments it keeps are known (`_optimizer_moments`).
_EXTRA_COPIES = 1
# torch.optim's files, by how many moments of each parameter the optimizer keeps (its state the size
# of the parameter): Adam and its variants two, SGD (with momentum) and Adagrad one.
_TWO_MOMENT_FILE = re.compile(r"(?:^|/)torch/optim/(?:adam|adamw|nadam|radam|adamax)\.py$")
_ONE_MOMENT_FILE = re.compile(r"(?:^|/)torch/optim/(?:sgd|adagrad)\.py$")
# An optimizer's moments quantised to one byte an element, beside the parameters (`_quantised_moments`):
# (bytes of a parameter's block per byte of a moment's, moments a parameter), likeliest first: fp32
# weights with two 8-bit moments (8-bit Adam), with one (8-bit SGD momentum, Adagrad), 16-bit weights
# with two. (One block at half a parameter's bytes is as likely a 16-bit copy of fp32 weights: not read.)
_QUANTISED_MOMENTS = ((4, 2), (4, 1), (2, 2))
_QUANTISED_SHARE = 0.9  # of the bytes of the blocks left as parameters, those with their moments beside them
_QUANTISED_SHAPES_MIN = 2  # moment shapes found: one could be a coincidence of sizes
_QUANTISED_CONFIDENCE = 0.3
_COPY_TOLERANCE = 0.01  # bytes in shapes that break a k-copy pattern, as a share of the frame-less bytes
_COPY_SHAPES_SHARE = 2 / 3  # of the repeated shapes, those that must follow the pattern
# One copy of a model built of identical layers: shapes that repeat once per layer.
_GRADIENT_COPIES_SHARE = 0.9  # of the frame-less bytes, those whose shapes hold exactly k gradient sets
_LAYERS_MIN = 4  # fewer layers cannot be told from copies of a small model's states
_LAYER_SHAPES_MIN = 3  # distinct shapes a layer has (its matrices, biases, norms)
_LAYER_BYTES_SHARE = 0.9  # of the bytes in repeated shapes, those that repeat a multiple of the layer count
_LAYERS_SHARE = 1 / 2  # of the frame-less bytes, those the layers hold
_WIDTH_MIN_BYTES = 256  # the smallest per-layer vector taken for the model's width (no scalar buffer)
_LAYER_CONFIDENCE = 0.3  # weights read from the shapes alone
_SAME_SHAPE_PER_COMPANION = 4  # matrices of one shape in a layer per smaller tensor beside them (q, k, v, o)


@per_stack
def _python_user_frames(stack: Stack) -> tuple[tuple[str, str], ...]:
    """(file stem, function) of the innermost user frames, as written (camelCase splits into words)."""
    found: list[tuple[str, str]] = []
    for frame in stack:
        filename = frame.path
        if not filename.endswith(".py") or "/torch/" in filename or "<frozen" in filename:
            continue
        stem = filename.rsplit("/", 1)[-1][:-3]
        found.append((stem, frame.name))
        if len(found) == _USER_FRAMES_READ:
            break
    return tuple(found)


def made_by_code_outside_torch(stack: Stack) -> bool:
    """Whether the stack holds Python frames outside torch (the script's or a library's own code)."""
    return bool(_python_user_frames(stack))


@per_stack
def _workspace_frames(stack: Stack) -> bool:
    """Whether a C++ frame of the stack (recorded with `stacks="all"`) allocates a library workspace."""
    return any(_WORKSPACE_FRAME_WORD in frame.name.lower() for frame in stack if not frame.filename.endswith(".py"))


# Libraries that read tensors from a file (torch.load, safetensors' load_file and safe_open): what
# they place on the GPU is weights (or a resumed run's state), never a batch.
_WEIGHT_READERS = ("/safetensors/", "torch/serialization.py")


@per_stack
def _reads_weights(stack: Stack) -> bool:
    """Whether the stack reads tensors from a file (a weights reader's frames) outside data loading
    (a dataset of cached tensors is read so too)."""
    return not _loads_data(stack) and any(
        reader in frame.path for frame in stack if is_python_source(frame) for reader in _WEIGHT_READERS
    )


def reads_weights(stack: Stack) -> bool:
    """Whether the stack reads tensors from a file (torch.load, safetensors) outside data loading:
    weights, or a resumed run's state, being loaded."""
    return _reads_weights(stack)


@per_stack
def _placed_by_names(stack: Stack) -> tuple[int, str, float] | None:
    """(component, method, confidence) of a block by what its code is called: a library that reads
    weights from a file (frames), else the words of the user's own function and file names
    (names, a low confidence: a name is the user's choice, not torch's evidence)."""
    if _reads_weights(stack):
        return PARAMETERS, METHOD_FRAMES, _WEIGHT_READER_CONFIDENCE
    named = _by_names(stack)
    return (named, METHOD_NAMES, _NAME_CONFIDENCE) if named is not None else None


# A script's own entry points: they run the whole program, so the script's file name (train_adamw.py,
# finetune_lora.py) says what the program is about, not what their lines allocate.
_SCRIPT_ENTRIES = frozenset({"<module>", "main"})


@per_stack
def _by_names(stack: Stack) -> int | None:
    """The kind of memory the user's own function and file names say they allocate, if any (the
    file's name only for a function of it that is not the script's entry point)."""
    for stem, function in _python_user_frames(stack):
        if function in _SCRIPT_ENTRIES:
            stem = ""
        text = f"{stem} {function}".lower()
        if _PREALLOCATED_WORDS.search(text):
            return PREALLOCATED
        words = _words(stem) | _words(function)
        if words & _OPTIMIZER_WORDS:
            return OPTIMIZER_STATE
        if words & _PARAMETER_WORDS or _PARAMETER_PHRASES.search(text):
            return PARAMETERS
        if _words(function) & _GRADIENT_WORDS:
            return GRADIENTS
    return None


def preallocates(stack: Stack) -> bool:
    """Whether the user's own function and file names say the stack makes a pre-allocation (a KV
    cache, a memory pool sized up front), as they place a live block so."""
    return _by_names(stack) == PREALLOCATED


@per_stack
def _loads_data(stack: Stack) -> bool:
    """Whether the stack makes or moves a batch: torch's data loading, or user code named so."""
    for frame in stack:
        if frame.path.find("torch/utils/data/") >= 0:
            return True
    return any(_DATA_WORDS.search(function.lower()) for _, function in _python_user_frames(stack))


@per_stack
def _in_constructor(stack: Stack) -> bool:
    return any(function == "__init__" for _, function in _python_user_frames(stack))


def _phase_of(phases: PhaseIndex, index: int) -> str | None:
    span = phases.span_of(index)
    return span.phase if span is not None else None


@per_stack
def _makes_parameter(stack: Stack, buffer_line: int | None = None) -> bool:
    """Whether a block made before the first step by this stack is a parameter (as `_infer` places
    one by its frames): a module's setup (not its buffers', `buffer_line`), a function named so, or
    a user constructor that is not an optimizer's."""
    cls = classify_stack(stack)
    if cls == "module-setup":
        return not moved_as_buffer(stack, buffer_line)
    if cls == PHASE_OPTIMIZER:
        return False
    named = _placed_by_names(stack)
    if named is not None:
        return named[0] == PARAMETERS
    return _in_constructor(stack)


# Module._apply (what `.cuda()`, `.to()`, `.half()` run) converts a module's parameters, then each
# parameter's gradient, then its buffers, each in its own line of torch/nn/modules/module.py, the
# buffers' last: the innermost `_apply` frame of a block it made says which loop made it.
_MODULE_FILE = "torch/nn/modules/module.py"
_APPLY = "_apply"
_APPLY_LOOPS = 3  # the lines at which Module._apply converts tensors: parameters, gradients, buffers


def _is_apply(frame: Frame) -> bool:
    return frame.name == _APPLY and frame.path.endswith(_MODULE_FILE)


@per_stack
def _apply_frame(stack: Stack) -> int | None:
    """The position in a stack of its innermost `Module._apply` frame (the loop that converted the
    tensor), if any."""
    for position, frame in enumerate(stack):
        if _is_apply(frame):
            return position
    return None


@per_stack
def _apply_line(stack: Stack) -> int | None:
    position = _apply_frame(stack)
    return stack[position].line if position is not None else None


def apply_buffer_line(made: Sequence[tuple[Stack, int]]) -> int | None:
    """The line of torch's Module._apply at which it converts buffers, read from (stack, requested
    bytes) of the blocks it made in one dump (the line differs between torch versions, the order of
    its loops does not): the last of the lines seen, where one conversion (the same frames outside
    `_apply` and its recursion into submodules: one `.cuda()` call) made blocks at it and at an
    earlier line, and where at least three
    lines are seen (parameters, gradients, buffers), or two and the later one made a block of a
    size the earlier did not (a gradient is its parameter's size; BatchNorm's step count, a
    quantised weight, a rotary table are of none). None where the blocks do not say: one line, two
    of which the later may be the gradients', or lines no one conversion shares."""
    sizes_at: dict[int, set[int]] = defaultdict(set)
    callers_at: dict[int, set[Stack]] = defaultdict(set)
    for stack, requested in made:
        position = _apply_frame(stack)
        if position is not None:
            line = stack[position].line
            sizes_at[line].add(requested)
            outer = position + 1
            while outer < len(stack) and _is_apply(stack[outer]):  # the recursion into submodules
                outer += 1
            callers_at[line].add(stack[outer:])
    if len(sizes_at) < _APPLY_LOOPS - 1:
        return None
    last = max(sizes_at)
    if not any(callers_at[last] & callers_at[line] for line in sizes_at if line != last):
        return None
    if len(sizes_at) >= _APPLY_LOOPS or sizes_at[last] - sizes_at[min(sizes_at)]:
        return last
    return None


def trace_buffer_line(trace: DeviceTrace, blocks: Collection[tuple[Stack, int]] = ()) -> int | None:
    """`apply_buffer_line` of a device's trace's allocations and of `blocks` (the stacks and
    requested bytes of the blocks the dump keeps). Each distinct stack of the trace is read once."""
    allocs = trace.positions(ALLOC)
    numbers, stacks = trace.stacks_at(allocs)
    moving = {number for number, stack in stacks.items() if _apply_line(stack) is not None}
    made: list[tuple[Stack, int]] = []
    if moving:
        # each distinct (stack, requested bytes) once, picked in C: `apply_buffer_line` reads only
        # which of them occur, and a model moved every step makes the same ones again and again
        kept = list(map(moving.__contains__, numbers))
        pairs = set(zip(compress(numbers, kept), compress(map(trace.sizes.__getitem__, allocs), kept)))
        made = [(stacks[number], requested) for number, requested in pairs]
    made.extend((stack, requested) for stack, requested in blocks if _apply_line(stack) is not None)
    return apply_buffer_line(made)


def moved_as_buffer(stack: Stack, buffer_line: int | None) -> bool:
    """Whether Module._apply made the block in its buffers' loop (`apply_buffer_line`)."""
    return buffer_line is not None and _apply_line(stack) == buffer_line


# DDP's reducer allocates its gradient buckets in C++, called from these functions of
# torch/nn/parallel/distributed.py: the constructor's `_ddp_init_helper` (dist.Reducer) and the
# bucket rebuild after the first iteration (`_pre_forward`, and the join hook's `main_hook`).
# Without gradient_as_bucket_view nothing in Python reaches the buckets, so no registry names them.
_DDP_FILE = "torch/nn/parallel/distributed.py"
_DDP_BUCKET_FUNCTIONS = frozenset({"_ddp_init_helper", "_pre_forward", "main_hook"})


@per_stack
def ddp_bucket_frames(stack: Stack) -> bool:
    """Whether the innermost Python frame of a stack is where DDP's reducer makes its gradient
    buckets (`_DDP_BUCKET_FUNCTIONS`)."""
    for frame in stack:
        filename = frame.path
        if filename.endswith(".py"):
            return filename.endswith(_DDP_FILE) and frame.name in _DDP_BUCKET_FUNCTIONS
    return False


# Optimizers that keep only this rank's share of the optimizer state (ZeRO stage 1 and up): torch's
# ZeroRedundancyOptimizer, which runs its local optimizer on the rank's partition of the parameters,
# and DeepSpeed's ZeRO optimizers (their state made for the rank's flat partition).
_SHARDED_OPTIMIZER_FILES = ("torch/distributed/optim/zero_redundancy_optimizer.py",)
_SHARDED_OPTIMIZER_FOLDERS = ("deepspeed/runtime/zero/",)


@per_stack
def sharded_optimizer_frames(stack: Stack) -> bool:
    """Whether a stack runs inside an optimizer that shards its state across ranks."""
    for frame in stack:
        filename = frame.path
        if filename.endswith(_SHARDED_OPTIMIZER_FILES) or any(f in filename for f in _SHARDED_OPTIMIZER_FOLDERS):
            return True
    return False


@per_stack
def series_component_by_stack(stack: Stack) -> int | None:
    """The component the memory-over-time series gives an allocation by its own stack, whatever
    the phase it was made in (None: by its phase), as the live blocks are placed: DDP's gradient
    buckets, rebuilt inside the forward after the first iteration (`_pre_forward`), are gradients
    the reducer keeps for the whole run; FSDP's parameters and their all-gathers, made inside a
    forward or backward, are parameters. Neither is the activations of the pass that made them."""
    if ddp_bucket_frames(stack):
        return GRADIENTS
    if fsdp_parameter_frames(stack):
        return PARAMETERS
    return None


def components_by_own_stacks(trace: DeviceTrace) -> dict[int, int]:
    """alloc event -> its component by its own stack (`series_component_by_stack`), for the events
    whose stack gives one; each distinct stack read once."""
    allocs = trace.positions(ALLOC)
    if not allocs:
        return {}
    numbers, stacks = trace.stacks_at(allocs)
    by_number = {n: c for n, stack in stacks.items() if (c := series_component_by_stack(stack)) is not None}
    if not by_number:
        return {}
    return {index: by_number[n] for index, n in zip(allocs, numbers) if n in by_number}


# FSDP's own parameter storage: FSDP1's flat parameters (made, sharded and unsharded in
# _flat_param.py), FSDP2's sharded parameters (_fsdp_param.py) and its all-gather outputs (the
# unsharded parameters a forward or backward uses). Their gradients (reduce-scatter) are not.
_FSDP_PARAMETER_FILES = ("torch/distributed/fsdp/_flat_param.py", "torch/distributed/fsdp/_fully_shard/_fsdp_param.py")
_FSDP_COLLECTIVES = "torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py"


@per_stack
def fsdp_parameter_frames(stack: Stack) -> bool:
    """Whether the innermost torch frames of a stack are FSDP making or gathering parameters."""
    for frame in stack:
        filename = frame.path
        if not filename.endswith(".py"):
            continue
        if "grad" in frame.name.lower() or "reduce" in frame.name.lower():
            return False
        if filename.endswith(_FSDP_PARAMETER_FILES):
            return True
        if filename.endswith(_FSDP_COLLECTIVES) and "all_gather" in frame.name:
            return True
        # (another function of the collectives, its `allocate` of the all-gather's flat buffer,
        # is read by its caller: foreach_all_gather's buffer holds the gathered parameters,
        # foreach_reduce's the gradients)
        if "/torch/" not in filename:  # past torch's frames: the user's code decides nothing here
            return False
    return False


# A module's tensors moved onto the device inside a forward: an offload hook that brings a layer's
# weights in before its forward and sends them back after it (diffusers' enable_model_cpu_offload
# and accelerate's cpu_offload_with_hook call `module.to(device)`; accelerate's AlignDevicesHook,
# behind device_map offloading, calls its `set_module_tensor_to_device`, a name copied widely). The
# phase (a forward) would call them activations; they are the layer's parameters while it runs.
# (`_MODULE_FILE`, above: Module's own file.)
_MODULE_MOVES = frozenset({"_apply", "to", "cuda", "to_empty"})
_SET_MODULE_TENSOR = "set_module_tensor_to_device"


@per_stack
def moves_module_tensors(stack: Stack) -> bool:
    """Whether the stack moves or converts a module's own tensors (`Module.to`, `.cuda`, `_apply`)
    or sets one (accelerate's `set_module_tensor_to_device`)."""
    for frame in stack:
        if not is_python_source(frame):
            continue
        if frame.name == _SET_MODULE_TENSOR:
            return True
        if frame.name in _MODULE_MOVES and frame.path.endswith(_MODULE_FILE):
            return True
    return False


# A hook the user wrote (`p.data = host.to(device)` in a forward pre-hook, and back in its forward
# hook) moves a layer's weights without any frame of Module.to: the block's stack runs in a function
# that Module.__call__ called (`_call_impl`, or its `inner` closure) and that is no forward.
_HOOK_CALLERS = frozenset({"_call_impl", "inner"})


def module_hook_frame(stack: Stack) -> Frame | None:
    """The module hook a stack runs in: its innermost frame of the user's or a library's code,
    where torch's Module.__call__ called it and it is not a `forward` (None otherwise)."""
    for position, frame in enumerate(stack):
        if frame_kind(frame) not in (USER, LIBRARY):
            continue
        caller = next((f for f in stack[position + 1 :] if frame_kind(f) in PYTHON_KINDS), None)
        if (
            caller is None
            or caller.name not in _HOOK_CALLERS
            or not caller.path.endswith(_MODULE_FILE)
            or frame.name == "forward"
        ):
            return None
        return frame
    return None


def hook_moved_weights(
    trace: DeviceTrace, phases: PhaseIndex, live: Collection[LiveAllocation], after_target: int
) -> set[int]:
    """The allocation indices of the live blocks that are a layer's weights a module hook moved
    onto the device for the forward running at the target. Their hook's site (its frame) moved
    weights out again too: a hook freed one of the blocks it made earlier before the site ran
    again (the forward hook that sends them back, or the next layer's pre-hook), which only a
    free's own stack shows (not with `context="alloc"`, whose frees repeat the allocation's stack).
    A hook that keeps each layer's output (a feature extractor's clone) frees it only when it
    replaces it, the site having run again since. And they are the site's latest
    run of allocations: a block from an earlier run outlived the hook that let its weights go, so
    something else holds it (autograd, saving it for a backward: an activation, as the phase says).
    An input cast in a pre-hook is freed by the forward that uses it, not by a hook: no site."""
    candidates = {
        a.alloc_index
        for a in live
        if a.alloc_index is not None
        and _phase_of(phases, a.alloc_index) in FORWARD_PASSES
        and module_hook_frame(trace.frames_at(a.alloc_index)) is not None
    }
    if not candidates or frees_carry_alloc_stacks(trace):
        return set()
    actions, addrs = trace.actions, trace.addrs
    hook_of: dict[int, Frame | None] = {}  # id of a stack -> module_hook_frame (stacks are shared)

    def hook_at(index: int) -> Frame | None:
        stack = trace.frames_at(index)
        if id(stack) not in hook_of:
            hook_of[id(stack)] = module_hook_frame(stack)
        return hook_of[id(stack)]

    site_at: dict[int, tuple[Frame, int]] = {}  # address -> the hook site that made the block there, its run
    run_of: dict[int, int] = {}  # allocation index -> its run
    latest_run: dict[Frame, int] = {}  # hook site -> its latest run
    moved_out: set[Frame] = set()  # sites a block of which a hook freed before the site ran again
    runs, current = 0, None
    for index in range(min(after_target + 1, len(trace))):
        action = actions[index]
        if action == ALLOC:
            site = None
            if _phase_of(phases, index) in FORWARD_PASSES:
                site = hook_at(index)
            if site is None:
                site_at.pop(addrs[index], None)
                current = None
                continue
            if site != current:
                runs += 1
                current = site
            site_at[addrs[index]] = (site, runs)
            run_of[index] = runs
            latest_run[site] = runs
        elif action == FREE_REQUESTED:
            made = site_at.pop(addrs[index], None)
            if made is not None and latest_run[made[0]] == made[1] and hook_at(index) is not None:
                moved_out.add(made[0])  # freed by a hook before its site ran again
    return {
        index
        for index in candidates
        if (site := module_hook_frame(trace.frames_at(index))) in moved_out and run_of.get(index) == latest_run[site]
    }


def _in_module_call(stack: Stack) -> bool:
    """Whether a stack runs inside a module's call (torch's Module.__call__ is on it)."""
    return any(
        frame.name in _HOOK_CALLERS or frame.name == "_wrapped_call_impl"
        for frame in stack
        if frame.path.endswith(_MODULE_FILE)
    )


def kept_past_backward_by_the_loop(
    trace: DeviceTrace, phases: PhaseIndex, live: Collection[LiveAllocation], after_target: int
) -> set[int]:
    """The allocation indices of live blocks that the loop's own code made after its model returned
    and before the backward (no module call on the stack, after the forward's last allocation inside
    one), at a site one of whose blocks outlived the backward that followed: autograd did not keep
    it for that backward, so it is no activation of the pass but what the loop holds, an input by the
    phase the markers give it (the gradient a pipeline stage receives from the next stage and passes
    to `backward`, a loss the loop keeps). What the loop's code computes for the backward (a loss's
    intermediates) is freed by it, and stays an activation."""
    in_call: dict[int, bool] = {}  # id of a stack -> _in_module_call (stacks are shared)

    def frames_in_call(index: int) -> tuple[Stack, bool]:
        stack = trace.frames_at(index)
        known = in_call.get(id(stack))
        if known is None:
            known = in_call[id(stack)] = _in_module_call(stack)
        return stack, known

    spans = [span for span in phases.spans if span.phase in FORWARD_PASSES and span.first_index <= after_target]
    if not spans or not any(
        a.alloc_index is not None
        and _phase_of(phases, a.alloc_index) in FORWARD_PASSES
        and (stack := trace.frames_at(a.alloc_index))
        and not _in_module_call(stack)
        for a in live
    ):
        return set()
    made: dict[int, tuple[int, Stack]] = {}  # alloc index -> (its backward's last index, its stack)
    for span in spans:
        following = phases.span_after(span)
        if following is None or following.phase != PHASE_BACKWARD or following.first_index > after_target:
            continue
        allocs = trace.positions_in(ALLOC, span.first_index, min(span.last_index, after_target) + 1)
        last_inside = next((index for index in reversed(allocs) if frames_in_call(index)[1]), None)
        if last_inside is None:
            continue
        for index in allocs:
            if index > last_inside:
                stack, inside = frames_in_call(index)
                if stack and not inside:
                    made[index] = (following.last_index, stack)
    return _outlived_their_backward(trace, made, live, after_target)


def _outlived_their_backward(
    trace: DeviceTrace, made: Mapping[int, tuple[int, Stack]], live: Collection[LiveAllocation], after_target: int
) -> set[int]:
    """Of `made` (alloc index -> (the last index of the backward after it, its stack)), the live ones
    at a site one of whose blocks outlived that backward: the loop held them, not autograd."""
    if not made:
        return set()
    live_made = {a.alloc_index for a in live if a.alloc_index is not None and a.alloc_index in made}
    if not live_made:
        return set()
    # which of those sites had a block outlive its backward
    open_at: dict[int, int] = {}
    outlived: set[Stack] = set()
    actions, addrs = trace.actions, trace.addrs
    for index in range(min(after_target + 1, len(trace))):
        action = actions[index]
        if action == ALLOC:
            if index in made:
                open_at[addrs[index]] = index
            else:
                open_at.pop(addrs[index], None)
        elif action == FREE_REQUESTED and (alloc := open_at.pop(addrs[index], None)) is not None:
            backward_end, stack = made[alloc]
            if index > backward_end:
                outlived.add(stack)
    for alloc in open_at.values():  # alive at the target, past a backward that ended before it
        backward_end, stack = made[alloc]
        if backward_end < after_target:
            outlived.add(stack)
    return {index for index in live_made if made[index][1] in outlived}


def computed_for_the_backward(
    trace: DeviceTrace, phases: PhaseIndex, live: Collection[LiveAllocation], after_target: int
) -> set[int]:
    """Where the markers give the phases: the allocation indices of live blocks the loop's own code
    made after a training forward returned and before its backward (the marker phases call that code
    between steps; zero_grad may run in it, as a closure runs it), outside any module call, not
    making or moving a batch nor named for what it is, and at no site one of whose blocks outlived
    that backward: what the loop computes for the backward (a loss's intermediates, a loss computed
    outside the model), an activation of the forward as docs/definitions.md says. Where the target
    lies in that code before any backward began, nothing has outlived one yet.

    The work is the live blocks' and the windows' (the loop's code between a forward and its
    backward), not the trace's: a site is read only where a live block was made at it."""
    spans = phases.spans
    actions, addrs = trace.actions, trace.addrs
    # (first, last, the last index of the backward after it, None where it had not begun by the
    # target) of each window of the loop's code after a forward
    windows: list[tuple[int, int, int | None]] = []
    position = 0
    while position < len(spans):
        if spans[position].phase != PHASE_FORWARD or spans[position].last_index >= after_target:
            position += 1
            continue
        window, position = [], position + 1
        while position < len(spans) and spans[position].phase in (PHASE_BETWEEN, PHASE_ZERO_GRAD):
            if spans[position].phase == PHASE_BETWEEN and spans[position].first_index <= after_target:
                window.append(spans[position])
            position += 1
        following = spans[position] if position < len(spans) else None
        if following is not None and following.first_index <= after_target and following.phase != PHASE_BACKWARD:
            continue  # another pass or an optimizer step, no backward: not the loss code of a step
        backward = following.last_index if following is not None and following.first_index <= after_target else None
        windows.extend((span.first_index, min(span.last_index, after_target), backward) for span in window)
    if not windows:
        return set()
    loop_code_of: dict[int, bool] = {}  # id of a stack -> the loop's own code, as above (stacks are shared)

    def loop_code(stack: Stack) -> bool:
        known = loop_code_of.get(id(stack))
        if known is None:
            known = loop_code_of[id(stack)] = bool(
                stack
                and not _in_module_call(stack)
                and not _loads_data(stack)
                and _placed_by_names(stack) is None
                and save_frame(stack) is None
            )
        return known

    starts = [first for first, _, _ in windows]

    def window_of(index: int) -> tuple[int, int, int | None] | None:
        k = bisect.bisect_right(starts, index) - 1
        return windows[k] if k >= 0 and index <= windows[k][1] else None

    candidates = {
        a.alloc_index: stack
        for a in live
        if a.alloc_index is not None
        and a.alloc_index <= after_target
        and window_of(a.alloc_index) is not None
        and loop_code(stack := trace.frames_at(a.alloc_index))
    }
    if not candidates:
        return set()
    sites = set(candidates.values())
    # which of those sites had a block outlive its backward: not freed by the backward's end, which
    # came before the target (a block's first free after it is its own). The statement that called
    # the backward (`(loss / n).backward()`) frees its operands as it ends, before the loop allocates
    # again: freed by then, a block did not outlive the backward
    outlived: set[Stack] = set()
    for first, last, backward in windows:
        if backward is None:
            continue  # the target comes before this backward began: nothing outlived it yet
        try:
            backward_end = actions.index(ALLOC, backward + 1) - 1
        except ValueError:
            backward_end = len(actions)
        if backward_end >= after_target:
            continue
        made = {}
        for index in trace.positions_in(ALLOC, first, last + 1):
            stack = trace.frames_at(index)
            if stack in sites and loop_code(stack):
                made[addrs[index]] = (index, stack)
        if not made:
            continue
        end = backward_end + 1
        freed: set[int] = set()
        for index in compress(range(first, end), map(made.__contains__, addrs[first:end])):
            address = addrs[index]
            if actions[index] == FREE_REQUESTED and index > made[address][0] and address not in freed:
                freed.add(address)
        outlived.update(stack for address, (_, stack) in made.items() if address not in freed)
    return {index for index, stack in candidates.items() if stack not in outlived}


# DataParallel re-makes its replicas and splits its batch inside its forward, on every device but
# the first, every step: torch's replicate broadcasts the model (the replica's parameters and
# buffers), the scatter (DataParallel.scatter, torch's or a subclass's such as torch_geometric's,
# and torch's scatter_kwargs) moves each device's share of the inputs. The phase (a forward) would
# call both activations.
_REPLICATE_FILE = "torch/nn/parallel/replicate.py"
_SCATTER_FUNCTIONS = frozenset({"scatter", "scatter_kwargs"})
_SCATTER_FILES = ("/data_parallel.py", "/scatter_gather.py")


@per_stack
def data_parallel_kind(stack: Stack) -> int | None:
    """PARAMETERS for a block DataParallel's replicate made, INPUTS for one its scatter made (the
    innermost of the two frames decides), None otherwise."""
    for frame in stack:
        filename = frame.path
        if filename.endswith(_REPLICATE_FILE):
            return PARAMETERS
        if frame.name in _SCATTER_FUNCTIONS and filename.endswith(_SCATTER_FILES):
            return INPUTS
    return None


@per_stack
def _backward_made(stack: Stack) -> bool:
    return any("AccumulateGrad" in frame.name for frame in stack if not frame.filename.endswith(".py"))


# torch.optim's update functions (`_multi_tensor_adam`, `_single_tensor_rmsprop`, `_fused_adamw`):
# every optimizer but SGD makes its state elsewhere (its `_init_group`, its constructor), so what
# these allocate is the update's temporaries; SGD's make the momentum buffers at the first step.
_UPDATE_FUNCTION = re.compile(r"_(single_tensor|multi_tensor|fused)_(?!sgd$)\w+")


@per_stack
def _update_temporary(stack: Stack) -> bool:
    """Whether the innermost torch.optim frame of a stack is an update function that makes no state."""
    for frame in stack:
        if in_torch_optim(frame.filename):
            return _UPDATE_FUNCTION.fullmatch(frame.name) is not None
    return False


def _place_by_own_frames(
    stack: Stack, requested: int, never_freed: bool, buffer_line: int | None = None
) -> tuple[int, str, float] | None:
    """A pre-trace block placed by the stack the dump keeps for it (`buffer_line`: `apply_buffer_line`)."""
    if _workspace_frames(stack):
        return WORKSPACE, METHOD_FRAMES, 0.9
    if never_freed and requested == CUBLAS_DEFAULT_WORKSPACE_BYTES:
        return WORKSPACE, METHOD_SIZE_MATCH, 0.5
    if not stack:
        return None
    return _placed_by_stack(stack, buffer_line)


@per_stack
def _placed_by_stack(stack: Stack, buffer_line: int | None) -> tuple[int, str, float] | None:
    """`_place_by_own_frames` of a stack with frames, after the checks that read the block's size."""
    if save_frame(stack) is not None:  # a copy made to save a checkpoint (a state dict gathered): no model state
        return OTHER, METHOD_FRAMES, 0.6
    if ddp_bucket_frames(stack):
        return GRADIENTS, METHOD_FRAMES, 0.8
    if fsdp_parameter_frames(stack):
        return PARAMETERS, METHOD_FRAMES, 0.8
    cls = classify_stack(stack)
    if cls == PHASE_OPTIMIZER and _update_temporary(stack):  # alive at the dump inside the update
        return TEMPORARIES, METHOD_FRAMES, 0.7
    if cls == PHASE_OPTIMIZER:  # made by an optimizer step and outlived it: the optimizer's state
        return OPTIMIZER_STATE, METHOD_FRAMES, 0.8
    if cls == PHASE_BACKWARD:  # made by the autograd engine and outlived the backward
        return GRADIENTS, METHOD_FRAMES, 0.8 if _backward_made(stack) else 0.6
    if cls == "module-setup":
        if moved_as_buffer(stack, buffer_line):
            return BUFFERS, METHOD_FRAMES, 0.7
        return PARAMETERS, METHOD_FRAMES, 0.8
    if cls in FORWARD_PASSES:  # a forward's output kept since before the trace (whatever its code is named)
        return ACTIVATIONS, METHOD_FRAMES, 0.6
    named = _placed_by_names(stack)
    if named is not None:
        return named
    if cls == PHASE_ZERO_GRAD:
        return TEMPORARIES, METHOD_FRAMES, 0.4
    if _loads_data(stack):  # a batch made or moved (data loading, or user code named for it)
        return INPUTS, METHOD_FRAMES, 0.5
    return None


_REPLACED_BY_STEP = (OPTIMIZER_STATE, METHOD_LIFETIME, 0.5)  # a pre-trace block an optimizer step freed
_REPLACED_COPIES = 3  # a weight and two moments of each shape, all replaced by the step
_REPLACED_WEIGHT_CONFIDENCE = 0.4  # which copy of a shape is the weight is unknown: its bytes are not


def _place_by_fate(free_index: int | None, phases: PhaseIndex) -> tuple[int, str, float] | None:
    """A pre-trace block placed by what the trace later does to it."""
    if free_index is None:
        return None
    span = phases.span_of(free_index)
    if span is None:
        return None
    if span.phase == PHASE_ZERO_GRAD:
        return GRADIENTS, METHOD_LIFETIME, 0.7
    if span.phase == PHASE_OPTIMIZER:  # replaced by the step that updates it
        return _REPLACED_BY_STEP
    if span.phase == PHASE_BACKWARD:  # saved for this backward by a forward before the trace
        return ACTIVATIONS, METHOD_LIFETIME, 0.4
    # freed by a forward or between steps: not a model state (nothing frees those there)
    return UNKNOWN, METHOD_LIFETIME, 0.0


def _weights_among_replaced(allocations: Sequence[LiveAllocation], placed: dict[int, tuple[int, str, float]]) -> None:
    """The pre-trace blocks an optimizer step replaced (_place_by_fate's optimizer state) that hold
    three copies of one set of shapes are a weight and two moments of each: a user-written Adam
    that makes its moments and its weights anew (`m = b1 * m + ...`, `p.data = p.data - lr * ...`),
    in a trace begun after the model was made (a wrapped ring buffer). One copy of each shape is
    the parameters (torch.optim updates both in place and replaces none). Changed in place."""
    replaced = [a for a in allocations if placed.get(a.address) == _REPLACED_BY_STEP]
    sizes = [(a.requested_bytes, a.size_bytes) for a in replaced]
    if not replaced or model_state_copies(sizes, _REPLACED_COPIES) != _REPLACED_COPIES:
        return
    counts = Counter(requested for requested, _ in sizes)
    weights: Counter[int] = Counter()
    for allocation in replaced:
        if weights[allocation.requested_bytes] < counts[allocation.requested_bytes] // _REPLACED_COPIES:
            weights[allocation.requested_bytes] += 1
            placed[allocation.address] = (PARAMETERS, METHOD_LIFETIME, _REPLACED_WEIGHT_CONFIDENCE)


def _shape_totals(sizes: Sequence[tuple[int, int]]) -> tuple[dict[int, int], dict[int, int]]:
    """Per requested size of (requested bytes, block bytes) pairs: how many blocks, and their bytes."""
    counts: dict[int, int] = defaultdict(int)
    held: dict[int, int] = defaultdict(int)
    for requested, size in sizes:
        counts[requested] += 1
        held[requested] += size
    return counts, held


def model_state_copies(sizes: Sequence[tuple[int, int]], kinds_possible: int) -> int:
    """How many copies of one set of shapes the frame-less pre-trace blocks hold, from their
    (requested bytes, block bytes): the largest k (at most `kinds_possible`) such that the shapes
    occur a multiple of k times: all but _COPY_TOLERANCE of the bytes, at least _COPY_SHAPES_SHARE
    of the shapes that repeat (the small ones, norms and biases, count there), and every shape that
    repeats at least _LAYERS_MIN times (one model's layers: a regular model's counts may all be
    even but for its final norm's shape, 2L + 1)."""
    counts, held = _shape_totals(sizes)
    total = sum(held.values())
    repeated = [n for n in counts.values() if n > 1]
    if not total or not repeated:
        return 1
    for copies in range(min(kinds_possible, len(_MODEL_STATE_KINDS) + _EXTRA_COPIES), 1, -1):
        broken = sum(held[r] for r, n in counts.items() if n % copies)
        regular = sum(1 for n in repeated if n % copies == 0)
        # a shape that repeats as a layer's do (a norm's weight: twice a layer and once more at the
        # end) but not k times over is one model's, whatever its bytes: copies repeat every shape.
        # Scalars are no layer's: a fused or capturable Adam keeps one step count per parameter on
        # the device, as many as the parameters, whatever the copies
        layered_broken = any(n >= _LAYERS_MIN and n % copies for r, n in counts.items() if r >= _WIDTH_MIN_BYTES)
        if (
            broken <= total * _COPY_TOLERANCE
            and regular >= _COPY_SHAPES_SHARE * len(repeated)
            and not layered_broken
            and not _stacked_alone(counts, held, copies)
        ):
            return copies
    return 1


def _stacked_alone(counts: Mapping[int, int], held: Mapping[int, int], copies: int) -> bool:
    """Whether, in each of `copies` copies, the shape holding the most bytes is stacked as a
    layer's is (_LAYERS_MIN times or more) and more than _SAME_SHAPE_PER_COMPANION times as often
    as any other shape: a layer holds at most a few matrices of one shape (an attention's q, k, v
    and output) and with them at least one smaller tensor (a bias, a norm), so a model's layers
    stack their shapes together, while one shape stacked alone is what a loop that keeps its
    outputs leaves (a list of predictions, a cache of features)."""
    largest = max(held, key=held.__getitem__)
    stacked = counts[largest] // copies
    others = max((n for r, n in counts.items() if r != largest), default=0) // copies
    return stacked >= _LAYERS_MIN and stacked > _SAME_SHAPE_PER_COMPANION * max(others, 1)


def layer_stack_weights(sizes: Sequence[tuple[int, int]]) -> set[int] | None:
    """The requested bytes, among the frame-less pre-trace blocks' (requested, block bytes), of one
    copy of a model built of identical layers, or None when the shapes show no such model.

    Layers: a count L (at least _LAYERS_MIN) such that at least _LAYER_SHAPES_MIN shapes occur a
    multiple of L times, holding _LAYER_BYTES_SHARE of the bytes in repeated shapes and
    _LAYERS_SHARE of all. The model's other weights (embeddings, heads) share its width: every
    matrix of a layer has it as one dimension, and the smallest vector that repeats once per layer
    and divides the largest layer shape (a norm's weight or a bias) is one row of it. Shapes of
    either kind are the weights; the rest (workspaces, masks of another width, scratch) are not
    placed."""
    counts, held = _shape_totals(sizes)
    total = sum(held.values())
    repeated_bytes = sum(held[r] for r, n in counts.items() if n > 1)
    if not total or _stacked_alone(counts, held, 1):
        return None
    # per layer count L: the shapes occurring a multiple of L times and their bytes, from the
    # divisors of each shape's count (work in proportion to the blocks, whatever the counts)
    shapes_of: dict[int, int] = defaultdict(int)
    bytes_of: dict[int, int] = defaultdict(int)
    for requested, count in counts.items():
        for layers in _divisors(count):
            if layers >= _LAYERS_MIN:
                shapes_of[layers] += 1
                bytes_of[layers] += held[requested]
    fitting = [
        layers
        for layers, shapes in shapes_of.items()
        if shapes >= _LAYER_SHAPES_MIN
        and bytes_of[layers] >= _LAYER_BYTES_SHARE * repeated_bytes
        and bytes_of[layers] >= _LAYERS_SHARE * total
    ]
    if not fitting:
        return None
    layers = max(fitting)
    per_layer = [r for r, n in counts.items() if n % layers == 0]
    weights = set(per_layer)
    largest = max(per_layer)
    vectors = [r for r, n in counts.items() if n >= layers and r >= _WIDTH_MIN_BYTES and largest % r == 0]
    if vectors:
        width = min(vectors)
        weights.update(r for r in counts if r % width == 0)
    return weights


def _divisors(number: int) -> list[int]:
    """The divisors of a positive integer."""
    small = [d for d in range(1, int(number**0.5) + 1) if number % d == 0]
    return small + [number // d for d in reversed(small) if d * d != number]


def attribute(
    live: Collection[LiveAllocation],
    *,
    trace: DeviceTrace,
    frames_of: Mapping[int, Stack],
    phases: PhaseIndex,
    registry: Registry,
    target_index: int | None,
    pre_trace: Mapping[int, tuple[int, str, float]],
    ran_out: bool | None = None,
    buffer_line: int | None = None,
) -> list[LiveBlock]:
    """Place every block live at the target (in `live`'s order, then largest first); blocks from
    before the trace as `pre_trace` (`pre_trace_placements`) placed them. `ran_out`: whether the
    process recorded an OOM on any device (None: whether this trace did); `buffer_line`: the line of
    Module._apply's buffers' loop (`trace_buffer_line`)."""
    exact = bool(registry)
    after_target = target_index if target_index is not None else len(trace) - 1
    frees = first_frees_after(trace, {a.address for a in live}, after_target + 1)
    # Where the call the trace ends in may still have been running when the dump was written: at its
    # last event where the process ran out on any device (the dump may be taken inside the failing
    # call, or while its traceback holds what it made, and another device's call was cut short with
    # it). Without an OOM the program wrote the dump between its calls, after that call returned:
    # what it made and never freed outlived it. (The annotations' END says the same where they were
    # recorded; before torch 2.5 nothing else does.)
    if ran_out is None:
        ran_out = len(trace.positions(OOM)) > 0
    open_until = len(trace) - 1 if ran_out else len(trace)
    parameter_sizes: set[int] = set()
    if not exact:
        for allocation in live:
            alloc_index = allocation.alloc_index
            if alloc_index is None:
                if pre_trace.get(allocation.address, _UNPLACED)[0] == PARAMETERS:
                    parameter_sizes.add(allocation.requested_bytes)
            else:
                span = phases.span_of(alloc_index)
                if (
                    span is not None
                    and span.phase == PHASE_BEFORE
                    and _makes_parameter(trace.frames_at(alloc_index), buffer_line)
                ):
                    parameter_sizes.add(allocation.requested_bytes)

    # the requested bytes of the live blocks whose own stacks make a parameter (Python code makes
    # weights), in a run the trace shows training: a block of these shapes without any frame, in a
    # phase the trace cannot tell (or before its first step), was made by a thread without Python,
    # the autograd engine's (AccumulateGrad): a gradient, as a frame-less pre-trace copy beside
    # framed weights is
    framed_weights: set[int] = set()
    if not exact and {span.phase for span in phases.spans} & {PHASE_BACKWARD, PHASE_OPTIMIZER, PHASE_ZERO_GRAD}:
        for allocation in live:
            own = frames_of.get(allocation.address, ())
            if own and _makes_parameter(own):
                framed_weights.add(allocation.requested_bytes)

    successors: set[int] = set()
    if not exact and any(
        a.alloc_index is not None and _phase_of(phases, a.alloc_index) == PHASE_OPTIMIZER for a in live
    ):
        seeds = [address for address, placed in pre_trace.items() if placed[0] == PARAMETERS]
        successors = parameter_successors(trace, phases, seeds, after_target)
    state = state_blocks(trace, phases, live, after_target) if not exact else set()
    hook_moved = hook_moved_weights(trace, phases, live, after_target) if not exact else set()
    held_by_loop = kept_past_backward_by_the_loop(trace, phases, live, after_target) if not exact else set()
    for_the_backward = computed_for_the_backward(trace, phases, live, after_target) if exact else set()

    blocks: list[LiveBlock] = []
    for address, alloc_index, size, requested in live:  # LiveAllocation's fields
        span = phases.span_of(alloc_index) if alloc_index is not None else None
        phase = span.phase if span is not None else PHASE_BEFORE
        step = span.step if span is not None else None
        stack = trace.frames_at(alloc_index) if alloc_index is not None else frames_of.get(address, ())
        own_stack = False  # the stack is the dump's block's, the trace entry having none
        if not stack and alloc_index is not None and address not in frees:
            # a trace recorded without stacks (context="state", the legacy API's default) while the
            # dump's block, this same allocation, keeps the stack it was made with
            stack = frames_of.get(address, ())
            own_stack = True
            if phase == PHASE_OPTIMIZER and classify_stack(stack) in (PHASE_FORWARD, PHASE_BACKWARD):
                # inside an optimizer step's window (its annotation) the closure runs the forward
                # and backward (Lightning's training step): the block's own stack says which, as
                # the trace's stacks would
                phase = classify_stack(stack)
        name = None
        # The registry names the tensors alive at the dump: a block freed after the target is another
        # allocation that once had the same address.
        known = registry.by_address.get(address) if address not in frees else None
        if known is not None:
            component, name, method, confidence = known[0], known[1], METHOD_REGISTRY, 1.0
        elif ddp_bucket_frames(stack):  # DDP's gradient buckets, which no registry reaches
            component, method, confidence = GRADIENTS, METHOD_FRAMES, 0.8
        elif fsdp_parameter_frames(stack):  # FSDP's flat, sharded or gathered parameters
            component, method, confidence = PARAMETERS, METHOD_FRAMES, 0.8
        elif alloc_index is not None and (replicated := data_parallel_kind(stack)) is not None:
            component, method, confidence = replicated, METHOD_FRAMES, 0.8  # no registry names a replica
        elif exact and alloc_index is not None and save_frame(stack) is not None:
            # a copy made to save a checkpoint (a state dict built or gathered): no model state, no input
            component, method, confidence = OTHER, METHOD_FRAMES, 0.8
        elif exact:
            component, method, confidence = PHASE_COMPONENT.get(phase, UNKNOWN), METHOD_PHASE, 0.9
            if alloc_index is None:
                component, method = OTHER, METHOD_LIFETIME
            elif alloc_index in for_the_backward:  # the loop's loss code after its forward, for the backward
                component, method, confidence = ACTIVATIONS, METHOD_LIFETIME, 0.7
        elif alloc_index is None:
            component, method, confidence = pre_trace.get(address, _UNPLACED)
        else:
            freed_at = frees.get(address)
            if _workspace_frames(stack):
                component, method, confidence = WORKSPACE, METHOD_FRAMES, 0.9
            elif phase in FORWARD_PASSES and moves_module_tensors(stack):
                # a layer's weights an offload hook moved onto the device for its forward
                component, method, confidence = PARAMETERS, METHOD_FRAMES, 0.7
            elif alloc_index in hook_moved:  # the same, moved by a hook of the user's own
                component, method, confidence = PARAMETERS, METHOD_LIFETIME, 0.6
            elif alloc_index in held_by_loop:  # the loop's own, after its forward, held past the backward
                component, method, confidence = INPUTS, METHOD_LIFETIME, 0.5
            elif alloc_index in successors:  # a parameter the optimizer step replaced out of place
                component, method, confidence = PARAMETERS, METHOD_LIFETIME, 0.6
            elif requested == CUBLAS_DEFAULT_WORKSPACE_BYTES and _outlives(span, freed_at, open_until):
                component, method, confidence = WORKSPACE, METHOD_SIZE_MATCH, 0.6
            elif (
                not stack
                and requested in framed_weights
                and (phase in (PHASE_UNKNOWN, PHASE_BEFORE) or (phase == PHASE_OPTIMIZER and own_stack))
            ):
                # (before the first step: a ring buffer that wrapped inside a backward begins with
                # the engine's frame-less allocations, which no phase names; in an optimizer step's
                # window, a block that kept no stack of its own either: its closure's backward's)
                component, method, confidence = GRADIENTS, METHOD_SIZE_MATCH, 0.4
            else:
                component, method, confidence = _infer(
                    alloc_index,
                    phase,
                    span,
                    stack,
                    requested,
                    parameter_sizes,
                    after_target,
                    freed_at,
                    open_until,
                    state,
                    buffer_line,
                )
            if (
                component == OTHER
                and span is not None
                and (
                    (span.phase == PHASE_BEFORE and method != METHOD_SIZE_MATCH)  # a weight's copy is no batch
                    # between steps, only what nothing else placed (no checkpoint's copy, no name)
                    or (span.phase == PHASE_BETWEEN and method == METHOD_PHASE)
                )
                and _spans_next_forward(span, phases, after_target)
            ):
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
    blocks = _weights_among_first_inputs(blocks)
    blocks = _stepped_among_first_inputs(blocks)
    blocks.sort(key=lambda b: -b.size_bytes)
    return blocks


_STEPPED_MIN_PARAMETERS = 2  # parameters the optimizer's state must have reached, one after another


def _stepped_among_first_inputs(blocks: list[LiveBlock]) -> list[LiveBlock]:
    """Blocks made before the first forward and alive in it are its inputs, unless they are what the
    optimizer steps: fp32 master weights cloned from a half-precision model by the user's own code
    (`[p.detach().clone().float() for p in model.parameters()]`), which no frame names. An optimizer
    makes each parameter's state like the parameter (k moments of its size, one parameter after
    another), so the sizes of the state made in the trace, in order, are those of its parameters in
    order, each k times: where they are so for two parameters or more, running on from a block made
    before the first phase that nothing placed but its lifetime or its size, that block's allocation
    site made what the optimizer steps, and every such block that site made is a parameter. A batch
    is no list of the state's sizes."""
    first_inputs = sorted((b for b in blocks if _unnamed_before_first_step(b)), key=lambda b: b.alloc_index or 0)
    state_order = [
        b.requested_bytes
        for b in sorted(
            (
                b
                for b in blocks
                if b.component == COMPONENTS[OPTIMIZER_STATE]
                and b.alloc_index is not None
                and b.size_bytes > MIN_BLOCK_BYTES
            ),
            key=lambda b: b.alloc_index or 0,
        )
    ]
    if len(first_inputs) < _STEPPED_MIN_PARAMETERS or len(state_order) < _STEPPED_MIN_PARAMETERS:
        return blocks
    sizes = [b.requested_bytes for b in first_inputs if b.size_bytes > MIN_BLOCK_BYTES]
    kept = [b for b in first_inputs if b.size_bytes > MIN_BLOCK_BYTES]
    stepped: set[Stack] = set()
    for start, size in enumerate(sizes):
        if size != state_order[0]:
            continue
        for moments in (1, 2):
            expected = (s for s in sizes[start:] for _ in range(moments))
            matched = 0
            for made, wanted in zip(state_order, expected, strict=False):
                if made != wanted:
                    break
                matched += 1
            else:
                reached = -(-matched // moments)
                if matched == len(state_order) and reached >= _STEPPED_MIN_PARAMETERS:
                    stepped.update(b.frames for b in kept[start : start + reached] if b.frames)
                    break
        if stepped:
            break
    if not stepped:
        return blocks
    masters = [b.requested_bytes for b in first_inputs if b.frames in stepped]
    # their gradients: the user's code after the backward gives each its .grad (`m.grad =
    # p.grad.float()`), one block per parameter, of its size, in its order, from one line; the
    # phase (the backward's span) said temporaries (or its size a model gradient's)
    made_after_backward: dict[Stack, list[LiveBlock]] = defaultdict(list)
    for b in sorted(blocks, key=lambda b: b.alloc_index or 0):
        if (
            b.alloc_index is not None
            and b.phase == PHASE_BACKWARD
            and b.component in (COMPONENTS[TEMPORARIES], COMPONENTS[GRADIENTS])
            and b.method in (METHOD_PHASE, METHOD_SIZE_MATCH)
            and b.frames
            and frame_kind(b.frames[0]) in (USER, LIBRARY)
        ):
            made_after_backward[b.frames].append(b)
    gradients = {
        b.address for site in made_after_backward.values() if [b.requested_bytes for b in site] == masters for b in site
    }
    return [
        replace(b, component=COMPONENTS[PARAMETERS], method=METHOD_SIZE_MATCH, confidence=_LAYER_CONFIDENCE)
        if _unnamed_before_first_step(b) and b.frames in stepped
        else replace(b, component=COMPONENTS[GRADIENTS], method=METHOD_SIZE_MATCH, confidence=_LAYER_CONFIDENCE)
        if b.address in gradients
        else b
        for b in blocks
    ]


def _unnamed_before_first_step(block: LiveBlock) -> bool:
    """A block the trace made before its first phase that no frame or name placed: an input by its
    lifetime, or other (a copy of a weight's size, say)."""
    return (
        block.alloc_index is not None
        and block.phase == PHASE_BEFORE
        and block.method in (METHOD_LIFETIME, METHOD_SIZE_MATCH, METHOD_PHASE)
        and block.component in (COMPONENTS[INPUTS], COMPONENTS[OTHER], COMPONENTS[UNKNOWN])
    )


def _weights_among_first_inputs(blocks: list[LiveBlock]) -> list[LiveBlock]:
    """Blocks made before the first forward and alive in it are its inputs, unless their shapes
    repeat once per layer of a model (`layer_stack_weights`): a batch's tensors do not, the weights
    a model's loader put on the GPU by code that names nothing (FSDP's flat shards, a checkpoint
    read straight to the device) do. Those are parameters, by their shapes alone."""
    first_inputs = [b for b in blocks if b.component == COMPONENTS[INPUTS] and b.method == METHOD_LIFETIME]
    if not first_inputs:
        return blocks
    weights = layer_stack_weights([(b.requested_bytes, b.size_bytes) for b in first_inputs])
    if not weights:
        return blocks
    # the shapes that repeat, and a single one of the model's width (an embedding) made before the
    # last of them: a batch's one tensor may share the width too (hidden states, an image batch),
    # and is made once the model is there
    counts, _ = _shape_totals([(b.requested_bytes, b.size_bytes) for b in first_inputs])
    repeated = {r for r in weights if counts[r] > 1}
    last_layer = max(
        (b.alloc_index for b in first_inputs if b.requested_bytes in repeated and b.alloc_index is not None),
        default=-1,
    )
    weights = repeated | {
        b.requested_bytes
        for b in first_inputs
        if b.requested_bytes in weights and b.alloc_index is not None and b.alloc_index < last_layer
    }
    return [
        replace(b, component=COMPONENTS[PARAMETERS], method=METHOD_SIZE_MATCH, confidence=_LAYER_CONFIDENCE)
        if b.component == COMPONENTS[INPUTS] and b.method == METHOD_LIFETIME and b.requested_bytes in weights
        else b
        for b in blocks
    ]


def parameter_successors(
    trace: DeviceTrace,
    phases: PhaseIndex,
    seeds: Collection[int],
    last_index: int,
) -> set[int]:
    """The indices of the allocations that an optimizer step made to replace a parameter out of
    place (`p.data = p.data - lr * update`): in each optimizer phase up to `last_index`, a block made
    there that outlives it takes the place of a parameter of its size that the phase freed. The
    parameters are those made during setup by frames that say so, `seeds` (addresses of those
    made before the trace), and the replacements themselves, step after step."""
    parameters = set(seeds)
    successors: set[int] = set()
    actions, addrs, sizes = trace.actions, trace.addrs, trace.sizes
    made_by: dict[int, bool] = {}  # id of a stack -> whether it makes a parameter
    for span in phases.spans:
        if span.first_index > last_index:
            break
        end = min(span.last_index, last_index)
        if span.phase == PHASE_BEFORE:
            for index in range(span.first_index, end + 1):
                if actions[index] == ALLOC:
                    stack = trace.frames_at(index)
                    verdict = made_by.get(id(stack))
                    if verdict is None:
                        verdict = made_by[id(stack)] = bool(stack) and _makes_parameter(stack)
                    if verdict:
                        parameters.add(addrs[index])
        elif span.phase == PHASE_OPTIMIZER and parameters:
            released: dict[int, int] = defaultdict(int)  # bytes -> parameters of that size freed here
            made: dict[int, tuple[int, int]] = {}  # address -> (index, bytes) of blocks made here, live
            for index in range(span.first_index, end + 1):
                action = actions[index]
                if action == ALLOC:
                    made[addrs[index]] = (index, sizes[index])
                elif action == FREE_REQUESTED:
                    address = addrs[index]
                    if made.pop(address, None) is None and address in parameters:
                        parameters.discard(address)
                        released[sizes[index]] += 1
            for address, (index, size) in sorted(made.items(), key=lambda item: item[1][0]):
                if released.get(size):
                    released[size] -= 1
                    parameters.add(address)
                    successors.add(index)
    return successors


def first_frees_after(trace: DeviceTrace, addresses: Collection[int], start: int) -> dict[int, int]:
    """The index of the first free of each of `addresses` at or after event `start` (blocks live
    at `start` - 1; an address freed and reused later counts its first free only)."""
    wanted = set(addresses)
    found: dict[int, int] = {}
    if not wanted:
        return found
    actions, addrs = trace.actions, trace.addrs
    for index in range(max(start, 0), len(trace)):
        action = actions[index]
        if action == FREE_REQUESTED or action == FREE_COMPLETED:
            address = addrs[index]
            if address in wanted:
                wanted.discard(address)
                found[address] = index
                if not wanted:
                    break
    return found


_FREE_STACK_PAIRS = 256  # alloc/free pairs compared before trusting that frees carry the alloc's stack


def frees_carry_alloc_stacks(trace: DeviceTrace) -> bool:
    """Whether the trace's free events carry the stack of the allocation they free, so that the
    stack of a free of a block from before the trace says what made it. They do when recorded with
    `context="alloc"`; with `context="all"` (the default) a free carries the stack of the code that
    freed it (autograd releasing a saved tensor, zero_grad), which says when the block went, never
    what it was. Told apart on the blocks the trace both allocates and frees: every pair compared
    has equal stacks (a pair at one line, a temporary, has them under either setting; one that
    differs settles it). No pair: not trusted."""
    if not trace.any_frames:
        return False
    actions, addrs = trace.actions, trace.addrs
    open_allocs: dict[int, int] = {}
    pairs = 0
    for index, action in enumerate(actions):
        if action == ALLOC:
            open_allocs[addrs[index]] = index
        elif action == FREE_REQUESTED:
            made = open_allocs.pop(addrs[index], None)
            if made is None:
                continue
            made_by = trace.frames_at(made)
            if not made_by:  # the autograd engine's allocations carry no stack: they tell nothing
                continue
            if made_by != trace.frames_at(index):
                return False
            pairs += 1
            if pairs == _FREE_STACK_PAIRS:
                break
    return pairs > 0


def pre_trace_placements(
    trace: DeviceTrace,
    final_blocks: Mapping[int, Block],
    phases: PhaseIndex,
    registry: Registry,
    buffer_line: int | None = None,
) -> dict[int, tuple[int, str, float]]:
    """(component, method, confidence) of every allocation made before the trace began: those it
    frees (by the stack of the allocation when the free events carry it, `frees_carry_alloc_stacks`;
    else by what the trace does to them) and the dump's blocks it never allocated (by their own
    stacks). One placement serves the memory-over-time series and the blocks at the target."""
    if registry:
        return {}
    alloc_stacks: bool | None = None  # frees_carry_alloc_stacks, read at the first free that needs it
    allocated_in_trace: set[int] = set()
    allocations: list[LiveAllocation] = []
    frames_of: dict[int, Stack] = {}
    frees: dict[int, int] = {}
    actions, addrs, sizes = trace.actions, trace.addrs, trace.sizes
    backward_sizes: set[int] = set()  # requested bytes of backward allocations that outlive their backward
    # requested bytes of backward allocations freed inside it: a gradient computed and added into a
    # .grad that was already there (AccumulateGrad keeps the tensor itself when .grad is None)
    accumulated_sizes: set[int] = set()
    in_backward: dict[int, tuple[int, int]] = {}  # address -> (requested, last index of its backward)
    outlived: dict[int, Counter[int]] = defaultdict(
        Counter
    )  # per backward (its last index): sizes made that outlive it
    seen = allocated_in_trace.add
    spans = phases.spans or (PhaseSpan(0, len(trace) - 1, PHASE_UNKNOWN, 0, "none"),)
    for span in spans:  # span by span: the phase of every event without a lookup
        backward = span.phase == PHASE_BACKWARD
        end = span.last_index
        for index in range(span.first_index, end + 1):
            action = actions[index]
            if action == ALLOC:
                seen(addrs[index])
                if backward:
                    in_backward[addrs[index]] = (sizes[index], end)
            elif action == FREE_REQUESTED:
                address = addrs[index]
                if in_backward:
                    made = in_backward.pop(address, None)
                    if made is not None:
                        (backward_sizes if index > made[1] else accumulated_sizes).add(made[0])
                        if index > made[1]:
                            outlived[made[1]][made[0]] += 1
                if address not in allocated_in_trace and address not in frees:
                    frees[address] = index
                    allocations.append(LiveAllocation(address, None, sizes[index], sizes[index]))
                    if alloc_stacks is None:
                        alloc_stacks = frees_carry_alloc_stacks(trace)
                    if alloc_stacks:
                        frames_of[address] = trace.frames_at(index)
    backward_sizes.update(requested for requested, _ in in_backward.values())  # never freed
    for requested, end in in_backward.values():
        outlived[end][requested] += 1
    # one set of gradients: what one backward made of each shape (a later one adds into them)
    gradient_counts: Counter[int] = Counter()
    for made_by_one in outlived.values():
        gradient_counts |= made_by_one
    for address, block in final_blocks.items():
        if address not in allocated_in_trace and address not in frees:
            allocations.append(LiveAllocation(address, None, block.size, block.requested_size or block.size))
            frames_of[address] = block.frames
    return place_pre_trace(
        allocations,
        frames_of=frames_of,
        frees=frees,
        phases=phases,
        backward_sizes=backward_sizes,
        accumulated_sizes=accumulated_sizes - backward_sizes,
        gradient_counts=gradient_counts,
        state_sizes=lambda: _state_init_sizes(trace, phases),
        trains=lambda: _forwards_train(trace, phases),
        flat_gradients=lambda: _fsdp_in_trace(trace),
        sharded_state=lambda: _sharded_optimizer_in_trace(trace, phases),
        moments=lambda: _optimizer_moments(trace, phases),
        buffer_line=buffer_line,
    )


def _optimizer_moments(trace: DeviceTrace, phases: PhaseIndex) -> int | None:
    """How many moments of each parameter the trace's optimizer keeps, from the torch.optim file its
    steps' allocations run in (`_TWO_MOMENT_FILE`, `_ONE_MOMENT_FILE`); None where no step
    allocated through one (SGD's foreach update allocates nothing: then its kind is not seen), or
    where steps of both kinds ran."""
    found: set[int] = set()
    for stack in trace.stacks_at(_made_in(trace, phases, PHASE_OPTIMIZER))[1].values():
        for frame in stack:
            filename = frame.path
            if _TWO_MOMENT_FILE.search(filename):
                found.add(2)
            elif _ONE_MOMENT_FILE.search(filename):
                found.add(1)
    return found.pop() if len(found) == 1 else None


def _sharded_optimizer_in_trace(trace: DeviceTrace, phases: PhaseIndex) -> bool:
    """The trace's optimizer steps run inside an optimizer that shards its state (ZeRO)."""
    made = _made_in(trace, phases, PHASE_OPTIMIZER)
    return bool(made) and any(sharded_optimizer_frames(stack) for stack in trace.stacks_at(made)[1].values())


def _fsdp_in_trace(trace: DeviceTrace) -> bool:
    """The trace's allocations show FSDP at work (its parameters, or their all-gathers): its
    backward reduce-scatters each unit's gradients into a new flat buffer, of no parameter's shape."""
    allocs = trace.positions(ALLOC)
    return bool(allocs) and any(fsdp_parameter_frames(stack) for stack in trace.stacks_at(allocs)[1].values())


def _made_in(trace: DeviceTrace, phases: PhaseIndex, phase: str) -> list[int]:
    """The alloc events of the spans of `phase`, in order."""
    found: list[int] = []
    for span in phases.spans:
        if span.phase == phase:
            found.extend(trace.positions_in(ALLOC, span.first_index, span.last_index + 1))
    return found


def _state_init_sizes(trace: DeviceTrace, phases: PhaseIndex) -> set[int]:
    """The requested bytes of the optimizer state the trace's steps make (their lazy init): no state
    of these shapes was there before the trace. Each distinct stack read once."""
    made = _made_in(trace, phases, PHASE_OPTIMIZER)
    numbers, stacks = trace.stacks_at(made)
    init = {number for number, stack in stacks.items() if _stack_mentions(stack, _STATE_INIT_FUNCTIONS)}
    return {trace.sizes[index] for index, number in zip(made, numbers) if number in init}


def _forwards_train(trace: DeviceTrace, phases: PhaseIndex) -> bool:
    """Whether a forward of the trace runs inside a training step by its frames (Lightning's
    training_step, an optimizer's closure): the run trains, though the trace may end before its
    backward."""
    return any(trains_by_frames(stack) for stack in trace.stacks_at(_made_in(trace, phases, PHASE_FORWARD))[1].values())


def place_pre_trace(
    allocations: Sequence[LiveAllocation],
    *,
    frames_of: Mapping[int, Stack],
    frees: Mapping[int, int],
    phases: PhaseIndex,
    backward_sizes: Collection[int] = (),
    accumulated_sizes: Collection[int] = (),
    gradient_counts: Mapping[int, int] | None = None,
    state_sizes: Callable[[], Collection[int]] = frozenset,
    trains: Callable[[], bool] = bool,
    flat_gradients: Callable[[], bool] = bool,
    sharded_state: Callable[[], bool] = bool,
    moments: Callable[[], int | None] = lambda: None,
    buffer_line: int | None = None,
) -> dict[int, tuple[int, str, float]]:
    """(component, method, confidence) of each block allocated before the trace began (see above);
    `backward_sizes`: the requested bytes of the allocations the trace's backward made that outlive it,
    `accumulated_sizes`: of those it made and freed inside it (and of no size that outlived it),
    `state_sizes`: of the optimizer state the trace's optimizer steps made; `trains`: the trace's
    stacks show the run training (a forward inside a training step) whatever its phases;
    `flat_gradients`: the run makes its gradients in flat buffers of no parameter's shape (FSDP's
    reduce-scatter), so a traced backward that made blocks that outlive it made the gradients
    whatever their shapes; `sharded_state`: the trace's optimizer steps shard their state (ZeRO),
    `gradient_counts`: of each requested size, the most blocks one backward made that outlive it;
    `moments`: how many moments of each parameter the trace's optimizer keeps, where its steps show it;
    `buffer_line`: the line of Module._apply's buffers' loop (`apply_buffer_line`). The callables are read only where frame-less blocks are left to place."""
    placed: dict[int, tuple[int, str, float]] = {}
    frameless: list[LiveAllocation] = []
    for allocation in allocations:
        address = allocation.address
        freed_at = frees.get(address)
        placement = _place_by_own_frames(
            frames_of.get(address, ()), allocation.requested_bytes, freed_at is None, buffer_line
        )
        if placement is None:
            placement = _place_by_fate(freed_at, phases)
        if placement is None and _python_user_frames(frames_of.get(address, ())):
            # user code made it and does not say what it is: no shape of a model's states says so either
            placement = (UNKNOWN, METHOD_NONE, 0.0)
        if placement is None:
            frameless.append(allocation)
        else:
            placed[address] = placement
    _weights_among_replaced(allocations, placed)
    if frameless:
        weights = Counter(a.requested_bytes for a in allocations if placed.get(a.address, _UNPLACED)[0] == PARAMETERS)
        # a kind the frames found is found for these shapes only where its blocks have them (a loss's
        # 4-byte gradient seed, made by backward's _make_grads, finds no gradients of the weights)
        shapes = {a.requested_bytes for a in frameless}
        found = [placed[a.address] for a in allocations if a.address in placed and a.requested_bytes in shapes]
        placed.update(
            _place_model_states(
                frameless,
                found,
                phases,
                backward_sizes,
                accumulated_sizes,
                state_sizes(),
                trains=trains(),
                weight_sizes=weights,
                gradient_counts=gradient_counts,
                gradients_made=bool(backward_sizes) and flat_gradients(),
                sharded_state=sharded_state(),
                moments=moments(),
            )
        )
    return placed


def _place_model_states(
    frameless: Sequence[LiveAllocation],
    placed: Collection[tuple[int, str, float]],
    phases: PhaseIndex,
    backward_sizes: Collection[int],
    accumulated_sizes: Collection[int] = (),
    state_sizes: Collection[int] = (),
    *,
    trains: bool = False,
    weight_sizes: Mapping[int, int] | None = None,
    gradient_counts: Mapping[int, int] | None = None,
    gradients_made: bool = False,
    sharded_state: bool = False,
    moments: int | None = None,
    peeled: bool = False,
) -> dict[int, tuple[int, str, float]]:
    """The frame-less pre-trace blocks as copies of one set of parameter shapes, when something
    shows a model exists: the trace runs one, or the shapes repeat as copies of one set do.

    `weight_sizes`: how many pre-trace blocks of each requested size their own frames placed as
    parameters. Where there are any, the frames were recorded when the weights were made (Python
    code makes them): a frame-less block is no parameter, but a copy of their shapes (gradients,
    which the autograd engine's threads make without Python frames; optimizer moments) or, of
    another shape, unknown (`_copies_of_weights`).

    The copies are parameters, then those the run shows it can have: gradients and optimizer
    moments in a run that trains (its phases, or `trains`: its stacks run a training step; or one the
    dump has no trace of), less a kind the blocks' own
    frames already found. A traced backward that makes blocks of these shapes that outlive it
    made the gradients (they were None before it): then the further copies are optimizer moments.
    One that makes blocks of these shapes and frees them inside it added them into gradients that
    were there already (zero_grad left them, or was not called): then a copy is the gradients, even
    in a backward the OOM interrupted. An optimizer step in the trace that makes its state for these
    shapes (its first: state is made lazily) shows none was there: then no copy is optimizer state
    (a second copy of the weights is then another model's, an EMA's or a teacher's, read as
    parameters).

    `moments`: the moments per parameter of the optimizer the trace's steps run (None: not seen,
    Adam's two assumed). Where it is known and the shapes hold no whole number of the model states
    it explains, but one copy more, that copy is read as a copy of the parameters (an EMA of the
    weights, fp32 masters), not as more state or gradients; which copy of a shape is the model
    cannot be told, their bytes are the same.

    In a run that does not train, a shape each of whose blocks outweighs all the other frame-less
    blocks together (`_outweighing_shape`: one or a few very large blocks, an inference engine's
    KV cache or memory pool allocated up front) is unknown, not parameters: the model's own weights
    can be shaped so too (one huge embedding), and nothing in a frame-less block says which. The
    rest are read as above (`peeled`: that shape is already set apart)."""
    seen_phases = {span.phase for span in phases.spans}
    traced = bool(seen_phases - {PHASE_BEFORE, PHASE_UNKNOWN, PHASE_BETWEEN})
    untraced = not phases.spans or seen_phases <= {PHASE_UNKNOWN}
    trains = trains or untraced or bool(seen_phases & {PHASE_BACKWARD, PHASE_OPTIMIZER, PHASE_ZERO_GRAD})
    placed_kinds = {component for component, _, _ in placed}
    # (`gradients_made`: the traced backward made them in flat buffers, FSDP's, of other shapes)
    gradients_made = gradients_made or any(a.requested_bytes in backward_sizes for a in frameless)
    weights_found = bool(weight_sizes)
    weight_sizes = weight_sizes or {}
    kinds = [] if weights_found else ["parameters"]
    if trains and GRADIENTS not in placed_kinds and not gradients_made:
        kinds.append("gradients")
    state_made = any(a.requested_bytes in state_sizes for a in frameless)
    if trains and OPTIMIZER_STATE not in placed_kinds and not state_made:
        kinds += ["optimizer_state"] * (moments if moments is not None else 2)
    if not kinds:  # the weights, their gradients and state are all found by their frames: a copy is none of them
        return {a.address: (UNKNOWN, METHOD_NONE, 0.0) for a in frameless}
    if weights_found:
        return _copies_of_weights(frameless, weight_sizes, kinds)
    last = phases.spans[-1] if phases.spans else None
    backward_done = any(s.phase == PHASE_BACKWARD and s is not last for s in phases.spans)
    outweighing = None if peeled else _outweighing_shape(frameless)
    if outweighing is not None and (
        not trains
        or (
            backward_done
            and outweighing not in backward_sizes
            and any(a.requested_bytes in backward_sizes for a in frameless)
        )
    ):
        # a shape whose every block holds more than all the other frame-less blocks together, in a
        # run that only runs forwards (one copy of its weights at most), or that a completed traced
        # backward, which made gradients of the weights' shapes, made none of (no weight that
        # trains: no gradient, no state): a pool or cache sized up front (an inference engine's KV
        # cache) as likely as the model's own largest, or frozen, weight (a huge embedding):
        # nothing says which
        rest = [a for a in frameless if a.requested_bytes != outweighing]
        pool = {a.address: (UNKNOWN, METHOD_SIZE_OUTWEIGHS, 0.0) for a in frameless if a.requested_bytes == outweighing}
        return pool | _place_model_states(
            rest,
            placed,
            phases,
            backward_sizes,
            accumulated_sizes,
            state_sizes,
            trains=trains,
            gradient_counts=gradient_counts,
            gradients_made=gradients_made,
            sharded_state=sharded_state,
            moments=moments,
            peeled=True,
        )
    sizes = [(a.requested_bytes, a.size_bytes) for a in frameless]
    copies = model_state_copies(sizes, len(kinds))
    if copies < len(kinds) and moments is not None and "parameters" in kinds:
        # the model states the optimizer explains do not fit the shapes: where one copy more does,
        # it is a copy of the parameters
        more = len(kinds) + _EXTRA_COPIES
        if model_state_copies(sizes, more) == more:
            copies = more
            kinds = [*kinds, *["parameters"] * _EXTRA_COPIES]
    plan: Mapping[int, tuple[int, int]] | None = None  # per shape: parameter and state blocks, where known
    if copies == 1 and gradients_made and gradient_counts:
        copies, plan = _copies_of_gradients(frameless, gradient_counts, len(kinds))
    # quantised moments only beside an optimizer that is none of torch's own (`moments` None): those
    # keep each moment at its parameter's dtype, so blocks of a quarter of a weight's bytes beside
    # them are weights too (a transformer's q, k, v and output projections beside its 4x MLP)
    if (
        copies == 1
        and plan is None
        and moments is None
        and "optimizer_state" in kinds
        and PHASE_OPTIMIZER in seen_phases
    ):
        quantised = _quantised_moments(frameless)
        if quantised is not None:
            return quantised
    if sharded_state and gradients_made and backward_done and "optimizer_state" in kinds and "parameters" in kinds:
        # an optimizer that shards its state (ZeRO) keeps the moments of its share of the
        # parameters only: no whole copy of the set. Of each shape, as many blocks as one completed
        # traced backward made gradients of are the parameters, and up to two more per parameter
        # the moments; a shape holding more, or none of whose blocks train, stays as below
        sharded = _sharded_moments(frameless, gradient_counts or {})
        if sharded is not None:
            return sharded
    if copies == 1 and gradients_made and backward_done:
        # a completed traced backward made gradients of some shapes only: the parameters that
        # train (a fine-tune's last layers, a distillation's student) have their copies, the
        # frozen ones (no gradient, no state: the base, the teacher) one; read the copies of
        # those that train alone, where the whole set hides them
        trained = [a for a in frameless if a.requested_bytes in backward_sizes]
        frozen = [a for a in frameless if a.requested_bytes not in backward_sizes]
        trained_sizes = [(a.requested_bytes, a.size_bytes) for a in trained]
        if frozen and model_state_copies(trained_sizes, len(kinds)) > 1:
            split = _place_model_states(
                trained,
                placed,
                phases,
                backward_sizes,
                accumulated_sizes,
                state_sizes,
                trains=trains,
            )
            split.update({a.address: (PARAMETERS, METHOD_SIZE_MATCH, 0.4) for a in frozen})
            return split
    if copies == 1 and not traced:  # one set of shapes, and nothing runs a model
        weights = layer_stack_weights(sizes)
        if weights is None:  # nor do the shapes show one: cannot tell
            return {a.address: (UNKNOWN, METHOD_NONE, 0.0) for a in frameless}
        return {
            a.address: (PARAMETERS, METHOD_SIZE_MATCH, _LAYER_CONFIDENCE)
            if a.requested_bytes in weights
            else (UNKNOWN, METHOD_NONE, 0.0)
            for a in frameless
        }
    gradients_there = not gradients_made and any(a.requested_bytes in accumulated_sizes for a in frameless)
    if copies == 3 and len(kinds) == 4 and not (backward_done and not gradients_made) and not gradients_there:
        # gradients set to None and Adam-like moments (the likelier); unless a completed traced
        # backward found the gradients already there (it made none): then the third copy is one
        # moment (SGD's momentum)
        order = ["parameters", "optimizer_state", "optimizer_state"]
    else:
        order = kinds[:copies]
    confidence = 0.5 if copies > 1 else 0.4
    by_shape = _by_shape(frameless)
    result: dict[int, tuple[int, str, float]] = {}
    for requested, group in by_shape.items():
        per_copy = len(group) // copies if len(group) % copies == 0 else 0
        if plan is not None:  # the gradients count the parameters; the state beside them; the rest strays
            with_gradient, state = plan.get(requested, (0, 0))
            stepped = state // (copies - 1)
            for position, allocation in enumerate(group):
                if position < with_gradient:
                    result[allocation.address] = (INDEX[order[0]], METHOD_SIZE_MATCH, confidence)
                elif position < with_gradient + state:
                    kind = order[1 + (position - with_gradient) // stepped]
                    result[allocation.address] = (INDEX[kind], METHOD_SIZE_MATCH, confidence)
                else:
                    result[allocation.address] = (UNKNOWN, METHOD_NONE, 0.0)
            continue
        for position, allocation in enumerate(group):
            if per_copy and position < copies * per_copy:
                result[allocation.address] = (INDEX[order[position // per_copy]], METHOD_SIZE_MATCH, confidence)
            else:  # a shape that is no copy of the set (a workspace, a kept output): nothing says what it is
                result[allocation.address] = (UNKNOWN, METHOD_NONE, 0.0)
    return result


def _quantised_moments(frameless: Sequence[LiveAllocation]) -> dict[int, tuple[int, str, float]] | None:
    """The frame-less blocks as parameters and an optimizer's quantised moments (bitsandbytes'
    8-bit Adam keeps each moment of a parameter in one byte an element: a quarter of an fp32 weight's
    bytes, half a 16-bit one's), where their shapes say so: beside each parameter shape s,
    `per_parameter` blocks of s / `ratio` bytes per block of s (`_QUANTISED_MOMENTS`), for shapes
    holding _QUANTISED_SHARE of the bytes of those left as parameters. Shapes are read largest
    first, so a shape that is both a parameter's and another's moments' keeps what those moments
    leave. Read only where no whole copies are found (a quantised moment is no copy of its
    parameter). None where no ratio fits."""
    counts: Counter[int] = Counter(a.requested_bytes for a in frameless)
    for ratio, per_parameter in _QUANTISED_MOMENTS:
        left = Counter(counts)
        moments: Counter[int] = Counter()  # requested bytes -> blocks of it that are moments
        matched = unmatched = 0  # bytes of the parameters with their moments beside them, and without
        for size in sorted(counts, reverse=True):
            parameters = left[size]
            if not parameters:
                continue
            fraction = size // ratio
            if size % ratio == 0 and left[fraction] >= per_parameter * parameters:
                left[fraction] -= per_parameter * parameters
                moments[fraction] += per_parameter * parameters
                matched += size * parameters
            else:
                unmatched += size * parameters
        if len(moments) >= _QUANTISED_SHAPES_MIN and matched >= _QUANTISED_SHARE * (matched + unmatched):
            result: dict[int, tuple[int, str, float]] = {}
            for allocation in sorted(frameless, key=lambda a: a.address):
                if moments[allocation.requested_bytes]:
                    moments[allocation.requested_bytes] -= 1
                    result[allocation.address] = (OPTIMIZER_STATE, METHOD_SIZE_MATCH, _QUANTISED_CONFIDENCE)
                else:
                    result[allocation.address] = (PARAMETERS, METHOD_SIZE_MATCH, 0.4)
            return result
    return None


def _outweighing_shape(allocations: Sequence[LiveAllocation]) -> int | None:
    """The requested bytes of the shape, if any, each of whose blocks is larger than all the blocks
    of the other shapes together, of which there are some (at most one shape can be): one or a few
    very large blocks beside everything else."""
    counts, held = _shape_totals([(a.requested_bytes, a.requested_bytes) for a in allocations])
    total = sum(held.values())
    for requested in counts:
        if 0 < total - held[requested] < requested:
            return requested
    return None


def _by_shape(allocations: Sequence[LiveAllocation]) -> dict[int, list[LiveAllocation]]:
    """The allocations grouped by their requested bytes, each group in address order (the order
    the copies of one shape are counted in)."""
    by_shape: dict[int, list[LiveAllocation]] = defaultdict(list)
    for allocation in sorted(allocations, key=lambda a: a.address):
        by_shape[allocation.requested_bytes].append(allocation)
    return by_shape


def _copies_of_gradients(
    frameless: Sequence[LiveAllocation], gradient_counts: Mapping[int, int], kinds_possible: int
) -> tuple[int, Mapping[int, tuple[int, int]] | None]:
    """(copies, per shape: its parameter blocks and the state blocks beside them) of the frame-less
    pre-trace blocks, counted against one set of gradients a traced backward made
    (`gradient_counts`: what one backward made of each shape that outlived it): each weight that
    trains has one gradient, and, stepped by an optimizer with k - 1 moments, k - 1 blocks of state.
    Read where the shapes' own counts show no copies: a few stray blocks break them (a validation
    batch, a scalar of a bias's size: a shape's count past k copies), or only some weights have
    state (a half-precision model beside its fp32 masters, both with gradients, the masters with
    Adam's moments; a shape both hold has g gradients and g + (k - 1) b blocks, b of them
    masters). The k that explains most frame-less bytes, first with every weight holding state
    (shapes of exactly k times their gradients), else with some: where the blocks so placed hold
    _GRADIENT_COPIES_SHARE of the bytes; (1, None) where none does. Blocks past a shape's plan are
    strays (unknown)."""
    counts: Counter[int] = Counter(a.requested_bytes for a in frameless)
    held: Counter[int] = Counter()
    for allocation in frameless:
        held[allocation.requested_bytes] += allocation.size_bytes
    total = sum(held.values())
    most = min(kinds_possible, len(_MODEL_STATE_KINDS))
    shown: Counter[int] = Counter()  # copies -> bytes of the shapes holding exactly that many
    for requested, count in counts.items():
        one = gradient_counts.get(requested, 0)
        if one and count % one == 0:
            shown[count // one] += held[requested]
    best = max(shown, key=shown.__getitem__, default=1)
    if 1 < best <= most and shown[best] >= _GRADIENT_COPIES_SHARE * total:
        return best, {
            requested: (one, (best - 1) * one)
            for requested, one in gradient_counts.items()
            if counts.get(requested, 0) >= best * one
        }
    chosen: tuple[float, int, dict[int, tuple[int, int]]] | None = None
    for copies in range(2, most + 1):
        plan: dict[int, tuple[int, int]] = {}
        placed = 0.0
        for requested, count in counts.items():
            one = gradient_counts.get(requested, 0)
            if not one or count < one:
                continue
            stepped = min(one, (count - one) // (copies - 1))  # weights of this shape with state
            plan[requested] = (one, (copies - 1) * stepped)
            placed += held[requested] * (one + (copies - 1) * stepped) / count
        if any(state for _, state in plan.values()) and (chosen is None or placed > chosen[0]):
            chosen = (placed, copies, plan)
    if chosen is None or chosen[0] < _GRADIENT_COPIES_SHARE * total:
        return 1, None
    return chosen[1], chosen[2]


def _sharded_moments(
    frameless: Sequence[LiveAllocation], gradient_counts: Mapping[int, int]
) -> dict[int, tuple[int, str, float]] | None:
    """The frame-less blocks as parameters and a sharded optimizer's moments, shape by shape
    (`_place_model_states`); None where no shape holds moments or one holds more than two a
    parameter (something else shares the shapes)."""
    by_shape = _by_shape(frameless)
    result: dict[int, tuple[int, str, float]] = {}
    moments = False
    for shape, group in by_shape.items():
        trained = gradient_counts.get(shape, 0)
        if trained and len(group) > 3 * trained:
            return None
        kept = trained if trained else len(group)  # a shape without gradients: frozen weights
        for position, allocation in enumerate(group):
            if position < kept:
                result[allocation.address] = (PARAMETERS, METHOD_SIZE_MATCH, 0.4)
            else:
                result[allocation.address] = (OPTIMIZER_STATE, METHOD_SIZE_MATCH, 0.4)
                moments = True
    return result if moments else None


def _copies_of_weights(
    frameless: Sequence[LiveAllocation], weight_counts: Mapping[int, int], kinds: Sequence[str]
) -> dict[int, tuple[int, str, float]]:
    """Frame-less blocks beside the parameters their frames found, shape by shape against the
    parameters' own count of it: as many blocks or fewer are one copy, of the first kind (part of
    a set: a trace that began inside a backward holds the rest of the gradients; layers of one
    shape are counted as layers, not copies), a multiple k of them k copies; another shape, or a
    count that is neither, unknown."""
    by_shape = _by_shape(frameless)
    result: dict[int, tuple[int, str, float]] = {}
    for requested, group in by_shape.items():
        count = weight_counts.get(requested, 0)
        if len(group) <= count:
            copies = 1
        elif count and len(group) % count == 0 and len(group) // count <= len(kinds):
            copies = len(group) // count
        else:
            result.update({a.address: (UNKNOWN, METHOD_NONE, 0.0) for a in group})
            continue
        per_copy = len(group) // copies
        confidence = 0.5 if copies > 1 else 0.4
        for position, allocation in enumerate(group):
            result[allocation.address] = (INDEX[kinds[position // per_copy]], METHOD_SIZE_MATCH, confidence)
    return result


def _spans_next_forward(span, phases: PhaseIndex, after_target: int) -> bool:
    """Whether a block allocated in `span` (before the first phase, or between steps) lives into the
    forward right after it: what a loop makes just before its forward and keeps through it is the
    batch, whatever its functions are named (a GNN's `graph()`, a detector's images made in
    `main()`).

    The block is live at the target, so it lives into that forward when the forward began at or
    before the target. Between steps, the step's optimizer step may open before its forward (an
    `optimizer.step(closure)` runs the forward inside it), and its zero_grad may run between the
    batch and the forward (`optimizer.zero_grad()` at the top of the loop, after the batch is
    loaded, with the loop's own code after it): such spans of the same step are passed.
    """
    if span.phase not in (PHASE_BEFORE, PHASE_BETWEEN):
        return False
    following = phases.span_after(span)
    if span.phase == PHASE_BETWEEN:
        while (
            following is not None
            and following.phase in (PHASE_OPTIMIZER, PHASE_ZERO_GRAD, PHASE_BETWEEN)
            and following.step == span.step
        ):
            following = phases.span_after(following)
    return following is not None and following.phase in FORWARD_PASSES and following.first_index <= after_target


def _outlives(span, freed_at: int | None, trace_end: int) -> bool:
    """Whether a block made in `span` lives past its end: freed after it, or never freed when the
    span ended before `trace_end`, the last event at which the call it stands for may still have
    been running (a span running then may have freed it still)."""
    if span is None:
        return False
    return freed_at > span.last_index if freed_at is not None else span.last_index < trace_end


def _optimizer_site(stack: Stack) -> tuple[tuple[str, int], ...] | None:
    """The site (file, line of its innermost Python frames) of an allocation an optimizer's own
    code outside torch made: a user-written or library optimizer's step (Lion, Adafactor written
    with tensor ops), whose frames name no `_init_group`. None for torch.optim's own code, or
    without Python frames."""
    key: list[tuple[str, int]] = []
    for frame in stack:
        kind = frame_kind(frame)
        if kind == TORCH and not key:
            return None  # torch.optim's own code: its frames say what is state
        if kind in (USER, LIBRARY):
            key.append((frame.filename, frame.line))
            if len(key) == STATE_SITE_FRAMES:
                break
    return tuple(key) or None


def state_blocks(
    trace: DeviceTrace, phases: PhaseIndex, live: Collection[LiveAllocation], after_target: int
) -> set[int]:
    """The live blocks (their alloc event indices) that a user-written optimizer's step
    (`_optimizer_site`) made as its state: each outlived, up to the target, a block the same step
    made after it and freed (a temporary lives only as long as its parameter's update, so none
    made before it outlives it: only state does, as `state["exp_avg"] = torch.zeros_like(p)` and
    the update's temporaries that come and go after it). Then every live block of a site all of
    whose blocks in the step are alive and one of which is state (the state of the parameter the
    step reached last, at the same line, though nothing after it was freed yet). A line that also
    made blocks the step freed (`m = b1 * m + (1 - b1) * g` out of place) lends its blocks nothing.
    Only the optimizer steps that made a live block are read."""
    spans = {
        id(span): span
        for a in live
        if a.alloc_index is not None
        and (span := phases.span_of(a.alloc_index)) is not None
        and span.phase == PHASE_OPTIMIZER
    }
    state: set[int] = set()
    actions, addrs = trace.actions, trace.addrs
    site_of_stack: dict[int, tuple[tuple[str, int], ...] | None] = {}
    for span in spans.values():
        last = min(span.last_index, after_target)
        # address -> (alloc index, site): made in this span at a user-written optimizer's site, not
        # yet freed, in the order made; `pending` those not yet found to outlive a later one
        made: dict[int, tuple[int, tuple[tuple[str, int], ...]]] = {}
        pending: dict[int, int] = {}  # address -> alloc index
        freed_sites: set[tuple[tuple[str, int], ...]] = set()
        for index in range(span.first_index, last + 1):
            action = actions[index]
            if action == ALLOC:
                stack = trace.frames_at(index)
                if id(stack) not in site_of_stack:
                    site_of_stack[id(stack)] = _optimizer_site(stack)
                site = site_of_stack[id(stack)]
                if site is not None:
                    made[addrs[index]] = (index, site)
                    pending[addrs[index]] = index
            elif action == FREE_REQUESTED and addrs[index] in made:
                freed_made_at, freed_site = made.pop(addrs[index])
                freed_sites.add(freed_site)
                pending.pop(addrs[index], None)
                while pending:  # the ones made before it, first in the dict: they outlived it
                    address, made_at = next(iter(pending.items()))
                    if made_at > freed_made_at:
                        break
                    state.add(made_at)
                    del pending[address]
        sites = {made[addrs[i]][1] for i in state if addrs[i] in made} - freed_sites
        state |= {made_at for made_at, site in made.values() if site in sites}
    return state


def _infer(
    alloc_index,
    phase,
    span,
    stack,
    requested,
    parameter_sizes,
    after_target,
    freed_at,
    trace_end,
    state=(),
    buffer_line: int | None = None,
):
    if save_frame(stack) is not None:  # a copy made to save a checkpoint (a state dict gathered): no model state
        return OTHER, METHOD_FRAMES, 0.6
    stack_class = classify_stack(stack) if stack else "no-frames"
    span_over = span is not None and span.last_index < after_target
    if phase == PHASE_BEFORE:
        if stack_class == "module-setup":
            if moved_as_buffer(stack, buffer_line):  # Module._apply's buffers' loop (`.cuda()`)
                return BUFFERS, METHOD_FRAMES, 0.7
            return PARAMETERS, METHOD_FRAMES, 0.8
        if stack_class == PHASE_OPTIMIZER:
            return OPTIMIZER_STATE, METHOD_FRAMES, 0.7
        named = _placed_by_names(stack)
        if named is not None:
            return named
        if _in_constructor(stack):  # made by a constructor during setup: a module's parameters
            return PARAMETERS, METHOD_FRAMES, 0.6
        if requested in parameter_sizes:
            if _python_user_frames(stack):
                # the user's own code (no module, no constructor) copying a weight before training:
                # an EMA or a snapshot of the weights, a mask or a Fisher estimate of their shape
                return OTHER, METHOD_SIZE_MATCH, 0.5
            return PARAMETERS, METHOD_SIZE_MATCH, 0.5
        return OTHER, METHOD_PHASE, 0.5
    if phase == PHASE_OPTIMIZER:
        # outlives the step that made it (freed after the step ends, or never): the optimizer's state
        if span_over or _outlives(span, freed_at, trace_end):
            return OPTIMIZER_STATE, METHOD_LIFETIME, 0.8
        if stack and _stack_mentions(stack, _STATE_INIT_FUNCTIONS):
            return OPTIMIZER_STATE, METHOD_FRAMES, 0.8
        if alloc_index in state:  # outlived the step's later temporaries (`state_blocks`)
            return OPTIMIZER_STATE, METHOD_LIFETIME, 0.6
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
    if phase in FORWARD_PASSES:
        return ACTIVATIONS, METHOD_PHASE, 0.7
    if phase == PHASE_BETWEEN:
        if stack_class == "module-setup":
            if moved_as_buffer(stack, buffer_line):
                return BUFFERS, METHOD_FRAMES, 0.6
            return PARAMETERS, METHOD_FRAMES, 0.6
        named = _placed_by_names(stack)
        if named is not None:
            return named
        if not stack or _loads_data(stack):
            return INPUTS, METHOD_PHASE, 0.6 if stack else 0.4
        return OTHER, METHOD_PHASE, 0.4
    if phase == PHASE_ZERO_GRAD:
        return TEMPORARIES, METHOD_PHASE, 0.6
    if stack and phase == PHASE_UNKNOWN:  # no phases to place it by: its own stack may say what it is
        placed = _place_by_own_frames(stack, requested, freed_at is None, buffer_line)
        if placed is not None:
            return placed
    return UNKNOWN, METHOD_NONE, 0.0


def module_of(name: str) -> str:
    """The module path a registry name belongs to (`model.fc1` for `model.fc1.weight.exp_avg`); a flat
    buffer's name ("DDP gradient bucket (12 gradients: …)") and an input's are their own group."""
    if ".forward arg " in name or ".forward kwarg " in name:  # an input: group by the argument
        return name
    for suffix in (".exp_avg_sq", ".exp_avg", ".max_exp_avg_sq", ".momentum_buffer", ".grad"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    if " (" in name:  # a flat buffer, named with what it holds ("DDP gradient bucket (12 gradients: …)")
        return name
    return name.rsplit(".", 1)[0] if "." in name else name


GROUP_LIMIT = 12  # groups (module paths, source lines) kept per component


def shares(blocks: Sequence[LiveBlock], group_limit: int = GROUP_LIMIT) -> list[ComponentShare]:
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
            entry = modules[component][module_of(block.name)]
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
