"""What to change, ranked by the bytes each change saves, with "would fit on its own" judged
against what the run lacked (`Requirement`). Reads the same `Context` as the verdict tests.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from oomdoctor.analysis.accounting import place_after_freeing
from oomdoctor.analysis.attribution import preallocates, reads_weights
from oomdoctor.analysis.frame_kinds import in_activation_checkpoint, in_torch_optim, is_python_source
from oomdoctor.analysis.passes import CheckpointReplay
from oomdoctor.analysis.regions import Regions, checkpoint_regions, sequential_regions
from oomdoctor.analysis.results import (
    PHASE_BACKWARD,
    PHASE_EVALUATION,
    PHASE_FORWARD,
    PHASE_OPTIMIZER,
    PHASE_ZERO_GRAD,
    Change,
    EvidenceKind,
    Finding,
    LiveBlock,
    MeasuredRegions,
    Recommendation,
    WhatIf,
)
from oomdoctor.analysis.verdicts import (
    CUDA_CONTEXT_ALLOWANCE_BYTES,
    CUDA_CONTEXT_ALLOWANCE_PART,
    Context,
    gathered_for_save,
    graphs_pile_up,
    kept_from_earlier_passes,
    kept_outputs,
    model_states,
    rest_of_pass_lacking,
    states_assumed,
    trained_shown,
)
from oomdoctor.analysis.whatif import cache_margin, placement_limit, placement_reach
from oomdoctor.model import Frame
from oomdoctor.vocabulary import Component, Verdict

# What each change is estimated to save (the what-if checks the batch scale it implies).
NEGLIGIBLE_SAVING_PART = 100  # a change saving under 1/100 of what is needed is not shown
CHECKPOINTING_SAVES = 0.7  # of live activations, checkpointing the largest blocks
EIGHT_BIT_SAVES_OF_FOUR = 3  # an 8-bit optimizer keeps about a quarter of the state: saves 3/4
NO_GRAD_SAVES = 0.9  # of the activations a grad-mode evaluation pass keeps
CHUNKING_SAVES_OF_FOUR = 3  # computing an oversized op in chunks of a quarter saves 3/4 of the request
POOL_SAVES_OF_TWO = 1  # a pre-allocated pool sized at half saves half of the request


@dataclass(frozen=True)
class Requirement:
    """What the run lacked, which every "would fit on its own" and the what-if are judged against.

    `shortfall_bytes`: what the failed request lacked at the OOM (`Context.shortfall`).
    `projected_need_bytes`: when the model states are projected at full size (an OOM inside the first
    optimizer step, or `model-states-too-large`), what the run needs to get through: the projected
    model states, everything else live at the OOM, and the request when it grows with the batch.
    `projected_gap_bytes` is how far that is above the capacity. `placement_limit`, when the free
    bytes added up to the request but no place could take it: the largest fraction of the request
    that fits today's largest usable free block or free device memory (`whatif.placement_limit`).
    When the OOM interrupted a forward (`Context.passes.rest`): `rest_gap_bytes`, what the rest of
    the pass and its backward add to the shortfall, extrapolated from a comparable earlier pass; or
    `rest_unknown`, nothing shows the rest, so a change that covers the shortfall may still not be
    enough (its "would fit" is None); so too when the failed request was reading weights from a file
    (a model being loaded: the rest of the load is unknown).
    """

    shortfall_bytes: int | None
    projected_need_bytes: int | None = None
    projected_gap_bytes: int = 0
    placement_limit: float | None = None  # a placement failure: the largest request scale that finds a place
    placement_reach: float | None = None  # ... and the largest at which one could exist (`whatif.placement_reach`)
    # ... and the largest batch scale at which the scaled request surely finds one: today's free
    # blocks shrink with the batch where the tensors that left them did (`whatif.placement_limit`
    # with the holes), while segments cut for batch-sized tensors alone are cut smaller and leave
    # device memory free, so it can be below or above `placement_limit` (today's blocks as they are:
    # fragmentation-retrieval-class-scores 0.79 against 0.91, fragmentation-gpt-bucketed-lengths 0.96
    # against 0.84)
    batch_placement_limit: float | None = None
    rest_gap_bytes: int = 0  # the shortfall plus what the rest of the interrupted pass adds
    rest_unknown: bool = False  # the OOM interrupted a forward whose rest nothing shows

    @property
    def projecting(self) -> bool:
        return self.projected_need_bytes is not None

    @property
    def needed_bytes(self) -> int | None:
        if self.shortfall_bytes is None:
            return None
        return max(self.shortfall_bytes, self.projected_gap_bytes, self.rest_gap_bytes)

    def covered_by(self, saved_now_bytes: int, saved_projected_bytes: int) -> bool | None:
        """Whether a change saving these bytes at the OOM and of the projected need would have let the
        run fit (None: no shortfall known, or enough for the OOM instant of a pass whose rest is unknown)."""
        if self.shortfall_bytes is None:
            return None
        fits = (
            saved_now_bytes >= self.shortfall_bytes
            and saved_projected_bytes >= self.projected_gap_bytes
            and saved_projected_bytes >= self.rest_gap_bytes
        )
        return None if fits and self.rest_unknown else fits

    def spare_bytes(self, saved_now_bytes: int, saved_projected_bytes: int) -> int | None:
        """What a change saving these bytes leaves beyond what was needed, at the OOM and of the
        projected need (None: no shortfall known)."""
        if self.shortfall_bytes is None:
            return None
        return min(
            saved_now_bytes - self.shortfall_bytes,
            saved_projected_bytes - self.projected_gap_bytes,
            saved_projected_bytes - self.rest_gap_bytes,
        )


def _accumulates(ctx: Context) -> bool:
    """Whether the trace shows the run accumulating gradients already: two backwards in one step
    (the steps counted by the optimizer steps the trace shows: an update that allocates nothing has
    no span of its own, its step count still moves)."""
    backwards = [s.step for s in ctx.phases if s.phase == PHASE_BACKWARD]
    return len(backwards) != len(set(backwards))


def _checkpointed(stack: Sequence[Frame]) -> bool:
    """Whether an allocation was made inside an activation-checkpointed region (its forward, or
    its recomputation in backward)."""
    return any(in_activation_checkpoint(frame.filename) for frame in stack)


def _replayed(ctx: Context, regions: Regions) -> CheckpointReplay | None:
    """Checkpointing replayed on a completed pass of the judged pass's forward at its sizes
    (`PassHistory.checkpointed`), where its regions are the same kind, called from the same lines,
    as those the judged moment shows; else None (another structure)."""
    replay = ctx.passes.checkpointed
    if replay is None or replay.regions.sequential != regions.sequential or replay.regions.sites != regions.sites:
        return None
    return replay


def requirement(ctx: Context, verdicts: set[str]) -> Requirement:
    need = _requirement(ctx, verdicts)
    if ctx.oom is not None and need.shortfall_bytes is not None and reads_weights(ctx.request_frames):
        # the request reads weights from a file (torch.load, safetensors): the OOM interrupted a
        # load whose rest nothing shows, so a change that places this tensor may not place the next
        need = replace(need, rest_unknown=True)
    return need


def _requirement(ctx: Context, verdicts: set[str]) -> Requirement:
    shortfall = ctx.shortfall()
    limit = reach = batch_limit = None
    if ctx.placement_failure() and ctx.request:
        largest = ctx.fragmentation.largest_usable_free_block_bytes
        device_free = ctx.accounting.device_free_bytes
        limit = placement_limit(ctx.request, largest, device_free, ctx.large_segment_bytes)
        batch_limit = placement_limit(
            ctx.request, largest, device_free, ctx.large_segment_bytes, ctx.usable_holes, ctx.shrinking_segment_bytes
        )
        reach = placement_reach(
            ctx.request,
            largest,
            device_free,
            ctx.fragmentation.usable_free_bytes,
            ctx.scalable_bytes,
            ctx.large_segment_bytes,
        )
    first_step = ctx.in_first_optimizer_step()
    # model states too large only as projected on the assumption that every parameter trains (an
    # upper bound): what the run needs is not known from it
    states_too_large = Verdict.MODEL_STATES_TOO_LARGE in verdicts and not states_assumed(ctx)
    if ctx.oom is None or not ctx.capacity_bytes or not (states_too_large or first_step):
        return _rest_of_pass(
            ctx, Requirement(shortfall, placement_limit=limit, placement_reach=reach, batch_placement_limit=batch_limit)
        )
    states_now = sum(model_states(ctx))
    states_needed, _, _ = ctx.projection
    if states_needed <= states_now:
        return Requirement(shortfall, placement_limit=limit, placement_reach=reach, batch_placement_limit=batch_limit)
    others = sum(ctx.components.values()) - states_now
    need = states_needed + others + (ctx.request if ctx.request_scales else 0)
    return Requirement(
        shortfall,
        need,
        max(0, need - ctx.capacity_bytes),
        limit,
        placement_reach=reach,
        batch_placement_limit=batch_limit,
    )


def _rest_of_pass(ctx: Context, need: Requirement) -> Requirement:
    """At an OOM inside a forward: the rest of the pass and its backward still come. Extrapolated,
    what they add (beyond the failed request, which the pass's projected peak holds) raises the
    requirement; unknown, a change that covers the shortfall is not known to be enough. So is it
    when the run trains and the pass extrapolated from ran no backward (`backward_unknown`)."""
    rest = ctx.passes.rest
    if rest is None or ctx.oom is None or need.shortfall_bytes is None:
        return need
    if not rest.extrapolated:
        return replace(need, rest_unknown=True)
    extra = max(0, rest.extra_bytes - (ctx.request if ctx.request_scales else 0))
    # the request and the rest of the pass need bytes: what they lack beyond the free bytes (the
    # missing bytes plus the rest, where the free bytes fell short; on a placement failure the free
    # bytes exceeded the request, and that spare counts against the rest), or at least the gap to a
    # place for the request itself
    lacking = rest_of_pass_lacking(ctx)
    if lacking is None:  # (the headroom unknown)
        lacking = need.shortfall_bytes + extra
    return replace(need, rest_gap_bytes=max(need.shortfall_bytes, lacking), rest_unknown=backward_unknown(ctx))


def backward_unknown(ctx: Context) -> bool:
    """The rest of the interrupted pass was extrapolated from a replica's pass that ran no backward
    (DataParallel's first forward), in a run that trains or may (`Context.trains_unknown`): what
    its backward adds is unknown. (An earlier pass of this trace with no backward was a
    forward-only pass, evaluation say, as the interrupted one is.)"""
    rest = ctx.passes.rest
    return (
        rest is not None
        and rest.extrapolated
        and rest.earlier_device is not None
        and not rest.earlier_backward
        and (ctx.trains() or ctx.trains_unknown())
    )


def _makes_place(ctx: Context, freed: Sequence[LiveBlock]) -> bool:
    """Whether the failed request finds a place once the blocks `freed` are free (the layout at
    the OOM, `accounting.place_after_freeing`)."""
    if not ctx.layout or ctx.oom is None:
        return False
    return place_after_freeing(
        ctx.layout,
        {b.address for b in freed},
        request_bytes=ctx.request,
        request_stream=ctx.fragmentation.request_stream,
        device_free_bytes=ctx.accounting.device_free_bytes,
        message_bytes=ctx.accounting.message_bytes,
    )


# changes that halve the batch: the what-if sizes their saving (a fraction of its scalable bytes)
BATCH_SIZED_CHANGES = frozenset({Change.SMALLER_BATCH, Change.SMALLER_MICRO_BATCH})


def _made_by_torch_optimizer(frames) -> bool:
    """Whether the innermost Python frame of a stack is torch's optimizer code (an optimizer of the
    user's own subclasses torch's, so torch's step wrapper sits outside its frames)."""
    innermost = next((f for f in frames if is_python_source(f)), None)
    return innermost is not None and in_torch_optim(innermost.filename)


_ATTENTION_FRAMES = 4  # innermost Python frames read for the softmax and the attention (wrappers, torch's functional)


def attention_score_bytes(blocks: Sequence[LiveBlock]) -> int:
    """Live bytes of attention-score matrices an unfused attention materialised: blocks made by a
    softmax inside a function named for attention (`attention`, `attn`; both among the innermost
    Python frames, so a model's top-level function named so does not count), the blocks of that
    attention of the same sizes (the scores before the softmax), and the backward's temporaries of
    those sizes that no Python frame made (the autograd engine's gradients of the scores and of the
    softmax: torch's SDPA backward, or a hand-written softmax's div, neg and mul). Fused attention
    keeps none of them whole. Each distinct stack read once."""
    made: list[LiveBlock] = []
    engine: list[LiveBlock] = []  # the backward's frame-less temporaries
    read: dict[int, tuple[bool, bool, bool]] = {}  # id(stack) -> (in an attention, made by its softmax, Python frames)
    for block in blocks:
        if block.alloc_index is None:
            continue
        if not block.frames:
            if block.phase == PHASE_BACKWARD and block.component == Component.TEMPORARIES:
                engine.append(block)
            continue
        found = read.get(id(block.frames))
        if found is None:
            names = [f.name.lower() for f in block.frames if is_python_source(f)]
            inner = names[:_ATTENTION_FRAMES]
            attention = any("attention" in name or "attn" in name for name in inner)
            found = read[id(block.frames)] = (attention, attention and any("softmax" in n for n in inner), bool(names))
        if found[0]:
            made.append(block)
        elif not found[2] and block.phase == PHASE_BACKWARD and block.component == Component.TEMPORARIES:
            engine.append(block)
    sizes = {b.size_bytes for b in made if read[id(b.frames)][1]}
    # of the attention's other blocks of those sizes, the scores are those its softmax comes next
    # after; a block of the same size made after it (the output, where the sequence is as long as
    # a head is wide) is none
    in_order = sorted((b for b in made if b.size_bytes in sizes), key=lambda b: b.alloc_index or 0)
    scores = [
        b
        for b, following in zip(in_order, [*in_order[1:], None])
        if read[id(b.frames)][1] or (following is not None and read[id(following.frames)][1])
    ]
    return sum(b.size_bytes for b in scores) + sum(b.size_bytes for b in engine if b.size_bytes in sizes)


def _advise_fused_attention(
    ctx: Context, add: Callable[..., None], scale_after: Callable[[float], float | None]
) -> None:
    scores = attention_score_bytes(ctx.live_blocks)
    if scores:
        add(Change.FUSED_ATTENTION, scores, scale=scale_after(scores))


def balancing_saves(ctx: Context, imbalance: Finding, rest_extra: int = 0) -> int:
    """What the judged device would hold less with the work shared equally among the replicas:
    balanced, each holds about the mean of what the replicas held at their peaks (the judged one at
    its moment, plus `rest_extra`: what the rest of a pass the OOM interrupted adds, extrapolated).
    An estimate: the replicas' fixed parts (the model) are alike, and a device that holds more than
    its replica (device 0's extra modules) raises the mean, so the saving is, if anything, understated."""
    judged = ctx.allocated_bytes + rest_extra
    peaks = [judged, *(e.bytes or 0 for e in imbalance.evidence if e.kind == EvidenceKind.PEER_PEAK)]
    return judged - sum(peaks) // len(peaks)


def recommend(
    ctx: Context,
    verdicts: set[str],
    need: Requirement | None = None,
    what_if: WhatIf | None = None,
    imbalance: Finding | None = None,
) -> tuple[Recommendation, ...]:
    """Ranked changes, each with the bytes it saves and whether it alone would have let the run fit.

    "Would fit" means covering `need` (the shortfall at the OOM and, when the model states are
    projected, the projected need too); a change that only shrinks the batch must also fit in the
    what-if at the scale it implies, so the two sections of a report never disagree. A change that
    would save under 1% of what was needed is left out.
    """
    if need is None:
        need = requirement(ctx, verdicts)
    c = ctx.components
    activations = c.get(Component.ACTIVATIONS, 0)
    rest = ctx.passes.rest
    rest_extra = 0  # what the rest of the pass the OOM interrupted adds, extrapolated
    rest_growth = 0  # what the pass's own bytes grow by to that peak
    projected_rest = rest is not None and rest.extrapolated and what_if is not None and what_if.rest_of_pass is rest
    if projected_rest and rest is not None:
        # at the interrupted pass's projected peak, less the earlier outputs its rest frees
        rest_growth = max(0, rest.projected_pass_bytes - rest.pass_bytes)
        rest_extra = max(0, rest_growth - rest.freed_scaled_bytes)
        activations += rest_extra
    # the OOM cut a forward short whose rest nothing shows: a change whose saving grows with the
    # pass (its activations, its batch, the judged device's excess over the replicas) saves at the
    # pass's peak at least what it saves at the OOM, so that saving is a lower bound
    rest_unseen = rest is not None and ctx.oom is not None and not projected_rest
    # the interrupted pass's sites grew by ratios of their own: its rest's allocations at sites it had
    # not reached are scaled by a guess (passes._commonest_ratio), so the figure is an estimate that
    # can be off either way, and a smaller batch is not said to fit by it. (Rehearsed, the GPT whose
    # sequence doubled: its halved micro-batch peaked at 114 MiB allocated, as the figure says, within
    # the 130 MiB device, yet its cache needed 140 MiB: a fit by allocated bytes alone is thin there)
    rest_guessed = projected_rest and rest is not None and rest.by_site
    parameters, gradients, optimizer_state, _ = model_states(ctx)
    seen = ctx.phases_seen()
    # a trace of one forward of a training run (the gradients of an earlier backward are alive) trains too
    # and so does one that something besides its phases tells trains (a replica's trace, the
    # judged moment's frames, the process's annotations)
    training = (
        bool(seen & {PHASE_BACKWARD, PHASE_OPTIMIZER})
        or ctx.trains_beyond_phases()
        or bool(gradients or optimizer_state)
    )
    # the judged moment is in a pass that does not train (an evaluation loop's, by its frames or
    # annotations): it saves nothing for a backward, so there is no graph to checkpoint and no
    # gradient to accumulate over micro-batches, whatever the run did before
    pass_trains = training and ctx.target_phase != PHASE_EVALUATION
    # nothing in the file tells whether the run trains (the first passes of the trace, no backward,
    # no optimizer called yet: `Context.trains_unknown`): the advice for a pass that trains is given
    # on that condition, its saving the estimate for a run that does, and whether it fits not said
    # (it saves nothing if not)
    maybe_trains = not training and ctx.trains_unknown() and ctx.target_phase != PHASE_EVALUATION
    found: list[Recommendation] = []
    # without an OOM or a risk, only a change that removes waste is advised (fused attention
    # materialises no score matrices, at no cost), none that trades speed or batch for memory
    waste_only = verdicts == {Verdict.NO_OOM}
    scalable = what_if.scalable_bytes if what_if is not None else ctx.scalable_bytes
    needed = need.needed_bytes
    # what a change must save not to be noise: a hundredth of what was needed, or without an OOM
    # (advice sized against the peak) of the peak
    noise_floor = needed if needed is not None else ctx.allocated_bytes if ctx.oom is None else None

    def add(
        rec_id: str,
        saved: float,
        saved_projected: float | None = None,
        scale: float | None = None,
        request_scale: float | None = None,
        fit_unknown: bool = False,
        rule_of_thumb: bool = False,
        freed: Sequence[LiveBlock] | None = None,
        at_least: bool = False,
        if_trains: bool = False,
        peak_at_most: int | None = None,
        rest_fits: bool | None = None,
        fit_only: bool = False,
        regions: MeasuredRegions | None = None,
    ) -> None:
        """`scale`: the batch scale the change amounts to (checked against the what-if);
        `request_scale`: the fraction of the failed request that remains (a placement failure fits
        when that fraction finds a place); `at_least`: the saving is a lower bound; `if_trains`:
        the change applies only if the run trains, which the file cannot tell (its fit unknown);
        `rule_of_thumb`: the saving is a fixed share, which can be off either way (its fit unknown,
        and the reports say it is one);
        `peak_at_most`: the saving is the judged moment's, and the run's peak falls at most this below
        what the moment held (what the change frees is made again later; the fit is the moment's);
        `rest_fits`: False where the change makes no bytes free beyond those the rest of the
        interrupted pass was already counted against, and they fell short (its fit is then no);
        `fit_only`: a fit is claimed, never "not enough";
        `regions`: the checkpointing regions the saving was measured from, and how (the reports name
        them)."""
        saved_now = int(saved)
        projected = saved_now if saved_projected is None else int(saved_projected)
        shown = projected if need.projecting else saved_now
        if shown <= 0 or (noise_floor is not None and shown * NEGLIGIBLE_SAVING_PART < noise_floor):
            return
        fits = need.covered_by(saved_now, projected)
        if fits and rest_fits is False:
            fits = False
        # a fit by allocated bytes leaves the room for the cache's segments that the what-if leaves
        # (`whatif.cache_margin`; a batch scale is checked there, a placement failure by the layout
        # below, and expandable segments grow by pages, not whole segments): with less to spare the
        # changed run needs segments the file does not show, unless the layout at the OOM places the
        # request once the blocks the change frees are free. (Rehearsed, an 8-bit optimizer that left
        # 7.8 MiB spare ran out on a 16 MiB request with 12 MiB free on the device; foreach=False, 6
        # MiB spare and a place once its temporaries are free, fitted)
        if (
            fits
            and scale is None
            and need.placement_limit is None
            and rec_id not in (Change.EXPANDABLE_SEGMENTS, Change.UPGRADE_FOR_EXPANDABLE_SEGMENTS)
            and (need.spare_bytes(saved_now, projected) or 0) < cache_margin(ctx.large_segment_bytes)
        ):
            fits = True if freed is not None and _makes_place(ctx, freed) else None
        if fits is False and request_scale is not None and need.placement_limit is not None:
            fits = request_scale <= need.placement_limit and projected >= need.projected_gap_bytes
            if fits and need.rest_unknown:
                fits = None  # a place for the request now; the rest of the interrupted pass is unknown
        if fits and scale is not None:
            fits = what_if.fits_at(scale) if what_if is not None else False
        elif fits is None and scale is not None and what_if is not None and what_if.fits_at(scale) is False:
            fits = False  # not enough even at the OOM instant of the interrupted pass
        # a smaller batch shrinks the request itself where it grows with the batch (the what-if
        # then checks its place); expandable segments map free pages as one range
        makes_a_place = rec_id in (Change.EXPANDABLE_SEGMENTS, Change.UPGRADE_FOR_EXPANDABLE_SEGMENTS) or (
            rec_id in BATCH_SIZED_CHANGES and what_if is not None and what_if.placement_limit_scale is not None
        )
        if need.placement_limit is not None and request_scale is None and not makes_a_place:
            # the request failed for want of one place, not of bytes: a change that frees known
            # blocks fits where their freeing leaves one (the layout at the OOM says, whatever the
            # byte count); any other is not known to
            if freed is not None and _makes_place(ctx, freed):
                fits = (
                    None
                    if need.rest_unknown
                    else projected >= need.projected_gap_bytes and projected >= need.rest_gap_bytes or None
                )
            elif fits:
                fits = None
        if fits and (fit_unknown or if_trains):
            fits = None
        if rule_of_thumb or (fit_only and fits is False):  # a saving from a fixed share can be off either way
            fits = None
        if peak_at_most is not None:
            # at the moment the run peaked, the fixed run holds at most the saving less
            peak_at_most = min(peak_at_most, shown)
        found.append(
            Recommendation(
                rec_id,
                shown,
                fits,
                saved_at_least=at_least,
                if_trains=if_trains,
                peak_saved_at_most_bytes=peak_at_most,
                rule_of_thumb=rule_of_thumb,
                regions=regions,
            )
        )

    def scale_after(saved_bytes: float) -> float | None:
        """The batch scale whose what-if peak is this saving below today's."""
        return 1 - saved_bytes / scalable if scalable else None

    if waste_only:
        _advise_fused_attention(ctx, add, scale_after)
        return tuple(found)

    # In the optimizer step (or its zero_grad) every gradient the backward made is there, freed
    # before the forward or not, and the backward has released what forward saved for it: freeing
    # stale gradients and checkpointing save nothing at such a moment (they do in the forward)
    in_step = ctx.target_phase in (PHASE_OPTIMIZER, PHASE_ZERO_GRAD)
    if (
        activations
        and (pass_trains or maybe_trains)
        and not in_step
        and Verdict.INFERENCE_WITH_GRAD not in verdicts
        and Verdict.EVAL_OUTPUTS_KEPT not in verdicts  # kept outputs are no graph to checkpoint
        and verdicts
        & {
            Verdict.ACTIVATION_SPIKE,
            Verdict.OPTIMIZER_STATE_BUILDUP,
            Verdict.CREEPING_LEAK,
            Verdict.OVERSIZED_REQUEST,
            Verdict.UNKNOWN,
            Verdict.NO_OOM,
            Verdict.GRADIENTS_KEPT,
        }
    ):
        earlier, _, _ = ctx.old_bytes((Component.ACTIVATIONS,))
        live_activations = c.get(Component.ACTIVATIONS, 0)
        live = [b for b in ctx.live_blocks if b.component == Component.ACTIVATIONS]
        # the blocks a forward calls in a loop, else the segments of a Sequential of torch's own modules
        regions = checkpoint_regions(live, ctx.target_step) or sequential_regions(live, ctx.target_step, ctx.pass_freed)
        grows = 1.0  # the interrupted pass's extrapolated activations over those at the OOM
        bound = False  # the saving is a lower bound (at the OOM of an interrupted pass not replayed)
        beside = 0  # the gradients counted beside the largest region's recomputation
        replay = _replayed(ctx, regions) if regions is not None else None
        if regions is not None and replay is not None:
            # replayed on a completed pass of this forward at this pass's sizes (an interrupted pass's
            # rest's, or a comparable step's for a moment in a backward): its regions, their count and
            # what each recomputes, beside all the backward holds by then, are the whole pass's, not
            # those of the calls an interrupted pass made so far; the graphs earlier passes kept as at
            # the moment
            saved = replay.saved_bytes + regions.earlier_saved_bytes
            grows = 1 + rest_growth / max(1, live_activations - earlier)
            regions = replay.regions  # the reports name its count and the pass replayed
        elif regions is not None and (rest_growth or rest_unseen):
            # an interrupted pass whose whole pass the trace does not replay (its rest extrapolated
            # from a replica's, or from a pass of another structure, or shown by nothing: one of the
            # trace's first passes): the calls it made so far, cut as they are, at the OOM. The rest
            # runs more of them: at least that (lower bound)
            saved = regions.pass_saved_bytes + regions.earlier_saved_bytes
            bound = True
        elif regions is not None:
            # measured from the file: the regions the pass calls, checkpointed, keep their inputs and
            # recompute the largest (`regions`); the graphs earlier passes kept shrink to their inputs.
            # In a backward no pass replays, each region still alive is recomputed beside the gradients
            # the backward makes from here on: at most those of every parameter that trains and has
            # none yet (ctx.trained), all counted beside the largest
            beside = max(0, ctx.trained - gradients) if ctx.target_phase == PHASE_BACKWARD else 0
            saved = regions.pass_saved_beside(beside) + regions.earlier_saved_bytes
            # the saving less for them: at least what is said
            beside = beside if saved < regions.pass_saved_bytes + regions.earlier_saved_bytes else 0
        else:
            # no regions the stacks tell apart (no stacks, one call, a Sequential's one module):
            # a rule of thumb of this pass's own activations, said to be one. What earlier
            # steps left alive it does not count, nor what checkpointed regions make (their outputs,
            # or their inside while one runs): the run checkpoints those already, in the live
            # blocks' share (the rest of an interrupted pass runs the same layers)
            checkpointed = sum(
                b.size_bytes
                for b in ctx.live_blocks
                if b.component == Component.ACTIVATIONS and _checkpointed(b.frames)
            )
            unchecked = 1 - checkpointed / live_activations if live_activations else 1
            saved = int(max(0, live_activations - earlier + rest_growth) * unchecked * CHECKPOINTING_SAVES)
        add(
            Change.ACTIVATION_CHECKPOINTING,
            saved,
            scale=scale_after(saved),
            at_least=rest_unseen or bound or beside > 0,
            if_trains=not pass_trains,
            rule_of_thumb=regions is None,
            # rehearsed with the regions checkpointed as the reports say (docs/definitions.md): the
            # figure replayed on a completed pass of the judged pass's sizes came within 0.1 MiB, and
            # each fit it gave held; replayed on a pass projected from a shorter sequence it ran 8%
            # low; the bounds held. A fit is claimed from a figure nothing extrapolated; none from one
            # replayed on an extrapolated pass, nor from a Sequential's segments (an interrupted CNN
            # read from the calls seen said 32.7 MiB for 29.8 saved by the cut that gave, 57.7 by the
            # whole pass's, now said), and "not enough" never
            fit_only=True,
            fit_unknown=grows > 1 or bound or (regions is not None and regions.sequential),
            regions=None
            if regions is None
            else MeasuredRegions(
                regions.count,
                regions.sites,
                regions.sequential,
                regions.loops,
                replay.step if replay is not None else None,
                bound,
                beside,
            ),
        )
    if scalable and Verdict.EVAL_OUTPUTS_KEPT not in verdicts:  # a smaller batch keeps the same outputs, in more pieces
        if (
            pass_trains and Verdict.INFERENCE_WITH_GRAD not in verdicts
        ):  # an evaluation pass has no gradients to accumulate
            # accumulating over two micro-batches keeps the first one's gradients, every trained
            # parameter's, alive through the second's forward and backward: at a moment in a pass,
            # what of them it did not hold yet comes back (the peak moves by it, so does the scale
            # checked); between steps or in the optimizer step the micro-batches change nothing there;
            # a run that accumulates already holds them in its later micro-batches, and at a moment
            # of its first neither run does
            in_pass = ctx.target_phase in (PHASE_FORWARD, PHASE_BACKWARD)
            held_over = max(0, ctx.trained - gradients) if in_pass and not _accumulates(ctx) else 0
            # what two or more earlier steps left alive (a leak's kept tensors) grows per step, and a
            # step of two half micro-batches keeps as much as one whole: that part does not halve (a
            # loop variable holding the latest step's output, one step's, does)
            kept_before, steps, _ = ctx.old_bytes((Component.ACTIVATIONS, Component.TEMPORARIES, Component.INPUTS))
            unhalved = min(kept_before, scalable) // 2 if len(steps) >= 2 else 0
            saved = scalable // 2 - unhalved - held_over
            if saved <= 0 and held_over and not trained_shown(ctx):
                # the gradients held over would take all it saves only as if every parameter trained,
                # which the file does not show (a LoRA base gets none): a smaller batch holds none
                # over; whether it fits is unknown, as the gradients the rest of the step makes are
                add(
                    Change.SMALLER_BATCH,
                    scalable // 2 - unhalved,
                    scale=0.5 + unhalved / scalable,
                    at_least=rest_unseen,
                    fit_unknown=True,
                )
            else:
                add(
                    Change.SMALLER_MICRO_BATCH,
                    saved,
                    scale=0.5 + (unhalved + held_over) / scalable,
                    at_least=rest_unseen,
                    fit_unknown=rest_guessed or ctx.passes_grow,
                )
        else:
            # where every earlier pass's graph stays, each pass still to come adds a (smaller) one:
            # a smaller batch runs out later, and whether the loop ends first the file does not say
            add(
                Change.SMALLER_BATCH,
                scalable // 2,
                scale=0.5,
                fit_unknown=rest_guessed
                or (Verdict.INFERENCE_WITH_GRAD in verdicts and graphs_pile_up(ctx))
                or ctx.passes_grow,
                at_least=rest_unseen,
            )
    step_temporaries = (
        [b for b in ctx.live_blocks if b.component == Component.TEMPORARIES and b.phase == PHASE_OPTIMIZER]
        if ctx.target_phase == PHASE_OPTIMIZER
        else []
    )
    # without an OOM, advice is sized against the peak: a risk there with optimizer state its largest
    # part gets the change that shrinks that part too
    state_dominates = optimizer_state > 0 and max(c.values(), default=0) == optimizer_state
    if (
        Verdict.OPTIMIZER_STATE_BUILDUP in verdicts
        or Verdict.MODEL_STATES_TOO_LARGE in verdicts
        or (Verdict.NO_OOM in verdicts and state_dominates)
    ):
        _, projected_state, _ = ctx.projection
        saved_state = optimizer_state * EIGHT_BIT_SAVES_OF_FOUR // 4
        saved_projected_state = projected_state * EIGHT_BIT_SAVES_OF_FOUR // 4
        # an 8-bit optimizer's step updates each parameter in place, in one kernel (bitsandbytes): the
        # step's foreach temporaries go too, so where they and the state's saving together would
        # cover the need, the state's saving alone being short does not make the change not enough.
        # (Rehearsed, model-states-too-large-mlp-sgd with momentum kept at a quarter and updated in
        # place fitted, 18 MiB of the device free at its peak, where "not enough on its own" was said)
        step_made = sum(b.size_bytes for b in step_temporaries)
        add(
            Change.EIGHT_BIT_OPTIMIZER,
            saved_state,
            saved_projected_state,
            fit_only=bool(step_made)
            and need.covered_by(saved_state + step_made, saved_projected_state + step_made) is not False,
        )
    if step_temporaries:
        # torch's optimizers make them in their foreach lists; an optimizer of the user's own builds
        # new tensors where it could update in place
        own = any(b.frames for b in step_temporaries) and not any(
            _made_by_torch_optimizer(b.frames) for b in step_temporaries
        )
        # one parameter at a time, the update still makes that parameter's temporaries: the
        # largest of today's blocks (a foreach list holds one per parameter) stays
        made = sum(b.size_bytes for b in step_temporaries)
        largest = max(step_temporaries, key=lambda b: b.size_bytes)
        freed = step_temporaries if own else [b for b in step_temporaries if b is not largest]
        add(
            Change.IN_PLACE_OPTIMIZER if own else Change.FOREACH_FALSE,
            made if own else made - largest.size_bytes,
            freed=freed,
        )
    if Verdict.GRADIENTS_KEPT in verdicts and not in_step:
        stale = ctx.old_blocks((Component.GRADIENTS,), pre_trace=True)
        # freed before the forward, the stale gradients are gone at the judged moment; but the next
        # backward makes them again, and from then on to the next zero_grad they are alive beside
        # the parameters, the optimizer state and the buffers: the run's new peak is at least those
        # model states, so its peak drops by at most what the judged moment held (with the failed
        # request) beyond them. (Rehearsed, gradients-kept-mlp-plain-sgd: 50.1 MiB freed at the OOM,
        # the peak 16.9 MiB lower; the bound says 17.0.)
        demand = ctx.allocated_bytes + (ctx.request if ctx.oom is not None else 0)
        # with no optimizer step in sight they may be accumulated on purpose: then freeing them is
        # no change the run can make, and whether it would fit is not said
        add(
            Change.ZERO_GRAD_SET_TO_NONE,
            sum(b.size_bytes for b in stale),
            fit_unknown=ctx.gradients_maybe_accumulated(),
            freed=stale,
            peak_at_most=max(0, demand - sum(model_states(ctx))),
        )
    if Verdict.CREEPING_LEAK in verdicts:
        leaked = ctx.old_blocks((Component.ACTIVATIONS, Component.TEMPORARIES, Component.INPUTS))
        add(Change.FREE_KEPT_TENSORS, sum(b.size_bytes for b in leaked), freed=leaked)
    if Verdict.FRAGMENTATION in verdicts and ctx.expandable_on is not True:
        # it makes the free pieces one place: the rest of an interrupted pass was counted against
        # every free byte already (the headroom), so where that fell short it is not enough
        lacking = rest_of_pass_lacking(ctx)
        add(
            Change.EXPANDABLE_SEGMENTS if ctx.expandable_available else Change.UPGRADE_FOR_EXPANDABLE_SEGMENTS,
            ctx.fragmentation.usable_free_bytes,
            rest_fits=None if lacking is None else lacking <= 0,
            # passes that each grow (a generation loop's cache), or a leak that keeps more each
            # step: a place now only moves the OOM on, to a pass or step the file does not show
            fit_unknown=ctx.passes_grow or Verdict.CREEPING_LEAK in verdicts,
        )
    if Verdict.INFERENCE_WITH_GRAD in verdicts:
        graph = [
            b
            for b in ctx.live_blocks
            if b.component in (Component.ACTIVATIONS, Component.TEMPORARIES)
            and b.alloc_index is not None
            and b.step == ctx.target_step
        ]
        # no_grad frees most of them (NO_GRAD_SAVES): certainly the earlier passes' kept graphs
        add(
            Change.NO_GRAD,
            sum(b.size_bytes for b in graph) * NO_GRAD_SAVES,
            freed=kept_from_earlier_passes(ctx),
        )
    if Verdict.EVAL_OUTPUTS_KEPT in verdicts:
        outputs = kept_outputs(ctx)  # moved to the CPU (or reduced) as made, the earlier passes' outputs go
        add(
            Change.OUTPUTS_TO_CPU,
            outputs.kept_bytes if outputs is not None else 0,
            freed=outputs.blocks if outputs is not None else None,
        )
    if Verdict.CHECKPOINT_GATHER in verdicts:
        gathered = gathered_for_save(ctx)  # gathered to the CPU, the copies go; one unit's unshard may stay
        add(Change.STATE_DICT_TO_CPU, gathered.live_bytes if gathered is not None else 0)
    if Verdict.MODEL_STATES_TOO_LARGE in verdicts:
        states = parameters + gradients + optimizer_state
        states_needed, _, _ = ctx.projection
        if states_assumed(ctx):  # projected on the assumption every parameter trains: the states held only
            states_needed = states + c.get(Component.BUFFERS, 0)
        buffers = c.get(Component.BUFFERS, 0)
        # sharding the parameters saves at most half the states: each unit's parameters are gathered
        # whole for its forward and backward, and its gradient is whole until reduced, and how large the
        # units are (the wrapping policy) the file does not show, so no fit is claimed from the half.
        # (Rehearsed with every Linear a unit over two ranks, model-states-too-large-mlp-adamw ran out
        # in step 1's backward with 124 MiB allocated on 160 MiB, a 16 MiB request with the cache's 26
        # MiB in pieces, where 100 MiB saved was said to fit with 60 MiB to spare; -mlp-sgd fitted with
        # nothing to spare, or ran out where the model was built on the device before it was sharded.)
        # Where every parameter is taken to train, the gradients and state still to come are unknown too
        if training and ctx.parameters_sharded():
            # sharded already: over twice the ranks each holds half of its shards, at most half of what
            # it holds now; the units it gathers whole for their forward and backward, and gradients
            # not yet reduced, stay as large, so no fit is claimed from the half either
            add(Change.SHARD_OVER_MORE_GPUS, states // 2, (states_needed - buffers) // 2, fit_unknown=True)
        elif training and ctx.optimizer_state_sharded():
            # the state is this rank's share already; halving what is not sharded yet
            add(Change.SHARD_GRADIENTS_AND_PARAMETERS, (parameters + gradients) // 2, fit_unknown=True)
        elif training:
            add(
                Change.SHARD_MODEL_STATES,
                states // 2,
                (states_needed - buffers) // 2,
                fit_unknown=True,
            )
        else:  # weights alone (inference, or a model being loaded): no gradients or optimizer state to shard
            add(Change.SMALLER_WEIGHTS, parameters // 2)
    if not in_step:
        _advise_fused_attention(ctx, add, scale_after)
    if imbalance is not None:
        saved = balancing_saves(ctx, imbalance, rest_extra)  # at the pass's projected peak, as halving the batch
        add(Change.BALANCE_DEVICES, saved, scale=scale_after(saved), at_least=rest_unseen)
    gathering = None
    if Verdict.OVERSIZED_REQUEST in verdicts and Verdict.EVAL_OUTPUTS_KEPT in verdicts and ctx.request:
        outputs = kept_outputs(ctx)
        gathering = outputs is not None and ctx.request >= outputs.kept_bytes
    if Verdict.OVERSIZED_REQUEST in verdicts and Verdict.CHECKPOINT_GATHER in verdicts and ctx.oom is not None:
        # the request is the save's (`gathered_for_save` reads its stack): a tensor the state dict keeps
        gathering = gathering or gathered_for_save(ctx) is not None
    if Verdict.OVERSIZED_REQUEST in verdicts and not gathering:
        # (a request that holds every kept output is their concatenation, or a tensor a checkpoint's
        # state dict gathers: its result is what the run keeps, whole, so computing it in pieces
        # saves nothing; keeping them off the device does. Rehearsed, checkpoint-gather-mlp-adam with
        # each moment gathered in four pieces still ran out, 207.5 MiB allocated on 224 MiB, where
        # chunking was said to save about 48 MiB)
        # without an OOM, the request that hit the limit and was retried
        request = ctx.request or max((n.request_bytes for n in ctx.near_ooms), default=0)
        if ctx.oom is not None and preallocates(ctx.request_frames):
            # the request is a pool made up front (a serving engine's KV cache): one tensor sized by
            # a setting, not an operation whose input could be split; a smaller pool is smaller
            add(Change.SMALLER_PREALLOCATION, request * POOL_SAVES_OF_TWO // 2, request_scale=POOL_SAVES_OF_TWO / 2)
        elif ctx.oom is not None and reads_weights(ctx.request_frames):
            # a tensor read from a file (a weight being loaded): no operation to split; the weights
            # held in less memory are (and the rest of the load with them)
            if Verdict.MODEL_STATES_TOO_LARGE not in verdicts:
                add(Change.SMALLER_WEIGHTS, (parameters + request) // 2)
        else:
            add(
                Change.CHUNK_LARGE_OP,
                request * CHUNKING_SAVES_OF_FOUR // 4,
                request_scale=(4 - CHUNKING_SAVES_OF_FOUR) / 4,
            )
    if Verdict.OUTSIDE_PYTORCH in verdicts and ctx.accounting.non_pytorch_bytes:
        add(
            Change.FREE_OTHER_PROCESSES,
            ctx.accounting.non_pytorch_bytes
            - min(
                CUDA_CONTEXT_ALLOWANCE_BYTES, (ctx.accounting.device_total_bytes or 0) // CUDA_CONTEXT_ALLOWANCE_PART
            ),
        )
    found.sort(key=lambda r: -r.estimated_saved_bytes)
    return tuple(found)
