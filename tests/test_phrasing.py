"""The views' words (oomdoctor.views.phrasing): every kind the analysis returns has its sentence."""

from __future__ import annotations

from oomdoctor.analysis.results import Unknown, UnknownKind
from oomdoctor.views import phrasing


def test_every_unknown_kind_is_worded():
    assert set(phrasing.UNKNOWNS) == set(UnknownKind)
    for kind in UnknownKind:
        sentence = phrasing.unknown(Unknown(kind, 12))
        assert sentence and "{" not in sentence and "None" not in sentence


def test_an_unknown_names_its_count():
    assert phrasing.unknown(Unknown(UnknownKind.PRE_EXISTING, 3)).startswith("3 allocations predate the trace")
