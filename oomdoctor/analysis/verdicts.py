"""The verdict tests: one primary verdict from the fixed set, and the secondary findings.

Each verdict is a test on the evidence (DESIGN §5), reading a `Context` that `analyse` computes once.
The tests run in a fixed order of precedence and the first that holds is the primary verdict; every
other test that holds becomes a secondary finding. What to change is `recommendations.py`.

A finding is data: a `Summary` kind with the facts its sentence names, and evidence kinds with their
figures. The words are `oomdoctor.views.phrasing`'s.
"""

from __future__ import annotations

import bisect
import functools
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from oomdoctor.analysis.attribution import (
    ddp_bucket_frames,
    fsdp_parameter_frames,
    sharded_optimizer_frames,
    source_line,
)
from oomdoctor.analysis.checkpointing import save_frame
from oomdoctor.analysis.passes import PassHistory, passes_since_training
from oomdoctor.analysis.phases import KEPT_GRAPHS_OF_PASSES
from oomdoctor.analysis.results import (
    FORWARD_PASSES,
    PHASE_BACKWARD,
    PHASE_BETWEEN,
    PHASE_EVALUATION,
    PHASE_FORWARD,
    PHASE_OPTIMIZER,
    PHASE_UNKNOWN,
    PHASE_ZERO_GRAD,
    SOURCE_MARKERS,
    TRAINING_PHASES,
    Accounting,
    Evidence,
    EvidenceKind,
    Fact,
    Facts,
    Finding,
    Fragmentation,
    FreeHole,
    LiveBlock,
    NearOom,
    OomEvent,
    PhaseSpan,
    StepSummary,
    Summary,
    SummaryKind,
)
from oomdoctor.analysis.sizing import LARGE_SEGMENT_BYTES, MIN_BLOCK_BYTES
from oomdoctor.model import Frame, Segment, Stack
from oomdoctor.units import GIB, MIB
from oomdoctor.vocabulary import Component, Verdict

# The thresholds of the tests. A "_PART" is a divisor: at least total // PART.
OUTSIDE_MIN_PART = 4  # memory outside PyTorch: at least a quarter of the device
OUTSIDE_STRONG_PART = 3  # a third or more: the higher confidence
CUDA_CONTEXT_ALLOWANCE_BYTES = GIB // 2  # what the CUDA context and libraries may take by themselves,
CUDA_CONTEXT_ALLOWANCE_PART = 10  # but no more than a tenth of the device
# optimizers that keep one parameter-sized tensor of state per parameter (SGD's momentum buffer,
# Adagrad's sum, Lion's moment); the others read as Adam-style, two
ONE_MOMENT_OPTIMIZERS = frozenset({"sgd", "adagrad", "lion"})
# What says how many moments per parameter the optimizer state still to come is projected at
# (`moments_to_come`), surest first
MOMENTS_RECORDED = "recorded"  # capture recorded each optimizer's kind (metadata optimizer_kinds)
MOMENTS_KIND = "kind"  # frames or registry names name the optimizer's kind
MOMENTS_READ = "read"  # as many as its state so far holds (`state_moments`)
MOMENTS_ASSUMED = "assumed"  # Adam's two: nothing shows the kind
MODEL_STATES_CAPACITY_SHARE = 0.95  # model states at full size need this share of the capacity or more
ASSUMED_STATES_CONFIDENCE = 0.3  # too large only if every parameter trains, which the file does not show
OVERSIZED_PART = 2  # one request of half the capacity,
OVERSIZED_IF_LARGEST_PART = 4  # or of a quarter when it is larger than all transient memory together
DOMINANT_BLOCK_PART = 4  # one live block of a quarter of allocated at the OOM is named in the evidence,
DOMINANT_BLOCK_CAPACITY_PART = 10  # when it is also a tenth of the capacity (a small allocation's block is not)
GRADIENTS_KEPT_MIN_PART = 4  # old gradients: at least a quarter of the parameters
LEAK_MIN_STEPS = 2  # earlier steps (or steps of growth) that must leave memory behind
LEAK_MIN_PART = 10  # what they left: a tenth of the capacity, or the whole shortfall
LEAK_STEP_GROWTH_BYTES = MIB  # end-of-step growth below this is noise
KEPT_GRAPH_MIN_PART = 10  # earlier forward passes' activations: a tenth of the capacity, or the shortfall
SPIKE_OVER_STATE_GROWTH = 0.1  # activations above the earlier peak by this share: a spike, not new state
ACTIVATIONS_MIN_SHARE = 0.3  # activations and temporaries at least this share of allocated (or the largest)
SPIKE_RATIO = 1.2  # activations this many times the earlier steps' peak: a spike
CALLS_PER_STEP_UNSEEN = 3  # model calls one training step may make before its backward, with none seen
SMALLEST_GPU_BYTES = GIB  # no CUDA GPU has less: a capacity below it means memory was held outside
# Risks judged without an OOM event
KEPT_GRAPH_SHARE = 0.4  # a pass under no_grad frees each intermediate once used; keeping this share keeps a graph
KEPT_GRAPH_MIN_TENSORS = 16  # and a graph is many tensors (no_grad keeps the last few alive)
NO_GRAD_FREES = 0.9  # of a kept graph, what no_grad frees (recommendations.NO_GRAD_SAVES)
MODEL_STATES_SHARE = 0.9  # model states this share of allocated: they are what fills memory
AT_CAPACITY_FREE_PART = 100  # at capacity: the cache holds under a hundredth of reserved free
FEW_TRACE_ENTRIES = 8  # a trace this short (torch 2.0 kept one entry by default) may have lost its OOM
NO_OOM_CONFIDENCE = 0.9  # a trace that could have kept an OOM event holds none
NO_OOM_BLIND_CONFIDENCE = 0.3  # no trace, or one too short to have kept it: the file cannot tell
FRAGMENTATION_MATERIAL_PART = 20  # fragments under a twentieth of the capacity do not outrank growth
# what the run keeps and can free (stale gradients, a leak's tensors, kept outputs or graphs): where
# the model states were seen to fit the device, such an excess covering what is missing is the cause
KEPT_EXCESS_VERDICTS = (
    Verdict.GRADIENTS_KEPT,
    Verdict.CREEPING_LEAK,
    Verdict.EVAL_OUTPUTS_KEPT,
    Verdict.INFERENCE_WITH_GRAD,
)
# Outputs kept across evaluation batches (a loop of forward passes without backward)
EVAL_MIN_KEEPING_PASSES = 2  # earlier passes that each left outputs alive
EVAL_KEEPING_PART = 4  # and at least 3/4 of the earlier passes did
EVAL_ONE_PASS_SHARE = 0.6  # no one pass holds more than this share of what is kept: it piles up
EVAL_OUTPUTS_RISK_SHARE = 0.25  # without an OOM, kept outputs this share of allocated at the peak
# an earlier pass that keeps at most this many tensors (the typical one) kept its outputs (logits,
# labels, predictions), not its graph: autograd saves tensors at every layer of a pass. Outputs
# can be more than a quarter of what a pass allocated (a large vocabulary's logits after a narrow
# model), so the share alone does not tell them apart.
OUTPUT_TENSORS_PER_PASS = 4
# A state dict gathered at checkpoint save
CHECKPOINT_MIN_PART = 2  # saving code holding at least half of the device's parameters: a copy of them
CHECKPOINT_RISK_SHARE = 0.25  # without an OOM, the save's copies this share of allocated at the peak


@dataclass
class Context:
    """Everything the verdict tests read, computed once by `analyse`."""

    oom: OomEvent | None
    accounting: Accounting
    fragmentation: Fragmentation
    components: dict[str, int]
    live_blocks: Sequence[LiveBlock]
    phases: Sequence[PhaseSpan]
    phase_source: str
    target_phase: str
    target_step: int | None
    target_index: int | None
    steps: Sequence[StepSummary]
    optimizer_kind: str | None  # "adam" | "sgd" | "adagrad" | "lion" | None, from frames or registry names
    exact: bool  # the registry placed the model states
    expandable_on: bool | None
    capacity_bytes: int | None = field(default=None)  # what PyTorch could have had on this device
    target_allocated_bytes: int | None = field(default=None)  # docs/definitions.md's; None: the accounting's
    large_segment_bytes: int = field(default=LARGE_SEGMENT_BYTES)  # the allocator's large segment size
    scalable_bytes: int = field(default=0)  # live bytes that grow with the batch (whatif.scalable_bytes)
    request_scales: bool = field(default=False)  # the failed request grows with the batch (whatif.request_scales)
    near_ooms: tuple[NearOom, ...] = field(default=())  # cudaMalloc failures the allocator survived
    # (size, blocks) of each run of live optimizer state made one after another in the trace, that an
    # allocation of something else ended before the target (analysis._state_runs)
    state_runs: tuple[tuple[int, int], ...] = field(default=())
    pass_allocated_bytes: int = field(default=0)  # the forward's allocations since its oldest tensor still alive
    pass_kept_bytes: int = field(default=0)  # the forward's activations and temporaries alive at the target
    pass_kept_count: int = field(default=0)  # how many tensors those are
    # the judged step's forward allocations it freed before the target, (event index, bytes, stack):
    # what a checkpointed segment keeps as its input where the run freed it (a BatchNorm's output)
    pass_freed: tuple[tuple[int, int, Stack], ...] = field(default=())
    pass_returned: bool = field(default=False)  # the pass is the last forward, returned before the target
    earlier_passes_allocated_bytes: int = field(default=0)  # allocated by the earlier passes since the last backward
    request_frames: Stack = field(default=())  # the failed request's stack (the oom event's), innermost first
    trace_entries: int = field(default=0)
    end_components: dict[str, int] = field(default_factory=dict)  # at the dump (the series' last point)
    end_allocated_bytes: int | None = field(default=None)  # None: the target is the dump
    passes: PassHistory = field(default_factory=PassHistory)  # comparable steps, the rest of an interrupted pass
    # another device running the same model reached a backward or optimizer step this device's
    # trace, cut short by its OOM, never did (analysis/devices.py): the run trains
    peer_trains: bool = field(default=False)
    # the judged moment's stacks run inside a training step (phases.trains_by_frames): an OOM in
    # the first forward of a Lightning run trains, though no backward is in its trace
    frames_train: bool = field(default=False)
    # the process ran an optimizer's step or zero_grad (torch's record_function annotations, on any
    # device): it trains, though this device's trace holds no backward (DataParallel's first forward)
    optimizer_annotated: bool = field(default=False)
    # oomdoctor's capture saw the process make an optimizer (metadata `optimizers`): it trains, though
    # it ran out before any backward or optimizer call
    optimizer_made: bool = field(default=False)
    # the first event of each pass counted in the step before it though it may be a step of its own
    # (no optimizer step shows, and the gradients stay alive across it: micro-batches of one step,
    # or steps of an optimizer that leaves no trace in a loop that never frees them)
    unsplit_passes: tuple[int, ...] = field(default=())
    # the moments per parameter every optimizer the process held makes (0: SGD without momentum),
    # as capture recorded their kinds (metadata optimizer_kinds); None where it did not, or they differ
    recorded_moments: int | None = field(default=None)
    # bytes of the live parameter blocks oomdoctor's registry says train (requires_grad; a LoRA
    # base's are frozen); None where the dump does not say, parameter by parameter
    registry_trained: int | None = field(default=None)
    # the torch that wrote the dump offers expandable segments (torch 2.0 did not)
    expandable_available: bool = field(default=True)
    layout: Sequence[Segment] = field(default=())  # the segments and their blocks at the target
    # blocks were allocated or freed after the target: the layout (and the free blocks the
    # fragmentation figures read) was rebuilt back from the dump, an estimate (report_rows.layout_estimated)
    layout_estimated: bool = field(default=False)
    # live blocks that are the latest of a running concatenation over the passes since the last
    # training phase (passes.running_concatenations): address -> its chain of (event, bytes)
    concatenations: Mapping[int, tuple[tuple[int, int], ...]] = field(default_factory=dict)
    # the passes since the last training phase each left more allocated than the last (passes.passes_grow)
    passes_grow: bool = field(default=False)
    # a placement failure: the free blocks on the request's pool and stream, by what last held them
    # (analysis.holes); () where the trace shows none of them, or no request failed on placement
    usable_holes: tuple[FreeHole, ...] = field(default=())
    # ... and the sizes of the segments that shrink with the batch (holes.placement_layout)
    shrinking_segment_bytes: tuple[int, ...] = field(default=())

    @property
    def request(self) -> int:
        return self.oom.request_bytes if self.oom else 0

    @property
    def allocated_bytes(self) -> int:
        """Allocated bytes at the target by docs/definitions.md ("The peak"): the peak at the peak."""
        if self.target_allocated_bytes is not None:
            return self.target_allocated_bytes
        return self.accounting.allocated_bytes

    @property
    def missing(self) -> int:
        return self.accounting.missing_bytes or 0

    # What the model-state projection reads, each computed once per context: the verdicts, their
    # wording and the advice all ask (see the functions named for their docstrings).
    @functools.cached_property
    def trained(self) -> int:
        """`trained_parameters`."""
        return trained_parameters(self)

    @functools.cached_property
    def moments_shown(self) -> int | None:
        """`state_moments`."""
        return state_moments(self)

    @functools.cached_property
    def masters(self) -> int | None:
        """`master_weights`."""
        return master_weights(self)

    @functools.cached_property
    def projection(self) -> tuple[int, int, int | None]:
        """`projected_parts`."""
        return projected_parts(self)

    @property
    def needed(self) -> int:
        """What a cause must cover to have made the request fit: the missing bytes, or, when the
        free bytes added up to enough but no single place could take the request (missing is 0),
        the gap to the nearest place (`shortfall`). Bytes that cover neither could have been freed
        without the request fitting."""
        return self.shortfall() or 0

    def phases_seen(self) -> set[str]:
        return {s.phase for s in self.phases}

    def trains(self) -> bool:
        """The trace shows a backward, an optimizer step or zero_grad, or something else does
        (`trains_beyond_phases`)."""
        return bool(self.phases_seen() & TRAINING_PHASES) or self.trains_beyond_phases()

    def trains_unknown(self) -> bool:
        """Nothing in the file tells whether the run trains: the trace shows no backward, optimizer
        step or zero_grad, no evaluation loop's pass, no frames of a training step, no optimizer at
        work in the annotations, and the judged moment is in the first passes the trace shows
        (`in_first_passes`). A run that trains calls its optimizer only after a backward (or with the
        next batch), so before then finding no annotation or marker of one tells nothing, whether
        the file could record them (torch >= 2.5, oomdoctor's markers) or not; after more passes
        than one step makes with no backward between, the trace itself tells the run does not."""
        if self.trains() or PHASE_EVALUATION in self.phases_seen():
            return False
        return self.in_first_passes()

    def in_first_passes(self) -> bool:
        """The judged moment is in one of the first forward passes of the trace, no more of them
        before it than one training step may make before its backward with none seen
        (CALLS_PER_STEP_UNSEEN: a model and a loss module called apart, a pair's two calls), and
        none of a backward, optimizer step or zero_grad before it: nothing shows yet whether a
        backward follows."""
        index = self.target_index if self.target_index is not None else self.trace_entries - 1
        if index < 0:
            return False
        forwards, last_training = passes_since_training(self.phases, index)
        return last_training < 0 and 0 < len(forwards) <= CALLS_PER_STEP_UNSEEN

    def trains_beyond_phases(self) -> bool:
        """What tells the run trains besides this trace's phases: a replica's trace reached a
        backward or optimizer step, the judged moment's stacks run inside a training step, the
        process's annotations show an optimizer at work, or capture saw it make one."""
        return self.peer_trains or self.frames_train or self.optimizer_annotated or self.optimizer_made

    def optimizer_state_made(self) -> tuple[int, int | None]:
        """(live optimizer state made before the trace began, the event at which the last of the
        live state made in the trace was made; None when none was)."""
        before = 0
        last: int | None = None
        for block in self.live_blocks:
            if block.component != Component.OPTIMIZER_STATE:
                continue
            if block.alloc_index is None:
                before += block.size_bytes
            elif last is None or block.alloc_index > last:
                last = block.alloc_index
        return before, last

    def optimizer_step_seen(self, since: int | None = None) -> bool:
        """An optimizer step shows in the trace (its allocations' frames) or in the annotations. An
        optimizer that allocates nothing in its step (SGD with momentum, a fused Adam) and records
        no annotation (before torch 2.5) leaves none: then gradients alive across backwards may
        be kept on purpose, accumulated over micro-batches. Markers number the run's steps by its
        completed optimizer steps, so a markers step past 0 shows one ran. `since`: a step in the
        trace counts only where it ended after that event (the gradients were made)."""
        return (
            any(s.phase == PHASE_OPTIMIZER and (since is None or s.last_index > since) for s in self.phases)
            or self.optimizer_annotated
            or (self.phase_source == SOURCE_MARKERS and (self.target_step or 0) >= 1)
        )

    def gradients_maybe_accumulated(self) -> bool:
        """No optimizer step shows since the oldest of the gradients from earlier steps (or from
        before the trace) was made, or some are an earlier pass's of the target's step (no optimizer
        step shows between its passes): they may be accumulated over micro-batches on purpose."""
        if self.gradients_from_passes():
            return True
        made = [
            b.alloc_index for b in self.old_blocks((Component.GRADIENTS,), pre_trace=True) if b.alloc_index is not None
        ]
        return not self.optimizer_step_seen(since=min(made) if made else None)

    def optimizer_state_sharded(self) -> bool:
        """The optimizer state was made by an optimizer that keeps only this rank's share of it
        (ZeRO: torch's ZeroRedundancyOptimizer, DeepSpeed): it is no whole number of moments per
        parameter, and how large this rank's share will be is not in the file."""
        return any(
            b.component == Component.OPTIMIZER_STATE and sharded_optimizer_frames(b.frames) for b in self.live_blocks
        )

    def parameters_sharded(self) -> bool:
        """The parameters are FSDP's (its flat or sharded parameters, or their all-gathers): the run
        shards its model states across ranks already."""
        return any(b.component == Component.PARAMETERS and fsdp_parameter_frames(b.frames) for b in self.live_blocks)

    def in_first_optimizer_step(self) -> bool:
        """The target is in the trace's first step's optimizer step, and that is the run's first:
        the step is creating optimizer state (a stateful optimizer makes it lazily, in its first
        step), or none predates the trace. (A trace that began late, or a ring buffer that wrapped,
        counts its steps from 0 too; state from before the trace that this step does not add to
        was made by an earlier step, or up front as DeepSpeed makes it.)"""
        if self.target_phase != PHASE_OPTIMIZER or (self.target_step or 0) != 0:
            return False
        creating = any(
            b.component == Component.OPTIMIZER_STATE
            and b.alloc_index is not None
            and b.phase == PHASE_OPTIMIZER
            and b.step == self.target_step
            for b in self.live_blocks
        )
        return creating or self.optimizer_state_made()[0] == 0

    def earlier_passes_end(self) -> int | None:
        """Where the latest pass of the target's step that may be a step of its own began, at or
        before the target (`unsplit_passes`: no optimizer step shows, and the gradients stayed alive
        across it); None where there is none. Gradients this step made before it are an earlier
        pass's: a micro-batch's of the same step, or an earlier step's, which the file cannot tell."""
        if not self.unsplit_passes or self.target_step is None:
            return None
        target = self.target_index if self.target_index is not None else self.trace_entries - 1
        step_first = min((s.first_index for s in self.phases if s.step == self.target_step), default=None)
        if step_first is None:
            return None
        return max((i for i in self.unsplit_passes if step_first < i <= target), default=None)

    def from_earlier_pass(self, block: LiveBlock, passes_end: int | None) -> bool:
        """A gradient block made in the target's step before `passes_end` (`earlier_passes_end`)."""
        return (
            passes_end is not None
            and block.component == Component.GRADIENTS
            and block.alloc_index is not None
            and block.alloc_index < passes_end
            and block.step == self.target_step
        )

    def old_blocks(self, components: tuple[str, ...], *, pre_trace: bool = False) -> list[LiveBlock]:
        """The live blocks `old_bytes` counts (without a phase filter): made in a step before the
        target's, or gradients made by an earlier pass of its step that may have been a step of its
        own (`earlier_passes_end`). DDP's gradient buckets are gradients made once (and again at the
        bucket rebuild) that the reducer keeps for the whole run: no step leaves them behind, and
        zero_grad does not free them."""
        passes_end = self.earlier_passes_end() if Component.GRADIENTS in components else None
        return [
            block
            for block in self.live_blocks
            if block.component in components
            and not (block.component == Component.GRADIENTS and ddp_bucket_frames(block.frames))
            and (
                pre_trace
                if block.alloc_index is None
                else (self.target_step is not None and block.step is not None and block.step < self.target_step)
                or self.from_earlier_pass(block, passes_end)
            )
        ]

    def gradients_from_passes(self) -> int:
        """Bytes of the live gradients an earlier pass of the target's step made, which the file
        cannot tell from an earlier step's (`earlier_passes_end`)."""
        passes_end = self.earlier_passes_end()
        return sum(b.size_bytes for b in self.live_blocks if self.from_earlier_pass(b, passes_end))

    def old_bytes(
        self, components: tuple[str, ...], phases: tuple[str, ...] | None = None, *, pre_trace: bool = False
    ) -> tuple[int, set[int], LiveBlock | None]:
        """Live bytes of `components` allocated in a step before the target's (and, with
        `pre_trace`, before the trace began: older than any step it shows)."""
        total = 0
        steps: set[int] = set()
        largest = None
        for block in self.old_blocks(components, pre_trace=pre_trace):
            if phases is not None and block.phase not in phases:
                continue
            total += block.size_bytes
            if block.step is not None and block.alloc_index is not None:
                steps.add(block.step)
            if largest is None or block.size_bytes > largest.size_bytes:
                largest = block
        return total, steps, largest

    def shortfall(self) -> int | None:
        """What the failed request lacked at the OOM (None: no OOM, or not known).

        The missing bytes when free device memory and usable cache added up to less than the
        request. When they added up to enough (missing is 0) the request still failed because no
        single place could take it: then the gap to the nearest place it would have fitted, the
        largest usable free block, or free device memory against what cudaMalloc was asked for
        (freed cache goes back to the device when torch releases empty segments and retries).
        """
        if self.oom is None or self.accounting.missing_bytes is None:
            return None
        if self.missing > 0:
            return self.missing
        gaps = [self.request - self.fragmentation.largest_usable_free_block_bytes]
        free = self.accounting.device_free_bytes
        if free is not None:
            gaps.append((self.accounting.message_bytes or self.request) - free)
        gap = min(gaps)
        return gap if gap > 0 else None

    def placement_failure(self) -> bool:
        """The free bytes added up to the request, but no single place could take it."""
        return self.oom is not None and self.accounting.missing_bytes == 0


def _missing_evidence(ctx: Context) -> Evidence:
    """What the request lacked; when the free bytes added up to enough, say why it still failed."""
    if ctx.missing > 0 or ctx.oom is None:
        return Evidence(EvidenceKind.MISSING, "missing_bytes", ctx.missing, ctx.target_index)
    facts = Facts.of(
        largest=ctx.fragmentation.largest_usable_free_block_bytes,
        asked=ctx.accounting.message_bytes or ctx.request,
        free=ctx.accounting.device_free_bytes,
    )
    return Evidence(EvidenceKind.MISSING_PLACEMENT, "missing_bytes", ctx.missing, ctx.target_index, facts=facts)


def _frame_text(block: LiveBlock | None) -> str | None:
    return source_line(block.frames) if block is not None else None


def _block_evidence(
    kind: EvidenceKind, metric: str, nbytes: int | None, block: LiveBlock | None, facts: Facts | None = None
) -> Evidence:
    """Evidence of `nbytes` that points at one live block: its alloc event, address and source line."""
    return Evidence(
        kind,
        metric,
        nbytes,
        block.alloc_index if block is not None else None,
        block.address if block is not None else None,
        _frame_text(block),
        facts=facts if facts is not None else Facts(),
    )


def _component_evidence(ctx: Context, kind: EvidenceKind, component: str) -> Evidence:
    """Bytes of one component, pointing at its largest live block (event, address, source line)
    and naming it when the registry does."""
    blocks = [b for b in ctx.live_blocks if b.component == component]
    largest = max(blocks, key=lambda b: b.size_bytes) if blocks else None
    named = Facts.of(largest_name=largest.name) if largest is not None and largest.name else None
    return _block_evidence(kind, component, ctx.components.get(component, 0), largest, named)


def model_states(ctx: Context) -> tuple[int, int, int, int]:
    c = ctx.components
    return (
        c.get(Component.PARAMETERS, 0),
        c.get(Component.GRADIENTS, 0),
        c.get(Component.OPTIMIZER_STATE, 0),
        c.get(Component.BUFFERS, 0),
    )


def _projected_states(ctx: Context) -> tuple[int, Facts]:
    """Parameters + gradients + optimizer state + buffers as the run needs them at full size, and
    how the optimizer state was projected: `projected_moments` per parameter (None when it was
    taken as it is), `optimizer_kind` (None when the moments are assumed Adam-style or, with
    `moments_read`, read from the state made so far: `state_moments`), `moments_recorded` where
    capture recorded the optimizers' kinds (`moments_to_come`)."""
    total, _, moments = ctx.projection
    parameters, gradients, _, _ = model_states(ctx)
    trained = ctx.trained
    sharded = ctx.optimizer_state_sharded()
    facts = Facts.of(
        needed=total,
        projected_moments=moments,
        # the state taken as this rank's shard holds it; inside the first step, what it holds so far
        state_sharded=(2 if ctx.in_first_optimizer_step() else 1) if sharded else None,
        optimizer_kind=ctx.optimizer_kind,
        projected_gradients=int(ctx.trains() and gradients < trained),
        trained=trained if trained < parameters else None,
    )
    if moments is not None:
        source = moments_to_come(ctx)[1]
        if source == MOMENTS_RECORDED:
            facts = facts.adding(moments_recorded=1)  # as capture recorded the optimizers' kinds
        elif source == MOMENTS_READ:
            facts = facts.adding(moments_read=1)  # read from the state made so far, not assumed
    masters = ctx.masters if moments is not None else None
    if masters is not None and masters < trained:
        facts = facts.adding(masters=masters)  # the state projected at the fp32 master weights only
    if (facts.get("projected_gradients") or moments is not None) and not trained_shown(ctx):
        facts = facts.adding(assumed_all=1)  # every parameter taken to train: an upper bound
    return total, facts


def _backward_done_in_step(ctx: Context) -> bool:
    """A backward of the target's step ended before the target (the step's optimizer step, or a
    later micro-batch): every parameter that trains has its gradient by then."""
    target = ctx.target_index if ctx.target_index is not None else ctx.trace_entries - 1
    return any(s.phase == PHASE_BACKWARD and s.step == ctx.target_step and s.last_index < target for s in ctx.phases)


def trained_parameters(ctx: Context) -> int:
    """The bytes of parameters that train, which gradients and optimizer state are projected at:
    the parameters, unless the dump shows fewer train (frozen weights: a LoRA base, an RLHF
    reference model). After a backward of the target's step, the live gradients are every trained
    parameter's; after the optimizer's first step, its state is complete and holds at least one
    moment per trained parameter (Adam two, SGD momentum or Lion one), unless the optimizer
    shards it (ZeRO: each rank holds the moments of its share of the parameters)."""
    parameters, gradients, optimizer_state, _ = model_states(ctx)
    # the registry says which parameters require gradients: only those get gradients and state
    if ctx.registry_trained is not None:
        parameters = min(parameters, ctx.registry_trained)
    if gradients and _backward_done_in_step(ctx):
        return min(parameters, gradients)
    if optimizer_state and not ctx.in_first_optimizer_step() and not ctx.optimizer_state_sharded():
        return min(parameters, optimizer_state)
    return parameters


def trained_shown(ctx: Context) -> bool:
    """The file shows which parameters train (`trained_parameters`): the registry says, parameter
    by parameter, or a backward of the target's step made their gradients, or the optimizer's
    state is complete. Otherwise the projection assumes every parameter trains: an upper bound
    (a LoRA run's frozen base gets neither gradients nor optimizer state)."""
    _, gradients, optimizer_state, _ = model_states(ctx)
    return (
        ctx.registry_trained is not None
        or bool(gradients and _backward_done_in_step(ctx))
        or bool(optimizer_state and not ctx.in_first_optimizer_step() and not ctx.optimizer_state_sharded())
    )


def state_moments(ctx: Context) -> int | None:
    """The moments per parameter the optimizer state made in the trace shows, for an optimizer of
    unknown kind (a user's own Lion keeps one, Adam two): each state tensor is made like its
    parameter (`zeros_like`), so of one block size, and an optimizer makes a parameter's state
    before it moves on to the next. The state blocks in the order they were made, cut into runs of
    one size: every run but the last is of parameters done with (the last may be cut short by the
    OOM); a size whose done runs hold c blocks beside p parameter blocks of that size shows at
    least ceil(c / p) moments. None where no done run has a parameter's size (a flat buffer, an
    8-bit state, or only one run so far). Blocks of the allocator's smallest size are left out:
    a step count's scalar shares it with small parameters."""
    made = sorted(
        (b.alloc_index, b.size_bytes)
        for b in ctx.live_blocks
        if b.component == Component.OPTIMIZER_STATE and b.alloc_index is not None and b.size_bytes > MIN_BLOCK_BYTES
    )
    runs: list[list[int]] = []  # [size, blocks] of each run
    for _, size in made:
        if runs and runs[-1][0] == size:
            runs[-1][1] += 1
        else:
            runs.append([size, 1])
    done: dict[int, int] = {}
    for size, count in runs[:-1]:
        done[size] = done.get(size, 0) + count
    parameters: dict[int, int] = {}
    for b in ctx.live_blocks:
        if b.component == Component.PARAMETERS:
            parameters[b.size_bytes] = parameters.get(b.size_bytes, 0) + 1
    shown = [-(-count // parameters[size]) for size, count in done.items() if parameters.get(size)]
    if shown:
        return max(shown)
    return _moments_per_parameter_run(ctx.state_runs, parameters)


def _moments_per_parameter_run(runs: Sequence[tuple[int, int]], parameters: Mapping[int, int]) -> int | None:
    """The moments an optimizer that makes each parameter's state and then updates it (a loop over
    the parameters, as a Lion or Adam written by hand is) shows where its parameters have one size
    (no change of size cuts its state into parameters): each parameter's state is a run of state
    blocks that the update's first temporary ends. Two or more ended runs, all of one count, of a
    parameter's size: that count. None otherwise (one run: torch's foreach optimizers make every
    parameter's state in one run before any temporary, and its count alone could be either)."""
    counts = {count for size, count in runs if parameters.get(size)}
    if len(runs) < 2 or len(counts) != 1 or any(not parameters.get(size) for size, _ in runs):
        return None
    return counts.pop()


MASTER_PAIRED_SHARE = 0.9  # the paired blocks hold this share of the parameters' bytes or more


def master_weights(ctx: Context) -> int | None:
    """The bytes of fp32 master weights where the parameters are a half-precision model and its
    fp32 copy (mixed precision by hand, apex O2): the optimizer steps the masters only, so its state
    is theirs. Read from the requested bytes: in the order the parameters were made, a run of them
    pairs one for one, in the same order, with the run that follows (or precedes) it at exactly
    twice (half) the bytes, and the pairs hold nearly all the parameters' bytes (a few scalars, a
    loss scale, may stand apart), and the optimizer's first state block is of the first master's
    bytes (it steps the masters). None where they do not (a UNet whose widths double pairs its
    sizes, but not in that order; a recommender whose item table is twice its user table pairs
    them, but its optimizer began with the user table) or no state was made in the trace."""
    blocks = sorted(
        (b for b in ctx.live_blocks if b.component == Component.PARAMETERS),
        key=lambda b: (b.alloc_index is not None, b.alloc_index or 0, b.address),
    )
    sizes = [b.requested_bytes for b in blocks]
    total = sum(sizes)
    state = min(
        (b for b in ctx.live_blocks if b.component == Component.OPTIMIZER_STATE and b.alloc_index is not None),
        key=lambda b: b.alloc_index or 0,
        default=None,
    )
    if len(sizes) < 4 or not total or state is None:
        return None
    # first without the order: sizes that could pair at twice must hold the share at all
    count: dict[int, int] = {}
    for size in sizes:
        count[size] = count.get(size, 0) + 1
    count_of = dict(count)
    could = 0
    for size in sorted(count):
        pairs = min(count[size], count.get(2 * size, 0))
        count[2 * size] = count.get(2 * size, 0) - pairs
        could += 3 * size * pairs
    if could < MASTER_PAIRED_SHARE * total:
        return None
    # where each size lies among the parameters, in the order they were made: a block's pair is
    # found by bisection, not by a walk over the other run
    where: dict[int, list[int]] = {}
    for position, size in enumerate(sizes):
        where.setdefault(size, []).append(position)
    # Each split's pairs in order hold at most what its two runs' sizes could pair at all (kept
    # split by split as one block moves across: `before` and `after` count the runs' sizes). The
    # splits are tried from the largest such bound down, until no bound exceeds the best pairing
    # found: pairing every split in order made a model of a few thousand tensors take seconds.
    before: dict[int, int] = {}
    after = dict(count_of)
    bounds = [0, 0]  # the masters' bytes that could pair: half precision first, masters first

    def term(size: int, first_half: bool) -> int:
        half, masters = (before, after) if first_half else (after, before)
        return min(half.get(size, 0), masters.get(2 * size, 0)) * 2 * size

    candidates: list[tuple[int, int, bool]] = []  # (bound, split, half precision first)
    made = 0
    # the run made first holds a third (half precision first) or two thirds of the paired bytes,
    # and at most all the unpaired ones
    unpaired = 1 - MASTER_PAIRED_SHARE
    for split in range(1, len(sizes)):
        moved = sizes[split - 1]
        touched = {moved, moved // 2} if moved % 2 == 0 else {moved}
        for order, first_half in enumerate((True, False)):
            bounds[order] -= sum(term(size, first_half) for size in touched)
        before[moved] = before.get(moved, 0) + 1
        after[moved] -= 1
        for order, first_half in enumerate((True, False)):
            bounds[order] += sum(term(size, first_half) for size in touched)
        made += moved
        share = made / total
        if not any(
            part * MASTER_PAIRED_SHARE <= share <= part * MASTER_PAIRED_SHARE + unpaired for part in (1 / 3, 2 / 3)
        ):
            continue
        for order, first_half in enumerate((True, False)):
            if 3 * bounds[order] >= 2 * MASTER_PAIRED_SHARE * total:  # the pairs hold 3/2 the masters
                candidates.append((bounds[order], split, first_half))
    best: int | None = None
    for bound, split, first_half in sorted(candidates, reverse=True):
        if best is not None and bound <= best:
            break
        low, start, end = (range(split), split, len(sizes)) if first_half else (range(split, len(sizes)), 0, split)
        paired = _paired_in_order(sizes, where, low, start, end, state.requested_bytes, total)
        if paired is not None:
            best = paired if best is None else max(best, paired)
    return best


def _paired_in_order(
    sizes: Sequence[int],
    where: Mapping[int, list[int]],
    low: range,
    start: int,
    end: int,
    first_state: int,
    total: int,
) -> int | None:
    """`master_weights`' pairing of one split: each block of `low` (positions in `sizes`, in order)
    pairs with the next block of twice its bytes among positions `start` to `end`, after the last one
    paired. The masters' bytes paired where the pairs hold MASTER_PAIRED_SHARE of `total` and the
    first master paired is of the optimizer's first state block's bytes; else None. Stops as soon as
    either cannot hold."""
    needed = MASTER_PAIRED_SHARE * total
    left = 3 * sum(sizes[index] for index in low)  # what the pairs could still hold
    paired_low = paired_high = 0
    position = start
    first: int | None = None
    for index in low:
        size = sizes[index]
        left -= 3 * size
        candidates = where.get(2 * size, ())
        found = bisect.bisect_left(candidates, position)
        if found < len(candidates) and candidates[found] < end:
            if first is None:
                if 2 * size != first_state:  # the optimizer began with another tensor than this master
                    return None
                first = 2 * size
            paired_low += size
            paired_high += 2 * size
            position = candidates[found] + 1
        if paired_low + paired_high + left < needed:
            return None
    if first is None or paired_low + paired_high < needed:
        return None
    return paired_high


def moments_to_come(ctx: Context) -> tuple[int, str]:
    """The moments per parameter optimizer state still to come is projected at, and what says so
    (MOMENTS_RECORDED, MOMENTS_KIND, MOMENTS_READ, MOMENTS_ASSUMED): as capture recorded every
    optimizer's kind (`recorded_moments`: SGD without momentum keeps none); else one for an
    optimizer that keeps one (`ONE_MOMENT_OPTIMIZERS`) and two for another the frames or registry
    names; else as many as its state so far shows; else two, Adam's, assumed."""
    if ctx.recorded_moments is not None:
        return ctx.recorded_moments, MOMENTS_RECORDED
    if ctx.optimizer_kind is not None:
        return (1 if ctx.optimizer_kind in ONE_MOMENT_OPTIMIZERS else 2), MOMENTS_KIND
    if ctx.moments_shown:
        return ctx.moments_shown, MOMENTS_READ
    return 2, MOMENTS_ASSUMED


def projected_parts(ctx: Context) -> tuple[int, int, int | None]:
    """(projected model states, of which optimizer state, the moments per parameter the optimizer
    state was projected at; None when it was taken as it is). Gradients and state are projected at
    the parameters that train (`trained_parameters`). A sharded optimizer's state (ZeRO) is this
    rank's share, of no size the parameters give: it is taken as it is. Before the first optimizer
    step (the target in step 0, no state yet) the state to come is projected only where capture
    recorded the optimizers' kinds (`recorded_moments`): nothing else says which optimizer will
    step, and how much state it will make."""
    parameters, gradients, optimizer_state, buffers = model_states(ctx)
    trained = ctx.trained
    projected_moments = None
    projected_gradients = max(gradients, trained) if ctx.trains() else gradients
    projected_state = optimizer_state
    before_first_step = (
        not optimizer_state
        and bool(ctx.recorded_moments)
        and ctx.trains()
        and (ctx.target_step or 0) == 0
        and ctx.target_phase != PHASE_OPTIMIZER
    )
    if ctx.optimizer_state_sharded():
        pass
    elif before_first_step or ctx.in_first_optimizer_step() or (optimizer_state and optimizer_state < trained):
        moments, _ = moments_to_come(ctx)
        masters = ctx.masters
        projected_state = max(optimizer_state, moments * min(trained, masters if masters is not None else trained))
        projected_moments = moments
    return parameters + projected_gradients + projected_state + buffers, projected_state, projected_moments


# Each test returns a Finding when it holds.


def _test_outside(ctx: Context) -> Finding | None:
    outside = ctx.accounting.non_pytorch_bytes
    total = ctx.accounting.device_total_bytes
    if ctx.oom is None or outside is None or not total:
        return None
    context_allowance = min(CUDA_CONTEXT_ALLOWANCE_BYTES, total // CUDA_CONTEXT_ALLOWANCE_PART)
    if outside < total // OUTSIDE_MIN_PART or outside - context_allowance < ctx.needed:
        return None
    return Finding(
        Verdict.OUTSIDE_PYTORCH,
        0.85 if outside >= total // OUTSIDE_STRONG_PART else 0.7,
        Summary(SummaryKind.OUTSIDE_PYTORCH, Facts.of(outside=outside, total=total, request=ctx.request)),
        (
            Evidence(EvidenceKind.OUTSIDE, "non_pytorch_bytes", outside),
            Evidence(EvidenceKind.DEVICE_TOTAL, "device_total_bytes", total),
            _missing_evidence(ctx),
        ),
    )


def states_assumed(ctx: Context) -> bool:
    """The model states are too large for the capacity only as projected on the assumption that
    every parameter trains, which the file does not show (`trained_shown`): the states it holds
    fit, and the projection is an upper bound (a LoRA base is frozen: no gradients, no state)."""
    capacity = ctx.capacity_bytes
    if not capacity or sum(model_states(ctx)) >= MODEL_STATES_CAPACITY_SHARE * capacity:
        return False
    _, _, moments = ctx.projection
    parameters, gradients, _, _ = model_states(ctx)
    projects = moments is not None or (ctx.trains() and gradients < ctx.trained)
    return projects and not trained_shown(ctx)


def _test_model_states(ctx: Context) -> Finding | None:
    capacity = ctx.capacity_bytes
    if ctx.oom is None or not capacity:
        return None
    needed, projection = _projected_states(ctx)
    if needed < MODEL_STATES_CAPACITY_SHARE * capacity:
        return None
    # too large only if every parameter trains, which the file does not show (a plain dump's first
    # forward: a LoRA base is frozen): a finding no verdict rests on (`diagnose`)
    assumed = states_assumed(ctx)
    return Finding(
        Verdict.MODEL_STATES_TOO_LARGE,
        ASSUMED_STATES_CONFIDENCE if assumed else 0.85 if ctx.exact else 0.65,
        Summary(SummaryKind.MODEL_STATES_TOO_LARGE, projection.adding(capacity=capacity)),
        (
            _component_evidence(ctx, EvidenceKind.PARAMETERS, Component.PARAMETERS),
            _component_evidence(ctx, EvidenceKind.GRADIENTS, Component.GRADIENTS),
            _component_evidence(ctx, EvidenceKind.OPTIMIZER_STATE, Component.OPTIMIZER_STATE),
            Evidence(EvidenceKind.MODEL_STATES_NEEDED, "model_states_needed_bytes", needed, facts=projection),
            Evidence(EvidenceKind.CAPACITY, "capacity_bytes", capacity),
        ),
    )


def _test_fragmentation(ctx: Context) -> Finding | None:
    """Enough free cached memory on the request's pool and stream, but no block of it large enough."""
    frag = ctx.fragmentation
    if ctx.oom is None or not frag.would_fit_if_contiguous:
        return None
    # the free blocks at an OOM the dump postdates are the rebuilt layout's, an estimate: said so
    estimated: dict[str, Fact] = {"estimated": 1} if ctx.layout_estimated else {}
    return Finding(
        Verdict.FRAGMENTATION,
        0.85,
        Summary(
            SummaryKind.FRAGMENTATION,
            Facts.of(
                usable=frag.usable_free_bytes,
                request=ctx.request,
                largest=frag.largest_usable_free_block_bytes,
                **estimated,
            ),
        ),
        (
            Evidence(
                EvidenceKind.USABLE_FREE,
                "usable_free_bytes",
                frag.usable_free_bytes,
                facts=Facts.of(pool=frag.request_pool, **estimated),
            ),
            Evidence(
                EvidenceKind.LARGEST_FREE_BLOCK,
                "largest_usable_free_block_bytes",
                frag.largest_usable_free_block_bytes,
                facts=Facts.of(**estimated),
            ),
            Evidence(EvidenceKind.REQUEST, "request_bytes", ctx.request, ctx.target_index),
            Evidence(EvidenceKind.DEVICE_FREE, "device_free_bytes", ctx.accounting.device_free_bytes),
        ),
    )


def _test_oversized(ctx: Context) -> Finding | None:
    capacity = ctx.capacity_bytes
    if ctx.oom is None or not capacity:
        return None
    c = ctx.components
    transient = c.get(Component.ACTIVATIONS, 0) + c.get(Component.TEMPORARIES, 0) + c.get(Component.INPUTS, 0)
    request = ctx.request
    if not (
        request >= capacity // OVERSIZED_PART
        or (request >= capacity // OVERSIZED_IF_LARGEST_PART and request > transient)
    ):
        return None
    return Finding(
        Verdict.OVERSIZED_REQUEST,
        0.8 if request > transient else 0.6,
        Summary(
            SummaryKind.OVERSIZED_REQUEST, Facts.of(request=request, share=request / capacity, transient=transient)
        ),
        (
            Evidence(EvidenceKind.REQUEST, "request_bytes", request, ctx.target_index),
            Evidence(
                EvidenceKind.MESSAGE_BYTES,
                "message_bytes",
                ctx.accounting.message_bytes,
                ctx.target_index,
            ),
            Evidence(EvidenceKind.TRANSIENT, "transient_bytes", transient),
            Evidence(EvidenceKind.CAPACITY, "capacity_bytes", capacity),
        ),
    )


def _test_gradients_kept(ctx: Context) -> Finding | None:
    if ctx.oom is None or ctx.target_phase not in (*FORWARD_PASSES, PHASE_BACKWARD, PHASE_BETWEEN):
        return None
    old, steps, largest = ctx.old_bytes((Component.GRADIENTS,), pre_trace=True)
    parameters = ctx.components.get(Component.PARAMETERS, 0)
    if old <= 0 or (parameters and old < parameters // GRADIENTS_KEPT_MIN_PART) or old < ctx.needed:
        return None
    no_zero_grad = PHASE_ZERO_GRAD not in ctx.phases_seen()
    facts = Facts.of(old=old, step=ctx.target_step, phase=ctx.target_phase)
    before_trace = old - ctx.old_bytes((Component.GRADIENTS,))[0]  # made before any step the trace shows
    if before_trace:
        facts = facts.adding(before_trace=before_trace)
    accumulating = ctx.gradients_maybe_accumulated()
    if accumulating:
        facts = facts.adding(no_optimizer_step=1)
    from_passes = ctx.gradients_from_passes()
    if from_passes:  # an earlier pass's of this step: a micro-batch's, or a step's the file cannot tell
        facts = facts.adding(from_passes=from_passes)
    return Finding(
        Verdict.GRADIENTS_KEPT,
        0.5 if accumulating else 0.8 if no_zero_grad else 0.65,
        Summary(SummaryKind.GRADIENTS_KEPT, facts),
        (
            _block_evidence(EvidenceKind.OLD_GRADIENTS, "old_gradient_bytes", old, largest),
            _component_evidence(ctx, EvidenceKind.PARAMETERS, Component.PARAMETERS),
            Evidence(
                EvidenceKind.NO_ZERO_GRAD
                if no_zero_grad
                else EvidenceKind.ZERO_GRAD_KEPT
                if _survived_zero_grad(ctx)
                else EvidenceKind.ZERO_GRAD_LATER,
                "zero_grad_seen",
                value=int(not no_zero_grad),
            ),
        ),
    )


def _survived_zero_grad(ctx: Context) -> bool:
    """Whether an old gradient still alive was made before a zero_grad that ran (before the target):
    zero_grad kept it (set_to_none=False, or it zeroes in place). Gradients made from before the
    trace survived every zero_grad the trace shows. When each was made after the last zero_grad, a
    zero_grad that frees them simply has not run since (a loop that calls it after the forward)."""
    target = ctx.target_index if ctx.target_index is not None else ctx.trace_entries - 1
    starts = [s.first_index for s in ctx.phases if s.phase == PHASE_ZERO_GRAD and s.first_index <= target]
    if not starts:
        return False
    last_zero_grad = max(starts)
    return any(
        b.alloc_index is None or b.alloc_index < last_zero_grad
        for b in ctx.old_blocks((Component.GRADIENTS,), pre_trace=True)
    )


_LEAK_COMPONENTS = (Component.ACTIVATIONS, Component.TEMPORARIES, Component.INPUTS)


def _test_leak(ctx: Context) -> Finding | None:
    old, steps, largest = ctx.old_bytes(_LEAK_COMPONENTS)
    capacity = ctx.capacity_bytes or 0
    growth = _end_of_step_growth(ctx.steps)
    strong = old > 0 and len(steps) >= LEAK_MIN_STEPS and (old >= capacity // LEAK_MIN_PART or old >= ctx.needed)
    growing = growth is not None and growth[0] >= LEAK_MIN_STEPS and growth[1] > 0 and old > 0 and old >= ctx.needed
    if not (strong or growing) or (ctx.oom is None and not (strong and growing)):  # without an OOM: both
        return None
    evidence = [
        _block_evidence(EvidenceKind.KEPT_FROM_EARLIER_STEPS, "kept_bytes", old, largest, Facts.of(steps=len(steps)))
    ]
    if growth is not None:
        evidence.append(
            Evidence(
                EvidenceKind.STEP_GROWTH,
                "growth_per_step_bytes",
                growth[1],
                facts=Facts.of(steps=growth[0]),
            )
        )
    facts = Facts.of(old=old, step=ctx.target_step, at=None if ctx.oom is not None else _at(ctx))
    # kept blocks made outside any forward or backward (a list of tensors made between the steps):
    # the sentence says where they were made rather than calling them the passes'
    in_passes = ctx.old_bytes(_LEAK_COMPONENTS, (*FORWARD_PASSES, PHASE_BACKWARD))[0]
    if old > in_passes:
        facts = facts.adding(outside_passes=old - in_passes)
    return Finding(
        Verdict.CREEPING_LEAK,
        0.8 if strong and growing else 0.65,
        Summary(SummaryKind.CREEPING_LEAK, facts),
        tuple(evidence),
    )


def _end_of_step_growth(steps: Sequence[StepSummary]) -> tuple[int, int] | None:
    completed = [s for s in steps][:-1]  # the last step is the one that failed
    if len(completed) < 2:
        return None
    run = 0
    deltas = []
    for before, after in zip(completed, completed[1:]):
        delta = after.end_allocated_bytes - before.end_allocated_bytes
        if delta > LEAK_STEP_GROWTH_BYTES:
            run += 1
            deltas.append(delta)
        else:
            run = 0
            deltas = []
    if run == 0:
        return None
    return run, sum(deltas) // len(deltas)


def _kept_from_earlier_passes(ctx: Context) -> tuple[list[PhaseSpan], list[LiveBlock], int]:
    """(forward spans since the last backward, optimizer step or zero_grad; activations and
    temporaries of all but the latest still alive; the index where the last of those ended, -1 if none).
    Judged at the target event, or at the trace's last when the target is the dump itself."""
    index = ctx.target_index if ctx.target_index is not None else ctx.trace_entries - 1
    if index < 0:
        return [], [], -1
    forwards, last_training = passes_since_training(ctx.phases, index)
    if len(forwards) < 2:
        return forwards, [], last_training
    current = forwards[-1]
    kept = [
        b
        for b in ctx.live_blocks
        if b.alloc_index is not None
        and last_training < b.alloc_index < current.first_index
        # a running concatenation holds the earlier passes' outputs, whatever its phase made it
        # (the loop's code between passes: inputs by the markers' phases)
        and (b.component in (Component.ACTIVATIONS, Component.TEMPORARIES) or b.address in ctx.concatenations)
    ]
    return forwards, kept, last_training


def _passes_per_backward(ctx: Context) -> int:
    """The most forward passes a backward before the target consumed (those since the training
    phase before it); with no backward before the target, what a training step's structure runs
    at most (a triplet's three calls)."""
    target = ctx.target_index if ctx.target_index is not None else ctx.trace_entries - 1
    backwards = [s for s in ctx.phases if s.phase == PHASE_BACKWARD and s.last_index < target]
    if not backwards:
        # inside a training step by its frames (Lightning's training_step, an optimizer's closure):
        # any number of calls may await its backward (multi-crop views); else a triplet's three
        return sys.maxsize if ctx.frames_train else CALLS_PER_STEP_UNSEEN
    return max(len(passes_since_training(ctx.phases, b.first_index - 1)[0]) for b in backwards)


def _kept_per_pass(
    forwards: Sequence[PhaseSpan],
    kept: Sequence[LiveBlock],
    concatenations: Mapping[int, tuple[tuple[int, int], ...]] | None = None,
) -> tuple[list[int], list[int]]:
    """(bytes, blocks) of `kept` per earlier pass of `forwards` (all but the latest): each block
    counts to the pass it was allocated in, or after (the loop's code before the next pass). A
    running concatenation (`concatenations`: the block's chain of (event, bytes)) holds what each
    link added: each link's growth counts to the pass before it (the block's rounding to its last)."""
    earlier = forwards[:-1]
    starts = [s.first_index for s in earlier]
    per_pass = [0] * len(earlier)
    counts = [0] * len(earlier)

    def credit(index: int, size: int) -> None:
        position = max(bisect.bisect_right(starts, index) - 1, 0)
        per_pass[position] += size
        counts[position] += 1

    for block in kept:
        assert block.alloc_index is not None
        chain = (concatenations or {}).get(block.address)
        if not chain:
            credit(block.alloc_index, block.size_bytes)
            continue
        grown = 0
        for event, size in chain:
            credit(event, size - grown)
            grown = size
        per_pass[max(bisect.bisect_right(starts, chain[-1][0]) - 1, 0)] += block.size_bytes - grown
    return per_pass, counts


def _graphs_kept(ctx: Context, kept_bytes: int, counts: Sequence[int]) -> bool:
    """Whether what the earlier passes keep is their graphs: at least KEPT_GRAPHS_OF_PASSES of what
    they allocated, and more tensors than outputs are (OUTPUT_TENSORS_PER_PASS, the typical pass
    that keeps any)."""
    allocated = ctx.earlier_passes_allocated_bytes
    if kept_bytes < KEPT_GRAPHS_OF_PASSES * allocated:
        return False
    keeping = sorted(n for n in counts if n)
    return not keeping or keeping[len(keeping) // 2] > OUTPUT_TENSORS_PER_PASS


def kept_from_earlier_passes(ctx: Context) -> list[LiveBlock]:
    """The activations and temporaries of the forward passes since the last backward, but the
    latest, still alive at the target (what grad mode kept of them)."""
    return _kept_from_earlier_passes(ctx)[1]


def graphs_pile_up(ctx: Context) -> bool:
    """Whether what grad mode kept comes from two or more earlier passes since the last backward (a
    loop that keeps every pass's graph, `total += loss`), not from the latest one alone (a graph
    alive until the next pass replaces it): each pass still to come adds one, and how many come
    the file does not say."""
    forwards, kept, _ = _kept_from_earlier_passes(ctx)
    per_pass, _ = _kept_per_pass(forwards, kept)
    return sum(1 for kept_bytes in per_pass if kept_bytes > 0) >= 2


def _test_inference_with_grad(ctx: Context) -> Finding | None:
    """Repeated forward passes with no backward between them, each leaving its activations alive.
    (At an OOM: without one, `_risk_kept_graph` words the same evidence as a risk.)"""
    if ctx.oom is None or ctx.target_phase not in FORWARD_PASSES or ctx.target_index is None:
        return None
    forwards, kept, last_training = _kept_from_earlier_passes(ctx)
    if len(forwards) < 2:
        return None
    evaluating = all(f.phase == PHASE_EVALUATION for f in forwards)
    if ctx.trains() and not evaluating and len(forwards) <= _passes_per_backward(ctx):
        # a run that trains calls its model this many times before a backward (a siamese or
        # contrastive pair, a reward model's chosen and rejected, a GAN's discriminator on real and
        # fake): these passes' graphs wait for the step's backward. Passes an evaluation loop runs
        # (by its function's name) are no training step's.
        return None
    current = forwards[-1]
    kept_bytes = sum(b.size_bytes for b in kept)
    capacity = ctx.capacity_bytes or 0
    if kept_bytes <= 0 or (kept_bytes < ctx.needed and kept_bytes < capacity // KEPT_GRAPH_MIN_PART):
        return None
    if ctx.earlier_passes_allocated_bytes and not _graphs_kept(ctx, kept_bytes, _kept_per_pass(forwards, kept)[1]):
        return None  # the earlier passes kept their outputs, not their graphs
    largest = max(kept, key=lambda b: b.size_bytes)
    return Finding(
        Verdict.INFERENCE_WITH_GRAD,
        0.75,
        Summary(
            SummaryKind.INFERENCE_WITH_GRAD,
            Facts.of(passes=len(forwards), since_backward=int(last_training >= 0), kept=kept_bytes),
        ),
        (
            Evidence(EvidenceKind.FORWARD_PASSES, "forward_passes", None, current.first_index, value=len(forwards)),
            _block_evidence(EvidenceKind.EARLIER_PASS_ACTIVATIONS, "kept_activation_bytes", kept_bytes, largest),
            _missing_evidence(ctx),
        ),
    )


def _test_evaluation_keeps_graph(ctx: Context) -> Finding | None:
    """At an OOM inside an evaluation pass (by its frames: a predict, inference or generate loop)
    of a run that shows no training at all, after earlier passes of the loop that no backward
    followed: the pass keeping most of what it allocated, in many tensors, keeps its graph, as
    `_risk_kept_graph` reads a pass without an OOM. Under no_grad each intermediate goes once used.
    (The loop's first pass is not judged: nothing before it shows that no backward comes.)"""
    if ctx.oom is None or ctx.target_phase != PHASE_EVALUATION or ctx.target_index is None:
        return None
    if _training_seen(ctx) or len(_kept_from_earlier_passes(ctx)[0]) < 2:
        return None
    allocated, kept = ctx.pass_allocated_bytes, ctx.pass_kept_bytes
    if not allocated or kept < KEPT_GRAPH_SHARE * allocated or ctx.pass_kept_count < KEPT_GRAPH_MIN_TENSORS:
        return None
    if kept * NO_GRAD_FREES < ctx.needed:  # what no_grad would free does not cover what was missing
        return None
    return Finding(
        Verdict.INFERENCE_WITH_GRAD,
        0.7,
        Summary(
            SummaryKind.KEPT_GRAPH_RISK,
            Facts.of(
                kept=kept,
                share=kept / allocated,
                parameters=ctx.components.get(Component.PARAMETERS, 0),
                at="OOM",
                returned=0,
            ),
        ),
        (
            Evidence(EvidenceKind.PASS_ALLOCATED, "pass_allocated_bytes", allocated, ctx.target_index),
            Evidence(EvidenceKind.PASS_KEPT, "pass_kept_bytes", kept, ctx.target_index),
            Evidence(EvidenceKind.NO_TRAINING, "training_seen", value=0),
            _missing_evidence(ctx),
        ),
    )


def _earlier_activation_peak(ctx: Context) -> int:
    """The highest activation peak of the completed steps comparable with the target's
    (`passes.comparable_steps`: same phases, a completed forward, not setup, not a step the trace
    began inside); 0 when there is none."""
    return _comparable_peak(ctx)[0]


def _comparable_peak(ctx: Context, *, whole: bool = False) -> tuple[int, int | None]:
    """(the activations' peak, the step that reached it) over the comparable completed steps; with
    `whole`, their peak of all allocated bytes (model states included) instead."""
    comparable = set(ctx.passes.comparable_steps)

    def peak(s: StepSummary) -> int:
        return s.peak_allocated_bytes if whole else s.peak_activation_bytes or 0

    best = max((s for s in ctx.steps if s.step in comparable and peak(s)), key=peak, default=None)
    return (peak(best), best.step) if best is not None else (0, None)


def _pass_fit_since(ctx: Context, after: int) -> bool:
    """A forward and the backward after it, both of the target's step, began after event `after`
    and ended before the target, which is in a forward, a backward or between them: an earlier pass
    of this step (a micro-batch, with gradient accumulation) ran with what was alive after `after`
    and fit."""
    if ctx.target_phase not in (*FORWARD_PASSES, PHASE_BACKWARD, PHASE_BETWEEN):
        return False
    target = ctx.target_index if ctx.target_index is not None else ctx.trace_entries - 1
    forward_seen = False
    for span in ctx.phases:
        if span.step != ctx.target_step or span.first_index <= after:
            continue
        if span.last_index >= target:
            break
        if span.phase == PHASE_FORWARD:
            forward_seen = True
        elif span.phase == PHASE_BACKWARD and forward_seen:
            return True
    return False


def _inputs_changed(ctx: Context) -> bool | None:
    """Whether the inputs' sizes changed against the comparable steps (True when any changed;
    False when every one with evidence kept them; None without evidence)."""
    known = [v for v in ctx.passes.inputs_changed.values() if v is not None]
    if not known:
        return None
    return any(known)


def _test_optimizer_buildup(ctx: Context) -> Finding | None:
    if ctx.oom is None:
        return None
    parameters, gradients, optimizer_state, _ = model_states(ctx)
    step = ctx.target_step or 0
    if ctx.in_first_optimizer_step():
        return Finding(
            Verdict.OPTIMIZER_STATE_BUILDUP,
            0.8,
            Summary(
                SummaryKind.OPTIMIZER_FIRST_STEP,
                Facts.of(optimizer_state=optimizer_state, parameters=parameters, gradients=gradients),
            ),
            (
                _component_evidence(ctx, EvidenceKind.OPTIMIZER_STATE_AT_OOM, Component.OPTIMIZER_STATE),
                Evidence(EvidenceKind.FIRST_STEP_OOM, "target_step", None, ctx.target_index, value=step),
                _component_evidence(ctx, EvidenceKind.FOREACH_TEMPORARIES, Component.TEMPORARIES),
            ),
        )
    # state made before the trace began: an optimizer step ran before it, though the trace counts from 0
    before_trace, state_done = ctx.optimizer_state_made()
    if (step < 1 and not before_trace) or optimizer_state <= 0:
        return None
    # a completed step like the target's that began once the state was whole ran with it and fit:
    # the state is not what changed (what this step adds is judged by the spike test)
    state_whole = -1 if state_done is None else state_done
    comparable_steps = set(ctx.passes.comparable_steps)
    if any(s.first_index > state_whole for s in ctx.steps if s.step in comparable_steps):
        return None
    if _pass_fit_since(ctx, state_whole):  # a micro-batch of this step ran with the whole state and fit
        return None
    activations_now = ctx.components.get(Component.ACTIVATIONS, 0)
    earlier_peak = _earlier_activation_peak(ctx)
    growth = activations_now - earlier_peak
    if any(s.peak_activation_bytes is None for s in ctx.steps):
        # the trace names no forward (no stacks): the earlier steps' activations are unknown, but
        # not their whole peaks; where this step holds more above them than all the state, something
        # else grew more than the state did, and nothing shows the state is what changed
        earlier_whole = max((s.peak_allocated_bytes for s in ctx.steps if s.step < step), default=0)
        if earlier_whole and sum(ctx.components.values()) - earlier_whole > optimizer_state:
            return None
    if (
        earlier_peak
        and ctx.target_phase != PHASE_OPTIMIZER
        and growth > SPIKE_OVER_STATE_GROWTH * earlier_peak
        and growth >= ctx.needed
    ):
        return None  # this step's extra activations alone explain the OOM: a spike, not the new state
    comparable = [s for s in ctx.passes.comparable_steps if s < step]
    # markers number the run's steps from the capture's start: state from before the trace at the
    # run's step 1 was made by step 0's optimizer step, after step 0's forward and backward fit
    made_by_step_0 = bool(before_trace) and step == 1 and ctx.phase_source == SOURCE_MARKERS
    if made_by_step_0:
        comparable = [0]
    new_state = optimizer_state
    if comparable and not made_by_step_0:  # the state made since the latest step that fit began
        latest = max(comparable)
        began = next((s.first_index for s in ctx.steps if s.step == latest), -1)
        new_state = sum(
            b.size_bytes
            for b in ctx.live_blocks
            if b.component == Component.OPTIMIZER_STATE and b.alloc_index is not None and b.alloc_index >= began
        )
    if new_state < ctx.needed:
        return None
    traced_later_step = step >= 1 and (not before_trace or made_by_step_0)
    return Finding(
        Verdict.OPTIMIZER_STATE_BUILDUP,
        0.7 if traced_later_step else 0.5,
        Summary(
            SummaryKind.OPTIMIZER_LATER_STEP if traced_later_step else SummaryKind.OPTIMIZER_STATE_BEFORE_TRACE,
            Facts.of(
                step=step,
                optimizer_state=new_state if traced_later_step else optimizer_state,
                before_trace=before_trace,
                earlier_step=max(comparable) if comparable else None,
                phase=ctx.target_phase,
                temporaries=ctx.components.get(Component.TEMPORARIES, 0),
            ),
        ),
        (
            _component_evidence(ctx, EvidenceKind.OPTIMIZER_STATE_AT_OOM, Component.OPTIMIZER_STATE),
            Evidence(EvidenceKind.EARLIER_PEAK_ACTIVATIONS, "earlier_peak_activation_bytes", earlier_peak),
            _component_evidence(ctx, EvidenceKind.ACTIVATIONS_AT_OOM, Component.ACTIVATIONS),
            _missing_evidence(ctx),
        ),
    )


def after_forward_before_backward(ctx: Context) -> bool:
    """The target is in the loop's own code after a training forward returned and before anything
    else ran: between steps by the phases, but the forward's step is not over (the loss computed
    outside the model, `criterion(model(x), y)`, runs there, before its backward). The latest phase
    before the target is a forward (not an evaluation pass) of the target's step."""
    if ctx.target_phase != PHASE_BETWEEN or ctx.target_index is None:
        return False
    target = ctx.target_index
    before = [s for s in ctx.phases if s.first_index <= target and s.phase != PHASE_BETWEEN]
    return bool(before) and before[-1].phase == PHASE_FORWARD and before[-1].step == ctx.target_step


def _pass_own(ctx: Context) -> tuple[int, int, dict[int, LiveBlock]]:
    """(the judged pass's own live activations, its own temporaries, the live activation and
    temporary blocks by address that are not its own): what earlier steps or earlier passes left
    alive is a leak's or a kept graph's."""
    kept = {
        b.address: b
        for b in ctx.live_blocks
        if b.component in (Component.ACTIVATIONS, Component.TEMPORARIES)
        and b.step is not None
        and ctx.target_step is not None
        and b.step < ctx.target_step
    }
    kept.update((b.address, b) for b in _kept_from_earlier_passes(ctx)[1])
    c = ctx.components
    activations = c.get(Component.ACTIVATIONS, 0) - sum(
        b.size_bytes for b in kept.values() if b.component == Component.ACTIVATIONS
    )
    temporaries = c.get(Component.TEMPORARIES, 0) - sum(
        b.size_bytes for b in kept.values() if b.component == Component.TEMPORARIES
    )
    return activations, temporaries, kept


@dataclass(frozen=True)
class FullStates:
    """The model states at full size (`_states_at_full_size`) and what the projection assumed."""

    bytes: int
    assumed_all: bool  # every parameter taken to train: an upper bound
    moments: int | None  # optimizer state projected at this many moments per parameter (None: as it is)
    moments_assumed: bool  # that count is Adam-style's, assumed: neither frames nor state show the kind
    moments_recorded: bool = False  # that count is as capture recorded the optimizers' kinds
    # nothing still to come was projected (a run that does not train, no parameter that trains, the
    # gradients and state all made): the states as held
    as_held: bool = False


def _states_at_full_size(ctx: Context) -> FullStates:
    """The model states at full size. In a run that trains, or may (`trains_unknown`), gradients and
    optimizer state still to come are projected at the parameters that train where the file shows
    which (`trained_shown`), else at every parameter, an upper bound (a LoRA base gets neither); the
    state at one moment per parameter for an optimizer that keeps one, at as many as its state so
    far shows, else at two (Adam's, assumed where nothing names the optimizer); where capture
    recorded the optimizers' kinds, at theirs (none for SGD without momentum). State already
    complete (past the first step, or sharded) is taken as it is. A run the file shows does not
    train keeps what it holds."""
    parameters, gradients, optimizer_state, buffers = model_states(ctx)
    if not ctx.trains() and not ctx.trains_unknown():
        return FullStates(parameters + gradients + optimizer_state + buffers, False, None, False, as_held=True)
    shown = trained_shown(ctx)
    trained = ctx.trained if shown else parameters
    state, moments, source = optimizer_state, None, None
    complete = ctx.optimizer_state_sharded() or (optimizer_state > 0 and not ctx.in_first_optimizer_step())
    if not complete:
        moments, source = moments_to_come(ctx)
        state = max(optimizer_state, moments * trained)
    full = parameters + max(gradients, trained) + state + buffers
    if full == parameters + gradients + optimizer_state + buffers:
        return FullStates(full, False, None, False, as_held=True)  # nothing to project: none trains, or all made
    return FullStates(full, not shown, moments, source == MOMENTS_ASSUMED, moments_recorded=source == MOMENTS_RECORDED)


@dataclass(frozen=True)
class FirstPass:
    """A forward pass the OOM cut short with no earlier pass like it in the trace to say how much
    of it remained: what is known of it at the OOM, and what is only a bound."""

    own: int  # its own live activations and temporaries
    reached: int  # with the failed request: a lower bound of what the whole pass needs
    rest: int  # allocated bytes that are not its own (the model states, inputs, the rest)
    room: int  # what the capacity left it beside them
    full: FullStates  # the model states at full size
    capacity: int

    @property
    def states(self) -> int:
        return self.full.bytes

    @property
    def assumed(self) -> bool:
        """The states at full size take every parameter to train: an upper bound."""
        return self.full.assumed_all


def _first_pass(ctx: Context, activations: int, temporaries: int) -> FirstPass | None:
    """The judged forward as a pass the OOM interrupted with nothing to extrapolate its rest from:
    one of the trace's first passes (`Context.in_first_passes`), with no completed comparable pass
    (`passes.comparable_steps`) and no extrapolated rest. Only where the capacity is known and what
    it reached, counting the failed request, is more than the room the rest of memory left it (else
    the request failed for another reason: placement)."""
    capacity = ctx.capacity_bytes
    if ctx.oom is None or not capacity or ctx.target_phase not in FORWARD_PASSES or not ctx.in_first_passes():
        return None
    rest = ctx.passes.rest
    if (rest is not None and rest.extrapolated) or _comparable_peak(ctx)[0]:
        return None
    own = activations + temporaries
    reached = own + ctx.request
    others = ctx.allocated_bytes - own
    room = capacity - others
    if reached <= room:
        return None
    return FirstPass(own, reached, others, room, _states_at_full_size(ctx), capacity)


def _first_pass_evidence(ctx: Context, first: FirstPass) -> tuple[Evidence, ...]:
    return (
        Evidence(
            EvidenceKind.PASS_REACHED,
            "pass_reached_bytes",
            first.reached,
            ctx.target_index,
            facts=Facts.of(request=ctx.request),
        ),
        Evidence(EvidenceKind.ROOM_FOR_PASS, "room_for_pass_bytes", first.room, facts=Facts.of(rest=first.rest)),
        Evidence(
            EvidenceKind.MODEL_STATES_AT_FULL_SIZE,
            "model_states_full_bytes",
            first.states,
            facts=Facts.of(
                assumed_all=int(first.assumed) or None,
                projected_moments=first.full.moments,
                moments_assumed=int(first.full.moments_assumed) or None,
                as_held=int(first.full.as_held) or None,
                moments_recorded=int(first.full.moments_recorded) or None,
            ),
        ),
        Evidence(EvidenceKind.CAPACITY, "capacity_bytes", first.capacity),
    )


def _first_pass_too_large(ctx: Context, activations: int, temporaries: int) -> Finding | None:
    """A forward cut short near its start, with nothing to extrapolate its rest from: too large for
    the device in one pass where the model states fit at full size (even if every parameter
    trained, or as the file shows which train) and what the pass reached did not fit in the room
    they left. Where they fit only if some parameters are frozen, which the file does not show, the
    verdict is unknown and says why (`_unknown_verdict`)."""
    first = _first_pass(ctx, activations, temporaries)
    if first is None or first.states >= MODEL_STATES_CAPACITY_SHARE * first.capacity:
        return None
    phase = ctx.target_phase
    summary = Summary(
        SummaryKind.ACTIVATIONS_FIRST_PASS,
        Facts.of(
            phase=phase,
            activations=activations,
            own=first.own,
            reached=first.reached,
            room=first.room,
            rest=first.rest,
            states=first.states,
            capacity=first.capacity,
            assumed_all=int(first.assumed) or None,
        ),
    )
    evidence = (
        _component_evidence(ctx, EvidenceKind.LIVE_ACTIVATIONS, Component.ACTIVATIONS),
        _component_evidence(ctx, EvidenceKind.LIVE_TEMPORARIES, Component.TEMPORARIES),
        *_first_pass_evidence(ctx, first),
    )
    return Finding(Verdict.ACTIVATION_SPIKE, 0.6, summary, evidence)


def _test_activation_spike(ctx: Context) -> Finding | None:
    # with no phases at all (a trace without stacks), activations placed by their blocks' own
    # stacks still show what filled memory, at a lower confidence
    phases_unknown = ctx.target_phase == PHASE_UNKNOWN and not ctx.phases_seen() - {PHASE_UNKNOWN}
    # the forward's step goes on after it returned: its activations are what the loss code runs beside
    after_forward = after_forward_before_backward(ctx)
    in_pass = ctx.target_phase in (*FORWARD_PASSES, PHASE_BACKWARD) or after_forward
    if ctx.oom is None or (not in_pass and not phases_unknown):
        return None
    c = ctx.components
    activations, temporaries, kept = _pass_own(ctx)
    kept_activations = sum(b.size_bytes for b in kept.values() if b.component == Component.ACTIVATIONS)
    allocated = ctx.accounting.allocated_bytes or 1
    others = max([v for k, v in c.items() if k not in (Component.ACTIVATIONS,)] + [kept_activations])
    rest = ctx.passes.rest
    projected_pass = rest.projected_pass_bytes if rest is not None and rest.extrapolated else None
    # a forward the OOM cut short near its start holds little yet: what it would have needed is its
    # projected whole (the rest extrapolated from a comparable earlier pass), judged below; with no
    # earlier pass to extrapolate from (the run's first), by what it reached against the room the
    # model states left it, where they fit at full size (`_first_pass`)
    early = activations + temporaries < ACTIVATIONS_MIN_SHARE * allocated and activations < others
    if early and not after_forward and projected_pass is None:
        return _first_pass_too_large(ctx, activations, temporaries)
    if early and (after_forward or projected_pass is None or projected_pass < others):
        return None  # (a forward that returned is no pass cut short)
    # whose activations they are: the forward's, where the target is the loop's code after it
    phase = PHASE_FORWARD if after_forward else ctx.target_phase
    step = ctx.target_step or 0
    # in a backward whose own temporaries outweigh the activations left (a checkpointed region
    # recomputed, the gradients of attention scores), the pass's memory is both: they are counted
    # together, against the earlier steps' whole peaks (which hold both, and the model states)
    backward_own = temporaries if ctx.target_phase == PHASE_BACKWARD and temporaries > activations else 0
    if backward_own:
        earlier_peak, earlier_step = _comparable_peak(ctx, whole=True)
    else:
        earlier_peak, earlier_step = _comparable_peak(ctx)
    ratio = (activations + backward_own) / earlier_peak if earlier_peak else None
    evidence = [
        _component_evidence(ctx, EvidenceKind.LIVE_ACTIVATIONS, Component.ACTIVATIONS),
        _component_evidence(ctx, EvidenceKind.LIVE_TEMPORARIES, Component.TEMPORARIES),
    ]
    if kept:
        evidence.append(Evidence(EvidenceKind.CURRENT_ACTIVATIONS, "current_activation_bytes", activations))
    if ratio is not None:
        evidence.append(
            Evidence(
                EvidenceKind.EARLIER_PEAK_ACTIVATIONS,
                "earlier_peak_allocated_bytes" if backward_own else "earlier_peak_activation_bytes",
                earlier_peak,
                facts=Facts.of(ratio=ratio, whole=int(bool(backward_own)) or None),
            )
        )
    # what this pass reached counting what it still needed: the failed request when it grows with
    # the batch, and the rest of an interrupted pass where extrapolated
    reached = activations + backward_own + (ctx.request if ctx.request_scales else 0)
    if projected_pass is not None:
        reached = max(reached, projected_pass)
    reached_ratio = reached / earlier_peak if earlier_peak else None
    if reached_ratio is not None and reached_ratio <= 1:
        return None  # the pass needed no more than the earlier steps reached and fit: something else grew
    spike = ratio is not None and ratio > SPIKE_RATIO
    kept_bytes = sum(b.size_bytes for b in kept.values())
    # freed, what earlier steps or passes left alive must cover what the rest of an interrupted pass
    # still lacks as well (where it is extrapolated), else the OOM only moves further into the pass
    lacking = max(ctx.needed, rest_of_pass_lacking(ctx) or 0)
    if not spike and kept_bytes and kept_bytes >= lacking:
        return None  # what earlier steps or passes left alive explains the OOM, not this batch
    if early:
        # cut short near its start: a spike only where the projected pass outgrew the earlier peak
        if rest is None or reached_ratio is None or reached_ratio <= SPIKE_RATIO:
            return None
        projected_summary = Summary(
            SummaryKind.ACTIVATION_SPIKE_PROJECTED,
            Facts.of(
                step=step,
                phase=phase,
                activations=activations,
                projected=reached,
                ratio=reached_ratio,
                size_ratio=rest.size_ratio,
                earlier_step=earlier_step,
                rest_step=rest.earlier_step,
                inputs_changed=_inputs_changed(ctx),
            ),
        )
        return Finding(Verdict.ACTIVATION_SPIKE, 0.6, projected_summary, tuple(evidence))
    first = _first_pass(ctx, activations, temporaries) if ratio is None and not after_forward else None
    if first is not None:  # what the trace's first pass reached is known only as a bound: said so
        evidence.extend(_first_pass_evidence(ctx, first))
    summary = (
        Summary(
            SummaryKind.ACTIVATION_SPIKE,
            Facts.of(
                step=step,
                phase=phase,
                activations=activations,
                ratio=ratio,
                earlier_step=earlier_step,
                inputs_changed=_inputs_changed(ctx),
                temporaries=backward_own or None,
                after_forward=int(after_forward) or None,
            ),
        )
        if spike
        else Summary(
            SummaryKind.ACTIVATIONS_DOMINATE,
            Facts.of(
                phase=phase,
                activations=activations,
                ratio=reached_ratio,
                earlier_step=earlier_step,
                still_needed=int(reached != activations + backward_own),
                temporaries=backward_own or None,
                after_forward=int(after_forward) or None,
            ),
        )
    )
    return Finding(Verdict.ACTIVATION_SPIKE, 0.8 if spike else 0.4 if phases_unknown else 0.6, summary, tuple(evidence))


def _guess_outside_without_total(ctx: Context) -> Finding | None:
    """Last resort for a plain snapshot, which does not record the device's size: when PyTorch
    could use less than any CUDA GPU has (reserved + free under 1 GiB), the rest was held outside."""
    capacity = ctx.capacity_bytes
    if (
        ctx.oom is None
        or ctx.accounting.device_total_bytes is not None
        or capacity is None
        or capacity >= SMALLEST_GPU_BYTES
    ):
        return None
    return Finding(
        Verdict.OUTSIDE_PYTORCH,
        0.3,
        Summary(SummaryKind.OUTSIDE_PYTORCH_GUESSED, Facts.of(capacity=capacity)),
        (
            Evidence(EvidenceKind.RESERVED_PLUS_FREE, "capacity_bytes", capacity, ctx.target_index),
            Evidence(EvidenceKind.DEVICE_FREE, "device_free_bytes", ctx.accounting.device_free_bytes, ctx.target_index),
        ),
    )


# ---- outputs kept across evaluation batches; a state dict gathered at checkpoint save ------------


@dataclass(frozen=True)
class KeptOutputs:
    """What the forward passes since the last backward left alive: passes that ran, the earlier ones
    (all but the target's) that kept something, the bytes kept and the largest kept block."""

    passes: int
    keeping: int
    kept_bytes: int
    largest_pass_bytes: int
    largest: LiveBlock | None
    blocks: tuple[LiveBlock, ...] = ()  # the kept blocks themselves

    def share(self, ctx: Context) -> float | None:
        allocated = ctx.earlier_passes_allocated_bytes
        return self.kept_bytes / allocated if allocated else None


def kept_outputs(ctx: Context) -> KeptOutputs | None:
    """The evidence of outputs accumulated across batches of a loop without backward (an evaluation
    or prediction loop): several forward passes, each earlier one leaving a small share of what it
    allocated alive (its outputs, not its graph: under no_grad a pass frees every intermediate once
    used), so that what is kept grows pass after pass. Judged in a pass, or between steps after the
    passes (the loop's end, where the kept outputs are concatenated). None when the passes do not
    show that."""
    if ctx.target_phase not in (*FORWARD_PASSES, PHASE_BETWEEN):
        return None
    forwards, kept, _ = _kept_from_earlier_passes(ctx)
    earlier = forwards[:-1]
    if len(earlier) < EVAL_MIN_KEEPING_PASSES or not kept:
        return None
    per_pass, counts = _kept_per_pass(forwards, kept, ctx.concatenations)
    keeping = sum(1 for n in per_pass if n)
    kept_bytes = sum(per_pass)
    # outputs pile up: (nearly) every earlier pass kept some, none most of them
    if keeping < EVAL_MIN_KEEPING_PASSES or keeping * EVAL_KEEPING_PART < len(earlier) * (EVAL_KEEPING_PART - 1):
        return None
    if max(per_pass) > EVAL_ONE_PASS_SHARE * kept_bytes:
        return None
    if not ctx.earlier_passes_allocated_bytes or _graphs_kept(ctx, kept_bytes, counts):
        return None  # graphs kept (inference-with-grad), or nothing to weigh the kept bytes against
    largest = max(kept, key=lambda b: b.size_bytes)
    return KeptOutputs(len(forwards), keeping, kept_bytes, max(per_pass), largest, tuple(kept))


def _eval_outputs_finding(ctx: Context, outputs: KeptOutputs, confidence: float, at: str | None) -> Finding:
    share = outputs.share(ctx) or 0.0
    evidence = [
        Evidence(EvidenceKind.FORWARD_PASSES, "forward_passes", None, value=outputs.passes),
        _block_evidence(
            EvidenceKind.KEPT_OUTPUTS,
            "kept_output_bytes",
            outputs.kept_bytes,
            outputs.largest,
            Facts.of(passes=outputs.keeping),
        ),
        Evidence(
            EvidenceKind.EARLIER_PASSES_ALLOCATED,
            "earlier_passes_allocated_bytes",
            ctx.earlier_passes_allocated_bytes,
            facts=Facts.of(share=share),
        ),
        Evidence(
            EvidenceKind.OUTPUTS_PER_PASS,
            "kept_output_bytes_per_pass",
            outputs.kept_bytes // outputs.keeping,
            facts=Facts.of(passes=outputs.keeping),
        ),
    ]
    if ctx.oom is not None:
        if ctx.request >= outputs.kept_bytes:
            evidence.append(
                Evidence(
                    EvidenceKind.REQUEST_COVERS_KEPT,
                    "request_bytes",
                    ctx.request,
                    ctx.target_index,
                    facts=Facts.of(kept=outputs.kept_bytes),
                )
            )
        evidence.append(_missing_evidence(ctx))
    return Finding(
        Verdict.EVAL_OUTPUTS_KEPT,
        confidence,
        Summary(
            SummaryKind.EVAL_OUTPUTS_KEPT,
            Facts.of(passes=outputs.passes, keeping=outputs.keeping, kept=outputs.kept_bytes, share=share, at=at),
        ),
        tuple(evidence),
    )


def _test_eval_outputs_kept(ctx: Context) -> Finding | None:
    """An evaluation (or prediction) loop that keeps every batch's outputs on the device: the
    earlier passes' outputs cover what the request lacked (or a tenth of the capacity)."""
    if ctx.oom is None:
        return None
    outputs = kept_outputs(ctx)
    if outputs is None:
        return None
    capacity = ctx.capacity_bytes or 0
    if outputs.kept_bytes < ctx.needed and outputs.kept_bytes < capacity // KEPT_GRAPH_MIN_PART:
        return None
    return _eval_outputs_finding(ctx, outputs, 0.75, None)


def _risk_eval_outputs_kept(ctx: Context) -> Finding | None:
    """The same loop without an OOM: the kept outputs are a material share of memory at the peak."""
    if ctx.oom is not None:
        return None
    outputs = kept_outputs(ctx)
    if outputs is None or outputs.kept_bytes < EVAL_OUTPUTS_RISK_SHARE * (ctx.allocated_bytes or 1):
        return None
    return _eval_outputs_finding(ctx, outputs, 0.55, _at(ctx))


@dataclass(frozen=True)
class Gathered:
    """What checkpoint-saving code holds at the target: live bytes it allocated, the largest of
    those blocks, the outermost saving frame (of the failed request when it is the save's), and the
    parameters the device holds besides (blocks named parameters that the save did not make: its
    copies may be taken for parameters by their names or sizes)."""

    live_bytes: int
    largest: LiveBlock | None
    frame: Frame
    parameters_bytes: int


def gathered_for_save(ctx: Context) -> Gathered | None:
    """The blocks alive at the target that checkpoint-saving code allocated (by their stacks), and
    the saving frame: the failed request's, at an OOM (None when the request is not the save's)."""
    frame = save_frame(ctx.request_frames) if ctx.oom is not None else None
    if ctx.oom is not None and frame is None:
        return None
    live = parameters = 0
    largest: LiveBlock | None = None
    for block in ctx.live_blocks:
        block_frame = save_frame(block.frames) if block.alloc_index is not None else None
        if block_frame is None:
            parameters += block.size_bytes if block.component == Component.PARAMETERS else 0
            continue
        live += block.size_bytes
        if largest is None or block.size_bytes > largest.size_bytes:
            largest = block
            frame = frame or block_frame
    if frame is None:
        return None
    return Gathered(live, largest, frame, parameters)


def _checkpoint_finding(ctx: Context, gathered: Gathered, confidence: float, at: str | None) -> Finding:
    parameters = gathered.parameters_bytes
    total = gathered.live_bytes + ctx.request
    function = gathered.frame.name
    evidence = [
        Evidence(
            EvidenceKind.SAVE_CALL,
            "request_bytes" if ctx.oom is not None else None,
            ctx.request if ctx.oom is not None else None,
            ctx.target_index if ctx.oom is not None else None,
            frame=source_line((gathered.frame,)),
            facts=Facts.of(function=function),
        ),
        _block_evidence(EvidenceKind.SAVE_GATHERED, "save_gathered_bytes", gathered.live_bytes, gathered.largest),
        Evidence(EvidenceKind.PARAMETERS_HELD, "parameters_held_bytes", parameters),
    ]
    if ctx.oom is not None:
        evidence.append(_missing_evidence(ctx))
    return Finding(
        Verdict.CHECKPOINT_GATHER,
        confidence,
        Summary(
            SummaryKind.CHECKPOINT_GATHER,
            Facts.of(
                function=function,
                live=gathered.live_bytes,
                request=ctx.request if ctx.oom is not None else None,
                parameters=parameters,
                ratio=total / parameters if parameters else None,
                at=at,
            ),
        ),
        tuple(evidence),
    )


def _test_checkpoint_gather(ctx: Context) -> Finding | None:
    """The failed request was made by checkpoint-saving code, which with it would hold at least
    half as much as the parameters this device holds: a state dict copied (or gathered from the
    shards) on the GPU."""
    if ctx.oom is None:
        return None
    gathered = gathered_for_save(ctx)
    if gathered is None or not gathered.parameters_bytes:
        return None
    parameters = gathered.parameters_bytes
    total = gathered.live_bytes + ctx.request
    if total * CHECKPOINT_MIN_PART < parameters:
        return None
    return _checkpoint_finding(ctx, gathered, 0.8 if total > parameters else 0.65, None)


def _risk_checkpoint_gather(ctx: Context) -> Finding | None:
    """Without an OOM: at the peak, checkpoint-saving code holds copies of at least half the
    parameters, a material share of what is allocated."""
    if ctx.oom is not None:
        return None
    gathered = gathered_for_save(ctx)
    if gathered is None or not gathered.parameters_bytes:
        return None
    if gathered.live_bytes * CHECKPOINT_MIN_PART < gathered.parameters_bytes:
        return None
    if gathered.live_bytes < CHECKPOINT_RISK_SHARE * (ctx.allocated_bytes or 1):
        return None
    return _checkpoint_finding(ctx, gathered, 0.5, _at(ctx))


# ---- risks, without an OOM event: the same evidence, judged at the peak or the dump ------------


def _forward_of_the_step_before_target(ctx: Context) -> bool:
    """Whether the target's step ran a forward that began before the target."""
    if ctx.target_index is None and ctx.trace_entries <= 0:
        return False
    index = ctx.target_index if ctx.target_index is not None else ctx.trace_entries - 1
    return any(s.phase in FORWARD_PASSES and s.step == ctx.target_step and s.first_index <= index for s in ctx.phases)


def _training_seen(ctx: Context) -> bool:
    c = ctx.components
    return ctx.trains() or bool(c.get(Component.GRADIENTS, 0) or c.get(Component.OPTIMIZER_STATE, 0))


def _risk_kept_graph(ctx: Context) -> Finding | None:
    """A forward pass, in a dump that shows no training at all, keeping most of what it allocated:
    grad mode is on, so autograd keeps the graph for a backward that had not run. (Not at an OOM: a
    run's first forward keeps its graph for the backward to come, and nothing before it tells.)"""
    if ctx.oom is not None or _training_seen(ctx):
        return None
    if ctx.target_phase not in FORWARD_PASSES and not ctx.pass_returned:
        return None
    allocated_in_pass, kept = ctx.pass_allocated_bytes, ctx.pass_kept_bytes
    c = ctx.components
    transient = c.get(Component.ACTIVATIONS, 0) + c.get(Component.TEMPORARIES, 0)
    # a pass that returned has freed what it no longer uses: what it keeps is its graph or its outputs
    share = KEPT_GRAPHS_OF_PASSES if ctx.pass_returned else KEPT_GRAPH_SHARE
    if not allocated_in_pass or kept < share * allocated_in_pass:
        return None
    if ctx.pass_kept_count < KEPT_GRAPH_MIN_TENSORS:
        return None
    if transient < ACTIVATIONS_MIN_SHARE * (ctx.allocated_bytes or 1):
        return None
    return Finding(
        Verdict.INFERENCE_WITH_GRAD,
        0.55,
        Summary(
            SummaryKind.KEPT_GRAPH_RISK,
            Facts.of(
                kept=kept,
                share=kept / allocated_in_pass,
                parameters=c.get(Component.PARAMETERS, 0),
                at=_at(ctx),
                returned=int(ctx.pass_returned),
            ),
        ),
        (
            Evidence(EvidenceKind.PASS_ALLOCATED, "pass_allocated_bytes", allocated_in_pass, ctx.target_index),
            Evidence(EvidenceKind.PASS_KEPT, "pass_kept_bytes", kept, ctx.target_index),
            Evidence(EvidenceKind.NO_TRAINING, "training_seen", value=0),
        ),
    )


def _risk_gradients_kept(ctx: Context) -> Finding | None:
    """Gradients of an earlier backward alive while a forward runs: memory zero_grad(set_to_none)
    would have freed before it. Judged in the forward itself, or later in its step: gradients older
    than the step and still alive at the target were alive through the step's forward."""
    if ctx.oom is not None:
        return None
    in_forward = ctx.target_phase in FORWARD_PASSES
    if not in_forward and not _forward_of_the_step_before_target(ctx):
        return None
    old, _, largest = ctx.old_bytes((Component.GRADIENTS,), pre_trace=True)
    parameters = ctx.components.get(Component.PARAMETERS, 0)
    if old <= 0 or not parameters or old < parameters // GRADIENTS_KEPT_MIN_PART:
        return None
    return Finding(
        Verdict.GRADIENTS_KEPT,
        0.5,
        Summary(
            SummaryKind.GRADIENTS_KEPT_RISK,
            Facts.of(
                old=old,
                parameters=parameters,
                at=_at(ctx),
                step=None if in_forward else ctx.target_step,
                phase=None if in_forward else ctx.target_phase,
                no_optimizer_step=int(ctx.gradients_maybe_accumulated()),
            ),
        ),
        (
            _block_evidence(EvidenceKind.OLD_GRADIENTS, "old_gradient_bytes", old, largest),
            _component_evidence(ctx, EvidenceKind.PARAMETERS, Component.PARAMETERS),
        ),
    )


def _risk_model_states_at_capacity(ctx: Context) -> Finding | None:
    """Model states filling everything PyTorch reserved, with nothing usable free, in a dump whose
    trace is too short to have kept an OOM (or that reserved all of a known capacity)."""
    if ctx.oom is not None:
        return None
    states = sum(model_states(ctx))
    allocated = ctx.allocated_bytes
    reserved = ctx.accounting.reserved_bytes
    free = ctx.accounting.free_cached_bytes
    if not allocated or states < MODEL_STATES_SHARE * allocated or free * AT_CAPACITY_FREE_PART > reserved:
        return None
    capacity = ctx.capacity_bytes
    full = capacity is not None and reserved >= MODEL_STATES_CAPACITY_SHARE * capacity
    if not full and not (capacity is None and ctx.trace_entries <= FEW_TRACE_ENTRIES):
        return None
    return Finding(
        Verdict.MODEL_STATES_TOO_LARGE,
        0.4,
        Summary(
            SummaryKind.MODEL_STATES_AT_CAPACITY,
            Facts.of(states=states, reserved=reserved, free=free, entries=ctx.trace_entries, capacity=capacity),
        ),
        (
            _component_evidence(ctx, EvidenceKind.PARAMETERS, Component.PARAMETERS),
            Evidence(EvidenceKind.RESERVED, "reserved_bytes", reserved),
            Evidence(EvidenceKind.FREE_CACHED, "free_cached_bytes", free),
            Evidence(EvidenceKind.TRACE_ENTRIES, "trace_entries", value=ctx.trace_entries),
        ),
    )


def _risk_near_oom(ctx: Context) -> Finding | None:
    """The device ran out once and the allocator survived by flushing its cache: one request of a
    quarter or more of what the device could hold is what hit the limit."""
    if ctx.oom is not None or not ctx.near_ooms:
        return None
    near = max(ctx.near_ooms, key=lambda n: n.request_bytes)
    bound = near.capacity_bound_bytes
    if near.request_bytes < bound // OVERSIZED_IF_LARGEST_PART:
        return None
    return Finding(
        Verdict.OVERSIZED_REQUEST,
        0.5,
        Summary(
            SummaryKind.NEAR_OOM_OVERSIZED,
            Facts.of(
                request=near.request_bytes,
                bound=bound,
                share=near.request_bytes / bound,
                flushed=near.flushed_bytes,
                index=near.event_index,
            ),
        ),
        (
            Evidence(EvidenceKind.NEAR_OOM, "flushed_bytes", near.flushed_bytes, near.event_index),
            Evidence(EvidenceKind.REQUEST, "request_bytes", near.request_bytes, near.event_index),
            Evidence(EvidenceKind.CAPACITY_BOUND, "capacity_bound_bytes", bound, near.event_index),
        ),
    )


def _risk_oversized_tensor(ctx: Context) -> Finding | None:
    """One live tensor of half of a known capacity."""
    capacity = ctx.capacity_bytes
    if ctx.oom is not None or not capacity or not ctx.live_blocks:
        return None
    largest = max(ctx.live_blocks, key=lambda b: b.size_bytes)
    if largest.size_bytes < capacity // OVERSIZED_PART:
        return None
    return Finding(
        Verdict.OVERSIZED_REQUEST,
        0.4,
        Summary(
            SummaryKind.OVERSIZED_TENSOR_RISK,
            Facts.of(largest=largest.size_bytes, capacity=capacity, share=largest.size_bytes / capacity),
        ),
        (
            _block_evidence(EvidenceKind.LARGEST_TENSOR, "largest_tensor_bytes", largest.size_bytes, largest),
            Evidence(EvidenceKind.CAPACITY, "capacity_bytes", capacity),
        ),
    )


def _at(ctx: Context) -> str:
    return "peak" if ctx.target_index is not None else "dump"


RISKS: tuple[Callable[[Context], Finding | None], ...] = (
    _risk_model_states_at_capacity,
    _risk_checkpoint_gather,
    _risk_eval_outputs_kept,
    _risk_near_oom,
    _risk_oversized_tensor,
    _risk_gradients_kept,
    _risk_kept_graph,
)


TESTS: tuple[Callable[[Context], Finding | None], ...] = (
    _test_outside,
    _test_checkpoint_gather,
    _test_model_states,
    _test_fragmentation,
    _test_eval_outputs_kept,
    _test_oversized,
    _test_gradients_kept,
    _test_leak,
    _test_inference_with_grad,
    _test_evaluation_keeps_graph,
    _test_optimizer_buildup,
    _test_activation_spike,
)


def _dominant(components: dict[str, int]) -> tuple[str | None, int]:
    if not components:
        return None, 0
    name = max(components, key=lambda k: components[k])
    return (name, components[name]) if components[name] else (None, 0)


def _spike_over_kept_gradients(findings: list[Finding], ctx: Context) -> Finding | None:
    """The activation spike, when it outweighs gradients a run frees every step (zero_grad runs,
    only after this forward: a closure's order): what this batch added beyond the earlier steps'
    peak is more than the gradients still alive."""
    spike = next(
        (
            f
            for f in findings
            if f.summary.kind in (SummaryKind.ACTIVATION_SPIKE, SummaryKind.ACTIVATION_SPIKE_PROJECTED)
        ),
        None,
    )
    if spike is None or PHASE_ZERO_GRAD not in ctx.phases_seen():
        return None
    facts = spike.summary.facts
    # a pass cut short near its start is weighed by its projected whole
    ratio, activations = facts.number("ratio"), facts.size("projected") or facts.size("activations") or 0
    if ratio <= SPIKE_RATIO:
        return None
    grown = activations - activations / ratio
    old = findings[0].evidence[0].bytes or 0 if findings[0].evidence else 0
    return spike if grown > old else None


def rest_of_pass_lacking(ctx: Context) -> int | None:
    """What the failed request and the rest of the interrupted pass (`Context.passes.rest`,
    extrapolated from a comparable earlier pass, beyond the request where it grows with the batch)
    lack beyond the headroom (free device memory and every usable free cached byte, as if they were
    one place); None where no rest is extrapolated or the headroom is unknown."""
    rest = ctx.passes.rest
    headroom = ctx.accounting.headroom_bytes
    if ctx.oom is None or rest is None or not rest.extrapolated or headroom is None:
        return None
    extra = max(0, rest.extra_bytes - (ctx.request if ctx.request_scales else 0))
    return ctx.request + extra - headroom


def states_fit_earlier(ctx: Context) -> bool:
    """The model states, at the size judged, were all alive together in an earlier step the run
    went on from (its optimizer step completed: the target's step counts it), so they fit the
    device beside what else it held then: none is projected beyond what is alive at the target, and
    every model-state block alive there was made before that step's last event (or before the
    trace began), so it was alive at that event too."""
    if ctx.projection[0] > sum(model_states(ctx)):
        return False  # states still to be made (a first step's optimizer state, gradients to come)
    target = ctx.target_index if ctx.target_index is not None else ctx.trace_entries
    step = ctx.target_step or 0
    end = max((s.last_index for s in ctx.phases if s.step < step and s.last_index < target), default=None)
    if end is None:
        return False
    return all(b.alloc_index is None or b.alloc_index <= end for b in ctx.live_blocks if b.component in _MODEL_STATES)


def _excess_over_states(findings: list[Finding], ctx: Context) -> list[Finding]:
    """Model states too large by their share of the capacity do not outrank an excess the run keeps
    and can free (`KEPT_EXCESS_VERDICTS`: it covers what is missing) where the same states were all
    alive together in an earlier step the run went on from (`states_fit_earlier`): they fit
    then, and what fills the device now beside them is the excess (stale gradients accumulated into
    in the backward, a leak's tensors)."""
    if len(findings) < 2 or findings[0].verdict != Verdict.MODEL_STATES_TOO_LARGE:
        return findings
    excess = next((f for f in findings if f.verdict in KEPT_EXCESS_VERDICTS and _holds_either_way(f)), None)
    if excess is None or not states_fit_earlier(ctx):
        return findings
    return [excess, *(f for f in findings if f is not excess)]


def _holds_either_way(finding: Finding) -> bool:
    """All but gradients kept from an earlier pass of the target's step, which are kept only if that
    pass was a step of its own (micro-batches accumulate into them): the file cannot tell."""
    return not (finding.verdict == Verdict.GRADIENTS_KEPT and finding.summary.facts.size("from_passes"))


def _ordered(findings: list[Finding], ctx: Context) -> list[Finding]:
    """The cause first, weighed by materiality: model states that fit earlier do not outrank an
    excess the run keeps beside them (`_excess_over_states`); gradients kept only if an earlier
    pass of the target's step was a step of its own, which the file cannot tell (micro-batches
    accumulate into them), come after every finding that holds either way; fragments that are a
    small share of what the device could hold do not outrank growth over steps (a leak) or another
    excess the run keeps (`KEPT_EXCESS_VERDICTS`: graphs kept pass after pass, stale gradients)
    that filled it, nor, material or not, a leak whose tensors one step keeps would fill them
    (`_leak_outgrows`); gradients a run frees every step (only late) do not outrank a spike that
    grew by more than they hold; and fragments do not outrank an activation spike, or an excess the
    run keeps (`KEPT_EXCESS_VERDICTS`), where the interrupted pass, extrapolated, needed more than
    all the free memory had it been one block (a place for this request would only have moved the
    OOM further into the pass)."""
    findings = _excess_over_states(findings, ctx)
    if len(findings) >= 2 and not _holds_either_way(findings[0]):
        # gradients an earlier pass of this step made, kept only if that pass was a step of its own,
        # which the file cannot tell: what holds either way comes first
        findings = [*findings[1:], findings[0]]
    if len(findings) >= 2 and findings[0].verdict == Verdict.GRADIENTS_KEPT:
        spike = _spike_over_kept_gradients(findings, ctx)
        if spike is not None:
            return [spike, *(f for f in findings if f is not spike)]
    if len(findings) < 2 or findings[0].verdict != Verdict.FRAGMENTATION:
        return findings
    # the pass itself, or what the run keeps beside it (graphs kept pass after pass, a leak)
    grown = next(
        (
            f
            for f in findings
            if f.verdict == Verdict.ACTIVATION_SPIKE or (f.verdict in KEPT_EXCESS_VERDICTS and _holds_either_way(f))
        ),
        None,
    )
    lacking = rest_of_pass_lacking(ctx)
    if grown is not None and lacking is not None and lacking > 0:
        return [grown, *(f for f in findings if f is not grown)]
    capacity = ctx.capacity_bytes or 0
    usable = ctx.fragmentation.usable_free_bytes
    material = usable * FRAGMENTATION_MATERIAL_PART >= capacity
    # growth over steps (a leak) or over passes (graphs kept), or another excess the run keeps
    kept = next((f for f in findings if f.verdict in KEPT_EXCESS_VERDICTS and _holds_either_way(f)), None)
    if material:
        kept = next((f for f in findings if f.verdict == Verdict.CREEPING_LEAK), None)
        if kept is not None and not _leak_outgrows(usable, ctx):
            kept = None
    if kept is None:
        return findings
    return [kept, *(f for f in findings if f is not kept)]


def _leak_outgrows(usable_free: int, ctx: Context) -> bool:
    """A leak that keeps, per earlier step whose tensors are alive (on average), at least all the
    usable free pieces: had they been one block, the next step's kept tensors would fill it, so a
    place for this request only moves the OOM to a later step."""
    old, steps, _ = ctx.old_bytes(_LEAK_COMPONENTS)
    return bool(steps) and old >= usable_free * len(steps)


def diagnose(ctx: Context) -> tuple[Finding, tuple[Finding, ...]]:
    if ctx.oom is None:
        findings = [f for f in (test(ctx) for test in (*RISKS, _test_leak, _test_inference_with_grad)) if f is not None]
        findings.sort(key=lambda f: -f.confidence)
        peak = ctx.allocated_bytes
        at = _at(ctx)
        dominant, dominant_bytes = _dominant(ctx.components)
        end_dominant, end_bytes = _dominant(ctx.end_components) if ctx.end_allocated_bytes is not None else (None, 0)
        # judged at the dump: the cache's free memory when it is more than what is allocated
        cache = ctx.accounting
        cached = cache.free_cached_bytes if ctx.target_index is None and cache.free_cached_bytes > peak > 0 else None
        # without a trace, or with one too short to have kept an OOM event, that none is recorded
        # says nothing of whether the run ran out
        blind = ctx.trace_entries <= FEW_TRACE_ENTRIES
        # a peak the trace shows, over a run that began before it (blocks from before the trace are
        # alive there): what was allocated before the trace began is not recorded
        before_trace = at == "peak" and not blind and any(b.alloc_index is None for b in ctx.live_blocks)
        blind_facts: dict[str, Fact] = (
            {"entries": ctx.trace_entries, "empty": ctx.trace_entries == 0 and cache.reserved_bytes == 0}
            if blind
            else {}
        )
        primary = Finding(
            Verdict.NO_OOM,
            NO_OOM_BLIND_CONFIDENCE if blind else NO_OOM_CONFIDENCE,
            Summary(
                SummaryKind.NO_OOM,
                Facts.of(
                    at=at,
                    allocated=peak,
                    dominant=dominant,
                    dominant_bytes=dominant_bytes,
                    end_allocated=ctx.end_allocated_bytes,
                    end_dominant=end_dominant,
                    end_dominant_bytes=end_bytes,
                    cached=cached,
                    reserved=cache.reserved_bytes if cached is not None else None,
                    releasable=cache.releasable_bytes if cached is not None else None,
                    before_trace=int(before_trace) or None,
                ).adding(**blind_facts),
            ),
            (
                Evidence(
                    EvidenceKind.ALLOCATED_AT_TARGET, "allocated_bytes", peak, ctx.target_index, facts=Facts.of(at=at)
                ),
            ),
        )
        return primary, tuple(findings)
    findings = _assumed_states_last(_ordered([f for f in (test(ctx) for test in TESTS) if f is not None], ctx))
    if findings and _rests_on_assumption(findings[0]):
        # model states too large only if every parameter trains: no verdict rests on that alone
        return _naming_dominant_block(_unknown_verdict(ctx), ctx), tuple(findings)
    if not findings:
        guess = _guess_outside_without_total(ctx)
        if guess is not None:
            return _naming_dominant_block(guess, ctx), ()
        return _naming_dominant_block(_unknown_verdict(ctx), ctx), ()
    return _naming_dominant_block(findings[0], ctx), tuple(findings[1:])


def _unknown_verdict(ctx: Context) -> Finding:
    request = Evidence(EvidenceKind.REQUEST, "request_bytes", ctx.request, ctx.target_index)
    first = _first_pass(ctx, *_pass_own(ctx)[:2])
    if first is not None and first.assumed and first.states >= MODEL_STATES_CAPACITY_SHARE * first.capacity:
        # the model states fit as they are and would not if every parameter trained: whether the
        # pass is too large or the model is decides the verdict, and the file cannot tell
        parameters = model_states(ctx)[0]
        facts = Facts.of(
            phase=ctx.target_phase,
            parameters=parameters,
            states=first.states,
            capacity=first.capacity,
            reached=first.reached,
            room=first.room,
            rest=first.rest,
            trains=int(ctx.trains()) or None,  # the run trains: which parameters do is what is unknown
        )
        return Finding(
            Verdict.UNKNOWN,
            0.2,
            Summary(SummaryKind.UNKNOWN_WHAT_TRAINS, facts),
            (
                request,
                _component_evidence(ctx, EvidenceKind.PARAMETERS, Component.PARAMETERS),
                *_first_pass_evidence(ctx, first),
            ),
        )
    return Finding(Verdict.UNKNOWN, 0.2, Summary(SummaryKind.UNKNOWN), (request,))


def _rests_on_assumption(finding: Finding) -> bool:
    """Model states too large only if every parameter trains, which the file does not show: the
    present states fit, the projection (an upper bound) does not."""
    return finding.verdict == Verdict.MODEL_STATES_TOO_LARGE and finding.confidence == ASSUMED_STATES_CONFIDENCE


def _assumed_states_last(findings: list[Finding]) -> list[Finding]:
    """Every other finding before one that rests on the assumption that every parameter trains."""
    return [f for f in findings if not _rests_on_assumption(f)] + [f for f in findings if _rests_on_assumption(f)]


_MODEL_STATES = (Component.PARAMETERS, Component.GRADIENTS, Component.OPTIMIZER_STATE, Component.BUFFERS)


def _naming_dominant_block(finding: Finding, ctx: Context) -> Finding:
    """The finding with one more piece of evidence when a single live block that is not a model
    state holds a quarter or more of what was allocated at the OOM and a tenth of the capacity (a
    tensor kept the whole run, a large buffer) and its evidence does not point at that block
    already: what dominates memory is then said, whatever the verdict."""
    allocated = ctx.allocated_bytes
    candidates = [b for b in ctx.live_blocks if b.component not in _MODEL_STATES]
    if not candidates or allocated <= 0:
        return finding
    largest = max(candidates, key=lambda b: (b.size_bytes, -b.address))
    if largest.size_bytes * DOMINANT_BLOCK_PART < allocated:
        return finding
    capacity = ctx.capacity_bytes
    if capacity and largest.size_bytes * DOMINANT_BLOCK_CAPACITY_PART < capacity:
        return finding
    if any(item.address == largest.address for item in finding.evidence):
        return finding
    facts = Facts.of(component=largest.component, share=largest.size_bytes / allocated)
    if largest.name:
        facts = facts.adding(largest_name=largest.name)
    named = _block_evidence(EvidenceKind.DOMINANT_BLOCK, "dominant_block_bytes", largest.size_bytes, largest, facts)
    return replace(finding, evidence=(*finding.evidence, named))
