"""Pipeline stage 0 written by hand, read from a plain snapshot: after its forward, the loop
allocates the gradient it receives from the next stage (`grad = torch.empty_like(out)`, then
`dist.recv(grad)`) and hands it to `out.backward(grad)`. Frames put that allocation in the forward's
span (no backward has begun), so the phase said activations; but autograd never held it, and it
outlives the backward: the loop holds it, an input (attribution.kept_past_backward_by_the_loop), as
the markers' phases (between the forward and the backward) say."""

from __future__ import annotations

from oomdoctor.analysis import analyse
from oomdoctor.model import Frame
from oomdoctor.units import MIB
from tests.builders import BACKWARD_STACK, FORWARD_STACK, SETUP_STACK, Sim

BATCH = (Frame("train.py", 34, "train_step"),)  # x = batch.to(device)
RECEIVE = (Frame("train.py", 37, "train_step"),)  # grad = torch.empty_like(out); dist.recv(grad, src=1)
LOSS = (  # F.cross_entropy(out, y) in the loop: its log-softmax, saved for the backward
    Frame("/usr/lib/python3/site-packages/torch/nn/functional.py", 3100, "cross_entropy"),
    Frame("train.py", 37, "train_step"),
)
SGD_STEP = (
    Frame("/usr/lib/python3/site-packages/torch/optim/sgd.py", 454, "_multi_tensor_sgd"),
    Frame("/usr/lib/python3/site-packages/torch/optim/sgd.py", 120, "step"),
    Frame("train.py", 44, "train_step"),
)


def _stage(after_forward: tuple[Frame, ...], *, freed_by_backward: bool, oom_in: str) -> tuple[Sim, list[int]]:
    """Steps of a stage: the batch, a forward of three 8 MiB activations, the loop's 8 MiB block
    after it (`after_forward`), a backward that frees the activations (and the loop's block, when
    autograd held it), an SGD step. The second step runs out in its forward or its backward.
    Returns the sim and the loop's blocks."""
    sim = Sim(total_bytes=80 * MIB)
    for _ in range(2):
        sim.alloc(4 * MIB, SETUP_STACK)  # the stage's weights
    made: list[int] = []
    for step in range(2):
        batch = sim.alloc(2 * MIB, BATCH)
        if step == 1 and oom_in == "forward":
            sim.oom(32 * MIB, FORWARD_STACK)
            break
        activations = [sim.alloc(8 * MIB, FORWARD_STACK) for _ in range(3)]
        made.append(sim.alloc(8 * MIB, after_forward))
        gradients = [sim.alloc(4 * MIB, ()) for _ in range(2)]  # the engine's: no Python frames
        if step == 1:
            sim.oom(32 * MIB, ())
            break
        sim.free(sim.alloc(8 * MIB, ()))  # a gradient of an activation, used and freed
        for address in activations:
            sim.free(address, BACKWARD_STACK)
        if freed_by_backward:
            sim.free(made[-1], BACKWARD_STACK)
        for _ in gradients:
            sim.alloc(4 * MIB, SGD_STEP)  # momentum buffers
        sim.free(batch, BATCH)
    return sim, made


def _components(sim: Sim) -> tuple[str, dict[int, str]]:
    result = analyse(sim.snapshot(metadata=False))
    return result.target_phase, {b.address: b.component for b in result.live_blocks}


def test_the_gradient_a_stage_received_is_an_input_at_an_oom_in_the_next_forward():
    sim, received = _stage(RECEIVE, freed_by_backward=False, oom_in="forward")
    phase, component = _components(sim)
    assert phase == "forward"
    assert component[received[0]] == "inputs"


def test_the_gradient_a_stage_receives_is_an_input_inside_its_backward():
    """Inside the second step's backward the received gradient is alive, as saved activations are;
    the first step's, from the same line, outlived its backward: the loop holds what that line makes."""
    sim, received = _stage(RECEIVE, freed_by_backward=False, oom_in="backward")
    phase, component = _components(sim)
    assert phase == "backward"
    assert component[received[1]] == "inputs"
    assert component[received[0]] == "inputs"


def test_what_the_loop_computes_for_the_backward_stays_an_activation():
    """Counter-example: a loss's log-softmax computed in the loop after the forward is saved for the
    backward and freed by it: inside the next backward, that line's block is the pass's activation."""
    sim, made = _stage(LOSS, freed_by_backward=True, oom_in="backward")
    phase, component = _components(sim)
    assert phase == "backward"
    assert component[made[1]] == "activations"
