"""What-if: how the peak scales with the activation budget (batch size or sequence length).

The model is linear: memory needed = fixed (parameters, gradients, optimizer state, buffers, other)
+ scale x budget (activations, temporaries, inputs and the failed request when forward or backward
made it). It is the first-order answer a user needs to pick a batch size, not a simulation.
"""

from __future__ import annotations

import math

from oomdoctor.analysis.results import PHASE_BACKWARD, PHASE_BETWEEN, PHASE_FORWARD, WhatIf

SCALES = (0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0)


def what_if(
    components: dict[str, int], *, scalable_bytes: int, request_bytes: int, target_phase: str, capacity_bytes: int | None
) -> WhatIf:
    """`scalable_bytes`: live bytes that grow with the batch (activations, inputs, backward temporaries)."""
    scalable = scalable_bytes
    request_scales = target_phase in (PHASE_FORWARD, PHASE_BACKWARD, PHASE_BETWEEN)
    fixed = sum(components.values()) - scalable
    if request_scales:
        scalable += request_bytes
    else:
        fixed += request_bytes
    largest = None
    if capacity_bytes is None:
        note = "capacity unknown (a plain snapshot without an OOM event does not say how large the device is)"
    elif fixed >= capacity_bytes:
        largest = 0.0
        note = "the fixed part alone (model states, optimizer temporaries, buffers, other) does not fit: no batch size would"
    elif scalable == 0:
        note = "no activation budget at the target event: changing the batch would not change this peak"
    else:
        largest = math.floor((capacity_bytes - fixed) / scalable * 100) / 100
        note = f"activations scale linearly with batch size and (at least) with sequence length; at {largest:.2f}x the peak fits"
    peaks = tuple((scale, fixed + int(round(scalable * scale))) for scale in SCALES)
    return WhatIf(
        scalable_bytes=scalable,
        fixed_bytes=fixed,
        capacity_bytes=capacity_bytes,
        largest_fitting_scale=largest,
        predicted_peaks=peaks,
        note=note,
    )
