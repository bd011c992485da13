"""Gradients alive across backwards are 'kept' for certain only where an optimizer step shows
since they were made (its allocations' frames, its annotations, or a markers step past 0, which
counts completed optimizer steps). Without one, an optimizer that allocates nothing in its step (a
fused Adam, SGD's in-place momentum) may be accumulating them over micro-batches on purpose: the
finding says so, at a lower confidence, instead of telling such a run its gradients are not needed."""

from __future__ import annotations

from oomdoctor.analysis import analyse
from oomdoctor.model import Frame
from oomdoctor.views import phrasing
from tests.builders import ADAM_INIT_STACK, FOREACH_STACK, FORWARD_STACK, SETUP_STACK, GiB, MiB, Sim

TORCH = "/usr/lib/python3/site-packages/torch/"
BACKWARD_STACK = (
    Frame(TORCH + "autograd/graph.py", 825, "_engine_run_backward"),
    Frame(TORCH + "autograd/__init__.py", 347, "backward"),
    Frame("train.py", 42, "train_step"),
)


def _micro_batches(*, optimizer_step_seen: bool, oom_before_forward: bool = False):
    """AdamW state from an earlier step, then two micro-batches' forward and backward (the first
    makes the gradients, the second adds into them), and a third forward that runs out. With
    `optimizer_step_seen` an optimizer step that allocates runs after the second backward."""
    sim = Sim(total_bytes=16 * GiB)
    for _ in range(8):
        sim.alloc(256 * MiB, SETUP_STACK)
    for _ in range(16):
        sim.alloc(256 * MiB, ADAM_INIT_STACK)
    sim.start_recording()
    for micro in range(2):
        acts = [sim.alloc(1 * GiB, FORWARD_STACK) for _ in range(6)]
        for block in acts:
            sim.free(block)
        for _ in range(8):
            grad = sim.alloc(256 * MiB, BACKWARD_STACK)
            if micro:
                sim.free(grad)  # added into the .grad the first made
    if optimizer_step_seen:
        sim.free(sim.alloc(256 * MiB, FOREACH_STACK))
    if oom_before_forward:  # the next batch, moved to the GPU by the loop's own line, runs out
        sim.alloc(6 * GiB + 512 * MiB, (Frame("train.py", 36, "train_step"),))
        sim.oom(2 * GiB, (Frame("train.py", 37, "train_step"),))
        return analyse(sim.snapshot(metadata=False))
    for _ in range(7):
        sim.alloc(1 * GiB, FORWARD_STACK)
    sim.oom(1 * GiB, FORWARD_STACK)
    return analyse(sim.snapshot(metadata=False))


def test_gradients_kept_without_an_optimizer_step_in_sight_may_be_accumulated():
    analysis = _micro_batches(optimizer_step_seen=False)
    assert analysis.verdict == "gradients-kept"
    assert analysis.confidence == 0.5
    assert "unless the run accumulates them on purpose" in phrasing.summary(analysis.summary)


def test_gradients_kept_past_an_optimizer_step_are_stale():
    analysis = _micro_batches(optimizer_step_seen=True)
    assert analysis.verdict == "gradients-kept"
    assert analysis.confidence > 0.5
    assert "accumulates" not in phrasing.summary(analysis.summary)


def test_zero_grad_is_not_said_to_fit_where_the_gradients_may_be_accumulated():
    accumulating = _micro_batches(optimizer_step_seen=False, oom_before_forward=True)
    stale = _micro_batches(optimizer_step_seen=True, oom_before_forward=True)
    assert accumulating.verdict == stale.verdict == "gradients-kept"
    fits = {r.id: r.would_fit_alone for r in accumulating.recommendations}
    assert "zero-grad-set-to-none" in fits and fits["zero-grad-set-to-none"] is None
    assert {r.id: r.would_fit_alone for r in stale.recommendations}["zero-grad-set-to-none"] is not None
