"""Whose code a frame of an allocation stack is, and which frame is the user's line.

One set of rules for the attribution's source line (`attribution.source_line`), the terminal
app's stacks and the Markdown report's (`views/frames.py`), so that the line a block is labelled
with is the line its stack starts at.

torch writes a stack innermost frame first. With `stacks="all"` it holds C++ frames too: the
unwinder and the caching allocator that recorded it, torch's operators and autograd, CPython's
eval loop between every two Python frames, libc's start. A Python frame has a `.py` file (or is a
notebook cell); everything else is read by its function name, as torch's own `_memory_viz` does.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any, TypeVar

from oomdoctor.model import Frame, Stack, slashed

USER = "user"  # the user's own Python code, notebook cells included
LIBRARY = "library"  # an installed package other than torch (transformers, timm, lightning...)
TORCH = "torch"  # torch's Python code (and oomdoctor's own capture hooks)
STDLIB = "stdlib"  # the standard library, frozen modules, generated code (`<string>`)
NATIVE = "native"  # C++ of torch and its libraries: operators, dispatch, autograd, kernels
INTERPRETER = "interpreter"  # CPython's eval loop and call machinery, libc's start, thread entry
UNWINDER = "unwinder"  # the unwinder and the caching allocator that recorded the stack

PYTHON_KINDS = frozenset({USER, LIBRARY, TORCH, STDLIB})
NATIVE_KINDS = frozenset({NATIVE, INTERPRETER, UNWINDER})

_PACKAGE_MARKERS = ("/site-packages/", "/dist-packages/")
_STDLIB_MARKERS = ("<frozen", "/lib/python")
_TORCH_MARKERS = ("/torch/", "/oomdoctor/capture/")
# The frames that record a stack and the allocator's own (torch's _memory_viz omits the first ones
# too): what every stack of a `stacks="all"` dump starts with, whatever allocated.
_UNWINDER_NAMES = re.compile(
    r"unwind::unwind|CapturedTraceback::|gather_with_cpp|CachingAllocator::|c10::cuda::|c10::hip::"
    r"|CUDAAllocatorConfig|^c10::Allocator|^c10::StorageImpl"
)
# CPython's call machinery (`_PyEval_EvalFrameDefault`, `PyObject_Call`, `method_vectorcall`,
# `slot_tp_call`, ...), its start (`Py_RunMain`, `pyrun_file`), libc's and the threads' entry.
_INTERPRETER_NAMES = re.compile(
    r"^_?Py|^cfunction_|^method_vectorcall|^slot_tp_|^vectorcall|^run_mod|^run_eval_code|^pyrun_|^pymain_"
    r"|^builtin_|^function_code_fastcall|^_start$|^__libc_start|^clone\d*$|^__clone|^start_thread"
    r"|^pthread_|^execute_native_thread_routine"
)
_INTERPRETER_FILES = ("ceval.c", "pythonrun.c", "Modules/main.c", "Objects/call.c", "Objects/methodobject.c")


def is_notebook_cell(filename: str) -> bool:
    return filename.startswith("<ipython-input") or "/ipykernel_" in filename or filename.startswith("<cell")


def in_torch_optim(filename: str) -> bool:
    """Whether a frame's file is torch.optim's (an optimizer's code, its schedulers, swa_utils)."""
    return "torch/optim/" in slashed(filename)


# torch.utils.checkpoint's own file: a frame of it runs inside an activation-checkpointed region
_ACTIVATION_CHECKPOINT_FILE = "torch/utils/checkpoint.py"


def in_activation_checkpoint(filename: str) -> bool:
    """Whether a frame's file is torch.utils.checkpoint's (activation checkpointing: a checkpointed
    region's forward or its recomputation in backward; it saves no checkpoint to disk)."""
    return slashed(filename).endswith(_ACTIVATION_CHECKPOINT_FILE)


def is_python_source(frame: Frame) -> bool:
    """A frame of a `.py` file: one that can be the user's line (a notebook cell aside)."""
    return frame.path.endswith(".py")


def frame_kind(frame: Frame) -> str:
    """USER, LIBRARY, TORCH, STDLIB (Python), NATIVE, INTERPRETER or UNWINDER (C++)."""
    return _kind(frame.filename, frame.name, frame.line > 0)


@functools.lru_cache(maxsize=1 << 16)
def _kind(filename: str, name: str, has_line: bool) -> str:
    """frame_kind of one (file, function): a dump repeats the same few thousand frames in every
    stack, so each is read once (the C++ names go through two regular expressions)."""
    filename = slashed(filename)
    if is_notebook_cell(filename):
        return USER
    if filename.endswith(".py"):
        if any(marker in filename for marker in _TORCH_MARKERS):
            return TORCH
        if any(marker in filename for marker in _PACKAGE_MARKERS):
            return LIBRARY
        if any(marker in filename for marker in _STDLIB_MARKERS):
            return STDLIB
        return USER
    if filename.startswith("<") and has_line:  # <frozen runpy>, <string>, fx's <eval_with_key>
        return STDLIB
    name = name.strip()
    if _UNWINDER_NAMES.search(name):
        return UNWINDER
    if _INTERPRETER_NAMES.search(name) or any(filename.endswith(file) for file in _INTERPRETER_FILES):
        return INTERPRETER
    return NATIVE


# Stacks each function of one `per_stack` remembers, at most; past that it starts again.
STACKS_KEPT = 1 << 16

_Result = TypeVar("_Result")


def per_stack(function: Callable[..., _Result]) -> Callable[..., _Result]:
    """`function(stack, *rest)` worked out once per stack (and `rest`, hashable values): remembered
    by the stack's identity (with the stack itself, so that the identity stays its own), for at
    most STACKS_KEPT stacks.

    A dump's blocks and events share their stack tuples (the loader makes one per distinct stack),
    so what a rule reads in a stack is read once per distinct stack, not once per block or event
    that has it: a dump of 100,000 live blocks over a few hundred stacks. The function must be pure
    and return something nobody changes (a bool, a str, a tuple)."""
    kept: dict[Any, tuple[Stack, _Result]] = {}

    def remembered(stack: Stack, *rest: Any) -> _Result:
        key = (id(stack), *rest) if rest else id(stack)
        entry = kept.get(key)
        if entry is not None and entry[0] is stack:
            return entry[1]
        result = function(stack, *rest)
        if len(kept) >= STACKS_KEPT:
            kept.clear()
        kept[key] = (stack, result)
        return result

    return functools.update_wrapper(remembered, function)


@per_stack  # every view labels each block by its lead frame (some views more than once)
def lead_frame_index(stack: Stack) -> int | None:
    """The position of the frame that stands for where a block was allocated: the innermost frame
    of the user's own Python code.

    A notebook cell is the user's code too, but one cell line calls the whole model: there the
    innermost frame of a model library (an installed package other than torch) inside that call
    says more, and stands in for it. Without a user frame, the innermost model-library frame
    stands in, else the innermost Python frame (torch's); None when the stack has no Python frame.
    """
    library = None
    fallback = None
    for position, frame in enumerate(stack):
        kind = frame_kind(frame)
        if kind == USER:
            if is_notebook_cell(frame.path) and library is not None:
                return library
            return position
        if kind in PYTHON_KINDS and is_python_source(frame):
            if fallback is None:
                fallback = position
            if kind == LIBRARY and library is None:
                library = position
    return library if library is not None else fallback
