"""The views' words (oomdoctor.views.phrasing): every kind the analysis returns has its sentence."""

from __future__ import annotations

from oomdoctor.analysis.results import Change, Recommendation, Unknown, UnknownKind, WhatIf, WhatIfBasis, WhatIfCase
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
