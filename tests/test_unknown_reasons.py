"""Why memory is "unknown": where the analysis knows why it could not say what blocks are, every
report says it (text, Markdown, JSON, the app), not a bare "unknown"."""

from __future__ import annotations

import json

import pytest

from oomdoctor.analysis import analyse
from oomdoctor.analysis.results import UnknownKind
from oomdoctor.errors import OomdoctorError
from oomdoctor.load import load
from oomdoctor.pipeline import render_report
from oomdoctor.views import phrasing
from tests.builders import BACKWARD_STACK, FOREACH_STACK, FORWARD_STACK, SETUP_STACK, USER_STACK, MiB, Sim
from tests.conftest import CORPUS, FIXTURES

# what the reports say of blocks left unknown because each outweighs the rest
OUTWEIGHING = (
    "what is in 4 blocks from before the trace (256.00 MiB): each is larger than all the other frame-less blocks"
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


def test_memory_left_unknown_by_the_script_s_own_code_says_why():
    """A block the script's own code made before recording began, in a function whose name says
    nothing (`train_step`), which the trace never frees: nothing places it. The reports said
    "unknown" and no more; they now say that its frames' names say no kind oomdoctor reads."""
    sim = Sim()
    for size in (4, 4, 2, 1) * 4:
        sim.alloc(size * MiB)
    sim.alloc(3 * MiB, USER_STACK)
    sim.start_recording()
    sim.free(sim.alloc(8 * MiB, FORWARD_STACK))
    snapshot = sim.snapshot(metadata=False)
    analysis = analyse(snapshot)
    assert analysis.component_bytes()["unknown"] == 3 * MiB
    said = [(u.count, u.bytes) for u in analysis.unknowns if u.kind == UnknownKind.PRE_TRACE_CODE_SAYS_NOTHING]
    assert said == [(1, 3 * MiB)]
    body = " ".join(render_report(snapshot, "text").decode().split())
    assert "what is in 1 block made by Python code outside torch before anything the file records (3.00 MiB)" in body


def _files() -> list:
    """Every fixture dump, and every corpus file where the corpus is present."""
    files = sorted((FIXTURES / "dumps").glob("*.pickle"))
    if CORPUS is not None:
        for folder in ("snapshots", "other_formats"):
            if (CORPUS / folder).is_dir():
                files += sorted(p for p in (CORPUS / folder).iterdir() if p.is_file())
    return [pytest.param(p, id=p.name) for p in files]


@pytest.mark.parametrize("path", _files())
def test_every_unknown_byte_has_its_reason(path):
    """Every block in the component "unknown" is counted under one of the reasons the reports give
    (blocks and bytes add up to the component's): none is a bare "unknown"."""
    try:
        analysis = analyse(load(str(path)))
    except OomdoctorError:
        pytest.skip("the loader refuses this file")
    share = next((s for s in analysis.components if s.name == "unknown"), None)
    reasons = [u for u in analysis.unknowns if u.kind in phrasing.UNKNOWN_COMPONENT_REASONS]
    assert (sum(u.count or 0 for u in reasons), sum(u.bytes or 0 for u in reasons)) == (
        (share.block_count, share.bytes) if share is not None else (0, 0)
    )


def test_expandable_segments_unknown_says_why():
    """A plain snapshot that records no allocator settings, whose segments do not say whether they
    are expandable: the fragmentation sections said "expandable segments: unknown" and no more."""
    snapshot = _inference_beside_a_cache().snapshot(metadata=False)
    assert analyse(snapshot).fragmentation.expandable_segments is None
    said = "expandable segments: unknown (the file records no allocator settings, and none of its segments shows whether they were on)"
    for form in ("text", "md"):
        assert said in " ".join(render_report(snapshot, form).decode().split()), form


def test_a_block_the_registry_does_not_name_in_an_unknown_phase_says_why():
    """A dump with oomdoctor's registry: a block made in the trace that the registry does not name,
    in no phase anything marks, is unknown by its phase alone. The reports now say so."""
    sim = Sim()
    sim.alloc(8 * MiB, SETUP_STACK, "parameter", "w")
    sim.alloc(3 * MiB)
    snapshot = sim.snapshot()
    analysis = analyse(snapshot)
    assert analysis.component_bytes()["unknown"] == 3 * MiB
    said = [(u.count, u.bytes) for u in analysis.unknowns if u.kind == UnknownKind.TRACED_UNNAMED]
    assert said == [(1, 3 * MiB)]
    body = " ".join(render_report(snapshot, "text").decode().split())
    assert (
        "what is in 1 block made in the trace (3.00 MiB): oomdoctor's registry of named tensors does not name it"
        in body
    )
