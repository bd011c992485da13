"""Forward windows of hooks inside a forward (FSDP2's `FSDP::pre_forward (layer)` and
`FSDP::post_forward (layer)` record_function annotations) leave that forward one pass.

An MLP sharded with torch's fully_shard per Linear, rehearsed with --world-size 2, whose third
step's batch was 64 times larger: on its plain dump each unit's hook windows cut step 2's forward
into pieces of two sources (annotations, frames), each read as a pass of its own, so the earlier
units' activations were 'kept from earlier passes', this pass's own came to 0, and no activation
spike was found; the verdict fell to the last resort, outside-pytorch ('no CUDA GPU is that
small'). With the windows laid over the stacks' forward as the forward it is: activation-spike.
"""

from __future__ import annotations

import dataclasses

from oomdoctor.analysis import analyse
from oomdoctor.analysis.passes import passes_since_training
from oomdoctor.analysis.phases import build_spans
from oomdoctor.model import Annotation, Frame
from tests.builders import ADAM_INIT_STACK, BACKWARD_STACK, FORWARD_STACK, SETUP_STACK, GiB, MiB, Sim

TORCH = "/usr/lib/python3/site-packages/torch/"
GATHER = (
    Frame(TORCH + "distributed/fsdp/_fully_shard/_fsdp_collectives.py", 200, "foreach_all_gather"),
    Frame(TORCH + "distributed/fsdp/_fully_shard/_fsdp_param_group.py", 300, "unshard"),
    Frame(TORCH + "distributed/fsdp/_fully_shard/_fsdp_state.py", 230, "_pre_forward"),
    Frame(TORCH + "nn/modules/module.py", 1751, "_call_impl"),
    *FORWARD_STACK[1:],
)


# the all-gather's flat output buffer, made by the collectives' `allocate` for foreach_all_gather
GATHER_BUFFER = (Frame(TORCH + "distributed/fsdp/_fully_shard/_fsdp_collectives.py", 120, "allocate"), *GATHER)


def _sharded_run(units: int = 4, last_batch: int = 16, gather=GATHER) -> tuple[Sim, list[Annotation]]:
    sim = Sim(total_bytes=2 * GiB)
    annotations: list[Annotation] = []
    for _ in range(units):
        sim.alloc(8 * MiB, SETUP_STACK)  # this rank's shard of each unit
    for step in range(2):
        activations = []
        for unit in range(units):
            name = f"FSDP::pre_forward (layers.{unit})"
            annotations.append(Annotation(name, "START", 0, sim._tick()))
            gathered = sim.alloc(16 * MiB, gather)
            annotations.append(Annotation(name, "END", 0, sim._tick()))
            activations.append(sim.alloc((last_batch if step else 1) * 4 * MiB, FORWARD_STACK))
            if step == 1 and unit == units - 1:
                sim.oom(last_batch * 4 * MiB, FORWARD_STACK)
                return sim, annotations
            sim.free(gathered)
        gradients = [sim.alloc(8 * MiB, BACKWARD_STACK) for _ in range(units)]
        for block in activations:
            sim.free(block)
        if step == 0:
            for _ in range(2 * units):
                sim.alloc(8 * MiB, ADAM_INIT_STACK)
        for block in gradients:
            sim.free(block)
    raise AssertionError("the run did not run out")


def test_hook_windows_inside_a_forward_leave_it_one_pass():
    sim, annotations = _sharded_run()
    snapshot = dataclasses.replace(sim.snapshot(metadata=False), annotations=tuple(annotations))
    trace = snapshot.trace_of(0)
    spans, _ = build_spans(trace, markers=None, annotations=snapshot.annotations, device=0)
    forwards, _ = passes_since_training(spans, len(trace) - 1)
    assert len(forwards) == 1, forwards
    analysis = analyse(snapshot)
    assert analysis.verdict == "activation-spike"


def test_fsdp_all_gathers_are_parameters_in_the_steps_series_too():
    """The gathered parameters (and the all-gather's flat buffer, made by the collectives'
    `allocate`) are parameters at the OOM and in the steps' series: the FSDP2 run above read its
    earlier steps' activations peak at 13.51 MiB (2.01 MiB of activations and a unit's gathers),
    and its spike at 3.8x where it was 23.9x."""
    sim, annotations = _sharded_run(gather=GATHER_BUFFER)
    analysis = analyse(dataclasses.replace(sim.snapshot(metadata=False), annotations=tuple(annotations)))
    by_step = {s.step: s.peak_activation_bytes for s in analysis.steps}
    assert by_step[0] == 4 * 4 * MiB  # the four units' outputs, without the 16 MiB gathers
    assert analysis.component_bytes()["parameters"] == 4 * 8 * MiB + 16 * MiB  # the shards, the last gather
