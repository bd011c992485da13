"""Without a free figure for the judged moment (no OOM event, no mem_get_info there), the what-if's
capacity is the device's total: more than PyTorch could have had by what the CUDA context and other
processes held, so its largest fitting scale is said to be an upper bound and no scale is said to fit."""

from __future__ import annotations

from oomdoctor.analysis import analyse
from oomdoctor.views import phrasing, text_report
from tests.builders import FORWARD_STACK, SETUP_STACK, MiB, Sim


def test_a_peak_judged_against_the_device_total_fits_at_most():
    sim = Sim(total_bytes=1024 * MiB)
    sim.alloc(64 * MiB, SETUP_STACK, component="parameter", name="w")
    sim.marker("forward", "start")
    acts = [sim.alloc(64 * MiB, FORWARD_STACK) for _ in range(4)]
    sim.marker("forward", "end")
    for block in acts:
        sim.free(block)
    analysis = analyse(sim.snapshot())
    assert analysis.verdict == "no-oom"
    what_if = analysis.what_if
    assert what_if.capacity_bytes == 1024 * MiB and what_if.capacity_at_most
    # (above 1.00x a larger batch is an upper bound only, whatever the capacity)
    assert what_if.largest_fitting_scale is None
    assert what_if.upper_bound_scale is not None and what_if.upper_bound_scale > 1
    assert what_if.fits_at(1.0) is None
    assert "an upper bound only" in text_report.render(analysis)
    assert "against the device's total" in phrasing.what_if_note(what_if)
