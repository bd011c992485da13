"""A first forward that runs out near its start (verdicts._first_pass): no earlier pass in the trace
shows how much of it remained, so what it needs is known only as a bound, what it reached with the
failed request. Where the model states fit at full size, the pass is too large for the device in one
pass (`activation-spike`); where they fit only if some parameters are frozen, which the file does not
show, the verdict is `unknown` and says what decides it."""

from __future__ import annotations

import re

from oomdoctor.analysis import analyse
from oomdoctor.analysis.results import EvidenceKind, SummaryKind
from oomdoctor.model import Frame
from oomdoctor.pipeline import render_report
from oomdoctor.units import GIB as GiB
from oomdoctor.units import MIB as MiB
from oomdoctor.views.phrasing import evidence, summary
from tests.builders import FORWARD_STACK, SETUP_STACK, Sim

BASE_MIB = 700  # the frozen weights
ADAPTER_MIB = 8  # the weights that train
ACTIVATION_MIB = 50
REQUEST_MIB = 120


def _first_forward_oom(*, trains: dict[str, bool] | None) -> Sim:
    """1 GiB: 708 MiB of parameters, then the first forward keeps 200 MiB of activations and asks
    for 120 MiB more with 116 MiB free. `trains`: the registry's requires_grad by name (None: the
    registry does not say)."""
    sim = Sim(total_bytes=GiB)
    sim.alloc(BASE_MIB * MiB, SETUP_STACK, "parameter", "base.weight")
    sim.alloc(ADAPTER_MIB * MiB, SETUP_STACK, "parameter", "adapter.weight")
    if trains is not None:
        for entry in sim.tensors:
            entry["requires_grad"] = trains[entry["name"]]
    sim.marker("forward", "start")
    for _ in range(4):
        sim.alloc(ACTIVATION_MIB * MiB, FORWARD_STACK)
    sim.oom(REQUEST_MIB * MiB, FORWARD_STACK)
    return sim


def _evidence(result, kind: str):
    (item,) = [e for e in result.evidence if e.kind == kind]
    return item


def test_a_first_forward_the_frozen_model_leaves_too_little_room_is_too_large_in_one_pass():
    # the registry says the 700 MiB base is frozen: gradients and Adam state come for the adapter only
    sim = _first_forward_oom(trains={"base.weight": False, "adapter.weight": True})
    result = analyse(sim.snapshot(extra={"optimizers": 1}))
    assert (result.target_phase, result.target_step) == ("forward", 0)
    assert result.verdict == "activation-spike", result.verdict
    assert result.summary.kind == SummaryKind.ACTIVATIONS_FIRST_PASS
    # what the pass reached with the request (a bound), against the room the rest left it
    reached = _evidence(result, EvidenceKind.PASS_REACHED)
    assert reached.bytes == (4 * ACTIVATION_MIB + REQUEST_MIB) * MiB
    room = _evidence(result, EvidenceKind.ROOM_FOR_PASS)
    assert room.bytes == GiB - (BASE_MIB + ADAPTER_MIB) * MiB
    states = _evidence(result, EvidenceKind.MODEL_STATES_AT_FULL_SIZE)
    assert states.bytes == (BASE_MIB + ADAPTER_MIB + 3 * ADAPTER_MIB) * MiB  # + gradients + two moments
    words = summary(result.summary)
    assert "a lower bound" in words and "too large for this device in one pass" in words
    assert "x the peak" not in words  # no earlier step to compare with
    assert "lower bound" in evidence(reached)
    assert "upper bound" not in evidence(states)  # the registry says which parameters train


def test_a_first_forward_of_a_model_that_does_not_train_is_too_large_in_one_pass():
    # nothing requires gradients and no optimizer was made: the parameters are all the states there are
    sim = _first_forward_oom(trains={"base.weight": False, "adapter.weight": False})
    result = analyse(sim.snapshot())
    assert result.verdict == "activation-spike", result.verdict
    assert result.summary.kind == SummaryKind.ACTIVATIONS_FIRST_PASS
    states = _evidence(result, EvidenceKind.MODEL_STATES_AT_FULL_SIZE)
    assert states.bytes == (BASE_MIB + ADAPTER_MIB) * MiB
    # nothing is projected: no Adam-style moments are assumed for parameters none of which train
    words = evidence(states)
    assert "projected" not in words and "Adam" not in words
    assert "as held: no gradients or optimizer state still to come" in words


def test_a_plain_first_forward_whose_states_fit_only_if_frozen_is_unknown_and_says_why():
    # the same run as a plain snapshot: 708 MiB of parameters would need 2.8 GiB with gradients and
    # Adam state if all trained, and fit if most are frozen; the file cannot tell which
    sim = _first_forward_oom(trains=None)
    result = analyse(sim.snapshot(metadata=False))
    assert (result.target_phase, result.target_step) == ("forward", 0)
    assert result.verdict == "unknown"
    assert result.summary.kind == SummaryKind.UNKNOWN_WHAT_TRAINS
    words = summary(result.summary)
    assert "cannot tell whether they train" in words and "a lower bound" in words
    assert "a LoRA base, or inference" in words  # nothing shows the run trains at all


def test_a_plain_first_forward_inside_a_training_step_asks_which_parameters_train():
    # the forward runs inside `training_step`: the run trains, and which of its parameters do is unknown
    step = (Frame("train.py", 40, "training_step"),)
    sim = Sim(total_bytes=GiB)
    sim.alloc((BASE_MIB + ADAPTER_MIB) * MiB, SETUP_STACK)
    forward = (*FORWARD_STACK[:-1], *step)
    for _ in range(4):
        sim.alloc(ACTIVATION_MIB * MiB, forward)
    sim.oom(REQUEST_MIB * MiB, forward)
    result = analyse(sim.snapshot(metadata=False))
    assert result.summary.kind == SummaryKind.UNKNOWN_WHAT_TRAINS
    words = summary(result.summary)
    assert "the run trains, and the file cannot tell which of them do" in words
    assert "inference" not in words
    states = _evidence(result, EvidenceKind.MODEL_STATES_AT_FULL_SIZE)
    assert states.bytes == 4 * (BASE_MIB + ADAPTER_MIB) * MiB
    assert "assuming every parameter trains, an upper bound" in evidence(states)
    assert "the state at 2x the parameters that train, assuming Adam-style moments" in evidence(states)
    assert _evidence(result, EvidenceKind.PASS_REACHED).bytes == (4 * ACTIVATION_MIB + REQUEST_MIB) * MiB


def test_activations_dominating_a_first_forward_say_what_the_pass_reached_as_a_bound():
    # 100 MiB of parameters; the first forward holds 800 MiB of activations and asks for 200 MiB more
    sim = Sim(total_bytes=GiB)
    sim.alloc(100 * MiB, SETUP_STACK, "parameter", "weight")
    sim.marker("forward", "start")
    for _ in range(4):
        sim.alloc(200 * MiB, FORWARD_STACK)
    sim.oom(200 * MiB, FORWARD_STACK)
    result = analyse(sim.snapshot(extra={"optimizers": 1}))
    assert result.verdict == "activation-spike", result.verdict
    assert result.summary.kind == SummaryKind.ACTIVATIONS_DOMINATE
    assert _evidence(result, EvidenceKind.PASS_REACHED).bytes == 1000 * MiB
    assert _evidence(result, EvidenceKind.ROOM_FOR_PASS).bytes == GiB - 100 * MiB
    assert not [e for e in result.evidence if e.kind == EvidenceKind.EARLIER_PEAK_ACTIVATIONS]


def test_the_room_a_first_forward_had_does_not_say_it_allocated_none_of_the_rest():
    # the pass made a cuBLAS workspace (a C++ frame that allocates one; a plain snapshot, as read
    # without markers), which is not its own activations or temporaries: the rest it is weighed
    # against holds it, though the pass made it
    workspace = (Frame("??", 0, "at::cuda::getNewWorkspace()"), *FORWARD_STACK)
    sim = Sim(total_bytes=GiB)
    sim.alloc(100 * MiB, SETUP_STACK)
    sim.alloc(8 * MiB, workspace)
    for _ in range(4):
        sim.alloc(200 * MiB, FORWARD_STACK)
    sim.oom(200 * MiB, FORWARD_STACK)
    result = analyse(sim.snapshot(metadata=False))
    assert result.component_bytes()["workspace"] == 8 * MiB
    room = _evidence(result, EvidenceKind.ROOM_FOR_PASS)
    assert room.bytes == GiB - 108 * MiB  # the parameters and the workspace the pass made
    words = evidence(room)
    assert "did not allocate" not in words
    assert "the capacity less the 108.00 MiB allocated besides its own activations and temporaries" in words


def test_states_that_need_95_percent_of_the_capacity_are_not_said_to_need_more_than_it():
    # 245 MiB of parameters, 980 MiB with gradients and Adam state if all trained: at least 95% of
    # the 1 GiB (too large to train beside anything else), yet less than it. The first forward holds
    # 200 MiB beside a 400 MiB batch and asks for 200 MiB more
    sim = Sim(total_bytes=GiB)
    sim.alloc(245 * MiB, SETUP_STACK)
    for _ in range(4):
        sim.alloc(100 * MiB, (Frame("train.py", 30, "load_batch"), Frame("train.py", 50, "main")))
    for _ in range(4):
        sim.alloc(50 * MiB, FORWARD_STACK)
    sim.oom(200 * MiB, FORWARD_STACK)
    result = analyse(sim.snapshot(metadata=False))
    assert result.summary.kind == SummaryKind.UNKNOWN_WHAT_TRAINS
    assert _evidence(result, EvidenceKind.MODEL_STATES_AT_FULL_SIZE).bytes == 980 * MiB
    words = summary(result.summary)
    assert "more than the 1.00 GiB" not in words
    assert "bring the model states to 980.00 MiB, 96% of the 1.00 GiB PyTorch could have" in words


def test_a_first_forward_s_lines_from_the_file_are_escaped_in_each_report():
    # the frames' file names are the dump's text: control characters shown escaped, markup as data
    hostile = "[bold]x[/]\x1b[31m\x07`|<b>*m*.py"
    stack = (*FORWARD_STACK[:1], Frame(hostile, 12, "forward"), *FORWARD_STACK[2:])
    sim = Sim(total_bytes=GiB)
    sim.alloc(BASE_MIB * MiB, SETUP_STACK, "parameter", "base.weight")
    sim.alloc(ADAPTER_MIB * MiB, SETUP_STACK, "parameter", "adapter.weight")
    for entry in sim.tensors:
        entry["requires_grad"] = entry["name"] == "adapter.weight"
    sim.marker("forward", "start")
    for _ in range(4):
        sim.alloc(ACTIVATION_MIB * MiB, stack)
    sim.oom(REQUEST_MIB * MiB, stack)
    snapshot = sim.snapshot(extra={"optimizers": 1})
    assert analyse(snapshot).summary.kind == SummaryKind.ACTIVATIONS_FIRST_PASS
    for output in ("text", "md"):
        report = render_report(snapshot, output).decode()
        assert not re.search("[\x00-\x09\x0b-\x1f\x7f-\x9f]", report)
        assert "\\x1b[31m\\x07" in report  # shown, escaped


def _adapter_first_forward_oom() -> Sim:
    """1 GiB: a 600 MiB frozen base and a 150 MiB adapter that trains (the registry says so), then
    the first forward keeps 200 MiB of activations and asks for 100 MiB more with 74 MiB free.
    With Adam's two moments for the adapter the model states would need 1.17 GiB at full size; with
    no optimizer state, 900 MiB."""
    sim = Sim(total_bytes=GiB)
    sim.alloc(600 * MiB, SETUP_STACK, "parameter", "base.weight")
    sim.alloc(150 * MiB, SETUP_STACK, "parameter", "adapter.weight")
    for entry in sim.tensors:
        entry["requires_grad"] = entry["name"] == "adapter.weight"
    sim.marker("forward", "start")
    for _ in range(4):
        sim.alloc(50 * MiB, FORWARD_STACK)
    sim.oom(100 * MiB, FORWARD_STACK)
    return sim


SGD_WITHOUT_MOMENTUM = {"class": "torch.optim.sgd.SGD", "moments": 0, "options": {"momentum": 0.0}}


def test_a_first_forward_of_sgd_without_momentum_projects_no_optimizer_state():
    # capture recorded the optimizer's kind: plain SGD keeps no state, so the model states at full
    # size are the parameters and the adapter's gradients, which fit: the pass is too large alone
    sim = _adapter_first_forward_oom()
    result = analyse(sim.snapshot(extra={"optimizers": 1, "optimizer_kinds": [SGD_WITHOUT_MOMENTUM]}))
    assert (result.target_phase, result.target_step) == ("forward", 0)
    states = _evidence(result, EvidenceKind.MODEL_STATES_AT_FULL_SIZE)
    assert states.bytes == (600 + 150 + 150) * MiB  # parameters + the adapter's gradients, no state
    words = evidence(states)
    assert "no optimizer state: its optimizer keeps none, recorded at capture" in words
    assert "Adam" not in words
    assert result.verdict == "activation-spike", result.verdict
    assert result.summary.kind == SummaryKind.ACTIVATIONS_FIRST_PASS


def test_a_first_forward_projects_the_moments_capture_recorded():
    # AdamW with amsgrad keeps three moments a parameter: more than the two Adam-style assumes
    amsgrad = {"class": "torch.optim.adamw.AdamW", "moments": 3, "options": {"amsgrad": True}}
    sim = _first_forward_oom(trains={"base.weight": False, "adapter.weight": True})
    result = analyse(sim.snapshot(extra={"optimizers": 1, "optimizer_kinds": [amsgrad]}))
    states = _evidence(result, EvidenceKind.MODEL_STATES_AT_FULL_SIZE)
    assert states.bytes == (BASE_MIB + ADAPTER_MIB + 4 * ADAPTER_MIB) * MiB  # + gradients + three moments
    assert "the state at 3x the parameters that train, as many moments per parameter as its optimizer keeps" in (
        evidence(states)
    )


def test_optimizer_kinds_that_do_not_say_one_count_leave_the_assumption():
    # without kinds (an older dump), with a kind capture did not know, with one optimizer of two
    # recorded, or with two that differ, the state is projected as before: Adam-style, assumed
    unknown = {"class": "bitsandbytes.optim.adam.Adam8bit", "moments": None, "options": {}}
    momentum = {**SGD_WITHOUT_MOMENTUM, "moments": 1, "options": {"momentum": 0.9}}
    for extra in (
        {"optimizers": 1},
        {"optimizers": 1, "optimizer_kinds": [unknown]},
        {"optimizers": 2, "optimizer_kinds": [SGD_WITHOUT_MOMENTUM]},
        {"optimizers": 2, "optimizer_kinds": [SGD_WITHOUT_MOMENTUM, momentum]},
    ):
        result = analyse(_adapter_first_forward_oom().snapshot(extra=extra))
        assert result.verdict == "unknown", extra
        assert not [e for e in result.evidence if e.kind == EvidenceKind.MODEL_STATES_AT_FULL_SIZE]
    sim = _first_forward_oom(trains={"base.weight": False, "adapter.weight": True})
    result = analyse(sim.snapshot(extra={"optimizers": 2, "optimizer_kinds": [SGD_WITHOUT_MOMENTUM]}))
    states = _evidence(result, EvidenceKind.MODEL_STATES_AT_FULL_SIZE)
    assert states.bytes == (BASE_MIB + ADAPTER_MIB + 3 * ADAPTER_MIB) * MiB
    assert "assuming Adam-style moments" in evidence(states)


def test_a_strangers_optimizer_kind_is_data_never_words_of_the_report():
    # the class name a file gives is never printed (only the count decides), and a count is bounded
    from oomdoctor.pipeline import render_report

    hostile = {"class": "<script>x</script>\x1b[31m**SGD**", "moments": 0, "options": {"momentum": 0.0}}
    snapshot = _adapter_first_forward_oom().snapshot(extra={"optimizers": 1, "optimizer_kinds": [hostile]})
    for output_format in ("text", "md", "json"):
        words = render_report(snapshot, output_format).decode()
        assert "script" not in words and "\x1b" not in words and "**SGD**" not in words
        assert "its optimizer keeps none, recorded at capture" in words
    beyond = {"class": "X", "moments": 1_000_000}
    result = analyse(_adapter_first_forward_oom().snapshot(extra={"optimizers": 1, "optimizer_kinds": [beyond]}))
    assert result.verdict == "unknown"  # the count was dropped: the state is projected as before


def test_a_first_forward_whose_recorded_optimizer_s_state_cannot_fit_is_model_states_too_large():
    # 300 MiB of parameters that all train (the registry says so) and an AdamW capture recorded (two
    # moments a parameter): gradients and state to come bring the model states to 1.17 GiB, more
    # than the 1 GiB device, before the first step has made any of the state
    adamw = {"class": "torch.optim.adamw.AdamW", "moments": 2, "options": {"amsgrad": False}}
    sim = Sim(total_bytes=GiB)
    sim.alloc(300 * MiB, SETUP_STACK, "parameter", "weight")
    for entry in sim.tensors:
        entry["requires_grad"] = True
    sim.marker("forward", "start")
    for _ in range(4):
        sim.alloc(150 * MiB, FORWARD_STACK)
    sim.oom(150 * MiB, FORWARD_STACK)
    result = analyse(sim.snapshot(extra={"optimizers": 1, "optimizer_kinds": [adamw]}))
    assert (result.target_phase, result.target_step) == ("forward", 0)
    assert result.verdict == "model-states-too-large", result.verdict
    needed = _evidence(result, EvidenceKind.MODEL_STATES_NEEDED)
    assert needed.bytes == 4 * 300 * MiB  # parameters, gradients and two moments
    assert "recorded at capture" in evidence(needed)
    # without the record the state stays unprojected before the first step (nothing says which optimizer)
    plain = analyse(sim.snapshot(extra={"optimizers": 1}))
    assert plain.verdict != "model-states-too-large"
