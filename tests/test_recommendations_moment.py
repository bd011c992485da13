"""A recommendation's saving is what it saves at the judged moment: in the optimizer step the
gradients exist whether or not the forward freed stale ones, and the backward has already released
what forward saved for it; an optimizer of the user's own that allocates its update is told to
update in place, torch's to drop its foreach lists."""

from __future__ import annotations

from oomdoctor.analysis import analyse
from oomdoctor.model import Frame
from tests.builders import FOREACH_STACK, FORWARD_STACK, USER_STACK, MiB, Sim

BACKWARD_STACK = (Frame("train.py", 42, "train_step"),)
OWN_OPTIMIZER_STACK = (
    Frame("/home/u/proj/optimizer.py", 74, "step"),
    Frame("/usr/lib/python3/site-packages/torch/optim/optimizer.py", 485, "wrapper"),
    Frame("train.py", 44, "train_step"),
)


def _steps_without_zero_grad(oom_in: str | None, step_stack=FOREACH_STACK):
    """Two steps of a training loop that never calls zero_grad, each keeping its output (the
    logits) to the end of the step; an OOM in step 1's forward, or none: then the peak is step 1's
    optimizer step, whose update allocates parameter-sized temporaries."""
    sim = Sim(total_bytes=400 * MiB)
    for i in range(4):
        sim.alloc(16 * MiB, component="parameter", name=f"layer{i}.weight")
    for step in range(2):
        sim.marker("forward", "start")
        saved = [sim.alloc(12 * MiB, FORWARD_STACK, component="activation") for _ in range(4)]
        output = sim.alloc((8 + 4 * step) * MiB, FORWARD_STACK)
        if step == 1 and oom_in == "forward":
            sim.oom(40 * MiB, FORWARD_STACK)
            return analyse(sim.snapshot())
        sim.marker("forward", "end")
        sim.marker("backward", "start")
        for address in saved:
            sim.free(address)
        if step == 0:
            for i in range(4):
                sim.alloc(16 * MiB, BACKWARD_STACK, component="gradient", name=f"layer{i}.weight.grad")
        sim.marker("backward", "end")
        sim.marker("optimizer_step", "start")
        temporaries = [sim.alloc(16 * MiB, step_stack) for _ in range(4)]
        for address in temporaries:
            sim.free(address)
        sim.marker("optimizer_step", "end")
        sim.free(output)
    return analyse(sim.snapshot())


def _ids(analysis) -> dict[str, int]:
    return {r.id: r.estimated_saved_bytes for r in analysis.recommendations}


def test_in_the_forward_freeing_stale_gradients_saves_them():
    analysis = _steps_without_zero_grad("forward")
    assert analysis.target_phase == "forward"
    assert _ids(analysis)["zero-grad-set-to-none"] == 64 * MiB


def test_in_the_optimizer_step_freeing_stale_gradients_and_checkpointing_save_nothing():
    analysis = _steps_without_zero_grad(None)
    assert analysis.target_phase == "optimizer_step" and analysis.target_step == 1
    assert "gradients-kept" in {f.verdict for f in analysis.secondary}
    ids = _ids(analysis)
    assert "zero-grad-set-to-none" not in ids
    assert "activation-checkpointing" not in ids
    assert ids["foreach-false"] == 64 * MiB


def test_an_optimizer_of_the_user_s_own_is_told_to_update_in_place():
    analysis = _steps_without_zero_grad(None, OWN_OPTIMIZER_STACK)
    ids = _ids(analysis)
    assert ids["in-place-optimizer"] == 64 * MiB
    assert "foreach-false" not in ids


def test_user_frames_alone_are_not_read_as_torch_s_optimizer():
    analysis = _steps_without_zero_grad(None, USER_STACK)
    assert "in-place-optimizer" in _ids(analysis)


def test_the_kept_gradients_risk_at_an_optimizer_step_peak_says_the_saving_is_in_the_forward():
    """The risk's words agree with the advice: at an optimizer-step peak zero_grad is not advised,
    and the finding says its saving is in the forward, not at this moment."""
    from oomdoctor.views import phrasing

    analysis = _steps_without_zero_grad(None)
    finding = next(f for f in analysis.secondary if f.verdict == "gradients-kept")
    words = phrasing.summary(finding.summary)
    assert "optimizer step of step 1" in words
    assert "not at this moment, when every gradient exists either way" in words


def test_a_near_oom_names_the_event_its_retry_succeeded_at():
    from oomdoctor.views import phrasing
    from tests.builders import GiB
    from tests.test_risks_without_oom import RELU_STACK, _near_oom

    sim = Sim(total_bytes=4 * GiB)
    _near_oom(sim, RELU_STACK)
    finding = next(f for f in analyse(sim.snapshot(metadata=False)).secondary if f.verdict == "oversized-request")
    index = finding.summary.facts.get("index")
    assert sim.events[index].action == "segment_alloc"
    assert f"retried it (it succeeded at event {index})" in phrasing.summary(finding.summary)


def test_a_report_of_the_dump_says_its_batch_sized_savings_are_at_a_recorded_peak():
    """Judged at the dump, the what-if is made from a recorded step's peak: halving the batch is
    sized there, which may be more than the dump holds, and the heading says so."""
    from pathlib import Path

    from oomdoctor.load import load
    from oomdoctor.views import report_rows

    dump = (
        Path(__file__).resolve().parent.parent / "fixtures/dumps/realism/no-oom-forward-benchmark-with-grad-gpt.pickle"
    )
    analysis = analyse(load(dump))
    assert analysis.replay.target_kind == "dump" and analysis.what_if.basis is not None
    halved = next(r for r in analysis.recommendations if r.id in ("smaller-batch", "smaller-micro-batch"))
    assert halved.estimated_saved_bytes > analysis.replay.target_allocated_bytes  # why the heading must say
    title = report_rows.changes_title(analysis)
    assert f"at step {analysis.what_if.basis.step}'s peak" in title
