"""Result objects of the analysis: plain frozen dataclasses that views render and never recompute.

Every size is an int in bytes. Indices (`event_index`) point into the failing device's trace, oldest
event first, so that a view or a reader can find the exact event a number rests on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import NamedTuple

from oomdoctor.model import Segment, Stack
from oomdoctor.records import pickled_by_fields
from oomdoctor.vocabulary import Method, Phase, PhaseSource, StrEnum

# Where a phase or a component assignment came from, most trusted first.
# Plain-string aliases of the words in oomdoctor.vocabulary, where they are defined.
SOURCE_MARKERS = PhaseSource.MARKERS.value
SOURCE_ANNOTATIONS = PhaseSource.ANNOTATIONS.value
SOURCE_USER_METADATA = PhaseSource.USER_METADATA.value
SOURCE_FRAMES = PhaseSource.FRAMES.value
SOURCE_NONE = PhaseSource.NONE.value

METHOD_REGISTRY = Method.REGISTRY.value
METHOD_PHASE = Method.PHASE.value
METHOD_FRAMES = Method.FRAMES.value
METHOD_NAMES = Method.NAMES.value
METHOD_LIFETIME = Method.LIFETIME.value
METHOD_SIZE_MATCH = Method.SIZE_MATCH.value
METHOD_SIZE_OUTWEIGHS = Method.SIZE_OUTWEIGHS.value
METHOD_NONE = Method.NONE.value

PHASE_FORWARD = Phase.FORWARD.value
PHASE_BACKWARD = Phase.BACKWARD.value
PHASE_OPTIMIZER = Phase.OPTIMIZER_STEP.value
PHASE_ZERO_GRAD = Phase.ZERO_GRAD.value
PHASE_EVALUATION = Phase.EVALUATION.value
# a forward pass, whether it trains or not
FORWARD_PASSES = frozenset({PHASE_FORWARD, PHASE_EVALUATION})
# the phases that only training runs: after a pass, one of them means the pass trained
TRAINING_PHASES = frozenset({PHASE_BACKWARD, PHASE_OPTIMIZER, PHASE_ZERO_GRAD})
PHASE_BETWEEN = Phase.BETWEEN_STEPS.value
PHASE_BEFORE = Phase.BEFORE_FIRST_STEP.value
PHASE_UNKNOWN = Phase.UNKNOWN.value


class UnknownKind(StrEnum):
    """What a dump could not tell; `oomdoctor.views.phrasing` words each one."""

    REPLAYED_AFTER_TARGET = "replayed-after-target"  # count: events written after the target
    UNPLACED_BLOCKS = "unplaced-blocks"  # count: live blocks in no rebuilt segment
    NO_HISTORY = "no-history"
    NO_FRAMES = "no-frames"
    TRACE_NO_FRAMES = "trace-no-frames"  # count: trace entries, none with a stack (the blocks carry theirs)
    NO_PHASES = "no-phases"
    NO_REGISTRY = "no-registry"
    RING_BUFFER_WRAPPED = "ring-buffer-wrapped"  # count: events the trace holds
    PRE_EXISTING = "pre-existing"  # count: allocations older than the trace
    PRE_EXISTING_NO_STACK = "pre-existing-no-stack"  # count: of them, live at the target with no stack
    STEPS_BEFORE_TRACE = "steps-before-trace"  # optimizer state predates the trace: steps ran before it
    TRACE_AFTER_SETUP = "trace-after-setup"  # parameters predate the trace: steps may have run before it
    # count: passes after a backward counted in its step, each of which may be a step of its own (no
    # optimizer step shows, or only ones that made its state, and the gradients stayed alive
    # across: micro-batches, or steps)
    PASSES_MAY_BE_STEPS = "passes-may-be-steps"
    LOAD_UNFINISHED = "load-unfinished"  # the failed request was reading weights from a file: the rest of the load
    NO_STACK = "no-stack"  # count: live blocks with no stack in a snapshot with no trace at all
    NO_DEVICE_TOTAL = "no-device-total"
    NO_DEVICE_FREE = "no-device-free"
    OOM_RETRIED = "oom-retried"  # torch caught and retried the OOM judged
    OOM_CAUGHT = "oom-caught"  # count: OOMs at its site so far; the script caught the OOM judged and went on
    HISTORY_REARMED = "history-rearmed"  # count: calls by others to torch's _record_memory_history after install()
    HISTORY_STOPPED = "history-stopped"  # another caller stopped the history and it was not started again
    # count: blocks, bytes: the most torch's max_memory_allocated may be above the peak (unsplit remainders)
    PEAK_UNSIZED = "peak-unsized"
    # the same, where the allocator's settings are not recorded (torch < 2.3): the bound assumes its defaults
    PEAK_UNSIZED_DEFAULTS = "peak-unsized-defaults"
    # why blocks live at the target are unknown (count: blocks, bytes: theirs), by what placed them:
    # from before the trace, each outweighing all the other frame-less blocks from before it (method size-outweighs)
    PRE_TRACE_OUTWEIGHING = "pre-trace-outweighing"
    # from before the trace, freed by it outside a backward, an optimizer step and zero_grad (method lifetime)
    PRE_TRACE_FREED_ELSEWHERE = "pre-trace-freed-elsewhere"
    # from before the trace, made by Python code outside torch that says nothing oomdoctor reads
    PRE_TRACE_CODE_SAYS_NOTHING = "pre-trace-code-says-nothing"
    # from before the trace, no Python frame outside torch: sizes that no reading of the model's states explains
    PRE_TRACE_SHAPE_UNEXPLAINED = "pre-trace-shape-unexplained"
    # made in the trace: neither the phase it was made in nor its own frames say what it is
    TRACED_NOTHING_SAYS = "traced-nothing-says"
    # made in the trace, in a dump with oomdoctor's registry, which does not name it, in a phase that says nothing
    TRACED_UNNAMED = "traced-unnamed"


@dataclass(frozen=True, slots=True)
class Unknown:
    """Something the dump could not tell, with the one number its sentence names (if any)."""

    kind: str  # an UnknownKind
    count: int | None = None
    bytes: int | None = None  # the one size its sentence names, if any


@dataclass(frozen=True, slots=True)
class PhaseSpan:
    """Events first_index..last_index (inclusive) belong to `phase` of `step`, decided by `source`."""

    first_index: int
    last_index: int
    phase: str
    step: int
    source: str


@dataclass(frozen=True, slots=True)
class FreeHole:
    """A free block on the failed request's pool (and stream) at the OOM, by what last held it
    (`analysis.holes`): `scaled_bytes` last held by allocations that grow with the batch,
    `fixed_bytes` by ones that do not; the rest by none the trace shows (unknown)."""

    address: int
    size_bytes: int
    scaled_bytes: int
    fixed_bytes: int

    def at_least(self, hundredths: int) -> int:
        """What surely remains of it in a run at this scale (in hundredths): its fixed bytes and its
        scaled bytes scaled; of the bytes whose last holder is unknown, nothing is counted."""
        return self.fixed_bytes + self.scaled_bytes * hundredths // 100


@dataclass(frozen=True, slots=True)
class OomEvent:
    event_index: int
    request_bytes: int  # the oom event's size: the rounded request
    message_bytes: int  # the segment-sized "Tried to allocate" figure (spec §3.4)
    device_free_bytes: int | None
    time_us: int | None
    fatal: bool


@dataclass(frozen=True, slots=True)
class SeriesPoint:
    event_index: int
    time_us: int | None
    allocated_bytes: int
    reserved_bytes: int
    components: tuple[int, ...]  # bytes per name in COMPONENTS, allocated-at-that-event estimates


@dataclass(frozen=True, slots=True)
class SeriesPeak:
    """The most allocated bytes over the events one series point stands for: those after the
    previous point, up to and including its own (its first point: its event alone). The true
    maximum of those events by the rule of docs/definitions.md, not a sample, so the interval
    holding the peak has the peak (`ReplaySummary.peak_allocated_bytes`)."""

    event_index: int  # the first event of the interval that reaches it
    allocated_bytes: int
    components: tuple[int, ...]  # bytes per name in COMPONENTS right after that event


@dataclass(frozen=True, slots=True)
class ReplaySummary:
    device: int
    event_count: int
    target_index: int | None  # the event the live set and accounting describe; None: dump state
    target_kind: str  # "oom" | "peak" | "dump"
    peak_index: int | None
    peak_allocated_bytes: int  # the peak, by docs/definitions.md: what every report calls the peak
    target_allocated_bytes: int  # right after the target by the same rule (the peak at the peak)
    ooms: tuple[OomEvent, ...]
    series: tuple[SeriesPoint, ...]
    events_after_target: int
    pre_existing_allocations: int  # blocks freed or live whose allocation predates the trace
    pre_existing_bytes: int
    ring_buffer_wrapped: bool
    has_frames: bool
    has_time: bool
    # One per point of `series`: the most allocated over the events it stands for (what the
    # app's chart draws). Not in the JSON report: the report's series is the sampled points.
    series_peaks: tuple[SeriesPeak, ...] = ()
    # The most torch's own allocated bytes (max_memory_allocated) may have reached over the trace's
    # events: the peak plus the unsplit remainders the file cannot size in the blocks live then
    # (docs/definitions.md, "The peak"); torch's is at least the peak. None: no trace to walk.
    torch_peak_at_most_bytes: int | None = None
    # that bound assumes the allocator's default settings (no max_split_size, no
    # roundup_power2_divisions): the file does not record them (torch < 2.3)
    torch_peak_bound_assumes_defaults: bool = False


class LiveAllocation(NamedTuple):
    """One allocation live right after an event, as the replay rebuilt it.

    A named tuple rather than a dataclass: a replay makes one per live block at every cursor move.
    """

    address: int
    alloc_index: int | None  # its alloc event; None: allocated before the trace began
    size_bytes: int  # block bytes
    requested_bytes: int


@dataclass(frozen=True, slots=True)
class EventState:
    """The allocator's state right after one event, rebuilt by `Replayer.state_at`."""

    event_index: int
    allocated_bytes: int  # of the layout: blocks as `segments` hold them, unsplit remainders included
    active_bytes: int  # allocated + pending free
    reserved_bytes: int
    live: tuple[LiveAllocation, ...]  # the allocated blocks of `segments`, at their own bytes (definitions.md)
    segments: tuple[Segment, ...]  # the layout, with free gaps as inactive blocks
    exact: bool  # True when this is the dump's own state
    # Allocated by the rule of docs/definitions.md ("The peak"): every live allocation at its own
    # bytes, laid out or not; what the series, the timeline chart and the peak count.
    counted_bytes: int = 0


@dataclass(frozen=True, slots=True)
class LiveBlock:
    address: int
    size_bytes: int
    requested_bytes: int
    alloc_index: int | None  # None: allocated before the trace began
    phase: str
    step: int | None
    component: str
    method: str
    confidence: float
    name: str | None  # registry name when known
    frames: Stack


@dataclass(frozen=True, slots=True)
class Accounting:
    """Device memory at the target event; each equation holds to the byte where the input allows."""

    device_total_bytes: int | None  # None: the dump does not say
    device_free_bytes: int | None
    non_pytorch_bytes: int | None  # total - free - reserved
    reserved_bytes: int
    allocated_bytes: int
    pending_free_bytes: int  # active_pending_free: freed by the tensor, awaiting stream events
    free_cached_bytes: int  # reserved - allocated - pending_free
    releasable_bytes: int  # free bytes in segments that hold nothing active
    non_releasable_bytes: int  # free fragments pinned by active blocks in the same segment
    requested_bytes: int  # un-rounded bytes of allocated blocks
    rounding_bytes: int  # allocated - requested
    request_bytes: int | None  # the failed request, rounded (the oom event's size)
    message_bytes: int | None  # what the OOM message called "Tried to allocate"
    headroom_bytes: int | None  # what a request could have had: device free + usable cache
    missing_bytes: int | None  # request - headroom when positive
    unknowns: tuple[Unknown, ...]


@dataclass(frozen=True, slots=True)
class PoolFree:
    pool: str  # "small" | "large" | "private (a, b) small" ...
    stream: int
    free_bytes: int
    free_block_count: int
    largest_free_block_bytes: int
    request_fits_largest: bool | None  # None when no request


@dataclass(frozen=True, slots=True)
class SegmentDetail:
    address: int
    total_bytes: int
    allocated_bytes: int
    pending_free_bytes: int
    free_bytes: int
    largest_free_block_bytes: int
    block_count: int
    stream: int
    pool: str
    is_expandable: bool


@dataclass(frozen=True, slots=True)
class Fragmentation:
    internal_bytes: int  # rounding inside allocated blocks
    external_bytes: int  # free cached blocks
    request_pool: str | None
    request_stream: int | None
    usable_free_bytes: int  # free bytes on the request's pool and stream
    largest_usable_free_block_bytes: int
    would_fit_if_contiguous: bool | None  # None when no request
    pools: tuple[PoolFree, ...]
    segments: tuple[SegmentDetail, ...]
    expandable_segments: bool | None  # None: settings not recorded
    max_split_size_bytes: int | None  # None: unlimited or unknown
    alloc_conf: str | None


@dataclass(frozen=True, slots=True)
class Group:
    key: str  # a module path or a source line
    bytes: int
    block_count: int


@dataclass(frozen=True, slots=True)
class ComponentShare:
    name: str
    bytes: int
    block_count: int
    method: str  # the method that placed most of its bytes
    confidence: float
    by_module: tuple[Group, ...]
    by_source_line: tuple[Group, ...]


@dataclass(frozen=True, slots=True)
class StepSummary:
    step: int
    first_index: int
    last_index: int
    peak_allocated_bytes: int
    end_allocated_bytes: int
    # None where the trace names no forward pass (a trace without stacks): what was activations is unknown
    peak_activation_bytes: int | None
    # `end_allocated_bytes` is a lower bound: no mark (annotation, the frees of zero_grad or of an
    # optimizer's step) shows where the step ended, so it is read where the next step first
    # allocates, after frees that may be the next step's (torch 2.0 records no free's own stack)
    end_at_least: bool = False


Fact = int | float | str | None


@dataclass(frozen=True, slots=True)
class Facts:
    """The named numbers and strings one sentence about a result needs, beyond the result's own
    fields (`Facts.of(steps=3, pool="large")`). `oomdoctor.views.phrasing` reads them by name."""

    items: tuple[tuple[str, Fact], ...] = ()

    @classmethod
    def of(cls, **named: Fact) -> Facts:
        return cls(tuple(named.items()))

    def adding(self, **named: Fact) -> Facts:
        return Facts(self.items + tuple(named.items()))

    def get(self, name: str) -> Fact:
        return next((value for key, value in self.items if key == name), None)

    def size(self, name: str) -> int | None:
        """A byte count (or another whole number)."""
        value = self.get(name)
        return value if isinstance(value, int) else None

    def number(self, name: str) -> float:
        value = self.get(name)
        return float(value) if isinstance(value, (int, float)) else 0.0

    def text(self, name: str) -> str | None:
        value = self.get(name)
        return value if isinstance(value, str) else None


class SummaryKind(StrEnum):
    """The story a finding tells, one or more per verdict; `oomdoctor.views.phrasing` words each one."""

    OUTSIDE_PYTORCH = "outside-pytorch"  # outside, total, request
    OUTSIDE_PYTORCH_GUESSED = "outside-pytorch-guessed"  # capacity (a plain snapshot: no device total)
    # needed, capacity, projected_moments, optimizer_kind, moments_recorded (moments_read)
    MODEL_STATES_TOO_LARGE = "model-states-too-large"
    FRAGMENTATION = "fragmentation"  # usable, request, largest
    OVERSIZED_REQUEST = "oversized-request"  # request, share (of the capacity), transient
    GRADIENTS_KEPT = "gradients-kept"  # old, step, phase, before_trace (of old; only when some are)
    CREEPING_LEAK = "creeping-leak"  # old, step
    INFERENCE_WITH_GRAD = "inference-with-grad"  # passes, since_backward, kept
    OPTIMIZER_FIRST_STEP = "optimizer-first-step"  # optimizer_state, parameters, gradients
    OPTIMIZER_LATER_STEP = "optimizer-later-step"  # step, optimizer_state
    OPTIMIZER_STATE_BEFORE_TRACE = "optimizer-state-before-trace"  # optimizer_state, before_trace
    ACTIVATION_SPIKE = "activation-spike"  # step, phase, activations, ratio
    # a forward cut short near its start: activations so far, its projected whole and its ratio to the
    # earlier steps' activation peak, size_ratio (its allocations to rest_step's at the same point)
    ACTIVATION_SPIKE_PROJECTED = "activation-spike-projected"
    ACTIVATIONS_DOMINATE = "activations-dominate"  # phase, activations
    # a forward cut short near its start with no earlier pass to extrapolate from: phase,
    # activations, own (with temporaries), reached (with the request: a lower bound), room, rest,
    # states (at full size), capacity, assumed_all
    ACTIVATIONS_FIRST_PASS = "activations-first-pass"
    NO_OOM = "no-oom"  # at ("peak" | "dump"), allocated; dominant, dominant_bytes; end_* the same at the dump
    UNKNOWN = "unknown"
    # the same, with what decides it: a first forward the model states leave no room for, which fit
    # only if some parameters are frozen: phase, parameters, states, capacity, reached, room, rest
    UNKNOWN_WHAT_TRAINS = "unknown-what-trains"
    # Risks found without an OOM event (at the peak or the dump)
    KEPT_GRAPH_RISK = "kept-graph-risk"  # kept, share (of what the pass allocated), parameters
    GRADIENTS_KEPT_RISK = "gradients-kept-risk"  # old, phase, parameters
    MODEL_STATES_AT_CAPACITY = "model-states-at-capacity"  # states, reserved, free, entries
    NEAR_OOM_OVERSIZED = "near-oom-oversized"  # request, bound, share, flushed
    OVERSIZED_TENSOR_RISK = "oversized-tensor-risk"  # largest, capacity, share
    EVAL_OUTPUTS_KEPT = "eval-outputs-kept"  # passes, keeping, kept, share; at (risk only, else None)
    CHECKPOINT_GATHER = "checkpoint-gather"  # function, live, request, parameters; at (risk only, else None)
    # Several devices compared (analysis/devices.py)
    DEVICE_IMBALANCE = "device-imbalance"  # device, allocated, at, peer, peer_peak, ratio, data_parallel


@dataclass(frozen=True, slots=True)
class Summary:
    """A finding's one-sentence story: its kind and the facts the sentence names."""

    kind: str  # a SummaryKind
    facts: Facts = field(default_factory=Facts)


class EvidenceKind(StrEnum):
    """What a piece of evidence is; `oomdoctor.views.phrasing` words each one."""

    MISSING = "missing"
    MISSING_PLACEMENT = "missing-placement"  # largest, asked, free: the request failed on placement
    OUTSIDE = "outside"
    DEVICE_TOTAL = "device-total"
    PARAMETERS = "parameters"  # a component's evidence may name its largest tensor (largest_name)
    GRADIENTS = "gradients"
    OPTIMIZER_STATE = "optimizer-state"
    OPTIMIZER_STATE_AT_OOM = "optimizer-state-at-oom"
    FOREACH_TEMPORARIES = "foreach-temporaries"
    ACTIVATIONS_AT_OOM = "activations-at-oom"
    LIVE_ACTIVATIONS = "live-activations"
    LIVE_TEMPORARIES = "live-temporaries"
    MODEL_STATES_NEEDED = "model-states-needed"  # projected_moments, optimizer_kind, moments_recorded
    CAPACITY = "capacity"
    USABLE_FREE = "usable-free"  # pool
    LARGEST_FREE_BLOCK = "largest-free-block"
    REQUEST = "request"
    DEVICE_FREE = "device-free"
    MESSAGE_BYTES = "message-bytes"
    TRANSIENT = "transient"
    OLD_GRADIENTS = "old-gradients"
    NO_ZERO_GRAD = "no-zero-grad"
    ZERO_GRAD_KEPT = "zero-grad-kept"
    ZERO_GRAD_LATER = "zero-grad-later"
    KEPT_FROM_EARLIER_STEPS = "kept-from-earlier-steps"  # steps
    STEP_GROWTH = "step-growth"  # steps
    FORWARD_PASSES = "forward-passes"
    EARLIER_PASS_ACTIVATIONS = "earlier-pass-activations"
    FIRST_STEP_OOM = "first-step-oom"
    EARLIER_PEAK_ACTIVATIONS = "earlier-peak-activations"  # ratio, when compared
    CURRENT_ACTIVATIONS = "current-activations"
    RESERVED_PLUS_FREE = "reserved-plus-free"
    ALLOCATED_AT_TARGET = "allocated-at-target"  # at ("peak" | "dump")
    PASS_ALLOCATED = "pass-allocated"  # bytes the forward pass allocated up to the target
    PASS_KEPT = "pass-kept"  # of them, still alive at the target
    PASS_REACHED = "pass-reached"  # request: the pass's own live bytes and the request, a lower bound
    ROOM_FOR_PASS = "room-for-pass"  # rest: the capacity less what is allocated besides the pass's own
    # assumed_all, projected_moments, moments_assumed, moments_recorded, as_held
    MODEL_STATES_AT_FULL_SIZE = "model-states-at-full-size"
    NO_TRAINING = "no-training"  # no backward, optimizer step or gradients anywhere in the dump
    RESERVED = "reserved"
    FREE_CACHED = "free-cached"
    TRACE_ENTRIES = "trace-entries"
    NEAR_OOM = "near-oom"  # flushed: the allocator freed its cache to retry a request
    CAPACITY_BOUND = "capacity-bound"  # reserved before the flush + the request: the device had less
    LARGEST_TENSOR = "largest-tensor"
    # one live block, not a model state, holding a large share of allocated at the OOM that the
    # verdict's evidence does not name: component, share, largest_name (when the registry names it)
    DOMINANT_BLOCK = "dominant-block"
    KEPT_OUTPUTS = "kept-outputs"  # passes: how many earlier passes left outputs alive
    EARLIER_PASSES_ALLOCATED = "earlier-passes-allocated"  # share: what of it is still alive
    OUTPUTS_PER_PASS = "outputs-per-pass"  # passes: the kept outputs over the passes that kept them
    REQUEST_COVERS_KEPT = "request-covers-kept"  # kept: the request is at least the outputs kept
    SAVE_CALL = "save-call"  # function: the outermost frame that saves a checkpoint
    SAVE_GATHERED = "save-gathered"  # blocks allocated by checkpoint-saving code, still alive
    PARAMETERS_HELD = "parameters-held"  # parameter blocks the save did not make
    DEVICE_ALLOCATED = "device-allocated"  # device, at: the judged device's allocated bytes at its moment
    PEER_PEAK = "peer-peak"  # device: a replica's peak (its event_index is in that device's trace)
    PEER_AT_MOMENT = "peer-at-moment"  # device: a replica's allocated bytes at the judged moment, by time


@dataclass(frozen=True, slots=True)
class Evidence:
    """One fact a verdict rests on: a byte count or another number, and where it was read."""

    kind: str  # an EvidenceKind
    metric: str | None = None
    bytes: int | None = None
    event_index: int | None = None
    address: int | None = None
    frame: str | None = None
    value: float | int | None = None  # a number that is not a size (a count, a step, a ratio)
    facts: Facts = field(default_factory=Facts)  # what its sentence names besides


class Change(StrEnum):
    """A change a report recommends (`Recommendation.id`); `oomdoctor.views.phrasing` words each one."""

    ACTIVATION_CHECKPOINTING = "activation-checkpointing"
    SMALLER_MICRO_BATCH = "smaller-micro-batch"
    SMALLER_BATCH = "smaller-batch"
    EIGHT_BIT_OPTIMIZER = "eight-bit-optimizer"
    FOREACH_FALSE = "foreach-false"
    IN_PLACE_OPTIMIZER = "in-place-optimizer"  # an optimizer of the user's own that allocates its update
    ZERO_GRAD_SET_TO_NONE = "zero-grad-set-to-none"
    FREE_KEPT_TENSORS = "free-kept-tensors"
    EXPANDABLE_SEGMENTS = "expandable-segments"
    # the same, for a dump torch 2.0 wrote: it has no expandable segments (2.1 added them)
    UPGRADE_FOR_EXPANDABLE_SEGMENTS = "upgrade-for-expandable-segments"
    NO_GRAD = "no-grad"
    SHARD_MODEL_STATES = "shard-model-states"
    # the optimizer state is sharded already (ZeRO): the gradients and parameters are not
    SHARD_GRADIENTS_AND_PARAMETERS = "shard-gradients-and-parameters"
    # the model states are sharded already (FSDP): over more ranks, or offloaded
    SHARD_OVER_MORE_GPUS = "shard-over-more-gpus"
    SMALLER_WEIGHTS = "smaller-weights"  # model states that are weights only: nothing trains
    CHUNK_LARGE_OP = "chunk-large-op"
    SMALLER_PREALLOCATION = "smaller-preallocation"  # the failed request is a pool sized up front (a KV cache)
    FREE_OTHER_PROCESSES = "free-other-processes"
    OUTPUTS_TO_CPU = "outputs-to-cpu"
    STATE_DICT_TO_CPU = "state-dict-to-cpu"
    BALANCE_DEVICES = "balance-devices"  # replicas on several devices got unequal shares of the work
    FUSED_ATTENTION = "fused-attention"  # an attention that materialises its score matrices


@dataclass(frozen=True, slots=True)
class MeasuredRegions:
    """The regions activation checkpointing's saving was measured from (analysis/regions.py), and
    how it was had."""

    count: int  # how many regions (blocks) of the judged pass
    called_from: Stack  # the lines that call them (the callers' frames)
    # the regions are segments of the torch modules a Sequential (called from `called_from`) or a
    # user's loop (at it) calls, checkpoint_sequential's (one: checkpointed whole), not blocks
    sequential: bool = False
    of_loops: int = 0  # of `called_from`, the loops (the rest call Sequentials)
    # replayed on this step's completed pass of the same forward, at the judged pass's sizes
    # (analysis/passes.py `CheckpointReplay`; None: not replayed) ...
    replayed_step: int | None = None
    # ... else, at the OOM of an interrupted pass, of the calls it made so far (a lower bound) ...
    so_far: bool = False
    # ... or, in a backward, with these gradient bytes the backward has yet to make counted beside the
    # largest region's recomputation (at most that many: a lower bound)
    gradients_beside_bytes: int = 0


@dataclass(frozen=True, slots=True)
class Recommendation:
    id: str  # a Change
    estimated_saved_bytes: int
    would_fit_alone: bool | None  # None when there is no failed request to fit
    # the saving is a lower bound: estimated at the OOM of a pass whose rest nothing shows, which
    # only adds to what the change saves at that pass's peak
    saved_at_least: bool = False
    # advice for a run that trains, where the file cannot tell whether it does (its first passes, no
    # backward, no optimizer called yet: `Context.trains_unknown`): it saves nothing if the run does not
    if_trains: bool = False
    # the saving is the judged moment's (the OOM's, or the peak's), and what the change frees there
    # is made again later (the next backward's gradients): the run's peak drops by at most this
    # (None: the saving is the peak's own)
    peak_saved_at_most_bytes: int | None = None
    # the saving is a rule of thumb (a fixed share), not measured from the file
    rule_of_thumb: bool = False
    # activation checkpointing's saving measured from the regions of the judged pass (None: not measured)
    regions: MeasuredRegions | None = None


@dataclass(frozen=True, slots=True)
class NearOom:
    """A cudaMalloc that failed and was retried after the allocator freed its cache (spec §3: a run
    of `segment_free` events carrying the pending allocation's stack, then its `segment_alloc`)."""

    event_index: int  # the retried segment_alloc
    request_bytes: int  # the segment it asked for
    flushed_bytes: int  # what the flush gave back
    reserved_before_bytes: int  # reserved when the first cudaMalloc failed
    # the device had less than reserved_before + request free for PyTorch at that moment

    @property
    def capacity_bound_bytes(self) -> int:
        return self.reserved_before_bytes + self.request_bytes


@dataclass(frozen=True, slots=True)
class Finding:
    verdict: str
    confidence: float
    summary: Summary
    evidence: tuple[Evidence, ...]


class WhatIfCase(StrEnum):
    """What the batch-size what-if found; `oomdoctor.views.phrasing` words each one."""

    CAPACITY_UNKNOWN = "capacity-unknown"  # the dump does not say how large the device is
    # nor does it, but a near-OOM bounds it from above: past upper_bound_scale the peak cannot fit
    CAPACITY_BOUNDED = "capacity-bounded"
    FIXED_TOO_LARGE = "fixed-too-large"  # the fixed part alone does not fit: no batch size would
    NO_BUDGET = "no-budget"  # nothing at the target grows with the batch
    LINEAR = "linear"  # the peak fits up to largest_fitting_scale
    PLACEMENT = "placement"  # a placement failure: the scaled request finds a place up to largest_fitting_scale
    PASS_INTERRUPTED = (
        "pass-interrupted"  # the OOM cut a forward short and nothing shows its rest: at most upper_bound_scale
    )
    # the forward's rest extrapolated, but the run trains and that pass ran no backward: at most upper_bound_scale
    BACKWARD_UNKNOWN = "backward-unknown"
    # by the moment's figures the peak fits up to upper_bound_scale, but what decides the run is not
    # in them (`WhatIfUnknown`): no scale is said to fit
    BEYOND_THE_MOMENT = "beyond-the-moment"


class WhatIfUnknown(StrEnum):
    """Why no scale is said to fit although the moment's figures fit one (WhatIfCase.BEYOND_THE_MOMENT)."""

    # what the run keeps grows with each step or pass still to come (a leak, grad-mode graphs kept
    # pass after pass), and how many come the file does not say: a smaller batch may only run out later
    KEEPS_GROWING = "keeps-growing"
    # the rest of the interrupted pass was extrapolated with the sites it had not reached scaled by a
    # guess (`RestOfPass.by_site`): the figure can be off either way
    REST_GUESSED = "rest-guessed"
    # from a recorded step's peak, its activations are the budget: the temporaries and inputs there,
    # which grow with the batch too, count as fixed, so a scale above 1.00x is overstated
    ACTIVATIONS_ONLY = "activations-only"
    # a larger batch than the one measured makes larger requests than any the trace shows: how the
    # cache lays them out (segments of their own, cached blocks too small to take them) is unknown
    LARGER_BATCH = "larger-batch"


class RestUnknown(StrEnum):
    """Why the rest of a pass the OOM interrupted could not be extrapolated; phrasing words each."""

    NO_EARLIER_PASS = "no-earlier-pass"  # no earlier completed pass of the same structure in the trace
    STRUCTURE_DIFFERS = "structure-differs"  # this pass's allocations do not follow the earlier pass's
    BEYOND_EARLIER = "beyond-earlier"  # this pass already made more allocations than the earlier one in all


@dataclass(frozen=True, slots=True)
class RestOfPass:
    """The OOM came part-way through a forward (docs/definitions.md, "A pass the OOM interrupted"):
    what the rest of the pass, and its backward, would have needed.

    Extrapolated (`reason` None) from `earlier_step`'s completed pass of the same structure (on
    `earlier_device`, a replica, when this trace holds none): this pass allocated `size_ratio` times
    what that pass had at the same point (`progress` of its allocations made; that pass's own peak
    was `earlier_peak_bytes`). That pass, replayed from there at this pass's sizes
    (`passes._projection`), gives the projected peak: this pass's own bytes there
    (`projected_pass_bytes`, against `pass_bytes` live at the OOM), the gradients its backward
    made and keeps (`earlier_kept_bytes`, at their own size), and the blocks made before this pass
    that its rest has freed by then (`freed_bytes`)."""

    step: int | None
    reason: str | None = None  # a RestUnknown when nothing shows the rest; None: extrapolated
    earlier_step: int | None = None
    size_ratio: float | None = None
    progress: float | None = None
    earlier_peak_bytes: int = 0
    earlier_kept_bytes: int = 0
    pass_bytes: int = 0
    projected_pass_bytes: int = 0
    earlier_device: int | None = None  # the pass is a replica's on this device (DataParallel), not this trace's
    # that pass ran a backward (else what one adds is not in the projection); unknown rest: the run's
    # earlier passes did (False: they ran none, in a run that does not train, so none follows this one)
    earlier_backward: bool = True
    # the matched sites grew by ratios of their own (a longer sequence: attention by its square), so
    # the rest was scaled site by site, not by `size_ratio` alone (passes._projected_sizes)
    by_site: bool = False
    # live at the OOM, made before this pass (the previous step's outputs a loop variable held), and
    # freed by its rest before its projected peak, as the earlier pass freed theirs (passes._freed_before)
    freed_bytes: int = 0
    freed_scaled_bytes: int = 0  # of them activations, inputs and temporaries (what grows with the batch)

    @property
    def extrapolated(self) -> bool:
        return self.reason is None

    @property
    def extra_bytes(self) -> int:
        """What the rest of the pass adds above the OOM instant (the gradients it makes included)."""
        if not self.extrapolated:
            return 0
        return max(0, self.projected_pass_bytes - self.pass_bytes + self.earlier_kept_bytes - self.freed_bytes)


@dataclass(frozen=True, slots=True)
class WhatIfBasis:
    """The recorded step the what-if was made from, when not the target event."""

    step: int
    peak_allocated_bytes: int
    activation_bytes: int


@dataclass(frozen=True, slots=True)
class WhatIf:
    scalable_bytes: int  # activation budget at the target: activations + temporaries + inputs (+ request)
    fixed_bytes: int
    capacity_bytes: int | None  # what the device could give PyTorch
    largest_fitting_scale: float | None
    predicted_peaks: tuple[tuple[float, int], ...]  # (scale, predicted peak bytes)
    case: str  # a WhatIfCase
    unusable_bytes: int = 0  # cached memory the failed request could not use, counted in fixed_bytes
    projected_states: bool = False  # fixed_bytes holds the model states projected at full size
    # a placement failure: the largest batch scale at which the scaled request finds a place, in today's
    # free blocks as they would be at that batch or in free device memory (`whatif.placement_limit`)
    placement_limit_scale: float | None = None
    calibrated: bool = False  # at 1.00x the model falls short by exactly what the failed request lacked
    request_fixed: bool = False  # the failed request counts in fixed_bytes (it does not grow with the batch)
    rough: bool = False  # the largest fitting scale is so far from the measured batch that the model is rough
    basis: WhatIfBasis | None = None  # made from a recorded step's peak rather than the target event
    rest_of_pass: RestOfPass | None = None  # the OOM interrupted a forward: its rest, extrapolated or unknown
    upper_bound_scale: float | None = None  # PASS_INTERRUPTED: at the OOM instant it fits up to here, at most
    # CAPACITY_BOUNDED: PyTorch could have had less than this (a near-OOM's failed cudaMalloc)
    capacity_bound_bytes: int | None = None
    # the capacity is the device's total (no free figure at this moment): an upper bound, less what
    # the CUDA context and other processes held; a scale within it is not known to fit
    capacity_at_most: bool = False
    # the trace shows the run training: a backward follows the interrupted forward (else only if it trains)
    trains: bool = True
    # a placement failure: the largest scale at which the scaled request could find a place at all,
    # had the bytes a smaller pass does not hold been free beside today's largest free block or on
    # the device (`whatif.placement_reach`); between placement_limit_scale and it, a place is unknown
    placement_reach_scale: float | None = None
    # the reserved memory a run at another scale needs beyond its allocated bytes, at least, by the
    # allocator's segment rules (`whatif.cache_margin`): a scale whose peak fits only within it is
    # not known to fit
    cache_margin_bytes: int = 0
    # the largest scale allocated bytes alone allow, where the room for the cache made
    # `largest_fitting_scale` smaller (None there: no scale leaves that room)
    by_bytes_scale: float | None = None
    beyond_the_moment: str | None = None  # a WhatIfUnknown (BEYOND_THE_MOMENT)

    def fits_at(self, scale: float) -> bool | None:
        """Whether the predicted peak at `scale` fits the capacity, and the request a place (None:
        capacity unknown, or the OOM interrupted a pass whose rest is unknown and the scale is within
        what the instant allows, or the peak fits by allocated bytes but not with room for the cache's
        segments, `cache_margin_bytes`)."""
        if self.capacity_bytes is None:
            bound = self.capacity_bound_bytes
            return False if bound is not None and self.predicted_peak_bytes(scale) >= bound else None
        peak = self.predicted_peak_bytes(scale)
        fits: bool | None = peak <= self.capacity_bytes
        if self.placement_limit_scale is not None and scale > self.placement_limit_scale:
            # no place for the scaled request is known (today's blocks as they would be at this
            # scale, free device memory); a run at this scale holds fewer bytes at that moment, where
            # a place may be (up to the reach), or may not
            reach = self.placement_reach_scale
            return None if fits and reach is not None and scale <= reach else False
        if fits and peak + self.cache_margin_bytes > self.capacity_bytes:
            return None  # by allocated bytes only: the segments the cache cuts may not fit beside them
        # (a budget of a step's activations alone understates only what a larger batch adds)
        beyond = self.case == WhatIfCase.BEYOND_THE_MOMENT and not (
            self.beyond_the_moment in (WhatIfUnknown.ACTIVATIONS_ONLY, WhatIfUnknown.LARGER_BATCH) and scale <= 1
        )
        if fits and (
            self.case in (WhatIfCase.PASS_INTERRUPTED, WhatIfCase.BACKWARD_UNKNOWN) or beyond or self.capacity_at_most
        ):
            return None
        return fits

    def predicted_peak_bytes(self, scale: float) -> int:
        return self.fixed_bytes + math.ceil(self.scalable_bytes * scale)


@dataclass(frozen=True, slots=True)
class DeviceSummary:
    """One device of a snapshot that holds several, read as the judged one is (analysis/devices.py).

    Indices point into this device's own trace. `moment` is the moment its largest component is
    read at: its last OOM, else its peak, else the dump."""

    device: int
    judged: bool  # the device the analysis judges
    reserved_bytes: int  # at the dump
    allocated_bytes: int  # at the dump
    event_count: int
    peak_allocated_bytes: int  # the trace's peak by docs/definitions.md; the dump's allocated without a trace
    peak_index: int | None
    oom_count: int
    phases: tuple[str, ...]  # the phases its trace reached, in the order first seen
    trains: bool  # its trace shows a backward or an optimizer step
    moment: str  # "oom" | "peak" | "dump"
    largest_component: str | None
    largest_component_bytes: int
    allocated_at_judged_bytes: int | None  # at the judged moment by time_us (None: no times to align)
    replica: bool  # runs a replica of the judged device's model (DataParallel frames on both devices)
    data_parallel: bool  # its trace shows DataParallel's replicate, scatter or parallel_apply
    # a replica whose trace reached a backward or optimizer step the judged device's, cut short by
    # its OOM, never did: it tells that the run trains
    tells_training: bool = False


@dataclass(frozen=True, slots=True)
class Analysis:
    schema_version: int
    device: int
    devices: tuple[int, ...]
    source_format: str
    replay: ReplaySummary
    accounting: Accounting
    fragmentation: Fragmentation
    phase_source: str
    phases: tuple[PhaseSpan, ...]
    target_phase: str
    target_step: int | None
    steps: tuple[StepSummary, ...]
    components: tuple[ComponentShare, ...]
    live_blocks: tuple[LiveBlock, ...]
    verdict: str
    confidence: float
    summary: Summary
    evidence: tuple[Evidence, ...]
    secondary: tuple[Finding, ...]
    recommendations: tuple[Recommendation, ...]
    what_if: WhatIf
    unknowns: tuple[Unknown, ...] = field(default=())
    device_summaries: tuple[DeviceSummary, ...] = field(default=())  # one per device when there are several

    def component_bytes(self) -> dict[str, int]:
        return {c.name: c.bytes for c in self.components}


pickled_by_fields(globals())  # sent from a folder's worker processes to their parent: each class pickles fast
