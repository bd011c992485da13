"""Analysis: pure functions from a `Snapshot` to an `Analysis` result (DESIGN §5).

`analyse(snapshot)` judges one device (the failing one unless `device` is given): it replays the
trace back to the fatal OOM (or the peak), accounts for every byte there, measures fragmentation,
assigns each event a step and phase and each live byte a component, and picks a verdict with its
evidence, recommendations and a what-if for the batch size. No I/O, no printing.

    analysis = analyse(snapshot)
    analysis.verdict, analysis.confidence, analysis.summary, analysis.evidence
    analysis.component_bytes()              # {"parameters": ..., ...} at the OOM (or peak, or dump)
    analysis.accounting, analysis.fragmentation, analysis.what_if, analysis.recommendations
    analysis.what_if.fits_at(0.5)           # the model every "would fit on its own" agrees with
    analysis.replay.series                  # downsampled memory over time, by component
    analysis.phases                         # PhaseSpan runs covering every event, with their source
    analysis.live_blocks                    # every live block: component, method, confidence, frames

    replayer(snapshot, device).state_at(i)  # EventState after event i: live blocks, segment layout
    analyser(snapshot).analyse(i)           # analyse(snapshot, at_event=i); the device read once for every i

The verdict set and each verdict's test are documented in docs/verdicts.md, with the requirement
(`recommendations.requirement`: shortfall at the OOM, projected model states, placement failures) that the
recommendations' "would fit on its own" and the what-if are both judged against.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

from oomdoctor.analysis import accounting as _accounting
from oomdoctor.analysis import attribution as _attribution
from oomdoctor.analysis import devices as _devices
from oomdoctor.analysis import phases as _phases
from oomdoctor.analysis.frame_kinds import in_torch_optim
from oomdoctor.analysis.holes import placement_layout
from oomdoctor.analysis.passes import (
    Replica,
    pass_history,
    passes_grow,
    passes_since_training,
    running_concatenations,
)
from oomdoctor.analysis.reading import DeviceDump as _DeviceDump
from oomdoctor.analysis.reading import expandable_from_segments, peak_unsized, place, read_device, replay
from oomdoctor.analysis.recommendations import Requirement, backward_unknown, recommend, requirement
from oomdoctor.analysis.replay import (
    LiveHistory,
    ReplayState,
    columns,
    event_state,
    lay_out,
    near_ooms,
    ooms_of,
    segments_at,
)
from oomdoctor.analysis.results import (
    FORWARD_PASSES,
    METHOD_LIFETIME,
    METHOD_NONE,
    METHOD_PHASE,
    METHOD_SIZE_OUTWEIGHS,
    PHASE_BACKWARD,
    PHASE_BETWEEN,
    PHASE_FORWARD,
    PHASE_OPTIMIZER,
    PHASE_UNKNOWN,
    SOURCE_MARKERS,
    SOURCE_NONE,
    TRAINING_PHASES,
    Accounting,
    Analysis,
    ComponentShare,
    DeviceSummary,
    EventState,
    Finding,
    Fragmentation,
    FreeHole,
    LiveBlock,
    OomEvent,
    Recommendation,
    ReplaySummary,
    StepSummary,
    Summary,
    Unknown,
    UnknownKind,
    WhatIf,
    WhatIfBasis,
    WhatIfUnknown,
)
from oomdoctor.analysis.sizing import LARGE_SEGMENT_BYTES, MIN_BLOCK_BYTES
from oomdoctor.analysis.timeline import Replayer
from oomdoctor.analysis.verdicts import Context, diagnose, graphs_pile_up
from oomdoctor.analysis.whatif import cache_margin, request_scales, scalable_bytes, what_if
from oomdoctor.dump_metadata import NO_METADATA, DumpMetadata, Marker
from oomdoctor.gcpause import cyclic_gc_paused
from oomdoctor.metadata import HISTORY_RESTORED
from oomdoctor.model import ALLOC, FREE_COMPLETED, FREE_REQUESTED, OOM, DeviceTrace, Segment, Snapshot, Stack
from oomdoctor.vocabulary import Component, Verdict

__all__ = ["analyse", "analyser", "replayer", "Analyser", "Analysis", "Replayer", "RESULT_SCHEMA_VERSION"]

RESULT_SCHEMA_VERSION = 1


def _pick_device(snapshot: Snapshot, metadata: DumpMetadata) -> int:
    oom = metadata.oom
    if oom is not None and oom.device is not None and oom.device in snapshot.devices:
        return oom.device
    latest: tuple[int, int] | None = None
    for device, trace in enumerate(snapshot.traces):
        trace = columns(trace)
        if OOM not in trace.actions:
            continue
        index = len(trace.actions) - 1 - trace.actions[::-1].index(OOM)
        moment = trace.times_us[index] or 0 if trace.times_us is not None else 0
        if latest is None or moment > latest[0]:
            latest = (moment, device)
    if latest is not None:
        return latest[1]
    reserved: dict[int, int] = {}
    for segment in snapshot.segments:
        reserved[segment.device] = reserved.get(segment.device, 0) + segment.total_size
    if reserved:
        return max(reserved, key=lambda d: reserved[d])
    devices = snapshot.devices
    return devices[0] if devices else 0


def _fatal_oom(trace: DeviceTrace, oom_indices: list[int], metadata: DumpMetadata) -> int | None:
    if not oom_indices:
        return None
    oom = metadata.oom
    times = trace.times_us
    if oom is not None and oom.time_us is not None and times is not None:
        wanted = oom.time_us
        return min(oom_indices, key=lambda i: (abs((times[i] or 0) - wanted), -i))
    return oom_indices[-1]


def _optimizer_kind(registry: _attribution.Registry, blocks) -> str | None:
    for _, name, _ in registry.by_address.values():
        if name.endswith("exp_avg") or name.endswith("exp_avg_sq"):
            return "adam"
        if name.endswith("momentum_buffer"):
            return "sgd"
    seen: set[int] = set()
    for block in blocks:
        if id(block.frames) in seen:  # stacks are shared: read each once
            continue
        seen.add(id(block.frames))
        for frame in block.frames:
            filename = frame.path
            if in_torch_optim(filename):
                if "adam" in filename:
                    return "adam"
                if "sgd" in filename:
                    return "sgd"
                if filename.endswith("/adagrad.py"):
                    return "adagrad"
            elif (block.component == Component.OPTIMIZER_STATE or block.phase == PHASE_OPTIMIZER) and _LION_FILE.search(
                filename.rsplit("/", 1)[-1]
            ):
                return "lion"  # made in lion-pytorch's lion_pytorch.py, a lion.py of the user's: one moment
    return None


def _recorded_moments(metadata: DumpMetadata) -> int | None:
    """The moments per parameter of every optimizer the process held, as capture recorded their
    kinds (metadata `optimizer_kinds`); None where it did not record each one the dump counts
    (older dumps, entries the loader dropped), did not know one's count, or the counts differ."""
    kinds = metadata.optimizer_kinds
    if not kinds or metadata.optimizers != len(kinds):
        return None
    counts = {kind.moments for kind in kinds}
    if len(counts) != 1:
        return None
    return counts.pop()


# A Lion optimizer's file (lion-pytorch's `lion_pytorch.py`, a `lion.py`), whose state a block was made in
_LION_FILE = re.compile(r"(?:^|[_-])lion(?:[_.-])", re.IGNORECASE)


def replayer(snapshot: Snapshot, device: int) -> Replayer:
    """A `Replayer` for one device: `replayer(s, d).state_at(i)` is the state right after event i."""
    settings = snapshot.allocator_settings
    divisions = settings.rounding_divisions if settings is not None else ()
    trace = snapshot.traces[device] if 0 <= device < len(snapshot.traces) else ()
    return Replayer(trace, snapshot.segments_on(device), divisions)


@dataclass(frozen=True, slots=True)
class _Target:
    """The moment judged and the allocator's state right after it."""

    index: int | None  # None: the dump's own state
    kind: str  # "oom" | "peak" | "dump"
    fatal_index: int | None  # the OOM that stopped the run
    state: EventState
    notes: tuple[Unknown, ...]  # what rebuilding the state could not know
    allocated_bytes: int  # right after it, by docs/definitions.md ("The peak"): the peak's figure at the peak


@dataclass(frozen=True, slots=True)
class _Accounted:
    """Every byte at the target: the OOM events, the failed request, fragmentation and accounting."""

    ooms: tuple[OomEvent, ...]
    fatal: OomEvent | None
    request_bytes: int | None
    large_segment_bytes: int
    fragmentation: Fragmentation
    accounting: Accounting
    capacity_bytes: int | None  # what PyTorch could have had: reserved + device free, else the device total
    layout: tuple[Segment, ...] = ()  # the segments and their blocks at the target


@dataclass(frozen=True, slots=True)
class _Moment:
    """Where in the training loop the target fell, and the steps the trace holds."""

    phase: str
    step: int | None
    steps: tuple[StepSummary, ...]


@dataclass(frozen=True, slots=True)
class _Judgement:
    """The verdict and the changes recommended for it."""

    primary: Finding
    secondary: tuple[Finding, ...]
    recommendations: tuple[Recommendation, ...]
    what_if: WhatIf


def analyse(
    snapshot: Snapshot, *, device: int | None = None, series_points: int = 480, at_event: int | None = None
) -> Analysis:
    """Judge one device of `snapshot`, the failing one unless `device` is given (see the module's
    docstring); `series_points` bounds the memory-over-time series. `at_event` judges the state
    right after that event instead (a step's peak, say: `oomdoctor diff --steps`), as the OOM when
    it is the fatal one, else as a peak without an OOM. To judge several moments of one device,
    `analyser` reads it once for all of them."""
    return analyser(snapshot, device=device, series_points=series_points).analyse(at_event)


def analyser(snapshot: Snapshot, *, device: int | None = None, series_points: int = 480) -> Analyser:
    """An `Analyser` of one device of `snapshot` (the failing one unless `device` is given):
    `analyser(s).analyse(i)` is `analyse(s, at_event=i)`, and each further moment costs only its own
    judging."""
    return Analyser(snapshot, device, series_points)


class Analyser:
    """One device of a snapshot read and its trace replayed once, for judging any number of its
    moments: what `analyse` works out before it picks its moment (the device's phases and
    placements from before the trace, the replay, the bound on the peak's unsized remainders, the
    other devices' readings) depends on the snapshot alone, and each `analyse(at_event)` reuses it.
    A diff's target and peak, a rank's peak and a plan's phase peaks are each judged this way."""

    __slots__ = ("snapshot", "_dump", "_state", "_unsized", "_peers", "_judged")

    def __init__(self, snapshot: Snapshot, device: int | None = None, series_points: int = 480) -> None:
        self.snapshot = snapshot
        with cyclic_gc_paused():  # the analysis makes no cycles: the collector's passes would cost a tenth of it
            self._dump = _read_device(snapshot, device)
            self._state = replay(self._dump, series_points)
            self._unsized = peak_unsized(self._dump, self._state)
        self._peers: dict[int, tuple[_DeviceDump, ReplayState]] = {}  # the other devices, read when first judged
        self._judged: dict[int | None, Analysis] = {}  # at_event -> its judgement (immutable: asked again, shared)

    @property
    def device(self) -> int:
        """The device judged."""
        return self._dump.index

    def analyse(self, at_event: int | None = None) -> Analysis:
        """The judgement of the moment `analyse(snapshot, device=..., at_event=at_event)` judges
        (made once per moment: asked again, the same object)."""
        judged = self._judged.get(at_event)
        if judged is None:
            judged = self._judged[at_event] = self._judge(at_event)
        return judged

    def _judge(self, at_event: int | None) -> Analysis:
        snapshot, dump, state, unsized = self.snapshot, self._dump, self._state, self._unsized
        with cyclic_gc_paused():
            target = _pick_target(dump, state, at_event)
            accounted = _account(dump, state, target)
            blocks, shares = _attribute(dump, state, target)
            moment = _judge_moment(dump, state, target)
            devices, replicas = _compare_devices(snapshot, dump, state, target, shares, self._peers)
            ctx = _context(dump, state, target, accounted, blocks, shares, moment, replicas)
            ctx.peer_trains = _devices.peer_trains(devices)
            judgement = _diagnose(ctx, target, moment, devices)
            unknowns = _unknowns(dump, state, target, accounted, blocks, unsized)
            result = _result(snapshot, dump, state, target, accounted, blocks, shares, moment, judgement, unknowns)
            if unsized is not None:
                bound = state.peak_allocated_bytes + unsized[0]
                result = replace(
                    result,
                    replay=replace(
                        result.replay, torch_peak_at_most_bytes=bound, torch_peak_bound_assumes_defaults=unsized[2]
                    ),
                )
            return replace(result, device_summaries=devices) if devices else result


def _compare_devices(
    snapshot: Snapshot,
    dump: _DeviceDump,
    state: ReplayState,
    target: _Target,
    shares: Sequence[ComponentShare],
    peers: dict[int, tuple[_DeviceDump, ReplayState]],
) -> tuple[tuple[DeviceSummary, ...], tuple[Replica, ...]]:
    """Every device of a snapshot that holds several, the judged one read from its own analysis;
    and the replicas of its model among them. `peers`: the other devices' readings, kept from one
    moment judged to the next."""
    if len(snapshot.devices) < 2:
        return (), ()
    judged = _devices.JudgedDevice(
        device=dump.index,
        trace=dump.trace,
        segments=dump.segments,
        spans=dump.spans,
        peak_allocated_bytes=state.peak_allocated_bytes,
        peak_index=state.peak_index,
        oom_count=len(state.oom_indices),
        moment=target.kind,
        moment_index=target.index,
        components=shares,
    )
    return _devices.summarise(snapshot, dump.metadata, judged, peers)


def _read_device(snapshot: Snapshot, device: int | None) -> _DeviceDump:
    """Pick the device (the failing one unless given) and read what the dump holds for it."""
    metadata = snapshot.oomdoctor if snapshot.oomdoctor is not None else NO_METADATA
    if device is None:
        device = _pick_device(snapshot, metadata)
    return read_device(snapshot, metadata, device)


def _pick_target(dump: _DeviceDump, state: ReplayState, at_event: int | None = None) -> _Target:
    """The moment to judge, and the state right after it: the fatal OOM; else the peak, when the
    dump holds less than it and was not written for the peak or by hand; else the dump itself.
    `at_event` (an index into the trace) overrides the choice."""
    fatal_index = _fatal_oom(dump.trace, state.oom_indices, dump.metadata)
    if at_event is not None and 0 <= at_event < len(dump.trace) and at_event != fatal_index:
        at_target, notes = _state_at_target(dump.trace, dump.segments, state.history, at_event)
        return _Target(at_event, "peak", None, at_target, tuple(notes), _live_bytes(state.history, at_event))
    if fatal_index is not None:
        index, kind = fatal_index, "oom"
    elif (
        state.peak_index is not None
        and dump.metadata.reason not in ("peak", "manual")
        and state.peak_allocated_bytes > sum(b.size for b in state.history.final_blocks.values())
    ):
        index, kind = state.peak_index, "peak"
    else:
        index, kind = None, "dump"
    at_target, notes = _state_at_target(dump.trace, dump.segments, state.history, index)
    allocated = state.peak_allocated_bytes if kind == "peak" else _live_bytes(state.history, index)
    return _Target(index, kind, fatal_index, at_target, tuple(notes), allocated)


def _live_bytes(history: LiveHistory, index: int | None) -> int:
    """The bytes of the whole live set right after `index` (None: the dump) by docs/definitions.md's
    rule, blocks no rebuilt segment could hold included; what the walk counts there."""
    if index is None:
        return sum(b.size for b in history.final_blocks.values())
    return history.bytes_at(index)


def _account(dump: _DeviceDump, state: ReplayState, target: _Target) -> _Accounted:
    """Account for every byte at the target: the OOM events, what the device had free, the
    fragmentation the failed request met and what PyTorch could have had in all."""
    settings = dump.settings
    metadata = dump.metadata
    layout = target.state.segments
    large_segment = settings.large_segment_size_bytes if settings is not None else LARGE_SEGMENT_BYTES
    oom_events = ooms_of(dump.trace, state.oom_indices, target.fatal_index, large_segment)
    fatal = next((o for o in oom_events if o.fatal), None)
    device_total = _accounting.device_total(metadata)
    device_free = _device_free(metadata, fatal, target, device_total)
    request = fatal.request_bytes if fatal is not None else None
    request_stream = dump.trace.streams[fatal.event_index] if fatal is not None else None
    fragmentation = _accounting.fragmentation_of(
        layout,
        request_bytes=request,
        request_stream=request_stream,
        settings=settings,
        device_free_bytes=device_free,
        expandable_seen=expandable_from_segments(dump),
    )
    accounting = _accounting.account(
        layout,
        request_bytes=request,
        device_free_bytes=device_free,
        device_total_bytes=device_total,
        request_stream=request_stream,
        fragmentation=fragmentation,
        large_segment=large_segment,
    )
    capacity = None
    if device_free is not None:
        capacity = accounting.reserved_bytes + device_free
    elif device_total is not None:
        capacity = device_total
    return _Accounted(oom_events, fatal, request, large_segment, fragmentation, accounting, capacity, tuple(layout))


def _device_free(
    metadata: DumpMetadata, fatal: OomEvent | None, target: _Target, device_total: int | None
) -> int | None:
    """What the device had free at the target: as the fatal OOM's event or oomdoctor's record of
    it says, or for the dump itself as mem_get_info said; at most what the device total leaves."""
    device_free = fatal.device_free_bytes if fatal is not None else None
    if device_free is None and fatal is not None and metadata.oom is not None:
        device_free = metadata.oom.device_free_bytes
    if device_free is None and target.index is None and metadata.mem_get_info is not None:
        device_free = metadata.mem_get_info.free_bytes
    if device_free is not None and device_total is not None:
        # Under set_per_process_memory_fraction torch reports the allowed bytes as the total but the
        # whole GPU's free memory: what PyTorch could still get is what the fraction leaves.
        device_free = min(device_free, max(0, device_total - target.state.reserved_bytes))
    return device_free


def _attribute(dump: _DeviceDump, state: ReplayState, target: _Target) -> tuple[list[LiveBlock], list[ComponentShare]]:
    """Place every block live at the target in a component (largest first), and sum the components."""
    blocks = place(dump, state.history, target.state.live, target.index)
    return blocks, _attribution.shares(blocks)


def _end_unmarked(dump: _DeviceDump, first: int, last: int) -> bool:
    """Whether a step's end is only where the next step first allocates (no mark shows it), with
    frees after its own last allocation: what it held at its end is at least what it held there."""
    if last + 1 not in dump.inferred_step_starts:
        return False
    trace = dump.trace
    allocations = trace.positions_in(ALLOC, first, last + 1)
    after = int(allocations[-1]) + 1 if len(allocations) else first
    return any(len(trace.positions_in(action, after, last + 1)) for action in (FREE_REQUESTED, FREE_COMPLETED))


def _judge_moment(dump: _DeviceDump, state: ReplayState, target: _Target) -> _Moment:
    """The phase and step the target fell in (for the dump, the last span, or where the markers
    moved on to since), and a summary of every step when something marks them."""
    spans = dump.spans
    if target.index is not None:
        target_span = dump.phase_index.span_of(target.index)
    else:
        target_span = spans[-1] if spans else None
    phase = target_span.phase if target_span is not None else PHASE_UNKNOWN
    step = target_span.step if target_span is not None and dump.phase_source != SOURCE_NONE else None
    markers = dump.metadata.markers
    if target.index is None and markers:
        phase, step = _phase_after_markers(markers, phase, step)
    steps: tuple[StepSummary, ...] = ()
    if dump.phase_source != SOURCE_NONE:
        # activations are told by the phases of the allocations: where no span is a forward pass
        # (the trace carries no stacks, its phases come from optimizer annotations), unknown
        forwards = any(s.phase in FORWARD_PASSES for s in spans)
        steps = tuple(
            StepSummary(
                step,
                s.first_index,
                s.last_index,
                s.peak_allocated_bytes,
                s.end_allocated_bytes,
                s.peak_activation_bytes if forwards else None,
                _end_unmarked(dump, s.first_index, s.last_index),
            )
            for step, s in sorted(state.steps.items())
        )
        # the frees after the run's last completed step (zero_grad, empty_cache before a dump on
        # demand) lie in the next step, which did nothing: no row of its own
        last = steps[-1] if len(steps) > 1 else None
        if last is not None and not any(
            dump.trace.positions_in(action, last.first_index, last.last_index + 1) for action in (ALLOC, OOM)
        ):
            steps = steps[:-1]
    return _Moment(phase, step, steps)


def _allocated_between(trace: DeviceTrace, start: int, stop: int) -> int:
    """Requested bytes of the allocations among events start..stop-1."""
    return sum(map(trace.sizes.__getitem__, trace.positions_in(ALLOC, start, stop)))


def _earlier_passes_allocated(dump: _DeviceDump, target: _Target) -> int:
    """Bytes allocated by the forward passes before the target's since the last backward,
    optimizer step or zero_grad (what `verdicts._kept_from_earlier_passes` weighs its kept bytes against);
    when the target is the dump itself, those before the trace's last."""
    index = target.index if target.index is not None else len(dump.trace) - 1
    if index < 0:
        return 0
    forwards, last_training = passes_since_training(dump.spans, index)
    if len(forwards) < 2:
        return 0
    return _allocated_between(dump.trace, last_training + 1, forwards[-1].first_index)


def _forward_freed(dump: _DeviceDump, target: _Target, step: int | None) -> tuple[tuple[int, int, Stack], ...]:
    """The allocations the forward of `step` made and freed in it before the target, each (event
    index, requested bytes, stack), oldest first."""
    end = target.index if target.index is not None else len(dump.trace) - 1
    trace = dump.trace
    freed: list[tuple[int, int, Stack]] = []
    for span in dump.spans:
        if span.step != step or span.phase != PHASE_FORWARD or span.first_index > end:
            continue
        made: dict[int, int] = {}
        for index in range(span.first_index, min(span.last_index, end) + 1):
            action = trace.actions[index]
            if action == ALLOC:
                made[trace.addrs[index]] = index
            elif action in (FREE_REQUESTED, FREE_COMPLETED):
                alloc = made.pop(trace.addrs[index], None)
                if alloc is not None:
                    freed.append((alloc, trace.sizes[alloc], trace.frames_at(alloc)))
    return tuple(sorted(freed, key=lambda item: item[0]))


def _current_pass(dump: _DeviceDump, target: _Target, blocks: Sequence[LiveBlock]) -> tuple[int, int, int, bool]:
    """What the forward the target falls in keeps: (bytes allocated from the oldest of its
    activations and temporaries still alive at the target up to the target, the bytes of those
    live ones, how many there are, whether the pass had returned); zeros when the target is
    neither in a forward nor after one with only code outside any pass run since (a benchmark
    dumped by hand after its last forward: that pass has returned).

    A pass that keeps its graph keeps most of what it allocated since its oldest kept tensor, and
    keeps many tensors; under no_grad only the last few tensors are alive, or (when outputs are
    kept across steps of a loop) a small share of all that was allocated since the oldest."""
    index = target.index if target.index is not None else len(dump.trace) - 1
    span = dump.phase_index.span_of(index) if index >= 0 else None
    if span is None:
        return 0, 0, 0, False
    position = dump.spans.index(span)
    returned = span.phase not in FORWARD_PASSES
    if returned:
        while position >= 0 and dump.spans[position].phase == PHASE_BETWEEN:
            position -= 1
        if position < 0 or position == dump.spans.index(span) or dump.spans[position].phase not in FORWARD_PASSES:
            return 0, 0, 0, False
        span = dump.spans[position]
        index = span.last_index
    first = span.first_index
    # a forward may be cut into spans; in a run that does not train each span is a pass of its own
    # (phases.py starts one where a pass returned and the next began, as passes.py reads them): an
    # inference loop's earlier passes, of which only their kept outputs live, are not this pass
    trains = any(s.phase in TRAINING_PHASES for s in dump.spans)
    for earlier in reversed(dump.spans[:position] if trains else ()):
        if earlier.phase != span.phase:
            break
        first = earlier.first_index
    kept = [
        b
        for b in blocks
        if b.alloc_index is not None
        and first <= b.alloc_index <= index
        and b.component in (Component.ACTIVATIONS, Component.TEMPORARIES)
    ]
    if not kept:
        return 0, 0, 0, False
    oldest = min(b.alloc_index for b in kept if b.alloc_index is not None)
    allocated = _allocated_between(dump.trace, oldest, index + 1)
    return allocated, sum(b.size_bytes for b in kept), len(kept), returned


def _state_runs(trace: DeviceTrace, blocks: Sequence[LiveBlock], target: int | None) -> tuple[tuple[int, int], ...]:
    """(size, blocks) of each run of live optimizer state blocks allocated one after another, of
    one size, that an allocation of something else ended before the target (the run the target cut
    short is left out). Blocks of the allocator's smallest size neither count nor end a run: a
    step count's scalar shares it with small parameters."""
    made = {
        b.alloc_index: b.size_bytes
        for b in blocks
        if b.component == Component.OPTIMIZER_STATE and b.alloc_index is not None and b.size_bytes > MIN_BLOCK_BYTES
    }
    if len(made) < 2:
        return ()
    stop = target if target is not None else len(trace)
    runs: list[tuple[int, int]] = []
    size, count = 0, 0
    for index in trace.positions_in(ALLOC, min(made), stop):
        if index in made:
            if count and made[index] != size:
                runs.append((size, count))
                count = 0
            size, count = made[index], count + 1
        elif count and trace.sizes[index] > MIN_BLOCK_BYTES:
            runs.append((size, count))
            count = 0
    return tuple(runs)


def _at_end(
    dump: _DeviceDump, state: ReplayState, target: _Target, shares: Sequence[ComponentShare]
) -> tuple[dict[str, int], int | None]:
    """Components and allocated bytes at the dump, placed as the target's blocks are (None when
    the target is the dump itself). A target at the trace's last event is the dump's own state,
    placed already (`shares`)."""
    if target.index is None:
        return {}, None
    if target.index == len(dump.trace) - 1:
        return {s.name: s.bytes for s in shares}, target.state.allocated_bytes
    at_end = _state_at_target(dump.trace, dump.segments, state.history, None)[0]
    blocks = place(dump, state.history, at_end.live, None)
    return {s.name: s.bytes for s in _attribution.shares(blocks)}, at_end.allocated_bytes


def _context(
    dump: _DeviceDump,
    state: ReplayState,
    target: _Target,
    accounted: _Accounted,
    blocks: list[LiveBlock],
    shares: list[ComponentShare],
    moment: _Moment,
    replicas: Sequence[Replica] = (),
) -> Context:
    """Everything the verdict tests read."""
    pass_allocated, pass_kept, pass_kept_count, pass_returned = _current_pass(dump, target, blocks)
    end_components, end_allocated = _at_end(dump, state, target, shares)
    frames_train = _frames_train(dump, target, blocks, moment.step)
    optimizer_made = bool(dump.metadata.optimizers)
    holes, shrinking = _placement_layout(dump, target, accounted, blocks)
    return Context(
        oom=accounted.fatal,
        accounting=accounted.accounting,
        fragmentation=accounted.fragmentation,
        layout=accounted.layout,
        layout_estimated=any(note.kind == UnknownKind.REPLAYED_AFTER_TARGET for note in target.notes),
        components={s.name: s.bytes for s in shares},
        live_blocks=blocks,
        phases=dump.spans,
        phase_source=dump.phase_source,
        target_phase=moment.phase,
        target_step=moment.step,
        target_index=target.index,
        target_allocated_bytes=target.allocated_bytes,
        steps=moment.steps,
        optimizer_kind=_optimizer_kind(dump.registry, blocks),
        exact=bool(dump.registry),
        expandable_on=accounted.fragmentation.expandable_segments,
        capacity_bytes=accounted.capacity_bytes,
        large_segment_bytes=accounted.large_segment_bytes,
        scalable_bytes=scalable_bytes(blocks),
        request_scales=request_scales(moment.phase, accounted.request_bytes or 0, blocks),
        near_ooms=near_ooms(dump.trace, dump.segments, state.segment_events),
        state_runs=_state_runs(dump.trace, blocks, target.index),
        pass_allocated_bytes=pass_allocated,
        pass_kept_bytes=pass_kept,
        pass_kept_count=pass_kept_count,
        pass_freed=_forward_freed(dump, target, moment.step),
        pass_returned=pass_returned,
        earlier_passes_allocated_bytes=(
            _earlier_passes_allocated(dump, target) if moment.phase in (*FORWARD_PASSES, PHASE_BETWEEN) else 0
        ),
        request_frames=dump.trace.frames_at(target.index) if accounted.fatal and target.index is not None else (),
        trace_entries=len(dump.trace),
        end_components=end_components,
        end_allocated_bytes=end_allocated,
        passes=pass_history(
            dump.trace,
            dump.spans,
            target.index if target.kind == "oom" else None,
            moment.step,
            blocks,
            replicas,
            frames_train or dump.optimizer_annotated or optimizer_made,
            backward=moment.phase == PHASE_BACKWARD,
        ),
        frames_train=frames_train,
        optimizer_annotated=dump.optimizer_annotated,
        optimizer_made=optimizer_made,
        unsplit_passes=dump.unsplit_passes,
        recorded_moments=_recorded_moments(dump.metadata),
        registry_trained=(
            sum(
                b.size_bytes
                for b in blocks
                if b.component == Component.PARAMETERS and b.address not in dump.registry.frozen
            )
            if dump.registry.says_training
            else None
        ),
        expandable_available=dump.expandable_available,
        concatenations=(
            running_concatenations(dump.trace, dump.spans, target.index, blocks)
            if moment.phase in (*FORWARD_PASSES, PHASE_BETWEEN)
            else {}
        ),
        # judged inside a pass, with passes still to come
        passes_grow=target.kind == "oom"
        and moment.phase in FORWARD_PASSES
        and passes_grow(dump.trace, dump.spans, target.index),
        usable_holes=holes,
        shrinking_segment_bytes=shrinking,
    )


def _placement_layout(
    dump: _DeviceDump, target: _Target, accounted: _Accounted, blocks: Sequence[LiveBlock]
) -> tuple[tuple[FreeHole, ...], tuple[int, ...]]:
    """At a placement failure (free bytes enough, no place), the free blocks on the failed request's
    pool and stream by what last held them, and the segments that shrink with the batch
    (`holes.placement_layout`): a place for a smaller batch's request is only where one survives at
    that batch."""
    request = accounted.request_bytes
    if accounted.fatal is None or not request or accounted.accounting.missing_bytes != 0 or target.index is None:
        return (), ()
    return placement_layout(
        dump.trace,
        dump.phase_index,
        accounted.layout,
        request_pool=accounted.fragmentation.request_pool,
        request_stream=accounted.fragmentation.request_stream,
        target_index=target.index,
        min_bytes=request // 100,
        live_blocks=blocks,
        large_segment_bytes=accounted.large_segment_bytes,
        divisions=dump.settings.rounding_divisions if dump.settings is not None else (),
    )


def _frames_train(dump: _DeviceDump, target: _Target, blocks: Sequence[LiveBlock], step: int | None) -> bool:
    """Whether the failed request's stack, or a stack of a block the judged step allocated, runs
    inside a training step (`phases.trains_by_frames`); each distinct stack read once."""
    stacks = [dump.trace.frames_at(target.index)] if target.index is not None else []
    stacks += [b.frames for b in blocks if b.alloc_index is not None and b.step == step]
    seen: set[int] = set()
    for stack in stacks:
        if stack and id(stack) not in seen:
            seen.add(id(stack))
            if _phases.trains_by_frames(stack):
                return True
    return False


def _diagnose(ctx: Context, target: _Target, moment: _Moment, devices: Sequence[DeviceSummary] = ()) -> _Judgement:
    """The verdicts, the what-if for the batch size and the recommendations, all judged against
    the one requirement (`recommendations.requirement`); the devices compared add their finding."""
    primary, secondary = diagnose(ctx)
    imbalance = _devices.imbalance(
        devices, allocated_bytes=ctx.allocated_bytes, missing_bytes=ctx.needed, target_index=ctx.target_index
    )
    if imbalance is not None:
        secondary = (*secondary, imbalance)
    verdicts = {primary.verdict, *(f.verdict for f in secondary)}
    need = requirement(ctx, verdicts)
    whatif = _what_if(ctx, target, moment, need, verdicts)
    return _Judgement(primary, secondary, recommend(ctx, verdicts, need, whatif, imbalance), whatif)


def _what_if(ctx: Context, target: _Target, moment: _Moment, need: Requirement, verdicts: set[str]) -> WhatIf:
    """The batch-size what-if: of the state at the target, or of the recorded peak step when the
    dump came after it (between steps, say) and no OOM says otherwise.

    No scale is said to fit where what decides it is not in the moment's figures: what the run keeps
    grows with each step or pass still to come (a leak, grad-mode graphs kept pass after pass, passes
    that each leave more), or the rest of the interrupted pass is extrapolated by a guess. (Rehearsed
    at the scale the moment allowed, creeping-leak-mlp-sgd, slow-leak-mlp-kept-predictions and
    inference-with-grad-cnn still ran out; so did activation-spike-gpt-longer-sequence, whose rest
    is such a guess.)"""
    components = ctx.components
    request = ctx.oom.request_bytes if ctx.oom is not None else 0
    # no free figure at this moment: the capacity is the device's total, an upper bound
    at_most = ctx.accounting.device_free_bytes is None and ctx.capacity_bytes is not None
    peak_step = None
    if ctx.oom is None and target.kind == "dump":
        peak_step = _peak_step(moment.steps, sum(components.values()))
    if peak_step is not None:
        peak, activations = peak_step.peak_allocated_bytes, peak_step.peak_activation_bytes or 0
        return what_if(
            {"peak": peak},
            scalable_bytes=activations,
            request_bytes=0,
            target_phase=PHASE_BETWEEN,
            capacity_bytes=ctx.capacity_bytes,
            basis=WhatIfBasis(peak_step.step, peak, activations),
            capacity_at_most=at_most,
            cache_margin_bytes=cache_margin(ctx.large_segment_bytes),
            # the step's temporaries and inputs count as fixed: a scale above 1.00x is overstated.
            # (Rehearsed, no-oom-gpt-adamw at 2.98x, batch 47, ran out in backward with 228.6 MiB
            # allocated and a 24 MiB request on 256 MiB, where 230.8 MiB was predicted)
            beyond_the_moment=WhatIfUnknown.ACTIVATIONS_ONLY,
        )
    rest = ctx.passes.rest
    beyond = None
    if rest is not None and rest.extrapolated and rest.by_site:
        beyond = WhatIfUnknown.REST_GUESSED
    elif (
        Verdict.CREEPING_LEAK in verdicts
        or (Verdict.INFERENCE_WITH_GRAD in verdicts and graphs_pile_up(ctx))
        or ctx.passes_grow
    ):
        beyond = WhatIfUnknown.KEEPS_GROWING
    return what_if(
        components,
        scalable_bytes=ctx.scalable_bytes,
        request_bytes=request,
        target_phase=moment.phase,
        capacity_bytes=ctx.capacity_bytes,
        shortfall_bytes=need.shortfall_bytes,
        projected_need_bytes=need.projected_need_bytes,
        # a request made by checkpoint-saving code (a state dict gathered for a save) is as large
        # whatever the batch. (Rehearsed, checkpoint-gather-mlp-adam at batch 1 still ran out on its
        # 64 MiB gather, where a scale of 0.12x was said to fit)
        scales_request=ctx.request_scales and Verdict.CHECKPOINT_GATHER not in verdicts,
        placement_limit=need.batch_placement_limit,
        placement_reach=need.placement_reach,
        rest=ctx.passes.rest,
        # with no capacity known, the tightest near-OOM bounds it (what the device then refused)
        capacity_bound=min((n.capacity_bound_bytes for n in ctx.near_ooms), default=None),
        backward_unknown=backward_unknown(ctx),
        capacity_at_most=at_most,
        trains=ctx.trains(),
        cache_margin_bytes=cache_margin(ctx.large_segment_bytes),
        beyond_the_moment=beyond,
    )


def _pre_existing(state: ReplayState, blocks: Sequence[LiveBlock]) -> tuple[int, int]:
    """(allocations, bytes) made before the trace began: freed during it, or live at the target.
    One live at the target and freed after it is both: counted once. One whose free was requested
    before the trace and completed in it counts too (not its bytes: they were no longer allocated)."""
    older = [b for b in blocks if b.alloc_index is None]
    live = {b.address for b in older}
    frees = [(address, size) for _, address, size in state.history.pre_existing_frees if address not in live]
    count = len(frees) + len(older) + state.pre_existing_completions
    return count, sum(s for _, s in frees) + sum(b.size_bytes for b in older)


def _why_unknown(blocks: Sequence[LiveBlock]) -> list[Unknown]:
    """Why the blocks in the component "unknown" are there, one entry per reason attribution had
    (read from how it placed each: when the block was made, its method, its frames), largest first."""
    reasons: dict[str, list[LiveBlock]] = {}
    for block in blocks:
        if block.component != Component.UNKNOWN:
            continue
        if block.alloc_index is not None:
            # by its phase alone: the registry's dump, which names no such block (attribution's exact branch)
            unnamed = UnknownKind.TRACED_UNNAMED if block.method == METHOD_PHASE else None
            kind = UnknownKind.TRACED_NOTHING_SAYS if block.method == METHOD_NONE else unnamed
        elif block.method == METHOD_SIZE_OUTWEIGHS:
            kind = UnknownKind.PRE_TRACE_OUTWEIGHING
        elif block.method == METHOD_LIFETIME:
            kind = UnknownKind.PRE_TRACE_FREED_ELSEWHERE
        elif block.method != METHOD_NONE:
            kind = None
        elif _attribution.made_by_code_outside_torch(block.frames):
            kind = UnknownKind.PRE_TRACE_CODE_SAYS_NOTHING
        else:
            kind = UnknownKind.PRE_TRACE_SHAPE_UNEXPLAINED
        if kind is not None:
            reasons.setdefault(kind, []).append(block)
    found = [Unknown(kind, len(group), sum(b.size_bytes for b in group)) for kind, group in reasons.items()]
    return sorted(found, key=lambda u: -(u.bytes or 0))


# The share of the peak the unsplit remainders the file cannot size must reach before "Not
# determined" says how much higher torch's max_memory_allocated may be (docs/definitions.md, "The peak").
PEAK_UNSIZED_SHARE = 0.01


def _unknowns(
    dump: _DeviceDump,
    state: ReplayState,
    target: _Target,
    accounted: _Accounted,
    blocks: Sequence[LiveBlock],
    unsized: tuple[int, int, bool] | None = None,
) -> tuple[Unknown, ...]:
    """What the dump could not tell, in the order a report lists it (views.phrasing words them).
    `unsized`: (bytes, blocks, assumed) torch's max_memory_allocated may be above the peak
    (`peak_unsized`), the allocator's default settings assumed where they are not recorded."""
    trace, metadata = dump.trace, dump.metadata
    unknowns = list(target.notes)
    if unsized is not None and unsized[1] and unsized[0] >= PEAK_UNSIZED_SHARE * state.peak_allocated_bytes:
        kind = UnknownKind.PEAK_UNSIZED_DEFAULTS if unsized[2] else UnknownKind.PEAK_UNSIZED
        unknowns.append(Unknown(kind, unsized[1], unsized[0]))
    if not trace:
        unknowns.append(Unknown(UnknownKind.NO_HISTORY))
    elif not state.has_frames:
        if any(b.frames for b in state.history.final_blocks.values()):
            unknowns.append(Unknown(UnknownKind.TRACE_NO_FRAMES, len(trace)))
        else:
            unknowns.append(Unknown(UnknownKind.NO_FRAMES))
    if dump.phase_source == SOURCE_NONE and trace:
        unknowns.append(Unknown(UnknownKind.NO_PHASES))
    if not dump.registry:
        unknowns.append(Unknown(UnknownKind.NO_REGISTRY))
    if dump.ring_buffer_wrapped:
        unknowns.append(Unknown(UnknownKind.RING_BUFFER_WRAPPED, len(trace)))
    pre_count, _ = _pre_existing(state, blocks)
    if not trace:  # every block predates the (absent) trace: NO_HISTORY says so; only the stackless are counted
        frameless = sum(1 for b in blocks if not b.frames)
        if frameless:
            unknowns.append(Unknown(UnknownKind.NO_STACK, frameless))
    elif pre_count:
        unknowns.append(Unknown(UnknownKind.PRE_EXISTING, pre_count))
        frameless = sum(1 for b in blocks if b.alloc_index is None and not b.frames)
        if frameless:
            unknowns.append(Unknown(UnknownKind.PRE_EXISTING_NO_STACK, frameless))
        # markers count every step since capture began; a trace's own phases only those it shows
        pre_trace_state = any(b.alloc_index is None and b.component == Component.OPTIMIZER_STATE for b in blocks)
        if pre_trace_state and dump.phase_source != SOURCE_MARKERS:
            unknowns.append(Unknown(UnknownKind.STEPS_BEFORE_TRACE))
        elif (
            dump.phase_source != SOURCE_MARKERS
            and any(b.alloc_index is None and b.component == Component.PARAMETERS for b in blocks)
            and not any(b.alloc_index is not None and b.component == Component.OPTIMIZER_STATE for b in blocks)
        ):
            # the trace began after the model was made, and no optimizer state it made shows it holds
            # the run's first step: a stateless optimizer (plain SGD), an evaluation, or state read as
            # another kind leaves nothing to count the steps that ran before it
            unknowns.append(Unknown(UnknownKind.TRACE_AFTER_SETUP))
    passes = [i for i in dump.unsplit_passes if target.index is None or i <= target.index]
    if passes:
        unknowns.append(Unknown(UnknownKind.PASSES_MAY_BE_STEPS, len(passes)))
    unknowns.extend(_why_unknown(blocks))
    if (
        accounted.fatal is not None
        and target.index is not None
        and _attribution.reads_weights(trace.frames_at(target.index))
    ):
        unknowns.append(Unknown(UnknownKind.LOAD_UNFINISHED))
    unknowns.extend(accounted.accounting.unknowns)
    if accounted.fatal is not None and metadata.oom is not None and metadata.oom.surfaced is False:
        unknowns.append(Unknown(UnknownKind.OOM_RETRIED))
    if accounted.fatal is not None and metadata.exception is not None and metadata.exception.caught:
        occurrence = metadata.oom.occurrence if metadata.oom is not None else None
        unknowns.append(Unknown(UnknownKind.OOM_CAUGHT, occurrence or 1))
    recording = metadata.recording
    if recording is not None and recording.rearmed:
        others = sum(1 for call in recording.rearmed if call.action != HISTORY_RESTORED)
        if others:
            unknowns.append(Unknown(UnknownKind.HISTORY_REARMED, others))
        if recording.stopped:
            unknowns.append(Unknown(UnknownKind.HISTORY_STOPPED))
    return tuple(unknowns)


def _result(
    snapshot: Snapshot,
    dump: _DeviceDump,
    state: ReplayState,
    target: _Target,
    accounted: _Accounted,
    blocks: list[LiveBlock],
    shares: list[ComponentShare],
    moment: _Moment,
    judgement: _Judgement,
    unknowns: tuple[Unknown, ...],
) -> Analysis:
    """The steps' findings as one `Analysis`."""
    trace = dump.trace
    pre_count, pre_bytes = _pre_existing(state, blocks)
    replay = ReplaySummary(
        device=dump.index,
        event_count=len(trace),
        target_index=target.index,
        target_kind=target.kind,
        peak_index=state.peak_index,
        peak_allocated_bytes=state.peak_allocated_bytes,
        target_allocated_bytes=target.allocated_bytes,
        ooms=accounted.ooms,
        series=tuple(state.series),
        series_peaks=tuple(state.series_peaks),
        events_after_target=len(trace) - 1 - target.index if target.index is not None else 0,
        pre_existing_allocations=pre_count,
        pre_existing_bytes=pre_bytes,
        ring_buffer_wrapped=dump.ring_buffer_wrapped,
        has_frames=state.has_frames,
        has_time=state.has_time,
    )
    primary = judgement.primary
    summary, secondary = primary.summary, judgement.secondary
    marks: dict[str, int] = {}
    if any(u.kind in (UnknownKind.STEPS_BEFORE_TRACE, UnknownKind.TRACE_AFTER_SETUP) for u in unknowns):
        marks["trace_steps"] = 1  # steps may have run before the trace: the steps named are the trace's
    if any(u.kind == UnknownKind.PASSES_MAY_BE_STEPS for u in unknowns):
        marks["steps_at_least"] = 1  # passes counted in a step may be steps: the steps named are the least
    if marks:
        summary = _naming_steps(summary, marks)
        secondary = tuple(replace(f, summary=_naming_steps(f.summary, marks)) for f in secondary)
    return Analysis(
        schema_version=RESULT_SCHEMA_VERSION,
        device=dump.index,
        devices=snapshot.devices,
        source_format=snapshot.source_format,
        replay=replay,
        accounting=accounted.accounting,
        fragmentation=accounted.fragmentation,
        phase_source=dump.phase_source,
        phases=tuple(dump.spans),
        target_phase=moment.phase,
        target_step=moment.step,
        steps=moment.steps,
        components=tuple(shares),
        live_blocks=tuple(blocks),
        verdict=primary.verdict,
        confidence=primary.confidence,
        summary=summary,
        evidence=primary.evidence,
        secondary=secondary,
        recommendations=judgement.recommendations,
        what_if=judgement.what_if,
        unknowns=unknowns,
    )


def _naming_steps(summary: Summary, marks: dict[str, int]) -> Summary:
    """The summary with `marks` where it names a step (phrasing says what each means): `trace_steps`,
    the steps it names are counted from the trace's start, which came after the run's;
    `steps_at_least`, they are the least the trace shows (passes counted in a step may be steps of
    their own)."""
    if all(summary.facts.get(name) is None for name in ("step", "earlier_step", "rest_step")):
        return summary
    return Summary(summary.kind, summary.facts.adding(**marks))


def _peak_step(steps: tuple[StepSummary, ...], allocated_bytes: int) -> StepSummary | None:
    """The step with the highest recorded peak, when that peak is above what the dump holds."""
    peak = max(steps, key=lambda s: s.peak_allocated_bytes, default=None)
    if peak is None or peak.peak_allocated_bytes <= allocated_bytes or not peak.peak_activation_bytes:
        return None
    return peak


def _touches_blocks(trace: DeviceTrace, target_index: int) -> bool:
    later = trace.actions[target_index + 1 :]
    return "alloc" in later or "free_requested" in later or "free_completed" in later


def _phase_after_markers(markers: Sequence[Marker], phase: str, step: int | None) -> tuple[str, int | None]:
    """The phase at dump time: the markers may have moved on after the last recorded event."""
    timed = [(m.time_us, m.phase, m) for m in markers if m.time_us is not None and m.phase is not None]
    if not timed:
        return phase, step
    _, last_phase, last = max(timed, key=lambda t: t[0])
    last_step = last.step if last.step is not None else step
    if last.edge == "start":
        return last_phase, last_step
    if last_phase == "optimizer_step" and last_step is not None:
        last_step += 1
    return PHASE_BETWEEN, last_step


def _state_at_target(
    trace: DeviceTrace, segments: Sequence[Segment], history: LiveHistory, target_index: int | None
) -> tuple[EventState, list[Unknown]]:
    """(state, notes): the state right after the target; the dump's own when nothing was allocated
    or freed after it, otherwise replayed back from the final state."""
    notes: list[Unknown] = []
    if target_index is None:
        return event_state(len(trace) - 1, list(segments), history.at_end(), exact=True), notes
    if not _touches_blocks(trace, target_index):
        live = history.at_end()
        layout, exact = segments_at(trace, segments, target_index)
        if not exact:
            layout = lay_out(layout, live.values(), {})
    else:
        live, pending = history.at(target_index)
        seg_list, _ = segments_at(trace, segments, target_index)
        layout, exact = lay_out(seg_list, live.values(), pending), False
        notes.append(Unknown(UnknownKind.REPLAYED_AFTER_TARGET, len(trace) - 1 - target_index))
    state = event_state(target_index, layout, live, exact)
    unplaced = len(live) - len(state.live)
    if unplaced:
        notes.append(Unknown(UnknownKind.UNPLACED_BLOCKS, unplaced))
    return state, notes
