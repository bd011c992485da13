"""Advice where the file cannot tell: a saving estimated at the OOM of a pass whose rest nothing
shows is a lower bound, and said so."""

from __future__ import annotations

import dataclasses

from oomdoctor.analysis import analyse
from oomdoctor.analysis.results import Change
from oomdoctor.pipeline import render_report
from tests.builders import FORWARD_STACK, SETUP_STACK, Sim

MiB = 1 << 20


def _forward_cut_short(*, annotations_recorded: bool):
    """Weights, then one forward whose activations grow until a request fails: no earlier pass, no
    backward, no optimizer; no oomdoctor metadata."""
    sim = Sim(total_bytes=1024 * MiB)
    sim.alloc(128 * MiB, SETUP_STACK)
    for _ in range(6):
        sim.alloc(128 * MiB, FORWARD_STACK)
    sim.oom(256 * MiB, FORWARD_STACK)
    return dataclasses.replace(sim.snapshot(metadata=False), annotations_recorded=annotations_recorded)


def test_a_saving_at_the_oom_of_a_pass_whose_rest_is_unknown_is_a_lower_bound():
    """The OOM cut the forward short and nothing shows its rest: what halving the batch saves at the
    pass's peak is at least what it saves at the OOM; the report says "at least" and what it is of."""
    snapshot = _forward_cut_short(annotations_recorded=True)
    analysis = analyse(snapshot)
    assert analysis.what_if.rest_of_pass is not None and not analysis.what_if.rest_of_pass.extrapolated
    batch = next(r for r in analysis.recommendations if r.id == Change.SMALLER_BATCH)
    assert batch.saved_at_least
    text = render_report(snapshot, "text", analysis=analysis).decode()
    assert "saves at least " in text and "estimated at the OOM" in text
    markdown = render_report(snapshot, "md", analysis=analysis).decode()
    assert "| at least " in markdown
    assert b'"estimated_saved_is_lower_bound": true' in render_report(snapshot, "json", analysis=analysis)
