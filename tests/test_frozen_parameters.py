"""Model states projected over the parameters that train, not every parameter (verdicts.
trained_parameters): a frozen base (LoRA) or a frozen reference model (RLHF) gets no gradients and
no optimizer state, and the dump shows which train once a backward or a first optimizer step ran."""

from __future__ import annotations

from oomdoctor.analysis import analyse
from oomdoctor.model import Frame
from oomdoctor.units import GIB as GiB
from oomdoctor.units import MIB as MiB
from oomdoctor.views.phrasing import summary
from tests.builders import ADAM_INIT_STACK, BACKWARD_STACK, FORWARD_STACK, SETUP_STACK, Sim

FROZEN_MIB = 36  # the frozen weights
TRAINED_MIB = 4  # the adapters


def _model(sim: Sim) -> None:
    sim.alloc(FROZEN_MIB * MiB, SETUP_STACK, "parameter", "base.weight")
    sim.alloc(TRAINED_MIB * MiB, SETUP_STACK, "parameter", "adapter.weight")


def _step(sim: Sim, activation_mib: int, *, oom_in: str | None = None) -> None:
    sim.marker("forward", "start")
    kept = [sim.alloc(activation_mib * MiB, FORWARD_STACK)]
    if oom_in == "forward":
        sim.oom(8 * MiB, FORWARD_STACK)
        return
    sim.marker("forward", "end")
    sim.marker("backward", "start")
    sim.free(kept.pop())
    grad = sim.alloc(TRAINED_MIB * MiB, BACKWARD_STACK, "gradient", "adapter.weight.grad")
    sim.marker("backward", "end")
    sim.marker("optimizer_step", "start")
    if sim.step == 0:
        sim.alloc(TRAINED_MIB * MiB, ADAM_INIT_STACK, "optimizer_state", "exp_avg")
        if oom_in == "optimizer_step":
            sim.oom(TRAINED_MIB * MiB, ADAM_INIT_STACK)
            return
        sim.alloc(TRAINED_MIB * MiB, ADAM_INIT_STACK, "optimizer_state", "exp_avg_sq")
    sim.marker("optimizer_step", "end")
    sim.marker("zero_grad", "start")
    sim.free(grad)
    sim.marker("zero_grad", "end")


def test_the_first_optimizer_step_projects_the_state_of_the_parameters_with_gradients():
    # 40 MiB of parameters, 4 MiB of them trained: the states need 40 + 4 + 2 x 4 = 52 MiB; projected
    # over every parameter (40 + 40 + 80) they would seem three times the device
    sim = Sim(total_bytes=72 * MiB)
    _model(sim)
    sim.alloc(20 * MiB, FORWARD_STACK)  # what else the run holds
    _step(sim, 8, oom_in="optimizer_step")
    result = analyse(sim.snapshot())
    assert result.target_phase == "optimizer_step"
    assert result.verdict != "model-states-too-large"
    assert "model-states-too-large" not in {f.verdict for f in result.secondary}


def test_a_later_steps_forward_takes_the_state_the_first_step_made_as_complete():
    sim = Sim(total_bytes=100 * MiB)
    _model(sim)
    _step(sim, 8)
    _step(sim, 48, oom_in="forward")  # a longer batch: 48 MiB of activations and 8 more asked for
    result = analyse(sim.snapshot())
    assert (result.target_phase, result.target_step) == ("forward", 1)
    assert result.verdict == "activation-spike", result.verdict
    assert "model-states-too-large" not in {f.verdict for f in result.secondary}


def _first_forward_oom(sim: Sim) -> None:
    """The first step's forward runs out: no backward yet, no optimizer state, so neither shows
    which parameters train."""
    sim.marker("forward", "start")
    sim.alloc(20 * MiB, FORWARD_STACK)
    sim.oom(16 * MiB, FORWARD_STACK)


def test_the_registry_says_which_parameters_train_before_any_backward():
    # capture saw an optimizer made (the run trains) and the registry says the 36 MiB base is frozen:
    # the states need 40 + 4 (the adapters' gradients) and no more, not 40 + 40 as if all trained
    sim = Sim(total_bytes=72 * MiB)
    _model(sim)
    for entry in sim.tensors:
        entry["requires_grad"] = entry["name"] != "base.weight"
    _first_forward_oom(sim)
    result = analyse(sim.snapshot(extra={"optimizers": 1}))
    assert (result.target_phase, result.target_step) == ("forward", 0)
    assert result.verdict != "model-states-too-large"
    assert "model-states-too-large" not in {f.verdict for f in result.secondary}


def test_without_what_trains_the_projection_is_an_upper_bound_no_verdict_rests_on():
    # the same run in a dump whose registry does not say which parameters train (older capture):
    # 40 MiB of parameters fit the 72 MiB device; with a gradient for every one (80 MiB) they would
    # not, but nothing in the file shows the base trains
    sim = Sim(total_bytes=72 * MiB)
    _model(sim)
    _first_forward_oom(sim)
    result = analyse(sim.snapshot(extra={"optimizers": 1}))
    assert result.verdict != "model-states-too-large"
    (states,) = [f for f in result.secondary if f.verdict == "model-states-too-large"]
    assert states is result.secondary[-1] and states.confidence < 0.5
    assert "assuming every parameter trains, an upper bound" in summary(states.summary)
    # and no advice or what-if is sized on the assumed states: sharding halves the 40 MiB held
    assert not result.what_if.projected_states
    shard = next(r for r in result.recommendations if r.id == "shard-model-states")
    assert shard.estimated_saved_bytes == 20 * MiB


def test_states_that_do_not_fit_as_they_are_stay_the_verdict():
    # the parameters alone fill the device: too large whatever trains
    sim = Sim(total_bytes=42 * MiB)
    _model(sim)
    sim.marker("forward", "start")
    sim.alloc(MiB, FORWARD_STACK)
    sim.oom(16 * MiB, FORWARD_STACK)
    result = analyse(sim.snapshot(extra={"optimizers": 1}))
    assert result.verdict == "model-states-too-large"


def test_a_plain_dump_of_a_training_steps_first_forward_says_the_projection_assumes_all_train():
    # a plain snapshot (no metadata): the forward runs inside `training_step`, so the run trains,
    # but nothing shows which of the 2 GiB of parameters get gradients (a LoRA base gets none)
    step = (Frame("train.py", 40, "training_step"),)
    sim = Sim(total_bytes=3 * GiB)
    sim.alloc(2 * GiB, SETUP_STACK)
    sim.alloc(64 * MiB, SETUP_STACK)
    forward = (*FORWARD_STACK[:-1], *step)
    sim.alloc(600 * MiB, forward)
    sim.oom(512 * MiB, forward)
    result = analyse(sim.snapshot(metadata=False))
    assert (result.target_phase, result.target_step) == ("forward", 0)
    assert result.verdict != "model-states-too-large"
    (states,) = [f for f in result.secondary if f.verdict == "model-states-too-large"]
    assert "assuming every parameter trains, an upper bound" in summary(states.summary)


def test_a_plain_dump_of_the_first_backward_advises_no_micro_batches_sized_on_assumed_gradients():
    # accumulating over micro-batches holds the first one's gradients over, every trained
    # parameter's: as if all 2 GiB trained, halving the micro-batch would save nothing. Nothing shows
    # which train, so the smaller batch (none held over) is advised, its fit unknown, as is sharding's
    sim = Sim(total_bytes=3 * GiB)
    sim.alloc(2 * GiB, SETUP_STACK)
    sim.alloc(64 * MiB, SETUP_STACK)
    for _ in range(4):
        sim.alloc(150 * MiB, FORWARD_STACK)
    sim.alloc(200 * MiB, BACKWARD_STACK)
    sim.oom(512 * MiB, BACKWARD_STACK)
    result = analyse(sim.snapshot(metadata=False))
    assert (result.target_phase, result.target_step) == ("backward", 0)
    advice = {r.id: r for r in result.recommendations}
    assert "smaller-micro-batch" not in advice
    assert advice["smaller-batch"].would_fit_alone is None
    assert advice["shard-model-states"].would_fit_alone is None
