"""Passes and the steps they can be compared with (issue 11, causes G and J).

A claim about a pass the OOM interrupted, or a ratio against "earlier steps", is honest only against
a pass that completed and has the same structure (docs/definitions.md, "Comparable steps" and "A pass
the OOM interrupted"):

* `comparable_steps`: the completed steps before the target's that ran the same phases (a forward,
  and a backward when the run trains), neither model setup nor a step the trace began part-way into;
* `inputs_changed`: whether the inputs' sizes differ between an earlier step and the target's (the
  blocks made between steps, before the forward; the first allocations of each forward), None
  without evidence either way;
* `rest_of_pass`: at an OOM inside a forward, the rest of the pass and its backward extrapolated
  from the latest comparable pass whose allocations this one follows, or, when the trace has none,
  from a replica's pass on another device (DataParallel runs the same forward on each) that ran to
  its end: that pass replayed from the point the OOM came to, each allocation at this pass's size
  (`_projected_sizes`), with what it freed of the blocks made before it freed here too
  (`_freed_before`); or why it cannot be;
* `checkpoint_replay`: a completed pass of the judged pass's forward at its sizes (the one the rest
  was extrapolated from; for a target in a backward, a comparable step's whose inputs had the same
  sizes) replayed as it ran and with the checkpointing regions of its forward checkpointed
  (analysis/regions.py): what activation checkpointing saves of the whole pass, its backward's
  gradients beside each recomputation included.

Reads only the trace and the phase spans; no I/O.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import compress

from oomdoctor.analysis.frame_kinds import PYTHON_KINDS, frame_kind, per_stack
from oomdoctor.analysis.phases import in_module_forward
from oomdoctor.analysis.regions import Regions, checkpoint_regions, sequential_regions
from oomdoctor.analysis.results import (
    FORWARD_PASSES,
    PHASE_BACKWARD,
    PHASE_BETWEEN,
    PHASE_FORWARD,
    TRAINING_PHASES,
    LiveBlock,
    PhaseSpan,
    RestOfPass,
    RestUnknown,
)
from oomdoctor.model import ALLOC, FREE_REQUESTED, OOM, DeviceTrace, Stack
from oomdoctor.vocabulary import Component

KEY_FRAMES = 3  # an allocation's site: its innermost frames (file, line)
LOOKAHEAD = 8  # allocations one pass may have that the other lacks (a workspace made once) before they disagree
MISMATCH_PART = 10  # more than a tenth of this pass's allocations unmatched: not the same structure
INPUT_ALLOCATIONS = 8  # the first allocations of a forward that stand for its inputs' sizes
MAX_ALLOCATIONS = 50_000  # bound the work per pass
# A pass another follows with less misfit by this much (of the matched bytes) is extrapolated from
# instead of the latest earlier one: its allocations scale by one ratio (a batch halved), where the
# latest one's do not (a sequence doubled: attention grows by four, the rest by two)
MISFIT_MARGIN = 0.05
GROWING_PASSES = 3  # passes in a row that each leave more allocated than the one before: a loop that grows
SCALED = (Component.ACTIVATIONS, Component.INPUTS, Component.TEMPORARIES)


def passes_since_training(spans: Sequence[PhaseSpan], index: int) -> tuple[list[PhaseSpan], int]:
    """The forward and evaluation spans begun after the last backward, optimizer step or zero_grad
    that began at or before event `index`, up to it; and where that last one ended (-1: none)."""
    last_training = max(
        (s.last_index for s in spans if s.phase in TRAINING_PHASES and s.first_index <= index), default=-1
    )
    return [s for s in spans if s.phase in FORWARD_PASSES and last_training < s.first_index <= index], last_training


@dataclass(frozen=True, slots=True)
class Replica:
    """Another device of the snapshot running the judged device's model (`devices.summarise`):
    its trace and phases, read as the judged device's are."""

    device: int
    trace: DeviceTrace
    spans: Sequence[PhaseSpan]


@dataclass(frozen=True, slots=True)
class PassHistory:
    """What the verdict tests and the what-if read about comparable passes (`Context.passes`)."""

    comparable_steps: tuple[int, ...] = ()  # completed steps before the target's, of its structure
    inputs_changed: dict[int, bool | None] = field(default_factory=dict)  # per comparable step
    rest: RestOfPass | None = None  # the target is inside a forward: the rest of its pass
    # activation checkpointing replayed on a completed pass of the target's forward at the target
    # pass's sizes (`checkpoint_replay`): the one the rest of an interrupted pass was extrapolated
    # from, or, for a target in a backward, the latest comparable step's whose inputs had the same sizes
    checkpointed: CheckpointReplay | None = None


@dataclass(frozen=True, slots=True)
class CheckpointReplay:
    """A completed pass replayed from the trace at the judged pass's sizes (`ProjectedForward`), as
    it ran and with the checkpointing regions of its forward (read at the forward's end, as
    analysis/regions.py reads them at the judged moment) checkpointed: each region's blocks freed at
    its end but its output, and made again, its forward's allocations and frees replayed, where the
    backward first frees one of them, beside all the backward holds by then (the gradients it made,
    the gradients flowing). The peaks are of the pass's own allocations, from its forward's start to
    its backward's end."""

    step: int
    regions: Regions  # the replayed pass's regions (their count and calling lines)
    peak_bytes: int  # the pass as it ran
    checkpointed_peak_bytes: int  # the pass with its regions checkpointed

    @property
    def saved_bytes(self) -> int:
        return max(0, self.peak_bytes - self.checkpointed_peak_bytes)


@dataclass(frozen=True, slots=True)
class ProjectedForward:
    """A completed pass `then`, every allocation of its forward at the size the judged pass would
    have made it (an interrupted pass's `_projected_sizes`; a pass of the judged one's sizes, as it
    was): `live`, those alive at the forward's end, (event index, bytes, stack); `freed`, those it
    freed before then, alike. What `checkpoint_replay` reads its regions from."""

    then: _Pass
    sizes: Mapping[int, int]  # by event index, the projected sizes (`_projected_sizes`); the rest at `ratio`
    ratio: float
    live: tuple[tuple[int, int, Stack], ...]
    freed: tuple[tuple[int, int, Stack], ...]


@dataclass(frozen=True, slots=True)
class _Pass:
    first_index: int  # the forward's first event
    forward_last: int  # its last event
    last_index: int  # the end of the backward that follows in the same step, else the forward's end
    step: int


def _forwards(spans: Sequence[PhaseSpan], *, each_span: bool = False) -> list[_Pass]:
    """Each forward (consecutive forward spans of one step are one: a training step's calls before
    its backward) with the backward after it. `each_span`: in a run that does not train, each
    forward span is a pass of its own (phases.py starts a new span where a pass returned and the
    next began: a generation loop's next token, a benchmark's next iteration)."""
    passes: list[_Pass] = []
    position = 0
    while position < len(spans):
        span = spans[position]
        if span.phase != PHASE_FORWARD:
            position += 1
            continue
        first, last, step = span.first_index, span.last_index, span.step
        position += 1
        while (
            not each_span
            and position < len(spans)
            and spans[position].phase == PHASE_FORWARD
            and spans[position].step == step
        ):
            last = spans[position].last_index
            position += 1
        end = last
        look = position
        while look < len(spans) and spans[look].step == step and spans[look].phase != PHASE_FORWARD:
            if spans[look].phase == PHASE_BACKWARD:
                end = spans[look].last_index
            look += 1
        passes.append(_Pass(first, last, end, step))
    return passes


def _trains(spans: Sequence[PhaseSpan]) -> bool:
    return any(s.phase == PHASE_BACKWARD for s in spans)


def _pre_trace_frees(trace: DeviceTrace, first: int, last: int) -> bool:
    """Whether the trace frees, within [first, last], a block it never saw allocated."""
    seen: set[int] = set()
    actions, addrs = trace.actions, trace.addrs
    for index in range(min(last + 1, len(actions))):
        action = actions[index]
        if action == ALLOC:
            seen.add(addrs[index])
        elif action == FREE_REQUESTED and addrs[index] not in seen and index >= first:
            return True
    return False


def comparable_steps(trace: DeviceTrace, spans: Sequence[PhaseSpan], target_step: int | None) -> tuple[int, ...]:
    """Completed steps before `target_step` of the same structure: each ran a forward (and a backward
    when the run trains); model setup has no forward; the first step is left out when the trace
    began inside it (its first span a backward, optimizer step or zero_grad, or its backward frees
    blocks from before the trace: activations of a forward the trace missed)."""
    if target_step is None or not spans:
        return ()
    trains = _trains(spans)
    phases: dict[int, set[str]] = {}
    for span in spans:
        phases.setdefault(span.step, set()).add(span.phase)
    first_step = spans[0].step
    steps = []
    for step in sorted(phases):
        if step >= target_step:
            break
        seen = phases[step]
        if PHASE_FORWARD not in seen or (trains and PHASE_BACKWARD not in seen):
            continue
        if step == first_step:
            if spans[0].phase in TRAINING_PHASES:
                continue
            backward = [s for s in spans if s.step == step and s.phase == PHASE_BACKWARD]
            if backward and _pre_trace_frees(trace, backward[0].first_index, backward[-1].last_index):
                continue
        steps.append(step)
    return tuple(steps)


@per_stack  # each step's passes meet the same stacks again
def site_key(frames: Stack, depth: int | None = KEY_FRAMES) -> tuple[tuple[str, int], ...] | None:
    """An allocation's site: the (file, line) of its innermost Python frames, `depth` of them (a
    `stacks="all"` stack starts with the unwinder's and the allocator's C++ frames, alike for every
    allocation; None: every one, its callers included: where in the program it was made); None
    without Python frames (the autograd engine's, or no stack recorded)."""
    key: list[tuple[str, int]] = []
    for frame in frames:
        if frame_kind(frame) in PYTHON_KINDS:
            key.append((frame.filename, frame.line))
            if len(key) == depth:
                break
    return tuple(key) or None


def _allocations(
    trace: DeviceTrace, first: int, last: int, limit: int = MAX_ALLOCATIONS
) -> list[tuple[int, object, int]]:
    """(event index, site key, size) of each allocation in [first, last], the first `limit` of them."""
    sizes = trace.sizes
    indices = trace.positions_in(ALLOC, first, min(last + 1, len(sizes)), min(limit, MAX_ALLOCATIONS))
    numbers, stacks = trace.stacks_at(indices)  # each distinct stack's key made once
    key_of = {number: site_key(frames) for number, frames in stacks.items()}
    return list(zip(indices, map(key_of.__getitem__, numbers), map(sizes.__getitem__, indices)))


@dataclass(frozen=True, slots=True)
class _Alignment:
    now_bytes: int  # this pass's matched allocations
    earlier_bytes: int  # the earlier pass's matched allocations
    earlier_position: int  # how many of the earlier pass's allocations the match reached
    sizes: tuple[tuple[int, int], ...]  # (now, earlier) sizes of the first matched pairs
    skipped: int = 0  # the earlier pass's allocations the match passed over
    misfit: float = 0.0  # share of the matched bytes one ratio (now / earlier bytes) does not explain
    # (site key, now / earlier bytes of its matched allocations) of each site matched
    site_ratios: tuple[tuple[object, float], ...] = ()
    # (the earlier pass's event index, the size of this pass's allocation matched to it) of each pair
    matched: tuple[tuple[int, int], ...] = ()
    last_match: int | None = None  # the earlier pass's event index matched to this pass's last allocation


def _align(now: list[tuple[int, object, int]], earlier: list[tuple[int, object, int]]) -> _Alignment | str:
    """Match this pass's allocations, in order, to the earlier pass's by site (every site matches
    when neither has frames); a RestUnknown when they do not follow each other."""
    i = j = 0
    now_bytes = earlier_bytes = unmatched = skipped = 0
    pairs: list[tuple[int, int]] = []
    matched: list[tuple[int, int]] = []
    events: list[tuple[int, int]] = []  # (the earlier pass's event index, this pass's size)
    last_match = None
    by_site: dict[object, list[int]] = {}  # site key -> [now bytes, earlier bytes]
    while i < len(now):
        if j >= len(earlier):
            return RestUnknown.BEYOND_EARLIER
        key = now[i][1]
        if key == earlier[j][1]:
            now_bytes += now[i][2]
            earlier_bytes += earlier[j][2]
            matched.append((now[i][2], earlier[j][2]))
            events.append((earlier[j][0], now[i][2]))
            if i == len(now) - 1:
                last_match = earlier[j][0]
            site = by_site.setdefault(key, [0, 0])
            site[0] += now[i][2]
            site[1] += earlier[j][2]
            if len(pairs) < INPUT_ALLOCATIONS:
                pairs.append((now[i][2], earlier[j][2]))
            i += 1
            j += 1
            continue
        ahead = next((k for k in range(j + 1, min(j + 1 + LOOKAHEAD, len(earlier))) if earlier[k][1] == key), None)
        if ahead is not None:
            skipped += ahead - j
            j = ahead  # the earlier pass made allocations this one skips
            continue
        unmatched += 1
        i += 1
        if unmatched * MISMATCH_PART > max(len(now), LOOKAHEAD * MISMATCH_PART):
            return RestUnknown.STRUCTURE_DIFFERS
    if unmatched * MISMATCH_PART > len(now) or not earlier_bytes:
        return RestUnknown.STRUCTURE_DIFFERS
    ratio = now_bytes / earlier_bytes
    misfit = sum(abs(a - ratio * b) for a, b in matched) / now_bytes if now_bytes else 0.0
    sites = tuple((key, mine / theirs) for key, (mine, theirs) in by_site.items() if theirs)
    return _Alignment(now_bytes, earlier_bytes, j, tuple(pairs), skipped, misfit, sites, tuple(events), last_match)


def _kept_at_end(trace: DeviceTrace, one: _Pass) -> set[int]:
    """The allocations (by event index) made in the pass's backward and alive at its end: the
    gradients it made. By index: an address the backward (or an optimizer step the pass's span
    holds) allocated, freed and allocated again is kept once."""
    actions, addrs = trace.actions, trace.addrs
    last = min(one.last_index, len(actions) - 1)
    live: dict[int, int] = {}  # address -> alloc index
    for index in range(one.first_index, last + 1):
        if actions[index] == ALLOC:
            live[addrs[index]] = index
        elif actions[index] == FREE_REQUESTED:
            live.pop(addrs[index], None)
    return {index for index in live.values() if index > one.forward_last}


def _between_sizes(trace: DeviceTrace, spans: Sequence[PhaseSpan], step: int) -> tuple[int, ...]:
    """Sizes of the allocations a step makes between steps before its first forward (its batch)."""
    forward = next((s for s in spans if s.step == step and s.phase == PHASE_FORWARD), None)
    if forward is None:
        return ()
    sizes: list[int] = []
    for span in spans:
        if span.step != step or span.first_index >= forward.first_index:
            continue
        if span.phase != PHASE_BETWEEN:  # not model setup, not a phase of the step
            continue
        sizes += (
            s
            for a, s in zip(
                trace.actions[span.first_index : span.last_index + 1],
                trace.sizes[span.first_index : span.last_index + 1],
            )
            if a == ALLOC
        )
    return tuple(sorted(sizes))


def inputs_changed(
    trace: DeviceTrace,
    spans: Sequence[PhaseSpan],
    earlier: int,
    target_step: int,
    *,
    passes: Sequence[_Pass] | None = None,
    spans_by_step: Mapping[int, Sequence[PhaseSpan]] | None = None,
) -> bool | None:
    """Whether the inputs' sizes differ between step `earlier` and `target_step`: the batch each
    step made before its forward, and the first allocations of each forward matched by site. None
    when neither gives evidence. `passes` (`_forwards(spans)`) and `spans_by_step` (the spans of
    each step) save recomputing them for each of many steps (`_InputsProbe` keeps the target's side)."""
    return _InputsProbe(trace, spans, target_step, passes, spans_by_step).against(earlier)


# How many of an earlier forward's allocations `_align` can read when it matches the target's first
# INPUT_ALLOCATIONS: each matched allocation moves it at most LOOKAHEAD + 1 on, and it looks
# LOOKAHEAD past where it stands, so the allocations after these never change the alignment.
_INPUT_ALIGN_REACH = INPUT_ALLOCATIONS * (LOOKAHEAD + 1) + LOOKAHEAD + 1
# Passes of one structure align allocation for allocation: the match then ends at INPUT_ALLOCATIONS
# and reads no further than this, so the earlier pass's allocations are read this far first.
_INPUT_ALIGN_FIRST = INPUT_ALLOCATIONS + LOOKAHEAD + 1


def _align_inputs(trace: DeviceTrace, head: list[tuple[int, object, int]], then: _Pass) -> _Alignment | str:
    """`_align(head, the earlier forward's allocations)`, reading those only as far as it reaches:
    the first _INPUT_ALIGN_FIRST, and all it can reach (_INPUT_ALIGN_REACH) only when a match ending
    at `earlier_position` may have looked past them (it looks LOOKAHEAD past where it stands) or
    when it failed."""
    first = _allocations(trace, then.first_index, then.forward_last, _INPUT_ALIGN_FIRST)
    if len(first) < _INPUT_ALIGN_FIRST:  # all there are
        return _align(head, first)
    alignment = _align(head, first)
    if isinstance(alignment, _Alignment) and alignment.earlier_position + 1 + LOOKAHEAD <= _INPUT_ALIGN_FIRST:
        return alignment
    return _align(head, _allocations(trace, then.first_index, then.forward_last, _INPUT_ALIGN_REACH))


class _InputsProbe:
    """`inputs_changed` against one target step, its own side (its batch, its forward's first
    allocations, where each step's passes are) computed once for every earlier step it is asked about.
    `target_index`: the judged event, where it is known (an OOM): its own pass is the target's side,
    not the step's first (a micro-batch after others, or a pass that may be a step of its own, as
    phases.py counts them in one step), and the batch made before the step's first forward is that
    pass's only when it is the step's first."""

    def __init__(
        self,
        trace: DeviceTrace,
        spans: Sequence[PhaseSpan],
        target_step: int,
        passes: Sequence[_Pass] | None,
        spans_by_step: Mapping[int, Sequence[PhaseSpan]] | None,
        target_index: int | None = None,
    ) -> None:
        self.trace, self.spans, self.spans_by_step = trace, spans, spans_by_step
        now_spans = spans if spans_by_step is None else spans_by_step.get(target_step, ())
        self.before_now = _between_sizes(trace, now_spans, target_step)
        self.last_pass: dict[int, _Pass] = {}  # step -> its latest pass
        first_pass: dict[int, _Pass] = {}
        own: _Pass | None = None  # the latest pass of the target's step begun by the target
        for one in _forwards(spans) if passes is None else passes:
            first_pass.setdefault(one.step, one)
            self.last_pass[one.step] = one
            if one.step == target_step and target_index is not None and one.first_index <= target_index:
                own = one
        now = first_pass.get(target_step)
        if own is not None and own is not now:
            now, self.before_now = own, ()
        self.head = _allocations(trace, now.first_index, now.forward_last, INPUT_ALLOCATIONS) if now else []
        self.has_now = now is not None

    def against(self, earlier: int) -> bool | None:
        verdicts: list[bool] = []
        trace, spans_by_step = self.trace, self.spans_by_step
        then_spans = self.spans if spans_by_step is None else spans_by_step.get(earlier, ())
        before_then = _between_sizes(trace, then_spans, earlier)
        if self.before_now and before_then:
            verdicts.append(self.before_now != before_then)
        then = self.last_pass.get(earlier)
        if self.has_now and then is not None:
            head = self.head
            alignment = _align_inputs(trace, head, then) if head else None
            if isinstance(alignment, _Alignment) and alignment.sizes:
                verdicts.append(any(a != b for a, b in alignment.sizes))
        if not verdicts:
            return None
        return any(verdicts)


def rest_of_pass(
    trace: DeviceTrace,
    spans: Sequence[PhaseSpan],
    target_index: int | None,
    target_step: int | None,
    blocks: Sequence[LiveBlock],
    comparable: tuple[int, ...],
    replicas: Sequence[Replica] = (),
    trains: bool = False,
) -> tuple[RestOfPass | None, ProjectedForward | None]:
    """At an OOM inside a forward, its rest extrapolated from the latest earlier completed pass of
    the same structure (a comparable step's, or an earlier pass of the same step when the run does
    not train) whose allocations this pass follows, or, where the run went on after the OOM (the
    script caught it), from a pass after it that ran to its end and that this pass follows with
    allocations scaled more evenly (MISFIT_MARGIN: the same batch tried again at half its size);
    failing that, from a replica's pass that ran to its end (`_finished_passes`); else why not. None (and no forward) when the target is not in a forward.
    `trains`: something besides the spans tells the run trains (the stacks, the annotations); in a
    run that does not, each forward span is a pass (`_forwards`). With it, the forward of the pass
    it was extrapolated from in this trace, projected (`ProjectedForward`; None from a replica's)."""
    if target_index is None:
        return None, None
    trains = trains or _trains(spans) or any(_trains(replica.spans) for replica in replicas)
    passes = _forwards(spans, each_span=not trains)
    current = next((p for p in passes if p.first_index <= target_index <= p.forward_last), None)
    if current is None:
        return None, None
    own = sum(
        b.size_bytes
        for b in blocks
        if b.alloc_index is not None and current.first_index <= b.alloc_index <= target_index and b.component in SCALED
    )
    comparable_set = set(comparable)
    earlier = [
        p
        for p in passes
        if p.last_index < current.first_index
        and (
            p.step in comparable_set
            or p.step == current.step  # an earlier pass of this step: another evaluation batch, a micro-batch
        )
    ]
    after = _passes_after(trace, passes, current, trains)[:4]
    if not earlier and not after and not replicas:
        return RestOfPass(current.step, RestUnknown.NO_EARLIER_PASS, pass_bytes=own), None
    now = _allocations(trace, current.first_index, target_index)
    requested = False
    if trace.actions[target_index] == OOM:  # the failed request is this pass's next allocation
        key = site_key(trace.frames_at(target_index))
        # an OOM entry without frames in a pass whose allocations carry them says nothing of its site
        if key is not None or all(k is None for _, k, _ in now):
            now.append((target_index, key, trace.sizes[target_index]))
            requested = True
    reason: str = RestUnknown.NO_EARLIER_PASS
    best = None
    for then in [*reversed(earlier[-4:]), *after]:  # the latest earlier one first, then those after the OOM
        allocations = _allocations(trace, then.first_index, then.forward_last)
        alignment = _align(now, allocations)
        if isinstance(alignment, str):
            reason = alignment
            continue
        if best is None or alignment.misfit < best[2].misfit - MISFIT_MARGIN:
            best = (then, allocations, alignment)
    interrupted = _Interrupted(current, own, requested, trace, blocks)
    if best is not None:
        rest, sizes = _extrapolated(interrupted, trace, *best, None)
        return rest, _projected_forward(trace, best[0], sizes, rest.size_ratio or 1.0)
    if not earlier and replicas:  # nothing earlier in this trace: the replica's pass this one follows best
        found = _replica_pass(now, replicas, trace.times_us[target_index] if trace.times_us is not None else None)
        if found is not None:
            return _extrapolated(interrupted, *found)[0], None
    # the earlier passes of a run that does not train ran no backward: none follows this one either
    return RestOfPass(current.step, reason, pass_bytes=own, earlier_backward=trains or not earlier), None


def _projected_forward(trace: DeviceTrace, then: _Pass, sizes: Mapping[int, int], ratio: float) -> ProjectedForward:
    """`then`'s forward at the interrupted pass's sizes (`sizes`, else `ratio`, as `_projection` reads them)."""
    actions, addrs, trace_sizes = trace.actions, trace.addrs, trace.sizes
    last = min(then.forward_last, len(actions) - 1)
    made: dict[int, int] = {}  # address -> its allocation
    freed: list[int] = []
    for index in range(then.first_index, last + 1):
        if actions[index] == ALLOC:
            made[addrs[index]] = index
        elif actions[index] == FREE_REQUESTED:
            alloc = made.pop(addrs[index], None)
            if alloc is not None:
                freed.append(alloc)

    def projected(indices: Sequence[int]) -> tuple[tuple[int, int, Stack], ...]:
        return tuple(
            (index, sizes.get(index) or round(trace_sizes[index] * ratio), trace.frames_at(index))
            for index in sorted(indices)
        )

    return ProjectedForward(then, sizes, ratio, projected(list(made.values())), projected(freed))


def checkpoint_replay(trace: DeviceTrace, forward: ProjectedForward) -> CheckpointReplay | None:
    """`forward`'s pass replayed as it ran and with its checkpointing regions checkpointed
    (`CheckpointReplay`); None where its forward shows no regions, or its backward never frees a
    region's blocks (a graph it kept: where the recomputation would run, the trace does not show)."""
    then = forward.then
    live = [
        LiveBlock(0, size, size, index, PHASE_FORWARD, then.step, Component.ACTIVATIONS, "", 1.0, None, frames)
        for index, size, frames in forward.live
    ]
    regions = checkpoint_regions(live, then.step) or sequential_regions(live, then.step, forward.freed)
    if regions is None or not regions.spans:
        return None
    kept = _kept_at_end(trace, then)
    actions, addrs, trace_sizes = trace.actions, trace.addrs, trace.sizes
    last = min(then.last_index, len(actions) - 1)
    spans = regions.spans
    starts = [span[0] for span in spans]

    def size_of(index: int) -> int:
        if index in kept:  # a gradient: the parameter's shape
            return trace_sizes[index]
        return forward.sizes.get(index) or round(trace_sizes[index] * forward.ratio)

    def region_of(index: int) -> int | None:
        k = bisect.bisect_right(starts, index) - 1
        return k if k >= 0 and index <= spans[k][1] and index <= then.forward_last else None

    # each of the pass's allocations -> the event that frees it (within the pass)
    freed_at: dict[int, int] = {}
    freeing: dict[int, int] = {}  # the reverse: a free event -> the allocation it frees
    made_at: dict[int, int] = {}  # address -> allocation
    for index in range(then.first_index, last + 1):
        if actions[index] == ALLOC:
            made_at[addrs[index]] = index
        elif actions[index] == FREE_REQUESTED and addrs[index] in made_at:
            alloc = made_at.pop(addrs[index])
            freed_at[alloc], freeing[index] = index, alloc
    # checkpointed, a region keeps its output; what else of it the backward frees is dropped when it returns
    dropped: list[set[int]] = [set() for _ in spans]
    for alloc in range(then.first_index, then.forward_last + 1):
        k = region_of(alloc) if actions[alloc] == ALLOC else None
        # alive when it returns and not freed by the forward after all (saved for the backward)
        if k is not None and alloc != spans[k][2] and freed_at.get(alloc, last + 1) > then.forward_last:
            dropped[k].add(alloc)
    # the backward runs a region's forward again as it reaches the region: when the node before it
    # has let go of what it held (the free before the region's first free of a dropped block), before
    # the region's first node makes anything (its gradients)
    again_at: dict[int, list[int]] = {}
    for k, blocks in enumerate(dropped):
        if any(a not in freed_at for a in blocks):
            return None  # a block the pass never frees (a graph it kept)
        first_free = min((freed_at[a] for a in blocks), default=None)
        if first_free is None:
            continue  # nothing of it is saved: nothing recomputes it
        point = then.forward_last + 1
        for index in range(first_free - 1, then.forward_last, -1):
            if index in freeing:
                point = index + 1
                break
        again_at.setdefault(point, []).append(k)
    ends: dict[int, list[int]] = {}
    for k, span in enumerate(spans):
        ends.setdefault(span[1], []).append(k)

    at: dict[int, int] = {}  # address -> the pass's own live allocation there (as it ran)
    held = peak = 0  # as it ran
    checked: dict[int, int] = {}  # allocation -> bytes, alive in the checkpointed pass
    held_checked = peak_checked = 0

    def recompute(k: int) -> None:
        nonlocal held_checked, peak_checked
        # torch.utils.checkpoint (use_reentrant=False) stops the region's forward once it has made
        # again every block the backward needs of it: the rest of the region is not run again
        again: dict[int, int] = {}  # address -> allocation, the region's forward run again
        for index in range(spans[k][0], max(dropped[k]) + 1):
            if actions[index] == ALLOC:
                again[addrs[index]] = index
                held_checked += size_of(index)
                peak_checked = max(peak_checked, held_checked)
            elif actions[index] == FREE_REQUESTED:
                gone = again.pop(addrs[index], None)
                if gone is not None:
                    held_checked -= size_of(gone)
        for index in again.values():
            if index in dropped[k]:
                checked[index] = size_of(index)
            else:
                held_checked -= size_of(index)  # made again and let go (the output it keeps already)

    for index in range(then.first_index, last + 1):
        for k in again_at.get(index, ()):
            recompute(k)
        action = actions[index]
        if action == ALLOC:
            size = size_of(index)
            at[addrs[index]] = index
            held += size
            checked[index] = size
            held_checked += size
            peak, peak_checked = max(peak, held), max(peak_checked, held_checked)
        elif action == FREE_REQUESTED and addrs[index] in at:  # else made before the pass
            alloc = at.pop(addrs[index])
            held -= size_of(alloc)
            held_checked -= checked.pop(alloc, 0)
        for k in ends.get(index, ()):  # the region returns
            for alloc in dropped[k]:
                held_checked -= checked.pop(alloc, 0)
    return CheckpointReplay(then.step, regions, peak, peak_checked)


def _passes_after(trace: DeviceTrace, passes: Sequence[_Pass], current: _Pass, trains: bool) -> list[_Pass]:
    """The passes after `current` that ran to their end, in order, where the run went on after the
    OOM that cut `current` short (the script caught it: a smaller batch tried again, the next batch):
    no OOM in them, their backward ran in a run that trains, and something follows them."""
    last = len(trace) - 1
    return [
        p
        for p in passes
        if p.first_index > current.last_index
        and p.last_index < last
        and (p.last_index > p.forward_last or not trains)
        and not trace.positions_in(OOM, p.first_index, p.last_index + 1)
    ]


def _replica_pass(
    now: list[tuple[int, object, int]], replicas: Sequence[Replica], oom_time: int | None
) -> tuple[DeviceTrace, _Pass, list[tuple[int, object, int]], _Alignment, int] | None:
    """Of the replicas' passes that ran to their end (`_finished_passes`, the latest four of each),
    the one this pass follows with the fewest of its allocations passed over (the same code on a
    device that also ran other work, device 0's extra modules say, is passed over), the latest first
    on a tie: (its trace, the pass, its allocations, the alignment, the device)."""
    best = None
    for replica in replicas:
        for then in reversed(_finished_passes(replica, oom_time)[-4:]):
            allocations = _allocations(replica.trace, then.first_index, then.forward_last)
            alignment = _align(now, allocations)
            if isinstance(alignment, str):
                continue
            if best is None or alignment.skipped < best[3].skipped:
                best = (replica.trace, then, allocations, alignment, replica.device)
    return best


@dataclass(frozen=True, slots=True)
class _Interrupted:
    """The pass the OOM cut short, as `_extrapolated` reads it: the pass, its own bytes live at the
    OOM (`own`), whether the failed request is the last of the allocations aligned (`requested`),
    its trace and the blocks live at the OOM."""

    current: _Pass
    own: int
    requested: bool
    trace: DeviceTrace
    blocks: Sequence[LiveBlock]


def _extrapolated(
    now: _Interrupted,
    trace: DeviceTrace,
    then: _Pass,
    allocations: list[tuple[int, object, int]],
    alignment: _Alignment,
    device: int | None,
) -> tuple[RestOfPass, Mapping[int, int]]:
    """The rest of the interrupted pass from the completed pass `then` (of `trace`; on `device` when
    a replica's), followed from the point the OOM came to (`_projection`); with the sizes `then`'s
    allocations are projected at (`_projected_sizes`)."""
    ratio = alignment.now_bytes / alignment.earlier_bytes
    apart = _sites_apart(alignment, ratio)
    sizes = _projected_sizes(trace, then, allocations, alignment, ratio, apart)
    if now.requested and alignment.last_match is not None:
        start = alignment.last_match  # the earlier pass's allocation the failed request stands for
    elif alignment.earlier_position < len(allocations):
        start = allocations[alignment.earlier_position][0]
    else:
        start = then.forward_last + 1
    freed = _freed_before(trace, then, start, now)
    growth, kept_grown, freed_bytes, freed_scaled, peak = _projection(trace, then, sizes, ratio, start, freed)
    rest = RestOfPass(
        now.current.step,
        None,
        then.step,
        ratio,
        alignment.earlier_position / len(allocations) if allocations else None,
        peak,
        kept_grown,
        now.own,
        now.own + max(0, growth),
        device,
        then.last_index > then.forward_last,
        apart,
        freed_bytes,
        freed_scaled,
    )
    return rest, sizes


def _sites_apart(alignment: _Alignment, ratio: float) -> bool:
    """Whether the matched sites grew by ratios of their own (a longer sequence: attention's scores
    by its square, the rest by its length): one ratio leaves more than MISFIT_MARGIN of the matched
    bytes unexplained, and a site's ratio differs from it by more than that."""
    return alignment.misfit >= MISFIT_MARGIN and any(
        abs(r - ratio) > MISFIT_MARGIN * ratio for _, r in alignment.site_ratios
    )


def _projected_sizes(
    trace: DeviceTrace,
    then: _Pass,
    allocations: list[tuple[int, object, int]],
    alignment: _Alignment,
    ratio: float,
    apart: bool,
) -> dict[int, int]:
    """What each allocation of `then` (by event index) would be in the interrupted pass. Those the
    alignment matched: the size this pass allocated for them. The rest, where one ratio explains the
    matched ones: `ratio` (left out here). Where sites grew apart: the ratio the matched allocations
    of the same site and the same size grew by (one line of code can make a tensor that grows with
    the sequence and one that grows with its square; one module's forward, a Linear's, is called for
    tensors of every shape); else of the same site; a backward allocation without frames, the ratio
    of the forward allocations of its very size (a gradient has the shape of what it is the gradient
    of; sites of one size may grow apart: their mean); else, at a site not matched yet, the ratio
    the most matched sites grew by (`_commonest_ratio`)."""
    sizes = dict(alignment.matched)
    if not apart:
        return sizes
    key_of = {index: (key, size) for index, key, size in allocations}
    by_kind: dict[object, list[int]] = {}  # (site, earlier size) -> [now bytes, earlier bytes]
    for index, mine in alignment.matched:
        key, size = key_of[index]
        totals = by_kind.setdefault((key, size), [0, 0])
        totals[0] += mine
        totals[1] += size
    kind_ratio = {kind: mine / theirs for kind, (mine, theirs) in by_kind.items() if theirs}
    site_ratio = dict(alignment.site_ratios)
    unseen = _commonest_ratio(alignment.site_ratios, ratio)

    def ratio_of(key: object, size: int) -> float | None:
        found = kind_ratio.get((key, size))
        return found if found is not None else site_ratio.get(key)

    by_size: dict[int, list[float]] = {}
    for index, key, size in allocations:
        made = sizes.get(index)
        grew = made / size if made is not None and size else ratio_of(key, size)
        if grew is None:
            grew = unseen
        if made is None:
            sizes[index] = round(size * grew)
        by_size.setdefault(size, []).append(grew)
    for index, key, size in _allocations(trace, then.forward_last + 1, then.last_index):
        grew = ratio_of(key, size) if key is not None else None
        if grew is None:
            known = by_size.get(size)
            grew = sum(known) / len(known) if known else unseen
        sizes[index] = round(size * grew)
    return sizes


def _commonest_ratio(site_ratios: Sequence[tuple[object, float]], ratio: float) -> float:
    """The ratio the most matched sites grew by (those within MISFIT_MARGIN of one another counted
    as one; on a tie the larger): what an allocation at a site the interrupted pass had not reached
    grows by. Not `ratio`, the matched bytes' blend of the sites' own ratios, which no one tensor
    grew by (a longer sequence: the scores by its square, everything else by its length; the head
    and the loss after the layers grow as most of the layers' sites did)."""
    groups: list[list[float]] = []
    for grew in sorted(r for _, r in site_ratios):
        if groups and grew <= groups[-1][0] * (1 + MISFIT_MARGIN):
            groups[-1].append(grew)
        else:
            groups.append([grew])
    if not groups:
        return ratio
    commonest = max(groups, key=lambda group: (len(group), group[0]))
    return sum(commonest) / len(commonest)


def _freed_before(trace: DeviceTrace, then: _Pass, start: int, now: _Interrupted) -> dict[int, LiveBlock]:
    """The blocks alive at the OOM, made before the interrupted pass, that its rest frees: where
    `then` freed, after `start` (the point the OOM came to), a block made before it (the previous
    step's outputs, which the loop's variable held until the forward returned; the previous step's
    gradients, freed by a zero_grad inside the pass), the interrupted pass frees the latest block
    alive at the OOM made before it at the same place in the program (`_place`). `then`'s free
    event -> that block. A block the trace never saw made, or made at a place with no such block
    alive now, frees nothing here."""
    first, last = then.first_index, min(then.last_index, len(trace) - 1)
    actions, addrs = trace.actions, trace.addrs
    own: set[int] = set()  # addresses of `then`'s own blocks alive
    frees: list[int] = []
    for index in range(first, last + 1):
        if actions[index] == ALLOC:
            own.add(addrs[index])
        elif actions[index] == FREE_REQUESTED:
            if addrs[index] in own:
                own.discard(addrs[index])
            elif index > start:
                frees.append(index)
    if not frees:
        return {}
    wanted = {trace.addrs[index] for index in frees}
    made: dict[int, int] = {}  # address -> its latest allocation before `then`
    # back from `then` over its MAX_ALLOCATIONS allocations before it at most, until each is found
    # (the previous step's, mostly: a walk back, not a scan of the whole trace)
    seen = 0
    for index in range(first - 1, -1, -1):
        if actions[index] != ALLOC:
            continue
        seen += 1
        address = addrs[index]
        if address in wanted and address not in made:
            made[address] = index
            if len(made) == len(wanted):
                break
        if seen == MAX_ALLOCATIONS:
            break
    candidates: dict[object, list[LiveBlock]] = {}
    for block in sorted(now.blocks, key=lambda b: b.alloc_index or 0):
        if block.alloc_index is None or block.alloc_index >= now.current.first_index:
            continue
        candidates.setdefault(_place(now.trace, block.alloc_index), []).append(block)
    found: dict[int, LiveBlock] = {}
    for index in frees:
        origin = made.get(trace.addrs[index])
        if origin is None:
            continue
        same_place = candidates.get(_place(trace, origin))
        if same_place:
            found[index] = same_place.pop()  # the latest made
    return found


def _place(trace: DeviceTrace, index: int) -> object:
    """Where in the program allocation `index` was made: its whole stack (`site_key` of every Python
    frame); without Python frames (the autograd engine's: a gradient), its size."""
    return site_key(trace.frames_at(index), None) or ("no frames", trace.sizes[index])


def _projection(
    trace: DeviceTrace,
    then: _Pass,
    sizes: Mapping[int, int],
    ratio: float,
    start: int,
    freed: Mapping[int, LiveBlock],
) -> tuple[int, int, int, int, int]:
    """`then` replayed at the interrupted pass's sizes (`sizes`, else `ratio`; the gradients its
    backward makes and keeps, `_kept_at_end`, at their own: they have the parameters' shapes), with
    the blocks `freed` made before it going where `then` freed theirs: from its allocation `start`
    (the failed request's counterpart) to its end, the moment it held the most over what it held
    just before `start`. (What its own allocations had grown by there, the failed request included,
    less the kept gradients; those gradients; the bytes `freed` by then, and of them activations,
    inputs and temporaries; and `then`'s own peak at its own sizes, from its forward's start.)"""
    actions, addrs, trace_sizes = trace.actions, trace.addrs, trace.sizes
    last = min(then.last_index, len(actions) - 1)
    kept = _kept_at_end(trace, then)
    live: dict[int, tuple[int, bool, int]] = {}  # address -> (projected size, kept, own size)
    held = held_kept = gone = gone_scaled = 0
    before = before_kept = 0
    raw = raw_peak = 0  # `then`'s own allocations at their own sizes
    best: tuple[int, int, int, int] | None = None
    best_total = 0
    for index in range(then.first_index, last + 1):
        if index == start:
            before, before_kept = held, held_kept
        action = actions[index]
        if action == ALLOC:
            is_kept = index in kept
            size = trace_sizes[index] if is_kept else sizes.get(index)
            if size is None:
                size = round(trace_sizes[index] * ratio)
            live[addrs[index]] = (size, is_kept, trace_sizes[index])
            raw += trace_sizes[index]
            raw_peak = max(raw_peak, raw)
            if is_kept:
                held_kept += size
            else:
                held += size
        elif action == FREE_REQUESTED:
            entry = live.pop(addrs[index], None)
            if entry is not None:
                raw -= entry[2]
                if entry[1]:
                    held_kept -= entry[0]
                else:
                    held -= entry[0]
            elif index in freed:
                block = freed[index]
                gone += block.size_bytes
                if block.component in SCALED:
                    gone_scaled += block.size_bytes
        if index >= start:
            total = held + held_kept - gone
            if best is None or total > best_total:
                best, best_total = (held, held_kept, gone, gone_scaled), total
    if best is None:
        return 0, 0, 0, 0, raw_peak
    return best[0] - before, best[1] - before_kept, best[2], best[3], raw_peak


def _finished_passes(replica: Replica, before_time: int | None) -> list[_Pass]:
    """The replica's passes that ran to their end, oldest first: no OOM in them, and something
    after them in its trace, or its trace ended (by time_us) before `before_time`, the judged OOM,
    while the judged device was still in its pass (DataParallel's other threads run their forward
    to its end before the OOM is raised)."""
    trace = replica.trace
    if not len(trace):
        return []
    last = len(trace) - 1
    last_time = trace.times_us[last] if trace.times_us is not None else None
    ended_before = before_time is not None and last_time is not None and last_time < before_time
    return [
        p
        for p in _forwards(replica.spans)
        if not trace.positions_in(OOM, p.first_index, min(p.last_index + 1, len(trace)))
        and (p.last_index < last or ended_before)
    ]


def pass_history(
    trace: DeviceTrace,
    spans: Sequence[PhaseSpan],
    oom_index: int | None,
    target_step: int | None,
    blocks: Sequence[LiveBlock],
    replicas: Sequence[Replica] = (),
    trains: bool = False,
    backward: bool = False,
) -> PassHistory:
    """Everything `Context.passes` holds, computed once. `oom_index`: the judged OOM event, None
    when the moment judged is a peak or the dump (nothing cut a pass short there: the rest of the
    pass that holds a peak ran, and stayed below it). `trains`: as `rest_of_pass`'s. `backward`:
    the target is in a backward (`PassHistory.checkpointed` replays a comparable pass)."""
    comparable = comparable_steps(trace, spans, target_step)
    changed: dict[int, bool | None] = {}
    if target_step is not None and comparable:
        passes = _forwards(spans)
        by_step: dict[int, list[PhaseSpan]] = {}
        for span in spans:
            by_step.setdefault(span.step, []).append(span)
        probe = _InputsProbe(trace, spans, target_step, passes, by_step, oom_index)
        changed = {s: probe.against(s) for s in comparable}
    rest, forward = rest_of_pass(trace, spans, oom_index, target_step, blocks, comparable, replicas, trains)
    if forward is None and backward and target_step is not None:
        # a target in a backward: the latest comparable pass whose inputs had the same sizes, as it
        # was, where its backward made gradients as the target's does (a backward that adds into
        # gradients an earlier step left, or made them itself, is another: step 0 of a run that never
        # zeroes them)
        same = [s for s in comparable if s < target_step and changed.get(s) is False]
        forwards = _forwards(spans)
        then = next((p for p in reversed(forwards) if same and p.step == same[-1]), None)
        now = next((p for p in forwards if p.step == target_step), None)
        held_over = now is not None and any(
            b.component == Component.GRADIENTS and (b.alloc_index is None or b.alloc_index < now.first_index)
            for b in blocks
        )
        if then is not None and then.last_index > then.forward_last and not (held_over and _kept_at_end(trace, then)):
            forward = _projected_forward(trace, then, {}, 1.0)
    return PassHistory(comparable, changed, rest, checkpoint_replay(trace, forward) if forward is not None else None)


def running_concatenations(
    trace: DeviceTrace, spans: Sequence[PhaseSpan], index: int | None, blocks: Sequence[LiveBlock]
) -> dict[int, tuple[tuple[int, int], ...]]:
    """The live blocks that are the latest of a running concatenation over the forward passes since
    the last training phase (a loop that does `kept = torch.cat((kept, outputs))` after each batch, as
    transformers' evaluation loop does for the logits without eval_accumulation_steps): address ->
    the chain's (allocation event, bytes), oldest first.

    A link: an earlier allocation at the same site (its innermost frames), smaller, made before a
    forward pass that began before the later one, and freed after the later one was made with no
    other allocation at that site in between (the concatenation read it, then the loop dropped it).
    The block is made by the loop's code, outside any module's forward. A chain has at least three
    allocations, or none is returned for the block."""
    if index is None:
        return {}
    forwards, _ = passes_since_training(spans, index)
    if len(forwards) < 3:
        return {}
    first = forwards[0].first_index
    starts = [f.first_index for f in forwards]
    candidates = [
        b
        for b in blocks
        if b.alloc_index is not None
        and first <= b.alloc_index <= index
        and b.component not in (Component.PARAMETERS, Component.GRADIENTS, Component.OPTIMIZER_STATE)
    ]
    if not candidates:
        return {}
    # the loop's own code, not a module's: a cache a model grows inside its forward (a decoder's keys
    # and values, concatenated each generation step) is the model's input to the next pass
    sites = {
        b.address: site_key(frames)
        for b in candidates
        if b.alloc_index is not None and not in_module_forward(frames := trace.frames_at(b.alloc_index))
    }
    wanted = {key for key in sites.values() if key is not None}
    if not wanted:
        return {}
    indices = trace.positions_in(ALLOC, first, index + 1, MAX_ALLOCATIONS)
    numbers, stacks = trace.stacks_at(indices)
    key_of = {number: site_key(frames) for number, frames in stacks.items()}
    by_site: dict[object, list[int]] = {}
    for position, number in zip(indices, numbers):
        key = key_of[number]
        if key in wanted:
            by_site.setdefault(key, []).append(position)
    addrs, sizes = trace.addrs, trace.sizes

    def could_chain(block: LiveBlock) -> bool:
        """The two allocations before it at its site grow up to it: a chain of three may end there."""
        same_site = by_site.get(sites.get(block.address), [])
        before = bisect.bisect_left(same_site, block.alloc_index or 0)
        return (
            before >= 2 and sizes[same_site[before - 2]] < sizes[same_site[before - 1]] < sizes[block.alloc_index or 0]
        )

    chained = [b for b in candidates if sites.get(b.address) is not None and could_chain(b)]
    if not chained:
        return {}
    # where each allocation of those sites was freed (before the target): the first free of its
    # address after it, among the frees of the watched addresses (found in C, not by a walk of events)
    watched = [position for key in {sites[b.address] for b in chained} for position in by_site[key]]
    watched_addresses = {addrs[position] for position in watched}
    frees = trace.positions_in(FREE_REQUESTED, first, index + 1)
    frees_of: dict[int, list[int]] = {}
    for position in compress(frees, map(watched_addresses.__contains__, map(addrs.__getitem__, frees))):
        frees_of.setdefault(addrs[position], []).append(position)
    freed_at: dict[int, int] = {}
    for position in watched:
        later = frees_of.get(addrs[position], ())
        after = bisect.bisect_right(later, position)
        if after < len(later):
            freed_at[position] = later[after]

    found: dict[int, tuple[tuple[int, int], ...]] = {}
    for block in chained:
        same_site = by_site[sites[block.address]]  # in event order: every step below is a bisection
        current = block.alloc_index or 0
        chain = [(current, sizes[current])]
        while True:
            before = bisect.bisect_left(same_site, current)
            if not before:
                break
            previous = same_site[before - 1]
            freed = freed_at.get(previous)
            if freed is None or freed < current or sizes[previous] >= chain[-1][1]:
                break
            following = bisect.bisect_right(same_site, current)
            if following < len(same_site) and same_site[following] < freed:
                break  # another allocation at the site while the earlier one was alive
            began = bisect.bisect_right(starts, previous)
            if began == len(starts) or starts[began] >= current:
                break  # no pass began between them
            chain.append((previous, sizes[previous]))
            current = previous
        if len(chain) >= 3:
            found[block.address] = tuple(reversed(chain))
    return found


def passes_grow(trace: DeviceTrace, spans: Sequence[PhaseSpan], index: int | None) -> bool:
    """Whether the forward passes since the last training phase grow: the last GROWING_PASSES of them
    before the one the event `index` falls in (a pass the caller judges) each left more allocated, from
    its start to the next pass's, than it found (a generation loop's key/value cache concatenated each token, a list of
    outputs kept on the device). Each pass still to come then needs more than this one, and how many
    come the file does not say."""
    if index is None:
        return False
    forwards, _ = passes_since_training(spans, index)
    starts = [f.first_index for f in forwards][-(GROWING_PASSES + 1) :]
    if len(starts) <= GROWING_PASSES:
        return False
    sizes = trace.sizes

    def net(first: int, stop: int) -> int:
        allocated = sum(sizes[i] for i in trace.positions_in(ALLOC, first, stop))
        return allocated - sum(sizes[i] for i in trace.positions_in(FREE_REQUESTED, first, stop))

    return all(net(first, stop) > 0 for first, stop in zip(starts, starts[1:]))
