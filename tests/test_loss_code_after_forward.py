"""An OOM in the loop's own code after the model returned and before its backward: the loss
computed outside the model (`loss = criterion(model(x), y)`, the float copy of bf16 logits a
hand-written autocast loop makes). Capture's markers put that code between steps, since no module
runs; the forward's activations are still what fills memory there, so the verdict is theirs."""

from __future__ import annotations

from oomdoctor.analysis import analyse
from oomdoctor.views.phrasing import summary
from tests.builders import FORWARD_STACK, SETUP_STACK, USER_STACK, MiB, Sim


def _loss_code_oom(*, backward_first: bool = False) -> Sim:
    sim = Sim(total_bytes=256 * MiB)
    for index in range(2):
        sim.alloc(16 * MiB, SETUP_STACK, "parameter", f"layers.{index}.weight")
    sim.alloc(MiB, USER_STACK, "input", "Model.forward arg 0")
    sim.marker("forward", "start")
    for _ in range(4):
        sim.alloc(40 * MiB, FORWARD_STACK)
    sim.marker("forward", "end")
    if backward_first:  # a backward ran after the forward: the loss code's step is over
        sim.marker("backward", "start")
        sim.alloc(MiB, USER_STACK)
        sim.marker("backward", "end")
    sim.alloc(16 * MiB, USER_STACK)  # logits.float() in the loop, outside every module
    sim.oom(32 * MiB, USER_STACK)  # cross_entropy's log_softmax
    return sim


def test_an_oom_in_the_loss_code_after_the_forward_is_the_forwards_activations():
    result = analyse(_loss_code_oom().snapshot())
    assert (result.target_phase, result.target_step) == ("between_steps", 0)  # as the markers say
    assert result.verdict == "activation-spike"
    # the forward's 160 MiB and the loop's float copy of the logits, made for the backward
    assert result.component_bytes()["activations"] == 176 * MiB
    assert "alive in the loop's code after it returned and before its backward" in summary(result.summary)


def test_code_after_a_backward_is_not_the_forwards():
    result = analyse(_loss_code_oom(backward_first=True).snapshot())
    assert result.target_phase == "between_steps"
    assert result.verdict != "activation-spike"


def _loss_in_the_loop(*, keep: bool) -> Sim:
    """Two steps whose loss the loop computes after the model returned (24 MiB: `(loss / n)` of a
    per-token loss), freed as the statement that calls backward on it ends; with `keep`, the loop
    keeps each step's result past its backward instead (a list of per-step outputs)."""
    sim = Sim(total_bytes=512 * MiB)
    sim.alloc(16 * MiB, SETUP_STACK, "parameter", "layers.0.weight")
    for step in range(2):
        batch = sim.alloc(MiB, USER_STACK, "input", "Model.forward arg 0")
        sim.marker("forward", "start")
        saved = [sim.alloc(40 * MiB, FORWARD_STACK) for _ in range(2)]
        sim.marker("forward", "end")
        loss_code = sim.alloc(24 * MiB, USER_STACK)  # F.cross_entropy(logits, y) in the loop
        sim.marker("backward", "start")
        if step == 1:
            sim.oom(64 * MiB, USER_STACK)
            return sim
        for address in saved:
            sim.free(address)
        sim.marker("backward", "end")
        if not keep:
            sim.free(loss_code)  # `(loss / n).backward()` returned: its operand goes with the statement
        sim.marker("optimizer_step", "start")
        sim.marker("optimizer_step", "end")
        sim.free(batch)
    return sim


def test_what_the_loop_computes_for_the_backward_is_an_activation_with_the_markers():
    """The markers put the loop's loss code between steps; what it made for the backward that has
    not run yet is the forward's, as a plain snapshot's frames say (docs/definitions.md)."""
    result = analyse(_loss_in_the_loop(keep=False).snapshot())
    assert result.target_phase == "backward"
    assert result.component_bytes()["activations"] == (80 + 24) * MiB
    assert result.component_bytes()["inputs"] == MiB


def test_what_the_loop_keeps_past_the_backward_is_an_input_with_the_markers():
    result = analyse(_loss_in_the_loop(keep=True).snapshot())
    assert result.component_bytes()["activations"] == 80 * MiB
    assert result.component_bytes()["inputs"] == MiB + 2 * 24 * MiB  # the site's block outlived a backward
