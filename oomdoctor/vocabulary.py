"""The fixed words of oomdoctor, each defined once: verdicts, components, phases, where a phase was
read from, how a byte was attributed, block states and trace actions.

Each is a str enum, so a member is the string itself (`Verdict.FRAGMENTATION == "fragmentation"`,
formats and serialises as its value): reports, JSON and the dump format are unchanged by using them.
Pure Python; every layer may import it.
"""

from __future__ import annotations

import enum
import sys

if sys.version_info >= (3, 11):
    from enum import StrEnum
else:  # Python 3.10

    class StrEnum(str, enum.Enum):
        __str__ = str.__str__
        __format__ = str.__format__


class Verdict(StrEnum):
    """The primary cause of an OOM (DESIGN §5), or that there was none."""

    OPTIMIZER_STATE_BUILDUP = "optimizer-state-buildup"
    ACTIVATION_SPIKE = "activation-spike"
    GRADIENTS_KEPT = "gradients-kept"
    CREEPING_LEAK = "creeping-leak"
    FRAGMENTATION = "fragmentation"
    MODEL_STATES_TOO_LARGE = "model-states-too-large"
    OVERSIZED_REQUEST = "oversized-request"
    OUTSIDE_PYTORCH = "outside-pytorch"
    INFERENCE_WITH_GRAD = "inference-with-grad"
    EVAL_OUTPUTS_KEPT = "eval-outputs-kept"
    CHECKPOINT_GATHER = "checkpoint-gather"
    NO_OOM = "no-oom"
    UNKNOWN = "unknown"
    DEVICE_IMBALANCE = "device-imbalance"  # a secondary finding only: replicas on several devices differ


# Verdicts only a secondary finding carries, never the primary one (no fixture stops on them).
FINDING_ONLY_VERDICTS = frozenset({Verdict.DEVICE_IMBALANCE})


class Component(StrEnum):
    """What live bytes are, in the order reports list them."""

    PARAMETERS = "parameters"
    GRADIENTS = "gradients"
    OPTIMIZER_STATE = "optimizer_state"
    ACTIVATIONS = "activations"
    TEMPORARIES = "temporaries"
    INPUTS = "inputs"
    BUFFERS = "buffers"
    WORKSPACE = "workspace"  # library workspaces (cuBLAS, cuDNN)
    PREALLOCATED = "preallocated"  # large pre-allocations: KV caches, memory pools
    OTHER = "other"
    UNKNOWN = "unknown"


class RegistryComponent(StrEnum):
    """The kind of a named tensor in oomdoctor's registry (the dump's metadata)."""

    PARAMETER = "parameter"
    GRADIENT = "gradient"
    OPTIMIZER_STATE = "optimizer_state"
    BUFFER = "buffer"
    INPUT = "input"


class Phase(StrEnum):
    """Where in a training step an event happened. The first four and EVALUATION are also capture's
    markers."""

    FORWARD = "forward"
    BACKWARD = "backward"
    OPTIMIZER_STEP = "optimizer_step"
    ZERO_GRAD = "zero_grad"
    # a forward pass that does not train, and its loop's own code: evaluation, validation,
    # prediction or inference (under no_grad, in eval mode, or inside such a loop's function)
    EVALUATION = "evaluation"
    BETWEEN_STEPS = "between_steps"
    BEFORE_FIRST_STEP = "before_first_step"  # before the first phase of the run was seen
    UNKNOWN = "unknown"


class FrameworkStage(StrEnum):
    """Where a framework's loop was (its callback's hooks say), in a dump's `framework` entry."""

    TRAINING = "training"
    VALIDATING = "validating"
    SANITY_CHECKING = "sanity_checking"  # Lightning's validation batches before the first step
    TESTING = "testing"
    PREDICTING = "predicting"
    EVALUATING = "evaluating"  # the HF Trainer's evaluation / prediction loop
    SAVING_CHECKPOINT = "saving_checkpoint"


class PhaseSource(StrEnum):
    """What the phases of a trace were read from, most to least direct."""

    MARKERS = "markers"
    ANNOTATIONS = "annotations"
    USER_METADATA = "user_metadata"
    FRAMES = "frames"
    NONE = "none"


class Method(StrEnum):
    """How a block's component was decided."""

    REGISTRY = "registry"  # exact: oomdoctor's registry of named tensors
    PHASE = "phase"  # the phase in which the block was allocated
    FRAMES = "frames"  # the allocation's stack: torch's or a library's code that says what it makes
    NAMES = "names"  # the words of the user's own function and file names in that stack
    LIFETIME = "lifetime"  # when it was allocated and that it is still alive
    SIZE_MATCH = "size-match"  # its size equals a parameter's
    # from before the trace, frame-less, each block of its shape larger than all the other frame-less
    # blocks together, and no weight of that shape trains: a pool or cache, or the largest weights (unknown)
    SIZE_OUTWEIGHS = "size-outweighs"
    NONE = "none"


class BlockState(StrEnum):
    """A block's state in torch's snapshot (torch 2.0's `active_awaiting_free` reads as pending)."""

    ACTIVE_ALLOCATED = "active_allocated"
    ACTIVE_PENDING_FREE = "active_pending_free"
    INACTIVE = "inactive"


class Action(StrEnum):
    """A trace event's action (spec §1)."""

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


__all__ = [
    "Action",
    "BlockState",
    "Component",
    "Method",
    "Phase",
    "PhaseSource",
    "RegistryComponent",
    "StrEnum",
    "Verdict",
]
