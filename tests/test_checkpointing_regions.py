"""Activation checkpointing's saving, measured from the regions the stacks show: the blocks a
model's forward calls from one line (each call a region). Checkpointed, each region keeps its input
(the previous region's output) and the backward recomputes the largest; a graph an earlier pass
kept shrinks to its regions' inputs. Where the stacks show no such regions, the saving is a rule of
thumb and the report says so."""

from __future__ import annotations

import json
import re

from oomdoctor.analysis import analyse
from oomdoctor.analysis.recommendations import CHECKPOINTING_SAVES
from oomdoctor.analysis.results import Recommendation
from oomdoctor.model import Frame
from oomdoctor.pipeline import render_report
from oomdoctor.views import phrasing
from oomdoctor.views.json_report import _recommendation
from oomdoctor.views.markdown_report import code_span
from tests.builders import BACKWARD_STACK, FORWARD_STACK, SETUP_STACK, MiB, Sim

_MODULE = "/usr/lib/python3/site-packages/torch/nn/modules/module.py"
_LINEAR = Frame("/usr/lib/python3/site-packages/torch/nn/functional.py", 100, "linear")


def _in_block(line: int, model: str = "model.py") -> tuple[Frame, ...]:
    """An op in a block's forward (`Block.forward` at `line`), the block called by the model's
    forward in a loop (`x = block(x)`, line 30), the model by the training step."""
    return (
        _LINEAR,
        Frame(model, line, "forward"),
        Frame(_MODULE, 1751, "_wrapped_call_impl"),
        Frame(model, 30, "forward"),
        Frame(_MODULE, 1751, "_wrapped_call_impl"),
        Frame("train.py", 40, "train_step"),
    )


HEAD = (
    _LINEAR,
    Frame("model.py", 32, "forward"),
    Frame(_MODULE, 1751, "_wrapped_call_impl"),
    Frame("train.py", 40, "train_step"),
)

BLOCKS = 3
# each block: attention's 8 MiB (line 10), the MLP's 4 MiB (line 11), its 2 MiB output (line 12)
BLOCK_PARTS = ((10, 8), (11, 4), (12, 2))
BLOCK_MIB = sum(mib for _, mib in BLOCK_PARTS)
HEAD_MIB = 6  # the logits, made after the blocks
# the trained parameter's gradient, which an OOM at the backward's start has yet to make: the backward
# holds it beside a region's recomputation, and nothing replays a whole pass to say when it comes,
# so it is counted beside the largest (a bound: the saving is at least what is said)
GRADIENT_MIB = 8


def _forward(sim: Sim) -> None:
    sim.marker("forward", "start")
    for _ in range(BLOCKS):
        for line, mib in BLOCK_PARTS:
            sim.alloc(mib * MiB, _in_block(line))
    sim.alloc(HEAD_MIB * MiB, HEAD)
    sim.marker("forward", "end")


def _checkpointing(sim: Sim) -> Recommendation:
    analysis = analyse(sim.snapshot())
    assert analysis.target_phase == "backward"
    return next(r for r in analysis.recommendations if r.id == "activation-checkpointing")


def _pass_saving() -> int:
    """What checkpointing saves of one pass: the blocks' activations, less the inputs of the second
    and third (the first and second blocks' outputs), less the largest block, recomputed once the
    backward has freed the head's logits, beside the gradient the backward makes by then."""
    return (BLOCKS * BLOCK_MIB - (BLOCKS - 1) * 2 - (BLOCK_MIB + GRADIENT_MIB - HEAD_MIB)) * MiB


def test_checkpointing_saves_what_the_regions_hold_less_their_inputs_and_the_largest():
    """An OOM at the start of the backward. The rule of thumb said 70% of the 48 MiB of activations
    (33.6 MiB); the regions the stacks show say 42 - 4 - (14 + 8 - 6) = 22 MiB: the largest block
    recomputed, once the head's logits are freed, beside the parameter's 8 MiB gradient (it was 30
    MiB, without it)."""
    sim = Sim(total_bytes=256 * MiB)
    sim.alloc(8 * MiB, SETUP_STACK, "parameter", "w")
    _forward(sim)
    sim.marker("backward", "start")
    sim.oom(64 * MiB, BACKWARD_STACK)
    rec = _checkpointing(sim)
    assert rec.estimated_saved_bytes == _pass_saving() == 22 * MiB
    assert rec.estimated_saved_bytes != int((BLOCKS * BLOCK_MIB + HEAD_MIB) * MiB * CHECKPOINTING_SAVES)
    assert not rec.rule_of_thumb
    assert "rule of thumb" not in phrasing.saving(rec)


def test_a_graph_an_earlier_pass_kept_shrinks_to_its_regions_inputs():
    """A loop that keeps every step's graph (`retain_graph=True` and a list of losses): the first
    step's activations stay alive into the second's backward. Checkpointed, that kept graph holds
    only its regions' inputs (rehearsed on creeping-leak-gpt-adamw: 264 MiB saved, where the
    pass's own activations alone gave 63.1)."""
    sim = Sim(total_bytes=512 * MiB)
    sim.alloc(8 * MiB, SETUP_STACK, "parameter", "w")
    _forward(sim)
    sim.marker("backward", "start")
    grad = sim.alloc(8 * MiB, BACKWARD_STACK, "gradient", "w.grad")
    sim.marker("backward", "end")
    sim.marker("optimizer_step", "start")
    sim.marker("optimizer_step", "end")
    sim.marker("zero_grad", "start")
    sim.free(grad)
    sim.marker("zero_grad", "end")
    _forward(sim)
    sim.marker("backward", "start")
    sim.oom(256 * MiB, BACKWARD_STACK)
    rec = _checkpointing(sim)
    kept = (BLOCKS * BLOCK_MIB - (BLOCKS - 1) * 2) * MiB  # the first step's blocks, less its regions' inputs
    assert rec.estimated_saved_bytes == _pass_saving() + kept


def test_a_fit_is_claimed_from_the_regions_and_not_enough_is_not():
    """The regions' saving against what the run lacked: a shortfall it covers is a fit; one it does
    not is left unclaimed (rehearsed, its one 'not enough' on the fixtures fitted). A 1 MiB
    parameter, its gradient to come beside the largest block's recomputation: 42 - 4 - (14 + 1 - 6)
    = 29 MiB saved."""
    claims = {}
    # 4 and 64 MiB short of the 32 MiB free (the first fit leaves 25 MiB, room for a new segment of
    # each pool, 22 MiB: a fit by allocated bytes with less is not claimed)
    for request_mib in (36, 96):
        sim = Sim(total_bytes=81 * MiB)
        sim.alloc(MiB, SETUP_STACK, "parameter", "w")
        _forward(sim)
        sim.marker("backward", "start")
        sim.oom(request_mib * MiB, BACKWARD_STACK)
        rec = _checkpointing(sim)
        assert rec.estimated_saved_bytes == 29 * MiB
        claims[request_mib] = rec.would_fit_alone
    assert claims == {36: True, 96: None}


def test_without_regions_the_saving_is_said_to_be_a_rule_of_thumb():
    """Activations made in the model's own forward, no block called from a line more than once:
    the file cannot bound a region, so the saving is the rule of thumb, and the report says so."""
    sim = Sim(total_bytes=256 * MiB)
    sim.alloc(8 * MiB, SETUP_STACK, "parameter", "w")
    sim.marker("forward", "start")
    for _ in range(6):
        sim.alloc(8 * MiB, FORWARD_STACK)
    sim.marker("forward", "end")
    sim.marker("backward", "start")
    sim.oom(64 * MiB, BACKWARD_STACK)
    rec = _checkpointing(sim)
    assert rec.estimated_saved_bytes == int(48 * MiB * CHECKPOINTING_SAVES)
    assert rec.rule_of_thumb and rec.would_fit_alone is None
    assert phrasing.saving(rec).endswith("(rule of thumb, not measured from the file)")
    assert phrasing.saving_cell(rec).endswith("(rule of thumb, not measured from the file)")
    assert _recommendation(rec)["estimated_saved_is_rule_of_thumb"] is True


def _call(line: int, caller_line: int, *inner: Frame) -> tuple[Frame, ...]:
    """An op in a module's forward (model.py at `line`) that the model's forward called from its
    line `caller_line`, through `inner` frames first (innermost first)."""
    return (
        *inner,
        _LINEAR,
        Frame("model.py", line, "forward"),
        Frame(_MODULE, 1751, "_wrapped_call_impl"),
        Frame("model.py", caller_line, "forward"),
        Frame(_MODULE, 1751, "_wrapped_call_impl"),
        Frame("train.py", 40, "train_step"),
    )


def _saving_of(forward) -> int:
    sim = Sim(total_bytes=512 * MiB)
    sim.alloc(8 * MiB, SETUP_STACK, "parameter", "w")
    sim.marker("forward", "start")
    forward(sim)
    sim.marker("forward", "end")
    sim.marker("backward", "start")
    sim.oom(256 * MiB, BACKWARD_STACK)
    return _checkpointing(sim).estimated_saved_bytes


def test_two_loops_of_blocks_are_both_regions():
    """A U-shaped model: down blocks called from line 30, up blocks from line 31 (4 MiB, then a
    1 MiB output each). Both loops are regions: 20 MiB held, less the second block's input in each
    loop (2 MiB), less the largest block (5 MiB) and the gradient recomputed beside it (8 MiB)."""

    def forward(sim: Sim) -> None:
        for caller in (30, 31):
            for _ in range(2):
                sim.alloc(4 * MiB, _call(10, caller))
                sim.alloc(MiB, _call(11, caller))

    # the figure of the down loop alone would be 10 - 1 - 5 = 4 MiB
    assert _saving_of(forward) == (20 - 2 - 5 - GRADIENT_MIB) * MiB


def test_a_loop_inside_a_block_is_part_of_its_region():
    """Each of three blocks calls two experts in a loop (their forward at expert.py:5, called from
    the block's line 10), then makes its 2 MiB output at line 11: the regions are the blocks, not
    the experts: 3 x 8 MiB held, less two 2 MiB inputs and the largest block's 8 MiB, with the
    gradient beside it."""
    expert = Frame("expert.py", 5, "forward")

    def forward(sim: Sim) -> None:
        for _ in range(3):
            for _ in range(2):
                sim.alloc(3 * MiB, _call(10, 30, expert, Frame(_MODULE, 1751, "_wrapped_call_impl")))
            sim.alloc(2 * MiB, _call(11, 30))

    assert _saving_of(forward) == (24 - 4 - 8 - GRADIENT_MIB) * MiB


def test_the_model_s_own_calls_are_no_regions():
    """Two forwards of the model in one step (micro-batches whose graphs are both alive): the
    model's own call is no region, and nothing inside it is called twice in a pass, so the saving
    is the rule of thumb."""
    sim = Sim(total_bytes=512 * MiB)
    sim.alloc(8 * MiB, SETUP_STACK, "parameter", "w")
    for _ in range(2):
        sim.marker("forward", "start")
        sim.alloc(8 * MiB, FORWARD_STACK)
        sim.alloc(8 * MiB, (_LINEAR, *FORWARD_STACK[1:]))
        sim.marker("forward", "end")
    sim.marker("backward", "start")
    sim.oom(256 * MiB, BACKWARD_STACK)
    assert _checkpointing(sim).rule_of_thumb


def test_a_block_whose_forward_a_hook_wraps_is_still_a_region():
    """accelerate's hooks replace a module's forward with `new_forward`, which calls the module's
    own: each block's forward is then reached through the same wrapper line. The regions are read
    from the forward it calls (line 10, 11 of each block), as without the wrapper: 22 MiB."""
    wrapper = Frame("/usr/lib/python3/site-packages/accelerate/hooks.py", 170, "new_forward")

    def forward(sim: Sim) -> None:
        for _ in range(BLOCKS):
            for line, mib in BLOCK_PARTS:
                stack = _in_block(line)
                sim.alloc(mib * MiB, (*stack[:2], wrapper, *stack[2:]))
        sim.alloc(HEAD_MIB * MiB, HEAD)

    assert _saving_of(forward) == _pass_saving() == 22 * MiB


def _extrapolated_step(sim: Sim, scale: int, *, oom_at: int | None = None) -> None:
    """A training step of four blocks (4, 2 and 1 MiB each, times `scale`) and a head; `oom_at`:
    the forward runs out at this allocation."""
    sim.marker("forward", "start")
    kept = []
    for count, (line, mib) in enumerate(part for _ in range(4) for part in ((10, 4), (11, 2), (12, 1))):
        if count == oom_at:
            sim.oom(mib * scale * MiB)
            return
        kept.append(sim.alloc(mib * scale * MiB, _in_block(line)))
    kept.append(sim.alloc(2 * scale * MiB, HEAD))
    sim.marker("forward", "end")
    sim.marker("backward", "start")
    for address in reversed(kept):
        sim.free(address)
    grad = sim.alloc(8 * MiB, BACKWARD_STACK, "gradient", "w.grad")
    sim.marker("backward", "end")
    sim.marker("optimizer_step", "start")
    sim.marker("optimizer_step", "end")
    sim.marker("zero_grad", "start")
    sim.free(grad)
    sim.marker("zero_grad", "end")


def test_an_interrupted_pass_s_scaled_figure_claims_no_fit():
    """An OOM in the third block of a forward four times the size of the earlier steps': the rest
    of the pass is extrapolated and the regions' saving scaled with it, which rehearsed up to 13%
    high (a GPT of 6 blocks: 296.3 MiB said, 261.3 saved). It covers what the rest needs, but no
    fit is claimed from a scaled figure (it was: 'would fit on its own')."""
    sim = Sim(total_bytes=70 * MiB)
    sim.alloc(8 * MiB, SETUP_STACK, "parameter", "w")
    _extrapolated_step(sim, 1)
    _extrapolated_step(sim, 1)
    _extrapolated_step(sim, 4, oom_at=7)
    analysis = analyse(sim.snapshot())
    rest = analysis.what_if.rest_of_pass
    assert analysis.target_phase == "forward" and rest is not None and rest.extrapolated
    rec = next(r for r in analysis.recommendations if r.id == "activation-checkpointing")
    assert not rec.rule_of_thumb and rec.would_fit_alone is None


def _regions_snapshot(model: str):
    sim = Sim(total_bytes=256 * MiB)
    sim.alloc(8 * MiB, SETUP_STACK, "parameter", "w")
    sim.marker("forward", "start")
    for _ in range(BLOCKS):
        for line, mib in BLOCK_PARTS:
            sim.alloc(mib * MiB, _in_block(line, model))
    sim.alloc(HEAD_MIB * MiB, HEAD)
    sim.marker("forward", "end")
    sim.marker("backward", "start")
    sim.oom(64 * MiB, BACKWARD_STACK)
    return sim.snapshot()


def test_the_reports_name_the_blocks_the_saving_was_measured_from():
    """The figure assumes each call of the layer loop checkpointed: the reports say which line
    calls the blocks and how many of them the pass made, and that the gradient the backward has yet
    to make was counted beside the largest one's recomputation (a lower bound)."""
    snapshot = _regions_snapshot("model.py")
    said = "measured from the file: checkpointing each of the 3 blocks called at"
    beside = "; the largest recomputed beside the 8.00 MiB of gradients the backward has yet to make"
    text = render_report(snapshot, "text").decode()
    assert f"{said} model.py:30 in forward{beside}" in text
    md = render_report(snapshot, "md").decode()
    assert f"({said} `model.py:30 in forward`{beside} (at most that many, so at least this))" in md
    rec = next(
        r
        for r in json.loads(render_report(snapshot, "json"))["recommendations"]
        if r["id"] == "activation-checkpointing"
    )
    assert rec["regions"] == {"count": 3, "called_from": ["model.py:30 in forward"], "gradients_beside_bytes": 8 * MiB}
    assert rec["estimated_saved_is_lower_bound"] is True


def test_a_region_s_line_from_the_file_is_escaped_in_each_report():
    """The caller's file name is the file's text: in Markdown a code span (its pipe escaped, so the
    table keeps its columns; its escape character shown, not sent), in the text report printable."""
    model = "m`|<b>*x*\x1b[31m.py"
    snapshot = _regions_snapshot(model)
    md = render_report(snapshot, "md").decode()
    row = next(line for line in md.splitlines() if "measured from the file" in line)
    assert code_span(f"{model}:30 in forward", cell=True) in row  # a code span renders nothing inside it
    assert "\x1b" not in row and len(re.findall(r"(?<!\\)\|", row)) == 5  # the pipe inside escaped: four columns
    text = render_report(snapshot, "text").decode()
    line = next(line for line in text.splitlines() if "measured from the file" in line)
    assert "\x1b" not in line and "\\x1b[31m" in line


_CONTAINER = Frame("/usr/lib/python3/site-packages/torch/nn/modules/container.py", 250, "forward")
_GELU = Frame("/usr/lib/python3/site-packages/torch/nn/functional.py", 200, "gelu")


def _in_sequential(module: str, line: int, op: Frame) -> tuple[Frame, ...]:
    """An op in a torch module's forward (torch/nn/modules/`module` at `line`) that a Sequential's
    forward calls from its loop, the Sequential called by the model's forward (model.py line 31)."""
    return (
        op,
        Frame(f"/usr/lib/python3/site-packages/torch/nn/modules/{module}", line, "forward"),
        Frame(_MODULE, 1751, "_wrapped_call_impl"),
        _CONTAINER,
        Frame(_MODULE, 1751, "_wrapped_call_impl"),
        Frame("model.py", 31, "forward"),
        Frame(_MODULE, 1751, "_wrapped_call_impl"),
        Frame("train.py", 40, "train_step"),
    )


LINEAR_CALL = _in_sequential("linear.py", 125, _LINEAR)
GELU_CALL = _in_sequential("activation.py", 700, _GELU)


def _mlp_forward(sim: Sim, layers: int, mib: int, head_mib: int) -> None:
    """An MLP's forward: a Sequential of `layers` Linear and GELU pairs, each keeping its `mib` MiB
    output, then the head's `head_mib` MiB logits made in the model's own forward."""
    sim.marker("forward", "start")
    for _ in range(layers):
        sim.alloc(mib * MiB, LINEAR_CALL)
        sim.alloc(mib * MiB, GELU_CALL)
    sim.alloc(head_mib * MiB, HEAD)
    sim.marker("forward", "end")


def _sequential_snapshot():
    sim = Sim(total_bytes=256 * MiB)
    sim.alloc(8 * MiB, SETUP_STACK, "parameter", "w")
    _mlp_forward(sim, 3, 8, 2)
    sim.marker("backward", "start")
    sim.oom(64 * MiB, BACKWARD_STACK)
    return sim.snapshot()


def test_a_sequential_of_torch_modules_is_cut_into_segments():
    """A Sequential of three Linear+GELU pairs (8 MiB each of the six calls keeps) and a 2 MiB head,
    OOM at the backward's start. checkpoint_sequential in 2 segments keeps the second's input (8 MiB)
    and recomputes the first (24 MiB) beside the parameter's 8 MiB gradient, once the 2 MiB head is
    freed: 48 - 8 - 30 = 10 MiB (16 without the gradient; 3 segments: 48 - 16 - 22; the whole: its
    recomputation outweighs). It was the rule of thumb, 70% of 50 MiB (35 MiB), said to be one."""
    analysis = analyse(_sequential_snapshot())
    rec = next(r for r in analysis.recommendations if r.id == "activation-checkpointing")
    assert rec.estimated_saved_bytes == 10 * MiB
    assert rec.estimated_saved_bytes != int(50 * MiB * CHECKPOINTING_SAVES)
    assert not rec.rule_of_thumb and rec.regions.sequential and rec.regions.count == 2
    assert rec.regions.called_from == (Frame("model.py", 31, "forward"),)
    assert rec.would_fit_alone is None  # rehearsed up to 29% high on an interrupted CNN: no fit claimed


def test_a_graph_an_earlier_pass_kept_shrinks_to_its_sequential_s_output():
    """One hidden layer (a 10 MiB Linear output, a 10 MiB GELU output), each step's graph kept
    (`retain_graph=True`): the Sequential checkpointed whole keeps only its output of the first
    step's graph, 10 MiB saved; the judged pass's own recomputation outweighs what it saves, so it
    adds nothing. Rehearsed on creeping-leak-mlp-sgd: 30.0 MiB said and saved, where the rule of
    thumb said 14.1 (70% of the pass's own 21 MiB here: 14.7)."""
    sim = Sim(total_bytes=512 * MiB)
    sim.alloc(8 * MiB, SETUP_STACK, "parameter", "w")
    _mlp_forward(sim, 1, 10, 1)
    sim.marker("backward", "start")
    grad = sim.alloc(8 * MiB, BACKWARD_STACK, "gradient", "w.grad")
    sim.marker("backward", "end")
    sim.marker("optimizer_step", "start")
    sim.marker("optimizer_step", "end")
    sim.marker("zero_grad", "start")
    sim.free(grad)
    sim.marker("zero_grad", "end")
    _mlp_forward(sim, 1, 10, 1)
    sim.marker("backward", "start")
    sim.oom(256 * MiB, BACKWARD_STACK)
    rec = _checkpointing(sim)
    assert rec.estimated_saved_bytes == 10 * MiB
    assert not rec.rule_of_thumb and rec.regions.sequential and rec.regions.count == 1


def test_the_reports_name_the_segments_of_the_sequential():
    """The figure assumes the Sequential's modules cut as checkpoint_sequential cuts them: the
    reports say so, in how many segments, and which line calls the Sequential."""
    snapshot = _sequential_snapshot()
    said = "checkpointing in 2 segments the torch modules the Sequential calls (checkpoint_sequential's cuts"
    text = render_report(snapshot, "text").decode()
    assert said in text and "whole), called at model.py:31 in forward" in text
    assert "each of the" not in text
    rec = next(
        r
        for r in json.loads(render_report(snapshot, "json"))["recommendations"]
        if r["id"] == "activation-checkpointing"
    )
    assert rec["regions"] == {
        "count": 2,
        "called_from": ["model.py:31 in forward"],
        "sequential": True,
        "gradients_beside_bytes": 8 * MiB,
    }


def test_a_sequential_inside_a_block_of_the_model_s_is_no_segments():
    """A one-block transformer: the block (the user's module, called once) calls its MLP, a
    Sequential of torch's modules. A user checkpoints the block, which one call does not bound, not
    its MLP alone: the saving stays the rule of thumb (it was none at all: the MLP's cuts save
    nothing, and the advice was dropped)."""
    block = (Frame("model.py", 12, "forward"), Frame(_MODULE, 1751, "_wrapped_call_impl"))

    def in_block(call: tuple[Frame, ...]) -> tuple[Frame, ...]:
        return (*call[:5], *block, *call[5:])

    sim = Sim(total_bytes=256 * MiB)
    sim.alloc(8 * MiB, SETUP_STACK, "parameter", "w")
    sim.marker("forward", "start")
    sim.alloc(6 * MiB, _in_block(10))  # the block's attention
    sim.alloc(MiB, in_block(LINEAR_CALL))
    sim.alloc(MiB, in_block(GELU_CALL))
    sim.alloc(HEAD_MIB * MiB, HEAD)
    sim.marker("forward", "end")
    sim.marker("backward", "start")
    sim.oom(64 * MiB, BACKWARD_STACK)
    rec = _checkpointing(sim)
    assert rec.rule_of_thumb and rec.regions is None
    assert rec.estimated_saved_bytes == int(14 * MiB * CHECKPOINTING_SAVES)


CONV_CALL = _in_sequential(
    "conv.py", 565, Frame("/usr/lib/python3/site-packages/torch/nn/modules/conv.py", 560, "_conv_forward")
)
NORM_CALL = _in_sequential(
    "batchnorm.py", 210, Frame("/usr/lib/python3/site-packages/torch/nn/functional.py", 2898, "batch_norm")
)
RELU_CALL = _in_sequential(
    "activation.py", 143, Frame("/usr/lib/python3/site-packages/torch/nn/functional.py", 1771, "relu")
)


def test_a_cut_after_a_module_whose_output_the_pass_freed_keeps_it():
    """Two Conv-BatchNorm-ReLU stages (8 MiB outputs; a BatchNorm keeps 1 MiB of statistics live,
    its output is freed once the ReLU, which saves its own output, has run). Cut in 3 segments
    (conv+norm, relu+conv, norm+relu), the second segment's input is the first norm's output,
    which checkpointing keeps though the run freed it: 34 - 16 - 14 = 4 MiB; in 2 (at the stages)
    34 - 8 - 17 = 9 MiB, the most, less the 8 MiB gradient the backward holds beside the first
    stage's recomputation (2 MiB head freed): 34 - 8 - 23 = 3 MiB. Read from the live blocks alone the norm's output was its 1 MiB
    of statistics, and 3 segments saved 11 MiB (rehearsed on activation-spike-cnn-bigger-batch at its
    forward's end, the freed outputs counted: 56.0 MiB said, 57.7 saved)."""
    sim = Sim(total_bytes=256 * MiB)
    sim.alloc(8 * MiB, SETUP_STACK, "parameter", "w")
    sim.marker("forward", "start")
    for _ in range(2):
        sim.alloc(8 * MiB, CONV_CALL)
        normed = sim.alloc(8 * MiB, NORM_CALL)
        sim.alloc(MiB, NORM_CALL)
        sim.alloc(8 * MiB, RELU_CALL)
        sim.free(normed)
    sim.alloc(2 * MiB, HEAD)
    sim.marker("forward", "end")
    sim.marker("backward", "start")
    sim.oom(128 * MiB, BACKWARD_STACK)
    rec = _checkpointing(sim)
    assert rec.estimated_saved_bytes == 3 * MiB
    assert rec.regions.count == 2 and rec.regions.sequential


def _in_loop(module: str, line: int, op: Frame) -> tuple[Frame, ...]:
    """An op in a torch module's forward that the model's own loop calls (`for layer in
    self.layers: x = layer(x)`, model.py line 31)."""
    stack = _in_sequential(module, line, op)
    return (*stack[:3], *stack[5:])


def test_a_loop_of_the_user_s_own_over_torch_modules_is_cut_as_a_sequential():
    """The MLP of the Sequential test, its Linear and GELU modules in a ModuleList the model's
    forward loops over at line 31: the same 10 MiB in 2 segments, at the loop's line (it was the
    rule of thumb, 35 MiB)."""
    sim = Sim(total_bytes=256 * MiB)
    sim.alloc(8 * MiB, SETUP_STACK, "parameter", "w")
    sim.marker("forward", "start")
    for _ in range(3):
        sim.alloc(8 * MiB, _in_loop("linear.py", 125, _LINEAR))
        sim.alloc(8 * MiB, _in_loop("activation.py", 700, _GELU))
    sim.alloc(2 * MiB, HEAD)
    sim.marker("forward", "end")
    sim.marker("backward", "start")
    sim.oom(64 * MiB, BACKWARD_STACK)
    rec = _checkpointing(sim)
    assert rec.estimated_saved_bytes == 10 * MiB and rec.regions.count == 2 and rec.regions.sequential
    assert rec.regions.called_from == (Frame("model.py", 31, "forward"),) and rec.regions.of_loops == 1
    assert phrasing.regions_note(rec).endswith(
        "the torch modules the loop calls (checkpoint_sequential's cuts, "
        "the last segment unchecked; one segment: checkpoint of the whole), at"
    )


def test_a_line_that_makes_its_own_blocks_between_module_calls_is_no_loop_of_modules():
    """`x = F.dropout(act(layer(x)))` over Linear and GELU modules: the line itself makes the
    dropout's outputs, which no module call holds, so the calls do not bound what the loop keeps:
    the rule of thumb stays (it was 2 segments of the modules' calls alone)."""
    sim = Sim(total_bytes=256 * MiB)
    sim.alloc(8 * MiB, SETUP_STACK, "parameter", "w")
    sim.marker("forward", "start")
    dropout = Frame("/usr/lib/python3/site-packages/torch/nn/functional.py", 1400, "dropout")
    at_the_line = (dropout, *_in_loop("linear.py", 125, _LINEAR)[3:])
    for _ in range(3):
        sim.alloc(8 * MiB, _in_loop("linear.py", 125, _LINEAR))
        sim.alloc(8 * MiB, _in_loop("activation.py", 700, _GELU))
        sim.alloc(8 * MiB, at_the_line)
    sim.alloc(2 * MiB, HEAD)
    sim.marker("forward", "end")
    sim.marker("backward", "start")
    sim.oom(64 * MiB, BACKWARD_STACK)
    rec = _checkpointing(sim)
    assert rec.rule_of_thumb and rec.regions is None


def test_a_line_that_calls_each_module_once_is_no_loop():
    """`logits = self.head(self.act(x))` in the model's forward: two torch modules called from one
    line, neither again, is no loop over modules: the rule of thumb stays."""
    sim = Sim(total_bytes=256 * MiB)
    sim.alloc(8 * MiB, SETUP_STACK, "parameter", "w")
    sim.marker("forward", "start")
    sim.alloc(8 * MiB, FORWARD_STACK)
    sim.alloc(8 * MiB, _in_loop("activation.py", 700, _GELU))
    sim.alloc(8 * MiB, _in_loop("linear.py", 125, _LINEAR))
    sim.marker("forward", "end")
    sim.marker("backward", "start")
    sim.oom(64 * MiB, BACKWARD_STACK)
    rec = _checkpointing(sim)
    assert rec.rule_of_thumb and rec.regions is None


def _mlp_step(sim: Sim, mib: int, *, oom_after: int | None = None) -> None:
    """A step of an MLP whose Sequential makes eight calls, four Linear and GELU pairs, each keeping
    its `mib` MiB output, then a head of half that; the backward frees them last first and makes a
    1 MiB gradient. `oom_after`: the forward runs out after that many calls."""
    sim.marker("forward", "start")
    made = []
    for call in range(8 if oom_after is None else oom_after):
        made.append(sim.alloc(mib * MiB, LINEAR_CALL if call % 2 == 0 else GELU_CALL))
    if oom_after is not None:
        sim.oom(mib * MiB, GELU_CALL if oom_after % 2 else LINEAR_CALL)
        return
    made.append(sim.alloc(mib // 2 * MiB, HEAD))
    sim.marker("forward", "end")
    sim.marker("backward", "start")
    for address in reversed(made):
        sim.free(address)
    grad = sim.alloc(MiB, BACKWARD_STACK, "gradient", "w.grad")
    sim.marker("backward", "end")
    sim.marker("optimizer_step", "start")
    sim.marker("optimizer_step", "end")
    sim.marker("zero_grad", "start")
    sim.free(grad)
    sim.marker("zero_grad", "end")


def test_an_interrupted_sequential_is_cut_as_its_completed_pass_is():
    """Step 0 runs a Sequential of eight 2 MiB calls; step 1, at twice the batch, runs out after five
    of them. checkpoint_sequential cuts the whole Sequential, not the calls seen: replayed on step 0's
    pass at step 1's sizes (eight 4 MiB calls, a 2 MiB head; 34 MiB at the forward's end), 2 segments
    keep the first's output (4 MiB) and run the second unchecked (16 MiB) beside the head: 22 MiB, and
    the backward recomputes the first's three other calls (12 MiB) once the rest is freed: 34 - 22 =
    12 MiB. The cut of the five calls seen, scaled to the pass, said 6.8 MiB (the CNN fixture: 32.7
    MiB said, 29.8 saved by the cut it advised, 57.7 by the whole pass's, now said)."""
    sim = Sim(total_bytes=16 * MiB)
    sim.alloc(MiB, SETUP_STACK, "parameter", "w")
    _mlp_step(sim, 2)
    _mlp_step(sim, 4, oom_after=5)
    analysis = analyse(sim.snapshot())
    assert analysis.target_phase == "forward" and analysis.what_if.rest_of_pass.extrapolated
    rec = next(r for r in analysis.recommendations if r.id == "activation-checkpointing")
    assert rec.estimated_saved_bytes == 12 * MiB
    assert rec.regions.count == 2 and rec.regions.sequential and rec.regions.replayed_step == 0
    assert not rec.saved_at_least and rec.would_fit_alone is None  # extrapolated: no fit claimed
    assert "replayed on step 0's completed pass of this forward" in phrasing.regions_line(rec)


def _blocks_step(sim: Sim, *, oom: bool = False) -> None:
    """`_forward`'s three blocks and head; the backward frees the head, makes the parameter's 8 MiB
    gradient, then frees each block last first (its output first). `oom`: it runs out at its start."""
    sim.marker("forward", "start")
    made = [sim.alloc(mib * MiB, _in_block(line)) for _ in range(BLOCKS) for line, mib in BLOCK_PARTS]
    head = sim.alloc(HEAD_MIB * MiB, HEAD)
    sim.marker("forward", "end")
    sim.marker("backward", "start")
    if oom:
        sim.oom(8 * MiB, BACKWARD_STACK)
        return
    sim.free(head)
    grad = sim.alloc(8 * MiB, BACKWARD_STACK, "gradient", "w.grad")
    for block in range(BLOCKS - 1, -1, -1):
        for address in reversed(made[block * 3 : block * 3 + 3]):
            sim.free(address)
    sim.marker("backward", "end")
    sim.marker("optimizer_step", "start")
    sim.marker("optimizer_step", "end")
    sim.marker("zero_grad", "start")
    sim.free(grad)
    sim.marker("zero_grad", "end")


def test_a_backward_s_recomputation_is_counted_beside_the_gradients_it_made():
    """An OOM at step 1's backward start; step 0, of the same sizes, shows its backward: the head
    freed, the 8 MiB gradient made, then each block. Replayed checkpointed, the third block is made
    again (12 MiB beside its kept output) while the gradient is alive: 2 + 2 + 8 + 12 = 24 MiB at the
    most, against 50 (42 of blocks, 8 of gradient after the head's 6 are freed): 26 MiB saved. The
    largest block beside what came after the regions alone said 42 - 4 - (14 - 6) = 30; with every
    gradient still to come beside it, 22, a bound."""
    sim = Sim(total_bytes=128 * MiB)
    sim.alloc(8 * MiB, SETUP_STACK, "parameter", "w")
    _blocks_step(sim)
    _blocks_step(sim, oom=True)
    rec = _checkpointing(sim)
    assert rec.estimated_saved_bytes == 26 * MiB
    assert rec.regions.count == BLOCKS and rec.regions.replayed_step == 0 and not rec.saved_at_least


def test_a_first_forward_cut_short_is_cut_as_the_calls_it_made_so_far_a_lower_bound():
    """The trace's first forward runs out in its third block: no completed pass replays it, so the
    regions are the calls it made so far, cut as they are, and its rest runs more of them. The
    figure is at least what it says, and the reports say why (JSON `regions.so_far`), as they do
    where the rest was extrapolated but not replayed."""
    sim = Sim(total_bytes=64 * MiB)
    sim.alloc(8 * MiB, SETUP_STACK, "parameter", "w")
    sim.marker("forward", "start")
    for _ in range(2):
        for line, mib in BLOCK_PARTS:
            sim.alloc(mib * MiB, _in_block(line))
    sim.alloc(8 * MiB, _in_block(10))
    sim.oom(32 * MiB, _in_block(11))
    snapshot = sim.snapshot()
    analysis = analyse(snapshot)
    assert analysis.target_phase == "forward" and analysis.what_if.rest_of_pass is not None
    assert not analysis.what_if.rest_of_pass.extrapolated
    rec = next(r for r in analysis.recommendations if r.id == "activation-checkpointing")
    assert rec.regions is not None and rec.regions.count == 3 and rec.regions.replayed_step is None
    assert rec.saved_at_least and rec.regions.so_far and rec.would_fit_alone is None
    assert "; of the calls the interrupted pass made so far, cut as they are" in phrasing.regions_line(rec)
    json_rec = next(
        r
        for r in json.loads(render_report(snapshot, "json"))["recommendations"]
        if r["id"] == "activation-checkpointing"
    )
    assert json_rec["regions"]["so_far"] is True
