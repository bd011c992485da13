"""A free event's stack is the stack of the allocation it frees only when the history was recorded
with `context="alloc"`; with `context="all"` (torch's default) it is the stack of the code that
freed the block. A block from before the trace that the trace frees is placed by that stack only
in the first case; in the second by what the trace does to it (freed in a backward: a saved
activation), never as what its free site's frames would make it (autograd's frames: a gradient)."""

from __future__ import annotations

from dataclasses import replace

from oomdoctor.analysis import analyse
from oomdoctor.analysis.attribution import frees_carry_alloc_stacks
from oomdoctor.metadata import COMPONENTS
from oomdoctor.model import FREE_COMPLETED, FREE_REQUESTED, DeviceTrace, Frame
from tests.builders import BACKWARD_STACK, FORWARD_STACK, SETUP_STACK, GiB, MiB, Sim

GRADIENTS, ACTIVATIONS = COMPONENTS.index("gradients"), COMPONENTS.index("activations")
LOSS_STACK = (Frame("train.py", 40, "train_step"),)


def _run(*, free_site: bool):
    """Weights, a forward recorded only in part (its first saved activations predate the trace),
    then the backward that frees them, and an OOM in the backward. With `free_site` the free events
    carry the stack of the backward that freed the blocks, as context="all" records them; else the
    stack of their allocation, as context="alloc" does."""
    sim = Sim(total_bytes=4 * GiB)
    for _ in range(4):
        sim.alloc(64 * MiB, SETUP_STACK)
    saved = [sim.alloc(256 * MiB, FORWARD_STACK) for _ in range(4)]  # before the trace
    sim.start_recording()
    later = [sim.alloc(256 * MiB, FORWARD_STACK) for _ in range(2)]
    loss = sim.alloc(4 * MiB, LOSS_STACK)
    sim.free(loss)
    for block in saved + later:
        sim.alloc(64 * MiB, BACKWARD_STACK)
        sim.free(block)
    sim.oom(2 * GiB, BACKWARD_STACK)
    events = sim.events
    if free_site:
        events = [
            replace(e, frames=BACKWARD_STACK)
            if e.action in (FREE_REQUESTED, FREE_COMPLETED) and e.size > 8 * MiB
            else e
            for e in events
        ]
    sim.events = events
    return sim


def test_a_free_s_stack_is_the_free_site_unless_every_pair_shows_the_alloc_s():
    alloc_context = _run(free_site=False)
    all_context = _run(free_site=True)
    assert frees_carry_alloc_stacks(DeviceTrace.from_events(0, tuple(alloc_context.events)))
    assert not frees_carry_alloc_stacks(DeviceTrace.from_events(0, tuple(all_context.events)))
    no_pairs = [e for e in alloc_context.events if e.action != "alloc"]
    assert not frees_carry_alloc_stacks(DeviceTrace.from_events(0, tuple(no_pairs)))


def test_saved_activations_freed_by_the_backward_are_not_read_as_gradients():
    """Their free events carry autograd's frames (context="all"): read as the blocks' own stacks,
    they made 1 GiB of 'gradients' from before the trace; by their fate they are activations."""
    for free_site in (True, False):  # context="alloc": the frees carry the forward's stack
        sim = _run(free_site=free_site)
        analysis = analyse(sim.snapshot(metadata=False))
        first = analysis.replay.series[0].components
        assert first[GRADIENTS] < 256 * MiB
        assert first[ACTIVATIONS] >= 4 * 256 * MiB


def test_pairs_whose_allocation_has_no_stack_tell_nothing():
    """The autograd engine's allocations carry no stack (stacks="python"), and under context="all"
    their frees carry none either: such pairs match under both settings, so only pairs with an
    allocation stack decide."""
    sim = Sim(total_bytes=4 * GiB)
    for _ in range(8):
        sim.free(sim.alloc(16 * MiB))  # the engine's: no stack on either
    block = sim.alloc(16 * MiB, FORWARD_STACK)
    sim.free(block)
    events = [
        replace(e, frames=BACKWARD_STACK) if e.action == FREE_REQUESTED and e.frames == FORWARD_STACK else e
        for e in sim.events
    ]
    assert not frees_carry_alloc_stacks(DeviceTrace.from_events(0, tuple(events)))
    engine_only = [e for e in sim.events if not e.frames]
    assert not frees_carry_alloc_stacks(DeviceTrace.from_events(0, tuple(engine_only)))
