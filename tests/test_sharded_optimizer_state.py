"""An optimizer that shards its state across ranks (ZeRO) in a plain snapshot.

torch's ZeroRedundancyOptimizer (and DeepSpeed's ZeRO optimizers) keep on each rank the moments of
that rank's share of the parameters only. A DDP MLP trained with ZeroRedundancyOptimizer(Adam),
rehearsed with --world-size 2: rank 1, out of memory in its second optimizer step with its whole
state (10.11 MiB for 13.06 MiB of parameters), read 'Parameters, gradients and optimizer state
alone need 65.28 MiB (optimizer state projected at 2x the parameters)', a state no rank ever
holds, and both ranks were told to 'Shard parameters, gradients and optimizer state across GPUs
(FSDP or ZeRO)', though the state was sharded already.
"""

from oomdoctor.analysis import analyse
from oomdoctor.model import Frame
from oomdoctor.views import phrasing
from tests.builders import BACKWARD_STACK, FORWARD_STACK, SETUP_STACK, GiB, MiB, Sim

TORCH = "/usr/lib/python3/site-packages/torch/"


def _state_stack(sharded: bool) -> tuple[Frame, ...]:
    inner = (Frame(TORCH + "optim/adam.py", 178, "_init_group"), Frame(TORCH + "optim/adam.py", 238, "step"))
    zero = TORCH + "distributed/optim/zero_redundancy_optimizer.py"
    outer = (Frame(zero, 1101, "_local_step"), Frame(zero, 1148, "step")) if sharded else ()
    return (*inner, *outer, Frame("train.py", 44, "train_step"))


def _second_step_oom(sharded: bool) -> Sim:
    """Four 256 MiB weights; this rank's Adam state is the two moments of one of them (a quarter of
    the parameters, as one rank of four holds), made in step 0; step 1's update asks for 256 MiB."""
    sim = Sim(total_bytes=2 * GiB + 640 * MiB)
    for _ in range(4):
        sim.alloc(256 * MiB, SETUP_STACK)
    state = _state_stack(sharded)
    for step in range(2):
        activations = [sim.alloc(16 * MiB, FORWARD_STACK) for _ in range(2)]
        gradients = [sim.alloc(256 * MiB, BACKWARD_STACK) for _ in range(4)]
        for block in activations:
            sim.free(block)
        if step == 0:
            for _ in range(2):
                sim.alloc(256 * MiB, state)
            for block in gradients:
                sim.free(block)
    sim.oom(256 * MiB, state)
    return sim


def test_sharded_state_is_taken_as_this_ranks_share_not_projected_from_the_parameters():
    analysis = analyse(_second_step_oom(sharded=True).snapshot(metadata=False))
    components = analysis.component_bytes()
    assert components["optimizer_state"] == 512 * MiB and components["parameters"] == GiB
    assert analysis.verdict == "model-states-too-large"
    assert analysis.summary.facts.get("needed") == 2 * GiB + 512 * MiB  # as the rank holds them
    assert analysis.summary.facts.get("projected_moments") is None
    text = phrasing.summary(analysis.summary)
    assert "projected at 2x" not in text and "shards it across ranks" in text
    ids = {r.id for r in analysis.recommendations}
    assert "shard-model-states" not in ids
    assert "shard-gradients-and-parameters" in ids


def test_an_unsharded_state_smaller_than_the_parameters_is_still_projected():
    """The counter-example: torch's Adam alone, its state short of two moments per parameter."""
    analysis = analyse(_second_step_oom(sharded=False).snapshot(metadata=False))
    assert analysis.verdict == "model-states-too-large"
    assert analysis.summary.facts.get("projected_moments") == 2
    assert "shard-model-states" in {r.id for r in analysis.recommendations}


FSDP_FLAT = (
    Frame(TORCH + "distributed/fsdp/_flat_param.py", 780, "flatten_tensors"),
    Frame(TORCH + "distributed/fsdp/fully_sharded_data_parallel.py", 480, "__init__"),
    Frame("train.py", 30, "main"),
)


def test_a_run_whose_parameters_fsdp_shards_is_not_told_to_shard_with_fsdp():
    """FSDP's flat parameters (this rank's shards) whose model states do not fit in the first
    optimizer step: the states are sharded already, so the change is more ranks or offloading,
    not 'Shard parameters, gradients and optimizer state across GPUs (FSDP or ZeRO)'."""
    sim = Sim(total_bytes=1 * GiB + 512 * MiB)
    for _ in range(4):
        sim.alloc(96 * MiB, FSDP_FLAT)
    activations = [sim.alloc(16 * MiB, FORWARD_STACK) for _ in range(2)]
    for _ in range(4):
        sim.alloc(96 * MiB, BACKWARD_STACK)
    for block in activations:
        sim.free(block)
    for _ in range(6):
        sim.alloc(96 * MiB, _state_stack(sharded=False))
    sim.oom(96 * MiB, _state_stack(sharded=False))
    analysis = analyse(sim.snapshot(metadata=False))
    assert analysis.verdict == "model-states-too-large"
    ids = {r.id for r in analysis.recommendations}
    assert "shard-model-states" not in ids and "shard-gradients-and-parameters" not in ids
    assert "shard-over-more-gpus" in ids


def test_sharding_over_more_ranks_is_never_said_to_fit():
    """Twice the ranks halve each rank's shards, not the units FSDP gathers whole for their forward
    and backward nor a gradient before it is reduced, and the units' size is not in the file: as
    sharding a run that does not shard yet, no fit is claimed from the half (docs/verdicts.md).
    FSDP's flat parameters, 384 MiB on this rank, their gradients, and Adam state being made in the
    first step: 1.50 GiB of states at full size on 1.25 GiB, of which half, 768 MiB, is said saved."""
    sim = Sim(total_bytes=1 * GiB + 256 * MiB)
    for _ in range(4):
        sim.alloc(96 * MiB, FSDP_FLAT)
    activations = [sim.alloc(16 * MiB, FORWARD_STACK) for _ in range(2)]
    for _ in range(4):
        sim.alloc(96 * MiB, BACKWARD_STACK)
    for block in activations:
        sim.free(block)
    for _ in range(6):
        sim.alloc(96 * MiB, _state_stack(sharded=False))
    sim.oom(96 * MiB, _state_stack(sharded=False))
    analysis = analyse(sim.snapshot(metadata=False))
    assert analysis.verdict == "model-states-too-large"
    (more,) = [r for r in analysis.recommendations if r.id == "shard-over-more-gpus"]
    assert more.estimated_saved_bytes == 768 * MiB
    assert more.would_fit_alone is None
