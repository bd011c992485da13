"""A history recorded with context="state" (the legacy `_record_memory_history(True, ...)`'s default)
keeps no stack on its trace entries, while the dump's blocks keep the stack they were made with.
An allocation the trace shows and that is still that block at the dump is placed by the block's
stack; with no phases at all, activations that fill memory are still said to, at a low confidence."""

from __future__ import annotations

from dataclasses import replace

import pytest

from oomdoctor.analysis import analyse
from oomdoctor.model import NO_STACK, Annotation
from oomdoctor.views import markdown_report, phrasing, text_report
from tests.builders import ADAM_INIT_STACK, FOREACH_STACK, FORWARD_STACK, SETUP_STACK, GiB, MiB, Sim


def _forward_oom(*, stacks_on_trace: bool):
    sim = Sim(total_bytes=4 * GiB)
    for _ in range(4):
        sim.alloc(64 * MiB, SETUP_STACK)
    for _ in range(12):
        sim.alloc(256 * MiB, FORWARD_STACK)
    sim.oom(1 * GiB, FORWARD_STACK)
    if not stacks_on_trace:
        sim.events = [replace(e, frames=NO_STACK) for e in sim.events]
    return analyse(sim.snapshot(metadata=False))


def test_blocks_keep_the_stack_the_trace_did_not_record():
    analysis = _forward_oom(stacks_on_trace=False)
    assert analysis.target_phase == "unknown"
    components = {c.name: c.bytes for c in analysis.components if c.bytes}
    assert components.get("activations") == 12 * 256 * MiB
    assert components.get("parameters") == 4 * 64 * MiB
    assert analysis.verdict == "activation-spike"
    assert analysis.confidence == 0.4
    assert "placed by their blocks' own stacks" in phrasing.summary(analysis.summary)


def test_with_stacks_on_the_trace_the_phase_decides_as_before():
    analysis = _forward_oom(stacks_on_trace=True)
    assert analysis.target_phase == "forward"
    assert analysis.verdict == "activation-spike" and analysis.confidence == 0.6


def _first_adam_step_recorded_with_context_state() -> Sim:
    """An MLP's first Adam step recorded from the start with context="state": the trace carries no
    stacks; the blocks keep theirs, but the gradients have none (the autograd engine's thread makes
    them without Python frames). The optimizer step is marked by its profiler annotation."""
    sim = Sim(total_bytes=4 * GiB)
    shapes = (64, 64, 16, 1)
    for size in shapes:
        sim.alloc(size * MiB, SETUP_STACK)
    sim.free(sim.alloc(32 * MiB, FORWARD_STACK))
    for size in shapes:
        sim.alloc(size * MiB)  # the gradients
    sim.step_start = sim._tick()
    for size in shapes:
        for _ in range(2):
            sim.alloc(size * MiB, ADAM_INIT_STACK)
    sim.oom(1 * GiB, FOREACH_STACK)
    sim.events = [replace(e, frames=NO_STACK) for e in sim.events]
    return sim


def test_frameless_copies_of_framed_weights_in_a_traced_training_run_are_gradients():
    """With context="state" the trace cannot tell the phases before the optimizer step: the
    gradients (blocks of the weights' shapes without any frame) were unknown, and the summary said
    "0 bytes of gradients" of a run holding 145 MiB of them."""
    sim = _first_adam_step_recorded_with_context_state()
    base = sim.snapshot(metadata=False)
    annotations = (
        Annotation("Optimizer.step#Adam.step", "START", 0, sim.step_start),
        Annotation("Optimizer.step#Adam.step", "END", 0, sim._tick()),
    )
    analysis = analyse(replace(base, annotations=annotations))
    assert analysis.target_phase == "optimizer_step"
    components = analysis.component_bytes()
    assert components["parameters"] == 145 * MiB
    assert components["gradients"] == 145 * MiB
    assert components["optimizer_state"] == 290 * MiB
    assert components["unknown"] == 0

    untrained = analyse(base)  # nothing in the trace shows training: the frame-less blocks stay unknown
    assert untrained.component_bytes()["gradients"] == 0


def test_a_ring_buffer_that_wrapped_in_the_backward_begins_with_gradients_not_parameters():
    """max_entries small enough that the trace begins inside the backward: its first allocations
    are the engine's gradients, without frames, which no phase names (before the first step). They
    were parameters by their weights' shapes (parameters twice their size, and a false
    model-states-too-large); beside weights whose frames made them, in a run that trains, they are
    gradients."""
    sim = Sim(total_bytes=700 * MiB)
    shapes = (64, 64, 16, 1)
    for size in shapes:
        sim.alloc(size * MiB, SETUP_STACK)
    sim.start_recording()
    for size in shapes:
        sim.alloc(size * MiB)  # the gradients, made by the engine's thread
    for size in shapes:
        for _ in range(2):
            sim.alloc(size * MiB, ADAM_INIT_STACK)
    sim.oom(200 * MiB, FOREACH_STACK)
    analysis = analyse(sim.snapshot(metadata=False))
    components = analysis.component_bytes()
    assert components["parameters"] == 145 * MiB
    assert components["gradients"] == 145 * MiB
    assert analysis.verdict != "model-states-too-large"


@pytest.mark.parametrize("momentum", [True, False])
def test_a_trace_without_stacks_counts_the_steps_its_optimizer_annotations_end(momentum):
    """context="state": no trace entry names a phase, but each optimizer step's annotation ends a
    step. Two SGD steps (with momentum the first makes its buffers, the second allocates nothing;
    plain SGD allocates nothing in either) and an OOM in the third forward: the OOM is step 2's (it
    was step 0: no step was counted without named allocations; without momentum, no phase at all
    and no step)."""
    sim = Sim(total_bytes=4 * GiB)
    for _ in range(4):
        sim.alloc(64 * MiB, SETUP_STACK)
    windows = []
    momentum = not momentum  # made already: the steps allocate nothing
    for _ in range(2):
        activations = [sim.alloc(128 * MiB, FORWARD_STACK) for _ in range(2)]
        for block in activations:
            sim.free(block)
        start = sim._tick()
        if not momentum:  # the first step makes the momentum buffers; the next allocates nothing
            for _ in range(4):
                sim.alloc(64 * MiB, FOREACH_STACK)
            momentum = True
        windows.append((start, sim._tick()))
    for _ in range(12):
        sim.alloc(256 * MiB, FORWARD_STACK)
    sim.oom(1 * GiB, FORWARD_STACK)
    sim.events = [replace(e, frames=NO_STACK) for e in sim.events]
    annotations = tuple(
        Annotation("Optimizer.step#SGD.step", stage, 0, time)
        for start, end in windows
        for stage, time in (("START", start), ("END", end))
    )
    analysis = analyse(replace(sim.snapshot(metadata=False), annotations=annotations))
    assert analysis.target_step == 2
    assert [s.step for s in analysis.steps] == [0, 1, 2]
    # no span is a forward pass: each step's activations peak is unknown, not 0 bytes (step 2
    # holds 3 GiB of activations by the blocks' own stacks)
    assert all(s.peak_activation_bytes is None for s in analysis.steps)
    rows = [line for line in text_report.render(analysis).splitlines() if line.startswith("  step ")]
    assert rows and all(row.endswith("activations peak      unknown") for row in rows)
    assert "| unknown |" in markdown_report.render(analysis)


def _later_step_without_stacks(second_pass_bytes: int):
    """context="state": step 0 (a forward of 2 x 128 MiB, then Adam's first step making 4 MiB of
    state, in its annotation's window), then step 1's forward keeping `second_pass_bytes` in
    256 MiB blocks, and an OOM there. No trace entry carries frames."""
    # the device: 2 MiB short of the request of 64 MiB, less than the state made
    sim = Sim(total_bytes=256 * MiB + 4 * MiB + second_pass_bytes + 62 * MiB)
    for _ in range(4):
        sim.alloc(64 * MiB, SETUP_STACK)
    for block in [sim.alloc(128 * MiB, FORWARD_STACK) for _ in range(2)]:
        sim.free(block)
    start = sim._tick()
    for _ in range(4):
        sim.alloc(1 * MiB, ADAM_INIT_STACK)
    end = sim._tick()
    for _ in range(second_pass_bytes // (256 * MiB)):
        sim.alloc(256 * MiB, FORWARD_STACK)
    sim.oom(64 * MiB, FORWARD_STACK)
    sim.events = [replace(e, frames=NO_STACK) for e in sim.events]
    annotations = (
        Annotation("Optimizer.step#Adam.step", "START", 0, start),
        Annotation("Optimizer.step#Adam.step", "END", 0, end),
    )
    return analyse(replace(sim.snapshot(metadata=False), annotations=annotations))


def test_state_is_no_later_step_s_cause_where_the_step_grew_far_more_than_it():
    """Without stacks the earlier steps' activations are unknown. Step 1 holds 3 GiB more than
    step 0's whole peak, the state made since is 4 MiB: the verdict said "Step 1 failed with 4 MiB
    of optimizer state alive ...: the state raised the baseline" (as it did of an evaluation
    without no_grad that kept 276 MiB of activations beside 1.5 MiB of state)."""
    analysis = _later_step_without_stacks(3 * GiB)
    assert analysis.target_step == 1
    verdicts = {analysis.verdict, *(f.verdict for f in analysis.secondary)}
    assert "optimizer-state-buildup" not in verdicts
    # where the step holds no more above the earlier one than the state: the state's, as before
    same = _later_step_without_stacks(256 * MiB)
    assert same.verdict == "optimizer-state-buildup"


def test_a_closure_s_forward_and_backward_inside_an_optimizer_window_keep_their_blocks_stacks():
    """Lightning runs the training step as the optimizer's closure: forward and backward lie inside
    the optimizer step's annotation. Recorded with context="state", the trace's stacks cannot tell
    them apart from the step, so the closure's activations (blocks with a forward's stack) and its
    gradients (blocks of the weights' shapes without any stack) were the step's temporaries; the
    blocks' own stacks say which."""
    sim = Sim(total_bytes=1 * GiB)
    shapes = (64, 16)
    for size in shapes:
        sim.alloc(size * MiB, SETUP_STACK)
    windows = []
    start = sim._tick()
    sim.free(sim.alloc(128 * MiB, FORWARD_STACK))
    for size in shapes:
        sim.alloc(size * MiB)  # the closure's backward: the gradients
    for size in shapes:
        for _ in range(2):
            sim.alloc(size * MiB, ADAM_INIT_STACK)
    windows.append((start, sim._tick()))
    start = sim._tick()
    for _ in range(4):
        sim.alloc(64 * MiB, FORWARD_STACK)  # step 1's closure: its forward
    sim.oom(512 * MiB, FORWARD_STACK)
    sim.events = [replace(e, frames=NO_STACK) for e in sim.events]
    annotations = (
        Annotation("Optimizer.step#Adam.step", "START", 0, windows[0][0]),
        Annotation("Optimizer.step#Adam.step", "END", 0, windows[0][1]),
        Annotation("Optimizer.step#Adam.step", "START", 0, start),
    )
    analysis = analyse(replace(sim.snapshot(metadata=False), annotations=annotations))
    components = analysis.component_bytes()
    assert components["activations"] == 256 * MiB
    assert components["gradients"] == 80 * MiB
    assert components["optimizer_state"] == 160 * MiB
    assert components["temporaries"] == 0
