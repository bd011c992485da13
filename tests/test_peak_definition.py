"""One peak, one definition, in every report (issue 11, cause L; docs/definitions.md, "The peak").

The walk, the layout rebuilt at the target and the live blocks placed in it used to give three
"peak" figures in one report: the headline and the evidence the layout's (unsplit remainders
included), the step table the walk's, which counted the exact size of a block still live at the
dump from the start of the trace, before it was allocated. The scenes below are built so that all
three differ by the old reckoning; every format must now print the one figure, and the layout's
only on its own labelled line.
"""

from __future__ import annotations

import json
import re

from oomdoctor.analysis import analyse
from oomdoctor.analysis.replay import survivor_sizes
from oomdoctor.pipeline import render_report
from oomdoctor.tui.content import memory_lines
from oomdoctor.units import human_size
from oomdoctor.views import phrasing
from tests.builders import FORWARD_STACK, SETUP_STACK, USER_STACK, MiB, Sim

KiB = 1 << 10
PARAMETERS = 8 * MiB
ACTIVATION = 3 * MiB + 256 * KiB  # round_size keeps it: a multiple of 512
REMAINDER = 768 * KiB  # unsplit, inside each activation's block while it lives
KEPT = 2 * MiB + 512 * KiB
KEPT_REMAINDER = 512 * KiB
PEAK = PARAMETERS + 3 * ACTIVATION  # 17.75 MiB: the rule's figure
LAID_OUT = PARAMETERS + 3 * (ACTIVATION + REMAINDER)  # 20 MiB: the layout rebuilt at the peak


def forward_then_release():
    """Parameters from before the trace; one forward's activations (each with an unsplit remainder)
    make the peak and are freed; then a block with a remainder of its own is kept to the dump."""
    sim = Sim()
    sim.alloc(PARAMETERS, SETUP_STACK)
    sim.start_recording()
    sim.marker("forward", "start")
    activations = [sim.alloc(ACTIVATION, FORWARD_STACK, remainder=REMAINDER) for _ in range(3)]
    sim.marker("forward", "end")
    for address in activations:
        sim.free(address)
    sim.alloc(KEPT, USER_STACK, remainder=KEPT_REMAINDER)
    return sim.snapshot(registry=False)


def _reports(snapshot) -> dict[str, str]:
    return {fmt: render_report(snapshot, fmt, source="dump.pickle").decode() for fmt in ("text", "md", "json")}


def test_the_walk_counts_each_block_by_the_rule():
    snapshot = forward_then_release()
    analysis = analyse(snapshot)
    replay = analysis.replay
    assert replay.target_kind == "peak"
    assert replay.peak_allocated_bytes == PEAK == replay.target_allocated_bytes
    # the layout rebuilt at the peak gives each activation its remainder: legitimately more
    assert analysis.accounting.allocated_bytes == LAID_OUT
    # the components at the peak are the live blocks at the rule's sizes: they add up to the peak
    assert sum(share.bytes for share in analysis.components) == PEAK
    # the step table's largest peak is the peak, not the peak plus the kept block's remainder
    assert max(step.peak_allocated_bytes for step in analysis.steps) == PEAK
    # the series starts from the parameters alone, and ends at the dump's exact bytes
    assert analysis.replay.series[0].allocated_bytes == PARAMETERS
    assert analysis.replay.series[-1].allocated_bytes == PARAMETERS + KEPT + KEPT_REMAINDER


def test_survivor_sizes_names_the_kept_block_at_its_alloc():
    snapshot = forward_then_release()
    trace = snapshot.traces[0]
    from oomdoctor.analysis.replay import final_live_blocks

    sizes = survivor_sizes(trace, final_live_blocks(snapshot.segments_on(0)))
    assert list(sizes.values()) == [KEPT + KEPT_REMAINDER]
    (index,) = sizes
    assert trace.actions[index] == "alloc" and trace.sizes[index] == KEPT


def test_every_format_prints_the_one_peak():
    reports = _reports(forward_then_release())
    peak, laid_out = human_size(PEAK), human_size(LAID_OUT)

    text = reports["text"]
    assert f"the figures describe the peak ({peak} allocated)" in text
    assert f"allocated bytes at the peak: {peak}" in text
    assert re.search(rf"^    allocated +{re.escape(peak)}  \(the peak\)$", text, re.M)
    # rebuilt back from the dump past the frees after the peak: an estimate, and it says so
    assert re.search(
        rf"^    as laid out +{re.escape(laid_out)}  \(an estimate: the blocks as the rebuilt segments", text, re.M
    )
    (step_row,) = [line for line in text.splitlines() if line.startswith("  step 0 ")]
    assert f"peak {peak:>12}" in step_row

    md = reports["md"]
    assert f"the figures describe the peak ({peak} allocated)" in md
    assert f"allocated bytes at the peak: **{peak}**" in md
    assert f"| &nbsp;&nbsp;allocated (the peak) | {peak} | {PEAK:,} |" in md
    assert (
        f"| &nbsp;&nbsp;as laid out (an estimate: the blocks as the rebuilt segments hold them, unsplit remainders included) | {laid_out} | {LAID_OUT:,} |"
        in md
    )
    assert f"| 0 | {peak} |" in md

    data = json.loads(reports["json"])
    assert f"the figures describe the peak ({peak} allocated)" in data["summary"]
    assert [e["bytes"] for e in data["evidence"] if e["metric"] == "allocated_bytes"] == [PEAK]
    assert max(row["peak_allocated_bytes"] for row in data["steps"]) == PEAK
    assert data["replay"]["peak_allocated_bytes"] == data["replay"]["target_allocated_bytes"] == PEAK
    assert sum(data["components"].values()) == PEAK
    assert data["accounting"]["allocated_bytes"] == LAID_OUT  # the layout's, as docs/definitions.md says


def test_no_report_calls_the_layouts_figure_the_peak():
    reports = _reports(forward_then_release())
    laid_out = human_size(LAID_OUT)
    for fmt, report in reports.items():
        for line in report.splitlines():
            if laid_out in line or f"{LAID_OUT:,}" in line or str(LAID_OUT) in line:
                assert "peak" not in line, (fmt, line)


def test_the_app_shows_the_peak_and_labels_the_layout():
    lines = memory_lines(analyse(forward_then_release()))
    (allocated,) = [line for line in lines if line.lstrip().startswith("allocated")]
    (laid_out,) = [line for line in lines if line.lstrip().startswith("as laid out")]
    assert human_size(PEAK) in allocated and "the peak" in allocated
    assert human_size(LAID_OUT) in laid_out and "peak" not in laid_out


def test_one_line_when_the_layout_agrees():
    """At the dump (or any state the dump holds exactly) the layout is the rule's figure: one
    allocated line with its rounding, as before."""
    sim = Sim()
    sim.alloc(PARAMETERS, SETUP_STACK, remainder=REMAINDER)
    sim.alloc(KEPT, USER_STACK)
    text = render_report(sim.snapshot(registry=False), "text").decode()
    total = human_size(PARAMETERS + REMAINDER + KEPT)
    assert f"the figures describe the dump ({total} allocated)" in text
    assert re.search(rf"^    allocated +{re.escape(total)}  \(of which rounding ", text, re.M)
    assert "as laid out" not in text


def test_a_peak_over_memory_from_before_the_trace_is_the_most_the_trace_shows():
    """A peak judged where blocks from before the trace are alive: the run began before the trace,
    and what it allocated then is not recorded, so the peak is said to be the trace's. A trace that
    began on an empty allocator says the peak as it is."""
    late = phrasing.summary(analyse(forward_then_release()).summary)
    assert "the most the trace shows: what was allocated before it began is not recorded" in late

    sim = Sim()
    sim.marker("forward", "start")
    for address in [sim.alloc(ACTIVATION, FORWARD_STACK) for _ in range(3)]:
        sim.free(address)
    sim.marker("forward", "end")
    sim.alloc(KEPT, USER_STACK)
    whole = analyse(sim.snapshot(metadata=False))
    words = phrasing.summary(whole.summary)
    assert whole.verdict == "no-oom" and "the figures describe the peak" in words
    assert "the most the trace shows" not in words
