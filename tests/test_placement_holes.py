"""A placement failure's what-if finds a smaller batch's place only where one survives at that batch.

Today's free blocks are what the run's own tensors left behind. Where those tensors grow with the
batch, the blocks are smaller at a smaller batch, as the request is: they are no place for it at any
scale. (`fragmentation-retrieval-class-scores` said a 0.91x batch would fit "with today's free
blocks", its 44 MiB piece left by a 48 MiB score matrix; rehearsed at 0.91x it ran out again, its
largest piece 40.4 MiB for a 43.7 MiB request.) A block left by what does not grow with the batch
(the optimizer step's temporaries) stays a place; one whose last tensor the trace does not show is
no known place.
A segment cut for a batch-sized tensor alone is cut smaller at a smaller batch, and free device
memory gains the rest: there the smaller request's cudaMalloc finds its place.
"""

from __future__ import annotations

from oomdoctor.analysis import analyse
from oomdoctor.analysis.replay import last_occupants
from oomdoctor.analysis.results import WhatIfCase
from oomdoctor.model import DeviceTrace, Frame, TraceEvent
from tests.builders import FOREACH_STACK, SETUP_STACK, MiB, Sim

SCORES = (
    Frame("/usr/lib/python3/site-packages/torch/functional.py", 400, "matmul"),
    Frame("eval.py", 33, "forward"),
    Frame("/usr/lib/python3/site-packages/torch/nn/modules/module.py", 1751, "_wrapped_call_impl"),
    Frame("eval.py", 57, "main"),
)
KEPT = (Frame("eval.py", 34, "forward"), *SCORES[2:])
BATCH = (Frame("eval.py", 55, "main"),)  # queries.to(device), between passes
CAT = (Frame("eval.py", 59, "main"),)


class KeptCache(Sim):
    def release_cache(self) -> None:  # cache the flush cannot return (blocks of split segments)
        pass


def _left_behind(by: str) -> Sim:
    """A forward keeps an 8 MiB result; a 40 MiB tensor made by `by` is freed and stays cached; the
    final concatenation asks for 48 MiB between passes with 8 MiB free on the device: 48 MiB free
    in all, the largest piece 40 MiB."""
    sim = KeptCache(total_bytes=58 * MiB)
    sim.alloc(2 * MiB, SETUP_STACK, "parameter", "encoder.weight")
    if by == "an input of another size":  # the site loaded a batch of another size before
        sim.free(sim.alloc(20 * MiB, BATCH))
        Sim.release_cache(sim)  # (emptied: its segment goes back to the device)
    if by == "the optimizer step":
        sim.marker("optimizer_step", "start")
        sim.free(sim.alloc(40 * MiB, FOREACH_STACK))
        sim.marker("optimizer_step", "end")
    elif by == "an input of another size":
        sim.free(sim.alloc(40 * MiB, BATCH))
    sim.marker("forward", "start")
    if by in ("the forward", "a tensor before the trace"):
        scores = sim.alloc(40 * MiB, SCORES)
    sim.alloc(8 * MiB, KEPT)
    if by in ("the forward", "a tensor before the trace"):
        sim.free(scores)
    sim.marker("forward", "end")
    if by == "a tensor before the trace":
        sim.start_recording()
    sim.oom(48 * MiB, CAT)
    return sim


def test_a_piece_left_by_a_batch_sized_tensor_is_no_place_for_a_smaller_batch():
    analysis = analyse(_left_behind("the forward").snapshot())
    assert analysis.accounting.missing_bytes == 0  # a placement failure: 48 MiB free, 40 MiB the largest piece
    what_if = analysis.what_if
    assert what_if.case == WhatIfCase.PLACEMENT
    # today's 40 MiB piece would take 0.83x of the request; at 0.83x it is 33.2 MiB, the request 39.8 MiB.
    # The 40 MiB segment was cut for the scores alone: at 0.54x it is cut at 22 MiB, and free device
    # memory, 8 MiB + 18 MiB, takes the request's 26 MiB segment; at 0.55x 28 MiB does not fit 26 MiB
    assert what_if.placement_limit_scale == what_if.largest_fitting_scale == 0.54
    assert what_if.fits_at(0.8) is None  # past every known place, within reach: unknown, not "fits"


def test_a_piece_left_by_the_optimizer_step_stays_a_place():
    """Its last tensor is as large at any batch: today's piece takes the scaled request up to 0.83x."""
    what_if = analyse(_left_behind("the optimizer step").snapshot()).what_if
    assert what_if.placement_limit_scale == 0.83
    # (the room for a new segment of each pool leaves 0.60x; up to it the run is said to fit)
    assert what_if.largest_fitting_scale == 0.6 and what_if.fits_at(0.6) is True


def test_a_piece_left_by_an_input_whose_site_made_other_sizes_shrinks_with_the_batch():
    what_if = analyse(_left_behind("an input of another size").snapshot()).what_if
    assert what_if.placement_limit_scale == 0.54


def test_a_piece_whose_last_tensor_the_trace_does_not_show_is_no_known_place():
    """Free since before the trace: it may be as large at another batch, or not. Only the device's
    own free memory (8 MiB: a request of at most 1 MiB, in a 2 MiB segment) is a known place; up to
    where a place could exist at all, whether a scale fits is unknown."""
    what_if = analyse(_left_behind("a tensor before the trace").snapshot()).what_if
    assert what_if.placement_limit_scale == 0.02
    assert what_if.placement_reach_scale is not None and what_if.placement_reach_scale >= 0.83
    assert what_if.fits_at(0.5) is None


def test_what_last_held_a_free_block_is_read_back_piece_by_piece():
    """A block freed and partly taken again leaves the rest of it; two blocks freed side by side
    coalesce; a segment's tail never held has no last holder. Frees cover the rounded request (the
    trace's sizes are the requests, un-rounded)."""
    base = 0x7F0000000000
    events = [
        TraceEvent("segment_alloc", base, 64 * MiB),
        TraceEvent("alloc", base, 48 * MiB - 100),  # 1: rounded to 48 MiB
        TraceEvent("free_completed", base, 48 * MiB - 100),
        TraceEvent("alloc", base, 4 * MiB),  # 3: live at the end
        TraceEvent("alloc", base + 48 * MiB, 6 * MiB),  # 4
        TraceEvent("alloc", base + 54 * MiB, 2 * MiB),  # 5
        TraceEvent("free_completed", base + 48 * MiB, 6 * MiB),
        TraceEvent("free_completed", base + 54 * MiB, 2 * MiB),
    ]
    trace = DeviceTrace.from_events(0, events)
    holes = [(base + 4 * MiB, 44 * MiB), (base + 48 * MiB, 16 * MiB)]
    left_by_one, coalesced = last_occupants(trace, holes, len(events))
    assert left_by_one == ((44 * MiB, 1),)
    assert sorted(coalesced, key=lambda piece: piece[0]) == [(2 * MiB, 5), (6 * MiB, 4), (8 * MiB, None)]
