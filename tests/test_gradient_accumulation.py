"""Gradients alive across backwards are 'kept' for certain only where an optimizer step shows
since they were made (its allocations' frames, its annotations, or a markers step past 0, which
counts completed optimizer steps). Without one, an optimizer that allocates nothing in its step (a
fused Adam, SGD's in-place momentum) may be accumulating them over micro-batches on purpose: the
finding says so, at a lower confidence, instead of telling such a run its gradients are not needed.

A plain trace numbers its steps by what it shows: where no optimizer step shows and a backward's
gradients stay alive into the next pass (AccumulateGrad adds into them in place), the next pass is
counted in the same step, as a micro-batch is, and the report says the number is the least the
trace shows (the passes may be steps of an optimizer that records nothing); where the gradients
are freed before the next backward, the pass began a step."""

from __future__ import annotations

from oomdoctor.analysis import analyse
from oomdoctor.analysis.results import UnknownKind
from oomdoctor.model import Frame
from oomdoctor.views import phrasing
from oomdoctor.views.report_rows import target_context
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
    """No optimizer step shows: the three passes are counted as one step (the gradients the first
    made stay alive through the others), and the gradients of the earlier passes are kept only if
    those were steps, which the file cannot tell: the finding says so, at a lower confidence, after
    the activations' spike, which holds either way. The state made before the trace ran through two
    whole passes that fit: it is not what ran out."""
    analysis = _micro_batches(optimizer_step_seen=False)
    assert (analysis.verdict, analysis.target_step) == ("activation-spike", 0)
    kept = next(f for f in analysis.secondary if f.verdict == "gradients-kept")
    assert kept.confidence == 0.5
    assert "from earlier passes" in phrasing.summary(kept.summary)
    assert "unless the run accumulates them on purpose" in phrasing.summary(kept.summary)
    assert "optimizer-state-buildup" not in {f.verdict for f in analysis.secondary}


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


def _first_step_micro_batches(*, zero_grad: str | None = None):
    """A plain trace from the model's creation (no optimizer state yet): two micro-batches, the
    first backward making the gradients, the second adding into them in place (its gradients made
    and freed), and the second backward runs out, before any optimizer step. With `zero_grad`
    ("before" or "after" the second forward) the loop's own code frees the first backward's
    gradients (`p.grad = None`): the second pass began a step."""
    sim = Sim(total_bytes=4 * GiB)
    for _ in range(4):
        sim.alloc(64 * MiB, SETUP_STACK)
    grads: list[int] = []
    for micro in range(2):
        if micro and zero_grad == "before":
            for block in grads:
                sim.free(block, (Frame("train.py", 30, "train_step"),))
        acts = [sim.alloc(512 * MiB, FORWARD_STACK) for _ in range(4)]
        if micro and zero_grad == "after":
            for block in grads:
                sim.free(block, (Frame("train.py", 33, "train_step"),))
        for block in acts[1:] if micro else acts:
            sim.free(block)
        if micro:
            sim.alloc(128 * MiB, BACKWARD_STACK)
            sim.oom(1 * GiB, BACKWARD_STACK)
            break
        grads = [sim.alloc(64 * MiB, BACKWARD_STACK) for _ in range(4)]
        for _ in range(4):  # the second micro-batch's would be added into these
            sim.free(sim.alloc(64 * MiB, BACKWARD_STACK))
    return analyse(sim.snapshot(metadata=False))


def test_micro_batches_before_any_optimizer_step_are_not_counted_as_steps():
    """The first micro-batch's gradients, alive in the second one's backward, were an earlier
    step's by the old reading (each backward ended a step where the optimizer allocates nothing):
    'step 1', and a verdict of gradients kept. Nothing shows a step ended: it is step 0, at least."""
    analysis = _first_step_micro_batches()
    assert (analysis.target_phase, analysis.target_step) == ("backward", 0)
    assert analysis.verdict != "gradients-kept"
    assert [u.count for u in analysis.unknowns if u.kind == UnknownKind.PASSES_MAY_BE_STEPS] == [1]
    assert "(step 0 or later, backward" in target_context(analysis)
    kept = [f for f in analysis.secondary if f.verdict == "gradients-kept"]
    assert [f.confidence for f in kept] == [0.5]
    assert "micro-batches of this step, or steps of their own" in phrasing.summary(kept[0].summary)


def test_gradients_freed_before_the_next_backward_end_the_step():
    """The loop freed the first backward's gradients (set to None, by its own code) before the next
    forward or after it: the next pass began a step, as a zero_grad shows, and nothing is unknown."""
    for zero_grad in ("before", "after"):
        analysis = _first_step_micro_batches(zero_grad=zero_grad)
        assert (analysis.target_phase, analysis.target_step) == ("backward", 1), zero_grad
        assert UnknownKind.PASSES_MAY_BE_STEPS not in {u.kind for u in analysis.unknowns}
        assert "or later" not in target_context(analysis)


ZERO_GRAD_STACK = (Frame(TORCH + "optim/optimizer.py", 990, "zero_grad"), Frame("train.py", 45, "train_step"))


def test_micro_batches_between_the_zero_grads_a_trace_shows_are_not_unknown():
    """An optimizer that records nothing of its step (SGD in place, torch < 2.5), and a zero_grad
    that frees the gradients after every second pass: the loop frees them each step, so the pass
    they stay alive into is a micro-batch of the same step. The steps are the zero_grads', and
    nothing is said to be a lower bound, nor are the first micro-batch's gradients kept."""
    sim = Sim(total_bytes=4 * GiB)
    for _ in range(4):
        sim.alloc(64 * MiB, SETUP_STACK)
    for step in range(2):
        grads: list[int] = []
        for micro in range(2):
            acts = [sim.alloc(256 * MiB, FORWARD_STACK) for _ in range(4)]
            if step and micro:  # the second step's second micro-batch runs out in its backward
                sim.oom(2 * GiB, BACKWARD_STACK)
                break
            for block in acts:
                sim.free(block)
            for _ in range(4):
                made = sim.alloc(64 * MiB, BACKWARD_STACK)
                if micro:
                    sim.free(made)  # added into the first micro-batch's
                else:
                    grads.append(made)
        else:
            for block in grads:
                sim.free(block, ZERO_GRAD_STACK)
    analysis = analyse(sim.snapshot(metadata=False))
    assert (analysis.target_phase, analysis.target_step) == ("backward", 1)
    assert UnknownKind.PASSES_MAY_BE_STEPS not in {u.kind for u in analysis.unknowns}
    assert "gradients-kept" not in {analysis.verdict, *(f.verdict for f in analysis.secondary)}
