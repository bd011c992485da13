"""The cyclic garbage collector is paused while a snapshot loads and while it is analysed (both make
millions of objects and no cycles), and is left as it was found afterwards."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest

import oomdoctor.analysis
from oomdoctor.load import load

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "dumps" / "creeping-leak-gpt-adamw.pickle"


@pytest.fixture
def collector_state():
    was = gc.isenabled()
    yield
    if was:
        gc.enable()
    else:
        gc.disable()


@pytest.mark.parametrize("enabled", [True, False])
def test_load_and_analyse_leave_the_collector_as_they_found_it(collector_state, enabled):
    if enabled:
        gc.enable()
    else:
        gc.disable()
    snapshot = load(FIXTURE)
    assert gc.isenabled() is enabled
    oomdoctor.analysis.analyse(snapshot)
    assert gc.isenabled() is enabled


def test_analysis_runs_with_the_collector_paused(collector_state, monkeypatch):
    gc.enable()
    seen: list[bool] = []
    replay = oomdoctor.analysis.replay

    def watched(*args, **kwargs):
        seen.append(gc.isenabled())
        return replay(*args, **kwargs)

    monkeypatch.setattr(oomdoctor.analysis, "replay", watched)
    oomdoctor.analysis.analyse(load(FIXTURE))
    assert seen == [False]
    assert gc.isenabled()


def test_the_collector_resumes_when_analysis_fails(collector_state, monkeypatch):
    gc.enable()

    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(oomdoctor.analysis, "replay", broken)
    with pytest.raises(RuntimeError):
        oomdoctor.analysis.analyse(load(FIXTURE))
    assert gc.isenabled()
