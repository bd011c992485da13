"""A run that does not train (generation, a forward benchmark) read from frames alone: each forward
pass is its own pass, so the rest of the one the OOM interrupted is extrapolated from the pass
before it (passes._forwards, `each_span`), as it is from the markers of such a run."""

from __future__ import annotations

from oomdoctor.analysis import analyse
from oomdoctor.model import DeviceTrace, Frame, TraceEvent
from oomdoctor.units import MIB as MiB
from oomdoctor.views import phrasing
from tests.builders import BACKWARD_STACK, SETUP_STACK, Sim

MODULE_CALL = Frame("/usr/lib/python3/site-packages/torch/nn/modules/module.py", 1751, "_call_impl")
LOOP = Frame("generate.py", 40, "main")  # `logits = model(tokens)` in the loop
SAMPLE = (Frame("generate.py", 44, "main"),)  # the loop's own code after the pass: sampling


def _layer(op: int) -> tuple[Frame, ...]:
    return (
        Frame("/usr/lib/python3/site-packages/torch/nn/functional.py", 100 + op, "linear"),
        Frame("model.py", 30 + op, "forward"),
        MODULE_CALL,
        LOOP,
    )


def _run(sim: Sim, passes: int, oom_at: int | None) -> None:
    """`passes` forward passes of six 4 MiB allocations each, all kept (grad mode keeps the graph
    of a pass that no backward uses), then sampling in the loop's code; the last pass runs out at
    its `oom_at`th allocation (None: no OOM)."""
    sim.alloc(8 * MiB, SETUP_STACK)  # the model
    for number in range(passes):
        for op in range(6):
            if number == passes - 1 and op == oom_at:
                sim.oom(4 * MiB, _layer(op))
                return
            sim.alloc(4 * MiB, _layer(op))
        sim.alloc(1 * MiB, SAMPLE)


def test_the_rest_of_a_forward_only_pass_comes_from_the_pass_before_it():
    sim = Sim(total_bytes=60 * MiB)
    _run(sim, passes=3, oom_at=2)
    result = analyse(sim.snapshot(metadata=False))
    assert result.target_phase == "forward"
    rest = result.what_if.rest_of_pass
    assert rest is not None and rest.extrapolated, rest
    # the pass before it: 24 MiB of layers and the 1 MiB its loop's code sampled; this one had made
    # 8 MiB when it ran out
    assert rest.size_ratio == 1.0 and rest.projected_pass_bytes == 25 * MiB and rest.pass_bytes == 8 * MiB
    assert not rest.earlier_backward and rest.earlier_kept_bytes == 0
    assert "no earlier completed pass" not in phrasing.what_if_note(result.what_if)


def test_a_training_steps_calls_before_its_backward_stay_one_pass():
    """Counter-example: in a run that trains, two model calls before one backward (a siamese pair)
    are one pass; the second call is not extrapolated from the first."""
    sim = Sim(total_bytes=80 * MiB)
    sim.alloc(8 * MiB, SETUP_STACK)
    for step in range(2):
        kept = []
        for call in range(2):
            for op in range(3):
                if step == 1 and call == 1 and op == 1:
                    sim.oom(4 * MiB, _layer(op))
                    break
                kept.append(sim.alloc(4 * MiB, _layer(op)))
            else:
                sim.alloc(1 * MiB, SAMPLE)  # the pair's loss, outside the model
                continue
            break
        if step == 0:
            for address in reversed(kept):
                sim.free(address)
            sim.free(sim.alloc(2 * MiB, BACKWARD_STACK))
    result = analyse(sim.snapshot(metadata=False))
    rest = result.what_if.rest_of_pass
    assert rest is not None and rest.extrapolated and rest.earlier_backward, rest
    assert rest.earlier_step == 0 and rest.pass_bytes == 17 * MiB


def test_where_the_rest_is_unknown_no_backward_is_said_to_come_in_a_run_that_does_not_train():
    """The earlier passes ran no backward and nothing says the run trains: the interrupted pass's
    rest is the rest of its forward (here its allocations follow no earlier pass: another site)."""
    sim = Sim(total_bytes=60 * MiB)
    _run(sim, passes=2, oom_at=None)
    # the third pass runs out in a module none of the earlier passes called
    sim.oom(16 * MiB, (Frame("head.py", 7, "forward"), MODULE_CALL, LOOP))
    result = analyse(sim.snapshot(metadata=False))
    rest = result.what_if.rest_of_pass
    assert rest is not None and not rest.extrapolated and not rest.earlier_backward, rest
    note = phrasing.what_if_note(result.what_if)
    assert "the rest of the forward still comes" in note and "backward still come" not in note


def test_own_peak_counts_a_reused_address_once_as_kept():
    """A backward that allocates at one address, frees it and allocates there again (a Lightning-style
    closure's step reuses gradient-sized blocks) keeps only the last of them: the pass's kept bytes at
    its peak never exceed the peak. Counting every allocation at a kept address made them larger, and
    the interrupted pass's rest was projected at 0 bytes (peak − kept < 0)."""
    from oomdoctor.analysis.passes import _Pass, _projection

    events = [
        TraceEvent("alloc", 0x1000, 4 * MiB, 0, (), 1),  # the forward's activation
        TraceEvent("alloc", 0x2000, MiB, 0, (), 2),  # the backward: freed at once
        TraceEvent("free_requested", 0x2000, MiB, 0, (), 3),
        TraceEvent("alloc", 0x2000, MiB, 0, (), 4),  # the same address again: kept
        TraceEvent("free_requested", 0x1000, 4 * MiB, 0, (), 5),
        TraceEvent("alloc", 0x3000, MiB, 0, (), 6),  # kept
    ]
    trace = DeviceTrace.from_events(0, events)
    # replayed at its own sizes from its start: what it grew by at its peak, the kept part of it,
    # nothing freed of what came before it, and its own peak
    grown, kept, freed, freed_scaled, peak = _projection(
        trace, _Pass(first_index=0, forward_last=0, last_index=5, step=0), {}, 1.0, 0, {}
    )
    assert (grown, kept, freed, freed_scaled, peak) == (5 * MiB, 0, 0, 0, 5 * MiB)
