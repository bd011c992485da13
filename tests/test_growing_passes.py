"""A loop of passes that each leave more allocated than the last (a generation loop whose key/value
cache is concatenated each token) runs out inside one of them: a smaller batch, or a place for
this request, lets this pass through, but each pass still to come needs more, and how many come
the file does not say. So neither is said to fit on its own. (A held-out greedy decoder, batch 16,
400 new tokens on a 256 MiB device, read "would fit on its own" for expandable segments; rehearsed
with them it still ran out, 31 MiB of cache later.)"""

from __future__ import annotations

from oomdoctor.analysis import analyse
from tests.builders import FORWARD_STACK, SETUP_STACK, MiB, Sim


def _decoder(*, growing: bool) -> Sim:
    """Five passes of an evaluation loop, each replacing the cache it was given by one 2 MiB larger
    (or as large, without `growing`) and making a 16 MiB temporary it frees; the sixth runs out on its
    temporary, 8 MiB short."""
    sim = Sim(total_bytes=200 * MiB)
    sim.alloc(64 * MiB, SETUP_STACK, "parameter", "decoder.weight")
    cache = sim.alloc(32 * MiB, FORWARD_STACK)
    for token in range(6):
        sim.marker("evaluation", "start")
        grown = sim.alloc((32 + (2 * token + 2 if growing else 0)) * MiB, FORWARD_STACK)
        sim.free(cache)
        cache = grown
        if token == 5:
            sim.oom(120 * MiB - (4 * MiB if growing else 0), FORWARD_STACK)
            break
        sim.free(sim.alloc(16 * MiB, FORWARD_STACK))
        sim.marker("evaluation", "end")
    return sim


def _halving(growing: bool):
    result = analyse(_decoder(growing=growing).snapshot())
    assert result.target_phase == "evaluation"
    return next(r for r in result.recommendations if r.id == "smaller-batch")


def test_a_smaller_batch_is_not_said_to_fit_where_each_pass_needs_more():
    assert _halving(growing=True).would_fit_alone is None


def test_a_smaller_batch_fits_where_the_passes_do_not_grow():
    assert _halving(growing=False).would_fit_alone is True
