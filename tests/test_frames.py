"""The frame filter (views/frames.py) and the label shortening (views/shorten.py) shared by the
Markdown report and the terminal app."""

from __future__ import annotations

import pytest

from oomdoctor.analysis.attribution import source_line
from oomdoctor.analysis.frame_kinds import (
    INTERPRETER,
    LIBRARY,
    NATIVE,
    STDLIB,
    TORCH,
    UNWINDER,
    USER,
    frame_kind,
    lead_frame_index,
)
from oomdoctor.load import load
from oomdoctor.model import Frame
from oomdoctor.pipeline import render_report
from oomdoctor.views.frames import BASIS_LIBRARY, BASIS_NATIVE, BASIS_PYTHON, BASIS_USER, shown_frames
from oomdoctor.views.shorten import ELLIPSIS, PathStyle, common_directory, elide_middle, frame_label, shorten_name

ENV = "/home/zeus/miniconda3/envs/cloud/lib/python3.10/site-packages"
PROJECT = "/teamspace/studios/this_studio/diffusion/src"


def cpp(name: str, filename: str = "??") -> Frame:
    return Frame(filename, 0, name)


# A `stacks="all"` stack as torch 2.x records one (shortened from a real snapshot's 233 frames):
# the unwinder and the allocator, an operator, CPython between every two Python frames, torch's
# Module.__call__, a model library, then the user's model and training script.
UNWINDER_FRAMES = (
    cpp("torch::unwind::unwind()"),
    cpp("torch::CapturedTraceback::gather(bool, bool, bool)"),
    cpp("torch::cuda::(anonymous namespace)::gather_with_cpp()", "memory_snapshot.cpp"),
    cpp("c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(int, unsigned long)"),
)
OPERATOR = cpp("at::(anonymous namespace)::wrapper_CUDA_gelu(at::Tensor const&)", "RegisterCUDA.cpp")
EVAL = cpp("_PyEval_EvalFrameDefault")
CALL = cpp("PyObject_Call")
VECTORCALL = cpp("method_vectorcall", "")
ACTIVATION = Frame(f"{ENV}/torch/nn/modules/activation.py", 682, "forward")
CALL_IMPL = Frame(f"{ENV}/torch/nn/modules/module.py", 1561, "_call_impl")
TIMM = Frame(f"{ENV}/timm/layers/mlp.py", 45, "forward")
DIT = Frame(f"{PROJECT}/models/nets/dit.py", 126, "forward")
DIT_OUTER = Frame(f"{PROJECT}/models/nets/dit.py", 249, "forward")
TRAIN = Frame(f"{PROJECT}/train.py", 95, "train")
MAIN_START = (cpp("Py_BytesMain"), cpp("__libc_start_main"), cpp("_start"))
STACK = (
    *UNWINDER_FRAMES,
    OPERATOR,
    cpp("cfunction_call", ""),
    ACTIVATION,
    EVAL,
    VECTORCALL,
    CALL_IMPL,
    EVAL,
    CALL,
    TIMM,
    EVAL,
    CALL_IMPL,
    EVAL,
    DIT,
    EVAL,
    CALL_IMPL,
    EVAL,
    DIT_OUTER,
    EVAL,
    Frame("<frozen runpy>", 198, "_run_module_as_main"),
    TRAIN,
    EVAL,
    *MAIN_START,
)


def test_frames_are_told_apart_by_whose_code_they_are():
    assert {frame_kind(f) for f in UNWINDER_FRAMES} == {UNWINDER}
    assert frame_kind(OPERATOR) == NATIVE
    assert {frame_kind(f) for f in (EVAL, CALL, VECTORCALL, *MAIN_START)} == {INTERPRETER}
    assert frame_kind(ACTIVATION) == frame_kind(CALL_IMPL) == TORCH
    assert frame_kind(TIMM) == LIBRARY
    assert frame_kind(Frame("<frozen runpy>", 198, "_run_module_as_main")) == STDLIB
    assert frame_kind(Frame("/usr/lib/python3.11/threading.py", 1, "run")) == STDLIB
    assert frame_kind(DIT) == frame_kind(TRAIN) == USER
    assert frame_kind(Frame("C:\\work\\proj\\train.py", 3, "main")) == USER
    assert frame_kind(Frame("<ipython-input-3-0f2b>", 2, "<module>")) == USER


def test_the_stack_starts_at_the_users_line_and_counts_what_it_hides():
    shown = shown_frames(STACK)
    assert shown.frames == (DIT, DIT_OUTER, TRAIN)  # the user's line, then its callers
    assert shown.basis == BASIS_USER
    assert shown.hidden == len(STACK) - 3 and shown.total == len(STACK)
    assert set(shown.hidden_kinds) == {UNWINDER, NATIVE, INTERPRETER, TORCH, LIBRARY, STDLIB}
    assert shown.hidden_words() == f"{len(STACK) - 3} torch, library and C++ frames"
    # the frame the block is labelled with is the one its stack starts at
    assert source_line(STACK) == f"{DIT.filename}:{DIT.line} in {DIT.name}"
    everything = shown_frames(STACK, all_frames=True)
    assert everything.frames == STACK and everything.hidden == 0


def test_nothing_hidden_says_nothing():
    shown = shown_frames((DIT, TRAIN))
    assert shown.frames == (DIT, TRAIN) and shown.hidden == 0 and shown.hidden_words() == ""
    assert shown_frames((ACTIVATION, DIT)).hidden_words() == "1 torch frame"


def test_without_a_user_frame_the_model_library_then_python_then_cpp_frames_stand_in():
    library_only = tuple(f for f in STACK if frame_kind(f) != USER)
    shown = shown_frames(library_only)
    assert shown.basis == BASIS_LIBRARY and shown.frames[0] == TIMM
    assert source_line(library_only) == f"{TIMM.filename}:{TIMM.line} in {TIMM.name}"

    torch_only = tuple(f for f in library_only if frame_kind(f) != LIBRARY)
    shown = shown_frames(torch_only)
    assert shown.basis == BASIS_PYTHON and shown.frames[0] == ACTIVATION
    assert all(frame_kind(f) in (TORCH, STDLIB) for f in shown.frames)
    assert source_line(torch_only) == f"{ACTIVATION.filename}:{ACTIVATION.line} in {ACTIVATION.name}"

    # a backward on autograd's thread: C++ only; the unwinder and the interpreter still hidden
    native = (*UNWINDER_FRAMES, OPERATOR, cpp("torch::autograd::Engine::thread_main()"), cpp("clone"))
    shown = shown_frames(native)
    assert shown.basis == BASIS_NATIVE and shown.frames == native[4:6] and shown.hidden == 5
    assert source_line(native) is None and lead_frame_index(native) is None

    # never empty while there are frames
    for stack in ((EVAL, CALL), UNWINDER_FRAMES, (Frame("<string>", 1, "<module>"),)):
        assert shown_frames(stack).frames


def test_in_a_notebook_the_model_library_inside_the_cell_comes_first():
    cell = Frame("/tmp/ipykernel_4242/1234567.py", 3, "<module>")
    shown = shown_frames((ACTIVATION, TIMM, CALL_IMPL, cell))
    assert shown.frames == (TIMM, cell) and shown.basis == BASIS_USER
    assert source_line((ACTIVATION, TIMM, CALL_IMPL, cell)).startswith(f"{TIMM.filename}:45")


# --- shortening -------------------------------------------------------------------------------


def test_the_directory_shared_by_the_users_files_is_stripped():
    assert common_directory([DIT.filename, TRAIN.filename]) == f"{PROJECT}/"
    assert common_directory(["/a/x.py", "/b/y.py"]) == ""  # only the root: nothing worth stripping
    assert common_directory(["fixtures/scenarios/a.py", "fixtures/b.py"]) == "fixtures/"
    style = PathStyle.of_stacks([STACK, (TRAIN,)])
    assert style.prefix == f"{PROJECT}/"  # torch's and timm's files do not widen it
    assert style.path(DIT.filename) == "models/nets/dit.py"
    assert style.path(CALL_IMPL.filename) == "torch/nn/modules/module.py"  # from the package on
    assert style.frame(DIT) == "models/nets/dit.py:126 in forward"


def test_long_labels_lose_their_middle_and_keep_file_line_and_tail():
    path = "models/components/nets/transformers/dit.py"
    for width in (60, 40, 30, 24, 12, 5):
        label = frame_label(path, 126, "forward", width)
        assert "dit.py:126" in label, label  # always, even past the width
        assert len(label) <= max(width, len("…/dit.py:126")), label
    assert frame_label(path, 126, "forward", 200) == f"{path}:126 in forward"
    # whole folders go, those nearest the file kept first
    assert frame_label(path, 126, "forward", 36) == "…/transformers/dit.py:126 in forward"
    assert frame_label(path, 126, "forward", 30) == "models/…/dit.py:126 in forward"
    assert frame_label(path, 125, "forward", 30) != frame_label(path, 126, "forward", 30)
    assert frame_label(path, 126, "training_step_with_a_long_name", 30).startswith("…/dit.py:126 in train")
    name = "model.body.2.weight.exp_avg_sq"
    short = shorten_name(name, 20)
    assert len(short) == 20 and ELLIPSIS in short and short.endswith("exp_avg_sq") and short.startswith("model.")
    assert shorten_name("model.body.2.weight.exp_avg", 20) != short
    assert elide_middle("abc", 10) == "abc" and elide_middle("abcdefghij", 5) == "ab…ij"
    assert "\x1b" not in shorten_name("model.\x1b[2Jweight", 12)  # made printable before cut


# --- the Markdown report on a real `stacks="all"` snapshot ----------------------------------------


def _markdown_stacks(markdown: str) -> list[list[str]]:
    """The lines of each block's stack (the fenced blocks after the largest blocks' table)."""
    stacks, current = [], None
    for line in markdown[markdown.index("<details>") :].splitlines():
        if line == "```":
            if current is None:
                current = []
            else:
                stacks.append(current)
                current = None
        elif current is not None:
            current.append(line)
    return stacks


@pytest.mark.parametrize(
    "name",
    ["oom_action__nesta_discrete_diffusion__memory_snapshot.json", "segments_only_26GB__verl__mem.pickle"],
)
def test_markdown_stacks_of_a_cpp_snapshot_start_at_a_python_user_frame(corpus_dir, name):
    snapshot = load(corpus_dir / "snapshots" / name)
    frames = {f.filename for s in snapshot.segments for b in s.blocks for f in b.frames}
    assert any(not f.endswith(".py") for f in frames)  # C++ frames are there to hide
    stacks = _markdown_stacks(render_report(snapshot, "md").decode())
    assert stacks
    user_files = {f for f in frames if frame_kind(Frame(f, 1, "f")) == USER}
    for lines in stacks:
        first = lines[0]
        assert ".py:" in first, first
        assert first.split(".py:", 1)[0] + ".py" in user_files, first
        assert lines[-1].endswith("frames hidden)")
