"""The report never contradicts itself: "would fit on its own" and the what-if answer from one model.

Checked on every labelled fixture and on the corpus's real OOMs, and on built stories where the old
arithmetic went wrong (optimizer temporaries counted as batch-scaled, a partly built optimizer state
judged at the moment of the OOM, a request that failed on placement said to fit at 1.00x).
"""

from __future__ import annotations

import json

import pytest

from oomdoctor.analysis import analyse
from oomdoctor.analysis.results import EvidenceKind, SummaryKind
from oomdoctor.load import load
from oomdoctor.model import Frame
from oomdoctor.views import phrasing, text_report
from tests.builders import FORWARD_STACK, SETUP_STACK, MiB, Sim
from tests.conftest import CORPUS_SNAPSHOTS, FIXTURES

REAL_OOM_PREFIXES = ("oom_action__", "multi_device_expandable__")
BATCH_RECOMMENDATIONS = ("smaller-micro-batch", "smaller-batch")


def _fixture_entries() -> list[dict]:
    manifest = FIXTURES / "manifest.json"
    if not manifest.is_file():
        return []
    return [e for e in json.loads(manifest.read_text())["fixtures"] if (FIXTURES / e["file"]).is_file()]


ENTRIES = _fixture_entries()
BY_NAME = {e["name"]: e for e in ENTRIES}


def _cases():
    cases = [pytest.param(FIXTURES / e["file"], id=e["name"]) for e in ENTRIES]
    cases += [pytest.param(p, id=p.name) for p in CORPUS_SNAPSHOTS if p.name.startswith(REAL_OOM_PREFIXES)]
    return cases or [pytest.param(None, marks=pytest.mark.skip(reason="no fixtures or corpus"))]


def _fixture(name: str):
    if name not in BY_NAME:
        pytest.skip(f"fixture {name} not generated")
    return analyse(load(FIXTURES / BY_NAME[name]["file"]))


def _checkpointing_scale(rec, what_if) -> float:
    return 1 - rec.estimated_saved_bytes / what_if.scalable_bytes


@pytest.mark.parametrize("path", _cases())
def test_recommendations_agree_with_the_what_if(path):
    analysis = analyse(load(path))
    what_if = analysis.what_if
    largest = what_if.largest_fitting_scale
    for rec in analysis.recommendations:
        if rec.id in BATCH_RECOMMENDATIONS:
            # halving counts only what grows with the batch, the what-if's own budget; accumulating
            # over two micro-batches gives back the gradients the first one keeps alive
            if rec.id == "smaller-micro-batch":
                assert 0 < rec.estimated_saved_bytes <= what_if.scalable_bytes // 2, rec
            else:
                assert rec.estimated_saved_bytes == what_if.scalable_bytes // 2, rec
            if rec.would_fit_alone:
                assert largest is not None and largest >= 0.5, (rec, what_if)
        if rec.id == "activation-checkpointing" and rec.would_fit_alone:
            implied = _checkpointing_scale(rec, what_if)
            assert largest is not None and largest >= int(implied * 100) / 100, (rec, what_if)
    if analysis.replay.target_kind == "oom" and largest is not None:
        # the batch that failed never "fits" in the what-if
        assert largest < 1.0, what_if
        assert not what_if.fits_at(1.0)
    if largest == 0.0:
        assert not any(r.would_fit_alone for r in analysis.recommendations if r.id in BATCH_RECOMMENDATIONS)


@pytest.mark.parametrize("path", _cases())
def test_would_fit_covers_the_projected_model_states(path):
    """Where a verdict projects the model states at full size, a change that "would fit" saves at
    least what the projected states overshoot the capacity by."""
    analysis = analyse(load(path))
    findings = [(analysis.verdict, analysis.evidence), *((f.verdict, f.evidence) for f in analysis.secondary)]
    needed = [e.bytes for _, evidence in findings for e in evidence if e.metric == "model_states_needed_bytes"]
    capacity = analysis.what_if.capacity_bytes
    if not needed or capacity is None:
        return
    overshoot = max(needed) - capacity
    for rec in analysis.recommendations:
        if rec.would_fit_alone:
            assert rec.estimated_saved_bytes >= overshoot, (rec, overshoot)


@pytest.mark.parametrize("path", _cases())
def test_ranked_by_bytes_saved_and_nothing_negligible(path):
    analysis = analyse(load(path))
    recs = analysis.recommendations
    assert list(recs) == sorted(recs, key=lambda r: -r.estimated_saved_bytes)
    missing = analysis.accounting.missing_bytes or 0
    for rec in recs:
        assert rec.estimated_saved_bytes * 100 >= missing, rec


def test_optimizer_temporaries_do_not_count_as_batch_savings():
    analysis = _fixture("optimizer-state-buildup-mlp-adam")
    components = analysis.component_bytes()
    assert components["temporaries"] > 30 * MiB and components["activations"] < MiB  # the story
    assert analysis.what_if.largest_fitting_scale == 0.0
    assert analysis.what_if.scalable_bytes < MiB  # the foreach temporaries are fixed, not batch-scaled
    assert not any(r.id in BATCH_RECOMMENDATIONS for r in analysis.recommendations)  # about a KiB: left out
    foreach = next(r for r in analysis.recommendations if r.id == "foreach-false")
    # a per-parameter update still makes one 16 MiB matrix's temporary: the rest is saved
    assert foreach.estimated_saved_bytes == components["temporaries"] - 16 * MiB
    # the Adam state is already whole (2x the parameters): nothing is projected, the moment decides
    assert not analysis.what_if.projected_states
    assert foreach.would_fit_alone is True


def test_first_step_judged_against_the_projected_model_states():
    analysis = _fixture("model-states-too-large-mlp-sgd")
    assert analysis.verdict == "model-states-too-large"
    by_id = {r.id: r for r in analysis.recommendations}
    missing = analysis.accounting.missing_bytes
    # foreach=False frees more than the moment lacked, but the states alone exceed the device
    assert by_id["foreach-false"].estimated_saved_bytes >= missing
    assert by_id["foreach-false"].would_fit_alone is False
    # half the states is the most sharding saves (each unit's parameters and gradient come back whole
    # while it runs): no fit is claimed from it
    assert by_id["shard-model-states"].would_fit_alone is None
    assert analysis.what_if.projected_states
    assert "projected at full size" in phrasing.what_if_note(analysis.what_if)
    text = text_report.render(analysis)
    assert "foreach=False" in text and text.count("would fit on its own") == 0


def _optimizer_oom_with_foreach_temporaries(total_bytes: int) -> Sim:
    """Four 64 MiB parameters and their gradients; the first step allocates three 64 MiB foreach
    temporaries before its (Adam-style) state, and a 64 MiB request fails."""
    sim = Sim(total_bytes=total_bytes)
    for i in range(4):
        sim.alloc(64 * MiB, SETUP_STACK, "parameter", f"layer{i}.weight")
    sim.marker("forward", "start")
    kept_activation = sim.alloc(1024, FORWARD_STACK)
    acts = [sim.alloc(16 * MiB, FORWARD_STACK) for _ in range(2)]
    sim.marker("forward", "end")
    sim.marker("backward", "start")
    for a in acts:
        sim.free(a)
    for i in range(4):
        sim.alloc(64 * MiB, (), "gradient", f"layer{i}.weight.grad")
    sim.marker("backward", "end")
    sim.marker("optimizer_step", "start")
    for _ in range(3):
        sim.alloc(64 * MiB)
    sim.oom(64 * MiB)
    assert kept_activation
    return sim


def test_built_first_step_oom_foreach_is_not_enough_while_states_are_projected():
    sim = _optimizer_oom_with_foreach_temporaries(720 * MiB)
    analysis = analyse(sim.snapshot())
    assert analysis.verdict == "model-states-too-large", analysis.summary
    by_id = {r.id: r for r in analysis.recommendations}
    assert by_id["foreach-false"].estimated_saved_bytes == 128 * MiB  # one 64 MiB temporary stays
    assert analysis.accounting.missing_bytes <= 128 * MiB  # enough for the moment ...
    assert by_id["foreach-false"].would_fit_alone is False  # ... not for 1 GiB of projected states
    # half the projected states leaves 16 MiB beyond the 496 MiB the run lacked: less than the room
    # the cache's segments need (`whatif.cache_margin`); and half is the most sharding saves
    assert by_id["shard-model-states"].would_fit_alone is None
    assert by_id["shard-model-states"].estimated_saved_bytes == 512 * MiB  # half of the projected states
    assert "smaller-micro-batch" not in by_id and "activation-checkpointing" not in by_id


def test_placement_failure_is_said_and_not_fitted_at_full_scale():
    analysis = _fixture("inference-with-grad-cnn")
    assert analysis.accounting.missing_bytes == 0
    missing = next(e for e in analysis.evidence if e.metric == "missing_bytes")
    assert missing.kind == EvidenceKind.MISSING_PLACEMENT
    text = phrasing.evidence(missing)
    assert "placement" in text and "largest usable free block" in text
    what_if = analysis.what_if
    # (graphs kept pass after pass: the moment's scale is an upper bound only, no scale said to fit;
    # as one, it is where no place could exist at all, past where today's layout shows one)
    assert what_if.largest_fitting_scale is None
    bound = what_if.upper_bound_scale
    assert what_if.placement_limit_scale is not None and what_if.placement_reach_scale is not None
    assert bound is not None and what_if.placement_limit_scale <= bound <= what_if.placement_reach_scale < 1.0


def test_fragmentation_what_if_stays_below_the_failed_batch():
    """Its free pieces were left by score matrices, which shrink with the batch as the request does:
    no scale of the request fits them. At a smaller batch the two 48 MiB segments cut for score
    matrices alone are cut smaller, and free device memory (18 MiB) gains the rest: at 0.79x, 18 MiB
    + 2 x 10 MiB for the request's 38 MiB segment; at 0.80x, 34 MiB for 40 MiB. (Rehearsed: 0.79x
    fits; 0.91x, which today's 44 MiB piece would have placed, ran out again.)"""
    analysis = _fixture("fragmentation-retrieval-class-scores")
    frag = analysis.fragmentation
    request = analysis.accounting.request_bytes
    limit = analysis.what_if.largest_fitting_scale
    assert limit is not None and limit < 1.0
    assert request * 0.91 <= frag.largest_usable_free_block_bytes  # today's piece, as it was
    assert analysis.what_if.placement_limit_scale == limit == 0.79


def test_request_the_size_of_a_parameter_in_backward_does_not_scale():
    analysis = _fixture("gradients-kept-mlp-plain-sgd")
    request = analysis.accounting.request_bytes
    assert any(b.component == "parameters" and b.size_bytes == request for b in analysis.live_blocks)
    assert analysis.what_if.scalable_bytes < request
    halve = next(r for r in analysis.recommendations if r.id in BATCH_RECOMMENDATIONS)
    assert halve.would_fit_alone is False


def test_no_oom_dump_after_the_peak_scales_the_recorded_peak():
    analysis = _fixture("no-oom-gpt-adamw")
    peak = max(analysis.steps, key=lambda s: s.peak_allocated_bytes)
    assert peak.peak_allocated_bytes > analysis.accounting.allocated_bytes
    assert analysis.what_if.predicted_peak_bytes(1.0) == peak.peak_allocated_bytes
    assert analysis.what_if.scalable_bytes == peak.peak_activation_bytes
    assert analysis.what_if.basis is not None and analysis.what_if.basis.step == peak.step
    assert f"step {peak.step}'s peak" in phrasing.what_if_note(analysis.what_if)


def test_evaluation_is_not_told_to_accumulate_gradients():
    analysis = _fixture("inference-with-grad-gpt")
    ids = {r.id for r in analysis.recommendations}
    assert "smaller-batch" in ids and "smaller-micro-batch" not in ids


@pytest.mark.parametrize(
    "name", ["inference-with-grad-cnn", "inference-with-grad-gpt", "creeping-leak-gpt-adamw", "creeping-leak-mlp-sgd"]
)
def test_kept_activations_are_not_called_a_batch_too_large(name):
    """Activations that earlier steps or earlier passes left alive are the primary verdict's story;
    an activation-spike finding beside it would blame the batch for them."""
    analysis = _fixture(name)
    assert analysis.verdict == BY_NAME[name]["verdict"]
    assert all(f.verdict != "activation-spike" for f in analysis.secondary), [f.summary for f in analysis.secondary]
    if analysis.verdict == "inference-with-grad":
        # an evaluation pass has no backward to recompute for: checkpointing is not the fix
        assert all(r.id != "activation-checkpointing" for r in analysis.recommendations)


def test_an_evaluation_pass_of_a_run_that_trains_is_told_neither_to_accumulate_nor_to_checkpoint():
    """A run trains, then its evaluation (a pass that does not train) runs out: that pass saves
    nothing for a backward, so activation checkpointing saves nothing and there are no gradients to
    accumulate over micro-batches (a Trainer's evaluation_loop after training: the advice was 'Halve
    the micro-batch and accumulate gradients' and 'activation checkpointing ... would fit on its own')."""
    sim = Sim(total_bytes=600 * MiB)
    sim.alloc(64 * MiB, SETUP_STACK, "parameter", "model.weight")
    sim.marker("forward", "start")
    acts = [sim.alloc(32 * MiB, FORWARD_STACK) for _ in range(4)]
    sim.marker("forward", "end")
    sim.marker("backward", "start")
    for address in acts:
        sim.free(address)
    sim.alloc(64 * MiB, (), "gradient", "model.weight.grad")
    sim.marker("backward", "end")
    sim.marker("optimizer_step", "start")
    sim.alloc(64 * MiB, (), "optimizer_state", "model.weight.exp_avg")
    sim.alloc(64 * MiB, (), "optimizer_state", "model.weight.exp_avg_sq")
    sim.marker("optimizer_step", "end")
    sim.marker("evaluation", "start")
    for _ in range(8):
        sim.alloc(32 * MiB, FORWARD_STACK)
    sim.oom(128 * MiB, FORWARD_STACK)
    analysis = analyse(sim.snapshot())
    assert analysis.target_phase == "evaluation"
    ids = {r.id for r in analysis.recommendations}
    assert "smaller-micro-batch" not in ids and "activation-checkpointing" not in ids, ids
    assert "smaller-batch" in ids, ids


EVAL_CAT_STACK = (
    Frame("/usr/lib/python3/site-packages/torch/_tensor.py", 10, "cat"),
    Frame("trainer.py", 79, "evaluation_loop"),
    Frame("trainer.py", 120, "evaluate"),
)


def _evaluation_with_running_concatenation(total_bytes: int, cat_stack=EVAL_CAT_STACK) -> Sim:
    """A run trains a step, then evaluates: each evaluation pass makes 4 x 24 MiB of intermediates
    (freed) and 16 MiB of logits, and the loop concatenates the logits to what it kept so far
    (`all_logits = torch.cat((all_logits, logits))`, transformers' evaluation loop without
    eval_accumulation_steps), dropping the previous concatenation and the batch's logits. The
    concatenation after the fifth pass (80 MiB) fails."""
    sim = Sim(total_bytes=total_bytes)
    sim.alloc(32 * MiB, SETUP_STACK, "parameter", "model.weight")
    sim.marker("forward", "start")
    acts = [sim.alloc(24 * MiB, FORWARD_STACK) for _ in range(4)]
    sim.marker("forward", "end")
    sim.marker("backward", "start")
    for address in acts:
        sim.free(address)
    sim.alloc(32 * MiB, (), "gradient", "model.weight.grad")
    sim.marker("backward", "end")
    sim.marker("optimizer_step", "start")
    sim.marker("optimizer_step", "end")
    kept = None
    for batch in range(5):
        sim.marker("evaluation", "start")
        scratch = [sim.alloc(24 * MiB, FORWARD_STACK) for _ in range(4)]
        logits = sim.alloc(16 * MiB, FORWARD_STACK)
        for address in scratch:
            sim.free(address)
        sim.marker("evaluation", "end")
        if batch == 4:
            sim.oom(80 * MiB, cat_stack)
            break
        if kept is None:
            kept = logits
            continue
        joined = sim.alloc(16 * MiB * (batch + 1), cat_stack)
        sim.free(kept)
        sim.free(logits)
        kept = joined
    return sim


def test_a_running_concatenation_of_evaluation_outputs_is_kept_outputs():
    """The concatenation is one tensor made after the latest earlier pass, but it holds what every
    earlier pass output: the kept outputs pile up pass after pass (eval-outputs-kept), and halving
    the batch would not shrink them (they grow with the batches evaluated, not with the batch)."""
    analysis = analyse(_evaluation_with_running_concatenation(200 * MiB).snapshot())
    assert analysis.verdict == "eval-outputs-kept", (analysis.verdict, analysis.summary)
    ids = {r.id for r in analysis.recommendations}
    assert "smaller-batch" not in ids and "smaller-micro-batch" not in ids, ids


def test_a_cache_a_model_concatenates_inside_its_forward_is_no_kept_output():
    """The same growth made inside a module's forward (a decoder's keys and values concatenated each
    generation step) is the model's input to its next pass, not outputs the loop gathers."""
    in_forward = (
        Frame("model.py", 30, "forward"),
        Frame("/usr/lib/python3/site-packages/torch/nn/modules/module.py", 1751, "_wrapped_call_impl"),
        Frame("generate.py", 50, "decode"),
    )
    analysis = analyse(_evaluation_with_running_concatenation(200 * MiB, in_forward).snapshot())
    assert analysis.verdict != "eval-outputs-kept", analysis.summary


def test_a_placement_failure_in_a_forward_counts_the_spare_free_bytes_against_the_rest_of_the_pass():
    """The OOM is the first allocation of a forward twice the size of the last step's (a bigger batch),
    and fails on placement: 4 MiB free on the device and 32 MiB free in the cache, in 8 MiB blocks,
    for a 16 MiB request. The rest of the pass needs bytes, not a place: what it lacks is the request
    and the rest less the free bytes (the what-if's gap), not the gap to a place plus the whole rest.
    Halving the batch fits by the what-if's allocated bytes and must not be said to be not enough (a
    Lightning-like run said 'not enough on its own' beside 'largest scale that fits: 0.58x'); on this
    small device it leaves no room for a new segment of each pool, and the 8 MiB blocks, left by the
    last step's activations, shrink with the batch as the request does (no known place takes half of
    it), so whether it fits is unknown."""

    class KeptCache(Sim):
        def release_cache(self) -> None:  # cache the flush cannot return (blocks of split segments)
            pass

    layers = [
        (
            Frame("/usr/lib/python3/site-packages/torch/nn/functional.py", 100, "linear"),
            Frame("model.py", 12 + i, "forward"),
        )
        for i in range(4)
    ]
    sim = KeptCache(total_bytes=68 * MiB)
    sim.alloc(16 * MiB, SETUP_STACK, "parameter", "model.weight")
    sim.marker("forward", "start")
    acts = [sim.alloc(8 * MiB, layer) for layer in layers]
    sim.marker("forward", "end")
    sim.marker("backward", "start")
    for address in acts:
        sim.free(address)
    sim.alloc(16 * MiB, (), "gradient", "model.weight.grad")
    sim.marker("backward", "end")
    sim.marker("optimizer_step", "start")
    sim.marker("optimizer_step", "end")
    sim.marker("forward", "start")
    sim.oom(16 * MiB, layers[0])
    analysis = analyse(sim.snapshot())
    assert analysis.accounting.missing_bytes == 0 and analysis.what_if.rest_of_pass.extrapolated
    halve = next(r for r in analysis.recommendations if r.id in BATCH_RECOMMENDATIONS)
    # by allocated bytes it fits (the 8 MiB pieces, left by activations, shrink with the batch as the
    # request does, so no known place takes half of it: past that, up to the reach, unknown)
    assert analysis.what_if.predicted_peak_bytes(0.5) <= analysis.what_if.capacity_bytes
    assert analysis.what_if.placement_limit_scale < 0.5 <= analysis.what_if.placement_reach_scale
    assert analysis.what_if.fits_at(0.5) is None
    assert halve.would_fit_alone is None, halve


def test_a_forward_cut_short_at_its_first_allocation_is_judged_by_its_projected_whole():
    """A loop that calls zero_grad between forward and backward (Lightning's closure) doubles its
    batch; the forward runs out at its first allocation, twice the last step's there, with the last
    step's gradients alive. The pass holds nothing yet, but its rest, extrapolated from the last
    step's, needs twice what that step's did: the spike is the headline, the kept gradients (which
    could have made room for the first allocation only) secondary."""
    layers = [
        (
            Frame("/usr/lib/python3/site-packages/torch/nn/functional.py", 100, "linear"),
            Frame("model.py", 12 + i, "forward"),
        )
        for i in range(8)
    ]
    sim = Sim(total_bytes=136 * MiB)
    sim.alloc(64 * MiB, SETUP_STACK, "parameter", "model.weight")
    sim.marker("forward", "start")
    acts = [sim.alloc(8 * MiB, layer) for layer in layers]
    sim.marker("forward", "end")
    sim.marker("zero_grad", "start")
    sim.free(sim.alloc(512, FORWARD_STACK))  # an event inside it, so the trace shows the phase
    sim.marker("zero_grad", "end")
    sim.marker("backward", "start")
    for address in acts:
        sim.free(address)
    sim.alloc(64 * MiB, (), "gradient", "model.weight.grad")
    sim.marker("backward", "end")
    sim.marker("optimizer_step", "start")
    sim.marker("optimizer_step", "end")
    sim.marker("forward", "start")
    sim.oom(16 * MiB, layers[0])
    analysis = analyse(sim.snapshot())
    assert analysis.verdict == "activation-spike", analysis.summary
    assert analysis.summary.kind == SummaryKind.ACTIVATION_SPIKE_PROJECTED
    assert "gradients-kept" in {f.verdict for f in analysis.secondary}
    text = phrasing.summary(analysis.summary)
    assert "ran out near its start" in text and "2.00x step 0's at the same point" in text, text


def test_the_concatenation_of_kept_outputs_is_not_told_to_be_computed_in_pieces():
    """When the failed request is the concatenation of every kept output (oversized-request beside
    eval-outputs-kept), its result is what the loop keeps, whole: chunking the op saves nothing
    (it was said to save 60 MiB and fit, in a Trainer-like evaluation loop); keeping the outputs off
    the device does."""
    analysis = analyse(_evaluation_with_running_concatenation(160 * MiB).snapshot())
    assert analysis.verdict == "eval-outputs-kept", analysis.summary
    assert "oversized-request" in {f.verdict for f in analysis.secondary}
    ids = {r.id for r in analysis.recommendations}
    assert "chunk-large-op" not in ids and "outputs-to-cpu" in ids, ids
