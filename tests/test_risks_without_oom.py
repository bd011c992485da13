"""A diagnosis for a snapshot without an OOM event (issue 11, causes A, E, H and N): the same
evidence judged at the peak or the dump and worded as risks, what dominates memory, near-OOMs."""

from __future__ import annotations

from dataclasses import replace

from oomdoctor.analysis import analyse
from oomdoctor.analysis.results import Facts, Finding, Summary, SummaryKind
from oomdoctor.analysis.verdicts import Context, _ordered
from oomdoctor.model import Frame, TraceEvent
from oomdoctor.views import phrasing
from tests.builders import FOREACH_STACK, FORWARD_STACK, SETUP_STACK, USER_STACK, GiB, MiB, Sim

ACCUMULATE_GRAD_STACK = (Frame("", 0, "torch::autograd::AccumulateGrad::apply(std::vector<at::Tensor>&&)"),)
RELU_STACK = (
    Frame("/usr/lib/python3/site-packages/torch/nn/functional.py", 1704, "relu"),
    Frame("infer.py", 200, "step"),
)
EMPTY_CACHE_STACK = (
    Frame("/usr/lib/python3/site-packages/torch/cuda/memory.py", 222, "empty_cache"),
    Frame("infer.py", 90, "main"),
)


def _findings(result) -> dict[str, Finding]:
    return {f.verdict: f for f in result.secondary}


def _forward(sim: Sim, sizes: list[int], keep: bool) -> list[int]:
    """A forward pass allocating `sizes`; with `keep`, autograd keeps every tensor for backward,
    without it each is freed once the next one exists (as under no_grad)."""
    kept = []
    previous = None
    for size in sizes:
        address = sim.alloc(size, FORWARD_STACK)
        if keep:
            kept.append(address)
        elif previous is not None:
            sim.free(previous)
        previous = address
    return kept


def test_a_forward_that_keeps_its_graph_without_training_is_a_risk():
    sim = Sim()
    sim.alloc(64 * MiB, SETUP_STACK)  # the model
    sim.start_recording()
    kept = _forward(sim, [4 * MiB] * 32, keep=True)
    for address in kept:  # the output is dropped: the graph goes in one release
        sim.free(address)
    result = analyse(sim.snapshot(metadata=False))
    assert result.verdict == "no-oom"
    finding = _findings(result)["inference-with-grad"]
    assert finding.summary.kind == SummaryKind.KEPT_GRAPH_RISK
    assert "with grad mode on" in phrasing.summary(finding.summary)
    assert "no-grad" in {r.id for r in result.recommendations}

    no_grad = Sim()
    no_grad.alloc(64 * MiB, SETUP_STACK)
    no_grad.start_recording()
    _forward(no_grad, [4 * MiB] * 32, keep=False)
    assert "inference-with-grad" not in _findings(analyse(no_grad.snapshot(metadata=False)))


def _with_gradients_from_before() -> Sim:
    """128 MiB of parameters and their gradients, made by a backward before recording began."""
    sim = Sim()
    for _ in range(4):
        sim.alloc(32 * MiB, SETUP_STACK)
    for _ in range(4):
        sim.alloc(32 * MiB, ACCUMULATE_GRAD_STACK)
    sim.start_recording()
    return sim


def test_gradients_of_an_earlier_backward_alive_in_a_forward_are_a_risk():
    sim = _with_gradients_from_before()
    _forward(sim, [8 * MiB] * 4, keep=True)
    result = analyse(sim.snapshot(metadata=False))
    finding = _findings(result)["gradients-kept"]
    assert finding.evidence[0].bytes == 128 * MiB
    assert "zero-grad-set-to-none" in {r.id for r in result.recommendations}
    assert "inference-with-grad" not in _findings(result)  # the gradients show a training run


def test_model_states_filling_the_cache_with_a_one_entry_trace_may_not_fit():
    sim = Sim()
    for _ in range(6):
        sim.alloc(40 * MiB, SETUP_STACK)
    sim.start_recording()
    sim.events.append(TraceEvent("snapshot", 0, 240 * MiB, 0, (), sim._tick()))
    result = analyse(sim.snapshot(metadata=False))
    finding = _findings(result)["model-states-too-large"]
    assert finding.summary.kind == SummaryKind.MODEL_STATES_AT_CAPACITY
    assert "1 entry" in phrasing.summary(finding.summary)

    untraced = Sim()
    for _ in range(6):
        untraced.alloc(40 * MiB, SETUP_STACK)
    untraced.start_recording()
    finding = _findings(analyse(untraced.snapshot(metadata=False)))["model-states-too-large"]
    words = phrasing.summary(finding.summary)
    assert "no trace that could have kept an OOM event" in words
    assert "0 entries" not in words

    roomy = Sim()
    for _ in range(6):
        roomy.alloc(40 * MiB, SETUP_STACK)
    roomy.free(roomy.alloc(100 * MiB))  # a cached free segment: not at capacity
    roomy.start_recording()
    assert "model-states-too-large" not in _findings(analyse(roomy.snapshot(metadata=False)))


def _near_oom(sim: Sim, stack) -> None:
    cached = [sim.alloc(512 * MiB, RELU_STACK) for _ in range(2)]
    for address in cached:
        sim.free(address)
    for address in cached:  # the flush: the cached segments go, carrying the waiting allocation's stack
        size = sim.segments.pop(address)[0]
        sim.events.append(TraceEvent("segment_free", address, size, 0, stack, sim._tick()))
    sim.alloc(1536 * MiB, stack)


def test_a_cache_flush_retry_is_a_near_oom_and_its_request_is_judged():
    sim = Sim(total_bytes=4 * GiB)
    _near_oom(sim, RELU_STACK)
    result = analyse(sim.snapshot(metadata=False))
    finding = _findings(result)["oversized-request"]
    assert finding.summary.kind == SummaryKind.NEAR_OOM_OVERSIZED
    assert finding.summary.facts.size("request") == 1536 * MiB
    assert finding.summary.facts.size("bound") == 1024 * MiB + 1536 * MiB
    assert "chunk-large-op" in {r.id for r in result.recommendations}

    asked = Sim(total_bytes=4 * GiB)
    _near_oom(asked, EMPTY_CACHE_STACK)  # torch.cuda.empty_cache(): the user's flush, not a retry
    assert "oversized-request" not in _findings(analyse(asked.snapshot(metadata=False)))


def test_a_near_oom_bounds_the_capacity_the_what_if_reads():
    """With no capacity in the file, the refused cudaMalloc bounds it: past the scale whose peak
    needs more than that bound the batch cannot fit; below it, nothing is claimed."""
    sim = Sim(total_bytes=4 * GiB)
    _near_oom(sim, FORWARD_STACK)  # in a forward: it scales with the batch
    what_if = analyse(sim.snapshot(metadata=False)).what_if
    assert what_if.capacity_bytes is None and what_if.case == "capacity-bounded"
    assert what_if.capacity_bound_bytes == 1024 * MiB + 1536 * MiB
    upper = what_if.upper_bound_scale
    assert upper is not None and what_if.predicted_peak_bytes(upper) >= what_if.capacity_bound_bytes
    assert what_if.predicted_peak_bytes(upper - 0.01) < what_if.capacity_bound_bytes
    assert what_if.fits_at(upper) is False and what_if.fits_at(0.5) is None
    assert what_if.largest_fitting_scale is None
    assert "under 2.50 GiB" in phrasing.what_if_note(what_if)
    assert f"past {upper:.2f}x" in phrasing.what_if_note(what_if)

    plain = Sim(total_bytes=4 * GiB)
    plain.alloc(1536 * MiB, FORWARD_STACK)
    assert analyse(plain.snapshot(metadata=False)).what_if.case == "capacity-unknown"


def test_the_no_oom_headline_says_what_dominates_at_the_peak_and_at_the_dump():
    sim = Sim()
    sim.alloc(64 * MiB, SETUP_STACK)
    sim.start_recording()
    for address in _forward(sim, [32 * MiB] * 4, keep=True):
        sim.free(address)
    result = analyse(sim.snapshot(metadata=False))
    text = phrasing.summary(result.summary)
    assert "At the peak the largest part is activations (128.00 MiB, 67%)" in text
    assert "at the dump (64.00 MiB allocated) it is parameters (64.00 MiB, 100%)" in text


def _fragmentation_and_leak(capacity: int, usable_free: int) -> list[Finding]:
    result = analyse(Sim().snapshot(metadata=False))
    ctx = Context(
        oom=None,
        accounting=result.accounting,
        fragmentation=replace(result.fragmentation, usable_free_bytes=usable_free),
        components={},
        live_blocks=(),
        phases=(),
        phase_source="frames",
        target_phase="forward",
        target_step=70,
        target_index=None,
        steps=(),
        optimizer_kind=None,
        exact=False,
        expandable_on=False,
        capacity_bytes=capacity,
    )
    findings = [
        Finding("fragmentation", 0.85, Summary(SummaryKind.FRAGMENTATION, Facts()), ()),
        Finding("creeping-leak", 0.8, Summary(SummaryKind.CREEPING_LEAK, Facts()), ()),
    ]
    return [f.verdict for f in _ordered(findings, ctx)]


def test_growth_over_steps_outranks_immaterial_fragments():
    assert _fragmentation_and_leak(capacity=8 * GiB, usable_free=4 * MiB) == ["creeping-leak", "fragmentation"]
    assert _fragmentation_and_leak(capacity=8 * GiB, usable_free=2 * GiB) == ["fragmentation", "creeping-leak"]


def test_gradients_of_an_earlier_backward_still_alive_later_in_the_step_were_alive_through_its_forward():
    """The peak in the optimizer step: gradients older than the step, still alive there, lived
    through its forward (gradients accumulated in place, never set to None)."""
    sim = _with_gradients_from_before()
    for activation in _forward(sim, [8 * MiB] * 4, keep=True):
        sim.free(activation)
    sim.free(sim.alloc(16 * MiB, ()))  # the backward, adding into the gradients already there
    sim.free(sim.alloc(64 * MiB, FOREACH_STACK))  # the optimizer step's temporaries: the peak
    result = analyse(sim.snapshot(metadata=False))
    assert result.target_phase == "optimizer_step"
    finding = _findings(result)["gradients-kept"]
    assert finding.evidence[0].bytes == 128 * MiB
    words = phrasing.summary(finding.summary)
    assert "(optimizer step of step 0)" in words and "alive through the step's forward" in words


def test_the_graph_of_the_last_forward_still_alive_after_it_returned_is_a_risk():
    """A benchmark dumped by hand after its loop: the last pass has returned, and its output still
    holds the graph that no backward will use."""

    def dumped_after_the_loop(keep: bool):
        sim = Sim()
        sim.alloc(64 * MiB, SETUP_STACK)  # the model
        sim.start_recording()
        sim.marker("forward", "start")
        _forward(sim, [4 * MiB] * 32, keep=keep)
        sim.marker("forward", "end")
        sim.alloc(MiB, USER_STACK)  # the loop's own code after the pass
        return analyse(sim.snapshot(registry=False))

    result = dumped_after_the_loop(keep=True)
    assert result.verdict == "no-oom" and result.target_phase == "between_steps"
    finding = _findings(result)["inference-with-grad"]
    assert finding.summary.kind == SummaryKind.KEPT_GRAPH_RISK
    assert "the last forward pass, returned, still keeps 128.00 MiB" in phrasing.summary(finding.summary)
    assert "inference-with-grad" not in _findings(dumped_after_the_loop(keep=False))


def test_a_dump_whose_cache_holds_more_free_than_allocated_says_so():
    sim = Sim()
    sim.free(sim.alloc(64 * MiB))  # an earlier, larger allocation: its segments stay cached
    sim.alloc(4 * MiB)
    sim.alloc(3 * MiB)
    sim.start_recording()  # no trace: judged at the dump
    result = analyse(sim.snapshot(metadata=False))
    accounting = result.accounting
    assert accounting.free_cached_bytes > accounting.allocated_bytes
    words = phrasing.summary(result.summary)
    assert "PyTorch's cache holds more free than allocated" in words
    assert f"{phrasing.human(accounting.free_cached_bytes)} of the {phrasing.human(accounting.reserved_bytes)}" in words

    full = Sim()
    full.alloc(64 * MiB)
    full.start_recording()
    assert "cache holds" not in phrasing.summary(analyse(full.snapshot(metadata=False)).summary)


def _no_oom(sim: Sim, events: int) -> tuple[float, str]:
    sim.start_recording()
    for _ in range(events // 4):
        sim.free(sim.alloc(MiB, USER_STACK))
    result = analyse(sim.snapshot(metadata=False))
    assert result.verdict == "no-oom"
    return result.confidence, phrasing.summary(result.summary)


def test_without_a_trace_the_file_cannot_tell_whether_the_run_ran_out():
    sim = Sim()
    sim.alloc(64 * MiB, SETUP_STACK)
    confidence, text = _no_oom(sim, 0)
    assert confidence <= 0.3
    assert text.startswith("This file cannot tell whether the run ran out of memory: it holds no allocation history")
    assert "No out-of-memory event was recorded" not in text


def test_a_trace_too_short_to_show_an_oom_says_so_and_a_long_one_does_not():
    sim = Sim()
    sim.alloc(64 * MiB, SETUP_STACK)
    confidence, text = _no_oom(sim, 4)
    assert confidence <= 0.3
    assert "its trace holds only 4 entries, and an OOM before them would not show" in text

    sim = Sim()
    sim.alloc(64 * MiB, SETUP_STACK)
    confidence, text = _no_oom(sim, 40)
    assert confidence == 0.9
    assert text.startswith("No out-of-memory event was recorded on this device; the figures describe the peak")


def test_an_empty_snapshot_says_nothing_was_recorded():
    confidence, text = _no_oom(Sim(), 0)
    assert confidence <= 0.3
    assert text.startswith("This file holds no GPU memory and no allocation history for this device")


def test_a_file_that_cannot_tell_says_so_in_the_verdict_line():
    from oomdoctor.tui.content import overview_sections
    from oomdoctor.views import markdown_report, text_report

    blind = Sim()
    blind.alloc(64 * MiB, SETUP_STACK)
    blind.start_recording()  # no history at all
    analysis = analyse(blind.snapshot(metadata=False))
    assert analysis.verdict == "no-oom"  # the verdict id is unchanged; the words say it cannot tell
    assert text_report.render(analysis).startswith("Verdict: no-oom, cannot tell  (confidence 30%)")
    assert markdown_report.render(analysis).startswith("## oomdoctor: `no-oom`, cannot tell (confidence 30%)")
    assert overview_sections(analysis, "dump.pickle")[0].title.startswith("Verdict: no-oom, cannot tell")

    seen = Sim()
    for _ in range(6):
        seen.free(seen.alloc(8 * MiB, SETUP_STACK))
    assert text_report.render(analyse(seen.snapshot(metadata=False))).startswith("Verdict: no-oom  (confidence 90%)")


def _prediction_loop(grad: bool, oom: bool = False):
    """A batch-inference loop (`predict`) that keeps each batch's predictions (4 KiB) and runs three
    passes of 20 x 16 MiB and a last, larger one of 20 x 20 MiB; with grad mode on every pass keeps
    its intermediates until it returns, under no_grad only the last two. Dumped at the end, or
    (`oom`) on a 1 GiB device the last pass runs out at its end asking for 128 MiB."""
    torch_dir = "/usr/lib/python3/site-packages/torch/"

    def forward(line: int):
        return (
            Frame(torch_dir + "nn/functional.py", 100, "linear"),
            Frame("model.py", line, "forward"),
            Frame(torch_dir + "nn/modules/module.py", 1751, "_wrapped_call_impl"),
            Frame("serve.py", 40, "predict"),
            Frame("serve.py", 60, "main"),
        )

    prediction = (Frame(torch_dir + "_tensor.py", 10, "argmax"), Frame("serve.py", 41, "predict"))
    sim = Sim(total_bytes=1 * GiB if oom else 16 * GiB)
    for _ in range(8):
        sim.alloc(64 * MiB, SETUP_STACK)
    for batch in range(4):
        size = 16 * MiB if batch < 3 else 20 * MiB
        blocks: list[int] = []
        for layer in range(20):
            blocks.append(sim.alloc(size, forward(10 + layer)))
            if not grad and len(blocks) > 2:
                sim.free(blocks.pop(0))
        if oom and batch == 3:
            sim.oom(128 * MiB, forward(30))
            break
        sim.alloc(4096, prediction)
        for block in blocks:
            sim.free(block)
    analysis = analyse(sim.snapshot(metadata=False))
    if oom:  # the verdict's summary, and the secondary findings'
        return {analysis.verdict: analysis.summary, **{f.verdict: f.summary for f in analysis.secondary}}
    return _findings(analysis)


def test_an_inference_loop_that_keeps_its_predictions_is_judged_pass_by_pass_for_a_kept_graph():
    """With grad mode on, the last pass of a prediction loop keeps all it allocated (400 MiB) at the
    peak: the kept-graph risk. The passes before it keep their predictions, 4 KiB each: measured from
    the oldest of those, the loop's whole history (1.31 GiB) hid the pass's share (29%). In a run that
    does not train each forward span is a pass of its own (as passes.py reads them); under no_grad the
    same loop shows no risk."""
    assert "inference-with-grad" in _prediction_loop(grad=True)
    assert "inference-with-grad" not in _prediction_loop(grad=False)


def test_an_oom_in_an_inference_loop_with_grad_mode_on_is_inference_with_grad():
    """At the OOM, the last pass of the prediction loop keeps all it allocated (400 MiB, 20 tensors),
    after three passes that no backward followed, in a run that never trains: grad mode is on
    (inference-with-grad, with the no_grad change), not only an activation spike of a larger batch.
    The same loop under no_grad keeps two tensors and is not judged so."""
    found = _prediction_loop(grad=True, oom=True)
    assert "inference-with-grad" in found
    assert "At the OOM, a forward pass keeps 400.00 MiB" in phrasing.summary(found["inference-with-grad"])
    assert "inference-with-grad" not in _prediction_loop(grad=False, oom=True)
