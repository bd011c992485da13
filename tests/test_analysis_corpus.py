"""Every real snapshot of the corpus gets an analysis and a report, and its accounting adds up."""

from __future__ import annotations

import orjson
import pytest

from oomdoctor.analysis import analyse
from oomdoctor.analysis.results import UnknownKind
from oomdoctor.load import load
from oomdoctor.model import ACTIVE_ALLOCATED
from oomdoctor.views import json_report, text_report
from tests.conftest import corpus_params

REAL_OOM = {
    "oom_action__nesta_discrete_diffusion__memory_snapshot.json",
    "multi_device_expandable__constructor_sun_code_location__memory_snapshot.pickle",
}


@pytest.mark.parametrize("path", corpus_params())
def test_corpus_snapshot_gets_a_report(path):
    analysis = analyse(load(path))
    acc = analysis.accounting
    # allocated + free = reserved, in total ...
    assert acc.allocated_bytes + acc.pending_free_bytes + acc.free_cached_bytes == acc.reserved_bytes
    assert acc.free_cached_bytes >= 0 and acc.releasable_bytes >= 0 and acc.non_releasable_bytes >= 0
    assert acc.requested_bytes + acc.rounding_bytes == acc.allocated_bytes
    # ... and per segment
    frag = analysis.fragmentation
    for segment in frag.segments:
        assert segment.allocated_bytes + segment.pending_free_bytes + segment.free_bytes == segment.total_bytes
    assert sum(s.total_bytes for s in frag.segments) == acc.reserved_bytes
    # the components are the live blocks at docs/definitions.md's sizes: they add up to the figure
    # the report calls allocated there (the peak at the peak; the layout's may hold unsplit remainders)
    assert sum(c.bytes for c in analysis.components) == analysis.replay.target_allocated_bytes
    data = orjson.loads(json_report.render(analysis))
    assert data["verdict"] and data["schema_version"] >= 1
    assert text_report.render(analysis).startswith("Verdict: ")
    if path.name in REAL_OOM:
        assert analysis.verdict not in ("no-oom", "unknown")
        assert analysis.evidence
        assert analysis.replay.target_kind == "oom"
    else:
        assert analysis.verdict == "no-oom"


def test_trace_that_continues_after_the_oom_is_judged_at_the_oom(corpus_dir):
    path = corpus_dir / "snapshots" / "multi_device_expandable__constructor_sun_code_location__memory_snapshot.pickle"
    snapshot = load(path)
    analysis = analyse(snapshot)
    assert analysis.device == 1  # the failing device, judged on its own
    final_allocated = sum(b.size for s in snapshot.segments_on(1) for b in s.blocks if b.state == ACTIVE_ALLOCATED)
    assert analysis.replay.events_after_target > 0
    assert analysis.accounting.allocated_bytes > 10 * final_allocated  # the end state is not the OOM state
    assert analysis.accounting.request_bytes > 4 << 30
    assert UnknownKind.REPLAYED_AFTER_TARGET in {u.kind for u in analysis.unknowns}


def test_replayer_agrees_with_the_analysis_at_the_oom(corpus_dir):
    from oomdoctor.analysis import replayer

    path = corpus_dir / "snapshots" / "oom_action__nesta_discrete_diffusion__memory_snapshot.json"
    snapshot = load(path)
    analysis = analyse(snapshot)
    state = replayer(snapshot, analysis.device).state_at(analysis.replay.target_index)
    assert state.reserved_bytes == analysis.accounting.reserved_bytes
    assert abs(state.allocated_bytes - analysis.accounting.allocated_bytes) <= 1 << 20
    for segment in state.segments:
        assert sum(b.size for b in segment.blocks) == segment.total_size
