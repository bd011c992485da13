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

Where no forward calls such blocks but a Sequential of torch's own modules loops over them (an MLP,
a CNN's stages), or a line of the user's own does, `sequential_regions` reads each module call as a
region and cuts them as checkpoint_sequential would (its last segment unchecked), or checkpoints
them whole.

Read at the judged moment, the figure knows neither what an interrupted pass's rest calls nor what
the backward holds beside each recomputation: where the trace holds a completed pass of the same
forward, analysis/passes.py replays it checkpointed (`Regions.spans` say where each region begins,
ends and what it keeps); where it does not, `Regions.pass_saved_beside` counts the gradients the
backward has yet to make beside the largest region's recomputation.
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
    # the segments of a Sequential of torch's own modules (`sequential_regions`): of `pass_held_bytes`,
    # what its last segment holds, which checkpoint_sequential runs without checkpointing
    unchecked_bytes: int = 0
    sequential: bool = False  # the regions are such segments, not the blocks a forward calls
    loops: int = 0  # of `sites`, the user's own lines that loop over torch's modules (not a Sequential's callers)
    # the judged pass's checkpointed regions, each (its first allocation's index, its last's, its
    # output's: the block it keeps), in allocation order: what `passes.checkpoint_replay` replays
    spans: tuple[tuple[int, int, int], ...] = ()

    @property
    def pass_saved_bytes(self) -> int:
        """What checkpointing saves of the judged pass at the higher of its two peaks: the forward's
        end (everything else, the regions' inputs and the segment run unchecked) and a region's
        recomputation in the backward (the largest, where what came after the regions, and the
        unchecked segment, is freed already)."""
        return self.pass_saved_beside(0)

    def pass_saved_beside(self, beside_bytes: int) -> int:
        """`pass_saved_bytes` where the backward holds `beside_bytes` more than at the judged moment
        beside a region's recomputation (the gradients it made since)."""
        recomputed = max(self.unchecked_bytes, self.largest_bytes + beside_bytes - self.after_bytes, 0)
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
    # per pass (step): its regions in allocation order, each [bytes, latest block's bytes, latest
    # index, first index]
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
        if _TORCH_MODULES in callee.path:
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
                regions.append([0, 0, -1, block.alloc_index or 0])
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
    spans = sorted(
        (region[3], following[3] - 1 if following is not None else region[2], region[2])
        for _, site in chosen
        for region, following in zip(site.passes[step], [*site.passes[step][1:], None], strict=True)
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
        spans=tuple(spans),
    )


_CONTAINER = "torch/nn/modules/container.py"


@dataclass
class _Sequence:
    caller: Frame  # the line that called the Sequential, or the user's line that loops over the modules
    loop: bool  # a line of the user's own, not a Sequential's forward
    # per pass (step): the module calls in allocation order, each [live bytes, output's bytes, latest
    # index, the called forward's number in `kinds`, first index (its output's)]
    passes: dict[int | None, list[list[int]]]
    last: dict[int | None, Frame]  # per pass, the latest block's called forward
    kinds: dict[tuple[str, str], int]  # the forwards it called (file, name), numbered
    members: set[int]  # the allocation indices of its calls' live blocks


def _is_container(frame: Frame) -> bool:
    return frame.name == "forward" and frame.path.endswith(_CONTAINER)


def _sequences_of(
    stack: Stack, sequences: dict[tuple[Frame, ...], _Sequence], bare: set[tuple[Frame, ...]]
) -> list[tuple[_Sequence, Frame]]:
    """The lines a stack runs through that call torch's own modules (a Sequential's forward's loop
    over its modules, torch/nn/modules/container.py, or a line of the user's own), outermost first,
    each registered in `sequences` by the frames that lead to it, with the forward of the module it
    called there; none inside a checkpointed region, and none within a module of the user's own
    that the model calls (a transformer block's MLP: a user checkpoints the block, which one call
    does not bound). A stack made at a user's line itself, in no module call, is added to `bare`
    (that line's work between calls, which its calls do not hold)."""
    calls = _calls(stack)
    if calls is None:
        return []
    frames, entered = calls
    line = len(frames)  # the stack's innermost frame of the user's own (past torch's functions it called)
    while line > 0 and frame_kind(frames[line - 1]) == TORCH:
        line -= 1
    if not any(position >= line for position in entered):  # made there, in no module call
        bare.add(frames[:line])
    found: list[tuple[_Sequence, Frame]] = []
    ends = (*entered[1:], len(frames))
    own = 0  # the modules of the user's own (not torch's) the stack called so far
    for position, end in zip(entered, ends, strict=False):  # no module call: none
        callee = _called_forward(frames[position:end])
        ours = _TORCH_MODULES in callee.path
        loop = frames[position - 1]
        if ours and position >= 2 and (_is_container(loop) or frame_kind(loop) != TORCH):
            prefix = frames[:position]
            sequence = sequences.get(prefix)
            if sequence is None:
                user = not _is_container(loop)
                caller = loop if user else frames[position - 2]
                sequence = sequences[prefix] = _Sequence(caller, user, {}, {}, {}, set())
            found.append((sequence, callee))
        if not ours:
            own += 1
            if own > 1:
                return found  # within a block of the model's: checkpointed with the block
        elif not _is_container(callee):
            return found  # inside a torch module's own forward (a layer): its calls are its own
    return found


def _segments(calls: list[list[int]], count: int) -> list[list[list[int]]]:
    """`calls` cut as checkpoint_sequential cuts a Sequential's modules into `count` segments:
    each of len // count calls, the last one the rest."""
    size = len(calls) // count
    return [calls[i * size : (i + 1) * size] for i in range(count - 1)] + [calls[(count - 1) * size :]]


@dataclass(frozen=True, slots=True)
class _Cut:
    count: int
    held: int
    inputs: int
    largest: int
    unchecked: int
    spans: tuple[tuple[int, int, int], ...]  # its checkpointed segments' (`Regions.spans`)


def _cut(calls: list[list[int]], count: int) -> _Cut:
    """One pass's module calls in `count` segments: with one, the Sequential checkpointed whole
    (torch.utils.checkpoint.checkpoint), keeping its input (made before it) and its output (what
    came after uses it); with more, checkpoint_sequential, which checkpoints each segment but the
    last, keeping each one's input (the previous one's output) and the last segment whole."""
    held = sum(call[0] for call in calls)
    if count == 1:
        return _Cut(1, held, calls[-1][1], held, 0, ((calls[0][4], calls[-1][2], calls[-1][4]),))
    segments = _segments(calls, count)
    inputs = sum(segment[-1][1] for segment in segments[:-1])
    largest = max(sum(call[0] for call in segment) for segment in segments[:-1])
    spans = tuple(
        (segment[0][4], following[0][4] - 1, segment[-1][4])
        for segment, following in zip(segments[:-1], segments[1:], strict=True)
    )
    return _Cut(count, held, inputs, largest, sum(call[0] for call in segments[-1]), spans)


def sequential_regions(
    blocks: Iterable[LiveBlock], step: int | None, freed: Iterable[tuple[int, int, Stack]] = ()
) -> Regions | None:
    """The segments that checkpointing a Sequential of torch's own modules (an MLP's layers, a
    CNN's convolutions, normalisations and activations) would cut the live activation blocks
    `blocks` into, where the judged pass `step` called two modules or more from its loop (or a
    user's line called a module's forward again, making nothing live itself between: `loops`),
    the outermost such line counting (a Sequential a loop calls is part of its call). Each
    module call is read from the stacks as `checkpoint_regions` reads a block's (a new one where the
    called forward changes or its line goes back: two like modules in a row whose first keeps
    nothing live read as one); its output is the first block it made, live or among `freed` (the
    pass's forward allocations it freed before the moment, (event index, bytes, stack)): a cut after
    a module whose output the run freed (a BatchNorm's, which the ReLU after it does not save) keeps
    it. The count of segments is the one of checkpoint_sequential's cuts of the calls the pass shows
    (or the whole Sequential checkpointed) that saves most; each earlier pass's kept graph is cut
    alike (its outputs read from its live blocks). None where no pass calls such a Sequential's
    modules twice."""
    made = [(b.alloc_index or 0, b.size_bytes, b.frames, b.step, True) for b in blocks if b.alloc_index is not None]
    made += [(index, size, frames, step, False) for index, size, frames in freed]
    made.sort(key=lambda item: item[0])
    sequences: dict[tuple[Frame, ...], _Sequence] = {}
    bare: set[tuple[Frame, ...]] = set()  # the frames of the judged pass's blocks made at a line itself
    read: dict[int, tuple[Stack, list[tuple[_Sequence, Frame]], set[tuple[Frame, ...]]]] = {}
    for index, size, frames, block_step, live in made:
        known = read.get(id(frames))
        if known is None or known[0] is not frames:
            found_bare: set[tuple[Frame, ...]] = set()
            known = read[id(frames)] = (frames, _sequences_of(frames, sequences, found_bare), found_bare)
        if block_step == step and live:
            bare |= known[2]
        for sequence, callee in known[1]:
            calls = sequence.passes.setdefault(block_step, [])
            before = sequence.last.get(block_step)
            kind = sequence.kinds.setdefault((callee.filename, callee.name), len(sequence.kinds))
            if before is None or _restarts(before, callee):
                calls.append([0, size, -1, kind, index])  # [live bytes, output's bytes, latest index, forward, first]
            call = calls[-1]
            call[2] = index
            sequence.last[block_step] = callee
            if live:
                call[0] += size
                sequence.members.add(index)

    def loops(prefix: tuple[Frame, ...], sequence: _Sequence) -> bool:
        """A Sequential that called two modules or more in the judged pass; a user's line, one that
        called a forward again (a loop), and made nothing live of its own between the calls."""
        calls = sequence.passes.get(step, [])
        if len(calls) < 2:
            return False
        return not sequence.loop or (len({call[3] for call in calls}) < len(calls) and prefix not in bare)

    chosen: list[tuple[tuple[Frame, ...], _Sequence]] = []
    for prefix, sequence in sorted(sequences.items(), key=lambda item: len(item[0])):
        if loops(prefix, sequence) and not any(prefix[: len(outer)] == outer for outer, _ in chosen):
            chosen.append((prefix, sequence))
    if not chosen:
        return None
    members = set().union(*(sequence.members for _, sequence in chosen))
    end = max(sequence.passes[step][-1][2] for _, sequence in chosen)
    after = sum(
        size
        for index, size, _, block_step, live in made
        if live and block_step == step and index > end and index not in members
    )
    held = inputs = pass_held = pass_inputs = largest = unchecked = count = 0
    spans: list[tuple[int, int, int]] = []
    for _, sequence in chosen:
        calls = sequence.passes[step]
        best: tuple[int, _Cut, int, int] | None = None
        for segments in range(1, len(calls) + 1):
            cut = _cut(calls, segments)
            earlier = [_cut(c, min(segments, len(c))) for s_, c in sequence.passes.items() if s_ != step]
            recomputed = max(cut.unchecked, cut.largest - after, 0)
            saved = max(0, cut.held - cut.inputs - recomputed) + sum(e.held - e.inputs - e.unchecked for e in earlier)
            kept = sum(e.inputs + e.unchecked for e in earlier)
            if best is None or saved > best[0]:
                best = (saved, cut, sum(e.held for e in earlier), kept)
        assert best is not None
        _, cut, earlier_held, earlier_kept = best
        held += cut.held + earlier_held
        inputs += cut.inputs + earlier_kept
        pass_held += cut.held
        pass_inputs += cut.inputs
        largest = max(largest, cut.largest)
        unchecked += cut.unchecked
        count += cut.count
        spans += cut.spans
    return Regions(
        sites=tuple(sequence.caller for _, sequence in chosen),
        count=count,
        held_bytes=held,
        inputs_bytes=inputs,
        largest_bytes=largest,
        pass_held_bytes=pass_held,
        pass_inputs_bytes=pass_inputs,
        after_bytes=after,
        unchecked_bytes=unchecked,
        sequential=True,
        loops=sum(sequence.loop for _, sequence in chosen),
        spans=tuple(sorted(spans)),
    )
