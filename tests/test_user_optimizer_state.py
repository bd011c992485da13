"""A user-written optimizer's state (Lion or AdamW written with tensor ops in the user's file: no
`_init_group` frame) read from a plain snapshot at an OOM inside its first step: the blocks that
outlive the step's later temporaries are its state (attribution.state_blocks), not temporaries."""

from __future__ import annotations

from oomdoctor.analysis import analyse
from oomdoctor.model import Frame
from oomdoctor.units import MIB as MiB
from oomdoctor.views import text_report
from tests.builders import BACKWARD_STACK, FORWARD_STACK, SETUP_STACK, Sim

STEP_WRAPPER = (
    Frame("/usr/lib/python3/site-packages/torch/optim/optimizer.py", 485, "wrapper"),
    Frame("train.py", 80, "main"),
)


def _in_step(line: int) -> tuple[Frame, ...]:
    return (Frame("optim.py", line, "step"), *STEP_WRAPPER)


ZEROS_LIKE = _in_step(28)  # state["exp_avg"] = torch.zeros_like(p)
UPDATE = _in_step(31)  # update = exp_avg.mul(beta1).add(grad, alpha=1 - beta1).sign_()
OUT_OF_PLACE = _in_step(40)  # m = beta1 * m + (1 - beta1) * grad


def _trained(sim: Sim, sizes: tuple[int, ...]) -> None:
    for size in sizes:
        sim.alloc(size * MiB, SETUP_STACK)
    sim.free(sim.alloc(8 * MiB, FORWARD_STACK))
    for size in sizes:
        sim.alloc(size * MiB, BACKWARD_STACK)  # the gradients


def test_a_user_written_lions_state_is_state_at_an_oom_in_its_first_step():
    sizes = (24, 48)
    sim = Sim(total_bytes=220 * MiB)
    _trained(sim, sizes)
    state_0 = sim.alloc(24 * MiB, ZEROS_LIKE)
    sim.free(sim.alloc(24 * MiB, UPDATE))  # exp_avg.mul(beta1): freed once the add made its result
    sim.alloc(24 * MiB, UPDATE)  # `update`, alive until the next parameter's replaces it
    sim.alloc(48 * MiB, ZEROS_LIKE)  # the second parameter's state
    sim.oom(48 * MiB, UPDATE)
    result = analyse(sim.snapshot(metadata=False))
    assert result.target_phase == "optimizer_step"
    by_address = {b.address: b.component for b in result.live_blocks}
    assert by_address[state_0] == "optimizer_state"
    components = result.component_bytes()
    assert components.get("optimizer_state") == 72 * MiB, components
    assert components.get("temporaries") == 24 * MiB, components


def test_an_out_of_place_update_lends_its_line_nothing():
    """Counter-example: `m = beta1 * m + (1 - beta1) * grad` makes two temporaries and the new state
    at one line; mid-step, the parameter being updated has its temporaries alive."""
    sizes = (16, 16, 16)
    sim = Sim(total_bytes=1024 * MiB)
    _trained(sim, sizes)
    kept = []
    for number, size in enumerate(sizes):
        first = sim.alloc(size * MiB, OUT_OF_PLACE)  # beta1 * m
        second = sim.alloc(size * MiB, OUT_OF_PLACE)  # (1 - beta1) * grad
        kept.append(sim.alloc(size * MiB, OUT_OF_PLACE))  # the new m
        if number == len(sizes) - 1:
            sim.oom(size * MiB, OUT_OF_PLACE)
            break
        sim.free(first)
        sim.free(second)
    result = analyse(sim.snapshot(metadata=False))
    by_address = {b.address: b.component for b in result.live_blocks}
    # the first parameter's new m outlived the second's temporaries: state
    assert by_address[kept[0]] == "optimizer_state"
    # the last parameter's two temporaries: their line made blocks the step freed, so it makes
    # nothing state but what outlived a later temporary
    assert by_address[first] == by_address[second] == "temporaries"


def _lion_oom(total_bytes: int, sizes: tuple[int, ...], moments: int = 1) -> Sim:
    """A user-written optimizer's first step (`moments` zeros_like per parameter, then its update
    temporary) that fails on the last parameter's update."""
    sim = Sim(total_bytes=total_bytes)
    _trained(sim, sizes)
    update = None
    for size in sizes:
        for _ in range(moments):
            sim.alloc(size * MiB, ZEROS_LIKE)
        if update is not None:
            sim.free(update)
        update = sim.alloc(size * MiB, UPDATE) if size != sizes[-1] else None
    sim.oom(sizes[-1] * MiB, UPDATE)
    return sim


def _projections(result) -> list[str]:
    return [line for line in text_report.render(result).splitlines() if "projected at" in line]


def test_a_user_written_optimizer_s_moments_are_read_from_the_state_it_made():
    """A recommender trained with a hand-written Lion (one moment per parameter; embeddings of 24
    and 48 MiB, a 16 MiB tower), OOM at its last parameter's update: the state was projected at
    Adam's two moments, 'need 352 MiB' of the 360 MiB, and a false model-states-too-large. The
    state made so far shows one block per parameter of the sizes it is done with: 1x, 264 MiB."""
    result = analyse(_lion_oom(360 * MiB, (24, 48, 16)).snapshot(metadata=False))
    assert result.target_phase == "optimizer_step"
    assert result.component_bytes().get("optimizer_state") == 88 * MiB
    assert result.verdict == "optimizer-state-buildup", result.verdict
    assert not any("2x" in line for line in _projections(result))


def test_two_moments_are_read_as_two_and_one_run_reads_nothing():
    """Counter-examples: a hand-written Adam (two zeros_like per parameter) is read as two moments
    (still model-states-too-large: 352 MiB of 360), and an OOM before the optimizer moved past its
    first parameter shows nothing, so the state is projected at two moments as an assumption."""
    adam = analyse(_lion_oom(360 * MiB, (24, 48, 16), moments=2).snapshot(metadata=False))
    assert adam.verdict == "model-states-too-large"
    assert any(
        "need 352.00 MiB (optimizer state projected at 2x the parameters, as many moments" in line
        for line in _projections(adam)
    )
    sim = Sim(total_bytes=300 * MiB)
    _trained(sim, (48, 48, 48))
    sim.alloc(48 * MiB, ZEROS_LIKE)
    sim.oom(48 * MiB, UPDATE)
    first = analyse(sim.snapshot(metadata=False))
    assert first.verdict == "model-states-too-large"
    assert any("at 2x the parameters, assuming Adam-style moments" in line for line in _projections(first))


def _one_size_oom(total_bytes: int, moments: int, parameters: int = 4) -> Sim:
    """A hand-written optimizer's first step over parameters of one size (32 MiB each): per
    parameter, `moments` zeros_like and then its update temporary (kept until the next one's is
    made, or the last parameter's state), failing on the last parameter's update."""
    sim = Sim(total_bytes=total_bytes)
    _trained(sim, (32,) * parameters)
    update = None
    for number in range(parameters):
        for _ in range(moments):
            sim.alloc(32 * MiB, ZEROS_LIKE)
        if number == parameters - 1:
            if update is not None:
                sim.free(update)
            sim.oom(32 * MiB, UPDATE)
            break
        made = sim.alloc(32 * MiB, UPDATE)
        if update is not None:
            sim.free(update)
        update = made
    return sim


def test_a_one_moment_optimizer_over_parameters_of_one_size_is_read_from_its_runs():
    """A hand-written Lion over four 32 MiB parameters (one size: no change of size cuts its state
    into parameters), OOM at the last update on a 420 MiB device: the state was projected at Adam's
    two moments, 'need 512 MiB', a false model-states-too-large. Each parameter's state is a run of
    one block that its update's temporary ended: 1x, 384 MiB, and the first step's buildup."""
    result = analyse(_one_size_oom(420 * MiB, moments=1).snapshot(metadata=False))
    assert result.target_phase == "optimizer_step"
    assert result.component_bytes().get("optimizer_state") == 128 * MiB
    assert result.verdict == "optimizer-state-buildup", result.verdict
    assert not any("2x" in line for line in _projections(result))


def test_two_moments_over_parameters_of_one_size_are_read_as_two():
    """Counter-example: a hand-written Adam over the same parameters makes runs of two: 2x (512 MiB
    of 530, a further finding), read from the state so far rather than assumed."""
    result = analyse(_one_size_oom(530 * MiB, moments=2).snapshot(metadata=False))
    lines = _projections(result)
    assert any(
        "at 2x the parameters, as many moments per parameter as its state so far holds" in line for line in lines
    ), lines


LION_STATE = (  # lion-pytorch: state["exp_avg"] = torch.zeros_like(p) in its step
    Frame("/usr/lib/python3/site-packages/lion_pytorch/lion_pytorch.py", 80, "step"),
    *STEP_WRAPPER,
)


def test_a_lion_library_s_state_is_one_moment_by_its_frames():
    """lion-pytorch over parameters of one size, OOM at its first parameter's update: the state
    shows no run its update ended, but its frames name the optimizer: 1x, 384 MiB, not Adam's
    assumed 2x, 512 MiB."""
    sim = Sim(total_bytes=300 * MiB)
    _trained(sim, (32, 32, 32, 32))
    sim.alloc(32 * MiB, LION_STATE)
    sim.oom(32 * MiB, UPDATE)
    lines = _projections(analyse(sim.snapshot(metadata=False)))
    assert any("need 384.00 MiB (optimizer state projected at 1x the parameters)" in line for line in lines), lines
