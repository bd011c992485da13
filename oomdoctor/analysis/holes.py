"""The free blocks a failed request could have been placed in, by what last held them.

A placement failure's what-if asks where a smaller batch's request would find a place. Today's free
blocks are what the run's own tensors left behind: a block whose last tensors grow with the batch is
smaller in a run with a smaller batch, as the request is, so it is no more a place for the scaled
request than it was for today's. Each free block is read back to the allocations that last held it
(`replay.last_occupants`), and its bytes are told apart by them: bytes last held by an allocation
that grows with the batch, bytes last held by one that does not, and bytes whose last holder the
trace does not show (free since before the trace, or never held), of which nothing is known.

An allocation grows with the batch as a live block does (`whatif.scalable_bytes`): made in a forward
or backward (activations and their temporaries), except in backward one exactly a live parameter's
size (a gradient, as `whatif.request_scales` reads the failed request); or, made elsewhere (between
steps: inputs, or other), where its site made allocations of different sizes in the trace (a batch
that changes size). One made in the optimizer step or zero_grad does not (model states and their
temporaries); another made elsewhere at a site of one size only is not known to.

Where the smaller request's cudaMalloc finds its place instead, free device memory at that batch is
today's and what each segment cut for batch-sized tensors alone is cut smaller by. That is an
estimate as the what-if's scale is: a run at another batch may lay its blocks out otherwise (one
more segment kept, say). Rehearsed, `accumulation-optimizer-state-gpt-adamw` said to fit up to
0.87x of its batch 16, fitted at 13 and ran out at 14, keeping ten segments of 14 MiB where the
batch of 16 kept nine of 16 MiB.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from oomdoctor.analysis.accounting import pool_label
from oomdoctor.analysis.passes import site_key
from oomdoctor.analysis.phases import PhaseIndex
from oomdoctor.analysis.replay import MAX_OCCUPANT_WALK, last_occupants
from oomdoctor.analysis.results import (
    FORWARD_PASSES,
    PHASE_BACKWARD,
    PHASE_OPTIMIZER,
    PHASE_ZERO_GRAD,
    FreeHole,
    LiveBlock,
)
from oomdoctor.analysis.sizing import LARGE_SEGMENT_BYTES, MIN_LARGE_ALLOC_BYTES, SMALL_REQUEST_BYTES, round_size
from oomdoctor.analysis.whatif import scalable_bytes
from oomdoctor.model import ALLOC, INACTIVE, DeviceTrace, Segment
from oomdoctor.vocabulary import Component

FIXED_PHASES = frozenset({PHASE_OPTIMIZER, PHASE_ZERO_GRAD})


def placement_layout(
    trace: DeviceTrace,
    phases: PhaseIndex,
    layout: Sequence[Segment],
    *,
    request_pool: str | None,
    request_stream: int | None,
    target_index: int,
    min_bytes: int,
    live_blocks: Iterable[LiveBlock] = (),
    large_segment_bytes: int = LARGE_SEGMENT_BYTES,
    divisions: tuple[tuple[int, int], ...] = (),
) -> tuple[tuple[FreeHole, ...], tuple[int, ...]]:
    """The free blocks at the target on the failed request's pool (and stream), of at least
    `min_bytes` (smaller ones place no scale of the request), each by what last held it; and the
    sizes of the segments that shrink with the batch: each cut for a request of its own (larger
    than the allocator's standard segments, which are as large at any batch), every byte of it held
    by a live block that grows with the batch (`whatif.scalable_bytes`) or free and last held by an
    allocation that did. A run at a smaller batch cuts it smaller, and leaves the rest of it free
    on the device."""
    live = list(live_blocks)
    growing = {b.address for b in live if scalable_bytes((b,))}
    usable = {
        (block.address, block.size)
        for segment in layout
        if pool_label(segment) == request_pool and (request_stream is None or segment.stream == request_stream)
        for block in segment.blocks
        if block.state == INACTIVE and block.size >= min_bytes
    }
    cut_alone = [
        segment
        for segment in layout
        if segment.total_size >= MIN_LARGE_ALLOC_BYTES
        and segment.total_size != large_segment_bytes
        and not segment.is_expandable
        and all(block.state == INACTIVE or block.address in growing for block in segment.blocks)
    ]
    wanted = sorted(usable | {(b.address, b.size) for s in cut_alone for b in s.blocks if b.state == INACTIVE})
    if not wanted:
        return (), ()
    parameter_sizes = {b.size_bytes for b in live if b.component == Component.PARAMETERS}
    sizes_at: dict[object, set[int]] | None = None  # site -> the sizes it allocated, read when first needed

    def grows(alloc_index: int) -> bool | None:
        nonlocal sizes_at
        span = phases.span_of(alloc_index)
        phase = span.phase if span is not None else None
        if phase in FORWARD_PASSES:
            return True
        if phase == PHASE_BACKWARD:
            return round_size(trace.sizes[alloc_index], divisions) not in parameter_sizes
        if phase in FIXED_PHASES:
            return False
        site = site_key(trace.frames_at(alloc_index))
        if site is None:
            return None
        if sizes_at is None:
            sizes_at = _site_sizes(trace, target_index)
        return True if len(sizes_at.get(site, ())) > 1 else None

    holes = {}
    for (address, size), pieces in zip(
        wanted, last_occupants(trace, wanted, target_index, divisions=divisions), strict=True
    ):
        scaled = fixed = 0
        for nbytes, alloc_index in pieces:
            verdict = grows(alloc_index) if alloc_index is not None else None
            if verdict is True:
                scaled += nbytes
            elif verdict is False:
                fixed += nbytes
        holes[address] = FreeHole(address, size, scaled, fixed)
    # (a free block's bytes no shown allocation held, up to the largest remainder the allocator leaves
    # unsplit in a block, may be such a remainder of what it shows)
    shrinking = tuple(
        segment.total_size
        for segment in cut_alone
        if all(
            block.state != INACTIVE
            or (
                holes[block.address].fixed_bytes == 0
                and block.size - holes[block.address].scaled_bytes <= SMALL_REQUEST_BYTES
            )
            for block in segment.blocks
        )
    )
    return tuple(holes[address] for address, size in wanted if (address, size) in usable), shrinking


def _site_sizes(trace: DeviceTrace, before: int) -> dict[object, set[int]]:
    """Each site's allocation sizes, over the events `replay.last_occupants` walks back over."""
    indices = trace.positions_in(ALLOC, max(0, before - MAX_OCCUPANT_WALK), before)
    numbers, stacks = trace.stacks_at(indices)
    key_of = {number: site_key(frames) for number, frames in stacks.items()}
    sizes: dict[object, set[int]] = {}
    for index, number in zip(indices, numbers, strict=True):
        key = key_of[number]
        if key is not None:
            sizes.setdefault(key, set()).add(trace.sizes[index])
    return sizes
