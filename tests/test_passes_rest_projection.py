"""The rest of a pass the OOM interrupted, followed allocation by allocation from the point it came
to: each earlier allocation at the size this pass made its match, or the ratio its site and size
grew by, and the blocks from before the pass that its rest frees (the previous step's outputs a loop
variable held) gone where the earlier pass freed theirs."""

from __future__ import annotations

from pathlib import Path

from oomdoctor.analysis import analyse
from oomdoctor.load import load
from oomdoctor.model import Frame
from tests.builders import SETUP_STACK, GiB, MiB, Sim

TORCH = "/usr/lib/python3/site-packages/torch/"
FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "dumps"


def _site(line: int):
    return (
        Frame(TORCH + "nn/functional.py", 100, "linear"),
        Frame("model.py", line, "forward"),
        Frame(TORCH + "nn/modules/module.py", 1751, "_wrapped_call_impl"),
        Frame("train.py", 40, "train_step"),
    )


LOOP = (Frame("train.py", 41, "train_step"),)  # `logits, loss = model(...)`: the old logits go


def _step(sim: Sim, batch: int, previous: int | None, *, oom: bool = False) -> int | None:
    """Two layers (batch MiB each) and logits (4 x batch MiB) that the loop's variable keeps until
    the next forward returns; then the backward: the logits' gradient (their size, no frames) first,
    then everything of the pass freed. Returns the logits; with `oom`, the second layer fails."""
    kept = [sim.alloc(batch * MiB, _site(10))]
    if oom:
        sim.oom(batch * MiB, _site(11))
        return None
    kept.append(sim.alloc(batch * MiB, _site(11)))
    logits = sim.alloc(4 * batch * MiB, _site(20))
    if previous is not None:
        sim.free(previous, LOOP)
    gradient = sim.alloc(4 * batch * MiB)
    for block in (*kept, gradient):
        sim.free(block)
    return logits


def test_the_rest_of_a_pass_frees_what_the_loop_held_from_the_step_before():
    """Batch 16, 16, then 32, whose second layer fails. Step 2's rest: its second layer (32 MiB, the
    request), its logits (128 MiB), then step 1's logits (64 MiB, alive at the OOM) go, then the
    logits' gradient (128 MiB): at that peak the pass holds 320 MiB of its own and step 1's logits
    are gone, 224 MiB above what was allocated before the request (32 MiB of the pass's own, 64 of
    step 1's logits). Scaled from step 1's own peak alone (2 x 160 MiB), the rest was put at 288 MiB:
    the 64 MiB that step 1 freed of step 0's logits was not counted gone."""
    sim = Sim(total_bytes=1 * GiB)
    sim.alloc(8 * MiB, SETUP_STACK)
    logits = _step(sim, 16, None)
    logits = _step(sim, 16, logits)
    _step(sim, 32, logits, oom=True)
    rest = analyse(sim.snapshot(metadata=False)).what_if.rest_of_pass
    assert rest is not None and rest.extrapolated and rest.size_ratio == 2.0
    assert rest.pass_bytes == 32 * MiB
    assert rest.extra_bytes == 224 * MiB
    assert rest.freed_bytes == rest.freed_scaled_bytes == 64 * MiB
    assert rest.projected_pass_bytes == 320 * MiB


def _layered_step(sim: Sim, batch: int, seq: int, *, oom: bool = False) -> None:
    """Two layers, each a norm (batch x seq MiB), then at one line a copy of its input (batch x seq
    MiB) and the scores (batch x seq^2 / 8 MiB), then an MLP (2 x batch x seq MiB), then a head
    (4 x batch x seq MiB), all kept for the backward, which makes the head's gradient (its size, no
    frames) and frees them. With `oom`, the second layer's norm fails."""
    kept = []
    for layer in range(2):
        if oom and layer == 1:
            sim.oom(batch * seq * MiB, _site(10))
            return
        kept.append(sim.alloc(batch * seq * MiB, _site(10)))
        kept.append(sim.alloc(batch * seq * MiB, _site(12)))
        kept.append(sim.alloc(batch * seq * seq * MiB // 8, _site(12)))
        kept.append(sim.alloc(2 * batch * seq * MiB, _site(14)))
    kept.append(sim.alloc(4 * batch * seq * MiB, _site(20)))
    gradient = sim.alloc(4 * batch * seq * MiB)
    for block in (*kept, gradient):
        sim.free(block)


def test_an_interrupted_pass_s_rest_grows_by_site_and_size_and_unreached_sites_as_most_did():
    """A sequence twice as long (4, then 8; batch 16): the scores grow four times, everything else
    twice. The line that makes the copy and the scores made one of each in the first layer, which
    grew by 2 and by 4 (their blend, 2.67, fits neither); the head, a site the pass had not reached,
    grows as the most sites did (the norm's, the MLP's: 2), and its gradient with it (a gradient has
    the size of what it is the gradient of). Its own peak is then 2 x (128 + 128 + 128 + 256) + 512
    + 512 = 2304 MiB, the truth; scaled by each site's blend and the head and its gradient by the
    matched bytes' (2.18), it was 2397 MiB."""
    sim = Sim(total_bytes=4 * GiB)
    sim.alloc(8 * MiB, SETUP_STACK)
    _layered_step(sim, 16, 4)
    _layered_step(sim, 16, 8, oom=True)
    rest = analyse(sim.snapshot(metadata=False)).what_if.rest_of_pass
    assert rest is not None and rest.extrapolated and rest.by_site
    assert rest.pass_bytes == 640 * MiB
    assert rest.projected_pass_bytes == 2304 * MiB


def test_a_smaller_micro_batch_is_not_said_to_fit_by_a_rest_partly_guessed():
    """The GPT whose sequence doubled (activation-spike-gpt-longer-sequence): its rest is scaled site
    by site, the head's allocations, at sites the pass had not reached, by a guess. By the figure
    halving the micro-batch fits (its allocated peak, rehearsed, is 114 MiB of the 130 MiB device),
    but rehearsed it runs out: its cache needed 140 MiB. No fit is claimed, and no "not enough"."""
    analysis = analyse(load(FIXTURES / "activation-spike-gpt-longer-sequence.pickle"))
    rest = analysis.what_if.rest_of_pass
    assert rest is not None and rest.extrapolated and rest.by_site
    halve = next(r for r in analysis.recommendations if r.id == "smaller-micro-batch")
    assert halve.would_fit_alone is None


def _closure_step(sim: Sim, batch: int, gradients: list[int], *, oom: bool = False) -> list[int]:
    """A training step run as an optimizer's closure (Lightning's): two layers (batch MiB each) and
    logits (4 x batch MiB); then zero_grad frees the previous step's gradients (2 x 8 MiB, no
    frames), the backward makes the logits' gradient, frees the pass and makes the new gradients,
    alive until the next step's zero_grad. With `oom`, the second layer fails."""
    kept = [sim.alloc(batch * MiB, _site(10))]
    if oom:
        sim.oom(batch * MiB, _site(11))
        return []
    kept.append(sim.alloc(batch * MiB, _site(11)))
    kept.append(sim.alloc(4 * batch * MiB, _site(20)))
    for gradient in gradients:
        sim.free(gradient)
    kept.append(sim.alloc(4 * batch * MiB))
    for block in kept:
        sim.free(block)
    return [sim.alloc(8 * MiB) for _ in range(2)]


def test_the_rest_of_a_closure_s_pass_frees_the_previous_step_s_gradients():
    """Batch 16, 16, then 32, whose second layer fails; the previous step's gradients (16 MiB) are
    alive at the OOM. The rest: the second layer (32 MiB, the request), the logits (128 MiB), the
    zero_grad inside the pass frees those gradients, the logits' gradient (128 MiB): at that peak
    320 MiB of the pass's own, the old gradients gone: 272 MiB above what was allocated before the
    request. Scaled from step 1's own peak, it was 288 MiB: the gradients its zero_grad freed, made
    by the backward before it with no frames, were not counted gone (they are matched by size)."""
    sim = Sim(total_bytes=1 * GiB)
    sim.alloc(8 * MiB, SETUP_STACK)
    gradients = _closure_step(sim, 16, [])
    gradients = _closure_step(sim, 16, gradients)
    _closure_step(sim, 32, gradients, oom=True)
    rest = analyse(sim.snapshot(metadata=False)).what_if.rest_of_pass
    assert rest is not None and rest.extrapolated and rest.size_ratio == 2.0
    assert rest.extra_bytes == 272 * MiB
    assert rest.freed_bytes == 16 * MiB


def _plain_step(sim: Sim, batch: int, *, oom: bool = False) -> None:
    """Two layers (batch MiB each; the first placed in a block half a MiB larger, unsplit, as the
    allocator leaves a remainder under its split threshold), logits (4 x batch MiB), the logits'
    gradient (the same, no frames), all freed. With `oom`, the second layer fails."""
    kept = [sim.alloc(batch * MiB, _site(10), remainder=MiB // 2)]
    if oom:
        sim.oom(batch * MiB, _site(11))
        return
    kept.append(sim.alloc(batch * MiB, _site(11)))
    kept.append(sim.alloc(4 * batch * MiB, _site(20)))
    kept.append(sim.alloc(4 * batch * MiB))
    for block in kept:
        sim.free(block)


def test_the_rest_of_a_pass_is_counted_from_the_oom_in_the_trace_s_own_bytes():
    """Batch 16, 16, then 32, whose second layer fails: the rest adds 32 + 128 + 128 = 288 MiB to
    what was allocated before the request, whatever the blocks' unsplit remainders. The projected
    own peak (320 MiB, the trace's sizes) less the pass's blocks at the OOM (32.5 MiB, a remainder
    included) put it at 287.5 MiB."""
    sim = Sim(total_bytes=1 * GiB)
    sim.alloc(8 * MiB, SETUP_STACK)
    for batch in (16, 16):
        _plain_step(sim, batch)
    _plain_step(sim, 32, oom=True)
    rest = analyse(sim.snapshot(metadata=False)).what_if.rest_of_pass
    assert rest is not None and rest.extrapolated and rest.size_ratio == 2.0
    assert rest.pass_bytes == 32 * MiB + MiB // 2
    assert rest.extra_bytes == 288 * MiB
