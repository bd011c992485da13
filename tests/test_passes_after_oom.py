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
    assert not rest.by_site  # one ratio explains the pass that tried again

    stopped = analyse(_caught_oom(goes_on=False).snapshot(metadata=False))  # the trace ends at the OOM
    rest = stopped.what_if.rest_of_pass
    assert rest is not None and rest.earlier_step == 0


def _embedded_step(sim: Sim, batch: int, seq: int, *, oom: bool = False) -> None:
    """An embedding (batch x seq x 2 MiB) then two layers of one code (each a projection, batch x
    seq MiB, at one site, and an attention matrix, batch x seq^2 / 8 MiB, at another) kept for the
    backward; with `oom`, the first layer's attention fails and the trace ends there."""
    kept = [sim.alloc(batch * seq * 2 * MiB, _site(5))]
    for _ in range(2):
        kept.append(sim.alloc(batch * seq * MiB, _site(10)))
        if oom:
            sim.oom(batch * seq * seq * MiB // 8, _site(11))
            return
        kept.append(sim.alloc(batch * seq * seq * MiB // 8, _site(11)))
    for block in kept:
        sim.free(block)
    grads = [sim.alloc(8 * MiB, BACKWARD_STACK) for _ in range(2)]
    for block in grads:
        sim.free(block)


def test_the_rest_of_a_pass_is_scaled_site_by_site_where_its_sites_grew_apart():
    """A sequence twice as long: the embedding and projections grow twice, the attention four
    times. At the OOM (the first attention) the pass had allocated 2.29x the earlier pass at that
    point, mostly the embedding's growth; scaled by that one ratio its own peak was 731 MiB, less
    than the 768 MiB it needs (256 + 2 x (128 + 128)). Each site's own ratio, read from the
    matched allocations (embedding 2, projection 2, attention 4), gives 768 MiB."""
    sim = Sim(total_bytes=1 * GiB)
    for _ in range(2):
        sim.alloc(8 * MiB, SETUP_STACK)
    _embedded_step(sim, 16, 4)
    _embedded_step(sim, 16, 8, oom=True)
    rest = analyse(sim.snapshot(metadata=False)).what_if.rest_of_pass
    assert rest is not None and rest.extrapolated and rest.earlier_step == 0
    assert round(rest.size_ratio, 2) == 2.29
    assert rest.projected_pass_bytes == 768 * MiB
    assert rest.by_site  # and the note says so: not the one ratio it states
