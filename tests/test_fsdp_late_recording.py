"""A trace begun after an FSDP run's first step: its pre-trace shards and moments carry no stack.

FSDP2 (fully_shard per Linear, Adam) recorded from its second step on, dumped on demand: the
frame-less blocks from before the trace are this rank's parameter shards and their two moments,
three copies of one set of shapes. The traced backward made no block of those shapes (FSDP
reduce-scatters each unit's gradients into one flat buffer), which _place_model_states read as 'the
gradients were there already': parameters 6.53 MiB, gradients 6.53 MiB and optimizer state 6.53 MiB
for 6.53 and 13.06 MiB, and the main risk 'gradients-kept: 6.53 MiB of gradients from an earlier
backward are still alive ... zero_grad(set_to_none=True) before the forward would have freed them',
false of a loop that calls it.
"""

from oomdoctor.analysis import analyse
from oomdoctor.model import Frame
from tests.builders import FORWARD_STACK, MiB, Sim

TORCH = "/usr/lib/python3/site-packages/torch/"
GATHER = (
    Frame(TORCH + "distributed/fsdp/_fully_shard/_fsdp_collectives.py", 200, "foreach_all_gather"),
    Frame(TORCH + "distributed/fsdp/_fully_shard/_fsdp_param_group.py", 300, "unshard"),
    *FORWARD_STACK,
)
BACKWARD = (
    Frame(TORCH + "autograd/graph.py", 825, "_engine_run_backward"),
    Frame(TORCH + "_tensor.py", 648, "backward"),
    Frame("train.py", 42, "train_step"),
)
ADAM = (
    Frame(TORCH + "optim/adam.py", 540, "_multi_tensor_adam"),
    Frame(TORCH + "optim/adam.py", 230, "step"),
    Frame("train.py", 44, "train_step"),
)


def _late_fsdp_run(units: int = 4) -> Sim:
    sim = Sim(total_bytes=1 << 34)
    for _ in range(units):  # this rank's shards, then their two Adam moments, from step 0
        sim.alloc(2 * MiB)
    for _ in range(2 * units):
        sim.alloc(2 * MiB)
    sim.start_recording()
    activations = []
    for _ in range(units):
        sim.free(sim.alloc(4 * MiB, GATHER))  # the unit's parameters gathered, then resharded
        activations.append(sim.alloc(1 * MiB, FORWARD_STACK))
    flat = []
    for block in reversed(activations):
        sim.free(sim.alloc(4 * MiB, BACKWARD))  # the unsharded gradient, reduce-scattered
        flat.append(sim.alloc(2 * MiB + 4096, BACKWARD))  # the unit's flat sharded gradients
        sim.free(block)
    sim.free(sim.alloc(8 * MiB, ADAM))  # the update's temporaries
    for block in flat:  # zero_grad(set_to_none=True)
        sim.free(block)
    sim.alloc(1 * MiB, FORWARD_STACK)  # the next step's forward
    return sim


def test_moments_from_before_the_trace_are_no_gradients_where_fsdp_makes_them_flat():
    analysis = analyse(_late_fsdp_run().snapshot(metadata=False))
    components = analysis.component_bytes()
    assert components.get("parameters") == 4 * 2 * MiB
    assert components.get("optimizer_state") == 8 * 2 * MiB
    assert not components.get("gradients")
    assert "gradients-kept" not in {analysis.verdict, *(f.verdict for f in analysis.secondary)}
