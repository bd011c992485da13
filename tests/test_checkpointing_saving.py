"""Activation checkpointing's rule of thumb saves part of the judged pass's own activations, never
what earlier steps left alive (a leak's tensors, which no recomputation frees); where the stacks show
the regions, a graph an earlier step kept shrinks to its regions' inputs too
(tests/test_checkpointing_regions.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from oomdoctor.analysis import analyse
from oomdoctor.load import load
from oomdoctor.model import Frame
from oomdoctor.views import phrasing
from tests.builders import BACKWARD_STACK, SETUP_STACK, MiB, Sim

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "dumps"


def _own_and_leaked(name: str):
    analysis = analyse(load(FIXTURES / name))
    assert analysis.verdict == "creeping-leak"
    own = sum(
        b.size_bytes
        for b in analysis.live_blocks
        if b.component == "activations" and not (b.step is not None and b.step < (analysis.target_step or 0))
    )
    leaked = sum(b.size_bytes for b in analysis.live_blocks if b.component == "activations") - own
    assert leaked > own  # the leak's tensors are most of the activations
    rest = analysis.what_if.rest_of_pass  # an interrupted pass's rest counts, extrapolated
    rest_extra = max(0, rest.projected_pass_bytes - rest.pass_bytes) if rest is not None and rest.extrapolated else 0
    rec = next(r for r in analysis.recommendations if r.id == "activation-checkpointing")
    return rec, own, leaked, rest_extra


@pytest.mark.parametrize("name", ["creeping-leak-mlp-sgd.pickle", "realism/slow-leak-mlp-kept-predictions.pickle"])
def test_a_sequential_s_saving_is_measured_and_never_more_than_the_activations_held(name):
    """An MLP whose layers are a Sequential of torch's own modules: cut as checkpoint_sequential
    cuts it (regions.py), its saving is measured from the file, not the rule of thumb, and is never
    more than what the pass and the graphs earlier steps kept hold (rehearsed: 30.0 and 3.8 MiB)."""
    rec, own, leaked, rest_extra = _own_and_leaked(name)
    assert not rec.rule_of_thumb and rec.regions.sequential
    assert 0 < rec.estimated_saved_bytes < own + leaked + rest_extra


def test_checkpointing_shrinks_the_graphs_a_leak_kept():
    """The GPT's blocks are regions; the graphs earlier steps kept (`retain_graph=True`) shrink to
    their inputs, which the pass's own activations alone do not cover (rehearsed: 264 MiB saved)."""
    rec, own, leaked, rest_extra = _own_and_leaked("creeping-leak-gpt-adamw.pickle")
    assert not rec.rule_of_thumb
    assert own + rest_extra < rec.estimated_saved_bytes < own + leaked + rest_extra


CHECKPOINTED_STACK = (  # a layer's op inside torch.utils.checkpoint's region (use_reentrant=False)
    Frame("/usr/lib/python3/site-packages/torch/nn/functional.py", 100, "linear"),
    Frame("model.py", 12, "forward"),
    Frame("/usr/lib/python3/site-packages/torch/nn/modules/module.py", 1751, "_wrapped_call_impl"),
    Frame("/usr/lib/python3/site-packages/torch/utils/checkpoint.py", 519, "checkpoint"),
    Frame("train.py", 40, "train_step"),
)


def test_checkpointing_saves_nothing_of_activations_inside_checkpointed_regions():
    """A run that checkpoints its blocks already: its live activations at a forward OOM are the
    running block's inside (attention scores) and the blocks' outputs, all made inside
    torch/utils/checkpoint.py. Checkpointing them again frees nothing; it was advised at 70% of them."""
    sim = Sim(total_bytes=160 * MiB)
    sim.alloc(8 * MiB, SETUP_STACK, "parameter", "w")
    sim.marker("forward", "start")
    kept = [sim.alloc(4 * MiB, CHECKPOINTED_STACK) for _ in range(2)]
    sim.marker("forward", "end")
    sim.marker("backward", "start")
    for address in kept:
        sim.free(address)
    sim.alloc(8 * MiB, BACKWARD_STACK, "gradient", "w.grad")
    sim.marker("backward", "end")
    sim.marker("optimizer_step", "start")
    sim.marker("optimizer_step", "end")
    sim.marker("forward", "start")
    for _ in range(8):
        sim.alloc(16 * MiB, CHECKPOINTED_STACK)
    sim.oom(64 * MiB, CHECKPOINTED_STACK)
    analysis = analyse(sim.snapshot())
    assert analysis.target_phase == "forward"
    saved = {r.id: r.estimated_saved_bytes for r in analysis.recommendations}.get("activation-checkpointing", 0)
    assert saved == 0


RECOMPUTE_STACK = (  # a checkpointed block's forward run again by the backward
    Frame("/usr/lib/python3/site-packages/torch/nn/functional.py", 100, "linear"),
    Frame("model.py", 12, "forward"),
    Frame("/usr/lib/python3/site-packages/torch/utils/checkpoint.py", 1688, "recompute_fn"),
    *BACKWARD_STACK,
)


def _checkpointed_step(sim: Sim, recompute_mib: int, *, oom: bool = False) -> None:
    """A step of a model that checkpoints its blocks: forward keeps two 1 MiB block outputs, the
    backward recomputes a block (four tensors of `recompute_mib`) and makes an 8 MiB gradient."""
    sim.marker("forward", "start")
    kept = [sim.alloc(MiB, CHECKPOINTED_STACK) for _ in range(2)]
    sim.marker("forward", "end")
    sim.marker("backward", "start")
    recomputed = [sim.alloc(recompute_mib * MiB, RECOMPUTE_STACK) for _ in range(3)]
    if oom:
        sim.oom(recompute_mib * MiB, RECOMPUTE_STACK)
        return
    for address in [*recomputed, *kept]:
        sim.free(address)
    grad = sim.alloc(8 * MiB, BACKWARD_STACK, "gradient", "w.grad")
    sim.marker("backward", "end")
    sim.marker("optimizer_step", "start")
    sim.marker("optimizer_step", "end")
    sim.marker("zero_grad", "start")
    sim.free(grad)
    sim.marker("zero_grad", "end")


def test_a_backward_whose_recompute_fills_memory_is_not_said_to_be_dominated_by_activations():
    """The OOM in a checkpointed model's backward, recomputing a block at a longer sequence: 96 MiB
    of the backward's temporaries and 2 MiB of activations (the block outputs forward kept). The
    summary said 'Activations alive in the backward (2.00 MiB ...) dominate live memory'."""
    sim = Sim(total_bytes=128 * MiB)
    sim.alloc(8 * MiB, SETUP_STACK, "parameter", "w")
    for _ in range(2):
        _checkpointed_step(sim, 8)
    _checkpointed_step(sim, 32, oom=True)
    analysis = analyse(sim.snapshot())
    assert analysis.target_phase == "backward" and analysis.verdict == "activation-spike"
    summary = phrasing.summary(analysis.summary)
    assert "temporaries" in summary and "96.00 MiB of them the backward's temporaries" in summary, summary
    # against the earlier steps' whole peaks (8 MiB parameters, 2 MiB kept, 24 MiB recomputed): 98 / 34
    earlier = next(e for e in analysis.evidence if e.kind == "earlier-peak-activations")
    assert earlier.bytes == 34 * MiB
