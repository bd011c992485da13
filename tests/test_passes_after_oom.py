"""A script that catches the OOM and goes on (a smaller batch tried again, as many training loops
do): the passes after the OOM ran the same layers to their end, and the one whose allocations
scale by one ratio tells the rest of the interrupted pass better than an earlier pass of another
shape."""

from __future__ import annotations

from oomdoctor.analysis import analyse
from oomdoctor.model import Frame
from tests.builders import BACKWARD_STACK, SETUP_STACK, GiB, MiB, Sim

TORCH = "/usr/lib/python3/site-packages/torch/"


def _site(line: int):
    return (
        Frame(TORCH + "nn/functional.py", 100, "linear"),
        Frame("model.py", line, "forward"),
        Frame(TORCH + "nn/modules/module.py", 1751, "_wrapped_call_impl"),
        Frame("train.py", 40, "train_step"),
    )


def _step(sim: Sim, batch: int, seq: int, *, oom_at_layer: int | None = None) -> None:
    """Two layers, each a projection (batch x seq MiB) and an attention matrix (batch x seq^2 / 8
    MiB), and a head's logits (batch x seq x 4 MiB), kept for the backward; then the backward's
    gradients, freed by the next zero_grad."""
    kept = []
    for layer in range(2):
        kept.append(sim.alloc(batch * seq * MiB, _site(10 + 2 * layer)))
        if layer == oom_at_layer:
            sim.oom(batch * seq * seq * MiB // 8, _site(11 + 2 * layer))
            for block in kept:  # the script catches the OOM: the pass's tensors go
                sim.free(block)
            sim.release_cache()
            return
        kept.append(sim.alloc(batch * seq * seq * MiB // 8, _site(11 + 2 * layer)))
    kept.append(sim.alloc(batch * seq * 4 * MiB, _site(20)))
    for block in kept:
        sim.free(block)
    grads = [sim.alloc(8 * MiB, BACKWARD_STACK) for _ in range(2)]
    for block in grads:
        sim.free(block)


def _caught_oom(*, goes_on: bool) -> Sim:
    sim = Sim(total_bytes=1 * GiB)
    for _ in range(2):
        sim.alloc(8 * MiB, SETUP_STACK)
    _step(sim, 16, 4)  # a short sequence: 2 x (64 + 32) MiB and 256 MiB of logits
    _step(sim, 16, 8, oom_at_layer=0)  # twice as long: attention four times, the rest twice
    if goes_on:
        _step(sim, 8, 8)  # the same sequence at half the batch fits
        _step(sim, 8, 8)
        sim.alloc(MiB, _site(10))  # the next step begins
    return sim


def test_the_rest_of_a_caught_oom_s_pass_is_read_from_the_pass_that_tried_again():
    """The OOM'd pass (batch 16, sequence 8) is followed by the same layers at half the batch,
    which ran to their end: by them its own peak is twice theirs, 2 x (2 x (64 + 64) + 256) MiB
    = 1 GiB, the truth. The earlier pass, of half the sequence, has the projections and logits
    at half and the attention at a quarter: its ratio at the OOM (2.67, its first layer's) projected
    1195 MiB, and in the catch-OOM GPT run said that halving the batch would not fit, though the
    run itself went on at half the batch and fit."""
    analysis = analyse(_caught_oom(goes_on=True).snapshot(metadata=False))
    rest = analysis.what_if.rest_of_pass
    assert rest is not None and rest.extrapolated
    assert rest.earlier_step == 2
    assert rest.size_ratio == 2.0
    assert rest.projected_pass_bytes == 1024 * MiB

    stopped = analyse(_caught_oom(goes_on=False).snapshot(metadata=False))  # the trace ends at the OOM
    rest = stopped.what_if.rest_of_pass
    assert rest is not None and rest.earlier_step == 0
