"""A trace begun after a ZeRO run's first step: the rank's moments from before it carry no stack.

A DDP MLP trained with torch's ZeroRedundancyOptimizer(Adam), rehearsed with --world-size 2,
recording started after the first step, dumped on demand: the frame-less blocks from before the
trace are the parameters and the moments of this rank's share of them (16 MiB for 13.06 MiB of
parameters), no whole copy of the set, so all of them were parameters: 'parameters 29.06 MiB' and
no optimizer state at all. The trace's optimizer step runs inside the sharded optimizer.
"""

from oomdoctor.analysis import analyse
from oomdoctor.model import Frame
from tests.builders import BACKWARD_STACK, FORWARD_STACK, MiB, Sim

TORCH = "/usr/lib/python3/site-packages/torch/"
ZERO = TORCH + "distributed/optim/zero_redundancy_optimizer.py"


def _update(sharded: bool) -> tuple[Frame, ...]:
    inner = (Frame(TORCH + "optim/adam.py", 540, "_multi_tensor_adam"), Frame(TORCH + "optim/adam.py", 230, "step"))
    outer = (Frame(ZERO, 1101, "_local_step"), Frame(ZERO, 1148, "step")) if sharded else ()
    return (*inner, *outer, Frame("train.py", 44, "train_step"))


def _late_run(sharded: bool) -> Sim:
    sim = Sim(total_bytes=1 << 34)
    for _ in range(4):  # the parameters
        sim.alloc(64 * MiB)
    for _ in range(4):  # the two moments of this rank's two of them, from step 0
        sim.alloc(64 * MiB)
    sim.alloc(1 * MiB)  # a bias, in the other rank's share
    sim.start_recording()
    activations = [sim.alloc(8 * MiB, FORWARD_STACK) for _ in range(2)]
    gradients = [sim.alloc(64 * MiB, BACKWARD_STACK) for _ in range(4)] + [sim.alloc(1 * MiB, BACKWARD_STACK)]
    for block in activations:
        sim.free(block)
    for _ in range(2):
        sim.free(sim.alloc(64 * MiB, _update(sharded)))
    for block in gradients:  # zero_grad(set_to_none=True)
        sim.free(block)
    sim.alloc(8 * MiB, FORWARD_STACK)  # the next step's forward
    return sim


def test_a_sharded_optimizers_moments_from_before_the_trace_are_optimizer_state():
    components = analyse(_late_run(sharded=True).snapshot(metadata=False)).component_bytes()
    assert components.get("parameters") == 4 * 64 * MiB + 1 * MiB
    assert components.get("optimizer_state") == 4 * 64 * MiB
