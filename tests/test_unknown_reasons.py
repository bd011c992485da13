"""Why memory is "unknown": where the analysis knows why it could not say what blocks are, every
report says it (text, Markdown, JSON, the app), not a bare "unknown"."""

from __future__ import annotations

import json

import pytest

from oomdoctor.analysis import analyse
from oomdoctor.analysis.results import UnknownKind
from oomdoctor.pipeline import render_report
from tests.builders import BACKWARD_STACK, FOREACH_STACK, FORWARD_STACK, MiB, Sim

# what the reports say of blocks left unknown because each outweighs the rest
OUTWEIGHING = (
    "what 4 blocks from before the trace are (256.00 MiB): each is larger than all the other frame-less blocks"
)
WHICH = "a cache or pool allocated up front (a KV cache) or the model's own largest weights, untrained; the file cannot tell which"


def _inference_beside_a_cache() -> Sim:
    """An inference engine that allocated its KV cache up front (four 64 MiB blocks) beside a
    model's weights, before recording began; the trace runs two forwards."""
    sim = Sim()
    for size in (4, 4, 2, 1) * 4:
        sim.alloc(size * MiB)
    for _ in range(4):
        sim.alloc(64 * MiB)
    sim.start_recording()
    for _ in range(2):
        sim.free(sim.alloc(8 * MiB, FORWARD_STACK))
    return sim


def test_blocks_unknown_because_each_outweighs_the_rest_say_why_in_every_report():
    """The four cache blocks are unknown (a pool or the model's own huge weight: nothing in a
    frame-less block says which). The reports said only "unknown"; they now say why."""
    snapshot = _inference_beside_a_cache().snapshot(metadata=False)
    analysis = analyse(snapshot)
    assert analysis.component_bytes()["unknown"] == 256 * MiB
    said = [u for u in analysis.unknowns if u.kind == UnknownKind.PRE_TRACE_OUTWEIGHING]
    assert [(u.count, u.bytes) for u in said] == [(4, 256 * MiB)]
    for form in ("text", "md"):
        body = " ".join(render_report(snapshot, form).decode().split())
        assert OUTWEIGHING in body and WHICH in body, form
    report = json.loads(render_report(snapshot, "json"))
    unknown = next(row for row in report["component_detail"] if row["name"] == "unknown")
    assert OUTWEIGHING in unknown["reason"] and WHICH in unknown["reason"]
    assert any(OUTWEIGHING in line for line in report["unknowns"])
    assert all("reason" not in row for row in report["component_detail"] if row["name"] != "unknown")


def test_the_app_says_why_the_blocks_are_unknown():
    pytest.importorskip("textual")
    from oomdoctor.tui import content

    analysis = analyse(_inference_beside_a_cache().snapshot(metadata=False))
    sections = {s.title: s.lines for s in content.overview_sections(analysis, "dump.pickle")}
    assert any(OUTWEIGHING in line and WHICH in line for line in sections["Not determined from this file"])


def test_blocks_a_completed_backward_made_no_gradient_of_say_why_too():
    """Training beside a KV cache (recording begun after the first AdamW step): the backward kept
    gradients of the weights' shapes, none of the cache's, so the cache blocks are unknown, and the
    reports say why, as in a run that does not train."""
    sim = Sim(total_bytes=4 << 30)
    shapes = (4, 4, 2, 1)
    for _ in range(3):  # the weights and Adam's two moments
        for size in shapes:
            sim.alloc(size * MiB)
    for _ in range(4):
        sim.alloc(64 * MiB)
    sim.start_recording()
    sim.free(sim.alloc(8 * MiB, FORWARD_STACK))
    gradients = [sim.alloc(size * MiB, BACKWARD_STACK) for size in shapes]
    sim.free(sim.alloc(4 * MiB, FOREACH_STACK))
    for gradient in gradients:
        sim.free(gradient)
    sim.free(sim.alloc(8 * MiB, FORWARD_STACK))
    snapshot = sim.snapshot(metadata=False)
    assert analyse(snapshot).component_bytes()["unknown"] == 256 * MiB
    body = " ".join(render_report(snapshot, "text").decode().split())
    assert OUTWEIGHING in body and WHICH in body
