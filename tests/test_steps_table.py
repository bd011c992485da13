"""The steps table does not call what a step held after the OOM, as the exception unwound and freed
its tensors, "at its end": the step never ended (a real DataParallel OOM's trace goes on 174 events
past it, down from 78 GiB to 385 MiB)."""

from __future__ import annotations

from oomdoctor.analysis import analyse
from oomdoctor.views import markdown_report, text_report
from tests.builders import FORWARD_STACK, MiB, Sim


def _oom(unwinds: bool):
    sim = Sim(total_bytes=512 * MiB)
    sim.marker("forward", "start")
    kept = [sim.alloc(100 * MiB, FORWARD_STACK) for _ in range(4)]
    sim.oom(200 * MiB, FORWARD_STACK)
    if unwinds:
        for address in kept:
            sim.free(address)
    return analyse(sim.snapshot(registry=False))


def test_a_step_that_went_on_after_the_oom_says_so():
    analysis = _oom(unwinds=True)
    rows = [line for line in text_report.render(analysis).splitlines() if line.startswith("  step ")]
    assert rows and "after OOM " in rows[-1] and "at its end" not in rows[-1]
    assert " (after the OOM) |" in markdown_report.render(analysis)


def test_a_trace_that_stops_at_the_oom_keeps_its_words():
    rows = [line for line in text_report.render(_oom(unwinds=False)).splitlines() if line.startswith("  step ")]
    assert rows and "at its end" in rows[-1]
