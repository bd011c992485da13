"""Every sentence a report says about an analysis, in one place: the analysis returns data (a kind
and the numbers and names its sentence needs), and these functions word it. The text, Markdown and
JSON reports and the terminal app all take their words from here, so they never disagree.

Plain strings; a name from the file (a tensor's registry name, say) goes in as it is, and each view
escapes the whole sentence its own way (`safetext.printable`, Markdown's `inline_text`).

To word a new kind: add it to its enum in `oomdoctor.analysis.results` and its sentence here;
`tests/test_phrasing.py` checks that every kind has one.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from oomdoctor.analysis.results import (
    FORWARD_PASSES,
    PHASE_OPTIMIZER,
    PHASE_UNKNOWN,
    PHASE_ZERO_GRAD,
    SOURCE_NONE,
    Change,
    DeviceSummary,
    Evidence,
    EvidenceKind,
    Facts,
    Recommendation,
    RestUnknown,
    Summary,
    SummaryKind,
    Unknown,
    UnknownKind,
    WhatIf,
    WhatIfCase,
    WhatIfUnknown,
)
from oomdoctor.model import Frame, Stack
from oomdoctor.units import human_size as human
from oomdoctor.units import human_sizes_apart, plural

# --- what the dump could not tell -----------------------------------------------------------------

UNKNOWNS: dict[str, str] = {
    UnknownKind.REPLAYED_AFTER_TARGET: (
        "the dump was written {events} after the target; block sizes freed since then are estimated from their requests"
    ),
    UnknownKind.UNPLACED_BLOCKS: "{blocks} live at the target lie in no segment the replay could rebuild; left out",
    UnknownKind.NO_HISTORY: "no allocation history was recorded: phases, steps, the OOM event and the series are unknown",
    UnknownKind.NO_FRAMES: "no stack frames were recorded: phases come from markers or annotations only",
    UnknownKind.NO_PHASES: "no markers, annotations or frames mark the phases, so steps and phases are unknown",
    UnknownKind.NO_REGISTRY: "no oomdoctor registry of named tensors: components are inferred, not exact",
    UnknownKind.RING_BUFFER_WRAPPED: (
        "the trace holds {events}, as many as the ring buffer keeps: it wrapped, and older events are lost"
    ),
    UnknownKind.TRACE_NO_FRAMES: (
        "no trace entry carries frames ({entries}): phases come from markers or annotations only (the dump's blocks carry their own stacks)"
    ),
    UnknownKind.PRE_EXISTING: "{allocations} predate the trace; when they were made is unknown",
    UnknownKind.STEPS_BEFORE_TRACE: (
        "how many optimizer steps ran before the trace: steps are counted from its start, and optimizer state made before it suggests at least one ran earlier (or the optimizer made its state up front, as DeepSpeed does)"
    ),
    UnknownKind.TRACE_AFTER_SETUP: (
        "how many steps ran before the trace: its steps are counted from its start, which came after the model's parameters were made"
    ),
    UnknownKind.PASSES_MAY_BE_STEPS: (
        "how many steps ran: {passes} after a backward with no optimizer step between, the backward's gradients still alive, {are} counted in its step, as micro-batches of gradient accumulation are, though {each} may be a step of its own (an optimizer that records nothing, or nothing after its first step, in a loop that never frees the gradients); step numbers are the least the trace shows"
    ),
    UnknownKind.LOAD_UNFINISHED: (
        "how much was still to be loaded: the failed request was reading tensors from a file (torch.load, safetensors), so a change that places it is not known to place the rest of the load"
    ),
    UnknownKind.PRE_EXISTING_NO_STACK: (
        "{count} of the blocks live at the target predate the trace and carry no stack: what they are is inferred from their shapes and what the trace does to them"
    ),
    UnknownKind.NO_STACK: (
        "what the blocks live at the dump without a stack are ({count}): with no history either, it is inferred from their sizes alone"
    ),
    UnknownKind.NO_DEVICE_TOTAL: "device total memory (not in a plain snapshot), so memory outside PyTorch is unknown",
    UnknownKind.NO_DEVICE_FREE: "free device memory at the target event, so memory outside PyTorch is unknown",
    UnknownKind.OOM_RETRIED: (
        "torch caught and retried this OOM internally (as cuDNN's workspace search does): it may not be what stopped the run"
    ),
    UnknownKind.OOM_CAUGHT: (
        "the script caught this OOM and went on (as a batch-size finder does with its probes; OOM number {count} at this place): it may not be what stopped the run"
    ),
    UnknownKind.HISTORY_REARMED: (
        "something else called torch's _record_memory_history {times} after oomdoctor.install() (as torchtitan's memory profiler does; who and with which settings: the Environment section, or the dump's recording.rearmed): the history may be cut there (a stop clears it), and its settings changed there"
    ),
    UnknownKind.PEAK_UNSIZED: (
        "how much higher torch's own peak (max_memory_allocated) is: up to {size} more, as the peak counts a block freed before the dump at its rounded request and the allocator may have left an unsplit remainder, which the trace does not record, in {blocks} live where that bound is reached"
    ),
    UnknownKind.PEAK_UNSIZED_DEFAULTS: (
        "how much higher torch's own peak (max_memory_allocated) is: up to {size} more with the allocator's default settings, as the peak counts a block freed before the dump at its rounded request and the allocator may have left an unsplit remainder, which the trace does not record, in {blocks} live where that bound is reached; this torch does not record its allocator settings, and with max_split_size_mb or roundup_power2_divisions set it may be more"
    ),
    UnknownKind.PRE_TRACE_OUTWEIGHING: (
        "what is in {blocks} from before the trace ({size}): {each_is} larger than all the other frame-less blocks from before it together and the trace keeps no gradient of {their} shape, so {they_may} be a cache or pool allocated up front (a KV cache) or the model's own largest weights, untrained; the file cannot tell which, and {they_are} counted as unknown"
    ),
    UnknownKind.PRE_TRACE_FREED_ELSEWHERE: (
        "what is in {blocks} from before the trace ({size}): the trace frees {them} outside a backward, an optimizer step and zero_grad, where no weights, gradients or optimizer state are freed, and nothing else says what {they_hold}; counted as unknown"
    ),
    UnknownKind.PRE_TRACE_CODE_SAYS_NOTHING: (
        "what is in {blocks} made by Python code outside torch before anything the file records ({size}): {their} frames' file and function names say no kind of memory oomdoctor reads, and nothing the trace does to {them} says more; counted as unknown"
    ),
    UnknownKind.PRE_TRACE_SHAPE_UNEXPLAINED: (
        "what is in {blocks} made before anything the file records, with no Python frame outside torch ({size}): only {their_sizes} could say, and no reading of a model's states (weights, gradients, optimizer state) places {them}; counted as unknown"
    ),
    UnknownKind.TRACED_UNNAMED: (
        "what is in {blocks} made in the trace ({size}): oomdoctor's registry of named tensors does not name {them}, and the phase {they_were} made in (unknown, or one oomdoctor does not know) does not say; counted as unknown"
    ),
    UnknownKind.TRACED_NOTHING_SAYS: (
        "what is in {blocks} made in the trace ({size}): neither the phase {they_were} made in nor {their} own frames say; counted as unknown"
    ),
    UnknownKind.HISTORY_STOPPED: (
        "something else stopped torch's allocator history and it could not be started again: events after that are missing"
    ),
}


def unknown(item: Unknown) -> str:
    """One thing the dump could not tell, as a sentence (without its full stop); a sentence names its
    count bare ({count}) or with its noun ({events}: '1 event', '2 events'), and its bytes ({size})."""
    count = item.count or 0
    return UNKNOWNS[item.kind].format(
        count=item.count,
        events=plural(count, "event"),
        blocks=plural(count, "block"),
        entries=plural(count, "entry", "entries"),
        allocations=plural(count, "allocation"),
        times="once" if count == 1 else f"{count} times",
        passes=plural(count, "pass", "passes"),
        are="is" if count == 1 else "are",
        each="it" if count == 1 else "each",
        size=human(item.bytes or 0),
        # the blocks' pronouns, as many as they are
        **(_ONE_BLOCK if count == 1 else _BLOCKS),
    )


_ONE_BLOCK = {
    "them": "it",
    "their": "its",
    "their_sizes": "its size",
    "each_is": "it is",
    "they_may": "it may",
    "they_are": "it is",
    "they_hold": "it holds",
    "they_were": "it was",
}
_BLOCKS = {
    "them": "them",
    "their": "their",
    "their_sizes": "their sizes",
    "each_is": "each is",
    "they_may": "they may",
    "they_are": "they are",
    "they_hold": "they hold",
    "they_were": "they were",
}


def phase_source(source: str) -> str:
    """Where the phases were read from, as a report's context says it: 'phases from markers', or
    'phases not determined' when nothing marked them (SOURCE_NONE)."""
    if source == SOURCE_NONE:
        return "phases not determined"
    return f"phases from {source.replace('_', ' ')}"


def unknowns(items: tuple[Unknown, ...]) -> tuple[str, ...]:
    return tuple(unknown(item) for item in items)


# the things not determined that say why blocks are in the component "unknown"
UNKNOWN_COMPONENT_REASONS = frozenset(
    {
        UnknownKind.PRE_TRACE_OUTWEIGHING,
        UnknownKind.PRE_TRACE_FREED_ELSEWHERE,
        UnknownKind.PRE_TRACE_CODE_SAYS_NOTHING,
        UnknownKind.PRE_TRACE_SHAPE_UNEXPLAINED,
        UnknownKind.TRACED_NOTHING_SAYS,
        UnknownKind.TRACED_UNNAMED,
    }
)


def unknown_component_reasons(items: tuple[Unknown, ...]) -> tuple[str, ...]:
    """Why blocks are counted as unknown, where the analysis says (the sentences of `unknowns`)."""
    return tuple(unknown(item) for item in items if item.kind in UNKNOWN_COMPONENT_REASONS)


# --- what if the batch were scaled ----------------------------------------------------------------


BY_BYTES = "an estimate by allocated bytes"  # how a largest fitting scale says what it is
BY_BYTES_NOTE = (
    "the scale is an estimate by allocated bytes, which leaves out how the cache lays its blocks out at"
    " another size (free pieces too small for a request, cached blocks reused unsplit, whole segments to"
    " cut): that can need more reserved memory, so a smaller scale may still run out"
)

BY_BYTES_ROOM_NOTE = (
    "the scale is an estimate by allocated bytes with room for one new segment of each pool, which leaves"
    " out how else the cache lays its blocks out at another size (free pieces too small for a request, cached"
    " blocks reused unsplit, more segments to cut): that can need more reserved memory, so a smaller scale may"
    " still run out"
)


def scale_estimated(what_if: WhatIf) -> bool:
    """Whether the what-if gives a largest fitting scale, which is an estimate by allocated bytes
    (`BY_BYTES_NOTE`); 'none' (the fixed part alone does not fit) is no estimate: a layout only adds."""
    return what_if.largest_fitting_scale is not None and what_if.case != WhatIfCase.FIXED_TOO_LARGE


def largest_scale(what_if: WhatIf) -> str | None:
    """'largest scale that fits: 2.31x (an estimate by allocated bytes)' ('at most 2.31x' against
    the device's total), 'none' where the fixed part alone does not fit (not even 0.00x: the model
    states do not), or None."""
    if what_if.largest_fitting_scale is None:
        return None
    if what_if.case == WhatIfCase.FIXED_TOO_LARGE:
        return "none"
    bound = what_if.capacity_at_most and what_if.largest_fitting_scale > 0  # none fitting is definite
    room = (
        f", with {human(what_if.cache_margin_bytes)} left for the cache's segments"
        if what_if.cache_margin_bytes
        else ""
    )
    return f"{'at most ' if bound else ''}{what_if.largest_fitting_scale:.2f}x ({BY_BYTES}{room})"


def _cache_room(what_if: WhatIf) -> str:
    """Why the largest fitting scale leaves room for the cache, and what allocated bytes alone allow."""
    why = (
        f"room for the cache's segments ({human(what_if.cache_margin_bytes)}: a request of 1-10 MiB that no cached"
        " block takes is placed in a whole new large segment, one of at most 1 MiB in a new small one)"
    )
    if what_if.largest_fitting_scale is None:
        return (
            f"by allocated bytes the peak would fit up to {what_if.by_bytes_scale or 0:.2f}x, but no scale leaves {why}:"
            " whether any fits is unknown"
        )
    return (
        f"that leaves {why}; by allocated bytes alone the peak would fit up to {what_if.by_bytes_scale or 0:.2f}x,"
        " and between the two whether it fits is unknown"
    )


def what_if_note(what_if: WhatIf) -> str:
    """What the batch-size what-if found, as one clause (the views add the capital and full stop)."""
    case = what_if.case
    if case == WhatIfCase.CAPACITY_UNKNOWN:
        note = "capacity unknown (a plain snapshot without an OOM event does not say how large the device is)"
    elif case == WhatIfCase.CAPACITY_BOUNDED:
        note = (
            f"capacity unknown, but under {human(what_if.capacity_bound_bytes or 0)}: a cudaMalloc failed there and was"
            f" retried after the cache was freed; at 1.00x the run went on, past {what_if.upper_bound_scale or 0:.2f}x"
            " the peak would need more than that bound, and between the two whether it fits is unknown"
        )
    elif case == WhatIfCase.FIXED_TOO_LARGE:
        states = "model states projected at full size" if what_if.projected_states else "model states"
        request = ", the failed request" if what_if.request_fixed else ""
        note = f"the fixed part alone ({states}, optimizer temporaries, buffers, other{request}) does not fit: no batch size would"
    elif case == WhatIfCase.NO_BUDGET:
        note = "no activation budget at the target event: changing the batch would not change this peak"
    elif case == WhatIfCase.PASS_INTERRUPTED:
        note = _interrupted_words(what_if)
    elif case == WhatIfCase.BACKWARD_UNKNOWN:
        note = (
            f"the forward's peak would fit up to {what_if.upper_bound_scale or 0:.2f}x, an upper bound only: the run"
            " trains, and what its backward adds is unknown"
            if what_if.trains
            else f"the forward's peak would fit up to {what_if.upper_bound_scale or 0:.2f}x, an upper bound only:"
            " whether a backward follows is unknown (the trace shows none, and nothing in the file tells whether"
            " the run trains: no optimizer had been called, or this torch recorded no annotation of one)"
        )
    elif case == WhatIfCase.BEYOND_THE_MOMENT:
        bound = what_if.upper_bound_scale or 0.0
        if what_if.beyond_the_moment == WhatIfUnknown.ACTIVATIONS_ONLY:
            note = (
                f"by the step's activations alone the peak would fit up to {bound:.2f}x, an upper bound only: its"
                " temporaries and inputs, which grow with the batch too, are counted fixed, so no scale above 1.00x"
                " is said to fit"
            )
        elif what_if.beyond_the_moment == WhatIfUnknown.LARGER_BATCH:
            note = (
                f"by allocated bytes the peak would fit up to {bound:.2f}x, an upper bound only: a larger batch makes"
                " larger requests than any the trace shows, and how the cache lays them out (segments of their own,"
                " cached blocks too small to take them) is unknown, so no scale above 1.00x is said to fit"
            )
        elif what_if.beyond_the_moment == WhatIfUnknown.REST_GUESSED:
            note = (
                "whether a smaller batch fits is unknown: the rest of the pass the OOM cut short is extrapolated with"
                " the sites it had not reached scaled by a guess, which can be off either way; by that estimate the"
                f" peak would fit up to {bound:.2f}x, and no scale is said to fit by it"
            )
        else:
            note = (
                "whether a smaller batch fits is unknown: what the run keeps grows with each step or pass still to"
                " come (a leak, or graphs kept pass after pass), and how many come the file does not say; by this"
                f" moment's figures the run would fit up to {bound:.2f}x, an upper bound only"
                " (a larger scale does not fit), and a smaller batch may only run out later"
            )
        if what_if.capacity_at_most:
            note += (
                " (and that against the device's total: what the CUDA context and other processes held is not"
                " recorded for this moment)"
            )
    elif case == WhatIfCase.PLACEMENT:
        note = (
            "at 1.00x the request failed on placement, not for want of bytes: the scaled request finds a place up to"
            f" {what_if.largest_fitting_scale:.2f}x, in today's free blocks as they would be at that batch (each shrunk"
            " as the tensors that last held it shrink with the batch, bytes whose last tensor the trace does not show"
            " counted as none) or in free device memory, with each segment cut for batch-sized tensors alone cut"
            " smaller (by bytes alone the peak would fit further)"
        )
    elif what_if.largest_fitting_scale is None:  # (LINEAR: no scale leaves room for the cache)
        note = f"activations scale linearly with batch size and (at least) with sequence length; {_cache_room(what_if)}"
    else:
        note = f"activations scale linearly with batch size and (at least) with sequence length; at {what_if.largest_fitting_scale:.2f}x the peak fits"
        if what_if.capacity_at_most and (what_if.largest_fitting_scale or 0) > 0:
            note += " at most: that is against the device's total, and what the CUDA context and other processes held is not recorded for this moment"
        if what_if.calibrated:
            note += " (calibrated on the OOM: at 1.00x it falls short by what the failed request lacked"
            note += f"{', with the model states projected at full size' if what_if.projected_states else ''})"
        if what_if.by_bytes_scale is not None:
            note += f"; {_cache_room(what_if)}"
    rest = what_if.rest_of_pass
    if rest is not None and rest.extrapolated and case != WhatIfCase.PASS_INTERRUPTED:
        source = (
            f"step {rest.earlier_step}'s completed pass of the same layers ("
            if rest.earlier_device is None
            else f"device {rest.earlier_device}'s pass of the same layers (a replica that ran the same forward to"
            " its end while this device was still in its own; "
        )
        what = "the rest of the pass and its backward are" if rest.earlier_backward else "the rest of the pass is"
        note += (
            f"; the OOM cut step {rest.step}'s forward short, so {what}"
            f" extrapolated from {source}this one allocated"
            f" {rest.size_ratio or 0:.2f}x what it had at the same point): this pass's own peak projected"
            f"{', each site at the ratio it grew by (one not reached yet as most did),' if rest.by_site else ''} at"
            f" {human(rest.projected_pass_bytes)}, {human(rest.pass_bytes)} at the OOM"
        )
        if rest.earlier_kept_bytes:
            note += f", and {human(rest.earlier_kept_bytes)} of gradients its backward makes"
        if rest.freed_bytes:
            note += f", less {human(rest.freed_bytes)} made before it that its rest frees, as that pass freed theirs"
        if not rest.earlier_backward:
            note += " (that pass ran no backward, so no backward is counted)"
    if scale_estimated(what_if):
        note += f"; {BY_BYTES_ROOM_NOTE if what_if.cache_margin_bytes else BY_BYTES_NOTE}"
    if what_if.rough:
        note += "; that far from the measured batch the linear model is a rough guide only"
    basis = what_if.basis
    if basis is not None:
        note = (
            f"from step {basis.step}'s peak ({human(basis.peak_allocated_bytes)} allocated,"
            f" activations up to {human(basis.activation_bytes)}): {note}"
        )
    return note


# --- the devices compared -------------------------------------------------------------------------

DEVICE_MOMENTS = {"oom": "its OOM", "peak": "its peak", "dump": "the dump"}
_JUDGED_MOMENTS = {"oom": "at its OOM", "peak": "at its peak", "dump": "written to the dump"}


def devices_intro(summaries: Sequence[DeviceSummary]) -> str:
    """What the devices section shows, in one sentence."""
    judged = next(s for s in summaries if s.judged)
    return (
        f"This snapshot holds {len(summaries)} devices; the report above judges device {judged.device}. Each row is read"
        f" from that device's own trace and segments; 'at the same time' is what it held when device {judged.device}"
        f" was {_JUDGED_MOMENTS[judged.moment]} (by time_us), and its largest component is at its OOM, else its peak."
    )


def device_notes(summaries: Sequence[DeviceSummary]) -> list[str]:
    """What comparing the devices told, beyond their figures."""
    judged = next(s for s in summaries if s.judged)
    notes = []
    for s in summaries:
        if s.tells_training:
            notes.append(
                f"Device {judged.device}'s trace stops at its OOM before any backward or optimizer step, but device"
                f" {s.device}'s, running the same model, reached one: the run trains."
            )
    unlike = [s for s in summaries if not s.judged and not s.replica and s.event_count]
    if unlike:
        # replicas are told by DataParallel's frames on both devices alone: devices that share
        # source lines may still run different layers of one model (a model split across devices)
        names = ", ".join(str(s.device) for s in unlike)
        devices = f"Device{'s' if len(unlike) > 1 else ''} {names}"
        if not judged.data_parallel:
            why = f"device {judged.device}'s trace shows no DataParallel frames ({DATA_PARALLEL_WORDS})"
        else:
            without = [str(s.device) for s in unlike if not s.data_parallel]
            whose = f"device {without[0]}'s trace shows" if len(without) == 1 else f"devices {', '.join(without)} show"
            why = f"{whose} no DataParallel frames ({DATA_PARALLEL_WORDS})"
        notes.append(
            f"{devices} not compared with device {judged.device} as replicas of one model: {why}; devices that"
            " run different layers of one model, or different work, are not replicas."
        )
    return notes


DATA_PARALLEL_WORDS = "replicate, scatter, parallel_apply"


_REST_UNKNOWN_WORDS = {
    RestUnknown.NO_EARLIER_PASS: "no earlier completed pass of the same structure in the trace shows how much of it remains",
    RestUnknown.STRUCTURE_DIFFERS: "its allocations do not follow those of the earlier completed passes, so they cannot tell how much of it remains",
    RestUnknown.BEYOND_EARLIER: "it had already made more allocations than the earlier completed pass made in all, so that pass cannot tell how much of it remains",
}


def _interrupted_words(what_if: WhatIf) -> str:
    """The what-if of a pass the OOM interrupted whose rest nothing shows: an upper bound only."""
    rest = what_if.rest_of_pass
    step = f"step {rest.step}'s" if rest is not None and rest.step is not None else "the"
    why = _REST_UNKNOWN_WORDS.get(RestUnknown(rest.reason), "") if rest is not None and rest.reason else ""
    bound = what_if.upper_bound_scale or 0.0
    # a trace that shows training runs a backward after the forward; earlier passes that ran none,
    # in a run that does not train, show none follows this one; else one comes only if the run
    # trains (nothing in the trace says: its first forward, an inference run under no_grad)
    if rest is not None and not rest.earlier_backward:
        still = "the rest of the forward still comes"
    elif what_if.trains:
        still = "the rest of the forward and the backward still come"
    else:
        still = "the rest of the forward, and its backward if the run trains, still come"
    return (
        f"whether a smaller batch fits is unknown: the OOM cut {step} forward short and {why}. At the OOM"
        f" instant the peak would fit up to {bound:.2f}x, an upper bound only: {still} (a larger scale does not fit)"
    )


# --- what to change --------------------------------------------------------------------------------

CHANGES: dict[str, str] = {
    Change.ACTIVATION_CHECKPOINTING: (
        "Use activation checkpointing (torch.utils.checkpoint) on the largest blocks so forward keeps only their inputs."
    ),
    Change.SMALLER_MICRO_BATCH: (
        "Halve the micro-batch and accumulate gradients over two steps: same effective batch, half the activations, inputs and forward/backward temporaries."
    ),
    Change.SMALLER_BATCH: (
        "Halve the batch (or process the input in chunks): half the activations, inputs and forward/backward temporaries."
    ),
    Change.EIGHT_BIT_OPTIMIZER: (
        "Use an 8-bit optimizer (bitsandbytes) to keep optimizer state at about a quarter of the size."
    ),
    Change.FOREACH_FALSE: (
        "Pass foreach=False (or fused=True) to the optimizer so its step does not allocate a parameter-sized list of temporaries."
    ),
    Change.IN_PLACE_OPTIMIZER: (
        "Update the optimizer's state and the parameters in place (`exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)`, `p.addcdiv_(...)`) so its step allocates no parameter-sized temporaries."
    ),
    Change.ZERO_GRAD_SET_TO_NONE: (
        "Call zero_grad(set_to_none=True) before each forward (the optimizer's, or the model's where no optimizer runs), so the previous step's gradients are freed before the forward, not after it; where gradients are accumulated over micro-batches on purpose, only before each optimizer step's first."
    ),
    Change.FREE_KEPT_TENSORS: (
        "Stop keeping tensors across steps: accumulate `loss.item()` or `loss.detach()`, not `loss`; clear lists of outputs."
    ),
    Change.EXPANDABLE_SEGMENTS: (
        "Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True so free pieces of the cache can be mapped into one range."
    ),
    Change.UPGRADE_FOR_EXPANDABLE_SEGMENTS: (
        "Move to torch 2.1 or later and set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True so free pieces of the cache can be mapped into one range: this snapshot's per-block history is the format of torch 2.0 and before, which have no expandable segments (they refuse the option)."
    ),
    Change.NO_GRAD: (
        "Run forward-only work (evaluation, inference, a forward benchmark) under torch.inference_mode() (or torch.no_grad()) so forward keeps no graph; where a loss is summed over batches, sum `loss.item()`, not `loss`."
    ),
    Change.SHARD_MODEL_STATES: (
        "Shard parameters, gradients and optimizer state across GPUs (FSDP or ZeRO); with two GPUs each holds half."
    ),
    Change.SHARD_GRADIENTS_AND_PARAMETERS: (
        "The optimizer state is sharded already (ZeRO): shard the gradients and parameters too (ZeRO stage 2 or 3, or FSDP); with two GPUs each holds half of them."
    ),
    Change.SHARD_OVER_MORE_GPUS: (
        "The model states are sharded already (FSDP): shard them over more GPUs (over twice as many each rank holds half its shards; the units it gathers whole stay as large), or offload parameters and optimizer state to the CPU (FSDP's CPUOffload, FSDP2's offload_policy)."
    ),
    Change.SMALLER_WEIGHTS: (
        'Hold the weights in less GPU memory: quantise them (8- or 4-bit), load them in half precision if they are in float32, keep some layers on the CPU (offloading, as `device_map="auto"` does), or split them across GPUs (tensor parallelism).'
    ),
    Change.CHUNK_LARGE_OP: (
        "Compute the oversized operation in pieces: split its input along the batch, sequence or spatial dimensions and process one piece at a time (for logits, a chunked or fused cross-entropy), so no single tensor needs that much."
    ),
    Change.SMALLER_PREALLOCATION: (
        "Pre-allocate less: the failed request is a cache or memory pool sized up front (a KV cache), not an operation to split; size it for what is left beside the weights and the largest pass (fewer cache blocks, a shorter maximum length or fewer sequences at once; in vLLM a lower gpu_memory_utilization, max_model_len or max_num_seqs). Its saving is at half the pool."
    ),
    Change.FREE_OTHER_PROCESSES: "Stop the other processes on this GPU (see nvidia-smi) or pick a free device.",
    Change.OUTPUTS_TO_CPU: (
        "Stop keeping every batch's outputs on the GPU: move each to the CPU as it is made (`logits.cpu()`; transformers' `eval_accumulation_steps`), reduce them first (`preprocess_logits_for_metrics`: argmax, not logits), or compute the metric batch by batch."
    ),
    Change.FUSED_ATTENTION: (
        'Use fused attention (torch.nn.functional.scaled_dot_product_attention, FlashAttention; in transformers, attn_implementation="sdpa") so the attention-score matrices are never materialised whole.'
    ),
    Change.BALANCE_DEVICES: (
        "Balance the work across the devices (DataParallel splits a batch by count, not by size): bucket or sort the inputs by size, or cap their size per batch; or move to DistributedDataParallel."
    ),
    Change.STATE_DICT_TO_CPU: (
        "Gather the state dict to the CPU, not the GPU (FSDP `FullStateDictConfig(offload_to_cpu=True, rank0_only=True)`; `get_model_state_dict` with `StateDictOptions(full_state_dict=True, cpu_offload=True)`), or save a sharded checkpoint with torch.distributed.checkpoint so no rank holds a full copy."
    ),
}


# why the file cannot tell whether the run trains (`Context.trains_unknown`), said with the advice for one that does
IF_TRAINS_WHY = (
    "the file cannot tell: it shows no backward, optimizer step or other sign of training,"
    " and none is due yet in the first forward passes it holds"
)


def recommendation(item: Recommendation) -> str:
    """The change a recommendation asks for, as one imperative sentence (for a run that may not
    train, conditional on its training)."""
    words = CHANGES[item.id]
    if item.if_trains:
        return f"If this run trains ({IF_TRAINS_WHY}), {words[:1].lower()}{words[1:]}"
    return words


def expandable_words(value: bool | None) -> str:
    """Whether expandable segments were on, as the fragmentation sections say it; where unknown, why
    (`accounting._expandable`: no recorded setting, and no segment shows it)."""
    if value is None:
        return "unknown (the file records no allocator settings, and none of its segments shows whether they were on)"
    return "on" if value else "off"


def saving(item: Recommendation, where: str = "at the OOM") -> str:
    """What a recommendation saves, as its estimate or as the lower bound it is (the heading says
    what the bound is of: `report_rows.changes_basis`); where what it frees at the judged moment
    (`where`: 'at the OOM', 'at the peak') is made again later, that moment's saving and the bound
    on the run's peak (as `saving_cell` words it, after "saves" or "saves about")."""
    return f"saves {'' if item.saved_at_least else 'about '}{saving_cell(item, where)}"


def _peak_bound(item: Recommendation, where: str) -> str:
    """The bound on the run's peak where what a change frees is made again (`Recommendation.peak_saved_at_most_bytes`),
    against what the judged moment held (at an OOM, with the request it failed)."""
    held = "what it needed at the OOM" if where == "at the OOM" else f"what it held {where}"
    return f"the next backward makes the gradients again, so the run's peak falls at most {human(item.peak_saved_at_most_bytes or 0)} below {held}"


def saving_cell(item: Recommendation, where: str = "at the OOM") -> str:
    """A recommendation's saving in a table column headed "saves about"."""
    if item.peak_saved_at_most_bytes is not None and not item.saved_at_least:
        return f"{human(item.estimated_saved_bytes)} {where}; {_peak_bound(item, where)}"
    shown = (
        f"at least {human(item.estimated_saved_bytes)}" if item.saved_at_least else human(item.estimated_saved_bytes)
    )
    return shown + _thumb(item)


def _thumb(item: Recommendation) -> str:
    """Said after a saving that is a rule of thumb (a fixed share), not measured from the file."""
    return f" ({RULE_OF_THUMB})" if item.rule_of_thumb else ""


RULE_OF_THUMB = "rule of thumb, not measured from the file"


def regions_note(item: Recommendation) -> str | None:
    """What activation checkpointing's saving was measured from, the words before the lines that
    call its regions (`MeasuredRegions.called_from`, which each view appends, worded by
    `frame_words` and escaped its own way); None for a saving not measured from regions."""
    regions = item.regions
    if regions is None or not regions.count:
        return None
    if regions.sequential:
        what, where = (
            ("the Sequential", "called at")
            if not regions.of_loops
            else ("the loop", "at")
            if regions.of_loops == len(regions.called_from)
            else ("a Sequential or a loop", "the Sequential called or the loop at")
        )
        return (
            f"measured from the file: checkpointing in {plural(regions.count, 'segment')} the torch modules"
            f" {what} calls (checkpoint_sequential's cuts, the last segment unchecked; one segment:"
            f" checkpoint of the whole), {where}"
        )
    return f"measured from the file: checkpointing each of the {plural(regions.count, 'block')} called at"


def regions_basis(item: Recommendation) -> str:
    """How the regions' saving was had, said after the lines that call them ('' where the regions
    were read at the judged moment alone, as they are)."""
    regions = item.regions
    if regions is None:
        return ""
    if regions.replayed_step is not None:
        return (
            f"; replayed on step {regions.replayed_step}'s completed pass of this forward at this pass's"
            " sizes, each region run again where the backward reaches it, beside what the backward holds then"
        )
    if regions.so_far:
        return "; of the calls the interrupted pass made so far, cut as they are: its rest runs more (at least this)"
    if regions.gradients_beside_bytes:
        return (
            f"; the largest recomputed beside the {human(regions.gradients_beside_bytes)} of gradients the"
            " backward has yet to make (at most that many, so at least this)"
        )
    return ""


def regions_called_from(item: Recommendation) -> Stack:
    """The lines that call the regions activation checkpointing's saving was measured from."""
    return item.regions.called_from if item.regions is not None else ()


def regions_line(item: Recommendation) -> str | None:
    """`regions_note` and the lines that call the regions, as plain text (the text report and the
    app, which show it as it is; Markdown sets the lines as code), then `regions_basis`; None as
    `regions_note`."""
    note = regions_note(item)
    if note is None:
        return None
    return f"{note} {', '.join(frame_words(f) for f in regions_called_from(item))}{regions_basis(item)}"


def frame_words(frame: Frame) -> str:
    """A frame as the reports name a line: `path:line in function`."""
    return f"{frame.filename}:{frame.line} in {frame.name}"


# --- the verdict's story and its evidence ---------------------------------------------------------


# where the moments of optimizer state still to come are as capture recorded the optimizers' kinds
KEPT_AS_RECORDED = "as many moments per parameter as its optimizer keeps, recorded at capture"
NONE_AS_RECORDED = "its optimizer keeps none, recorded at capture"


def _projection(facts: Facts) -> str:
    """' (optimizer state projected at 2x the parameters)' when the model states were projected
    (gradients too, in a run that trains but holds fewer of them than parameters)."""
    moments = facts.get("projected_moments")
    trained = facts.size("trained") if facts.get("trained") is not None else None
    which = "the parameters" if trained is None else f"the {human(trained)} of parameters that train"
    parts = []
    if facts.get("projected_gradients"):
        parts.append(f"gradients projected at {which}' size" if trained is None else f"gradients projected at {which}")
    if moments == 0 and facts.get("moments_recorded"):
        parts.append(f"no optimizer state projected: {NONE_AS_RECORDED}")
    elif moments is not None:
        assumed = (
            f", {KEPT_AS_RECORDED}"
            if facts.get("moments_recorded")
            else ""
            if facts.get("optimizer_kind")
            else ", as many moments per parameter as its state so far holds"
            if facts.get("moments_read")
            else ", assuming Adam-style moments"
        )
        masters = facts.size("masters")
        if masters is not None:  # the parameters pair as a half-precision model and its fp32 copy
            which = f"the {human(masters)} of fp32 master weights beside their half-precision copy"
        parts.append(f"optimizer state projected at {moments}x {which}{assumed}")
    if facts.get("assumed_all"):  # the file does not show which parameters train
        parts.append("assuming every parameter trains, an upper bound: frozen ones (a LoRA base) get neither")
    sharded = facts.get("state_sharded")
    if sharded:
        so_far = " so far, in its first step" if sharded == 2 else ""
        parts.append(
            f"optimizer state as this rank holds it{so_far}: its optimizer shards it across ranks, as ZeRO does"
        )
    return f" ({'; '.join(parts)})" if parts else ""


def _spike_cause(f: Facts) -> str:
    """What grew, where the inputs' sizes show it: larger inputs, inputs of the same sizes, or nothing."""
    changed = f.get("inputs_changed")
    if changed is True:
        return " (larger inputs: a bigger batch, a longer sequence or larger images)"
    if changed is False:
        return ", with inputs of the same sizes"
    return ""


LAYOUT_ESTIMATE = "an estimate, as laid out"  # a figure of the layout rebuilt back from the dump


def _layout_estimate(f: Facts) -> str:
    """' (an estimate, as laid out: ...)' where the figures are the rebuilt layout's (the dump
    postdates the moment: `Context.layout_estimated`)."""
    if not f.get("estimated"):
        return ""
    return f" ({LAYOUT_ESTIMATE}: the dump was written after the OOM, and blocks freed since count at their rounded requests)"


def _summary_words(kind: str, f: Facts) -> str:
    size = f.size
    if kind == SummaryKind.OUTSIDE_PYTORCH:
        return f"{human(size('outside'))} of the device's {human(size('total'))} was held outside PyTorch (other processes, NCCL or the CUDA context); without it the {human(size('request'))} request fits."
    if kind == SummaryKind.OUTSIDE_PYTORCH_GUESSED:
        return f"PyTorch could use only {human(size('capacity'))} of this device (reserved + free at the OOM). A plain snapshot does not record the device's size, but no CUDA GPU is that small: most of it was probably held outside PyTorch."
    if kind == SummaryKind.MODEL_STATES_TOO_LARGE:
        at_least = "at least " if f.get("state_sharded") == 2 else ""
        return f"Parameters, gradients and optimizer state alone need {at_least}{human(size('needed'))}{_projection(f)}, but PyTorch could have at most {human(size('capacity'))} on this device."
    if kind == SummaryKind.FRAGMENTATION:
        largest, request = human_sizes_apart(size("largest"), size("request"))
        return f"{human(size('usable'))} sat free in PyTorch's cache for this pool and stream, more than the {request} request, but in pieces: the largest was {largest}{_layout_estimate(f)}."
    if kind == SummaryKind.OVERSIZED_REQUEST:
        return f"One allocation of {human(size('request'))} failed: {f.number('share'):.0%} of what PyTorch could have on this device, and more than all live activations, temporaries and inputs together ({human(size('transient'))})."
    if kind == SummaryKind.GRADIENTS_KEPT:
        before = size("before_trace")
        passes = size("from_passes")
        if passes and passes >= (size("old") or 0):  # made by this step's earlier passes, all of them
            made = "from earlier passes (micro-batches of this step, or steps of their own: the file cannot tell)"
        elif passes:
            made = f"from earlier steps and passes ({human(passes)} from passes that may be micro-batches of this step)"
        elif before and before >= (size("old") or 0):  # the earlier steps are not in the trace
            made = "made before the trace began (an earlier step's backward)"
        else:
            made = (
                f"from earlier steps ({human(before)} of them from before the trace began)"
                if before
                else "from earlier steps"
            )
        if f.get("phase") == "between_steps":  # a step's code before its forward
            during = f"before step {f.get('step')}'s forward"
        else:
            during = f"during step {f.get('step')}'s {(f.text('phase') or '').replace('_', ' ')}"
        return f"{human(size('old'))} of gradients {made} were still alive {during}; they are not needed before the next backward{_UNLESS_ACCUMULATING if f.get('no_optimizer_step') else ''}."
    if kind == SummaryKind.CREEPING_LEAK:
        old, outside = size("old") or 0, size("outside_passes") or 0
        if not outside:
            made = "allocated in earlier steps' forward or backward"
        elif outside >= old:
            made = "allocated in earlier steps outside their forward and backward"
        else:
            made = f"allocated in earlier steps ({human(old - outside)} in their forward or backward, {human(outside)} outside them)"
        return f"{human(size('old'))} {made} was still alive at the {f.get('at') or 'OOM'} in step {f.get('step')}: something keeps each step's tensors (a loss kept with its graph, a list of outputs)."
    if kind == SummaryKind.INFERENCE_WITH_GRAD:
        since = "the last backward" if f.get("since_backward") else "the start of the trace"
        return f"{f.get('passes')} forward passes ran since {since} with no backward, and {human(size('kept'))} of the earlier passes' activations are still alive: grad mode is on, so each pass keeps its graph."
    if kind == SummaryKind.OPTIMIZER_FIRST_STEP:
        return f"The OOM came inside the first optimizer.step(), where a stateful optimizer creates its state lazily: {human(size('optimizer_state'))} of state so far on top of {human(size('parameters'))} of parameters and {human(size('gradients'))} of gradients."
    if kind == SummaryKind.OPTIMIZER_STATE_BEFORE_TRACE:
        state_words, before_words = human(size("optimizer_state")), human(size("before_trace"))
        if f.get("phase") == PHASE_OPTIMIZER:  # not the first step: its state is there already
            return f"The OOM came inside an optimizer step whose state was made before the trace began ({before_words}: by an earlier step, or up front as DeepSpeed makes it): {state_words} of optimizer state and {human(size('temporaries'))} of the step's temporaries are alive, and together they do not fit."
        return f"{state_words} of optimizer state is alive at the OOM, {before_words} of it made before the trace began (by an earlier optimizer step, or up front as DeepSpeed makes it), enough to cover what the request lacked. The trace holds no completed step like this one to compare with: if the run's earlier steps fit with this state alive, what this step adds is the cause, not the state."
    if kind == SummaryKind.OPTIMIZER_LATER_STEP:
        earlier = f.get("earlier_step")
        if earlier is None:
            return f"Step {f.get('step')} failed with {human(size('optimizer_state'))} of optimizer state alive, made by an optimizer step earlier in the trace: the state raised the baseline. The trace holds no completed step like this one to compare with."
        return f"Step {f.get('step')} failed with {human(size('optimizer_state'))} of optimizer state alive that step {earlier}, which fit, ran without: the state an optimizer step created since raised the baseline."
    # judged in the loop's code after the forward returned (a loss computed outside the model)
    after = ", alive in the loop's code after it returned and before its backward," if f.get("after_forward") else ""
    if kind == SummaryKind.ACTIVATION_SPIKE:
        cause = _spike_cause(f)
        if f.get("temporaries"):  # a backward's own temporaries with them, against whole peaks
            both = (size("activations") or 0) + (size("temporaries") or 0)
            return f"Activations and temporaries of step {f.get('step')}'s {f.get('phase')} reached {human(both)} ({human(size('temporaries'))} of them the backward's temporaries), {f.number('ratio'):.1f}x the peak allocated by earlier steps{cause}."
        return f"Activations of step {f.get('step')}'s {f.get('phase')}{after} reached {human(size('activations'))}, {f.number('ratio'):.1f}x the peak of earlier steps{cause}."
    if kind == SummaryKind.ACTIVATION_SPIKE_PROJECTED:
        cause = _spike_cause(f)
        return f"Step {f.get('step')}'s {f.get('phase')} ran out near its start, with {human(size('activations'))} of its own activations so far: its allocations up to the failed request were {f.number('size_ratio'):.2f}x step {f.get('rest_step')}'s at the same point{cause}, and the whole pass is projected at {human(size('projected'))}, {f.number('ratio'):.1f}x the activation peak of earlier steps (an estimate, extrapolated from step {f.get('rest_step')}'s pass)."
    if kind == SummaryKind.ACTIVATIONS_DOMINATE:
        phase = f.text("phase") or ""
        if phase == PHASE_UNKNOWN:  # no phases: the blocks' own stacks placed them
            return f"Activations ({human(size('activations'))}, placed by their blocks' own stacks) dominate live memory; the trace records no stacks, so which passes made them, and whether earlier ones kept theirs, is unknown."
        # a forward's own activations, or those a forward left alive in a later phase (the backward)
        whose = f"of the {phase} pass" if phase in FORWARD_PASSES else f"alive in the {phase.replace('_', ' ')}"
        ratio = f.get("ratio")
        if f.get("temporaries"):  # a backward's own temporaries outweigh the activations: both are its memory
            both = (size("activations") or 0) + (size("temporaries") or 0)
            what = f"Activations and temporaries {whose} ({human(both)}, {human(size('temporaries'))} of them the backward's temporaries"
            if ratio is not None and f.get("earlier_step") is not None:
                counting = "with the failed request or the rest of the pass, " if f.get("still_needed") else ""
                return f"{what}; {counting}{f.number('ratio'):.2f}x all that step {f.get('earlier_step')} had allocated at its peak, which fit) dominate live memory: this step needs more than the earlier ones did."
            return f"{what}) dominate live memory: at this batch and sequence size the pass needs more than the device has."
        if ratio is not None and f.get("earlier_step") is not None:  # a completed step like this one fit, with less
            counting = "with the failed request or the rest of the pass, " if f.get("still_needed") else ""
            return f"Activations {whose} ({human(size('activations'))}; {counting}{f.number('ratio'):.2f}x the peak of step {f.get('earlier_step')}, which fit){after} dominate live memory: this step needs more than the earlier ones did."
        return f"Activations {whose} ({human(size('activations'))}){after} dominate live memory: at this batch and sequence size the pass needs more than the device has."
    if kind == SummaryKind.ACTIVATIONS_FIRST_PASS:
        every = ", even if every parameter trains" if f.get("assumed_all") else ""
        return f"The {f.get('phase')} pass ran out near its start, with no earlier pass like it in the trace to show how much of it remained: its own memory so far ({human(size('own'))}) and the failed request come to {human(size('reached'))}, a lower bound of what it needs, more than the {human(size('room'))} the device left it beside the {human(size('rest'))} held otherwise. The model states fit at full size ({human(size('states'))} of {human(size('capacity'))}{every}): at this batch and sequence size the pass is too large for this device in one pass."
    if kind == SummaryKind.NO_OOM:
        if f.get("empty"):
            return "This file holds no GPU memory and no allocation history for this device: PyTorch had reserved nothing when it was written and no history was recorded (torch.cuda.memory._record_memory_history() must run before the work, and the snapshot be written while its tensors are alive), so it cannot tell whether the run ran out."
        entries = f.size("entries")
        if entries is None:
            recorded = "No out-of-memory event was recorded on this device"
        elif entries == 0:
            recorded = "This file cannot tell whether the run ran out of memory: it holds no allocation history for this device (history recording was off)"
        else:
            recorded = f"This file cannot tell whether the run ran out of memory: its trace holds only {plural(entries, 'entry', 'entries')}, and an OOM before {'it' if entries == 1 else 'them'} would not show"
        # the trace's peak, of a run that began before the trace: earlier peaks are not recorded
        earlier = (
            ", the most the trace shows: what was allocated before it began is not recorded"
            if f.get("before_trace")
            else ""
        )
        return (
            f"{recorded}; the figures describe the {f.get('at')} ({human(size('allocated'))} allocated){earlier}."
            + _dominance(f)
            + _cached(f)
        )
    if kind == SummaryKind.KEPT_GRAPH_RISK:
        kept = f"{human(size('kept'))}, {f.number('share'):.0%} of what it allocated, and nothing in the dump trains"
        if f.get("returned"):  # the dump came after the pass: no backward had run by then
            return f"At the {f.get('at')}, the last forward pass, returned, still keeps {kept}: that is its graph, kept with grad mode on for a backward that had not run when the dump was written."
        # judged inside the pass: a backward may yet follow it
        return f"At the {f.get('at')}, a forward pass keeps {kept}: with grad mode on, autograd keeps the graph for a backward, which inference or a benchmark never runs."
    if kind == SummaryKind.GRADIENTS_KEPT_RISK:
        if f.get("phase") is not None:  # judged later in the step than its forward
            phase = f.text("phase") or ""
            # in the optimizer step (or its zero_grad) the backward's gradients exist either way
            moment = (
                ", not at this moment, when every gradient exists either way"
                if phase in (PHASE_OPTIMIZER, PHASE_ZERO_GRAD)
                else ""
            )
            unless = _UNLESS_ACCUMULATING if f.get("no_optimizer_step") else ""
            return f"At the {f.get('at')} ({phase.replace('_', ' ')} of step {f.get('step')}), {human(size('old'))} of gradients from an earlier backward are still alive: they were alive through the step's forward (parameters: {human(size('parameters'))}); zero_grad(set_to_none=True) before the forward would have freed them there{moment}{unless}."
        unless = _UNLESS_ACCUMULATING if f.get("no_optimizer_step") else ""
        return f"At the {f.get('at')}, {human(size('old'))} of gradients from an earlier backward are alive during a forward (parameters: {human(size('parameters'))}); zero_grad(set_to_none=True) before the forward would free them{unless}."
    if kind == SummaryKind.MODEL_STATES_AT_CAPACITY:
        capacity = f.size("capacity")
        entries = f.size("entries") or 0
        why = (
            f"of the {human(capacity)} PyTorch could have"
            if capacity is not None
            else f"and the trace holds only {plural(entries, 'entry', 'entries')}, too few to have kept an OOM event"
            if entries
            else "and there is no trace that could have kept an OOM event"
        )
        return f"Model states fill what PyTorch reserved ({human(size('states'))} of {human(size('reserved'))}, {human(size('free'))} free in the cache) {why}: if this dump was written at an OOM, the model states do not fit."
    if kind == SummaryKind.NEAR_OOM_OVERSIZED:
        return f"The device ran out once without an OOM: a {human(size('request'))} request failed in cudaMalloc, the allocator freed {human(size('flushed'))} of cache and retried it (it succeeded at event {f.get('index')}). That one request is at least {f.number('share'):.0%} of the most the device could have held for PyTorch then (under {human(size('bound'))})."
    if kind == SummaryKind.OVERSIZED_TENSOR_RISK:
        return f"One live tensor of {human(size('largest'))} is {f.number('share'):.0%} of what PyTorch could have on this device."
    if kind == SummaryKind.DEVICE_IMBALANCE:
        return _imbalance_words(f)
    if kind == SummaryKind.EVAL_OUTPUTS_KEPT:
        at = f.get("at")
        return (
            (f"At the {at}, " if at else "")
            + f"{f.get('passes')} forward passes ran with no backward between them, and {f.get('keeping')} of the earlier ones still hold their outputs: {human(size('kept'))}, {f.number('share'):.0%} of what they allocated (outputs, not graphs). Each batch's outputs (logits, predictions) are kept on the GPU and pile up batch after batch, as in an evaluation loop that gathers them for an end-of-run metric."
        )
    if kind == SummaryKind.CHECKPOINT_GATHER:
        at = f.get("at")
        ratio = f.get("ratio")
        asked = f" and asked for {human(size('request'))} more" if f.get("request") is not None else ""
        held = f"{human(size('live'))} of copies{asked}"
        against = (
            f", {f.number('ratio'):.1f}x the {human(size('parameters'))} of parameters this device holds"
            if ratio is not None
            else ""
        )
        what = (
            "a full state dict gathered on one GPU, not only this device's shard"
            if ratio is not None and f.number("ratio") > 1
            else "the state dict copied on the GPU"
        )
        where = f"(in {f.text('function')})"
        start = (
            f"At the {at}, code saving a checkpoint {where} holds"
            if at
            else f"The OOM came while a checkpoint was being saved {where}: the save holds"
        )
        return f"{start} {held}{against}: {what}."
    if kind == SummaryKind.UNKNOWN:
        return "The OOM does not match any known pattern with the data this dump holds."
    if kind == SummaryKind.UNKNOWN_WHAT_TRAINS:
        which, frozen = (
            ("the run trains, and the file cannot tell which of them do", "a LoRA base")
            if f.get("trains")
            else ("the file cannot tell whether they train", "a LoRA base, or inference")
        )
        # (too large from 95% of the capacity on, not only past it)
        states, capacity = size("states") or 0, size("capacity") or 0
        against = "more than the" if states > capacity or not capacity else f"{states / capacity:.0%} of the"
        return f"The {f.get('phase')} pass ran out near its start, beside {human(size('parameters'))} of parameters; {which}, and that decides the cause: if every one trains, its gradients and optimizer state bring the model states to {human(states)}, {against} {human(capacity)} PyTorch could have (model states too large); if most are frozen ({frozen}), the pass's own memory and the failed request, at least {human(size('reached'))} (a lower bound: the pass was interrupted), did not fit in the {human(size('room'))} left beside the {human(size('rest'))} held otherwise (activations too large for one pass)."
    raise KeyError(kind)


def _imbalance_words(f: Facts) -> str:
    """The devices compared: the judged one held far more than any replica of its model."""
    device = f.get("device")
    at = {"oom": "at its OOM", "peak": "at its peak", "dump": "at the dump"}.get(str(f.get("at")), "")
    others = "every other device" if (f.size("peers") or 0) > 1 else f"device {f.get('peer')}"
    if not f.get("data_parallel"):
        why = "The work was split unevenly between devices that run the same model code: balance it by input size."
    elif device == 0:
        why = (
            "DataParallel gathers the outputs on device 0 and keeps the master copy of the model there: gather a"
            " smaller output, or move to DistributedDataParallel (one process per GPU, no master device)."
        )
    else:
        why = (
            f"DataParallel splits a batch by count, not by size, so device {device} got more of the work: balance"
            " the inputs by size (or cap them per batch), or move to DistributedDataParallel."
        )
    return (
        f"Device {device} held {human(f.size('allocated'))} {at}, {f.number('ratio'):.1f}x the highest peak of"
        f" {others} running the same model (device {f.get('peer')}: {human(f.size('peer_peak'))}). {why}"
    )


def _dominance(f: Facts) -> str:
    """' At the peak the largest part is activations (26.92 GiB, 68%); at the dump (...) it is
    parameters (...).'"""
    name = f.text("dominant")
    allocated = f.size("allocated") or 0
    if not name or not allocated:
        return ""
    held = f.size("dominant_bytes") or 0
    words = (
        f" At the {f.get('at')} the largest part is {_component_words(name)} ({human(held)}, {held / allocated:.0%})"
    )
    end_name, end_allocated = f.text("end_dominant"), f.size("end_allocated")
    if end_name and end_allocated:
        end_held = f.size("end_dominant_bytes") or 0
        words += f"; at the dump ({human(end_allocated)} allocated) it is {_component_words(end_name)} ({human(end_held)}, {end_held / end_allocated:.0%})"
    return words + "."


def _cached(f: Facts) -> str:
    """' PyTorch's cache holds more free than allocated: 4.67 GiB of the 5.18 GiB it reserves (...).'"""
    cached = f.size("cached")
    if cached is None:
        return ""
    return (
        f" PyTorch's cache holds more free than allocated: {human(cached)} of the {human(f.size('reserved') or 0)}"
        " it reserves, kept from earlier allocations for reuse (torch.cuda.empty_cache() would return"
        f" {human(f.size('releasable') or 0)} of it to the device)."
    )


_COMPONENT_WORDS = {
    "optimizer_state": "optimizer state",
    "preallocated": "large pre-allocations",
    "workspace": "library workspaces",
    "other": "other memory",
    "unknown": "memory of unknown kind",
}


def _counted(value: object, noun: str, nouns: str | None = None) -> str:
    """A fact's count with its noun ('1 earlier step'); a count that is not a whole number as it is."""
    if isinstance(value, int) and not isinstance(value, bool):
        return plural(value, noun, nouns)
    return f"{value} {nouns or noun + 's'}"


def _component_words(name: str) -> str:
    return _COMPONENT_WORDS.get(name, name)


# where no optimizer step shows between the backwards, the gradients may be kept on purpose
_UNLESS_ACCUMULATING = ", unless the run accumulates them on purpose (no optimizer step shows since they were made)"


def summary(item: Summary) -> str:
    """A finding's story in one or two sentences; where the steps it names are the trace's (steps
    may have run before it began), or the least the trace shows (passes counted in a step may be
    steps of their own), it says so."""
    words = _summary_words(item.kind, item.facts)
    if item.facts.get("trace_steps") and _STEP_NUMBER.search(words):
        words += " (Steps are counted from the trace's start; more may have run before it.)"
    if item.facts.get("steps_at_least") and _STEP_NUMBER.search(words):
        words += " (Step numbers are the least the trace shows: passes counted in one step may be steps of their own.)"
    return words


_STEP_NUMBER = re.compile(r"\b[Ss]tep \d")


EVIDENCE: dict[str, str] = {
    EvidenceKind.MISSING: "bytes missing for the request",
    EvidenceKind.OUTSIDE: "memory outside PyTorch = total − free − reserved",
    EvidenceKind.DEVICE_TOTAL: "device total memory",
    EvidenceKind.PARAMETERS: "parameters",
    EvidenceKind.GRADIENTS: "gradients",
    EvidenceKind.OPTIMIZER_STATE: "optimizer state",
    EvidenceKind.OPTIMIZER_STATE_AT_OOM: "optimizer state alive at the OOM",
    EvidenceKind.FOREACH_TEMPORARIES: "temporaries (foreach buffers)",
    EvidenceKind.ACTIVATIONS_AT_OOM: "activations at the OOM",
    EvidenceKind.LIVE_ACTIVATIONS: "live activations at the OOM",
    EvidenceKind.LIVE_TEMPORARIES: "live temporaries at the OOM",
    EvidenceKind.CAPACITY: "capacity available to PyTorch",
    EvidenceKind.LARGEST_FREE_BLOCK: "largest usable free block",
    EvidenceKind.REQUEST: "failed request (rounded)",
    EvidenceKind.DEVICE_FREE: "free device memory at the OOM",
    EvidenceKind.MESSAGE_BYTES: "what the OOM message calls Tried to allocate",
    EvidenceKind.TRANSIENT: "live activations + temporaries + inputs",
    EvidenceKind.OLD_GRADIENTS: "gradients allocated in earlier steps, still alive",
    EvidenceKind.NO_ZERO_GRAD: "no zero_grad phase recorded",
    EvidenceKind.ZERO_GRAD_KEPT: "zero_grad ran but kept the tensors (set_to_none=False)",
    EvidenceKind.ZERO_GRAD_LATER: "zero_grad ran, but not between the backward that made these gradients and this moment (the loop calls it later in the step)",
    EvidenceKind.FORWARD_PASSES: "forward passes without a backward",
    EvidenceKind.EARLIER_PASS_ACTIVATIONS: "activations of earlier forward passes still alive",
    EvidenceKind.FIRST_STEP_OOM: "OOM during step 0's optimizer step",
    EvidenceKind.CURRENT_ACTIVATIONS: "of them, this pass's own (earlier steps' and earlier passes' left out)",
    EvidenceKind.RESERVED_PLUS_FREE: "reserved + free device memory at the OOM",
    EvidenceKind.PASS_ALLOCATED: "allocated by this forward pass up to here",
    EvidenceKind.PASS_KEPT: "of it, activations and temporaries still alive",
    EvidenceKind.PASS_REACHED: "this pass's own live memory and the failed request: a lower bound of what it needs (the pass was interrupted)",
    EvidenceKind.NO_TRAINING: "no backward, optimizer step, gradients or optimizer state in the dump",
    EvidenceKind.RESERVED: "reserved by PyTorch",
    EvidenceKind.FREE_CACHED: "free in PyTorch's cache",
    EvidenceKind.TRACE_ENTRIES: "entries in the trace",
    EvidenceKind.NEAR_OOM: "cache freed to retry a failed cudaMalloc (a near-OOM)",
    EvidenceKind.CAPACITY_BOUND: "reserved before the flush + the request: the device had less for PyTorch",
    EvidenceKind.LARGEST_TENSOR: "largest live tensor",
    EvidenceKind.SAVE_GATHERED: "allocated by the checkpoint-saving code, still alive (state dict copies)",
    EvidenceKind.PARAMETERS_HELD: "parameters this device holds (blocks the save did not make)",
}

# the devices compared: where each figure was read
_DEVICE_MOMENTS = {"oom": "the OOM", "peak": "the peak", "dump": "the dump"}


def _evidence_words(kind: str, f: Facts) -> str:
    if kind == EvidenceKind.MISSING_PLACEMENT:
        free = f.size("free")
        return (
            f"bytes missing by count (the request failed on placement: the largest usable free block was {human(f.size('largest'))}"
            + (f", and cudaMalloc needed {human(f.size('asked'))} with {human(free)} free" if free is not None else "")
            + ")"
        )
    if kind == EvidenceKind.MODEL_STATES_NEEDED:
        return "model states needed" + _projection(f)
    if kind == EvidenceKind.MODEL_STATES_AT_FULL_SIZE:
        if f.get("as_held"):
            return "model states at full size (as held: no gradients or optimizer state still to come)"
        moments = f.get("projected_moments")
        recorded = f.get("moments_recorded")
        at = (
            ""
            if moments is None
            else f", no optimizer state: {NONE_AS_RECORDED}"
            if moments == 0 and recorded
            else f", the state at {moments}x the parameters that train" + (f", {KEPT_AS_RECORDED}" if recorded else "")
        )
        assuming = ", assuming Adam-style moments" if f.get("moments_assumed") else ""
        every = "; assuming every parameter trains, an upper bound" if f.get("assumed_all") else ""
        return f"model states at full size (gradients and optimizer state still to come projected{at}{assuming}{every})"
    if kind == EvidenceKind.ROOM_FOR_PASS:
        return f"left for this pass: the capacity less the {human(f.size('rest'))} allocated besides its own activations and temporaries (model states, inputs, workspaces, the rest)"
    if kind == EvidenceKind.USABLE_FREE:
        estimated = f"; {LAYOUT_ESTIMATE}" if f.get("estimated") else ""
        return f"free cached bytes usable for the request ({f.get('pool')} pool, same stream{estimated})"
    if kind == EvidenceKind.LARGEST_FREE_BLOCK and f.get("estimated"):
        return f"{EVIDENCE[kind]} ({LAYOUT_ESTIMATE})"
    if kind == EvidenceKind.KEPT_FROM_EARLIER_STEPS:
        return f"activations, temporaries and inputs from {_counted(f.get('steps'), 'earlier step')} still alive"
    if kind == EvidenceKind.STEP_GROWTH:
        # the mean of the steps' growths, which differ from step to step
        return f"end-of-step allocated memory grew over {_counted(f.get('steps'), 'consecutive step')}, on average per step"
    if kind == EvidenceKind.EARLIER_PEAK_ACTIVATIONS:
        ratio = f.get("ratio")
        what = (
            "peak allocated by earlier steps (model states included)"
            if f.get("whole")
            else "peak activations of earlier steps"
        )
        return what + (f" (now {f.number('ratio'):.2f}x)" if ratio is not None else "")
    if kind == EvidenceKind.KEPT_OUTPUTS:
        return f"outputs of {_counted(f.get('passes'), 'earlier forward pass', 'earlier forward passes')}, still alive"
    if kind == EvidenceKind.EARLIER_PASSES_ALLOCATED:
        return f"allocated by the earlier passes (what they still hold is {f.number('share'):.0%} of it: their intermediates were freed)"
    if kind == EvidenceKind.OUTPUTS_PER_PASS:
        return f"outputs kept per pass, on average over {f.get('passes')} passes"
    if kind == EvidenceKind.REQUEST_COVERS_KEPT:
        return f"failed request, at least the {human(f.size('kept'))} of outputs kept so far (likely their concatenation, torch.cat)"
    if kind == EvidenceKind.SAVE_CALL:
        return f"checkpoint-saving code on the stack ({f.text('function')})"
    if kind == EvidenceKind.ALLOCATED_AT_TARGET:
        return f"allocated bytes at the {f.get('at')}"
    if kind == EvidenceKind.DOMINANT_BLOCK:
        name = f.text("largest_name")
        return (
            f"a single live block of {_component_words(str(f.get('component')))}{f' ({name})' if name else ''},"
            f" {f.number('share'):.0%} of allocated at the OOM"
        )
    if kind == EvidenceKind.DEVICE_ALLOCATED:
        return f"device {f.get('device')}: allocated bytes at {_DEVICE_MOMENTS.get(str(f.get('at')), 'its moment')}"
    if kind == EvidenceKind.PEER_PEAK:
        return f"device {f.get('device')}: its peak allocated (the event is in that device's trace)"
    if kind == EvidenceKind.PEER_AT_MOMENT:
        return f"device {f.get('device')}: allocated at the same time as {_DEVICE_MOMENTS.get(str(f.get('at')), 'that moment')} (by time_us)"
    text = EVIDENCE[kind]
    name = f.text("largest_name")
    return text + (f" (largest: {name})" if name else "")


def evidence(item: Evidence) -> str:
    """What a piece of evidence is (the views add its figure and where it was read)."""
    return _evidence_words(item.kind, item.facts)
