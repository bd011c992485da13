"""A forward-only loop with grad mode on that keeps every pass's graph (`total += loss`) runs out
later with a smaller batch, not never: each pass still to come adds a graph, and how many come the
file does not say, so halving the batch is not said to fit. Where one earlier pass's graph is alive (a
benchmark whose output lives until the next forward replaces it), halving is judged as before.
Rehearsed: the CNN evaluation of inference-with-grad-cnn (8 batches of 16, losses summed as
tensors, 110 MiB) said 'Halve the batch ... would fit on its own'; at 8 it runs out too."""

from __future__ import annotations

from oomdoctor.analysis import analyse
from tests.builders import FORWARD_STACK, SETUP_STACK, MiB, Sim


def _forward_loop(*, passes: int, total_mib: int, tensor_mib: int = 4):
    """A 16 MiB model; passes of eight tensors (4 MiB unless said), all kept (grad mode): every pass's graph
    stays. The last of `passes` runs out after four of its tensors."""
    sim = Sim(total_bytes=total_mib * MiB)
    sim.alloc(16 * MiB, SETUP_STACK, component="parameter", name="w")
    for index in range(passes):
        sim.marker("forward", "start")
        made = []
        for op in range(8):
            if index == passes - 1 and op == 4:
                sim.oom(tensor_mib * MiB, FORWARD_STACK)
                return analyse(sim.snapshot())
            made.append(sim.alloc(tensor_mib * MiB, FORWARD_STACK, component="activation"))
        sim.marker("forward", "end")
        assert made
    raise AssertionError("no OOM")


def _halving(analysis):
    return next(r for r in analysis.recommendations if r.id == "smaller-batch")


def test_every_pass_s_graph_kept_halving_is_not_said_to_fit():
    analysis = _forward_loop(passes=5, total_mib=160)  # four earlier graphs alive, 128 MiB
    assert analysis.verdict == "inference-with-grad"
    # at the instant's pass, half would fit (0.5x is within the moment's bound) ...
    assert analysis.what_if.upper_bound_scale is not None and analysis.what_if.upper_bound_scale >= 0.5
    assert analysis.what_if.fits_at(0.5) is None  # ... but more passes may come: no scale is said to fit
    assert _halving(analysis).would_fit_alone is None


def test_one_earlier_graph_halving_is_judged():
    # the second pass of a benchmark whose output lives until the next forward has finished: one
    # earlier graph, which the next pass replaces
    # (of 8 MiB tensors on 112 MiB: the halved pass leaves room for a new segment of each pool, 22 MiB)
    analysis = _forward_loop(passes=2, total_mib=112, tensor_mib=8)
    assert analysis.verdict == "inference-with-grad"
    assert _halving(analysis).would_fit_alone is True
