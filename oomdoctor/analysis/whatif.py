"""What-if: how the peak scales with the activation budget (batch size or sequence length).

The model is linear: memory needed = fixed (parameters, gradients, optimizer state, buffers, other)
+ scale x budget (activations, inputs, forward/backward temporaries, and the failed request when
forward or backward made it). It is the first-order answer a user needs to pick a batch size, not a
simulation. At an OOM it is calibrated on the OOM itself: at 1.00x it falls short by exactly what
the failed request lacked (cached memory the request could not use counts as fixed), so the model
never says that the batch which failed would fit. When the verdict projects the model states at
full size, the fixed part is at least what they need (see `recommendations.requirement`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from oomdoctor.analysis.results import (
    FORWARD_PASSES,
    PHASE_BACKWARD,
    PHASE_BETWEEN,
    FreeHole,
    LiveBlock,
    RestOfPass,
    WhatIf,
    WhatIfBasis,
    WhatIfCase,
    WhatIfUnknown,
)
from oomdoctor.analysis.sizing import LARGE_SEGMENT_BYTES, MIN_BLOCK_BYTES, SMALL_SEGMENT_BYTES, segment_size

SCALES = (0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0)
SCALED_COMPONENTS = ("activations", "inputs")


def request_scales(target_phase: str, request_bytes: int = 0, blocks: Iterable[LiveBlock] = ()) -> bool:
    """Whether the failed request grows with the batch: it was made in forward, backward or between
    steps, and is not, in backward, exactly the size of a live parameter (then it is a gradient)."""
    if target_phase not in (*FORWARD_PASSES, PHASE_BACKWARD, PHASE_BETWEEN):
        return False
    if target_phase == PHASE_BACKWARD and request_bytes:
        return not any(b.component == "parameters" and b.size_bytes == request_bytes for b in blocks)
    return True


def cache_margin(large_segment_bytes: int = LARGE_SEGMENT_BYTES) -> int:
    """The reserved memory a run at another scale needs beyond its allocated bytes, at least, by the
    allocator's segment rules (spec §4.1): a request of 1-10 MiB that no cached block takes is placed
    in a whole new large segment (20 MiB, or `large_segment_size_mb`), one of at most 1 MiB in a new
    2 MiB small segment, so at such a moment the device must have that segment free, not only the
    request. What else the cache holds at another size (free pieces too small for the next request,
    cached blocks reused unsplit) the file cannot tell: a fit within this margin is unknown."""
    return large_segment_bytes + SMALL_SEGMENT_BYTES


def scalable_bytes(blocks: Iterable[LiveBlock]) -> int:
    """Live bytes that grow with the batch: activations, inputs, and temporaries of forward or backward.

    Temporaries of the optimizer step (foreach lists) and every model state do not scale with the
    batch. The batch-size recommendations and the what-if both count savings with this definition.
    """
    return sum(
        b.size_bytes
        for b in blocks
        if b.component in SCALED_COMPONENTS
        or (b.component == "temporaries" and b.phase in (*FORWARD_PASSES, PHASE_BACKWARD))
    )


def what_if(
    components: dict[str, int],
    *,
    scalable_bytes: int,
    request_bytes: int,
    target_phase: str,
    capacity_bytes: int | None,
    shortfall_bytes: int | None = None,
    projected_need_bytes: int | None = None,
    scales_request: bool | None = None,
    placement_limit: float | None = None,
    basis: WhatIfBasis | None = None,
    rest: RestOfPass | None = None,
    capacity_bound: int | None = None,
    backward_unknown: bool = False,
    capacity_at_most: bool = False,
    trains: bool = True,
    placement_reach: float | None = None,
    cache_margin_bytes: int = 0,
    beyond_the_moment: WhatIfUnknown | None = None,
) -> WhatIf:
    """`scalable_bytes`: live bytes that grow with the batch (`scalable_bytes(blocks)`).

    `shortfall_bytes`: what the failed request lacked at the OOM (None: no OOM, or not known);
    `projected_need_bytes`: what the run needs with the model states at full size (None: no projection),
    counting the request when it scales; `scales_request`: whether the request grows with the batch
    (None: `request_scales(target_phase)`); `placement_limit`: when the request failed on placement
    although the free bytes added up to enough, the largest scale of the request that finds a place
    today (`placement_limit`), and `placement_reach`, the largest at which one could exist at all
    (`placement_reach`): between the two, whether a scale fits is unknown. `basis`: the recorded step the figures come from, when not the
    target event.

    A placement failure is not a shortage of bytes, so when the request grows with the batch the
    largest fitting scale is where the scaled request fits today's largest free block, or its
    cudaMalloc fits free device memory (and never above what the bytes allow).

    `rest`: the OOM interrupted a forward (`passes.rest_of_pass`). Extrapolated, the pass's own bytes
    are its projected peak, less the earlier outputs its rest frees (and the gradients its backward
    makes are fixed), never below the instant's; unknown, the instant's largest scale is only an upper bound (`upper_bound_scale`):
    the rest of the forward and the backward still come, so no scale within it is said to fit.

    `backward_unknown`: the rest was extrapolated from a pass that ran no backward, in a run that
    trains (`recommendations.backward_unknown`): the largest scale is an upper bound only.

    `capacity_at_most`: the capacity is the device's total (no free figure for this moment), more
    than PyTorch could have had by what the CUDA context and other processes held: the largest
    scale is an upper bound.

    `trains`: the trace shows the run training (a backward follows the interrupted forward); else a
    backward follows only if the run trains (a forward-only trace of inference runs none).

    `cache_margin_bytes`: the reserved memory a run at another scale needs beyond its allocated
    bytes (`cache_margin`): the largest fitting scale leaves it free; between that scale and the
    one allocated bytes alone allow (`by_bytes_scale`), whether the run fits is unknown.

    `beyond_the_moment`: what decides whether a scaled run fits is not in the moment's figures (what the
    run keeps grows with the steps still to come; the rest of the pass is a guess): the moment's
    largest scale is given as `upper_bound_scale`, and no scale is said to fit.

    `capacity_bound`: with the capacity unknown, what PyTorch could have had at most (a near-OOM:
    a cudaMalloc of the request failed with this much reserved and requested). Past the scale whose
    peak reaches it (`upper_bound_scale`) the peak cannot fit; below it, whether it fits is unknown.
    """
    scalable = scalable_bytes
    fixed = sum(components.values()) - scalable
    if scales_request is None:
        scales_request = request_scales(target_phase)
    if scales_request:
        scalable += request_bytes
    else:
        fixed += request_bytes
    unusable = 0
    if not (scales_request and request_bytes):
        placement_limit = None
    if placement_limit is None:
        placement_reach = None
    calibrated = placement_limit is None and capacity_bytes is not None and shortfall_bytes is not None
    if placement_limit is None and capacity_bytes is not None and shortfall_bytes is not None:
        # at 1.00x the demand (fixed + scalable) must exceed the capacity by the shortfall, as it did
        unusable = max(0, capacity_bytes + shortfall_bytes - (fixed + scalable))
        fixed += unusable
    if rest is not None and rest.extrapolated:
        # at the projected peak the gradients the backward made are there, and the earlier outputs
        # the rest of the pass frees (the previous step's, a loop variable held) are not; what else
        # it frees (the previous step's gradients, at a zero_grad inside the pass) stays counted: at
        # a smaller scale the pass may peak where they are still held
        fixed += rest.earlier_kept_bytes
        own_now = rest.pass_bytes + (request_bytes if scales_request else 0)
        scalable = max(scalable, scalable - own_now + rest.projected_pass_bytes - rest.freed_scaled_bytes)
    projected = False
    if projected_need_bytes is not None and projected_need_bytes - scalable > fixed:
        fixed = projected_need_bytes - scalable
        projected = True
    largest = None
    upper_bound = None
    bound_by_place: float | None = None

    def bound(scale: float | None) -> float | None:
        """The largest scale as an upper bound: where a placement limit decides it, the scale past
        which no place could exist at all, or the bytes do not fit (`placement_reach`)."""
        return bound_by_place if case == WhatIfCase.PLACEMENT else scale

    bounded = capacity_bytes is None and capacity_bound is not None and scalable > 0 and fixed < capacity_bound
    if not bounded:
        capacity_bound = None  # none, or not needed: the capacity is known, or nothing scales
    if capacity_bound is not None:
        case = WhatIfCase.CAPACITY_BOUNDED
        upper_bound = -(-(capacity_bound - fixed) * 100 // scalable) / 100  # rounded up: past it, more than the bound
    elif capacity_bytes is None:
        case = WhatIfCase.CAPACITY_UNKNOWN
    elif fixed >= capacity_bytes:
        largest = 0.0
        case = WhatIfCase.FIXED_TOO_LARGE
    elif scalable == 0:
        case = WhatIfCase.NO_BUDGET
    else:
        largest = ((capacity_bytes - fixed) * 100 // scalable) / 100
        case = WhatIfCase.LINEAR
        if placement_limit is not None and placement_limit < largest:
            # as an upper bound (below, where no scale is said to fit) the placement limit is not
            # one: past it a place may still exist, up to the reach
            bound_by_place = min(largest, placement_reach) if placement_reach is not None else largest
            largest = placement_limit
            case = WhatIfCase.PLACEMENT
    if beyond_the_moment is None and largest is not None and largest > 1:
        # a larger batch than the one measured: no scale above 1.00x is said to fit. (Rehearsed, every
        # larger batch the fixtures' what-ifs allowed by allocated bytes ran out, with room for the
        # cache or without: no-oom-eval-outputs-kept-gpt at 1.57x, its final torch.cat of 100 MiB with
        # 76 MiB free and 48 MiB cached in pieces)
        beyond_the_moment = WhatIfUnknown.LARGER_BATCH
    if rest is not None and not rest.extrapolated and case in (WhatIfCase.LINEAR, WhatIfCase.PLACEMENT):
        upper_bound, largest, case = bound(largest), None, WhatIfCase.PASS_INTERRUPTED
    elif (
        backward_unknown
        and rest is not None
        and rest.extrapolated
        and case in (WhatIfCase.LINEAR, WhatIfCase.PLACEMENT)
    ):
        upper_bound, largest, case = bound(largest), None, WhatIfCase.BACKWARD_UNKNOWN
    elif (
        beyond_the_moment is not None
        and case in (WhatIfCase.LINEAR, WhatIfCase.PLACEMENT)
        # (a budget of the activations alone understates only what a larger batch adds)
        and (
            beyond_the_moment not in (WhatIfUnknown.ACTIVATIONS_ONLY, WhatIfUnknown.LARGER_BATCH)
            or (largest is not None and largest > 1)
        )
    ):
        upper_bound, largest, case = bound(largest), None, WhatIfCase.BEYOND_THE_MOMENT
    if case != WhatIfCase.BEYOND_THE_MOMENT:
        beyond_the_moment = None
    by_bytes = None
    if case in (WhatIfCase.LINEAR, WhatIfCase.PLACEMENT) and cache_margin_bytes and capacity_bytes is not None:
        # the cache cuts segments beyond the bytes requested: the scale that surely fits leaves
        # room for them; above it (up to `largest`, by allocated bytes) whether it fits is unknown
        room = capacity_bytes - fixed - cache_margin_bytes
        with_room = (room * 100 // scalable) / 100 if room > 0 else None
        if largest is not None and (with_room is None or with_room < largest):
            by_bytes, largest, case = largest, with_room, WhatIfCase.LINEAR
    peaks = tuple((scale, fixed + math.ceil(scalable * scale)) for scale in SCALES)
    return WhatIf(
        scalable_bytes=scalable,
        fixed_bytes=fixed,
        capacity_bytes=capacity_bytes,
        largest_fitting_scale=largest,
        predicted_peaks=peaks,
        case=case,
        unusable_bytes=unusable,
        projected_states=projected,
        placement_limit_scale=placement_limit,
        calibrated=calibrated,
        request_fixed=bool(request_bytes) and not scales_request,
        rough=largest is not None and largest > SCALES[-1] * 2,
        basis=basis,
        rest_of_pass=rest,
        upper_bound_scale=upper_bound,
        capacity_bound_bytes=capacity_bound,
        capacity_at_most=capacity_at_most and capacity_bytes is not None,
        trains=trains,
        placement_reach_scale=placement_reach,
        cache_margin_bytes=cache_margin_bytes if capacity_bytes is not None else 0,
        by_bytes_scale=by_bytes,
        beyond_the_moment=beyond_the_moment,
    )


def placement_limit(
    request_bytes: int,
    largest_free_block_bytes: int,
    device_free_bytes: int | None,
    large_segment_bytes: int = LARGE_SEGMENT_BYTES,
    holes: Sequence[FreeHole] | None = None,
    shrinking_segments: Sequence[int] = (),
) -> float:
    """The largest scale of the request (in 0.01 steps, below 1) at which it fits the largest usable
    free block, or its cudaMalloc fits free device memory.

    With `holes` (the usable free blocks by what last held them, `analysis.holes`) the scale is the
    batch's: in a run at that scale each block holds what surely remains of it (`FreeHole.at_least`:
    one its batch-sized tensors left behind shrinks with them, one nothing in the trace shows counts
    as none), and free device memory gains what the segments that shrink with the batch
    (`shrinking_segments`, `holes.placement_layout`) are cut smaller by; without, it is the
    request's alone, today's blocks as they are (a chunked request)."""
    for hundredths in range(99, -1, -1):
        scaled = -(-request_bytes * hundredths // 100 // MIN_BLOCK_BYTES) * MIN_BLOCK_BYTES
        device_free = device_free_bytes
        if holes is not None:
            largest_free_block_bytes = max((hole.at_least(hundredths) for hole in holes), default=0)
            if device_free is not None:
                device_free += sum(
                    max(0, size - segment_size(-(-size * hundredths // 100 // MIN_BLOCK_BYTES) * MIN_BLOCK_BYTES))
                    for size in shrinking_segments
                )
        if scaled <= largest_free_block_bytes:
            return hundredths / 100
        if device_free is not None and segment_size(max(scaled, MIN_BLOCK_BYTES), large_segment_bytes) <= device_free:
            return hundredths / 100
    return 0.0


def placement_reach(
    request_bytes: int,
    largest_free_block_bytes: int,
    device_free_bytes: int | None,
    free_cached_bytes: int,
    scalable_bytes: int,
    large_segment_bytes: int = LARGE_SEGMENT_BYTES,
) -> float:
    """The largest scale (in 0.01 steps, below 1) at which the scaled request could find a place at
    all: a pass at that scale holds (1 - scale) of today's `scalable_bytes` fewer at that moment, and
    at most those bytes could join today's largest usable free block, or, with every free cached
    byte released, free device memory for its cudaMalloc. Above it no layout of those bytes makes a
    place; at or below it one may (`placement_limit`, today's layout, says where one surely is)."""
    for hundredths in range(99, -1, -1):
        scaled = -(-request_bytes * hundredths // 100 // MIN_BLOCK_BYTES) * MIN_BLOCK_BYTES
        released = scalable_bytes * (100 - hundredths) // 100
        if scaled <= largest_free_block_bytes + released:
            return hundredths / 100
        if (
            device_free_bytes is not None
            and segment_size(max(scaled, MIN_BLOCK_BYTES), large_segment_bytes)
            <= device_free_bytes + free_cached_bytes + released
        ):
            return hundredths / 100
    return 0.0
