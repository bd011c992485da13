"""Steps and phases of plain torch snapshots, from stacks that frameworks shape (issue 11, C and D).

Each test scripts a small trace with `Sim` (no oomdoctor markers, as a plain torch snapshot) whose
stacks are laid out the way PyTorch, Lightning and torch.compile lay them out (innermost frame
first), and checks the phase and step `build_spans` gives each allocation.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from oomdoctor.analysis import analyse
from oomdoctor.analysis.phases import PhaseIndex, _annotation_phase, build_spans, classify_stack
from oomdoctor.analysis.results import PhaseSpan, UnknownKind
from oomdoctor.model import Annotation, Frame, Snapshot
from oomdoctor.views.report_rows import target_context
from tests.builders import ADAM_INIT_STACK, FORWARD_STACK, MiB, Sim

SITE = "/venv/lib/python3.11/site-packages"
TORCH = f"{SITE}/torch"
LIGHTNING = f"{SITE}/lightning/pytorch"


def _frame(path: str, name: str, line: int = 1) -> Frame:
    return Frame(path, line, name)


LOOP = (_frame("train.py", "main", 60), _frame("train.py", "<module>", 70))
MODULE_CALL = (
    _frame(f"{TORCH}/nn/modules/module.py", "_call_impl"),
    _frame(f"{TORCH}/nn/modules/module.py", "_wrapped_call_impl"),
)
LINEAR = (
    _frame(f"{TORCH}/nn/modules/linear.py", "forward"),
    *MODULE_CALL,
    _frame("model.py", "forward", 12),
    *MODULE_CALL,
)
FORWARD = (*LINEAR, *LOOP)
LOSS = (_frame("losses.py", "cross_entropy", 8), *LOOP)  # loss code outside any module
BACKWARD = (
    _frame(f"{TORCH}/autograd/__init__.py", "_make_grads"),
    _frame(f"{TORCH}/autograd/__init__.py", "backward"),
    _frame(f"{TORCH}/_tensor.py", "backward"),
    *LOOP,
)
ENGINE = (  # stacks="all": an allocation on the autograd engine's own thread
    _frame("??", "torch::autograd::Engine::evaluate_function(...)"),
    _frame("??", "torch::autograd::Engine::thread_main(...)"),
    _frame("??", "torch::autograd::python::PythonEngine::thread_init(...)"),
)
ADAM_STEP = (
    _frame(f"{TORCH}/optim/adam.py", "_init_group", 160),
    _frame(f"{TORCH}/optim/adam.py", "step", 230),
    _frame(f"{TORCH}/optim/optimizer.py", "wrapper"),
    *LOOP,
)
ADAM_LOAD = (_frame(f"{TORCH}/optim/optimizer.py", "load_state_dict"), *LOOP)
ADAM_SAVE = (  # a sharded optimizer's state gathered by a hook of optimizer.state_dict(), to save it
    _frame("trainer.py", "gather_full_moments", 40),
    _frame(f"{TORCH}/optim/optimizer.py", "state_dict"),
    _frame("trainer.py", "save_checkpoint", 52),
    *LOOP,
)
MODEL_TO = (
    _frame(f"{TORCH}/nn/modules/module.py", "convert"),
    _frame(f"{TORCH}/nn/modules/module.py", "_apply"),
    *LOOP,
)

# Lightning's automatic optimization: optimizer.step(closure), the closure runs the training step.
LIGHTNING_OUTER = (
    _frame(f"{LIGHTNING}/plugins/precision/precision.py", "_wrap_closure"),
    _frame(f"{TORCH}/optim/adam.py", "step"),
    _frame(f"{TORCH}/optim/optimizer.py", "_use_grad"),
    _frame(f"{TORCH}/optim/optimizer.py", "wrapper"),
    _frame(f"{LIGHTNING}/core/optimizer.py", "step"),
    _frame(f"{LIGHTNING}/loops/optimization/automatic.py", "_optimizer_step"),
    _frame(f"{LIGHTNING}/trainer/trainer.py", "fit"),
    *LOOP,
)
LIGHTNING_STEP = (
    _frame("module.py", "training_step", 40),
    _frame(f"{LIGHTNING}/strategies/strategy.py", "training_step"),
    _frame(f"{LIGHTNING}/loops/optimization/automatic.py", "_training_step"),
    _frame(f"{LIGHTNING}/loops/optimization/automatic.py", "closure"),
    _frame(f"{LIGHTNING}/loops/optimization/automatic.py", "__call__"),
    *LIGHTNING_OUTER,
)
LIGHTNING_FORWARD = (*LINEAR, *LIGHTNING_STEP)
LIGHTNING_LOSS = (_frame("module.py", "compute_loss", 30), *LIGHTNING_STEP)
LIGHTNING_BACKWARD = (
    _frame(f"{TORCH}/_tensor.py", "backward"),
    _frame(f"{LIGHTNING}/core/module.py", "backward"),
    _frame(f"{LIGHTNING}/loops/optimization/automatic.py", "backward_fn"),
    _frame(f"{LIGHTNING}/loops/optimization/automatic.py", "closure"),
    _frame(f"{LIGHTNING}/loops/optimization/automatic.py", "__call__"),
    *LIGHTNING_OUTER,
)
LIGHTNING_ADAM = (
    _frame(f"{TORCH}/optim/adam.py", "_init_group", 160),
    _frame(f"{TORCH}/optim/adam.py", "step"),
    *LIGHTNING_OUTER[2:],
)

# torch.autograd.grad called inside a forward (a gradient penalty, a jvp).
GRAD_IN_FORWARD = (
    _frame(f"{TORCH}/autograd/__init__.py", "grad"),
    _frame(f"{TORCH}/autograd/functional.py", "jvp"),
    _frame("model.py", "forward", 20),
    *MODULE_CALL,
    *LOOP,
)

# torch.compile: the compiled forward and AOTAutograd's backward run Python, and the inductor
# kernels' stacks show the model's source lines, `forward` included.
INDUCTOR = (_frame("/tmp/torchinductor_me/ab/cab.py", "call"), _frame("model.py", "forward", 41))
COMPILED_FORWARD = (
    *INDUCTOR,
    _frame(f"{TORCH}/_functorch/_aot_autograd/runtime_wrappers.py", "forward"),
    _frame(f"{TORCH}/autograd/function.py", "apply"),
    _frame(f"{TORCH}/_dynamo/eval_frame.py", "_fn"),
    *MODULE_CALL,
    *LOOP,
)
COMPILED_BACKWARD = (  # stacks="python": the engine thread's Python frames only
    *INDUCTOR,
    _frame(f"{TORCH}/_functorch/_aot_autograd/runtime_wrappers.py", "_backward_impl"),
    _frame(f"{TORCH}/_functorch/_aot_autograd/runtime_wrappers.py", "backward"),
    _frame(f"{TORCH}/autograd/function.py", "apply"),
)
COMPILED_AUTOGRAD = (*INDUCTOR, _frame(f"{TORCH}/_dynamo/compiled_autograd.py", "runtime_wrapper"))
CHECKPOINT_RECOMPUTE = (*LINEAR, _frame(f"{TORCH}/utils/checkpoint.py", "recompute_fn"), *ENGINE)


def _trace(sim: Sim, annotations: tuple[Annotation, ...] = ()) -> Snapshot:
    return dataclasses.replace(sim.snapshot(metadata=False), annotations=annotations)


def _phase_steps(snapshot: Snapshot, stacks_at: list[int]) -> list[tuple[str, int]]:
    """(phase, step) of the allocations made at the given `sim.alloc` calls (by call number)."""
    trace = snapshot.trace_of(0)
    spans, _ = build_spans(trace, markers=None, annotations=snapshot.annotations, device=0)
    index = PhaseIndex(spans)
    allocs = [i for i, action in enumerate(trace.actions) if action in ("alloc", "oom")]
    result = []
    for call in stacks_at:
        span = index.span_of(allocs[call])
        assert span is not None
        result.append((span.phase, span.step))
    return result


def _run(stacks: list, *, annotations_at: dict[int, list[str]] | None = None) -> list[tuple[str, int]]:
    """Allocate once per stack (a 1 MiB block, kept), with zero-width annotations before the
    allocation of the given call numbers; (phase, step) of each."""
    annotations: list[Annotation] = []
    sim = _sim_of(stacks, annotations_at, annotations)
    return _phase_steps(_trace(sim, tuple(annotations)), list(range(len(stacks))))


def _sim_of(
    stacks: list, annotations_at: dict[int, list[str]] | None = None, annotations: list[Annotation] | None = None
) -> Sim:
    """A 1 MiB block allocated (and kept) per stack; the annotations before the given calls go into
    `annotations`."""
    sim = Sim(total_bytes=8 << 30)
    for call, stack in enumerate(stacks):
        for name in (annotations_at or {}).get(call, []):
            time_us = sim._tick()
            if annotations is not None:
                annotations += [Annotation(name, "START", 0, time_us), Annotation(name, "END", 0, time_us)]
        sim.alloc(MiB, stack)
    return sim


# --- one stack --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("stack", "expected"),
    [
        (FORWARD, "forward"),
        (BACKWARD, "backward"),
        (ADAM_STEP, "optimizer_step"),
        (ADAM_LOAD, "optimizer_step"),  # optimizer state for attribution, though no step runs
        (MODEL_TO, "module-setup"),
        (LOSS, "user"),
        (ENGINE, "backward"),
        ((), "no-frames"),
        # Lightning: the training step runs inside optimizer.step(closure)
        (LIGHTNING_FORWARD, "forward"),
        (LIGHTNING_LOSS, "user"),
        (LIGHTNING_BACKWARD, "backward"),
        (LIGHTNING_ADAM, "optimizer_step"),
        # a grad nested in a forward is the forward's; a forward nested in a backward the backward's
        (GRAD_IN_FORWARD, "forward"),
        ((*ENGINE[:1], *GRAD_IN_FORWARD), "forward"),
        (CHECKPOINT_RECOMPUTE, "backward"),
        # torch.compile
        (COMPILED_FORWARD, "forward"),
        (COMPILED_BACKWARD, "backward"),
        ((*COMPILED_BACKWARD, *ENGINE), "backward"),
        (COMPILED_AUTOGRAD, "backward"),
        # a model's forward called directly (model.forward(x)), not through __call__
        ((_frame("model.py", "forward", 5), *LOOP), "forward"),
        # Windows paths
        ((Frame("C:\\venv\\Lib\\site-packages\\torch\\optim\\adam.py", 1, "step"), *LOOP), "optimizer_step"),
    ],
)
def test_the_innermost_meaningful_frame_decides(stack, expected):
    assert classify_stack(stack) == expected


def test_the_builders_stacks_keep_their_class():
    assert classify_stack(FORWARD_STACK) == "forward"
    assert classify_stack(ADAM_INIT_STACK) == "optimizer_step"


# --- phases from where an allocation lies ------------------------------------------------------


def test_loss_code_outside_modules_belongs_to_the_forward():
    assert _run([MODEL_TO, FORWARD, FORWARD, LOSS, LOSS, BACKWARD, (), ADAM_STEP]) == [
        ("before_first_step", 0),
        ("forward", 0),
        ("forward", 0),
        ("forward", 0),
        ("forward", 0),
        ("backward", 0),
        ("backward", 0),
        ("optimizer_step", 0),
    ]


def test_code_before_backward_is_the_forward_even_without_modules():
    # functional code run at the loop's level (no nn.Module), then backward()
    assert _run([LOSS, LOSS, BACKWARD, ()]) == [("forward", 0), ("forward", 0), ("backward", 0), ("backward", 0)]


def test_code_after_a_completed_step_is_between_steps_of_the_next():
    assert _run([FORWARD, BACKWARD, ADAM_STEP, LOSS, FORWARD, BACKWARD]) == [
        ("forward", 0),
        ("backward", 0),
        ("optimizer_step", 0),
        ("between_steps", 1),
        ("forward", 1),
        ("backward", 1),
    ]


def test_lightning_closure_is_the_training_step_not_the_optimizer():
    sim = Sim(total_bytes=8 << 30)
    sim.alloc(MiB, MODEL_TO)
    for _ in range(3):
        sim.alloc(64 * MiB, LIGHTNING_FORWARD)
    sim.alloc(MiB, LIGHTNING_LOSS)
    sim.oom(512 * MiB)
    sim.events[-1] = dataclasses.replace(sim.events[-1], frames=LIGHTNING_FORWARD)
    snapshot = _trace(sim)
    assert _phase_steps(snapshot, [0, 1, 3, 4]) == [
        ("before_first_step", 0),
        ("forward", 0),
        ("forward", 0),
        ("forward", 0),
    ]
    result = analyse(snapshot)
    assert (result.target_phase, result.target_step) == ("forward", 0)


def test_lightning_steps_count_optimizer_steps():
    step = [LIGHTNING_FORWARD, LIGHTNING_LOSS, LIGHTNING_BACKWARD, (), LIGHTNING_ADAM]
    phases = _run(step + step)
    assert phases == [
        ("forward", 0),
        ("forward", 0),
        ("backward", 0),
        ("backward", 0),
        ("optimizer_step", 0),
        ("forward", 1),
        ("forward", 1),
        ("backward", 1),
        ("backward", 1),
        ("optimizer_step", 1),
    ]


def test_a_grad_nested_in_a_forward_neither_ends_the_forward_nor_starts_a_step():
    # the engine thread's allocations for the nested grad, then the forward goes on; then the real backward
    phases = _run([FORWARD, GRAD_IN_FORWARD, ENGINE, ENGINE, FORWARD, LOSS, BACKWARD, ENGINE])
    assert phases == [("forward", 0)] * 6 + [("backward", 0)] * 2


def test_compiled_backward_is_backward():
    phases = _run([COMPILED_FORWARD, LOSS, BACKWARD, COMPILED_BACKWARD, COMPILED_BACKWARD, ADAM_STEP])
    assert [p for p, _ in phases] == ["forward", "forward", "backward", "backward", "backward", "optimizer_step"]
    assert {s for _, s in phases} == {0}


def test_checkpoint_recomputation_in_backward_is_backward():
    phases = _run([FORWARD, BACKWARD, ENGINE, CHECKPOINT_RECOMPUTE, ENGINE])
    assert [p for p, _ in phases] == ["forward", "backward", "backward", "backward", "backward"]


# --- steps -------------------------------------------------------------------------------------


def test_no_phantom_step_from_a_tail_of_frees():
    sim = Sim(total_bytes=8 << 30)
    sim.alloc(MiB, FORWARD)
    sim.alloc(MiB, BACKWARD)
    start = sim._tick()
    blocks = [sim.alloc(MiB, ADAM_STEP) for _ in range(2)]
    end = sim._tick()
    for block in blocks:
        sim.free(block)
    annotations = (
        Annotation("Optimizer.step#Adam.step", "START", 0, start),
        Annotation("Optimizer.step#Adam.step", "END", 0, end),
    )
    for snapshot in (_trace(sim), _trace(sim, annotations)):
        spans, _ = build_spans(snapshot.trace_of(0), markers=None, annotations=snapshot.annotations, device=0)
        assert spans[-1].last_index == len(snapshot.trace_of(0)) - 1
        # frames alone cannot tell the step's own frees from what follows it; its annotation's end
        # can: what follows a completed step lies in the next, which did nothing and has no row
        assert {s.step for s in spans} == ({0, 1} if snapshot.annotations else {0}), spans
        assert [s.step for s in analyse(snapshot).steps] == [0]


def test_a_step_ends_only_after_a_completed_backward_or_optimizer_step():
    # gradient accumulation: two micro-batches, then the optimizer
    micro = [FORWARD, LOSS, BACKWARD, ()]
    phases = _run(micro + micro + [ADAM_STEP] + micro)
    assert [s for _, s in phases] == [0] * 9 + [1] * 4
    # an optimizer that updates in place allocates nothing, and the backwards' blocks all stay
    # alive (gradients added into, never freed): nothing shows where a step ended, the passes may be
    # micro-batches, and they are counted in the step before them, not as steps of their own
    unsplit: set[int] = set()
    trace = _trace(_sim_of(micro * 3)).trace_of(0)
    spans, _ = build_spans(trace, markers=None, annotations=(), device=0, unsplit=unsplit)
    assert {s.step for s in spans} == {0}
    assert len(unsplit) == 2
    # the loop freed each backward's blocks (its gradients set to None) before the next forward:
    # each completed backward ends a step
    sim = Sim(total_bytes=8 << 30)
    for _ in range(3):
        sim.free(sim.alloc(MiB, FORWARD))
        grads = [sim.alloc(MiB, BACKWARD), sim.alloc(MiB, BACKWARD)]
        for block in grads:
            sim.free(block, LOSS)
    assert [s for _, s in _phase_steps(_trace(sim), list(range(9)))] == [0] * 3 + [1] * 3 + [2] * 3


def test_an_evaluation_after_a_backward_whose_gradients_stay_is_no_micro_batch():
    """No optimizer step shows and the backward's gradients stay alive, but the pass after it is an
    evaluation (a loop named for one): it adds into no gradients, so it is no micro-batch of the
    step before; it begins a step, as the markers' step index counts it, and nothing is unsplit."""
    unsplit: set[int] = set()
    trace = _trace(_sim_of([FORWARD, BACKWARD, EVAL_FORWARD, EVAL_FORWARD])).trace_of(0)
    spans, _ = build_spans(trace, markers=None, annotations=(), device=0, unsplit=unsplit)
    assert [(s.phase, s.step) for s in spans if s.phase != "before_first_step"] == [
        ("forward", 0),
        ("backward", 0),
        ("evaluation", 1),
    ]
    assert not unsplit


SGD_STEP = (  # torch.optim.SGD with momentum: its first step makes the momentum buffers
    _frame(f"{TORCH}/optim/sgd.py", "_multi_tensor_sgd", 420),
    _frame(f"{TORCH}/optim/sgd.py", "sgd", 300),
    _frame(f"{TORCH}/optim/sgd.py", "step", 120),
    _frame(f"{TORCH}/optim/optimizer.py", "wrapper"),
    *LOOP,
)
ADAM_FOREACH = (
    _frame(f"{TORCH}/optim/adam.py", "_multi_tensor_adam", 540),
    _frame(f"{TORCH}/optim/adam.py", "step", 230),
    _frame(f"{TORCH}/optim/optimizer.py", "wrapper"),
    *LOOP,
)


def _one_optimizer_step_then_passes(
    optimizer: tuple[Frame, ...], *, temporaries: bool, gradients_freed: bool = False
) -> tuple[list[tuple[str, int]], set[int], Snapshot]:
    """Two passes (the first backward makes the gradients, kept; the second adds into them), one
    optimizer step (its state, kept; with `temporaries` a block it makes and frees), then three
    passes whose backwards make only temporaries (the gradients added into in place). With
    `gradients_freed`, one pass before the step, and the loop frees the gradients at the top of
    each iteration (`p.grad = None`: the loop's own frames), so that each backward makes them
    again. (phase, step) of each pass's forward allocation, and the first events of the passes
    counted in the step before them (`unsplit`), and the snapshot (the next forward runs out)."""
    sim = Sim(total_bytes=8 << 30)
    forwards = []
    grads: list[int] = []

    def one_pass(makes_gradients: bool) -> None:
        if gradients_freed:  # the loop's own code, at the top of each iteration
            for block in grads:
                sim.free(block, LOOP)
            grads.clear()
        activation = sim.alloc(MiB, FORWARD)
        forwards.append(len(sim.events) - 1)  # the allocation's event
        if makes_gradients:
            grads.extend([sim.alloc(MiB, BACKWARD), sim.alloc(MiB, BACKWARD)])
        else:
            sim.free(sim.alloc(MiB, BACKWARD), BACKWARD)
        sim.free(activation, LOSS)

    one_pass(True)
    if not gradients_freed:  # a micro-batch adding into the first one's gradients
        one_pass(False)
    sim.alloc(MiB, optimizer)  # the optimizer's state
    if temporaries:
        sim.free(sim.alloc(MiB, optimizer), optimizer)
    for _ in range(3):
        one_pass(gradients_freed)
    for block in grads if gradients_freed else ():
        sim.free(block, LOOP)
    sim.oom(64 * MiB, FORWARD)  # the next iteration's forward runs out
    snapshot = _trace(sim)
    unsplit: set[int] = set()
    spans, _ = build_spans(snapshot.trace_of(0), markers=None, annotations=(), device=0, unsplit=unsplit)
    index = PhaseIndex(spans)
    steps = []
    for first in forwards:
        span = index.span_of(first)
        assert span is not None
        steps.append((span.phase, span.step))
    return steps, unsplit, snapshot


def test_passes_after_an_optimizer_seen_only_in_its_first_step_may_be_steps():
    """SGD with momentum allocates only in its first step (the buffers, updated in place after): a
    pass after a backward that follows that step, the gradients still alive, may be a micro-batch
    or a step of its own that left no trace. It is counted in the step before it and listed as
    unsplit ("step N or later"), not silently as a micro-batch. The passes before the one step
    the optimizer shows are micro-batches: a step before it would have made the state."""
    steps, unsplit, snapshot = _one_optimizer_step_then_passes(SGD_STEP, temporaries=False)
    assert [step for _, step in steps] == [0, 0, 1, 1, 1]
    assert len(unsplit) == 3  # the two passes after the first since the step, and the forward that ran out
    analysis = analyse(snapshot)
    assert [u.count for u in analysis.unknowns if u.kind == UnknownKind.PASSES_MAY_BE_STEPS] == [3]
    assert "(step 1 or later, forward" in target_context(analysis)


def test_passes_after_an_unseen_optimizers_step_are_steps_where_the_gradients_are_freed():
    """The same optimizer, in a loop that frees the gradients after each backward (its own code, not
    zero_grad): each backward ends a step, as where no optimizer shows at all."""
    steps, unsplit, _ = _one_optimizer_step_then_passes(SGD_STEP, temporaries=False, gradients_freed=True)
    assert [step for _, step in steps] == [0, 1, 2, 3]
    assert not unsplit


def test_optimizer_steps_that_made_state_alone_say_nothing_of_the_steps_between():
    """SGD with momentum makes a parameter's buffer in the first step that parameter has a gradient
    (a layer unfrozen, an expert first routed to): two steps that made state show, and the passes
    after each, the gradients still alive, may be steps that made none. Each shown step ends its
    step; the passes after it are counted in it and listed as unsplit."""
    sim = Sim(total_bytes=8 << 30)
    forwards = []
    for number, stack in enumerate([FORWARD, SGD_STEP, FORWARD, FORWARD, SGD_STEP, FORWARD, FORWARD]):
        if stack is SGD_STEP:
            sim.alloc(MiB, SGD_STEP)  # the buffers of the parameters with their first gradients
            continue
        activation = sim.alloc(MiB, FORWARD)
        forwards.append(len(sim.events) - 1)
        if number == 0:
            sim.alloc(MiB, BACKWARD)  # the gradients, kept and added into after
        else:
            sim.free(sim.alloc(MiB, BACKWARD), BACKWARD)
        sim.free(activation, LOSS)
    unsplit: set[int] = set()
    spans, _ = build_spans(_trace(sim).trace_of(0), markers=None, annotations=(), device=0, unsplit=unsplit)
    index = PhaseIndex(spans)
    assert [index.span_of(first).step for first in forwards] == [0, 1, 1, 2, 2]  # type: ignore[union-attr]
    assert sorted(unsplit) == [forwards[2], forwards[4]]


def test_an_optimizer_step_that_frees_its_temporaries_shows_each_step():
    """A foreach Adam makes and frees temporaries in every step: the passes after its one step with
    no step of it between are micro-batches of one step, and nothing is unsplit."""
    steps, unsplit, _ = _one_optimizer_step_then_passes(ADAM_FOREACH, temporaries=True)
    assert [step for _, step in steps] == [0, 0, 1, 1, 1]
    assert not unsplit


def test_an_optimizer_state_dict_saved_after_a_step_is_no_step():
    assert classify_stack(ADAM_SAVE) == "user"
    assert _run([FORWARD, BACKWARD, ADAM_STEP, ADAM_SAVE, ADAM_SAVE]) == [
        ("forward", 0),
        ("backward", 0),
        ("optimizer_step", 0),
        ("between_steps", 1),
        ("between_steps", 1),
    ]


def test_optimizer_state_loaded_at_setup_is_no_step():
    assert _run([MODEL_TO, ADAM_LOAD, FORWARD, BACKWARD, ADAM_STEP]) == [
        ("before_first_step", 0),
        ("before_first_step", 0),
        ("forward", 0),
        ("backward", 0),
        ("optimizer_step", 0),
    ]


def test_zero_grad_and_dataloader_annotations_mark_iterations():
    # a training loop whose update is the user's own code (no torch.optim frames, no backward)
    zero_grad = "Optimizer.zero_grad#SGD.zero_grad"
    loader = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
    stacks = [MODEL_TO, FORWARD, LOSS, LOSS, FORWARD, LOSS]
    phases = _run(stacks, annotations_at={1: [zero_grad, loader], 4: [zero_grad, loader]})
    assert phases == [
        ("before_first_step", 0),
        ("forward", 0),
        ("forward", 0),
        ("forward", 0),
        ("forward", 1),
        ("forward", 1),
    ]


@pytest.mark.parametrize(
    ("names", "reads_frees"),
    [
        (["Optimizer.zero_grad#SGD.zero_grad"], False),  # torch annotated the optimizer's calls
        (["enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"], True),  # only the loader's
        ([], True),
    ],
)
def test_the_frees_stacks_are_read_only_where_no_annotation_names_the_optimizer(monkeypatch, names, reads_frees):
    # A zero_grad that freed nothing leaves no window; where torch annotated it, every optimizer
    # call is annotated, so the frees' stacks (read at a cost per free) can tell nothing more
    import oomdoctor.analysis.phases as phases_module

    read: list[bool] = []
    real = phases_module.frame_windows

    def spy(trace):
        read.append(True)
        return real(trace)

    monkeypatch.setattr(phases_module, "frame_windows", spy)
    phases = _run([MODEL_TO, FORWARD, LOSS, FORWARD, LOSS], annotations_at={1: names, 3: names})
    assert bool(read) == reads_frees
    assert phases[1:3] == [("forward", 0), ("forward", 0)]


@pytest.mark.parametrize(
    "mark", ["Optimizer.zero_grad#SGD.zero_grad", "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"]
)
def test_a_loop_mark_between_a_forward_and_its_backward_starts_no_step(mark):
    # `loss = model(x); optimizer.zero_grad(); loss.backward(); optimizer.step()` (and a loader that
    # fetches the next batch before the backward): the mark is inside the iteration, whose backward
    # and update are the same step as its forward
    stacks = [MODEL_TO, FORWARD, LOSS, BACKWARD, ADAM_STEP, FORWARD, LOSS, BACKWARD, ADAM_STEP, FORWARD]
    phases = _run(stacks, annotations_at={3: [mark], 7: [mark]})
    assert phases == [
        ("before_first_step", 0),
        ("forward", 0),
        ("forward", 0),
        ("backward", 0),
        ("optimizer_step", 0),
        ("forward", 1),
        ("forward", 1),
        ("backward", 1),
        ("optimizer_step", 1),
        ("forward", 2),
    ]


# --- forward-only traces ------------------------------------------------------------------------


def test_a_forward_only_trace_is_not_numbered_as_steps_and_has_no_between_steps():
    loader = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
    stacks = [MODEL_TO, LOSS, FORWARD, FORWARD, LOSS, FORWARD, LOSS, FORWARD, LOSS]
    phases = _run(stacks, annotations_at={1: [loader], 4: [loader], 6: [loader]})
    assert phases[:2] == [("before_first_step", 0), ("before_first_step", 0)]
    assert phases[2:] == [("forward", 0)] * 7


def test_each_pass_of_a_forward_only_trace_keeps_its_own_span():
    sim = Sim(total_bytes=8 << 30)
    for _ in range(3):
        sim.alloc(MiB, FORWARD)
        sim.alloc(MiB, LOSS)
    snapshot = _trace(sim)
    spans, _ = build_spans(snapshot.trace_of(0), markers=None, annotations=(), device=0)
    assert [(s.phase, s.step) for s in spans] == [("before_first_step", 0)] + [("forward", 0)] * 3


def test_a_trace_whose_stacks_name_no_phase_stays_unknown():
    sim = Sim()
    sim.alloc(MiB, LOSS)
    sim.alloc(MiB, LOSS)
    spans, source = build_spans(_trace(sim).trace_of(0), markers=None, annotations=(), device=0)
    assert [(s.phase, s.source) for s in spans] == [("unknown", "none")] and source == "none"


# --- the real corpus ----------------------------------------------------------------------------

CORPUS = Path(__file__).resolve().parents[2] / "shared" / "corpus"
NESTA = CORPUS / "snapshots" / "oom_action__nesta_discrete_diffusion__memory_snapshot.json"


@pytest.mark.skipif(not NESTA.is_file(), reason="the corpus (../shared/corpus) is absent")
def test_corpus_lightning_oom_is_the_first_steps_forward():
    from oomdoctor.load import load

    labels = {entry["file"]: entry for entry in json.loads((CORPUS / "labels" / "labels.json").read_text())}
    assert labels[NESTA.name]["steps"]["n_steps_visible"] == 0
    result = analyse(load(NESTA))
    assert (result.target_phase, result.target_step) == ("forward", 0)
    assert {s.step for s in result.phases} == {0}


def test_an_optimizer_step_window_around_a_closure_keeps_its_forward_and_backward():
    # optimizer.step(closure) recorded as one Optimizer.step annotation; zero_grad inside the closure
    closure_forward = (*LINEAR, _frame("train.py", "closure", 50), *ADAM_STEP[1:])
    closure_backward = (*BACKWARD[:3], _frame("train.py", "closure", 52), *ADAM_STEP[1:])
    sim = Sim(total_bytes=8 << 30)
    annotations: list[Annotation] = []
    for _ in range(2):
        sim.alloc(MiB, LOSS)  # the batch
        start = sim._tick()
        sim.alloc(MiB, closure_forward)
        zero_grad = sim._tick()
        annotations += [
            Annotation("Optimizer.zero_grad#Adam.zero_grad", edge, 0, zero_grad) for edge in ("START", "END")
        ]
        sim.alloc(MiB, closure_backward)
        sim.alloc(MiB, ())
        sim.alloc(MiB, ADAM_STEP)
        annotations += [
            Annotation("Optimizer.step#Adam.step", edge, 0, t) for edge, t in (("START", start), ("END", sim._tick()))
        ]
    phases = _phase_steps(_trace(sim, tuple(annotations)), list(range(10)))
    step = [("forward", 0), ("backward", 0), ("backward", 0), ("optimizer_step", 0)]
    assert phases == [("before_first_step", 0), *step, ("between_steps", 1), *[(p, 1) for p, _ in step]]


def _user_free(sim: Sim, address: int, frames=LOOP) -> None:
    """The user's own code frees a block (`out = model(x)` dropping the previous output)."""
    from oomdoctor.model import TraceEvent

    size = sim.segments[address][2]
    sim.events.append(TraceEvent("free_requested", address, size, 0, frames, sim._tick()))
    sim.events.append(TraceEvent("free_completed", address, size, 0, frames, sim._tick()))
    sim.segments[address][1] = "inactive"


def _forward_spans(sim: Sim) -> list[tuple[int, int]]:
    spans, _ = build_spans(_trace(sim).trace_of(0), markers=None, annotations=(), device=0)
    return [(s.first_index, s.last_index) for s in spans if s.phase == "forward"]


def test_back_to_back_passes_split_where_the_user_dropped_the_previous_output():
    """A forward-only benchmark: nothing is allocated between two passes, but the loop's own code
    frees something of the last pass (`del out`, a temporary of the loop) before calling again."""
    sim = Sim(total_bytes=8 << 30)
    output = None
    for _ in range(3):
        if output is not None:
            _user_free(sim, output)
        sim.alloc(MiB, FORWARD)
        output = sim.alloc(MiB, FORWARD)
    assert len(_forward_spans(sim)) == 3
    # without the frees the three passes cannot be told apart
    sim = Sim(total_bytes=8 << 30)
    for _ in range(6):
        sim.alloc(MiB, FORWARD)
    assert len(_forward_spans(sim)) == 1


def test_the_loss_module_after_the_model_is_the_same_pass():
    """A free from the loop between the model's and the loss module's allocations: modules called
    from different lines of the loop are one step's forward, not two passes."""
    loss_module = (*LINEAR[:-4], *MODULE_CALL, _frame("train.py", "main", 61), LOOP[1])
    sim = Sim(total_bytes=8 << 30)
    previous = sim.alloc(MiB, LOSS)
    sim.alloc(MiB, FORWARD)
    _user_free(sim, previous)
    sim.alloc(MiB, loss_module)
    sim.alloc(MiB, BACKWARD)
    assert len(_forward_spans(sim)) == 1


# --- evaluation -------------------------------------------------------------------------------

EVAL_LOOP = (_frame("train.py", "evaluate", 80), *LOOP)
EVAL_FORWARD = (*LINEAR, *EVAL_LOOP)
EVAL_CODE = (_frame("metrics.py", "accuracy", 5), *EVAL_LOOP)  # the loop's own code, outside modules
LIGHTNING_VALIDATION = (
    *LINEAR,
    _frame("module.py", "validation_step", 60),
    _frame(f"{LIGHTNING}/strategies/strategy.py", "validation_step"),
    _frame(f"{LIGHTNING}/loops/evaluation_loop.py", "_evaluation_step"),
    _frame(f"{LIGHTNING}/loops/evaluation_loop.py", "run"),
    _frame(f"{LIGHTNING}/loops/fit_loop.py", "on_advance_end"),
    _frame(f"{LIGHTNING}/trainer/trainer.py", "fit"),
    *LOOP,
)
# Lightning's closure is decorated with torch.enable_grad(): the frame no_grad's decorator leaves too
ENABLE_GRAD_CLOSURE = (
    *LINEAR,
    *LIGHTNING_STEP[:4],  # training_step .. closure
    _frame(f"{TORCH}/utils/_contextlib.py", "decorate_context"),
    *LIGHTNING_STEP[4:],  # the closure's __call__ and the optimizer step around it
)


@pytest.mark.parametrize(
    ("stack", "expected"),
    [
        (EVAL_FORWARD, "evaluation"),
        (EVAL_CODE, "evaluation"),
        (LIGHTNING_VALIDATION, "evaluation"),
        ((*LINEAR, _frame("hf.py", "prediction_step"), _frame("hf.py", "evaluation_loop"), *LOOP), "evaluation"),
        ((*LINEAR, _frame("run.py", "run_inference"), *LOOP), "evaluation"),
        # a name that also says train, a test function, a function named for nothing: no evaluation
        ((*LINEAR, _frame("run.py", "train_and_evaluate"), *LOOP), "forward"),
        ((*LINEAR, _frame("test_model.py", "test_forward"), *LOOP), "forward"),
        ((*LINEAR, _frame("run.py", "interval_step"), *LOOP), "forward"),
        # the enable_grad (or no_grad) decorator's frame says nothing
        (ENABLE_GRAD_CLOSURE, "forward"),
        # a function named for evaluation inside a module's forward is the forward's own code
        ((_frame("model.py", "eval_head", 3), *LINEAR[1:], *LOOP), "forward"),
        # the optimizer, a backward inside an evaluation-named function keep their phase
        ((*BACKWARD[:3], *EVAL_LOOP), "backward"),
    ],
)
def test_a_pass_called_from_an_evaluation_loop_is_an_evaluation(stack, expected):
    assert classify_stack(stack) == expected


def test_an_evaluation_after_a_step_belongs_to_the_next_step_and_starts_no_step_of_its_own():
    loader = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
    stacks = [
        FORWARD,
        BACKWARD,
        ADAM_STEP,
        EVAL_FORWARD,
        EVAL_CODE,
        EVAL_FORWARD,
        EVAL_CODE,
        FORWARD,
        BACKWARD,
        ADAM_STEP,
    ]
    phases = _run(stacks, annotations_at={3: [loader], 5: [loader], 7: [loader]})
    assert phases == [
        ("forward", 0),
        ("backward", 0),
        ("optimizer_step", 0),
        ("evaluation", 1),
        ("evaluation", 1),
        ("evaluation", 1),
        ("evaluation", 1),
        ("forward", 1),
        ("backward", 1),
        ("optimizer_step", 1),
    ]


def test_each_evaluation_pass_keeps_its_own_span():
    sim = Sim(total_bytes=8 << 30)
    for _ in range(3):
        sim.alloc(MiB, EVAL_FORWARD)
        sim.alloc(MiB, LOSS)  # the loop's code in a function not named for evaluation
    sim.alloc(MiB, LOSS)
    spans, _ = build_spans(_trace(sim).trace_of(0), markers=None, annotations=(), device=0)
    phases = [s.phase for s in spans]
    assert phases[0] == "before_first_step"
    assert phases.count("evaluation") == 3
    # code between two of its passes is the evaluation's; after the last one, no pass is running
    assert phases[-1] != "evaluation"


def test_an_evaluation_pass_a_backward_follows_trained():
    # a forward from a function named for evaluation whose result is backpropagated: it trained
    stacks = [EVAL_FORWARD, EVAL_FORWARD, BACKWARD, ADAM_STEP]
    assert _run(stacks) == [("forward", 0), ("forward", 0), ("backward", 0), ("optimizer_step", 0)]


def _step_then_passes_keeping_outputs(sim: Sim, stack, *, before=lambda: None, after=lambda: None) -> None:
    """A model moved to the device and one training step, then eight passes of `stack` that each
    free their 8 MiB intermediates as they go (as under no_grad) and keep 2 MiB of logits; `before`
    and `after` run around each pass."""
    sim.alloc(4 * MiB, MODEL_TO)
    sim.free(sim.alloc(MiB, FORWARD))
    sim.free(sim.alloc(MiB, BACKWARD))
    sim.alloc(MiB, ADAM_STEP)
    for _ in range(8):
        before()
        previous = None
        for _ in range(4):
            intermediate = sim.alloc(8 * MiB, stack)
            if previous is not None:
                sim.free(previous)
            previous = intermediate
        sim.alloc(2 * MiB, stack)  # the logits, kept
        assert previous is not None
        sim.free(previous)
        after()


def test_an_evaluation_loop_keeping_its_outputs_is_found_from_frames():
    # after a training step, eight passes from `evaluate` each keep their 2 MiB of logits (each
    # intermediate freed once used, as under no_grad); the concatenation of what was kept fails
    sim = Sim(total_bytes=64 * MiB)
    _step_then_passes_keeping_outputs(sim, EVAL_FORWARD, before=lambda: sim.free(sim.alloc(4096, EVAL_CODE)))
    sim.oom(16 * MiB, EVAL_CODE)
    analysis = analyse(sim.snapshot(metadata=False))
    assert (analysis.target_phase, analysis.target_step) == ("evaluation", 1)
    assert analysis.verdict == "eval-outputs-kept", [f.verdict for f in analysis.secondary]


# --- evaluation windows (record_function annotations) ------------------------------------------


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("[LightningModule]LitModel.validation_step", "evaluation"),  # Lightning's PyTorchProfiler
        ("[Strategy]DDPStrategy.test_step", "evaluation"),
        ("evaluate", "evaluation"),
        ("run_inference", "evaluation"),
        ("[LightningModule]LitModel.training_step", None),
        ("train_and_evaluate", None),  # a name that also says train
        ("model_forward", "forward"),
        ("[LightningModule]LitModel.backward", "backward"),
        ("Optimizer.step#AdamW.step", "optimizer_step"),
        ("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", None),
    ],
)
def test_a_window_named_for_evaluation_is_one(name, expected):
    assert _annotation_phase(name) == expected


def _windowed_trace(calls: list) -> tuple[Snapshot, int]:
    """A trace from `calls`: a stack allocates 1 MiB (freed at once); ("START", name) and
    ("END", name) open and close a record_function window. Returns it and its allocation count."""
    sim = Sim(total_bytes=8 << 30)
    annotations: list[Annotation] = []
    allocations = 0
    for call in calls:
        if isinstance(call, tuple) and call[:1] in (("START",), ("END",)):
            annotations.append(Annotation(call[1], call[0], 0, sim._tick()))
            continue
        sim.free(sim.alloc(MiB, call))
        allocations += 1
    return _trace(sim, tuple(annotations)), allocations


def _windowed(calls: list) -> list[tuple[str, int]]:
    """(phase, step) of each allocation of `_windowed_trace(calls)`."""
    snapshot, allocations = _windowed_trace(calls)
    return _phase_steps(snapshot, list(range(allocations)))


def test_a_validation_window_makes_its_passes_an_evaluation_of_the_next_step():
    # Lightning's profiler windows: a training step, then two validation steps, each running the
    # model (a forward window inside it) on a batch its DataLoader handed over; then training again
    loader = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
    validation = "[LightningModule]LitModel.validation_step"
    forward = "[LightningModule]LitModel.forward"
    calls: list = [FORWARD, BACKWARD, ADAM_STEP]
    for _ in range(2):
        calls += [("START", loader), ("END", loader), ("START", validation), ("START", forward)]
        calls += [FORWARD, FORWARD, ("END", forward), LOSS, ("END", validation)]
    calls += [FORWARD, BACKWARD, ADAM_STEP]
    assert _windowed(calls) == [
        ("forward", 0),
        ("backward", 0),
        ("optimizer_step", 0),
        *[("evaluation", 1)] * 6,
        ("forward", 1),
        ("backward", 1),
        ("optimizer_step", 1),
    ]


def test_each_validation_window_is_a_pass_of_its_own():
    validation = "[LightningModule]LitModel.validation_step"
    calls: list = [FORWARD, BACKWARD, ADAM_STEP]
    for _ in range(3):
        calls += [("START", validation), FORWARD, LOSS, ("END", validation)]
    sim_spans = _windowed_spans(calls)
    assert [s.phase for s in sim_spans].count("evaluation") == 3


def test_an_evaluation_window_with_a_backward_inside_trained():
    # as a frame-read evaluation that a backward follows: the window's forward is a forward
    window = "evaluate"
    assert _windowed([("START", window), FORWARD, BACKWARD, ("END", window)]) == [("forward", 0), ("backward", 0)]


def _windowed_spans(calls: list):
    snapshot, _ = _windowed_trace(calls)
    spans, _ = build_spans(snapshot.trace_of(0), markers=None, annotations=snapshot.annotations, device=0)
    return spans


def test_a_validation_loop_keeping_its_outputs_is_found_from_its_windows():
    # as the frames-only loop above, but the stacks name no evaluation function: Lightning's
    # profiler windows (`validation_step`, the model's `forward` inside it) tell the passes apart
    sim = Sim(total_bytes=64 * MiB)
    annotations: list[Annotation] = []

    def mark(name: str, stage: str) -> None:
        annotations.append(Annotation(name, stage, 0, sim._tick()))

    validation, forward = "[LightningModule]LitModel.validation_step", "[LightningModule]LitModel.forward"
    _step_then_passes_keeping_outputs(
        sim,
        FORWARD,
        before=lambda: (mark(validation, "START"), mark(forward, "START")),
        after=lambda: (mark(forward, "END"), mark(validation, "END")),
    )
    mark(validation, "START")  # the epoch's end: what was kept, concatenated
    sim.oom(16 * MiB, LOSS)
    analysis = analyse(dataclasses.replace(sim.snapshot(metadata=False), annotations=tuple(annotations)))
    assert analysis.verdict == "eval-outputs-kept"
    assert (analysis.target_phase, analysis.target_step) == ("evaluation", 1)
    assert [s.phase for s in analysis.phases].count("evaluation") >= 8


# --- a loop run without autograd, from memory alone -----------------------------------------


def _spans(sim: Sim) -> list:
    spans, _ = build_spans(_trace(sim).trace_of(0), markers=None, annotations=(), device=0)
    return spans


def test_an_inline_no_grad_loop_of_a_training_script_is_an_evaluation():
    # `with torch.no_grad(): for batch in loader: kept.append(model(batch))` written in `main`: the
    # frames name no evaluation function, but each pass freed its intermediates as it went and no
    # backward follows any; the concatenation after the loop is between steps
    sim = Sim(total_bytes=64 * MiB)
    _step_then_passes_keeping_outputs(sim, FORWARD, before=lambda: sim.free(sim.alloc(4096, LOSS)))
    sim.oom(16 * MiB, LOSS)
    phases = [s.phase for s in _spans(sim)]
    assert phases.count("evaluation") == 8 and "forward" in phases  # the training step's stays one
    analysis = analyse(sim.snapshot(metadata=False))
    assert analysis.verdict == "eval-outputs-kept"
    assert (analysis.target_phase, analysis.target_step) == ("between_steps", 1)


def test_passes_that_keep_their_graphs_stay_forwards():
    # the same loop with autograd on: each pass holds every intermediate (saved for a backward)
    sim = Sim(total_bytes=1 << 30)
    sim.alloc(4 * MiB, MODEL_TO)
    sim.free(sim.alloc(MiB, FORWARD))
    sim.free(sim.alloc(MiB, BACKWARD))
    sim.alloc(MiB, ADAM_STEP)
    for _ in range(4):
        sim.free(sim.alloc(4096, LOSS))
        for _ in range(4):
            sim.alloc(8 * MiB, FORWARD)
    sim.oom(16 * MiB, LOSS)
    assert "evaluation" not in [s.phase for s in _spans(sim)]


def test_one_pass_that_holds_little_is_no_loop():
    # a checkpointed forward holds only its segments' inputs; the OOM in the loss after it: a forward
    sim = Sim(total_bytes=64 * MiB)
    sim.alloc(4 * MiB, MODEL_TO)
    sim.free(sim.alloc(MiB, FORWARD))
    sim.free(sim.alloc(MiB, BACKWARD))
    sim.alloc(MiB, ADAM_STEP)
    for _ in range(4):
        sim.free(sim.alloc(8 * MiB, FORWARD))
    sim.alloc(MiB, FORWARD)
    sim.oom(16 * MiB, LOSS)
    assert "evaluation" not in [s.phase for s in _spans(sim)]


def test_a_teachers_pass_before_the_students_stays_a_forward():
    # knowledge distillation: the teacher's pass (no_grad: it holds its outputs only), then the
    # student's, checkpointed (it holds little too), which a backward follows: the student's trained
    sim = Sim(total_bytes=1 << 30)
    teacher = (*LINEAR, _frame("train.py", "main", 58), LOOP[1])
    for _ in range(2):
        sim.free(sim.alloc(4096, LOSS))
        previous = None
        for _ in range(4):
            intermediate = sim.alloc(8 * MiB, teacher)
            if previous is not None:
                sim.free(previous)
            previous = intermediate
        sim.alloc(MiB, teacher)
        assert previous is not None
        sim.free(previous)
        sim.alloc(MiB, LOSS)  # the loop's code: the teacher's soft targets
        for _ in range(4):
            sim.free(sim.alloc(8 * MiB, FORWARD))
        sim.alloc(MiB, FORWARD)
        sim.alloc(MiB, BACKWARD)
        sim.alloc(MiB, ADAM_STEP)
    assert "evaluation" not in [s.phase for s in _spans(sim)]


def test_a_no_grad_loop_in_a_run_that_never_trains_stays_forwards():
    # an inference script: nothing in the trace trains, so no pass is told apart from a training one
    sim = Sim(total_bytes=64 * MiB)
    sim.alloc(4 * MiB, MODEL_TO)
    for _ in range(4):
        sim.free(sim.alloc(4096, LOSS))
        previous = None
        for _ in range(3):
            intermediate = sim.alloc(8 * MiB, FORWARD)
            if previous is not None:
                sim.free(previous)
            previous = intermediate
        sim.alloc(2 * MiB, FORWARD)
        assert previous is not None
        sim.free(previous)
    assert "evaluation" not in [s.phase for s in _spans(sim)]


# A Lightning step's forward with the user's training_step renamed away: only the closure says it trains
CLOSURE_ONLY_FORWARD = (
    *LINEAR,
    _frame(f"{LIGHTNING}/loops/optimization/automatic.py", "closure"),
    *LIGHTNING_OUTER,
)


def test_a_stack_trains_inside_an_optimizer_s_closure_or_a_training_step():
    from oomdoctor.analysis.phases import trains_by_frames

    assert trains_by_frames(LIGHTNING_FORWARD)  # training_step (and the closure)
    assert trains_by_frames(CLOSURE_ONLY_FORWARD)
    assert trains_by_frames((*LINEAR, _frame(f"{SITE}/transformers/trainer.py", "training_step", 30), *LOOP))
    assert not trains_by_frames((*LINEAR, _frame("train.py", "train_step", 30), *LOOP))  # a script's name
    assert not trains_by_frames(FORWARD)  # a module's forward alone: inference as much as training
    assert not trains_by_frames((*LINEAR, _frame("eval.py", "closure", 5), *LOOP))  # no optimizer calls it
    assert not trains_by_frames(ADAM_STEP)  # the optimizer's own code, no closure
    assert not trains_by_frames(())


@pytest.mark.parametrize("stack", [CLOSURE_ONLY_FORWARD, FORWARD])
def test_an_oom_in_the_first_forward_of_a_closure_trains_and_is_advised_as_training(stack):
    """No backward in the trace yet: the closure alone says the run trains, so the advice is a
    training run's (checkpointing; a smaller micro-batch with accumulation), not a plain smaller batch.
    A plain forward's first pass may or may not train: checkpointing only "if this run trains"."""
    sim = Sim(total_bytes=512 * MiB)
    for _ in range(8):
        sim.alloc(8 * MiB, stack)
    sim.oom(256 * MiB, stack)
    result = analyse(sim.snapshot(metadata=False))
    assert result.target_phase == "forward"
    ids = {r.id for r in result.recommendations}
    conditional = {r.id for r in result.recommendations if r.if_trains}
    if stack is CLOSURE_ONLY_FORWARD:
        assert {"activation-checkpointing", "smaller-micro-batch"} <= ids and "smaller-batch" not in ids
        assert not conditional
    else:
        assert conditional == {"activation-checkpointing"} and "smaller-micro-batch" not in ids


def test_frees_are_read_as_carrying_allocation_stacks_only_where_they_do():
    """zero_grad's released gradients are looked for (`_gradients_released`) only in a trace whose
    frees carry their blocks' allocation stacks (torch 2.0, context="alloc"); where the frees carry
    where they were freed (context="all"), zero_grad's own frees would show it, and the walk is spared."""
    from oomdoctor.analysis.phases import _frees_carry_allocation_stacks
    from oomdoctor.analysis.replay import columns
    from oomdoctor.model import ALLOC, FREE_REQUESTED
    from tests.builders import FORWARD_STACK, USER_STACK, Sim

    def verdict(own_stacks: bool) -> bool:
        sim = Sim()
        for _ in range(4):
            address = sim.alloc(3 << 20, FORWARD_STACK)
            sim.free(address, USER_STACK if own_stacks else None)
        trace = columns(sim.snapshot(metadata=False).traces[0])
        frees = trace.positions(FREE_REQUESTED)
        numbers, stacks = trace.stacks_at(frees)
        return _frees_carry_allocation_stacks(numbers, stacks, trace.stacks_at(trace.positions(ALLOC))[1])

    assert verdict(own_stacks=False) is True
    assert verdict(own_stacks=True) is False


# `optimizer.step(closure)` with SGD and momentum (it makes its buffers in its first step and
# allocates nothing after): the closure runs the forward, `zero_grad(set_to_none=True)` and the
# backward inside the step's frames
SGD_STEP = (
    _frame(f"{TORCH}/optim/sgd.py", "step", 116),
    _frame(f"{TORCH}/optim/optimizer.py", "_use_grad"),
    _frame(f"{TORCH}/optim/optimizer.py", "wrapper"),
    *LOOP,
)
CLOSURE_FORWARD = (*LINEAR, _frame("train.py", "closure", 62), *SGD_STEP)
CLOSURE_BACKWARD = (*BACKWARD[:3], _frame("train.py", "closure", 67), *SGD_STEP)
SGD_MOMENTUM = (_frame(f"{TORCH}/optim/sgd.py", "_multi_tensor_sgd", 454), *SGD_STEP)
BATCH = (_frame("data.py", "make_batch", 74), *LOOP)  # the loop's own code, outside the step


def _closure_steps_as_torch_2_0(steps: int) -> Sim:
    """`steps` iterations of `batch = make_batch(); optimizer.step(closure)`, the last one's forward
    running out, with every free carrying its allocation's stack as torch 2.0 recorded it: the
    frees of zero_grad (between the forward and its backward) and of the step show neither."""
    sim = Sim(total_bytes=1 << 30)
    sim.alloc(16 * MiB, MODEL_TO)
    gradients: list[int] = []
    batch = None
    for step in range(steps):
        if batch is not None:
            sim.free(batch)
        batch = sim.alloc(MiB, BATCH)
        activations = [sim.alloc(8 * MiB, CLOSURE_FORWARD) for _ in range(3)]
        if step == steps - 1:
            sim.oom(512 * MiB, CLOSURE_FORWARD)
            return sim
        for gradient in gradients:  # zero_grad(set_to_none=True): the last step's gradients go
            sim.free(gradient)
        initial = sim.alloc(512, CLOSURE_BACKWARD)  # the loss's initial gradient (_make_grads)
        gradients = [sim.alloc(4 * MiB, ()) for _ in range(4)]  # the engine's thread: no Python frames
        sim.free(initial)
        for activation in activations:
            sim.free(activation)
        if step == 0:
            sim.alloc(16 * MiB, SGD_MOMENTUM)  # the momentum buffers, made in the first step only
    return sim


def test_closure_steps_whose_frees_carry_allocation_stacks_are_cut_where_each_step_returned():
    """torch 2.0 wrote each free with its allocation's stack, so neither zero_grad nor an SGD step
    that allocates nothing shows by its own frames. Inside `optimizer.step(closure)` zero_grad
    falls between the forward and its backward: the gradients a returned backward made, released
    before the next backward, are its window there too. And the loop's own code allocating again
    (the next batch) after the closure's work is where the step had returned: a step ends there,
    its end 'at least' (no mark shows where)."""
    sim = _closure_steps_as_torch_2_0(3)
    spans = _spans(sim)
    assert [(s.phase, s.step) for s in spans if s.phase in ("zero_grad", "between_steps")] == [
        ("between_steps", 1),
        ("zero_grad", 1),
        ("between_steps", 1),  # the zero_grad's last free_completed, before the backward allocates
        ("between_steps", 2),
    ], spans
    result = analyse(sim.snapshot(metadata=False))
    assert (result.target_phase, result.target_step) == ("forward", 2)
    assert len(result.steps) == 3 and all(step.end_at_least for step in result.steps[:2]), result.steps


def test_another_threads_allocation_after_a_closure_s_work_ends_no_step():
    """Only the loop's own code, called from the outermost frame the step was called from, shows
    that the step returned: a DataParallel replica's forward runs on a worker thread (its outermost
    frame the thread's bootstrap, no optimizer frame in its stack) while the closure's pass is
    still going, and ends no step."""
    worker = (
        *LINEAR,
        _frame(f"{TORCH}/nn/parallel/parallel_apply.py", "_worker", 80),
        _frame("/usr/lib/python3.11/threading.py", "run", 975),
        _frame("/usr/lib/python3.11/threading.py", "_bootstrap", 995),
    )
    phases = _run([MODEL_TO, CLOSURE_FORWARD, worker, CLOSURE_FORWARD, CLOSURE_BACKWARD, (), BATCH, CLOSURE_FORWARD])
    assert [step for _, step in phases] == [0, 0, 0, 0, 0, 0, 1, 1], phases
    assert phases[6] == ("between_steps", 1), phases


def test_a_story_that_names_a_step_says_it_is_the_least_where_passes_may_be_steps():
    # the header's "step 1 or later" and the story's "step 1" must not disagree: the story says its
    # step numbers are lower bounds, in the secondary findings too
    from oomdoctor.views.phrasing import summary

    _, _, snapshot = _one_optimizer_step_then_passes(SGD_STEP, temporaries=False)
    analysis = analyse(snapshot)
    story = summary(analysis.summary)
    assert "step 1" in story
    assert "Step numbers are the least the trace shows" in story
    assert all(
        "Step numbers are the least the trace shows" in summary(f.summary)
        for f in analysis.secondary
        if re.search(r"\b[Ss]tep \d", summary(f.summary))
    )


def test_the_span_of_an_event_is_the_last_one_starting_at_or_before_it():
    spans = [PhaseSpan(5, 9, "forward", 0, "markers"), PhaseSpan(10, 20, "backward", 0, "markers")]
    index = PhaseIndex(spans)
    assert [index.span_of(i) for i in (5, 9, 10, 20, 25)] == [spans[0], spans[0], spans[1], spans[1], spans[1]]
    assert index.span_of(0) is spans[0] and index.span_of(-3) is spans[0]  # before the first: the first
    assert PhaseIndex([]).span_of(3) is None
