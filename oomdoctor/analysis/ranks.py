"""Rank comparison: which rank of a distributed run ran out first, and how the ranks differ.

    folder = RankFolder(directory, dumps, skipped)   # what reading a folder gave (oomdoctor.pipeline)
    comparison = compare_ranks(dumps)     # dumps: one RankDump per file of the folder
    comparison.rows, comparison.first_index, comparison.differences, comparison.verdicts_agree
    standout(comparison, index)           # what stands out most in one file, against the median
    comparison.first_standout             # what stands out most in the first rank, like with like

Each rank is compared at the OOM when it ran out, else at its peak (`RankDump.at_peak`: a dump written
by hand or at the end of a run describes a quieter moment than its peak). The first
rank is the one whose OOM has the smallest `time_us` (oomdoctor's recorded OOM time, else the
fatal `oom` event's). Ranks on different hosts are ordered by their clocks, which the comparison
records; without any time the order is unknown (`order_known`).

A rank stands out when its allocated bytes, or the bytes of one component, differ from the median
over all files by at least STANDOUT_FRACTION of the median rank's allocated bytes (and at least
STANDOUT_MIN_BYTES): rank 0 holding extra memory, or one rank given a bigger batch. The first rank's
OOM and the other ranks' peaks are different moments (its forward against their optimizer step): what
stands out in it is measured like with like where the data allows (`first_standout`: each rank at
the same step, else at its peak over its trace) and said to compare different moments where it does
not. Pure functions,
no I/O, no wording: oomdoctor.views.ranks says all this in words (the headline, the notes).
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass, replace

from oomdoctor.analysis.contents import Contents
from oomdoctor.analysis.environment import Environment
from oomdoctor.analysis.results import SOURCE_MARKERS, Analysis
from oomdoctor.metadata import COMPONENTS
from oomdoctor.records import pickled_by_fields

STANDOUT_FRACTION = 0.10
STANDOUT_MIN_BYTES = 1024 * 1024
ALLOCATED = "allocated"  # RankDifference.what for the total rather than one component
ACTIVATIONS = "activations"

# The moment a RankDifference compares the files at (RankDifference.moment)
MOMENT_COMPARED = "compared"  # each file at its row's moment, and every row is at the same step and phase
MOMENT_STEP = "step"  # each file's peak of it in one step (RankDifference.step), steps numbered by the run's markers
MOMENT_TRACE_PEAK = "trace peak"  # each file's peak of it over its trace: the rows' moments differ
MOMENT_DIFFERENT = "different"  # each file at its row's moment, and those moments differ

RANK_FROM_METADATA = "metadata"
RANK_FROM_FILE_NAME = "file name"
RANK_UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class RankDump:
    """One file of a folder: who wrote it, when it ran out, and its analysis."""

    file: str  # its name inside the folder
    rank: int | None
    rank_source: str  # RANK_FROM_METADATA | RANK_FROM_FILE_NAME | RANK_UNKNOWN
    ran_out: bool  # the dump holds an OOM (its analysis judges the OOM, not a peak)
    oom_time_us: int | None  # epoch microseconds of the OOM; None when not recorded or no OOM
    analysis: Analysis
    environment: Environment
    # a rank that did not run out whose analysis judges a moment below its peak (its dump): the
    # analysis at the peak, where it is compared; None when `analysis` is already what is compared
    at_peak: Analysis | None = None

    @property
    def compared(self) -> Analysis:
        """The analysis at the moment the rank is compared: its OOM, else its peak."""
        return self.at_peak if self.at_peak is not None else self.analysis


@dataclass(frozen=True, slots=True)
class SkippedFile:
    """An entry of a folder that was not compared, and why."""

    name: str  # relative to the folder
    reason: str


@dataclass(frozen=True, slots=True)
class FolderSummary:
    """One sub-folder holding snapshot files, found by a recursive read (`report DIR --recursive`)."""

    name: str  # relative to the folder given, "/"-separated; "" for that folder itself
    file_count: int  # snapshot files listed in it
    read: bool  # its files were read (the folders are read in turn until one holds an OOM)
    readable_count: int  # of them, read and analysed (0 when not read)
    ran_out_count: int  # of those, files that hold an OOM
    step: int | None  # the step its name (or its files' names) states
    chosen: bool  # the folder whose ranks the report compares


@dataclass(frozen=True, slots=True)
class RankFolder:
    """A folder of per-rank dumps, read: one RankDump per readable file, the rest skipped."""

    directory: str
    dumps: tuple[RankDump, ...]
    skipped: tuple[SkippedFile, ...]  # not snapshots, sub-folders, temporary files, unreadable files
    # read with --recursive: the sub-folder whose dumps these are ("" for the folder itself) and
    # every folder of the tree that holds snapshot files, in the order they were considered
    folder: str = ""
    folders: tuple[FolderSummary, ...] = ()


@dataclass(frozen=True, slots=True)
class RankContents:
    """One readable file of a folder as `oomdoctor info DIR` shows it: what it holds, who wrote it."""

    contents: Contents
    rank: int | None  # its metadata's rank, else the one its name states


@dataclass(frozen=True, slots=True)
class RankRow:
    index: int  # the position of its dump in compare_ranks' input
    file: str
    rank: int | None
    rank_source: str
    host: str | None
    world_size: int | None
    ran_out: bool
    oom_time_us: int | None
    seconds_after_first: float | None  # after the first rank's OOM; None when either time is unknown
    verdict: str
    confidence: float
    target_kind: str  # "oom" | "peak" | "dump": the moment the bytes below describe
    step: int | None
    phase: str
    allocated_bytes: int
    reserved_bytes: int
    request_bytes: int | None
    components: tuple[tuple[str, int], ...]  # (name, bytes) in COMPONENTS order
    # torchelastic's launch id and restart count of the worker group, when the dump records them
    run_id: str | None = None
    restart_count: int | None = None
    # per step of its trace: (step, peak allocated, peak activations or None when unknown)
    step_peaks: tuple[tuple[int, int, int | None], ...] = ()
    steps_from_markers: bool = False  # its steps are numbered by the run's own markers (alike on every rank)
    trace_peak_bytes: int | None = None  # the peak over its trace; None without a trace


@dataclass(frozen=True, slots=True)
class RankDifference:
    """One rank's allocated bytes (what == ALLOCATED) or one component, against the median."""

    index: int  # the position of its dump in compare_ranks' input
    file: str
    rank: int | None
    what: str
    bytes: int
    median_bytes: int
    difference_bytes: int  # bytes - median_bytes
    moment: str = MOMENT_COMPARED  # what moment of each file the bytes describe (MOMENT_*)
    step: int | None = None  # the step, for MOMENT_STEP


@dataclass(frozen=True, slots=True)
class RankComparison:
    rows: tuple[RankRow, ...]  # by rank (unknown ranks last, by file name)
    first_index: int | None  # the row of the first rank to run out; None when none did
    order_known: bool  # every rank that ran out has an OOM time
    ran_out_count: int
    untimed_count: int  # ranks that ran out without an OOM time (not ordered)
    clock_hosts: int  # hosts of the ranks with an OOM time: the clocks the order rests on
    world_size: int | None  # as the dumps record it (the largest, if they disagree)
    world_sizes: tuple[int, ...]  # every world size the dumps record, ascending
    missing_ranks: tuple[int, ...]  # ranks below world_size without a file
    repeated_ranks: tuple[int, ...]  # ranks with more than one file
    median_allocated_bytes: int
    median_components: tuple[tuple[str, int], ...]
    differences: tuple[RankDifference, ...]  # largest first
    verdicts: tuple[tuple[str, int], ...]  # verdict -> files, among ranks that ran out (all when none did)
    verdicts_agree: bool
    # the (run id, restart count) pairs the files record, sorted (None last): more than one, and the
    # files come from different launches or restarts of the job, whose ranks did not run side by side
    launches: tuple[tuple[str | None, int | None], ...] = ()
    # what stands out most in the first rank to run out, compared like with like (`first_standout`)
    first_standout: RankDifference | None = None
    # when a rank ran out: what stands out most in the file that differs most from the median, when it
    # is not the first rank's, compared like with like as `first_standout` is
    largest_standout: RankDifference | None = None

    @property
    def first(self) -> RankRow | None:
        return None if self.first_index is None else self.rows[self.first_index]


def _oom_time(dump: RankDump) -> int | None:
    if not dump.ran_out:
        return None
    if dump.oom_time_us is not None:
        return dump.oom_time_us
    fatal = [oom for oom in dump.analysis.replay.ooms if oom.fatal]
    return fatal[0].time_us if fatal else None


def _row(index: int, dump: RankDump) -> RankRow:
    analysis = dump.compared
    return RankRow(
        index=index,
        file=dump.file,
        rank=dump.rank,
        rank_source=dump.rank_source,
        host=dump.environment.host,
        world_size=dump.environment.world_size,
        ran_out=dump.ran_out,
        oom_time_us=_oom_time(dump),
        seconds_after_first=None,
        verdict=analysis.verdict,
        confidence=analysis.confidence,
        target_kind=analysis.replay.target_kind,
        step=analysis.target_step,
        phase=analysis.target_phase,
        allocated_bytes=analysis.replay.target_allocated_bytes,  # the peak at the peak (docs/definitions.md)
        reserved_bytes=analysis.accounting.reserved_bytes,
        request_bytes=analysis.accounting.request_bytes,
        components=tuple((name, analysis.component_bytes().get(name, 0)) for name in COMPONENTS),
        run_id=dump.environment.run_id,
        restart_count=dump.environment.restart_count,
        step_peaks=tuple((s.step, s.peak_allocated_bytes, s.peak_activation_bytes) for s in analysis.steps),
        steps_from_markers=analysis.phase_source == SOURCE_MARKERS,
        trace_peak_bytes=None if analysis.replay.target_kind == "dump" else analysis.replay.peak_allocated_bytes,
    )


def _median(values: list[int]) -> int:
    return round(statistics.median(values)) if values else 0


def _sort_key(row: RankRow) -> tuple[int, int, str, int]:
    return (row.rank is None, row.rank if row.rank is not None else 0, row.file, row.index)


def compare_ranks(dumps: list[RankDump] | tuple[RankDump, ...]) -> RankComparison:
    """The comparison of a folder's dumps; at least one dump."""
    if not dumps:
        raise ValueError("compare_ranks needs at least one dump")
    rows = sorted((_row(i, d) for i, d in enumerate(dumps)), key=_sort_key)
    failed = [i for i, row in enumerate(rows) if row.ran_out]
    timed = [i for i in failed if rows[i].oom_time_us is not None]
    order_known = bool(failed) and len(timed) == len(failed)
    first_index: int | None = None
    if timed:
        first_index = min(timed, key=lambda i: (rows[i].oom_time_us, _sort_key(rows[i])))
    elif failed:
        first_index = failed[0]
    start = rows[first_index].oom_time_us if first_index is not None else None
    if start is not None:
        rows = [
            _with_offset(row, (row.oom_time_us - start) / 1e6 if row.oom_time_us is not None else None) for row in rows
        ]

    median_allocated = _median([row.allocated_bytes for row in rows])
    median_components = tuple((name, _median([dict(row.components)[name] for row in rows])) for name in COMPONENTS)
    threshold = max(STANDOUT_MIN_BYTES, round(STANDOUT_FRACTION * median_allocated))
    differences = _differences(rows, median_allocated, dict(median_components), threshold)
    first_standout = _standout_like(rows, first_index, differences, threshold) if first_index is not None else None
    # the file that differs most, when a rank ran out and it is another: its excess, like with like too
    largest = differences[0] if differences else None
    largest_standout = None
    if (
        first_index is not None
        and largest is not None
        and largest.index != rows[first_index].index
        and largest.difference_bytes > 0
    ):
        position = next(i for i, row in enumerate(rows) if row.index == largest.index)
        largest_standout = _standout_like(rows, position, differences, threshold)

    judged = [rows[i] for i in failed] if failed else rows
    verdict_counts = Counter(row.verdict for row in judged)
    verdicts = tuple(sorted(verdict_counts.items(), key=lambda item: (-item[1], item[0])))

    world_sizes = [row.world_size for row in rows if row.world_size is not None]
    world_size = max(world_sizes) if world_sizes else None
    ranks = Counter(row.rank for row in rows if row.rank is not None)
    missing = tuple(r for r in range(world_size) if r not in ranks) if world_size is not None else ()
    repeated = tuple(sorted(r for r, count in ranks.items() if count > 1))

    return RankComparison(
        rows=tuple(rows),
        first_index=first_index,
        order_known=order_known,
        ran_out_count=len(failed),
        untimed_count=len(failed) - len(timed),
        clock_hosts=len({rows[i].host for i in timed if rows[i].host}),
        world_size=world_size,
        world_sizes=tuple(sorted(set(world_sizes))),
        missing_ranks=missing,
        repeated_ranks=repeated,
        median_allocated_bytes=median_allocated,
        median_components=median_components,
        differences=differences,
        verdicts=verdicts,
        verdicts_agree=len(verdict_counts) == 1,
        launches=_launches(rows),
        first_standout=first_standout,
        largest_standout=largest_standout,
    )


def _launches(rows: list[RankRow]) -> tuple[tuple[str | None, int | None], ...]:
    """The launches and restarts the rows record; () when no file records either."""
    found = {(row.run_id, row.restart_count) for row in rows if row.run_id is not None or row.restart_count is not None}
    return tuple(sorted(found, key=lambda item: (item[0] is None, item[0] or "", item[1] is None, item[1] or 0)))


def _with_offset(row: RankRow, seconds: float | None) -> RankRow:
    return replace(row, seconds_after_first=seconds)


def _differences(
    rows: list[RankRow], median_allocated: int, median_components: dict[str, int], threshold: int
) -> tuple[RankDifference, ...]:
    if len(rows) < 2:
        return ()
    found = []
    for row in rows:
        measured = [(ALLOCATED, row.allocated_bytes, median_allocated)]
        measured += [(name, size, median_components[name]) for name, size in row.components]
        for what, size, median in measured:
            if abs(size - median) >= threshold:
                found.append(RankDifference(row.index, row.file, row.rank, what, size, median, size - median))
    found.sort(
        key=lambda d: (
            -abs(d.difference_bytes),
            d.what == ALLOCATED,
            d.rank if d.rank is not None else -1,
            d.file,
            d.index,
        )
    )
    return tuple(found)


def standout(comparison: RankComparison, index: int) -> RankDifference | None:
    """The largest excess of one file over the median: a component when one stands out, else its total."""
    excess = [d for d in comparison.differences if d.index == index and d.difference_bytes > 0]
    components = [d for d in excess if d.what != ALLOCATED]
    found = components or excess
    return found[0] if found else None


def _largest_excess(found: list[RankDifference]) -> RankDifference | None:
    """A component's excess when one stands out (the largest), else the total's; None without either."""
    excess = sorted((d for d in found if d.difference_bytes > 0), key=lambda d: -d.difference_bytes)
    components = [d for d in excess if d.what != ALLOCATED]
    chosen = components or excess
    return chosen[0] if chosen else None


def _standout_like(
    rows: list[RankRow], position: int, differences: tuple[RankDifference, ...], threshold: int
) -> RankDifference | None:
    """What stands out most in rows[position] (the first rank to run out, or the file that differs
    most), against the median, like with like.

    When every row is at its step and phase, the rows' own bytes are alike (MOMENT_COMPARED).
    Otherwise its moment and the others' are different (its OOM in a forward, their peaks in an
    optimizer step): its activations and its total are compared with each file's peak of them in its
    step, where every file holds that step numbered by the run's markers (MOMENT_STEP), else with
    each file's peak over its trace (MOMENT_TRACE_PEAK); the other components, which no step records,
    at the rows' own moments, said to differ (MOMENT_DIFFERENT)."""
    mine = rows[position]
    own = [d for d in differences if d.index == mine.index]
    if all((row.step, row.phase) == (mine.step, mine.phase) for row in rows):
        return _largest_excess(own)
    found = [replace(d, moment=MOMENT_DIFFERENT) for d in own if d.what not in (ALLOCATED, ACTIVATIONS)]
    found += _like_moment_excess(rows, position, threshold)
    return _largest_excess(found)


def _like_moment_excess(rows: list[RankRow], position: int, threshold: int) -> list[RankDifference]:
    """rows[position]'s activations and total against the median, each file at its peak of them in
    that row's step where every file numbers its steps by markers and holds that step, else over its
    trace."""
    step = rows[position].step
    at_step = [
        next(((peak, activations) for s, peak, activations in row.step_peaks if s == step), None) for row in rows
    ]
    aligned = step is not None and all(row.steps_from_markers for row in rows) and all(p is not None for p in at_step)
    measures: dict[str, list[int | None]]
    if aligned:
        moment, moment_step = MOMENT_STEP, step
        measures = {
            ALLOCATED: [p[0] if p is not None else None for p in at_step],
            ACTIVATIONS: [p[1] if p is not None else None for p in at_step],
        }
    else:
        moment, moment_step = MOMENT_TRACE_PEAK, None
        measures = {
            ALLOCATED: [row.trace_peak_bytes for row in rows],
            ACTIVATIONS: [_trace_activation_peak(row) for row in rows],
        }
    row_at = rows[position]
    found = []
    for what, values in measures.items():
        known = [v for v in values if v is not None]
        if len(known) < len(values):  # some file does not tell: no like-for-like median
            continue
        median = _median(known)
        mine = known[position]
        if mine - median >= threshold:
            found.append(
                RankDifference(
                    row_at.index, row_at.file, row_at.rank, what, mine, median, mine - median, moment, moment_step
                )
            )
    return found


def _trace_activation_peak(row: RankRow) -> int | None:
    """The most activations over the row's trace: the largest of its steps' peaks; None when unknown."""
    peaks = [activations for _, _, activations in row.step_peaks]
    if not peaks or any(p is None for p in peaks):
        return None
    return max(p for p in peaks if p is not None)


pickled_by_fields(globals())  # sent from a folder's worker processes to their parent: each class pickles fast
