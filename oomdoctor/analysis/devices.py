"""Several devices compared (issue 11, cause K): a summary of every device a snapshot holds, the
imbalance between replicas of one model, and training decided across devices.

A process that drives several GPUs (DataParallel, a model split over devices) leaves one trace and
one set of segments per device in its snapshot; `analyse` judges one of them. `summarise` reads
each of the others once, the way the judged device is read (phases from `phases.build_spans`, the
peak from `replay.walk`, the components from `attribution` at the device's own moment: its last OOM,
else its peak, else the dump), and takes the judged device's figures from its analysis, so each
row says what `analyse(snapshot, device=d)` would say of that device's peak and largest component.

Two devices run replicas of one model when both their traces show DataParallel's replicate, scatter
or parallel_apply (torch.nn.parallel, torch_geometric's DataParallel). Shared source lines do not
show it: a model split across devices runs the same user lines (layers of one class) on each.

- `imbalance(...)`: the judged device held at least `IMBALANCE_RATIO` times the highest peak of
  every replica, and `IMBALANCE_MIN_BYTES` more (with an OOM, also at least what the request
  lacked): the work was split unevenly (DataParallel splits a batch by count, and device 0 gathers
  the outputs and holds the master copy), and the other devices' peaks are the evidence.
- `peer_trains(...)`: the judged device's trace was cut short by its OOM before any backward or
  optimizer step, and a replica's trace reached one: the run trains.

Pure functions of the model; no I/O.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass, replace
from itertools import compress, count, repeat

from oomdoctor.analysis import attribution as _attribution
from oomdoctor.analysis.passes import Replica
from oomdoctor.analysis.reading import DeviceDump, place, read_device, replay
from oomdoctor.analysis.replay import ReplayState, final_live_blocks
from oomdoctor.analysis.results import (
    PHASE_BACKWARD,
    PHASE_OPTIMIZER,
    ComponentShare,
    DeviceSummary,
    Evidence,
    EvidenceKind,
    Facts,
    Finding,
    PhaseSpan,
    Summary,
    SummaryKind,
)
from oomdoctor.dump_metadata import DumpMetadata
from oomdoctor.model import ALLOC, DeviceTrace, Segment, Snapshot
from oomdoctor.units import MIB
from oomdoctor.vocabulary import Verdict

IMBALANCE_RATIO = 1.5  # the judged device held this many times the highest peak of every replica,
IMBALANCE_MIN_BYTES = 256 * MIB  # and this much more
SITES_HEAD = 1024  # stacks read from the first alloc events of a trace,
SITES_SPREAD = 3072  # and from this many more spread over the rest (a trace may hold a million)
TRAINING_PHASES = frozenset({PHASE_BACKWARD, PHASE_OPTIMIZER})
DATA_PARALLEL_MARKERS = ("torch/nn/parallel/", "torch_geometric/nn/data_parallel")


@dataclass(frozen=True, slots=True)
class JudgedDevice:
    """What the analysis of the judged device already knows, so that it is not read twice."""

    device: int
    trace: DeviceTrace
    segments: tuple[Segment, ...]
    spans: Sequence[PhaseSpan]
    peak_allocated_bytes: int
    peak_index: int | None
    oom_count: int
    moment: str  # "oom" | "peak" | "dump": the target's kind
    moment_index: int | None  # None: the dump
    components: Sequence[ComponentShare]


def summarise(
    snapshot: Snapshot,
    metadata: DumpMetadata,
    judged: JudgedDevice,
    peers: dict[int, tuple[DeviceDump, ReplayState]] | None = None,
) -> tuple[tuple[DeviceSummary, ...], tuple[Replica, ...]]:
    """One summary per device of `snapshot`, in device order, and the replicas of the judged
    device's model among the others (their traces and phases, for `passes.rest_of_pass`); none
    when it holds one device. `peers`: each other device's reading and replay, filled as they are
    read and reused where already there (an `Analyser` judging several moments)."""
    devices = snapshot.devices
    if len(devices) < 2:
        return (), ()
    replicas: list[Replica] = []
    judged_data_parallel = _runs_data_parallel(judged.trace)
    moment_time = _time_at(judged.trace, judged.moment_index)
    summaries = []
    for device in devices:
        if device == judged.device:
            summaries.append(
                _summary(
                    device,
                    judged.trace,
                    judged.segments,
                    judged.spans,
                    peak_allocated=judged.peak_allocated_bytes,
                    peak_index=judged.peak_index,
                    oom_count=judged.oom_count,
                    moment=judged.moment,
                    components=judged.components,
                    allocated_at_judged=None,
                    judged=True,
                    replica=True,
                    data_parallel=judged_data_parallel,
                )
            )
        else:
            summary, dump = _peer(snapshot, metadata, device, judged_data_parallel, moment_time, peers)
            summaries.append(summary)
            if summary.replica and len(dump.trace):
                replicas.append(Replica(device, dump.trace, dump.spans))
    return _training_told(summaries), tuple(replicas)


def _training_told(summaries: list[DeviceSummary]) -> tuple[DeviceSummary, ...]:
    """Mark the replicas that tell the run trains: the judged device's trace stops at an OOM
    before any backward or optimizer step, and theirs reached one."""
    judged = next(s for s in summaries if s.judged)
    if judged.trains or not judged.oom_count:
        return tuple(summaries)
    return tuple(replace(s, tells_training=True) if not s.judged and s.replica and s.trains else s for s in summaries)


def _summary(
    device: int,
    trace: DeviceTrace,
    segments: Sequence[Segment],
    spans: Sequence[PhaseSpan],
    *,
    peak_allocated: int,
    peak_index: int | None,
    oom_count: int,
    moment: str,
    components: Sequence[ComponentShare],
    allocated_at_judged: int | None,
    judged: bool,
    replica: bool,
    data_parallel: bool,
) -> DeviceSummary:
    phases = tuple(dict.fromkeys(s.phase for s in spans)) if len(trace) else ()
    largest = max(components, key=lambda c: c.bytes, default=None)
    return DeviceSummary(
        device=device,
        judged=judged,
        reserved_bytes=sum(s.total_size for s in segments),
        allocated_bytes=sum(b.size for b in final_live_blocks(segments).values()),
        event_count=len(trace),
        peak_allocated_bytes=peak_allocated,
        peak_index=peak_index,
        oom_count=oom_count,
        phases=phases,
        trains=bool(TRAINING_PHASES.intersection(phases)),
        moment=moment,
        largest_component=largest.name if largest is not None and largest.bytes else None,
        largest_component_bytes=largest.bytes if largest is not None else 0,
        allocated_at_judged_bytes=allocated_at_judged,
        replica=replica,
        data_parallel=data_parallel,
    )


def _peer(
    snapshot: Snapshot,
    metadata: DumpMetadata,
    device: int,
    judged_data_parallel: bool,
    moment_time: int | None,
    peers: dict[int, tuple[DeviceDump, ReplayState]] | None = None,
) -> tuple[DeviceSummary, DeviceDump]:
    """Read one other device as `analyse` reads the judged one, at its own moment (and what was
    read); its reading and replay kept in `peers`, or taken from there."""
    known = peers.get(device) if peers is not None else None
    if known is None:
        read = read_device(snapshot, metadata, device)
        known = read, replay(read, 2)
        if peers is not None:
            peers[device] = known
    dump, state = known
    trace, segments, spans = dump.trace, dump.segments, dump.spans
    history = state.history
    if state.oom_indices:
        moment, index = "oom", state.oom_indices[-1]
    elif state.peak_index is not None:
        moment, index = "peak", state.peak_index
    else:
        moment, index = "dump", None
    live = history.at_end() if index is None else history.at(index)[0]
    blocks = place(dump, history, tuple(live.values()), index)
    at_judged = None
    aligned = _index_at_time(trace, moment_time)
    if aligned is not None:
        at_judged = history.bytes_at(aligned)
    data_parallel = _runs_data_parallel(trace)
    summary = _summary(
        device,
        trace,
        segments,
        spans,
        peak_allocated=state.peak_allocated_bytes,
        peak_index=state.peak_index,
        oom_count=len(state.oom_indices),
        moment=moment,
        components=_attribution.shares(blocks),
        allocated_at_judged=at_judged,
        judged=False,
        # replicas of one model: both devices show DataParallel's frames. Shared source lines do
        # not show it: a model split across devices (device_map="auto", pipeline stages) runs the
        # same user line on every device, and layers of one class share their lines too, yet no
        # device runs what another does, and balancing their inputs means nothing
        replica=judged_data_parallel and data_parallel,
        data_parallel=data_parallel,
    )
    return summary, dump


def _time_at(trace: DeviceTrace, index: int | None) -> int | None:
    """The time of event `index` (None: of the last event, for the dump)."""
    times = trace.times_us
    if times is None or not len(trace):
        return None
    return times[len(trace) - 1 if index is None else index]


def _index_at_time(trace: DeviceTrace, time_us: int | None) -> int | None:
    """The last event at or before `time_us` (None: no times, or the trace starts after it)."""
    times = trace.times_us
    if time_us is None or times is None:
        return None
    timed = trace.times_or_zero()
    if timed is times:  # every event has its time: the first later one found in C
        later = next(compress(count(), map(operator.gt, timed, repeat(time_us))), len(timed))
        return later - 1 if later else None
    return _last_at_or_before(times, time_us)


def _last_at_or_before(times: Sequence[int | None], time_us: int) -> int | None:
    """The last event with a time at or before `time_us` before the first with a later one (events
    without a time passed over), read one by one: `_index_at_time`'s reading of any times."""
    found = None
    for index, moment in enumerate(times):
        if moment is not None and moment <= time_us:
            found = index
        elif moment is not None:
            break
    return found


def _runs_data_parallel(trace: DeviceTrace) -> bool:
    """Whether DataParallel's frames are among the stacks of a trace's allocations (a bounded
    sample of its alloc events: a trace may hold a million)."""
    allocs = trace.with_frames(trace.positions(ALLOC))
    if len(allocs) > SITES_HEAD + SITES_SPREAD:
        rest = allocs[SITES_HEAD:]
        stride = len(rest) / SITES_SPREAD
        allocs = allocs[:SITES_HEAD] + [rest[int(k * stride)] for k in range(SITES_SPREAD)]
    seen: set[int] = set()
    for index in allocs:
        stack = trace.frames_at(index)
        if id(stack) in seen:
            continue
        seen.add(id(stack))
        if any(marker in frame.path for frame in stack for marker in DATA_PARALLEL_MARKERS):
            return True
    return False


def imbalance(
    summaries: Sequence[DeviceSummary], *, allocated_bytes: int, missing_bytes: int, target_index: int | None
) -> Finding | None:
    """The judged device held far more than every replica at its peak (see the module docstring):
    `allocated_bytes` is the judged device's at its moment, `missing_bytes` what its request lacked."""
    judged = next((s for s in summaries if s.judged), None)
    peers = [s for s in summaries if not s.judged and s.replica and s.event_count]
    if judged is None or not peers:
        return None
    highest = max(peers, key=lambda s: s.peak_allocated_bytes)
    excess = allocated_bytes - highest.peak_allocated_bytes
    if (
        allocated_bytes < IMBALANCE_RATIO * highest.peak_allocated_bytes
        or excess < IMBALANCE_MIN_BYTES
        or excess < missing_bytes
    ):
        return None
    data_parallel = judged.data_parallel or any(s.data_parallel for s in peers)
    ratio = allocated_bytes / highest.peak_allocated_bytes if highest.peak_allocated_bytes else None
    evidence = [
        Evidence(
            EvidenceKind.DEVICE_ALLOCATED,
            "allocated_bytes",
            allocated_bytes,
            target_index,
            facts=Facts.of(device=judged.device, at=judged.moment),
        )
    ]
    for peer in peers:
        evidence.append(
            Evidence(
                EvidenceKind.PEER_PEAK,
                "peer_peak_allocated_bytes",
                peer.peak_allocated_bytes,
                peer.peak_index,
                facts=Facts.of(device=peer.device),
            )
        )
        if peer.allocated_at_judged_bytes is not None:
            evidence.append(
                Evidence(
                    EvidenceKind.PEER_AT_MOMENT,
                    "peer_allocated_at_moment_bytes",
                    peer.allocated_at_judged_bytes,
                    facts=Facts.of(device=peer.device, at=judged.moment),
                )
            )
    return Finding(
        Verdict.DEVICE_IMBALANCE,
        0.7 if data_parallel else 0.55,
        Summary(
            SummaryKind.DEVICE_IMBALANCE,
            Facts.of(
                device=judged.device,
                allocated=allocated_bytes,
                at=judged.moment,
                peer=highest.device,
                peer_peak=highest.peak_allocated_bytes,
                ratio=ratio,
                peers=len(peers),
                data_parallel=int(data_parallel),
            ),
        ),
        tuple(evidence),
    )


def peer_trains(summaries: Sequence[DeviceSummary]) -> bool:
    """The judged device's trace stops at an OOM before any backward or optimizer step, and a
    replica's trace reached one: the workload trains (see the module docstring)."""
    return any(s.tells_training for s in summaries)
