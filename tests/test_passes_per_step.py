"""Several model calls before one backward are a training step's structure (a siamese or contrastive
pair, a reward model's chosen and rejected, a GAN's discriminator on real and fake), not grad mode
left on in a loop: in a run that trains, passes since the last backward are "inference with
autograd on" only when there are more of them than any earlier backward consumed."""

from __future__ import annotations

from oomdoctor.analysis import analyse
from oomdoctor.model import Frame
from tests.builders import ADAM_INIT_STACK, BACKWARD_STACK, SETUP_STACK, GiB, MiB, Sim

TORCH = "/usr/lib/python3/site-packages/torch/"
LOSS = (Frame(TORCH + "nn/functional.py", 3000, "cosine_similarity"), Frame("train.py", 45, "train_step"))
NORM = (Frame(TORCH + "nn/functional.py", 4800, "normalize"), Frame("train.py", 41, "train_step"))
BATCH = (Frame(TORCH + "utils/data/dataloader.py", 700, "__next__"), Frame("train.py", 58, "evaluate"))


def _call(line: int, name: str = "train_step"):
    return (
        Frame(TORCH + "nn/functional.py", 100, "linear"),
        Frame("model.py", 12, "forward"),
        Frame(TORCH + "nn/modules/module.py", 1751, "_wrapped_call_impl"),
        Frame("train.py", line, name),
    )


def _training_step(sim: Sim, calls: int, *, oom_in_last: bool = False, state: list[int] | None = None):
    """`calls` model calls of 8 x 256 MiB each (a line apart, each output normalised by the step's
    own code), a loss, the backward and an AdamW step whose state is made once."""
    kept = []
    for call in range(calls):
        for block in range(8):
            if oom_in_last and call == calls - 1 and block == 7:
                sim.oom(256 * MiB, _call(40 + call))
                return None
            kept.append(sim.alloc(256 * MiB, _call(40 + call)))
        kept.append(sim.alloc(4 * MiB, NORM))
    loss = sim.alloc(4, LOSS)
    for block in [*kept, loss]:
        sim.free(block)
    grads = [sim.alloc(128 * MiB, BACKWARD_STACK) for _ in range(4)]
    if state is not None and not state:
        state.extend(sim.alloc(128 * MiB, ADAM_INIT_STACK) for _ in range(8))
    return grads


def test_a_pair_of_calls_per_step_is_not_inference_with_grad():
    sim = Sim(total_bytes=5 * GiB + 512 * MiB)
    for _ in range(4):
        sim.alloc(128 * MiB, SETUP_STACK)
    state: list[int] = []
    for grad in _training_step(sim, 2, state=state) or []:
        sim.free(grad)
    _training_step(sim, 2, oom_in_last=True, state=state)
    analysis = analyse(sim.snapshot(metadata=False))
    assert analysis.target_step == 1 and analysis.target_phase == "forward"
    verdicts = {analysis.verdict, *(f.verdict for f in analysis.secondary)}
    assert "inference-with-grad" not in verdicts
    assert "no-grad" not in {r.id for r in analysis.recommendations}


def test_more_calls_than_any_backward_consumed_keep_graphs():
    """After steps of one call each, an evaluation loop run with grad on: its passes keep their
    graphs, and that is still found."""
    sim = Sim(total_bytes=4 * GiB)
    for _ in range(4):
        sim.alloc(128 * MiB, SETUP_STACK)
    state: list[int] = []
    for grad in _training_step(sim, 1, state=state) or []:
        sim.free(grad)
    sim.release_cache()
    outputs = []
    for _batch in range(6):
        outputs.append(sim.alloc(1 * MiB, BATCH))
        for _block in range(4):
            if sim.reserved() + 256 * MiB > 4 * GiB:
                sim.oom(256 * MiB, _call(60, "evaluate"))
                break
            outputs.append(sim.alloc(256 * MiB, _call(60, "evaluate")))
        else:
            continue
        break
    analysis = analyse(sim.snapshot(metadata=False))
    verdicts = {analysis.verdict, *(f.verdict for f in analysis.secondary)}
    assert "inference-with-grad" in verdicts
