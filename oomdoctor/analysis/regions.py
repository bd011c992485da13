"""Where activation checkpointing would cut a forward, read from the live activations' stacks.

A user checkpoints a model's repeated blocks: the layers a transformer's forward calls in a loop,
the blocks of a ModuleList. In a stack those are one call site (the same line of the same caller,
reached through the same outer calls) inside a module's forward, calling a module whose forward is
not torch's own (a Linear, a GELU, a Sequential: a region of those the file cannot bound). Each call
of it is a region; a new one begins where the called forward's line goes back (an earlier line of
the same forward) or another forward is called there, the called forward read past a wrapper that
Module.__call__ ran instead (accelerate's `new_forward`). Blocks made at the same line belong to the
same call (a sublayer's several outputs). Every such site counts that lies inside no other one's
region (a U-Net's down and up loops are two; the experts a layer loops over are the layer's).

Checkpointed, a region keeps only its input, the previous region's output (its latest live block
here; the first region's input is made before the regions and stays), and the backward recomputes
one region at a time, the largest at most, once it has freed what the pass made after the regions.
So checkpointing saves what the regions hold, less their inputs and the largest region beyond what
came after them. A graph an earlier pass kept (a leak's `retain_graph`) shrinks to its regions'
inputs too, and is never recomputed at the same time as the judged pass's region.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from oomdoctor.analysis.frame_kinds import TORCH, frame_kind, in_activation_checkpoint, is_python_source
from oomdoctor.analysis.results import LiveBlock
from oomdoctor.model import Frame, Stack

# the frames torch's Module.__call__ runs a forward through (and capture's own wrapper of it)
_DISPATCH_NAMES = frozenset({"_wrapped_call_impl", "_call_impl", "inner", "module_call"})
_TORCH_MODULES = "torch/nn/modules/"


@dataclass(frozen=True, slots=True)
class Regions:
    """The checkpointable regions of the live activations (`checkpoint_regions`)."""

    sites: tuple[Frame, ...]  # the lines that call the regions (the callers' frames), outermost first
    count: int  # regions of the judged pass
    held_bytes: int  # live activations the regions made (the judged pass's and earlier passes' kept ones)
    inputs_bytes: int  # what checkpointing keeps of them: each region's input
    largest_bytes: int  # the judged pass's largest region, recomputed whole in the backward
    pass_held_bytes: int  # of `held_bytes`, the judged pass's
    pass_inputs_bytes: int  # of `inputs_bytes`, the judged pass's
    # the judged pass's live activations made after its last region (the head, the logits, the loss):
    # the backward frees them before it recomputes a region
    after_bytes: int

    @property
    def pass_saved_bytes(self) -> int:
        """What checkpointing saves of the judged pass at the higher of its two peaks: the forward's
        end (everything else, and the regions' inputs) and a region's recomputation in the
        backward (the largest, where what came after the regions is freed already)."""
        recomputed = max(0, self.largest_bytes - self.after_bytes)
        return max(0, self.pass_held_bytes - self.pass_inputs_bytes - recomputed)

    @property
    def earlier_saved_bytes(self) -> int:
        """What checkpointing saves of the graphs earlier passes kept: all but their regions' inputs."""
        return max(0, self.held_bytes - self.pass_held_bytes - (self.inputs_bytes - self.pass_inputs_bytes))

    @property
    def saved_bytes(self) -> int:
        return self.pass_saved_bytes + self.earlier_saved_bytes


def _dispatch(frame: Frame) -> bool:
    return frame.name in _DISPATCH_NAMES and frame_kind(frame) == TORCH


def _calls(stack: Stack) -> tuple[tuple[Frame, ...], tuple[int, ...]] | None:
    """A stack's Python frames outermost first, the module dispatch frames left out, and the
    positions of the frames a module call entered (each forward Module.__call__ ran); None for a
    stack made inside an activation-checkpointed region (it is checkpointed already)."""
    frames: list[Frame] = []
    entered: list[int] = []
    after_dispatch = False
    for frame in reversed(stack):
        if in_activation_checkpoint(frame.filename):
            return None
        if not is_python_source(frame):
            continue
        if _dispatch(frame):
            after_dispatch = True
            continue
        if after_dispatch and frames:
            entered.append(len(frames))
        after_dispatch = False
        frames.append(frame)
    return tuple(frames), tuple(entered)


def _restarts(before: Frame, now: Frame) -> bool:
    """Whether an allocation whose called forward is at frame `now` begins another call than the
    allocation at `before`: another forward, or an earlier line of the same one. Only the called
    frame is read: deeper frames of the same file and name may be other functions (every module's
    method is `forward`)."""
    return (before.filename, before.name) != (now.filename, now.name) or now.line < before.line


def _called_forward(call: tuple[Frame, ...]) -> Frame:
    """The forward a module call ran: the first frame of the call (before any module it calls in
    turn) named `forward`, past a wrapper that Module.__call__ ran instead (accelerate's hooks'
    `new_forward`, which calls the module's own), else the call's first frame."""
    return next((frame for frame in call if frame.name == "forward"), call[0])


@dataclass
class _Site:
    caller: Frame
    # per pass (step): its regions in allocation order, each [bytes, latest block's bytes, latest index]
    passes: dict[int | None, list[list[int]]]
    members: set[int]  # the allocation indices of its regions' blocks
    last: dict[int | None, Frame]  # per pass, the latest block's called frame


def _sites_of(stack: Stack, sites: dict[tuple[Frame, ...], _Site]) -> list[tuple[_Site, Frame]]:
    """The call sites a stack runs through (registered in `sites` by the frames that lead to them),
    each with the forward it called there; none for a stack inside a checkpointed region, outside
    any module call but the model's own, or in a torch module's forward."""
    calls = _calls(stack)
    if calls is None:
        return []
    frames, entered = calls
    found = []
    ends = (*entered[2:], len(frames))  # each call runs until the next module call it makes
    for position, end in zip(entered[1:], ends, strict=False):  # the outermost call is the model's: no region
        callee = _called_forward(frames[position:end])
        if _TORCH_MODULES in callee.filename.replace("\\", "/"):
            continue  # a torch module's forward (a layer, a Sequential): its calls cannot be told apart
        prefix = frames[:position]
        site = sites.get(prefix)
        if site is None:
            site = sites[prefix] = _Site(frames[position - 1], {}, set(), {})
        found.append((site, callee))
    return found


def checkpoint_regions(blocks: Iterable[LiveBlock], step: int | None) -> Regions | None:
    """The regions of the live activation blocks `blocks` (allocated in the trace, the judged
    pass `step`'s and earlier ones'), at each call site that calls a region more than once in the
    judged pass and is not inside another such site's region (a model's down and up blocks are two
    sites; the experts a layer loops over are part of the layer's region); None where none does (no
    stacks, one region, only torch's own modules)."""
    ordered = sorted((b for b in blocks if b.alloc_index is not None), key=lambda b: b.alloc_index or 0)
    sites: dict[tuple[Frame, ...], _Site] = {}
    read: dict[int, tuple[Stack, list[tuple[_Site, Frame]]]] = {}  # id of a stack -> its calls (stacks are shared)
    for block in ordered:
        known = read.get(id(block.frames))
        if known is None or known[0] is not block.frames:
            known = read[id(block.frames)] = (block.frames, _sites_of(block.frames, sites))
        for site, callee in known[1]:
            regions = site.passes.setdefault(block.step, [])
            before = site.last.get(block.step)
            if before is None or _restarts(before, callee):
                regions.append([0, 0, -1])
            region = regions[-1]
            region[0] += block.size_bytes
            region[1], region[2] = block.size_bytes, block.alloc_index or 0
            site.members.add(block.alloc_index or 0)
            site.last[block.step] = callee
    candidates = sorted(
        ((prefix, site) for prefix, site in sites.items() if len(site.passes.get(step, ())) >= 2),
        key=lambda item: len(item[0]),
    )
    chosen: list[tuple[tuple[Frame, ...], _Site]] = []
    for prefix, site in candidates:  # the outermost: a loop inside a region is part of it
        if not any(prefix[: len(outer)] == outer for outer, _ in chosen):
            chosen.append((prefix, site))
    if not chosen:
        return None
    held = inputs = pass_held = pass_inputs = largest = end = 0
    members: set[int] = set()
    for _, site in chosen:
        for pass_step, regions in site.passes.items():
            kept = sum(r[1] for r in regions[:-1])  # each region's output is the next one's input
            held += sum(r[0] for r in regions)
            inputs += kept
            if pass_step == step:
                pass_held += sum(r[0] for r in regions)
                pass_inputs += kept
                largest = max(largest, *(r[0] for r in regions))
                end = max(end, regions[-1][2])
        members |= site.members
    after = sum(
        b.size_bytes
        for b in ordered
        if b.step == step and (b.alloc_index or 0) > end and (b.alloc_index or 0) not in members
    )
    return Regions(
        sites=tuple(site.caller for _, site in chosen),
        count=sum(len(site.passes[step]) for _, site in chosen),
        held_bytes=held,
        inputs_bytes=inputs,
        largest_bytes=largest,
        pass_held_bytes=pass_held,
        pass_inputs_bytes=pass_inputs,
        after_bytes=after,
    )
