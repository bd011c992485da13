"""The steps table does not call what a step held after the OOM, as the exception unwound and freed
its tensors, "at its end": the step never ended (a real DataParallel OOM's trace goes on 174 events
past it, down from 78 GiB to 385 MiB); nor what it held at the OOM, where the trace stops there."""

from __future__ import annotations

from dataclasses import replace

import pytest

from oomdoctor.analysis import analyse
from oomdoctor.model import Annotation
from oomdoctor.views import markdown_report, text_report
from tests.builders import ADAM_INIT_STACK, BACKWARD_STACK, FORWARD_STACK, SETUP_STACK, MiB, Sim


def _oom(unwinds: bool):
    sim = Sim(total_bytes=512 * MiB)
    sim.marker("forward", "start")
    kept = [sim.alloc(100 * MiB, FORWARD_STACK) for _ in range(4)]
    sim.oom(200 * MiB, FORWARD_STACK)
    if unwinds:
        for address in kept:
            sim.free(address)
    return analyse(sim.snapshot(registry=False))


def test_a_step_that_went_on_after_the_oom_says_so():
    analysis = _oom(unwinds=True)
    rows = [line for line in text_report.render(analysis).splitlines() if line.startswith("  step ")]
    assert rows and "after OOM " in rows[-1] and "at its end" not in rows[-1]
    assert " (after the OOM) |" in markdown_report.render(analysis)


def test_a_step_the_oom_cut_short_says_its_last_figure_is_at_the_oom():
    """A trace that stops at the OOM: the step's last event is the OOM, which is not a step's end either."""
    analysis = _oom(unwinds=False)
    rows = [line for line in text_report.render(analysis).splitlines() if line.startswith("  step ")]
    assert rows and "at the OOM" in rows[-1] and "at its end" not in rows[-1]
    assert " (at the OOM) |" in markdown_report.render(analysis)


def _late_trace(*, adam: bool) -> str:
    """Recording begun after the model was made: its parameters predate the trace; one step
    (forward, backward, optimizer step) and the next forward's OOM are traced."""
    sim = Sim()
    for _ in range(4):
        sim.alloc(16 * MiB, SETUP_STACK)
    sim.start_recording()
    activation = sim.alloc(64 * MiB, FORWARD_STACK)
    gradients = [sim.alloc(16 * MiB, BACKWARD_STACK) for _ in range(4)]
    sim.free(activation)
    if adam:  # the first step's state, made in the trace: the trace holds the run's first step
        for _ in range(8):
            sim.alloc(16 * MiB, ADAM_INIT_STACK)
    for block in gradients:
        sim.free(block)
    sim.alloc(64 * MiB, FORWARD_STACK)
    sim.oom(2 << 30, FORWARD_STACK)
    return text_report.render(analyse(sim.snapshot(metadata=False)))


def test_a_trace_begun_after_the_model_counts_its_steps_as_its_own():
    """A trace begun after the model was made, with an optimizer that makes no state (plain SGD,
    or state read as another kind): nothing shows how many steps ran before it, so its step is the
    trace's (the header said "step 1", a run's step, of a run that had trained for one before)."""
    report = _late_trace(adam=False)
    assert "(step 1 of the trace, forward" in report
    assert "how many steps ran before the trace" in report
    made_state = _late_trace(adam=True)  # the trace's optimizer step made the state: the run's first
    assert "(step 1, forward" in made_state
    assert "how many steps ran before the trace" not in made_state


def test_what_follows_an_optimizer_step_s_window_up_to_the_next_allocation_is_between_steps():
    """A loop that frees the step's outputs and empties the cache after zero_grad (del loss;
    torch.cuda.empty_cache()): those events lie after the zero_grad window, in the piece of the
    optimizer step's last allocation, and took its phase back: an 'optimizer_step' span of frees
    after zero_grad (and, where the step allocated nothing, a 'backward' one)."""
    sim = Sim()
    sim.alloc(64 * MiB, SETUP_STACK)
    kept = sim.alloc(8 * MiB, FORWARD_STACK)  # the logits the loop keeps until it deletes them
    grads = [sim.alloc(16 * MiB, BACKWARD_STACK)]
    step_start = sim._tick()
    sim.free(sim.alloc(16 * MiB, ADAM_INIT_STACK))
    step_end = sim._tick()
    zero_start = sim._tick()
    for block in grads:
        sim.free(block)
    zero_end = sim._tick()
    sim.free(kept)  # del logits, loss
    sim.release_cache()  # torch.cuda.empty_cache()
    sim.alloc(8 * MiB, FORWARD_STACK)
    annotations = (
        Annotation("Optimizer.step#Adam.step", "START", 0, step_start),
        Annotation("Optimizer.step#Adam.step", "END", 0, step_end),
        Annotation("Optimizer.zero_grad#Adam.zero_grad", "START", 0, zero_start),
        Annotation("Optimizer.zero_grad#Adam.zero_grad", "END", 0, zero_end),
    )
    analysis = analyse(replace(sim.snapshot(metadata=False), annotations=annotations))
    phases = [s.phase for s in analysis.phases]
    zero_grad = phases.index("zero_grad")
    assert phases[zero_grad + 1] == "between_steps"
    assert "optimizer_step" not in phases[zero_grad:]


@pytest.mark.parametrize("allocates", [False, True])
def test_a_dump_after_the_run_s_last_optimizer_step_lies_in_the_next_step(allocates: bool):
    """A dump written on demand after the last step of a run (SGD whose step allocates nothing, or
    Adam whose step makes its temporaries), with only zero_grad's frees and an empty_cache after
    that optimizer step: the step was completed, so the dump lies in the next one (the run has
    completed one step); it was counted into the step it followed, as if the trace had stopped
    inside it."""
    sim = Sim()
    sim.alloc(64 * MiB, SETUP_STACK)
    activation = sim.alloc(32 * MiB, FORWARD_STACK)
    grads = [sim.alloc(16 * MiB, BACKWARD_STACK)]
    sim.free(activation)
    step_start = sim._tick()
    if allocates:
        sim.free(sim.alloc(16 * MiB, ADAM_INIT_STACK))
    step_end = sim._tick()
    zero_start = sim._tick()
    for block in grads:
        sim.free(block)
    zero_end = sim._tick()
    sim.release_cache()
    annotations = (
        Annotation("Optimizer.step#SGD.step", "START", 0, step_start),
        Annotation("Optimizer.step#SGD.step", "END", 0, step_end),
        Annotation("Optimizer.zero_grad#SGD.zero_grad", "START", 0, zero_start),
        Annotation("Optimizer.zero_grad#SGD.zero_grad", "END", 0, zero_end),
    )
    analysis = analyse(replace(sim.snapshot(metadata=False), annotations=annotations))
    assert analysis.phases[-1].step == 1
    assert [s.phase for s in analysis.phases if s.step == 1][0] == "zero_grad"
    assert {s.step for s in analysis.phases if s.phase in ("forward", "backward")} == {0}
