"""Without an OOM, the strongest risk is said under the summary (the verdict stays no-oom: nothing ran
out), and the advice is sized against the peak: where optimizer state is the largest part there, a
risk found gets the change that shrinks it too. A file with no risk gets no advice."""

from __future__ import annotations

from oomdoctor.analysis import analyse
from oomdoctor.tui.content import overview_sections
from oomdoctor.views import markdown_report, phrasing, text_report
from tests.builders import FORWARD_STACK, MiB, Sim, spike_sim

SIZES = (8 * MiB, 12 * MiB, 16 * MiB, 28 * MiB)  # four parameters, 64 MiB


def _two_steps(activation_mib: float, zero_grad: bool):
    """Two training steps of four parameters (64 MiB) with Adam's two moments each (128 MiB of state)
    and four saved activations of `activation_mib`; no OOM, the peak is step 1's forward. Without
    zero_grad the first backward's gradients are alive then."""
    sim = Sim(total_bytes=2048 * MiB)
    for i, size in enumerate(SIZES):
        sim.alloc(size, component="parameter", name=f"layer{i}.weight")
    sim.start_recording()  # the model exists before the trace, as in most plain snapshots
    gradients: list[int] = []
    for step in range(2):
        sim.marker("forward", "start")
        saved = [sim.alloc(int(activation_mib * MiB), FORWARD_STACK, component="activation") for _ in range(4)]
        sim.marker("forward", "end")
        sim.marker("backward", "start")
        for address in saved:
            sim.free(address)
        if not gradients:
            gradients = [
                sim.alloc(size, component="gradient", name=f"layer{i}.weight.grad") for i, size in enumerate(SIZES)
            ]
        sim.marker("backward", "end")
        sim.marker("optimizer_step", "start")
        if step == 0:
            for i, size in enumerate(SIZES):
                for moment in ("exp_avg", "exp_avg_sq"):
                    sim.alloc(size, component="optimizer_state", name=f"layer{i}.weight.{moment}")
        sim.marker("optimizer_step", "end")
        if zero_grad:
            sim.marker("zero_grad", "start")
            for address in gradients:
                sim.free(address)
            gradients = []
            sim.marker("zero_grad", "end")
    return analyse(sim.snapshot(registry=False))


def test_a_risk_at_a_peak_of_optimizer_state_gets_the_8_bit_optimizer():
    analysis = _two_steps(activation_mib=12, zero_grad=False)
    assert analysis.verdict == "no-oom"
    assert "gradients-kept" in {f.verdict for f in analysis.secondary}
    state = {s.name: s.bytes for s in analysis.components}["optimizer_state"]
    assert state == 128 * MiB
    saved = {r.id: r.estimated_saved_bytes for r in analysis.recommendations}
    assert saved["eight-bit-optimizer"] == state * 3 // 4
    assert "zero-grad-set-to-none" in saved
    # a peak is no OOM: nothing cut its forward short, and the what-if does not say so
    assert analysis.what_if.rest_of_pass is None
    assert "OOM" not in phrasing.what_if_note(analysis.what_if)


def test_optimizer_state_that_is_not_the_largest_part_gets_no_8_bit_advice():
    analysis = _two_steps(activation_mib=48, zero_grad=False)
    assert "gradients-kept" in {f.verdict for f in analysis.secondary}
    assert "eight-bit-optimizer" not in {r.id for r in analysis.recommendations}


def test_no_risk_no_advice():
    analysis = _two_steps(activation_mib=12, zero_grad=True)
    assert analysis.verdict == "no-oom" and not analysis.secondary
    assert analysis.recommendations == ()


def test_the_main_risk_is_said_under_the_summary_in_every_view():
    analysis = _two_steps(activation_mib=12, zero_grad=False)
    text = text_report.render(analysis).splitlines()
    assert text[0].startswith("Verdict: no-oom")
    assert text[2].startswith("Main risk, gradients-kept (confidence ")
    assert "Also found" not in text
    markdown = markdown_report.render(analysis)
    assert "> **Main risk**, `gradients-kept` (confidence " in markdown
    assert "### Also found" not in markdown
    headline = overview_sections(analysis, "dump.pickle")[0]
    assert any("Main risk, gradients-kept" in line for line in headline.lines)


def test_with_an_oom_the_other_findings_are_also_found():
    analysis = analyse(spike_sim(oom_after=300).snapshot())
    assert analysis.verdict != "no-oom"
    assert not any(line.startswith("Main risk") for line in text_report.render(analysis).splitlines())


def test_without_an_oom_a_change_saving_under_a_hundredth_of_the_peak_is_noise():
    analysis = _two_steps(activation_mib=0.5, zero_grad=False)
    ids = {r.id for r in analysis.recommendations}
    assert "zero-grad-set-to-none" in ids
    assert not ids & {"activation-checkpointing", "smaller-micro-batch"}  # under 1% of the peak
