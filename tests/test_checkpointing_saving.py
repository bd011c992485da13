"""Activation checkpointing saves part of the judged pass's own activations, never what earlier
steps left alive (a leak's tensors, which no recomputation frees)."""

from __future__ import annotations

from pathlib import Path

import pytest

from oomdoctor.analysis import analyse
from oomdoctor.analysis.recommendations import CHECKPOINTING_SAVES
from oomdoctor.load import load

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "dumps"


@pytest.mark.parametrize(
    "name",
    ["creeping-leak-gpt-adamw.pickle", "creeping-leak-mlp-sgd.pickle", "realism/slow-leak-mlp-kept-predictions.pickle"],
)
def test_checkpointing_saves_only_the_pass_s_own_activations(name):
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
    saved = {r.id: r.estimated_saved_bytes for r in analysis.recommendations}["activation-checkpointing"]
    assert saved <= (own + rest_extra) * CHECKPOINTING_SAVES + 1
    assert saved < (own + leaked + rest_extra) * CHECKPOINTING_SAVES
