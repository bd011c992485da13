"""The views' words (oomdoctor.views.phrasing): every kind the analysis returns has its sentence."""

from __future__ import annotations

from oomdoctor.analysis.results import (
    Change,
    Evidence,
    EvidenceKind,
    Facts,
    Recommendation,
    Summary,
    SummaryKind,
    Unknown,
    UnknownKind,
    WhatIf,
    WhatIfBasis,
    WhatIfCase,
)
from oomdoctor.views import phrasing


def test_every_unknown_kind_is_worded():
    assert set(phrasing.UNKNOWNS) == set(UnknownKind)
    for kind in UnknownKind:
        sentence = phrasing.unknown(Unknown(kind, 12))
        assert sentence and "{" not in sentence and "None" not in sentence


def test_an_unknown_names_its_count():
    assert phrasing.unknown(Unknown(UnknownKind.PRE_EXISTING, 3)).startswith("3 allocations predate the trace")


def _what_if(case, **fields) -> WhatIf:
    return WhatIf(0, 0, None, fields.pop("largest", None), (), case, **fields)


def test_every_what_if_case_is_worded():
    for case in WhatIfCase:
        note = phrasing.what_if_note(_what_if(case, largest=0.5))
        assert note and "None" not in note


def test_a_what_if_from_a_recorded_step_says_so_first():
    basis = WhatIfBasis(step=3, peak_allocated_bytes=3 << 30, activation_bytes=1 << 30)
    note = phrasing.what_if_note(_what_if(WhatIfCase.LINEAR, largest=1.5, basis=basis, rough=True))
    assert note.startswith("from step 3's peak (3.00 GiB allocated, activations up to 1.00 GiB): ")
    assert "at 1.50x the peak fits" in note and note.endswith("a rough guide only")


def test_every_change_is_worded():
    assert set(phrasing.CHANGES) == set(Change)
    for change in Change:
        assert phrasing.recommendation(Recommendation(change, 1, None)).endswith(".")


def test_every_summary_kind_is_worded():
    for kind in SummaryKind:
        assert phrasing.summary(Summary(kind)).endswith(".")


def test_every_evidence_kind_is_worded():
    for kind in EvidenceKind:
        assert phrasing.evidence(Evidence(kind))


def test_a_component_names_its_largest_tensor_and_a_projection_its_moments():
    named = Evidence(EvidenceKind.OPTIMIZER_STATE_AT_OOM, facts=Facts.of(largest_name="body.2.weight.exp_avg"))
    assert phrasing.evidence(named) == "optimizer state alive at the OOM (largest: body.2.weight.exp_avg)"
    projected = Evidence(EvidenceKind.MODEL_STATES_NEEDED, facts=Facts.of(projected_moments=2, optimizer_kind=None))
    assert phrasing.evidence(projected) == (
        "model states needed (optimizer state projected at 2x the parameters, assuming Adam-style moments)"
    )
    summary = Summary(SummaryKind.NO_OOM, Facts.of(at="peak", allocated=3 << 20))
    assert phrasing.summary(summary) == (
        "No out-of-memory event was recorded on this device; the figures describe the peak (3.00 MiB allocated)."
    )


def test_a_projection_at_the_moments_capture_recorded_says_so():
    recorded = Evidence(EvidenceKind.MODEL_STATES_NEEDED, facts=Facts.of(projected_moments=3, moments_recorded=1))
    assert phrasing.evidence(recorded) == (
        "model states needed (optimizer state projected at 3x the parameters, as many moments per parameter as"
        " its optimizer keeps, recorded at capture)"
    )
    none = Evidence(EvidenceKind.MODEL_STATES_NEEDED, facts=Facts.of(projected_moments=0, moments_recorded=1))
    assert phrasing.evidence(none) == (
        "model states needed (no optimizer state projected: its optimizer keeps none, recorded at capture)"
    )


def test_gradients_kept_says_which_were_made_before_the_trace():
    def sentence(**before: int) -> str:
        facts = Facts.of(old=64 << 20, step=1, phase="backward").adding(**before)
        return phrasing.summary(Summary(SummaryKind.GRADIENTS_KEPT, facts))

    assert sentence().startswith("64.00 MiB of gradients from earlier steps were still alive during step 1's backward")
    assert sentence(before_trace=16 << 20).startswith(
        "64.00 MiB of gradients from earlier steps (16.00 MiB of them from before the trace began) were still alive"
    )
    between = Facts.of(old=64 << 20, step=2, phase="between_steps")
    assert "were still alive before step 2's forward;" in phrasing.summary(Summary(SummaryKind.GRADIENTS_KEPT, between))
    assert sentence(before_trace=64 << 20).startswith(
        "64.00 MiB of gradients made before the trace began (an earlier step's backward) were still alive during step 1's"
    )


def test_activations_dominating_a_backward_are_a_forwards_alive_in_it():
    def sentence(phase: str) -> str:
        return phrasing.summary(Summary(SummaryKind.ACTIVATIONS_DOMINATE, Facts.of(phase=phase, activations=1 << 20)))

    assert sentence("forward").startswith("Activations of the forward pass (1.00 MiB)")
    assert sentence("evaluation").startswith("Activations of the evaluation pass")
    assert sentence("backward").startswith("Activations alive in the backward (1.00 MiB)")
    assert sentence("optimizer_step").startswith("Activations alive in the optimizer step")


def test_a_largest_fitting_scale_says_it_is_an_estimate_by_allocated_bytes():
    """The what-if scales allocated bytes; at another size the cache lays its blocks out otherwise.
    Rehearsed, activation-spike-cnn-bigger-batch (0.66x of batch 64 on 96 MiB by allocated bytes, so
    batch 42) ran out at batch 42, 40 and 38 (a 20 MiB segment to cut with 14 MiB free, or 14.8 MiB
    reserved but unallocated), and fitted at 34 and 32. The scale leaves room for one new segment of
    each pool (22 MiB: 0.50x, batch 32) and says what allocated bytes alone allow; every view says
    what the figure is and the JSON flags it; 'none' (the fixed part alone does not fit, which a
    layout only makes worse) is no estimate."""
    import json

    from oomdoctor.analysis import analyse
    from oomdoctor.load import load
    from oomdoctor.pipeline import render_report
    from oomdoctor.tui.content import overview_sections
    from tests.conftest import FIXTURES

    snapshot = load(FIXTURES / "dumps" / "activation-spike-cnn-bigger-batch.pickle")
    analysis = analyse(snapshot)
    assert analysis.what_if.largest_fitting_scale == 0.5 and analysis.what_if.by_bytes_scale == 0.66
    text = render_report(snapshot, "text", analysis=analysis).decode()
    md = render_report(snapshot, "md", analysis=analysis).decode()
    report = json.loads(render_report(snapshot, "json", analysis=analysis))
    label = "0.50x (an estimate by allocated bytes, with 22.00 MiB left for the cache's segments)"
    assert f"largest scale that fits: {label}  (" in text
    assert f"Largest scale that fits: **{label}**" in md
    app = "\n".join(line for section in overview_sections(analysis, "dump.pickle") for line in section.lines)
    assert f"largest scale that fits: {label}" in app
    for body in (text, md, app, report["what_if"]["note"]):
        assert "the scale is an estimate by allocated bytes with room for one new segment of each pool" in body
        assert (
            "by allocated bytes alone the peak would fit up to 0.66x, and between the two whether it fits is unknown"
            in body
        )
    assert report["what_if"]["largest_fitting_scale_by_allocated_bytes"] is True
    assert report["what_if"]["by_bytes_scale"] == 0.66

    none = analyse(load(FIXTURES / "dumps" / "gradients-kept-mlp-plain-sgd.pickle")).what_if
    assert phrasing.largest_scale(none) == "none" and not phrasing.scale_estimated(none)
    assert "estimate by allocated bytes" not in phrasing.what_if_note(none)
