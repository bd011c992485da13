"""Mixed precision by hand (a bf16 model, fp32 master weights beside it, AdamW over the masters),
read from a plain snapshot at an OOM inside the first optimizer step: the optimizer state is the
masters', so it is projected at them, not at every parameter (verdicts.master_weights)."""

from __future__ import annotations

from oomdoctor.analysis import analyse
from oomdoctor.model import Frame
from oomdoctor.views import text_report
from tests.builders import ADAM_INIT_STACK, FORWARD_STACK, SETUP_STACK, MiB, Sim

MODEL = SETUP_STACK  # model.to(device).to(torch.bfloat16)
MASTERS = (Frame("train.py", 37, "<listcomp>"),)  # p.detach().clone().float()
SCALE = (Frame("train.py", 20, "__init__"),)  # the loss scale, a 4-byte tensor
MASTER_GRADIENT = (Frame("train.py", 46, "step"),)  # master.grad = p.grad.float()


def _first_step_oom(total_bytes: int, bf16: tuple[int, ...], *, masters: bool = True) -> Sim:
    """Parameters of `bf16` bytes (then their fp32 masters at twice those), a loss scale, a forward
    and backward (a gradient per parameter), and the first AdamW step over the masters, which makes
    the first half of its moments and fails on the next (the registry names the components: the
    projection is under test, not the attribution)."""
    sim = Sim(total_bytes=total_bytes)
    for number, size in enumerate(bf16):
        sim.alloc(size, MODEL, "parameter", f"model.{number}")
    sim.alloc(4, SCALE, "other", "scale")
    optimized = [2 * size for size in bf16] if masters else list(bf16)
    if masters:
        for number, size in enumerate(optimized):
            sim.alloc(size, MASTERS, "parameter", f"master.{number}")
    sim.marker("forward", "start")
    sim.free(sim.alloc(4 * MiB, FORWARD_STACK))
    sim.marker("forward", "end")
    sim.marker("backward", "start")
    for number, size in enumerate(bf16):
        sim.alloc(size, (), "gradient", f"model.{number}.grad")
    sim.marker("backward", "end")
    sim.marker("optimizer_step", "start")
    if masters:
        for number, size in enumerate(optimized):
            sim.alloc(size, MASTER_GRADIENT, "gradient", f"master.{number}.grad")
    for number, size in enumerate(optimized[: len(optimized) // 2]):
        sim.alloc(size, ADAM_INIT_STACK, "optimizer_state", f"master.{number}.exp_avg")
        sim.alloc(size, ADAM_INIT_STACK, "optimizer_state", f"master.{number}.exp_avg_sq")
    sim.oom(optimized[len(optimized) // 2], ADAM_INIT_STACK)
    return sim


BF16 = (MiB, 2048, 2 * MiB, 2048, 2 * MiB, 2048, 2 * MiB, 2048, 20480, 20)


def test_the_state_of_a_bf16_model_s_fp32_masters_is_projected_at_the_masters():
    """7 MiB of bf16 weights and their 14 MiB of fp32 masters: the state was projected at 2x all
    21 MiB of parameters ('need 84.33 MiB' of 72, a false model-states-too-large); AdamW keeps two
    moments of the masters only: 21 + 21 + 28 = 70.3 MiB."""
    result = analyse(_first_step_oom(72 * MiB, BF16).snapshot())
    assert result.target_phase == "optimizer_step"
    line = next(line for line in text_report.render(result).splitlines() if "projected at" in line)
    assert "need 70.28 MiB" in line and "2x the 14.05 MiB of fp32 master weights" in line, line


def test_layers_whose_sizes_double_are_no_master_copy():
    """Counter-example: a model whose layers double in size (a UNet's convolutions) pairs sizes at
    twice, but not a run with the run after it in the same order: every parameter is stepped, and
    its state is projected at 2x all 270 MiB of them."""
    widths = (18 * MiB, 36 * MiB, 72 * MiB, 144 * MiB)
    result = analyse(_first_step_oom(1100 * MiB, widths, masters=False).snapshot())
    assert result.verdict == "model-states-too-large"
    line = next(line for line in text_report.render(result).splitlines() if "projected at" in line)
    assert "need 1.05 GiB" in line and "master" not in line, line


def test_an_item_table_twice_the_user_table_is_no_master_copy():
    """Counter-example: a recommender whose item embedding is exactly twice its user embedding
    (400k and 200k rows) pairs the two at twice, in order; but its optimizer began its state with
    the user table, so it steps both: the state is projected at 2x all 72.26 MiB."""
    sizes = (24 * MiB, 48 * MiB, 256 * 1024, 1024)
    result = analyse(_first_step_oom(300 * MiB, sizes, masters=False).snapshot())
    assert result.verdict == "model-states-too-large"
    line = next(line for line in text_report.render(result).splitlines() if "projected at" in line)
    assert "need 289.00 MiB" in line and "master" not in line, line


def test_a_model_of_thousands_of_tensors_is_paired_with_its_masters():
    """1500 bf16 tensors (a large model's layers: a few sizes, repeating) and their masters: the
    masters are found among them. (Every split of the parameters near a third or two thirds of
    their bytes was once paired by a walk over the other run for each block, cubic in the tensors:
    about 25 s for this model. The splits are now tried from the most the runs' sizes could pair
    down, each block's pair found by bisection; this case takes a fraction of a second.)"""
    layers = tuple((1 + number % 7) * 4096 for number in range(1500))
    sim = _first_step_oom(6 * sum(layers) + 64 * MiB, layers)
    result = analyse(sim.snapshot())
    line = next(line for line in text_report.render(result).splitlines() if "projected at" in line)
    assert "of fp32 master weights" in line, line


def test_model_states_over_the_capacity_in_the_first_step_stay_the_cause():
    """Counter-example: the same bf16 model and masters on a 66 MiB device, where their 70.28 MiB
    of model states cannot all be held: model-states-too-large stays the headline."""
    result = analyse(_first_step_oom(66 * MiB, BF16).snapshot())
    assert result.target_phase == "optimizer_step"
    assert result.verdict == "model-states-too-large", result.verdict


BATCH = (Frame("train.py", 52, "main"),)  # inputs, targets = next(batches) on the device


def _masters_by_hand(batch: tuple[int, ...]) -> Sim:
    """A plain snapshot of the first AdamW step over fp32 masters cloned from a bf16 model by the
    user's own list comprehension (no frame names them), made before the first forward and alive
    in it, as the batch is; the step fails after three masters' moments."""
    sim = Sim(total_bytes=72 * MiB)
    for size in BF16:
        sim.alloc(size, MODEL)
    for size in BF16:
        sim.alloc(2 * size, MASTERS)
    for size in batch:
        sim.alloc(size, BATCH)
    sim.free(sim.alloc(4 * MiB, FORWARD_STACK))
    for size in BF16:
        sim.alloc(size, ())  # the bf16 gradients, made by the autograd engine
    for size in BF16:
        sim.alloc(2 * size, (Frame("train.py", 46, "main"),))  # m.grad = p.grad.float() / scale
    for size in BF16[:3]:
        for _ in range(2):
            sim.alloc(2 * size, ADAM_INIT_STACK)
    sim.oom(2 * BF16[3], ADAM_INIT_STACK)
    return sim


def test_masters_cloned_by_the_user_s_own_code_are_parameters_not_inputs():
    """The masters were made before the first forward and lived through it, so the lifetime rule
    read them as its inputs (14.06 MiB of 'inputs'); the optimizer's state, made one master after
    another at each master's size, shows they are what it steps: parameters. Their gradients, made
    after the backward by one line of the user's, one per master in the masters' order, were the
    backward's temporaries: gradients. The batch stays input."""
    result = analyse(_masters_by_hand((64 * 1024, 1024)).snapshot(metadata=False))
    assert result.target_phase == "optimizer_step"
    by_line: dict[int, set[str]] = {}
    for block in result.live_blocks:
        if block.frames:
            by_line.setdefault(block.frames[0].line, set()).add(block.component)
    assert by_line[MASTERS[0].line] == {"parameters"}
    assert by_line[46] == {"gradients"}
    assert {b.component for b in result.live_blocks if b.frames == BATCH} == {"inputs"}


def test_a_batch_of_the_state_s_first_size_is_no_master():
    """Counter-example: a model whose masters the trace does not show (made before it), and a batch
    whose first tensor happens to be of the first state block's size: one size is no list of the
    state's sizes: the batch is no parameter."""
    sim = Sim(total_bytes=72 * MiB)
    for size in BF16:
        sim.alloc(size, MODEL)
    sim.alloc(2 * MiB, BATCH)
    sim.alloc(4096, BATCH)
    sim.free(sim.alloc(4 * MiB, FORWARD_STACK))
    for size in BF16:
        sim.alloc(size, ())
    for size in BF16[:3]:
        for _ in range(2):
            sim.alloc(2 * size, ADAM_INIT_STACK)
    sim.oom(2 * BF16[3], ADAM_INIT_STACK)
    result = analyse(sim.snapshot(metadata=False))
    batch = {b.component for b in result.live_blocks if b.frames == BATCH}
    assert batch and "parameters" not in batch, batch
