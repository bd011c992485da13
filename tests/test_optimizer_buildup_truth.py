"""Optimizer state is named the cause of an OOM only where it is what changed: a later step that
fails with state that earlier, completed steps ran with (and fit) failed for what it added itself;
an OOM in the trace's first optimizer step is "the first optimizer.step()" only where no state
predates the trace (a trace that began late counts its steps from 0 too)."""

from __future__ import annotations

from oomdoctor.analysis import analyse
from oomdoctor.analysis.results import SummaryKind
from oomdoctor.views import phrasing
from tests.builders import ADAM_INIT_STACK, BACKWARD_STACK, FOREACH_STACK, FORWARD_STACK, SETUP_STACK, GiB, MiB, Sim


def _steps(activations: list[int], *, state_at: int = 0, last_oom: bool = True):
    """Steps of `activations[i]` 256 MiB blocks each (forward, backward, AdamW step); the optimizer
    state is made in step `state_at`'s optimizer step; the last step runs out in its forward."""
    sim = Sim(total_bytes=12 * GiB + 640 * MiB)
    for _ in range(8):
        sim.alloc(256 * MiB, SETUP_STACK)
    state: list[int] = []
    for number, count in enumerate(activations):
        last = number == len(activations) - 1
        acts = []
        for i in range(count):
            if last and last_oom and i == count - 1:
                sim.oom(256 * MiB, FORWARD_STACK)
                return analyse(sim.snapshot(metadata=False))
            acts.append(sim.alloc(256 * MiB, FORWARD_STACK))
        grads = [sim.alloc(256 * MiB, BACKWARD_STACK) for _ in range(8)]
        for block in acts:
            sim.free(block)
        if number >= state_at and not state:
            state.extend(sim.alloc(256 * MiB, ADAM_INIT_STACK) for _ in range(16))
        for block in [sim.alloc(256 * MiB, FOREACH_STACK) for _ in range(2)]:
            sim.free(block)
        for block in grads:
            sim.free(block)
    return analyse(sim.snapshot(metadata=False))


def test_a_later_step_that_adds_a_little_is_not_blamed_on_state_the_earlier_steps_had():
    """Steps 1-4 fit with the state alive; step 5's batch is 8% longer and runs out: the state is
    not what changed, and the report compares the step with those that fit."""
    analysis = _steps([24] * 5 + [27])
    assert analysis.verdict == "activation-spike"
    assert "optimizer-state-buildup" not in {f.verdict for f in analysis.secondary}
    summary = phrasing.summary(analysis.summary)
    # 6.5 GiB of activations and the 256 MiB the pass still asked for, against step 4's 6 GiB
    assert "1.12x the peak of step" in summary and "which fit" in summary
    assert "needs more than the earlier ones did" in summary


def test_the_step_after_the_state_was_made_is_still_the_state_s():
    """Step 0 made the state; step 1's forward, as large as step 0's, runs out: the state did it."""
    analysis = _steps([24, 24])
    assert analysis.verdict == "optimizer-state-buildup"
    assert analysis.summary.kind == SummaryKind.OPTIMIZER_LATER_STEP
    assert "that step 0, which fit, ran without" in phrasing.summary(analysis.summary)


def test_state_made_late_is_blamed_against_the_steps_that_ran_without_it():
    """State made by step 2's optimizer step (steps 0-2 ran their forward without any): step 3
    runs out with it, and the step named is the latest that ran without it."""
    analysis = _steps([24, 24, 24, 24], state_at=2)
    assert analysis.verdict == "optimizer-state-buildup"
    assert "that step 2, which fit, ran without" in phrasing.summary(analysis.summary)


def _later_optimizer_step_oom(*, recorded_from_start: bool):
    """An OOM in an optimizer step's foreach temporaries, the state made by an earlier step: before
    the trace began, or (recorded from the start) in the trace's own step 0."""
    sim = Sim(total_bytes=12 * GiB)
    for _ in range(8):
        sim.alloc(256 * MiB, SETUP_STACK)
    acts = [sim.alloc(512 * MiB, FORWARD_STACK) for _ in range(4)]
    for block in acts:
        sim.free(block)
    for _ in range(8):
        sim.alloc(256 * MiB, BACKWARD_STACK)
    for _ in range(16):
        sim.alloc(256 * MiB, ADAM_INIT_STACK)
    if not recorded_from_start:
        sim.start_recording()
    acts = [sim.alloc(512 * MiB, FORWARD_STACK) for _ in range(4)]
    for block in acts:
        sim.free(block)
    for _ in range(8):
        sim.alloc(256 * MiB, FOREACH_STACK)
    sim.oom(256 * MiB, FOREACH_STACK)
    return analyse(sim.snapshot(metadata=False))


def test_an_optimizer_step_oom_with_state_from_before_the_trace_is_not_the_first_step():
    analysis = _later_optimizer_step_oom(recorded_from_start=False)
    assert analysis.target_phase == "optimizer_step" and analysis.target_step == 0
    assert analysis.summary.kind != SummaryKind.OPTIMIZER_FIRST_STEP
    summary = phrasing.summary(analysis.summary)
    assert "first optimizer.step()" not in summary
    assert "whose state was made before the trace began" in summary and "temporaries" in summary
    ids = [r.id for r in analysis.recommendations]
    assert "foreach-false" in ids


def test_an_optimizer_step_creating_its_state_is_the_first_even_in_a_wrapped_trace():
    """The ring buffer wrapped inside the run's first optimizer step: part of the state predates
    the trace, and the step is making the rest (lazily, as a first step does)."""
    sim = Sim(total_bytes=12 * GiB)
    for _ in range(8):
        sim.alloc(256 * MiB, SETUP_STACK)
    for _ in range(8):
        sim.alloc(256 * MiB, BACKWARD_STACK)
    for _ in range(6):
        sim.alloc(256 * MiB, ADAM_INIT_STACK)
    sim.start_recording()
    for _ in range(10):
        sim.alloc(256 * MiB, ADAM_INIT_STACK)
    for _ in range(7):
        sim.alloc(256 * MiB, FOREACH_STACK)
    sim.oom(1 * GiB, FOREACH_STACK)
    analysis = analyse(sim.snapshot(metadata=False))
    assert analysis.target_phase == "optimizer_step"
    assert analysis.summary.kind == SummaryKind.OPTIMIZER_FIRST_STEP


def test_a_markers_step_1_with_state_from_before_the_trace_was_made_by_step_0():
    """Markers number the run's steps from the capture's start: at step 1 state from before the
    trace can only be step 0's, whose forward and backward ran without it."""
    sim = Sim(total_bytes=192 * MiB)
    sim.alloc(16 * MiB, SETUP_STACK, component="parameter", name="w")
    sim.marker("forward", "start")
    acts = [sim.alloc(24 * MiB, FORWARD_STACK) for _ in range(4)]
    sim.marker("forward", "end")
    sim.marker("backward", "start")
    for block in acts:
        sim.free(block)
    grad = sim.alloc(16 * MiB, BACKWARD_STACK, component="gradient", name="w.grad")
    sim.marker("backward", "end")
    sim.marker("optimizer_step", "start")
    sim.alloc(16 * MiB, ADAM_INIT_STACK, component="optimizer_state", name="w.exp_avg")
    sim.alloc(16 * MiB, ADAM_INIT_STACK, component="optimizer_state", name="w.exp_avg_sq")
    sim.marker("optimizer_step", "end")
    sim.free(grad)
    sim.start_recording()
    sim.marker("forward", "start")
    for _ in range(4):
        sim.alloc(24 * MiB, FORWARD_STACK)
    sim.oom(64 * MiB, FORWARD_STACK)
    analysis = analyse(sim.snapshot())
    assert analysis.target_step == 1
    assert analysis.verdict == "optimizer-state-buildup"
    assert analysis.summary.kind == SummaryKind.OPTIMIZER_LATER_STEP
    assert "that step 0, which fit, ran without" in phrasing.summary(analysis.summary)
