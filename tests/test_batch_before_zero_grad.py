"""The batch a loop loads before its `optimizer.zero_grad()` (the order many loops use: load the
batch, zero the gradients, forward, backward, step) is still the batch that forward is given: a
plain snapshot's zero_grad between the two does not make it `other`."""

from __future__ import annotations

from oomdoctor.analysis import analyse
from oomdoctor.model import Frame
from tests.builders import BACKWARD_STACK, FOREACH_STACK, FORWARD_STACK, SETUP_STACK, MiB, Sim

LOAD_STACK = (Frame("train.py", 30, "main"),)  # `images = torch.randn(...).to(device)`: no batch word
ZERO_GRAD_STACK = (
    Frame("/usr/lib/python3/site-packages/torch/optim/optimizer.py", 990, "zero_grad"),
    Frame("train.py", 31, "main"),
)


def _loop(*, zero_grad_first: bool) -> tuple[Sim, int]:
    sim = Sim(total_bytes=512 * MiB)
    weights = [sim.alloc(16 * MiB, SETUP_STACK) for _ in range(2)]
    gradients: list[int] = []
    batch = 0
    for step in range(2):
        batch = sim.alloc(6 * MiB, LOAD_STACK)
        if zero_grad_first:
            for gradient in gradients:
                sim.free(gradient, ZERO_GRAD_STACK)
            gradients = []
        activations = [sim.alloc(40 * MiB, FORWARD_STACK) for _ in range(2 + 6 * step)]
        if step == 1:
            sim.oom(64 * MiB, FORWARD_STACK)
            break
        gradients = [sim.alloc(16 * MiB, BACKWARD_STACK) for _ in weights]
        for activation in activations:
            sim.free(activation, BACKWARD_STACK)
        sim.free(sim.alloc(16 * MiB, FOREACH_STACK))
        if not zero_grad_first:
            for gradient in gradients:
                sim.free(gradient, ZERO_GRAD_STACK)
            gradients = []
        sim.free(batch)
    return sim, batch


def _batch_component(zero_grad_first: bool) -> str:
    sim, batch = _loop(zero_grad_first=zero_grad_first)
    result = analyse(sim.snapshot(metadata=False))
    assert (result.target_phase, result.target_step) == ("forward", 1)
    return next(block.component for block in result.live_blocks if block.address == batch)


def test_the_batch_loaded_before_zero_grad_is_an_input():
    assert _batch_component(zero_grad_first=True) == "inputs"


def test_the_batch_loaded_after_zero_grad_is_an_input():
    assert _batch_component(zero_grad_first=False) == "inputs"
