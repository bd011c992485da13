"""Every sentence a report says about an analysis, in one place: the analysis returns data (a kind
and the numbers and names its sentence needs), and these functions word it. The text, Markdown and
JSON reports and the terminal app all take their words from here, so they never disagree.

Plain strings; a name from the file (a tensor's registry name, say) goes in as it is, and each view
escapes the whole sentence its own way (`safetext.printable`, Markdown's `inline_text`).

To word a new kind: add it to its enum in `oomdoctor.analysis.results` and its sentence here;
`tests/test_phrasing.py` checks that every kind has one.
"""

from __future__ import annotations

from oomdoctor.analysis.results import Change, Recommendation, Unknown, UnknownKind, WhatIf, WhatIfCase
from oomdoctor.units import human_size

# --- what the dump could not tell -----------------------------------------------------------------

UNKNOWNS: dict[str, str] = {
    UnknownKind.REPLAYED_AFTER_TARGET: (
        "the dump was written {count} events after the target; block sizes freed since then are estimated from their requests"
    ),
    UnknownKind.UNPLACED_BLOCKS: "{count} blocks live at the target lie in no segment the replay could rebuild; left out",
    UnknownKind.NO_HISTORY: "no allocation history was recorded: phases, steps, the OOM event and the series are unknown",
    UnknownKind.NO_FRAMES: "no stack frames were recorded: phases come from markers or annotations only",
    UnknownKind.NO_PHASES: "no markers, annotations or frames mark the phases, so steps and phases are unknown",
    UnknownKind.NO_REGISTRY: "no oomdoctor registry of named tensors: components are inferred, not exact",
    UnknownKind.RING_BUFFER_WRAPPED: (
        "the trace holds {count} events, as many as the ring buffer keeps: it wrapped, and older events are lost"
    ),
    UnknownKind.PRE_EXISTING: "{count} allocations predate the trace; their phase and stack are unknown",
    UnknownKind.NO_DEVICE_TOTAL: "device total memory (not in a plain snapshot), so memory outside PyTorch is unknown",
    UnknownKind.NO_DEVICE_FREE: "free device memory at the target event, so memory outside PyTorch is unknown",
    UnknownKind.OOM_RETRIED: (
        "torch caught and retried this OOM internally (as cuDNN's workspace search does): it may not be what stopped the run"
    ),
}


def unknown(item: Unknown) -> str:
    """One thing the dump could not tell, as a sentence (without its full stop)."""
    return UNKNOWNS[item.kind].format(count=item.count)


def unknowns(items: tuple[Unknown, ...]) -> tuple[str, ...]:
    return tuple(unknown(item) for item in items)


# --- what if the batch were scaled ----------------------------------------------------------------


def what_if_note(what_if: WhatIf) -> str:
    """What the batch-size what-if found, as one clause (the views add the capital and full stop)."""
    case = what_if.case
    if case == WhatIfCase.CAPACITY_UNKNOWN:
        note = "capacity unknown (a plain snapshot without an OOM event does not say how large the device is)"
    elif case == WhatIfCase.FIXED_TOO_LARGE:
        states = "model states projected at full size" if what_if.projected_states else "model states"
        request = ", the failed request" if what_if.request_fixed else ""
        note = f"the fixed part alone ({states}, optimizer temporaries, buffers, other{request}) does not fit: no batch size would"
    elif case == WhatIfCase.NO_BUDGET:
        note = "no activation budget at the target event: changing the batch would not change this peak"
    elif case == WhatIfCase.PLACEMENT:
        note = (
            f"at 1.00x the request failed on placement, not for want of bytes: with today's free blocks the scaled request"
            f" fits up to {what_if.largest_fitting_scale:.2f}x (by bytes alone the peak would fit further)"
        )
    else:
        note = f"activations scale linearly with batch size and (at least) with sequence length; at {what_if.largest_fitting_scale:.2f}x the peak fits"
        if what_if.calibrated:
            note += " (calibrated on the OOM: at 1.00x it falls short by what the failed request lacked"
            note += f"{', with the model states projected at full size' if what_if.projected_states else ''})"
    if what_if.rough:
        note += "; that far from the measured batch the linear model is a rough guide only"
    basis = what_if.basis
    if basis is not None:
        note = (
            f"from step {basis.step}'s peak ({human_size(basis.peak_allocated_bytes)} allocated,"
            f" activations up to {human_size(basis.activation_bytes)}): {note}"
        )
    return note


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
    Change.ZERO_GRAD_SET_TO_NONE: (
        "Call optimizer.zero_grad(set_to_none=True) every step so the previous step's gradients are freed before forward."
    ),
    Change.FREE_KEPT_TENSORS: (
        "Stop keeping tensors across steps: accumulate `loss.item()` or `loss.detach()`, not `loss`; clear lists of outputs."
    ),
    Change.EXPANDABLE_SEGMENTS: (
        "Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True so free pieces of the cache can be mapped into one range."
    ),
    Change.NO_GRAD: (
        "Wrap evaluation in torch.inference_mode() (or torch.no_grad()) so forward keeps no graph, and accumulate `loss.item()`, not `loss`."
    ),
    Change.SHARD_MODEL_STATES: (
        "Shard parameters, gradients and optimizer state across GPUs (FSDP or ZeRO); with two GPUs each holds half."
    ),
    Change.CHUNK_LARGE_OP: (
        "Compute the oversized operation in chunks (for logits: a chunked or fused cross-entropy) so no single tensor needs that much."
    ),
    Change.FREE_OTHER_PROCESSES: "Stop the other processes on this GPU (see nvidia-smi) or pick a free device.",
}


def recommendation(item: Recommendation) -> str:
    """The change a recommendation asks for, as one imperative sentence."""
    return CHANGES[item.id]
