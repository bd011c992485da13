"""Halving the micro-batch and accumulating gradients over two micro-batches keeps the first
micro-batch's gradients, every trained parameter's, alive through the second's forward and
backward. At a moment in a pass that did not hold them yet (the run frees them with
`zero_grad(set_to_none=True)`), that change saves half the batch-sized bytes less the gradients,
and "would fit" is judged with them. Rehearsed (a GPT trained with SGD on sequence lengths 64, 64,
128, batch 16, on 130 MiB): batch 8 accumulated over two micro-batches peaks 10.5 MiB (the
gradients) above batch 8 alone, saves 72 MiB of the 186 MiB peak and runs out on 130 MiB; the
report said 97.5 MiB and that it would fit."""

from __future__ import annotations

from oomdoctor.analysis import analyse
from oomdoctor.model import Frame
from tests.builders import FOREACH_STACK, FORWARD_STACK, MiB, Sim

BACKWARD_STACK = (Frame("train.py", 42, "train_step"),)


def _two_steps(set_to_none: bool, total_mib: int):
    """Four 16 MiB parameters; step 0 fits, step 1's forward saves twice as much and its backward
    runs out asking for 40 MiB. With `set_to_none` the gradients are freed before each forward;
    without it step 0's gradients stay (and are accumulated into)."""
    sim = Sim(total_bytes=total_mib * MiB)
    for i in range(4):
        sim.alloc(16 * MiB, component="parameter", name=f"layer{i}.weight")
    grads: list[int] = []
    for step in range(2):
        if set_to_none:
            for address in grads:
                sim.free(address)
            grads = []
        sim.marker("forward", "start")
        saved = [sim.alloc((12 + 12 * step) * MiB, FORWARD_STACK, component="activation") for _ in range(4)]
        sim.marker("forward", "end")
        sim.marker("backward", "start")
        if step == 1:
            sim.oom(40 * MiB, BACKWARD_STACK)
            break
        for address in saved:
            sim.free(address)
        grads = [
            sim.alloc(16 * MiB, BACKWARD_STACK, component="gradient", name=f"layer{i}.weight.grad") for i in range(4)
        ]
        sim.marker("backward", "end")
        sim.marker("optimizer_step", "start")
        for address in [sim.alloc(16 * MiB, FOREACH_STACK) for _ in range(4)]:
            sim.free(address)
        sim.marker("optimizer_step", "end")
    return analyse(sim.snapshot())


def _halving(analysis):
    return next(r for r in analysis.recommendations if r.id == "smaller-micro-batch")


def test_accumulation_holds_the_gradients_the_moment_did_not():
    # 96 MiB of activations and the 40 MiB request scale: halved, 68 MiB less; but the first
    # micro-batch's 64 MiB of gradients are alive through the second's pass
    analysis = _two_steps(set_to_none=True, total_mib=170)
    assert analysis.what_if is not None and analysis.what_if.fits_at(0.5) is True  # a smaller batch alone fits
    halving = _halving(analysis)
    assert halving.estimated_saved_bytes == 4 * MiB
    assert halving.would_fit_alone is False  # 64 + 68 + 64 MiB of gradients > 170 MiB


def test_gradients_alive_at_the_moment_cost_accumulation_nothing():
    # (on 222 MiB: the halved run's peak leaves room for a new segment of each pool, 22 MiB)
    analysis = _two_steps(set_to_none=False, total_mib=222)
    halving = _halving(analysis)
    assert halving.estimated_saved_bytes == 68 * MiB
    assert halving.would_fit_alone is True


def test_a_run_that_accumulates_already_holds_them_in_its_own_later_micro_batches():
    # two micro-batches per step; step 1's first micro-batch runs out in its backward: at that moment
    # neither this run nor one with half the micro-batch holds gradients (rehearsed: the realism
    # variant accumulation-optimizer-state-gpt-adamw, batch 16 over 2 -> 8 over 4, saves 82 MiB,
    # half its batch-sized bytes)
    sim = Sim(total_bytes=170 * MiB)
    for i in range(4):
        sim.alloc(16 * MiB, component="parameter", name=f"layer{i}.weight")
    grads: list[int] = []
    for step in range(2):
        for _micro in range(2):
            sim.marker("forward", "start")
            saved = [sim.alloc((12 + 12 * step) * MiB, FORWARD_STACK, component="activation") for _ in range(4)]
            sim.marker("forward", "end")
            sim.marker("backward", "start")
            if step == 1:
                sim.oom(40 * MiB, BACKWARD_STACK)
                break
            for address in saved:
                sim.free(address)
            if not grads:
                grads = [
                    sim.alloc(16 * MiB, BACKWARD_STACK, component="gradient", name=f"layer{i}.weight.grad")
                    for i in range(4)
                ]
            sim.marker("backward", "end")
        if step == 1:
            break
        sim.marker("optimizer_step", "start")
        for address in [sim.alloc(16 * MiB, FOREACH_STACK) for _ in range(4)]:
            sim.free(address)
        sim.marker("optimizer_step", "end")
        for address in grads:
            sim.free(address)
        grads = []
    analysis = analyse(sim.snapshot())
    assert analysis.target_phase == "backward"
    assert _halving(analysis).estimated_saved_bytes == 68 * MiB


def _leaking_steps(keep_every_step: bool):
    """Three steps over 4 MiB of parameters (zero_grad(set_to_none) frees their gradients) whose
    forward makes four 8 MiB activations and a 2 MiB output; `keep_every_step`: every step's
    output is kept (a list of predictions), else only the latest (a loop variable). The fourth
    step's forward runs out."""
    sim = Sim(total_bytes=120 * MiB)
    sim.alloc(4 * MiB, component="parameter", name="w")
    kept: list[int] = []
    for step in range(4):
        sim.marker("forward", "start")
        saved = [sim.alloc(8 * MiB, FORWARD_STACK, component="activation") for _ in range(4)]
        if step == 3:
            sim.oom(8 * MiB, FORWARD_STACK)
            break
        output = sim.alloc(2 * MiB, FORWARD_STACK, component="activation")
        sim.marker("forward", "end")
        sim.marker("backward", "start")
        for address in saved:
            sim.free(address)
        grad = sim.alloc(4 * MiB, BACKWARD_STACK, component="gradient", name="w.grad")
        sim.marker("backward", "end")
        sim.marker("optimizer_step", "start")
        sim.marker("optimizer_step", "end")
        sim.free(grad)
        if not keep_every_step and kept:
            sim.free(kept.pop())
        kept.append(output)
    return analyse(sim.snapshot())


def test_what_earlier_steps_kept_does_not_halve_with_the_micro_batch():
    # slow-leak-mlp-kept-predictions, rehearsed at batch 512 over two micro-batches: the peak fell by
    # 3.9 MiB of 344 MiB, not the 147.7 MiB said: each micro-batch's predictions are kept, half as large
    leaking = _leaking_steps(keep_every_step=True)
    latest = _leaking_steps(keep_every_step=False)
    gradient = 4 * MiB  # held over by the first micro-batch in both
    assert _halving(latest).estimated_saved_bytes == latest.what_if.scalable_bytes // 2 - gradient
    # three steps' 2 MiB outputs: their half stays
    assert _halving(leaking).estimated_saved_bytes == leaking.what_if.scalable_bytes // 2 - 3 * MiB - gradient
