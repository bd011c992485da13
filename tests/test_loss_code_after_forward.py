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
    assert result.component_bytes()["activations"] == 160 * MiB
    assert "alive in the loop's code after it returned and before its backward" in summary(result.summary)


def test_code_after_a_backward_is_not_the_forwards():
    result = analyse(_loss_code_oom(backward_first=True).snapshot())
    assert result.target_phase == "between_steps"
    assert result.verdict != "activation-spike"
