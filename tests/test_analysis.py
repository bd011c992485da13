"""The analysis engine on model objects with a known story (tests/builders.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from oomdoctor.analysis import analyse
from oomdoctor.analysis.results import Analysis, SummaryKind, UnknownKind
from oomdoctor.analysis.sizing import round_size, segment_size
from oomdoctor.model import (
    ACTIVE_ALLOCATED,
    INACTIVE,
    AllocatorSettings,
    Annotation,
    Block,
    DeviceTrace,
    Segment,
    Snapshot,
    TraceEvent,
)
from oomdoctor.views import phrasing
from tests.builders import (
    ADAM_INIT_STACK,
    BACKWARD_STACK,
    FOREACH_STACK,
    FORWARD_STACK,
    SETUP_STACK,
    USER_STACK,
    GiB,
    MiB,
    Sim,
    metadata_fields,
)


def _train_until_optimizer_oom(sim: Sim, *, frames: bool = False) -> list[int]:
    params = [
        sim.alloc(64 * MiB, SETUP_STACK if frames else (), "parameter", f"model.layers.{i}.weight") for i in range(4)
    ]
    sim.marker("forward", "start")
    batch_acts = [sim.alloc(32 * MiB, FORWARD_STACK if frames else ()) for _ in range(3)]
    sim.marker("forward", "end")
    sim.marker("backward", "start")
    for address in batch_acts:
        sim.free(address)
    for i in range(4):
        sim.alloc(64 * MiB, (), "gradient", f"model.layers.{i}.weight.grad")
    sim.marker("backward", "end")
    sim.marker("optimizer_step", "start")
    for i in range(4):
        sim.alloc(64 * MiB, ADAM_INIT_STACK if frames else (), "optimizer_state", f"model.layers.{i}.weight.exp_avg")
        sim.alloc(64 * MiB, ADAM_INIT_STACK if frames else (), "optimizer_state", f"model.layers.{i}.weight.exp_avg_sq")
    for _ in range(3):  # foreach temporaries
        sim.alloc(64 * MiB, FOREACH_STACK if frames else ())
    sim.oom(64 * MiB)
    return params


def test_sizing_rules_match_the_allocator():
    assert round_size(1) == 512
    assert round_size(1200) == 1536
    assert round_size(1200, ((0, 4),)) == 1536  # below 512 * divisions: plain rounding
    assert round_size(5 * MiB + 1, ((0, 4),)) == 6 * MiB
    assert segment_size(512) == 2 * MiB
    assert segment_size(3 * MiB) == 20 * MiB
    assert segment_size(21 * MiB + 1) == 22 * MiB


def test_optimizer_state_buildup_with_registry_is_exact():
    sim = Sim(total_bytes=1230 * MiB)
    _train_until_optimizer_oom(sim)
    result = analyse(sim.snapshot())
    assert result.verdict == "optimizer-state-buildup"
    assert result.target_phase == "optimizer_step" and result.target_step == 0
    components = result.component_bytes()
    assert components["parameters"] == 256 * MiB
    assert components["gradients"] == 256 * MiB
    assert components["optimizer_state"] == 512 * MiB
    assert components["temporaries"] == 192 * MiB
    assert components["activations"] == 0
    assert {b.method for b in result.live_blocks if b.component != "temporaries"} == {"registry"}
    assert result.recommendations and result.recommendations == tuple(
        sorted(result.recommendations, key=lambda r: -r.estimated_saved_bytes)
    )
    assert result.what_if.largest_fitting_scale == 0.0  # batch size cannot help in the optimizer step


def test_optimizer_state_buildup_inferred_from_frames_without_metadata():
    sim = Sim(total_bytes=1230 * MiB)
    _train_until_optimizer_oom(sim, frames=True)
    result = analyse(sim.snapshot(metadata=False))
    assert result.phase_source == "frames"
    assert result.verdict == "optimizer-state-buildup"
    components = result.component_bytes()
    assert components["parameters"] == 256 * MiB
    assert components["optimizer_state"] == 512 * MiB
    assert components["temporaries"] == 192 * MiB
    assert components["gradients"] == 256 * MiB  # sizes match the parameters'
    assert UnknownKind.NO_REGISTRY in {u.kind for u in result.unknowns}


def test_accounting_adds_up_to_the_byte():
    sim = Sim(total_bytes=1270 * MiB, outside_bytes=40 * MiB)
    _train_until_optimizer_oom(sim)
    acc = analyse(sim.snapshot()).accounting
    assert acc.device_total_bytes == 1270 * MiB
    assert acc.non_pytorch_bytes == 40 * MiB
    assert acc.non_pytorch_bytes + acc.device_free_bytes + acc.reserved_bytes == acc.device_total_bytes
    assert acc.allocated_bytes + acc.pending_free_bytes + acc.free_cached_bytes == acc.reserved_bytes
    assert acc.releasable_bytes + acc.non_releasable_bytes == acc.free_cached_bytes
    assert acc.requested_bytes + acc.rounding_bytes == acc.allocated_bytes
    assert acc.request_bytes == 64 * MiB and acc.message_bytes == 64 * MiB


def test_replay_goes_back_to_the_oom_when_the_trace_continues():
    sim = Sim(total_bytes=512 * MiB)
    a = sim.alloc(200 * MiB, USER_STACK)
    b = sim.alloc(200 * MiB, USER_STACK)
    oom_index = sim.oom(200 * MiB)
    sim.free(a)
    sim.free(b)
    sim.release_cache()
    sim.alloc(10 * MiB, USER_STACK)
    result = analyse(sim.snapshot(metadata=False))
    assert result.replay.target_index == oom_index
    assert result.replay.events_after_target > 0
    assert result.accounting.allocated_bytes == 400 * MiB
    assert result.accounting.reserved_bytes == 400 * MiB
    assert {blk.address for blk in result.live_blocks} == {a, b}
    assert [o.fatal for o in result.replay.ooms] == [True]


def test_creeping_leak_across_steps():
    sim = Sim(total_bytes=1 * GiB)
    sim.alloc(64 * MiB, (), "parameter", "model.weight")
    for step in range(4):
        sim.marker("forward", "start")
        kept = sim.alloc(60 * MiB)  # the loss's graph keeps this one  # noqa: F841
        scratch = sim.alloc(40 * MiB)
        if step == 3:
            sim.alloc(300 * MiB)
            sim.oom(400 * MiB)
            break
        sim.marker("forward", "end")
        sim.marker("backward", "start")
        sim.free(scratch)
        grad = sim.alloc(64 * MiB, (), "gradient", "model.weight.grad")
        sim.marker("backward", "end")
        sim.marker("optimizer_step", "start")
        sim.marker("optimizer_step", "end")
        sim.marker("zero_grad", "start")
        sim.free(grad)
        sim.marker("zero_grad", "end")
    result = analyse(sim.snapshot())
    assert result.target_step == 3
    assert result.verdict == "creeping-leak", (result.verdict, result.summary)
    assert any(r.id == "free-kept-tensors" for r in result.recommendations)
    ends = [s.end_allocated_bytes for s in result.steps[:3]]
    assert ends == sorted(ends) and ends[0] < ends[-1]


def test_gradients_kept_without_zero_grad():
    sim = Sim(total_bytes=700 * MiB)
    sim.alloc(128 * MiB, (), "parameter", "model.weight")
    for step in range(2):
        sim.marker("forward", "start")
        acts = [sim.alloc(80 * MiB) for _ in range(6 if step == 0 else 5)]
        if step == 1:
            sim.oom(80 * MiB)
            break
        sim.marker("forward", "end")
        sim.marker("backward", "start")
        for address in acts:
            sim.free(address)
        sim.alloc(128 * MiB, (), "gradient", "model.weight.grad")
        sim.marker("backward", "end")
        sim.marker("optimizer_step", "start")
        sim.marker("optimizer_step", "end")
    result = analyse(sim.snapshot())
    assert result.verdict == "gradients-kept", (result.verdict, result.summary)
    assert result.recommendations[0].id in {"zero-grad-set-to-none", "activation-checkpointing", "smaller-micro-batch"}
    assert any(r.id == "zero-grad-set-to-none" and r.would_fit_alone for r in result.recommendations)


def test_outside_pytorch():
    sim = Sim(total_bytes=1 * GiB, outside_bytes=700 * MiB)
    sim.alloc(150 * MiB, USER_STACK)
    sim.oom(200 * MiB)
    result = analyse(sim.snapshot())
    assert result.verdict == "outside-pytorch"
    assert result.accounting.non_pytorch_bytes == 700 * MiB


def test_no_oom_reports_the_peak():
    sim = Sim()
    a = sim.alloc(100 * MiB, USER_STACK)
    sim.alloc(50 * MiB, USER_STACK)
    sim.free(a)
    result = analyse(sim.snapshot(metadata=False))
    assert result.verdict == "no-oom"
    assert result.replay.target_kind == "peak"
    assert result.accounting.allocated_bytes == 150 * MiB
    assert result.replay.peak_allocated_bytes == 150 * MiB


def _fragmented_snapshot(expandable: bool) -> Snapshot:
    base = 0x7F0000000000
    segments = []
    for i in range(4):
        address = base + i * 64 * MiB
        segments.append(
            Segment(
                device=0,
                address=address,
                total_size=20 * MiB,
                stream=0,
                segment_type="large",
                blocks=(
                    Block(address, 4 * MiB, 4 * MiB, ACTIVE_ALLOCATED),
                    Block(address + 4 * MiB, 16 * MiB, 0, INACTIVE),
                ),
            )
        )
    trace = DeviceTrace.from_events(0, [TraceEvent("oom", 0, 30 * MiB, 0, (), 1, device_free=8 * MiB)])
    settings = AllocatorSettings(
        raw_conf="expandable_segments:True" if expandable else "", expandable_segments=expandable
    )
    return Snapshot(segments=tuple(segments), traces=(trace,), allocator_settings=settings)


def test_fragmentation_and_the_expandable_recommendation():
    result = analyse(_fragmented_snapshot(expandable=False))
    assert result.verdict == "fragmentation"
    frag = result.fragmentation
    assert frag.usable_free_bytes == 64 * MiB
    assert frag.largest_usable_free_block_bytes == 16 * MiB
    assert frag.would_fit_if_contiguous is True
    assert any(r.id == "expandable-segments" and r.would_fit_alone for r in result.recommendations)
    assert result.accounting.message_bytes == 30 * MiB


def test_never_recommends_a_setting_already_in_force():
    result = analyse(_fragmented_snapshot(expandable=True))
    assert all(r.id != "expandable-segments" for r in result.recommendations)


def test_phases_from_annotations_and_frames():
    events = []
    time_us = 100
    for stack in (USER_STACK, FORWARD_STACK, FORWARD_STACK, (), (), ADAM_INIT_STACK, USER_STACK, FORWARD_STACK):
        time_us += 10
        events.append(TraceEvent("alloc", 0x1000 + time_us * 4096, 4096, 0, stack, time_us))
    annotations = (
        Annotation("Optimizer.step#Adam.step", "START", 0, 155),
        Annotation("Optimizer.step#Adam.step", "END", 0, 165),
    )
    snapshot = Snapshot(segments=(), traces=(DeviceTrace.from_events(0, events),), annotations=annotations)
    result = analyse(snapshot)
    phases = [(s.first_index, s.phase, s.step) for s in result.phases]
    assert phases == [
        (0, "before_first_step", 0),
        (1, "forward", 0),
        (3, "backward", 0),
        (5, "optimizer_step", 0),
        (6, "between_steps", 1),
        (7, "forward", 1),
    ]
    assert result.phase_source == "annotations"
    assert {s.source for s in result.phases} == {"frames", "annotations"}


def test_empty_snapshot_is_analysed():
    result = analyse(Snapshot(segments=(), traces=()))
    assert result.verdict == "no-oom"
    assert result.accounting.reserved_bytes == 0
    assert UnknownKind.NO_HISTORY in {u.kind for u in result.unknowns}


def test_snapshot_without_a_trace_says_nothing_about_one():
    """With no trace every block is older than it: the report says there is no history once, and
    counts the blocks without a stack, instead of lines about what predates the trace or what the
    trace did to them."""
    sim = Sim(total_bytes=4 * GiB)
    sim.alloc(64 * MiB, SETUP_STACK)
    for _ in range(3):
        sim.alloc(128 * MiB, ())
    sim.alloc(32 * MiB, ADAM_INIT_STACK)
    traced = sim.snapshot(metadata=False)
    result = analyse(Snapshot(segments=traced.segments, traces=()))
    kinds = [u.kind for u in result.unknowns]
    assert UnknownKind.NO_HISTORY in kinds
    assert not {UnknownKind.PRE_EXISTING, UnknownKind.PRE_EXISTING_NO_STACK, UnknownKind.STEPS_BEFORE_TRACE} & set(
        kinds
    )
    (stackless,) = [u for u in result.unknowns if u.kind == UnknownKind.NO_STACK]
    assert stackless.count == 3
    words = [phrasing.unknown(u) for u in result.unknowns]
    assert not [w for w in words if "the trace" in w], words
    # the same blocks with their trace: older than nothing, so no such line
    assert UnknownKind.NO_STACK not in {u.kind for u in analyse(traced).unknowns}


def test_analysis_imports_no_torch_rich_or_textual():
    code = (
        "import sys, oomdoctor.analysis, oomdoctor.views.json_report, oomdoctor.views.text_report;"
        "bad = [m for m in ('torch', 'rich', 'textual') if m in sys.modules]; print(bad); sys.exit(bool(bad))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_state_at_any_event_walks_back_from_the_dump():
    from oomdoctor.analysis import replayer

    sim = Sim(total_bytes=512 * MiB)
    a = sim.alloc(100 * MiB, USER_STACK)
    b = sim.alloc(50 * MiB, USER_STACK)
    sim.free(a)
    sim.release_cache()
    c = sim.alloc(30 * MiB, USER_STACK)
    snapshot = sim.snapshot(metadata=False)
    replay = replayer(snapshot, 0)
    alloc_b = 3  # segment_alloc a, alloc a, segment_alloc b, alloc b
    state = replay.state_at(alloc_b)
    assert state.allocated_bytes == 150 * MiB and state.reserved_bytes == 150 * MiB
    assert {live.address for live in state.live} == {a, b}
    after_free = replay.state_at(alloc_b + 2)
    assert after_free.allocated_bytes == 50 * MiB and after_free.reserved_bytes == 150 * MiB
    final = replay.state_at(len(snapshot.traces[0]) - 1)
    assert final.exact and {live.address for live in final.live} == {b, c}
    assert final.allocated_bytes == 80 * MiB


def test_message_figure_follows_large_segment_size():
    assert segment_size(3 * MiB, 64 * MiB) == 64 * MiB
    assert segment_size(3 * MiB) == 20 * MiB


def _forward_pass(sim: Sim, sizes) -> list[int]:
    sim.marker("forward", "start")
    blocks = [sim.alloc(size, FORWARD_STACK) for size in sizes]
    return blocks


def test_model_states_too_large():
    sim = Sim(total_bytes=600 * MiB)
    for i in range(4):
        sim.alloc(64 * MiB, SETUP_STACK, "parameter", f"layer{i}.weight")
    acts = _forward_pass(sim, [8 * MiB] * 2)
    sim.marker("forward", "end")
    sim.marker("backward", "start")
    for a in acts:
        sim.free(a)
    for i in range(4):
        sim.alloc(64 * MiB, (), "gradient", f"layer{i}.weight.grad")
    sim.marker("backward", "end")
    sim.marker("optimizer_step", "start")
    sim.alloc(64 * MiB, ADAM_INIT_STACK, "optimizer_state", "layer0.weight.exp_avg")
    sim.oom(64 * MiB)
    result = analyse(sim.snapshot())
    assert result.verdict == "model-states-too-large", result.summary
    assert any(r.id == "shard-model-states" for r in result.recommendations)


def test_frozen_parameters_are_projected_without_gradients_or_optimizer_state():
    """A plain snapshot of a first optimizer step beside a frozen model (a reference or teacher
    model, an EMA copy, a LoRA's base weights): 256 MiB of weights get no gradient. The backward has
    completed, so the 64 MiB of gradients are all there are and Adam's state is 2x those, not 2x
    every parameter: the states need 448 MiB, not 1.25 GiB."""
    sim = Sim(total_bytes=560 * MiB)
    for _ in range(5):
        sim.alloc(64 * MiB, SETUP_STACK)
    acts = _forward_pass(sim, [8 * MiB] * 2)
    for a in acts:
        sim.free(a)
    sim.alloc(64 * MiB, BACKWARD_STACK)
    for _ in range(2):
        sim.alloc(64 * MiB, ADAM_INIT_STACK)
    sim.alloc(64 * MiB, FOREACH_STACK)
    sim.oom(64 * MiB, FOREACH_STACK)
    result = analyse(sim.snapshot(metadata=False, registry=False))
    assert {c.name: c.bytes for c in result.components}["gradients"] == 64 * MiB
    assert result.verdict == "optimizer-state-buildup", result.summary
    needed = [
        e
        for e in (*result.evidence, *(e for f in result.secondary for e in f.evidence))
        if e.metric == "model_states_needed_bytes"
    ]
    assert all(e.bytes <= 5 * 64 * MiB + 64 * MiB + 128 * MiB for e in needed)


def test_weights_that_cannot_fit_get_weight_advice_not_sharding_of_training_state():
    """A model being loaded for inference: nothing trains, there are no gradients or optimizer
    state, so the advice is about the weights (precision, offloading, tensor parallelism), not
    FSDP's sharding of training state."""
    sim = Sim(total_bytes=264 * MiB)
    for i in range(4):
        sim.alloc(64 * MiB, SETUP_STACK, "parameter", f"layer{i}.weight")
    sim.oom(64 * MiB)
    result = analyse(sim.snapshot())
    assert result.verdict == "model-states-too-large", result.summary
    ids = [r.id for r in result.recommendations]
    assert "shard-model-states" not in ids
    (weights,) = [r for r in result.recommendations if r.id == "smaller-weights"]
    assert weights.estimated_saved_bytes == 128 * MiB  # half the weights
    assert "quantise them" in phrasing.recommendation(weights)


def test_activation_spike_against_earlier_steps():
    sim = Sim(total_bytes=560 * MiB)
    sim.alloc(64 * MiB, SETUP_STACK, "parameter", "w")
    for step, count in enumerate((4, 4, 12)):
        acts = _forward_pass(sim, [40 * MiB] * count)
        if step == 2:
            sim.oom(40 * MiB)
            break
        sim.marker("forward", "end")
        sim.marker("backward", "start")
        for a in acts:
            sim.free(a)
        grad = sim.alloc(64 * MiB, (), "gradient", "w.grad")
        sim.marker("backward", "end")
        sim.marker("optimizer_step", "start")
        sim.marker("optimizer_step", "end")
        sim.marker("zero_grad", "start")
        sim.free(grad)
        sim.marker("zero_grad", "end")
    result = analyse(sim.snapshot())
    assert result.verdict == "activation-spike", result.summary
    assert result.target_step == 2
    assert result.summary.kind == SummaryKind.ACTIVATION_SPIKE and result.summary.facts.get("ratio") == 3.0
    assert "3.0x" in phrasing.summary(result.summary)
    # this forward already made more allocations than the earlier ones in all: its rest is unknown, and
    # the instant's largest scale is an upper bound only (docs/definitions.md, "A pass the OOM interrupted")
    assert result.what_if.case == "pass-interrupted" and result.what_if.largest_fitting_scale is None
    assert result.what_if.rest_of_pass is not None and result.what_if.rest_of_pass.reason == "beyond-earlier"
    scale = result.what_if.upper_bound_scale
    assert scale is not None and 0.5 < scale < 1.0
    assert result.what_if.predicted_peak_bytes(scale) <= result.what_if.capacity_bytes
    assert result.what_if.predicted_peak_bytes(scale + 0.02) > result.what_if.capacity_bytes
    assert result.what_if.fits_at(scale) is None and result.what_if.fits_at(scale + 0.02) is False


def test_inference_with_grad_keeps_each_pass():
    sim = Sim(total_bytes=600 * MiB)
    sim.alloc(64 * MiB, SETUP_STACK, "parameter", "w")
    for batch in range(5):
        _forward_pass(sim, [20 * MiB] * 5)  # each pass's graph (a tensor per layer) is kept by the running loss
        if batch == 4:
            sim.oom(100 * MiB)
            break
        sim.marker("forward", "end")
    result = analyse(sim.snapshot())
    assert result.verdict == "inference-with-grad", result.summary
    assert result.recommendations[0].id == "no-grad"


def _in_place_sgd_steps(*, gradients_freed: bool) -> Analysis:
    """Three iterations of batch, forward, backward (SGD updating in place: no allocations); with
    `gradients_freed` the loop frees each backward's blocks (its gradients set to None) before the
    next batch, else every block stays alive."""
    events = []
    time_us = 0
    for _step in range(3):
        backward = []
        for stack in [USER_STACK, FORWARD_STACK, FORWARD_STACK, (), ()]:  # batch, forward, backward
            time_us += 10
            events.append(TraceEvent("alloc", 0x100000 + time_us * 4096, 4096, 0, stack, time_us))
            if not stack:
                backward.append(events[-1].addr)
        for address in backward if gradients_freed else ():
            time_us += 10
            events.append(TraceEvent("free_requested", address, 4096, 0, USER_STACK, time_us))
    return analyse(Snapshot(segments=(), traces=(DeviceTrace.from_events(0, events),)))


def test_steps_counted_without_optimizer_allocations_or_annotations():
    """Where no optimizer step shows, a backward whose blocks (its gradients) are freed before the
    next pass ended a step; where they stay alive into the next pass (added into: gradient
    accumulation, or a loop that never frees them) the file cannot tell, and the passes are not
    counted as steps of their own: the report says so."""
    result = _in_place_sgd_steps(gradients_freed=True)
    forwards = [(s.first_index, s.step) for s in result.phases if s.phase == "forward"]
    assert forwards == [(1, 0), (8, 1), (15, 2)]
    assert result.phase_source == "frames"
    assert UnknownKind.PASSES_MAY_BE_STEPS not in {u.kind for u in result.unknowns}
    kept = _in_place_sgd_steps(gradients_freed=False)
    assert [(s.first_index, s.step) for s in kept.phases if s.phase == "forward"] == [(1, 0), (6, 0), (11, 0)]
    assert [u.count for u in kept.unknowns if u.kind == UnknownKind.PASSES_MAY_BE_STEPS] == [2]


def test_dump_phase_follows_the_last_marker():
    sim = Sim()
    sim.marker("forward", "start")
    sim.alloc(10 * MiB, FORWARD_STACK)
    sim.marker("forward", "end")
    sim.marker("backward", "start")
    sim.alloc(10 * MiB)
    sim.marker("backward", "end")
    result = analyse(sim.snapshot())
    assert result.replay.target_kind == "dump"
    assert (result.target_phase, result.target_step) == ("between_steps", 0)


def test_plain_snapshot_with_a_tiny_usable_device_points_outside():
    sim = Sim(total_bytes=120 * MiB, outside_bytes=100 * MiB)
    sim.alloc(1 * MiB, USER_STACK)
    sim.oom(4 * MiB)
    plain = analyse(sim.snapshot(metadata=False))
    assert plain.verdict == "outside-pytorch" and plain.confidence < 0.5
    assert plain.accounting.non_pytorch_bytes is None
    exact = analyse(sim.snapshot())
    assert exact.verdict == "outside-pytorch" and exact.confidence > 0.5
    assert exact.accounting.non_pytorch_bytes == 100 * MiB


@pytest.mark.parametrize(
    "metadata",
    [
        {"markers": "nope", "tensors": 5, "oom": [], "recording": {"max_entries": "x"}},
        {"markers": [1, None, {"phase": 3, "edge": "start", "time_us": "t"}], "tensors": [None, {"address": "a"}]},
        {
            "markers": [{"phase": "forward", "edge": "start", "time_us": 2**70, "step": "s"}],
            "device": [],
            "mem_get_info": 3,
        },
        {"oom": {"device": 9, "time_us": None}, "reason": 7, "tensors": [{"address": 1, "component": ["x"]}]},
    ],
    ids=["wrong-types", "junk-entries", "huge-numbers", "odd-oom"],
)
def test_malformed_metadata_never_breaks_the_analysis(metadata):
    sim = Sim()
    sim.alloc(10 * MiB, USER_STACK)
    sim.oom(2000 * MiB)
    snapshot = sim.snapshot(metadata=False)
    from dataclasses import replace

    result = analyse(replace(snapshot, **metadata_fields(metadata)))
    assert result.device == 0
    assert result.verdict in {"oversized-request", "outside-pytorch", "unknown"}


def test_free_memory_under_a_memory_fraction_is_what_the_fraction_leaves(tmp_path):
    """torch passes the allowed bytes as the total but the whole GPU's free memory: the analysis
    must measure headroom against the allowed bytes, not report negative memory outside PyTorch."""
    import pickle

    from oomdoctor.analysis import analyse
    from oomdoctor.load import load, load_raw
    from tests.conftest import FIXTURES

    raw = load_raw(FIXTURES / "dumps" / "oversized-request-gpt-logits.pickle")
    meta = raw["oomdoctor"]
    allowed = meta["oom"]["device_total_bytes"]
    reserved = allowed - meta["oom"]["device_free_bytes"]
    whole_gpu_free = 130 * 2**30
    meta["oom"]["device_free_bytes"] = whole_gpu_free
    for trace in raw["device_traces"]:
        for event in trace:
            if event.get("action") == "oom":
                event["device_free"] = whole_gpu_free
    path = tmp_path / "fraction.pickle"
    path.write_bytes(pickle.dumps(raw, protocol=4))
    accounting = analyse(load(path)).accounting
    assert accounting.device_free_bytes == allowed - reserved
    assert accounting.non_pytorch_bytes == 0


def test_kept_gradients_that_could_not_have_made_room_are_no_cause():
    """A placement failure (the free bytes added up to the request, no single place could take it):
    what is missing is 0, but old gradients only cause the OOM if freeing them closes the gap to the
    nearest place. 2 MiB of gradients a loop frees in zero_grad after its forward (GNN on varying
    graph sizes) are alive in the forward of a larger input that needs 36 MiB more than any place has (here the cache's pieces: fragmentation)."""

    class KeptCache(Sim):
        def release_cache(self) -> None:  # cache the flush cannot return (blocks of split segments)
            pass

    sim = KeptCache(total_bytes=560 * MiB)
    sim.alloc(2 * MiB, SETUP_STACK, "parameter", "conv.weight")
    for step in range(2):
        sim.marker("forward", "start")
        acts = [sim.alloc((64 if step == 0 else 100) * MiB, FORWARD_STACK) for _ in range(3)]
        if step == 1:
            sim.oom(100 * MiB, FORWARD_STACK)
            break
        sim.marker("forward", "end")
        sim.marker("zero_grad", "start")
        sim.marker("zero_grad", "end")
        sim.marker("backward", "start")
        for address in acts:
            sim.free(address)
        sim.alloc(2 * MiB, BACKWARD_STACK, "gradient", "conv.weight.grad")
        sim.marker("backward", "end")
        sim.marker("optimizer_step", "start")
        sim.marker("optimizer_step", "end")
    result = analyse(sim.snapshot())
    assert result.accounting.missing_bytes == 0
    verdicts = [result.verdict, *(f.verdict for f in result.secondary)]
    assert "gradients-kept" not in verdicts, (result.verdict, result.summary)


def _zero_grad_order_sim(*, zero_grad_before_forward: bool) -> Sim:
    """Step 0 trains; step 1's forward runs out with step 0's gradients alive. With
    `zero_grad_before_forward` a zero_grad ran before that forward and left them (set_to_none=False);
    else the loop calls zero_grad between forward and backward (a Lightning closure, the tutorial
    order `loss = model(x); opt.zero_grad(); loss.backward()`), so none ran since they were made."""
    sim = Sim(total_bytes=700 * MiB)
    sim.alloc(128 * MiB, SETUP_STACK, "parameter", "model.weight")
    for step in range(2):
        if step == 1 and zero_grad_before_forward:
            sim.marker("zero_grad", "start")
            sim.free(sim.alloc(512, USER_STACK))  # an event inside it, so the trace shows the phase
            sim.marker("zero_grad", "end")
        sim.marker("forward", "start")
        acts = [sim.alloc(80 * MiB, FORWARD_STACK) for _ in range(6 if step == 0 else 5)]
        if step == 1:
            sim.oom(80 * MiB, FORWARD_STACK)
            break
        sim.marker("forward", "end")
        if not zero_grad_before_forward:
            sim.marker("zero_grad", "start")
            sim.free(sim.alloc(512, USER_STACK))
            sim.marker("zero_grad", "end")
        sim.marker("backward", "start")
        for address in acts:
            sim.free(address)
        sim.alloc(128 * MiB, BACKWARD_STACK, "gradient", "model.weight.grad")
        sim.marker("backward", "end")
        sim.marker("optimizer_step", "start")
        sim.marker("optimizer_step", "end")
    return sim


@pytest.mark.parametrize(("zero_grad_before_forward", "kind"), [(True, "zero-grad-kept"), (False, "zero-grad-later")])
def test_gradients_kept_says_whether_zero_grad_kept_them_or_has_not_run_since(zero_grad_before_forward, kind):
    result = analyse(_zero_grad_order_sim(zero_grad_before_forward=zero_grad_before_forward).snapshot())
    finding = next(f for f in (result, *result.secondary) if f.verdict == "gradients-kept")
    kinds = {e.kind.value for e in finding.evidence}
    assert kind in kinds and not kinds & ({"zero-grad-kept", "zero-grad-later"} - {kind}), kinds
