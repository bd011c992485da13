"""Which stacks save a checkpoint: code that builds a state dict or writes one (a frame's file or
function name), and not code that loads one. Read by attribution (a save's copies are no model
state) and by the checkpoint-gather verdict."""

from __future__ import annotations

import functools

from oomdoctor.analysis.frame_kinds import in_activation_checkpoint, per_stack
from oomdoctor.model import Frame, Stack

_DCP_FILES = "torch/distributed/checkpoint/"
_AUTOGRAD_FILES = "torch/autograd/"
_SAVE_TOKENS = frozenset({"save", "saving"})
# what a save must name to be a checkpoint's: a bare "save" is as often a hook's (`save_output`,
# `save_activation`, `save_features`: feature extraction and interpretability code keeps tensors so)
_SAVED_THINGS = frozenset({"checkpoint", "ckpt", "model", "state", "weights", "pretrained", "snapshot", "params"})
_WRITE_TOKENS = frozenset({"dump", "write", "store"})
_LOAD_TOKENS = frozenset({"load", "loading", "restore", "resume"})


def _tokens(name: str) -> set[str]:
    return {part for part in name.lower().split("_") if part}


@functools.lru_cache(maxsize=65536)  # a frame recurs in every stack that holds it: read it once
def _saves(frame: Frame) -> bool:
    """A frame of code that saves a checkpoint or builds a state dict: torch.distributed.checkpoint,
    or a function whose name says so (FSDP's `_full_post_state_dict_hook`, `get_model_state_dict`,
    accelerate's `get_state_dict` and `save_state`, DeepSpeed's `save_checkpoint` and
    `_zero3_consolidated_16bit_state_dict`, transformers' `save_model` and `save_pretrained`, a
    user's `save_checkpoint`): a save of a checkpoint, a model, its state or weights, not a hook's.
    Not autograd's saved tensors, and not activation checkpointing (`torch/utils/checkpoint.py`)."""
    filename = frame.path
    if _AUTOGRAD_FILES in filename or in_activation_checkpoint(filename):
        return False
    if _DCP_FILES in filename:
        return True
    tokens = _tokens(frame.name)
    if "backward" in tokens:  # ctx.save_for_backward
        return False
    if "state_dict" in frame.name.lower() or (tokens & _SAVE_TOKENS and tokens & _SAVED_THINGS):
        return True
    return "checkpoint" in tokens and bool(tokens & _WRITE_TOKENS)


@functools.lru_cache(maxsize=65536)
def _loads(frame: Frame) -> bool:
    """A frame of code that loads a checkpoint (`load_state_dict`, `set_model_state_dict`, FSDP's
    `_full_pre_load_state_dict_hook`, `from_pretrained`, a resume): its copies are not a save's."""
    name = frame.name.lower()
    tokens = _tokens(name)
    return (
        bool(tokens & _LOAD_TOKENS)
        or {"from", "pretrained"} <= tokens
        or (name.startswith("set_") and "state_dict" in name)
    )


@per_stack
def save_frame(stack: Stack) -> Frame | None:
    """The outermost frame of `stack` that saves a checkpoint, or None when the stack saves none
    (or loads one)."""
    if any(_loads(frame) for frame in stack):
        return None
    return next((frame for frame in reversed(stack) if _saves(frame)), None)
