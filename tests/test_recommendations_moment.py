"""A recommendation's saving is what it saves at the judged moment: in the optimizer step the
gradients exist whether or not the forward freed stale ones, and the backward has already released
what forward saved for it; an optimizer of the user's own that allocates its update is told to
update in place, torch's to drop its foreach lists."""

from __future__ import annotations

import json

from oomdoctor.analysis import analyse
from oomdoctor.model import Frame
from oomdoctor.pipeline import render_report
from oomdoctor.views import phrasing
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
    # one parameter at a time the update still makes that parameter's 16 MiB temporary: 64 - 16
    # (rehearsed: Adam over an MLP of 16 MiB matrices, 34 MiB of foreach temporaries at the OOM,
    # peaks 18.1 MiB lower with foreach=False, not 34)
    assert ids["foreach-false"] == 48 * MiB


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


# A serving engine's KV cache, made up front by a function its engine names for it (vLLM's
# CacheEngine._allocate_kv_cache), after the weights were loaded.
KV_CACHE_STACK = (
    Frame("/usr/lib/python3/site-packages/torch/utils/_device.py", 104, "__torch_function__"),
    Frame("cache_engine.py", 80, "_allocate_kv_cache"),
    Frame("cache_engine.py", 40, "__init__"),
    Frame("serve.py", 120, "main"),
)
ATTENTION_STACK = (
    Frame("/usr/lib/python3/site-packages/torch/functional.py", 400, "matmul"),
    Frame("attention.py", 60, "forward"),
    Frame("/usr/lib/python3/site-packages/torch/nn/modules/module.py", 1751, "_wrapped_call_impl"),
    Frame("serve.py", 130, "main"),
)


def _engine_out_of_memory(request_frames):
    from tests.builders import SETUP_STACK

    sim = Sim(total_bytes=96 * MiB)
    for _ in range(4):
        sim.alloc(5 * MiB, SETUP_STACK)  # the weights
    sim.oom(64 * MiB, request_frames)
    return analyse(sim.snapshot(metadata=False))


def test_an_oversized_pool_made_up_front_is_advised_smaller_not_computed_in_pieces():
    """A serving engine that runs out while it pre-allocates its KV cache (one 64 MiB tensor of a
    96 MiB device, beside 20 MiB of weights): the request is a pool sized by a setting, not an
    operation whose input could be split, so the advice is a smaller pool, not chunking the op
    ('for logits, a chunked cross-entropy'); an oversized request made by a forward is still told
    to compute it in pieces."""
    analysis = _engine_out_of_memory(KV_CACHE_STACK)
    assert analysis.verdict == "oversized-request"
    ids = [r.id for r in analysis.recommendations]
    assert "smaller-preallocation" in ids and "chunk-large-op" not in ids, ids
    pool = next(r for r in analysis.recommendations if r.id == "smaller-preallocation")
    assert pool.estimated_saved_bytes == 32 * MiB  # sized at half the pool
    assert "KV cache" in phrasing.recommendation(pool)

    ids = [r.id for r in _engine_out_of_memory(ATTENTION_STACK).recommendations]
    assert "chunk-large-op" in ids and "smaller-preallocation" not in ids, ids


def test_an_oom_while_loading_weights_claims_no_fit_for_the_rest_of_the_load():
    """A model loaded shard by shard with torch.load straight to the device runs out at a 40 MiB
    tensor with 80 MiB of weights loaded: a change that places this tensor is not known to place
    the tensors still to come (nothing in the file says how many), so no change 'would fit on its
    own', and the report says the rest of the load is unknown. The oversized request is a weight: it
    is told to hold the weights in less memory, not to split an operation's input along the batch."""
    torch_dir = "/usr/lib/python3/site-packages/torch/"
    load = (
        Frame(torch_dir + "serialization.py", 1400, "restore_location"),
        Frame(torch_dir + "serialization.py", 1900, "load"),
        Frame("serve.py", 30, "load_checkpoint_shards"),
        Frame("serve.py", 60, "main"),
    )
    sim = Sim(total_bytes=100 * MiB)
    for _ in range(8):
        sim.alloc(10 * MiB, load)
    sim.oom(40 * MiB, load)
    analysis = analyse(sim.snapshot(metadata=False))
    assert analysis.recommendations
    assert all(r.would_fit_alone is not True for r in analysis.recommendations), analysis.recommendations
    assert "load-unfinished" in {u.kind for u in analysis.unknowns}
    # a weight read from a file is no operation to split: the weights are held in less memory
    ids = {r.id for r in analysis.recommendations}
    assert "chunk-large-op" not in ids and "smaller-weights" in ids, ids


def _backward_oom_without_zero_grad(snapshot_only: bool = False):
    """Plain SGD without zero_grad (as the fixture gradients-kept-mlp-plain-sgd): step 1's backward
    runs out asking for a new 16 MiB gradient while step 0's four are alive."""
    sim = Sim(total_bytes=140 * MiB)
    for i in range(4):
        sim.alloc(16 * MiB, component="parameter", name=f"layer{i}.weight")
    for step in range(2):
        sim.marker("forward", "start")
        saved = [sim.alloc(1 * MiB, FORWARD_STACK, component="activation") for _ in range(4)]
        sim.marker("forward", "end")
        sim.marker("backward", "start")
        if step == 1:
            sim.oom(16 * MiB, BACKWARD_STACK)
            return sim.snapshot() if snapshot_only else analyse(sim.snapshot())
        for i in range(4):
            sim.alloc(16 * MiB, BACKWARD_STACK, component="gradient", name=f"layer{i}.weight.grad")
        for address in saved:
            sim.free(address)
        sim.marker("backward", "end")
        sim.marker("optimizer_step", "start")
        sim.marker("optimizer_step", "end")
    raise AssertionError("unreachable")


def test_freeing_stale_gradients_bounds_the_run_s_peak_by_what_the_backward_makes_again():
    """zero_grad(set_to_none=True) frees the stale gradients at the OOM, but the next backward makes
    them again, beside the parameters: the run's peak falls at most by what the OOM needed beyond
    those model states (the activations and the request), not by the gradients' 64 MiB. (Rehearsed,
    gradients-kept-mlp-plain-sgd: 50.1 MiB freed at the OOM, the peak 16.9 MiB lower.)"""
    analysis = _backward_oom_without_zero_grad()
    assert analysis.verdict == "gradients-kept" and analysis.target_phase == "backward"
    advice = next(r for r in analysis.recommendations if r.id == "zero-grad-set-to-none")
    assert advice.estimated_saved_bytes == 64 * MiB
    assert advice.peak_saved_at_most_bytes == 4 * MiB + 16 * MiB  # the activations and the request
    words = phrasing.saving(advice, "at the OOM")
    assert words == (
        "saves about 64.00 MiB at the OOM; the next backward makes the gradients again, so the run's peak"
        " falls at most 20.00 MiB below what it needed at the OOM"
    )
    snapshot = _backward_oom_without_zero_grad(snapshot_only=True)
    report = json.loads(render_report(snapshot, "json", analysis=analysis))
    advice_json = next(r for r in report["recommendations"] if r["id"] == "zero-grad-set-to-none")
    assert advice_json["peak_saved_at_most_bytes"] == 20 * MiB
    md = render_report(snapshot, "md", analysis=analysis).decode()
    assert (
        "| 64.00 MiB at the OOM; the next backward makes the gradients again, so the run's peak falls at most 20.00 MiB below what it needed at the OOM |"
        in md
    )


def test_the_peak_bound_is_never_above_the_saving():
    """In the forward, what the OOM needed beyond the model states is more than the stale gradients:
    the peak falls at most by those (at the moment the run peaked, the fixed run holds at least
    all but them)."""
    analysis = _steps_without_zero_grad("forward")
    advice = next(r for r in analysis.recommendations if r.id == "zero-grad-set-to-none")
    assert advice.peak_saved_at_most_bytes == advice.estimated_saved_bytes == 64 * MiB
