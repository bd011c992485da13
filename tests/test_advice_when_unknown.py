"""Advice where the file cannot tell: a saving estimated at the OOM of a pass whose rest nothing
shows is a lower bound, and said so; where nothing tells whether the run trains (the first passes
of the trace, no backward, no optimizer called yet, whether or not the file could record its
annotations), the advice for a pass that trains is given on that condition, not dropped and not
asserted."""

from __future__ import annotations

import dataclasses
import re

from oomdoctor.analysis import analyse
from oomdoctor.analysis.results import Change
from oomdoctor.model import Snapshot
from oomdoctor.pipeline import render_report
from tests.builders import ADAM_INIT_STACK, BACKWARD_STACK, FORWARD_STACK, SETUP_STACK, Sim

MiB = 1 << 20


def _forward_cut_short(*, annotations_recorded: bool):
    """Weights, then one forward whose activations grow until a request fails: no earlier pass, no
    backward, no optimizer; no oomdoctor metadata."""
    sim = Sim(total_bytes=1024 * MiB)
    sim.alloc(128 * MiB, SETUP_STACK)
    for _ in range(6):
        sim.alloc(128 * MiB, FORWARD_STACK)
    sim.oom(256 * MiB, FORWARD_STACK)
    return dataclasses.replace(sim.snapshot(metadata=False), annotations_recorded=annotations_recorded)


def test_a_saving_at_the_oom_of_a_pass_whose_rest_is_unknown_is_a_lower_bound():
    """The OOM cut the forward short and nothing shows its rest: what halving the batch saves at the
    pass's peak is at least what it saves at the OOM; the report says "at least" and what it is of."""
    snapshot = _forward_cut_short(annotations_recorded=True)
    analysis = analyse(snapshot)
    assert analysis.what_if.rest_of_pass is not None and not analysis.what_if.rest_of_pass.extrapolated
    batch = next(r for r in analysis.recommendations if r.id == Change.SMALLER_BATCH)
    assert batch.saved_at_least
    text = render_report(snapshot, "text", analysis=analysis).decode()
    assert "saves at least " in text and "estimated at the OOM" in text
    markdown = render_report(snapshot, "md", analysis=analysis).decode()
    assert "| at least " in markdown
    assert b'"estimated_saved_is_lower_bound": true' in render_report(snapshot, "json", analysis=analysis)


def test_when_the_file_cannot_tell_whether_the_run_trains_checkpointing_is_advised_on_that_condition():
    """A forward with no backward in sight may be a training run's: activation checkpointing is
    advised "if this run trains", its fit not said. Without annotations (torch < 2.5) nothing
    would show an optimizer at work; with them, none is due yet in the run's first forward (a run
    that trains calls its optimizer after a backward): the file cannot tell either way."""
    for annotations_recorded in (False, True):
        old = _forward_cut_short(annotations_recorded=annotations_recorded)
        analysis = analyse(old)
        checkpointing = [r for r in analysis.recommendations if r.id == Change.ACTIVATION_CHECKPOINTING]
        assert len(checkpointing) == 1, (annotations_recorded, analysis.recommendations)
        assert checkpointing[0].if_trains and checkpointing[0].would_fit_alone is None
        text = render_report(old, "text", analysis=analysis).decode()
        assert (
            "If this run trains (the file cannot tell: it shows no backward, optimizer step or other sign of"
            " training, and none is due yet in the first forward passes it holds), use activation checkpointing"
        ) in " ".join(text.split())
        assert b'"if_trains": true' in render_report(old, "json", analysis=analysis)


def _passes_then_oom(passes: int, optimizers: int | None = None) -> Snapshot:
    """Weights, then `passes` forward passes (oomdoctor's markers: grad mode on), each freeing its
    activations as it returns, no backward, no optimizer call, the last one running out; with
    `optimizers`, capture saw the process make that many."""
    sim = Sim(total_bytes=1024 * MiB)
    sim.alloc(128 * MiB, SETUP_STACK, component="parameter", name="fc.weight")
    for number in range(passes):
        sim.marker("forward", "start")
        activations = [sim.alloc(128 * MiB, FORWARD_STACK) for _ in range(6)]
        if number == passes - 1:
            sim.oom(256 * MiB, FORWARD_STACK)
            break
        for activation in activations:
            sim.free(activation)
        sim.marker("forward", "end")
    return sim.snapshot(extra=None if optimizers is None else {"optimizers": optimizers})


def test_a_file_with_markers_whose_first_forward_ran_out_cannot_tell_whether_the_run_trains():
    """oomdoctor's markers and registry record an optimizer's step and zero_grad, but a run that
    trains calls neither before its first backward: an OOM in its first forward leaves the file
    unable to tell whether it trains, and it says so ("if this run trains"), as a file without
    annotations does. Earlier passes that no backward followed (more than one training step makes
    before its backward) tell it does not, in a file of any torch: then no checkpointing is advised."""
    first = analyse(_passes_then_oom(1))
    assert first.target_phase == "forward" and first.phase_source == "markers"
    checkpointing = [r for r in first.recommendations if r.id == Change.ACTIVATION_CHECKPOINTING]
    assert [(r.if_trains, r.would_fit_alone) for r in checkpointing] == [(True, None)], first.recommendations
    assert Change.SMALLER_MICRO_BATCH not in [r.id for r in first.recommendations]
    for annotations_recorded in (True, False):  # a torch before 2.5 tells the same by the passes
        snapshot = dataclasses.replace(_passes_then_oom(5), annotations_recorded=annotations_recorded)
        later = analyse(snapshot)
        assert later.target_phase == "forward"
        assert Change.ACTIVATION_CHECKPOINTING not in [r.id for r in later.recommendations], later.recommendations


def _two_steps(*, markers: bool):
    """Two training steps: weights, a forward, its backward, an Adam step that makes its state,
    then the loop frees the step's output (`del out`, its free carrying the allocation's stack, as
    torch 2.0 records it) before the next forward; the second step likewise."""
    sim = Sim(total_bytes=4096 * MiB)
    sim.alloc(64 * MiB, SETUP_STACK)
    for _ in range(2):
        if markers:
            sim.marker("forward", "start")
        activation = sim.alloc(32 * MiB, FORWARD_STACK)
        output = sim.alloc(16 * MiB, FORWARD_STACK)
        if markers:
            sim.marker("backward", "start")
        sim.alloc(64 * MiB, BACKWARD_STACK)  # the gradient, kept
        sim.free(activation)
        if markers:
            sim.marker("optimizer_step", "start")
        sim.alloc(8 * MiB, ADAM_INIT_STACK)
        if markers:
            sim.marker("optimizer_step", "end")
        sim.free(output)
    return sim.snapshot(metadata=markers)


def test_a_step_whose_end_no_mark_shows_holds_at_least_its_figure():
    """Without a mark of where a step ended (no annotation, no frees of zero_grad), it ends where
    the next step first allocates, after the loop's frees that may be the next step's: what it held
    at its end is at least the figure read there, and the report says so; with marks it is exact."""
    plain = _two_steps(markers=False)
    analysis = analyse(plain)
    assert len(analysis.steps) == 2, analysis.steps
    first = analysis.steps[0]
    assert first.end_at_least, first
    text = render_report(plain, "text", analysis=analysis).decode()
    assert re.search(r"step 0 .* at its end at least ", text), text
    assert "'at least': no mark shows where the step ended" in text
    assert "| at least " in render_report(plain, "md", analysis=analysis).decode()
    assert b'"end_at_least": true' in render_report(plain, "json", analysis=analysis)
    marked = analyse(_two_steps(markers=True))
    assert not any(step.end_at_least for step in marked.steps), marked.steps
    assert b"end_at_least" not in render_report(_two_steps(markers=True), "json")


def test_an_optimizer_capture_saw_made_tells_the_run_trains():
    """Capture records the optimizers the process made (metadata `optimizers`), from their making:
    one made before the first forward ran out tells the run trains, so the advice is a training
    run's (checkpointing, not conditional; a smaller micro-batch with accumulation), where without it
    the file cannot tell. None made (0) tells nothing more than an older dump without the field."""
    made = analyse(_passes_then_oom(1, optimizers=1))
    advised = {r.id: r for r in made.recommendations}
    assert Change.SMALLER_MICRO_BATCH in advised and Change.SMALLER_BATCH not in advised, advised
    assert not advised[Change.ACTIVATION_CHECKPOINTING].if_trains
    for optimizers in (0, None):
        unknown = {r.id: r for r in analyse(_passes_then_oom(1, optimizers=optimizers)).recommendations}
        assert unknown[Change.ACTIVATION_CHECKPOINTING].if_trains and Change.SMALLER_MICRO_BATCH not in unknown
