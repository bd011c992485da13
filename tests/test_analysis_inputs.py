"""The batch is "inputs": from the registry's `input` entries, or inferred before the first forward."""

from __future__ import annotations

import dataclasses

from oomdoctor.analysis import analyse
from oomdoctor.model import Frame
from tests.builders import FOREACH_STACK, FORWARD_STACK, SETUP_STACK, USER_STACK, MiB, Sim


def _first_forward_oom(sim: Sim, *, frames: bool) -> tuple[int, int]:
    """Parameters, a lookup table and the batch made before any phase; the first forward runs out."""
    for index in range(2):
        sim.alloc(64 * MiB, SETUP_STACK if frames else (), "parameter", f"model.layers.{index}.weight")
    table = sim.alloc(3 * MiB, USER_STACK)  # never given to the model
    batch = sim.alloc(24 * MiB, USER_STACK, "input", "Model.forward arg 0")
    if not frames:
        sim.marker("forward", "start")
    for _ in range(2):
        sim.alloc(40 * MiB, FORWARD_STACK if frames else ())
    sim.oom(200 * MiB)
    # the failing request comes from the forward too (its frames say so in a plain snapshot)
    sim.events[-1] = dataclasses.replace(sim.events[-1], frames=FORWARD_STACK if frames else ())
    return table, batch


def test_registry_input_entries_place_the_first_batch_in_inputs():
    sim = Sim(total_bytes=512 * MiB)
    table, batch = _first_forward_oom(sim, frames=False)
    result = analyse(sim.snapshot())
    components = result.component_bytes()
    assert components["inputs"] == 24 * MiB and components["other"] == 3 * MiB
    block = next(b for b in result.live_blocks if b.address == batch)
    assert (block.component, block.method, block.confidence, block.name) == (
        "inputs",
        "registry",
        1.0,
        "Model.forward arg 0",
    )
    inputs = next(share for share in result.components if share.name == "inputs")
    assert inputs.method == "registry" and inputs.confidence == 1.0
    # without the input entry the same block, allocated before the first marker, is "other"
    sim.tensors = [entry for entry in sim.tensors if entry["component"] != "input"]
    components = analyse(sim.snapshot()).component_bytes()
    assert components["inputs"] == 0 and components["other"] == 27 * MiB


def test_a_plain_snapshot_counts_what_lives_into_the_first_forward_as_inputs():
    sim = Sim(total_bytes=512 * MiB)
    _first_forward_oom(sim, frames=True)
    result = analyse(sim.snapshot(metadata=False))
    assert result.phase_source == "frames" and result.target_phase == "forward"
    components = result.component_bytes()
    assert components["parameters"] == 128 * MiB
    # the batch and the table both live into the forward that follows them: nothing tells them apart
    assert components["inputs"] == 27 * MiB and components["other"] == 0
    assert components["activations"] == 80 * MiB
    blocks = [b for b in result.live_blocks if b.component == "inputs"]
    assert {(b.method, b.confidence) for b in blocks} == {("lifetime", 0.5)}


def test_a_plain_snapshot_keeps_other_when_the_first_phase_is_not_a_forward():
    sim = Sim(total_bytes=512 * MiB)
    sim.alloc(64 * MiB, SETUP_STACK)
    sim.alloc(8 * MiB, USER_STACK)
    sim.alloc(64 * MiB, FOREACH_STACK)  # the first phase is an optimizer step, not a forward
    sim.oom(600 * MiB)
    sim.events[-1] = dataclasses.replace(sim.events[-1], frames=FOREACH_STACK)
    result = analyse(sim.snapshot(metadata=False))
    assert result.target_phase == "optimizer_step"
    components = result.component_bytes()
    assert components["inputs"] == 0 and components["other"] == 8 * MiB


EMA_STACK = (Frame("train.py", 29, "<listcomp>"), Frame("train.py", 29, "main"))  # [p.detach().clone() for p in ...]


def test_a_copy_of_the_weights_made_by_user_code_before_training_is_no_parameter_and_no_batch():
    """An EMA of the parameters kept as cloned tensors (`ema = [p.detach().clone() for p in
    model.parameters()]`) before the first step, in a plain snapshot: each clone has a parameter's
    size, and lives into the first forward. It was read as parameters (by size), doubling them and
    the model states projected from them; a batch it is not either. It is other."""
    sim = Sim(total_bytes=512 * MiB)
    for _ in range(2):
        sim.alloc(64 * MiB, SETUP_STACK)
    for _ in range(2):
        sim.alloc(64 * MiB, EMA_STACK)
    batch = sim.alloc(MiB, USER_STACK)
    sim.alloc(32 * MiB, FORWARD_STACK)
    sim.oom(64 * MiB, FORWARD_STACK)
    components = analyse(sim.snapshot(metadata=False)).component_bytes()
    assert components["parameters"] == 128 * MiB
    assert components["other"] == 128 * MiB
    assert components["inputs"] == MiB
    assert batch
