"""Several devices compared (issue 11, cause K): the per-device summary, the imbalance finding
between replicas, training decided across devices, and each report's devices section."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oomdoctor.analysis import analyse
from oomdoctor.analysis.devices import IMBALANCE_RATIO, _index_at_time, _last_at_or_before
from oomdoctor.model import DeviceTrace, Frame, TraceEvent
from oomdoctor.views import json_report, markdown_report, text_report
from oomdoctor.vocabulary import Verdict
from tests.builders import FORWARD_STACK, GiB, MiB, Sim, several_devices

PARALLEL = "/usr/lib/python3/site-packages/torch/nn/parallel/"
REPLICATE_STACK = (
    Frame(PARALLEL + "comm.py", 67, "broadcast_coalesced"),
    Frame(PARALLEL + "replicate.py", 110, "replicate"),
    Frame(PARALLEL + "data_parallel.py", 190, "replicate"),
    Frame("train.py", 40, "train_step"),
)
REPLICA_FORWARD = (*FORWARD_STACK[:3], Frame(PARALLEL + "parallel_apply.py", 99, "_worker"))
BACKWARD_STACK = (
    Frame("/usr/lib/python3/site-packages/torch/autograd/__init__.py", 266, "backward"),
    Frame("/usr/lib/python3/site-packages/torch/_tensor.py", 581, "backward"),
    Frame("train.py", 42, "train_step"),
)
OTHER_CODE = (Frame("teacher.py", 7, "forward"), Frame("serve.py", 3, "main"))


def replica(activations: int, size: int, *, oom: int | None = None, backward: bool = False) -> Sim:
    """One device of a DataParallel step: its replica of the parameters, `activations` forward
    tensors of `size`, then an OOM or (with `backward`) the backward's gradients."""
    sim = Sim(total_bytes=8 * GiB)
    sim.alloc(100 * MiB, REPLICATE_STACK)
    for _ in range(activations):
        sim.alloc(size, REPLICA_FORWARD)
    if backward:
        for _ in range(4):
            sim.alloc(50 * MiB, BACKWARD_STACK)
    if oom is not None:
        index = sim.oom(oom)
        sim.events[index] = dataclasses.replace(sim.events[index], frames=REPLICA_FORWARD)  # the failed alloc's
    return sim


def imbalanced():
    """Device 1 got most of the batch and ran out; device 0's replica held a fraction of it."""
    return several_devices(replica(4, 100 * MiB), replica(30, 200 * MiB, oom=2 * GiB))


def test_summary_holds_every_device():
    analysis = analyse(imbalanced())
    assert analysis.device == 1
    zero, one = analysis.device_summaries
    assert (zero.device, zero.judged, one.device, one.judged) == (0, False, 1, True)
    assert zero.peak_allocated_bytes == 500 * MiB and zero.oom_count == 0 and zero.moment == "peak"
    assert one.peak_allocated_bytes == analysis.replay.peak_allocated_bytes == 6100 * MiB
    assert one.oom_count == 1 and one.moment == "oom"
    assert zero.reserved_bytes == zero.allocated_bytes == 500 * MiB
    assert "forward" in zero.phases and "forward" in one.phases and not zero.trains
    assert (zero.largest_component, zero.largest_component_bytes) == ("activations", 400 * MiB)
    assert one.largest_component == max(analysis.components, key=lambda c: c.bytes).name
    assert zero.replica and zero.data_parallel
    # device 0's trace ended before device 1's OOM: it held its end state then
    assert zero.allocated_at_judged_bytes == 500 * MiB


def test_single_device_has_no_summary():
    sim = replica(30, 200 * MiB, oom=2 * GiB)
    assert analyse(sim.snapshot(metadata=False)).device_summaries == ()


def test_imbalance_is_a_secondary_finding_with_peer_evidence():
    analysis = analyse(imbalanced())
    assert analysis.verdict != Verdict.DEVICE_IMBALANCE
    finding = next(f for f in analysis.secondary if f.verdict == Verdict.DEVICE_IMBALANCE)
    facts = finding.summary.facts
    assert (facts.get("device"), facts.get("peer"), facts.size("peer_peak")) == (1, 0, 500 * MiB)
    assert facts.number("ratio") == pytest.approx(6100 / 500)
    peer = [e for e in finding.evidence if e.kind == "peer-peak"]
    assert [(e.facts.get("device"), e.bytes) for e in peer] == [(0, 500 * MiB)]


def test_balanced_replicas_are_no_finding():
    balanced = several_devices(replica(28, 200 * MiB), replica(30, 200 * MiB, oom=2 * GiB))
    analysis = analyse(balanced)
    zero, one = analysis.device_summaries
    assert one.peak_allocated_bytes < IMBALANCE_RATIO * zero.peak_allocated_bytes
    assert all(f.verdict != Verdict.DEVICE_IMBALANCE for f in analysis.secondary)


def test_other_code_on_another_device_is_not_compared():
    other = Sim(total_bytes=8 * GiB)
    other.alloc(100 * MiB, OTHER_CODE)
    analysis = analyse(several_devices(other, replica(30, 200 * MiB, oom=2 * GiB)))
    zero = analysis.device_summaries[0]
    assert not zero.replica
    assert all(f.verdict != Verdict.DEVICE_IMBALANCE for f in analysis.secondary)
    assert "Device 0 not compared with device 1 as replicas of one model" in text_report.render(analysis)


def test_a_model_split_across_devices_is_no_pair_of_replicas():
    """device_map="auto": each device runs its own layers, called from one user line and of one
    layer class (the same source lines): no DataParallel frames, so no replicas and no imbalance."""
    layer = (*FORWARD_STACK[:3], Frame("run.py", 20, "main"))
    first, last = Sim(total_bytes=8 * GiB), Sim(total_bytes=8 * GiB)
    for _ in range(4):
        first.alloc(100 * MiB, layer)
    for _ in range(30):
        last.alloc(200 * MiB, layer)
    last.oom(2 * GiB, layer)
    analysis = analyse(several_devices(first, last))
    zero = analysis.device_summaries[0]
    assert not zero.replica and not zero.data_parallel
    assert all(f.verdict != Verdict.DEVICE_IMBALANCE for f in analysis.secondary)
    assert "balance-devices" not in {r.id for r in analysis.recommendations}


def test_training_is_decided_across_devices():
    """Device 1's trace stops at its OOM in the forward; device 0's replica reached its backward."""
    cut_short = replica(30, 200 * MiB, oom=2 * GiB)
    alone = analyse(cut_short.snapshot(metadata=False))
    both = analyse(several_devices(replica(4, 100 * MiB, backward=True), replica(30, 200 * MiB, oom=2 * GiB)))
    zero, one = both.device_summaries
    assert zero.trains and zero.tells_training and not one.trains
    alone_changes = {r.id for r in alone.recommendations}
    both_changes = {r.id for r in both.recommendations}
    assert "smaller-batch" in alone_changes and "smaller-micro-batch" not in alone_changes
    assert "smaller-micro-batch" in both_changes and "smaller-batch" not in both_changes
    assert "reached one: the run trains" in text_report.render(both)


def test_training_is_not_told_by_other_code():
    other = Sim(total_bytes=8 * GiB)
    other.alloc(100 * MiB, OTHER_CODE)
    other.alloc(50 * MiB, BACKWARD_STACK)
    analysis = analyse(several_devices(other, replica(30, 200 * MiB, oom=2 * GiB)))
    assert not any(s.tells_training for s in analysis.device_summaries)


def test_text_report_devices_section():
    text = text_report.render(analysis := analyse(imbalanced()))
    section = text[text.index("\nDevices\n") :]
    assert "1 (judged)" in section and "reserved at the dump" in section
    assert "device-imbalance" in text
    assert "Devices" not in text_report.render(analyse(replica(30, 200 * MiB, oom=2 * GiB).snapshot(metadata=False)))
    assert analysis.device_summaries


def test_markdown_report_devices_section():
    markdown = markdown_report.render(analyse(imbalanced()))
    assert "### Devices" in markdown
    assert "| 1 (judged) |" in markdown and "| 0 |" in markdown
    single = markdown_report.render(analyse(replica(30, 200 * MiB, oom=2 * GiB).snapshot(metadata=False)))
    assert "### Devices" not in single


def test_json_report_devices_section():
    data = json.loads(json_report.render(analyse(imbalanced())))
    compared = data["devices_compared"]
    assert [d["device"] for d in compared["devices"]] == [0, 1]
    assert compared["devices"][1]["judged"] is True and compared["text"]
    assert any(f["verdict"] == "device-imbalance" for f in data["secondary"])
    single = json.loads(json_report.render(analyse(replica(30, 200 * MiB, oom=2 * GiB).snapshot(metadata=False))))
    assert "devices_compared" not in single


CORPUS = Path(__file__).resolve().parents[2] / "shared" / "corpus" / "snapshots"
MULTI_DEVICE = CORPUS / "multi_device_expandable__constructor_sun_code_location__memory_snapshot.pickle"


@pytest.mark.skipif(not MULTI_DEVICE.exists(), reason="the corpus (../shared/corpus) is absent")
def test_corpus_data_parallel_imbalance():
    """torch_geometric DataParallel over three GPUs: cuda:1 ran out in its forward holding 78.29 GiB,
    cuda:0 peaked at 7.88 GiB and cuda:2 at 20.08 GiB (LABELS.md, file 19)."""
    from oomdoctor.load import load

    analysis = analyse(load(MULTI_DEVICE))
    assert analysis.device == 1 and analysis.verdict == Verdict.ACTIVATION_SPIKE
    summaries = {s.device: s for s in analysis.device_summaries}
    assert set(summaries) == {0, 1, 2}
    assert summaries[0].peak_allocated_bytes == pytest.approx(7.88 * GiB, rel=0.01)
    assert summaries[2].peak_allocated_bytes == pytest.approx(20.08 * GiB, rel=0.01)
    assert summaries[1].peak_allocated_bytes == pytest.approx(78.29 * GiB, rel=0.01)
    assert all(s.replica and s.data_parallel and not s.trains for s in summaries.values())
    assert summaries[0].allocated_at_judged_bytes == pytest.approx(7.54 * GiB, rel=0.01)  # ended before the OOM
    assert summaries[2].allocated_at_judged_bytes == pytest.approx(18.84 * GiB, rel=0.01)
    finding = next(f for f in analysis.secondary if f.verdict == Verdict.DEVICE_IMBALANCE)
    assert finding.summary.facts.get("peer") == 2
    assert finding.summary.facts.number("ratio") == pytest.approx(78.29 / 20.08, rel=0.02)


SCATTER_STACK = (
    Frame(PARALLEL + "comm.py", 205, "scatter"),
    Frame(PARALLEL + "_functions.py", 102, "forward"),
    Frame(PARALLEL + "scatter_gather.py", 35, "scatter_map"),
    Frame(PARALLEL + "scatter_gather.py", 50, "scatter"),
    Frame(PARALLEL + "scatter_gather.py", 80, "scatter_kwargs"),
    Frame(PARALLEL + "data_parallel.py", 195, "scatter"),
    Frame(PARALLEL + "data_parallel.py", 180, "forward"),
    Frame("train.py", 40, "train_step"),
)


def test_a_replica_is_parameters_and_its_share_of_the_batch_inputs():
    """DataParallel's replicate and scatter run inside its forward; what they make is the replica's
    parameters and the device's share of the inputs, not the forward's activations."""
    sim = replica(30, 200 * MiB)
    sim.alloc(64 * MiB, SCATTER_STACK)
    sim.oom(2 * GiB, REPLICA_FORWARD)
    analysis = analyse(several_devices(replica(4, 100 * MiB), sim))
    shares = {s.name: (s.bytes, s.method) for s in analysis.components if s.bytes}
    assert shares["parameters"] == (100 * MiB, "frames")
    assert shares["inputs"] == (64 * MiB, "frames")
    assert shares["activations"][0] == 30 * 200 * MiB


def test_an_imbalance_is_advised_to_balance_the_work():
    """Balanced, the judged device holds about the mean of what the replicas held at their peaks."""
    analysis = analyse(imbalanced())
    saved = {r.id: r for r in analysis.recommendations}
    balanced = (6100 * MiB + 500 * MiB) // 2
    assert saved["balance-devices"].estimated_saved_bytes == 6100 * MiB - balanced
    assert "DataParallel splits a batch by count" in text_report.render(analysis)


def test_balanced_replicas_are_not_advised_to_balance():
    balanced = several_devices(replica(28, 200 * MiB), replica(30, 200 * MiB, oom=2 * GiB))
    assert "balance-devices" not in {r.id for r in analyse(balanced).recommendations}


@pytest.mark.skipif(not MULTI_DEVICE.exists(), reason="the corpus (../shared/corpus) is absent")
def test_corpus_data_parallel_replica_and_inputs():
    """The expert's reading of cuda:1 at its OOM: the replica's parameters (broadcast_coalesced,
    0.234 GiB), the scattered graph batch (0.133 GiB), the forward's activations; balancing the
    work across the GPUs is the first advice."""
    from oomdoctor.load import load

    analysis = analyse(load(MULTI_DEVICE))
    shares = {s.name: s.bytes for s in analysis.components}
    assert shares["parameters"] == 251666432
    assert shares["inputs"] == pytest.approx(143321600, rel=0.01)
    assert "balance-devices" in {r.id for r in analysis.recommendations}


def _cut_short_beside_a_finished_replica(replica_later: bool = False):
    """Device 1 ran out three allocations into its forward (its first: nothing earlier in its trace
    shows the rest); device 0, a replica, ran the same forward, eight allocations, to its end, and
    its trace ended before device 1's OOM (or, with `replica_later`, went on past it)."""
    finished = replica(8, 100 * MiB)
    cut = Sim(total_bytes=8 * GiB)
    cut.time_us += 0 if replica_later else 10_000  # device 1's events come after device 0's last
    cut.alloc(100 * MiB, REPLICATE_STACK)
    for _ in range(3):
        cut.alloc(800 * MiB, REPLICA_FORWARD)
    index = cut.oom(2 * GiB)
    cut.events[index] = dataclasses.replace(cut.events[index], frames=REPLICA_FORWARD)
    if replica_later:
        finished.time_us += 10_000_000
        finished.alloc(1 * MiB, REPLICA_FORWARD)
    return analyse(several_devices(finished, cut))


def test_a_pass_cut_short_is_extrapolated_from_a_replica_that_finished_it():
    analysis = _cut_short_beside_a_finished_replica()
    rest = analysis.what_if.rest_of_pass
    assert analysis.device == 1 and rest is not None and rest.extrapolated
    assert rest.earlier_device == 0
    assert rest.projected_pass_bytes > rest.pass_bytes  # five more of the replica's allocations to come
    note = text_report.render(analysis)
    assert "extrapolated from device 0's pass of the same layers" in note


def test_a_replica_still_running_at_the_oom_does_not_tell_the_rest():
    rest = _cut_short_beside_a_finished_replica(replica_later=True).what_if.rest_of_pass
    assert rest is not None and not rest.extrapolated and rest.reason == "no-earlier-pass"


def test_a_site_is_read_from_python_frames_in_a_stacks_all_dump():
    """A `stacks="all"` stack starts with the unwinder's and the allocator's C++ frames, alike for
    every allocation: the site is the innermost Python frames."""
    from oomdoctor.analysis.passes import site_key

    native = (
        Frame("??", 0, "torch::unwind::unwind()"),
        Frame("CUDACachingAllocator.cpp", 0, "c10::cuda::CUDACachingAllocator::Native::malloc"),
    )
    one = (*native, Frame("model.py", 174, "update_nodes"), Frame("model.py", 231, "forward"))
    other = (*native, Frame("model.py", 181, "update_nodes"), Frame("model.py", 231, "forward"))
    assert site_key(one) == (("model.py", 174), ("model.py", 231))
    assert site_key(one) != site_key(other)
    assert site_key(native) is None and site_key(()) is None


@pytest.mark.skipif(not MULTI_DEVICE.exists(), reason="the corpus (../shared/corpus) is absent")
def test_corpus_data_parallel_rest_of_the_pass_from_a_replica():
    """cuda:1 ran out 5 of 12 message-passing iterations into its forward; cuda:2 ran all 12 (the
    expert: the full forward needs ~157 GiB there, so half the batch is not enough; balanced it fits;
    the run trains, by AdamW's zero_grad annotation on device 0, so checkpointing is advised too)."""
    from oomdoctor.load import load

    analysis = analyse(load(MULTI_DEVICE))
    rest = analysis.what_if.rest_of_pass
    assert rest is not None and rest.earlier_device == 2
    assert 140 * GiB < rest.projected_pass_bytes < 200 * GiB
    # the run trains (AdamW's zero_grad annotated) but no replica ran a backward: what it adds is
    # unknown, so nothing is said to fit, and the what-if's scale is an upper bound only
    assert analysis.what_if.case == "backward-unknown" and analysis.what_if.largest_fitting_scale is None
    assert analysis.what_if.upper_bound_scale is not None
    fits = {r.id: r.would_fit_alone for r in analysis.recommendations}
    assert fits["smaller-micro-batch"] is False
    assert fits["balance-devices"] is None and fits["activation-checkpointing"] is None


def test_an_optimizer_s_annotation_tells_the_run_trains():
    """torch's record_function windows of an optimizer's zero_grad (or step), on any device, show
    an optimizer at work: a first forward cut short by its OOM is advised as training (a smaller
    micro-batch with accumulation), not as evaluation (a smaller batch)."""
    from oomdoctor.model import Annotation

    sim = replica(30, 200 * MiB, oom=2 * GiB)
    plain = sim.snapshot(metadata=False)
    ids = {r.id for r in analyse(plain).recommendations}
    assert "smaller-batch" in ids and "smaller-micro-batch" not in ids
    zero_grad = [Annotation("Optimizer.zero_grad#AdamW.zero_grad", stage, 0, 1) for stage in ("START", "END")]
    annotated = dataclasses.replace(plain, annotations=tuple(zero_grad))
    ids = {r.id for r in analyse(annotated).recommendations}
    assert "smaller-micro-batch" in ids and "smaller-batch" not in ids


def test_a_replica_s_forward_without_a_backward_says_no_backward_is_counted():
    from oomdoctor.views import phrasing

    what_if = _cut_short_beside_a_finished_replica().what_if
    assert what_if.rest_of_pass is not None and not what_if.rest_of_pass.earlier_backward
    note = phrasing.what_if_note(what_if)
    assert "so the rest of the pass is extrapolated" in note
    assert "(that pass ran no backward, so no backward is counted)" in note


def test_a_replica_s_forward_tells_nothing_of_the_backward_of_a_run_that_trains():
    from oomdoctor.model import Annotation
    from oomdoctor.views import phrasing

    # the judged device's first forward, no optimizer called yet: nothing tells whether a backward follows
    sim_free = _cut_short_beside_a_finished_replica()
    assert sim_free.what_if.case == "backward-unknown" and not sim_free.what_if.trains
    # (the file records annotations: not "this torch records none", but none was due yet)
    assert "nothing in the file tells whether the run trains" in phrasing.what_if_note(sim_free.what_if)
    finished = replica(8, 100 * MiB)
    cut = Sim(total_bytes=8 * GiB)
    cut.time_us += 10_000
    cut.alloc(100 * MiB, REPLICATE_STACK)
    for _ in range(3):
        cut.alloc(800 * MiB, REPLICA_FORWARD)
    index = cut.oom(2 * GiB)
    cut.events[index] = dataclasses.replace(cut.events[index], frames=REPLICA_FORWARD)
    zero_grad = tuple(Annotation("Optimizer.zero_grad#SGD.zero_grad", stage, 0, 1) for stage in ("START", "END"))
    analysis = analyse(dataclasses.replace(several_devices(finished, cut), annotations=zero_grad))
    what_if = analysis.what_if
    assert what_if.case == "backward-unknown" and what_if.largest_fitting_scale is None
    assert "an upper bound only: the run trains, and what its backward adds is unknown" in phrasing.what_if_note(
        what_if
    )
    assert all(r.would_fit_alone is not True for r in analysis.recommendations)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.one_of(st.integers(min_value=0, max_value=50), st.none()), max_size=30),
    st.integers(min_value=-5, max_value=60),
)
def test_a_peer_is_read_at_the_last_event_at_or_before_the_judged_time(times, time_us):
    """Found in C where every event has its time (in order or not): the same event as the reading
    event by event finds."""
    trace = DeviceTrace.from_events(
        0, [TraceEvent("alloc", 512 * (i + 1), 512, time_us=t) for i, t in enumerate(times)]
    )
    assert _index_at_time(trace, time_us) == _last_at_or_before(trace.times_us or (), time_us)
    assert _index_at_time(trace, None) is None


@given(st.lists(st.sampled_from([0, 1, 2]), max_size=30))
def test_the_events_with_frames_are_those_with_a_non_empty_stack(kinds):
    stacks = [(), FORWARD_STACK, BACKWARD_STACK]
    trace = DeviceTrace.from_events(
        0, [TraceEvent("alloc", 512 * (i + 1), 512, frames=stacks[k]) for i, k in enumerate(kinds)]
    )
    indices = list(range(len(kinds)))[::-1][::2][::-1]
    assert (
        trace.with_frames(indices) == [i for i in indices if trace.has_frames_at(i)] == [i for i in indices if kinds[i]]
    )
