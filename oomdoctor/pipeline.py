"""Load, analyse, render: the one place the layers are put together, for one file and for a folder
of per-rank dumps. The verbs (oomdoctor/commands) call these; the terminal app runs
`load_and_analyse` in its worker, handed to it by `open` and `demo`.

    snapshot, analysis = load_and_analyse(path, device=None, max_bytes=None, enter_stage=print)
    report_file(path, "md", redact=True)         # bytes: `oomdoctor report FILE`
    render_report(snapshot, "json", source=...)  # bytes: the report of a loaded snapshot
    info_file(path, "text")                      # str: `oomdoctor info FILE`

    folder = read_folder("oom-dumps")            # RankFolder: one RankDump per file, skipped files
    report_folder("oom-dumps", "text")           # bytes: `oomdoctor report DIR`
    read_folder("outputs", recursive=True)       # `report DIR --recursive`: the folder holding the OOM
    info_folder("oom-dumps", "json")             # str: `oomdoctor info DIR`

Each file of a folder is loaded and analysed in a worker process (oomdoctor.load.folder.map_files),
then the ranks are compared (oomdoctor.analysis.ranks). The rank of a file is the one its oomdoctor
metadata records, else the one its name states (`oom-rank5-...`, `snapshot_rank5.pickle`), else
unknown. A file that cannot be read becomes a note and the rest are still read; when none can be,
`read_folder` raises a one-line LoadError. With `redact`, each worker redacts its own file's results
with what it learned from that file (hosts differ between ranks) before sending them back, and
skipped files' names lose the host and pids oomdoctor's dump names hold.

Heavy or large modules (the analysis, the views, redaction) are imported when a function needs them.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable, Mapping, Sequence

from oomdoctor.analysis.ranks import (
    RANK_FROM_FILE_NAME,
    RANK_FROM_METADATA,
    RANK_UNKNOWN,
    FolderSummary,
    RankContents,
    RankDump,
    RankFolder,
    SkippedFile,
)
from oomdoctor.errors import LoadError, OomdoctorError
from oomdoctor.load.folder import (
    FileOutcome,
    FolderGroup,
    FolderListing,
    Shares,
    file_size,
    find_dump_files,
    find_dump_tree,
    map_files,
    rank_from_name,
    read_at_once,
    read_beside,
)

# -- one file ------------------------------------------------------------------------------------


def require_device(snapshot, device: int | None, source: str) -> None:
    """Refuse a --device the snapshot has no memory of (None: the failing one, always there)."""
    if device is not None and (device < 0 or device not in snapshot.devices):
        known = ", ".join(str(d) for d in snapshot.devices) or "none"
        raise OomdoctorError(f"{source}: no device {device} in this snapshot (devices: {known})")


def load_snapshot(
    path, *, device: int | None = None, max_bytes: int | None = None, progress: Callable[[float], None] | None = None
):
    """The snapshot in `path`, refused when it has no `device` (None: the failing one); `progress`
    hears the fraction of the load done (oomdoctor.load.load)."""
    from oomdoctor.load import load

    snapshot = load(path, max_bytes=max_bytes, progress=progress)
    require_device(snapshot, device, str(path))
    return snapshot


def load_and_analyse(
    path,
    *,
    device: int | None = None,
    max_bytes: int | None = None,
    enter_stage: Callable[[str], None] | None = None,
    progress: Callable[[float], None] | None = None,
):
    """(snapshot, analysis of `device`): what the terminal app shows. `enter_stage` hears of each
    stage after reading the file ("analysing"); `progress` the fraction of the whole work done,
    from 0 while the file is read to LOAD_SHARE once its model is built."""
    from oomdoctor.analysis import analyse

    snapshot = load_snapshot(path, device=device, max_bytes=max_bytes, progress=_scaled(progress, 0.0, LOAD_SHARE))
    if enter_stage is not None:
        enter_stage("analysing")
    return snapshot, analyse(snapshot, device=device)


# The share of load_and_analyse's work that loading takes (about two thirds on a large trace)
LOAD_SHARE = 0.7


def render_report(
    snapshot,
    output_format: str,
    *,
    source: str | None = None,
    redact: bool = False,
    device: int | None = None,
    analysis=None,
) -> bytes:
    """The report of a loaded snapshot in one format ("text", "md", "json"), as `report` prints it
    (`analysis`: the snapshot's, when the caller has it already)."""
    from oomdoctor.analysis import analyse
    from oomdoctor.analysis.environment import environment_of

    if analysis is None:
        analysis = analyse(snapshot, device=device)
    environment = environment_of(snapshot)
    if redact:
        from oomdoctor.redact import Redactor, redact_analysis, redact_environment

        redactor = Redactor.from_snapshot(snapshot)
        analysis = redact_analysis(analysis, redactor)
        environment = redact_environment(environment, redactor)
        source = redactor.source(source) if source else source
    if output_format == "json":
        from oomdoctor.views.json_report import render as render_json

        return render_json(analysis, environment=environment)
    if output_format == "md":
        from oomdoctor.views.markdown_report import render as render_markdown

        return render_markdown(analysis, source=source, environment=environment).encode()
    from oomdoctor.views.text_report import render as render_text

    return render_text(analysis, source=source).encode()


def report_file(
    path: str,
    output_format: str,
    *,
    redact: bool = False,
    device: int | None = None,
    max_bytes: int | None = None,
    progress: Callable[[float], None] | None = None,
) -> bytes:
    """`oomdoctor report FILE` in "text", "md" or "json" (`progress`: as `load_snapshot`'s)."""
    return report_file_analysed(
        path, output_format, redact=redact, device=device, max_bytes=max_bytes, progress=progress
    )[0]


def report_file_analysed(
    path: str,
    output_format: str,
    *,
    redact: bool = False,
    device: int | None = None,
    max_bytes: int | None = None,
    progress: Callable[[float], None] | None = None,
):
    """(`report_file`'s bytes, the analysis they report, unredacted): for `report --fail-if`
    (`progress`: as `load_snapshot`'s)."""
    from oomdoctor.analysis import analyse

    snapshot = load_snapshot(path, device=device, max_bytes=max_bytes, progress=progress)
    analysis = analyse(snapshot, device=device)
    rendered = render_report(snapshot, output_format, source=str(path), redact=redact, device=device, analysis=analysis)
    return rendered, analysis


def info_file(
    path: str, output_format: str, *, max_bytes: int | None = None, progress: Callable[[float], None] | None = None
) -> str:
    """`oomdoctor info FILE` in "text" or "json" (`progress`: as `load_snapshot`'s)."""
    from oomdoctor.analysis.contents import describe
    from oomdoctor.views.info import to_json, to_text

    contents = describe(load_snapshot(path, max_bytes=max_bytes, progress=progress), path)
    return to_json(contents) + "\n" if output_format == "json" else to_text(contents)


# -- a folder of per-rank dumps ------------------------------------------------------------------


def read_rank(
    path: str,
    *,
    max_bytes: int | None = None,
    redact: bool = False,
    root: str | None = None,
    progress: Callable[[float], None] | None = None,
) -> RankDump:
    """Load and analyse one rank's file (what each worker process runs); its `file` is its name, or
    with `root` its path relative to that folder. `progress` hears the fraction of the work done
    (to LOAD_SHARE once its model is built)."""
    from oomdoctor.analysis import analyser
    from oomdoctor.analysis.environment import environment_of

    snapshot = load_snapshot(path, max_bytes=max_bytes, progress=_scaled(progress, 0.0, LOAD_SHARE))
    judge = analyser(snapshot)
    analysis = judge.analyse()
    environment = environment_of(snapshot)
    metadata = snapshot.oomdoctor_raw if isinstance(snapshot.oomdoctor_raw, Mapping) else {}
    name = _relative(path, root)
    rank, rank_source = _rank(environment.rank, path)
    oom = metadata.get("oom")
    recorded_time = oom.get("time_us") if isinstance(oom, Mapping) else None
    ran_out = analysis.replay.target_kind == "oom"
    replay = analysis.replay
    at_peak = None
    if not ran_out and replay.peak_index is not None and replay.peak_allocated_bytes > replay.target_allocated_bytes:
        # a rank that did not run out is compared at its peak, not at the quieter moment its dump describes
        at_peak = judge.analyse(replay.peak_index)
    if redact:
        from oomdoctor.redact import Redactor, redact_analysis, redact_environment

        redactor = Redactor.from_snapshot(snapshot)
        analysis = redact_analysis(analysis, redactor)
        at_peak = redact_analysis(at_peak, redactor) if at_peak is not None else None
        environment = redact_environment(environment, redactor)
        name = redactor.source(name)
    return RankDump(
        file=name,
        rank=rank,
        rank_source=rank_source,
        ran_out=ran_out,
        oom_time_us=recorded_time if ran_out and type(recorded_time) is int else None,
        analysis=analysis,
        environment=environment,
        at_peak=at_peak,
    )


def _rank(recorded: int | None, path: str) -> tuple[int | None, str]:
    """(rank, how it is known) of the file at `path`: the rank oomdoctor's metadata `recorded`,
    else the one its name gives, else None."""
    if recorded is not None:
        return recorded, RANK_FROM_METADATA
    rank = rank_from_name(os.path.basename(path))
    return rank, RANK_FROM_FILE_NAME if rank is not None else RANK_UNKNOWN


def _file_rank(
    path: str, *, max_bytes: int | None = None, progress: Callable[[float], None] | None = None
) -> int | None:
    """The rank of the file at `path`, as `read_rank` finds it, from its load alone (what each
    worker runs for `diff --ranks`; `progress` hears the fraction of the load done)."""
    from oomdoctor.analysis.environment import environment_of

    return _rank(environment_of(load_snapshot(path, max_bytes=max_bytes, progress=progress)).rank, path)[0]


def read_folder(
    directory: str | os.PathLike[str],
    *,
    max_bytes: int | None = None,
    redact: bool = False,
    parallel: bool = True,
    max_workers: int | None = None,
    recursive: bool = False,
    max_total_bytes: int | None = None,
    progress: Callable[[float], None] | None = None,
) -> RankFolder:
    """Every dump in `directory`, loaded and analysed in parallel worker processes; with `recursive`,
    the dumps of the one folder of its tree that holds the OOM (`read_tree`). `progress` hears the
    fraction of the files' work done (map_files)."""
    if recursive:
        return read_tree(
            directory,
            max_bytes=max_bytes,
            redact=redact,
            parallel=parallel,
            max_workers=max_workers,
            max_total_bytes=max_total_bytes,
            progress=progress,
        )
    listing = find_dump_files(directory)
    work = functools.partial(read_rank, max_bytes=max_bytes, redact=redact)
    outcomes = map_files(listing.paths, work, max_workers=max_workers, parallel=parallel, progress=progress)
    dumps = tuple(outcome.value for outcome in outcomes if outcome.error is None)
    failures = _skipped(outcomes)
    if not dumps:
        raise LoadError(_nothing_read(listing.directory, failures + _skipped(listing.skipped)))
    skipped = _skipped(listing.skipped) + failures
    if redact:
        skipped = tuple(SkippedFile(_redacted_name(item.name), item.reason) for item in skipped)
    return RankFolder(listing.directory, dumps, skipped)


# With --recursive, the files read in one command may total at most this many times the per-file
# limit (4 GiB by default: 64 GiB), or `max_total_bytes`; files past it are skipped, saying so.
TOTAL_BYTES_FACTOR = 16


def total_limit(max_bytes: int | None, max_total_bytes: int | None) -> int:
    from oomdoctor.load.containers import resolve_max_bytes

    return max_total_bytes if max_total_bytes is not None else TOTAL_BYTES_FACTOR * resolve_max_bytes(max_bytes)


def _within_total(paths: tuple[str, ...], budget: list[int]) -> tuple[list[str], list[FileOutcome]]:
    """The paths whose sizes fit in what is left of `budget` (a one-item list, spent), and the rest."""
    from oomdoctor.units import human_size

    kept: list[str] = []
    over: list[FileOutcome] = []
    for path in paths:
        size = file_size(path)
        if size > budget[0]:
            over.append(
                FileOutcome(path, None, f"not read: the files of a recursive read may total {human_size(budget[1])}")
            )
            continue
        budget[0] -= size
        kept.append(path)
    return kept, over


def _relative(path: str, root: str | None) -> str:
    """A file's name as a folder report shows it: its base name, or with `root` its path under it."""
    if root is None:
        return os.path.basename(path)
    return os.path.relpath(path, root).replace(os.sep, "/")


def read_tree(
    directory: str | os.PathLike[str],
    *,
    max_bytes: int | None = None,
    redact: bool = False,
    parallel: bool = True,
    max_workers: int | None = None,
    max_total_bytes: int | None = None,
    progress: Callable[[float], None] | None = None,
) -> RankFolder:
    """`report DIR --recursive`: the dumps of the one folder of `directory`'s tree that holds the OOM.

    The folders holding snapshot files are read in turn, those whose names say they were written at
    an OOM first (oomdoctor's `oom-` dumps, torchtitan's `..._exit` folders), then the latest step
    (`iteration_20` before `iteration_10`), then the newest files, until one holds a file that ran out
    of memory; that folder's ranks are compared (the first folder read when none did). The other
    folders are summed up in `folders`; file names are relative to `directory`.

    `progress` hears the fraction done of all the files the budget lets be read, each weighted by its
    size: the reading stops short of them all once a folder holds an OOM, and 1.0 when it is over."""
    tree = find_dump_tree(directory)
    root = tree.directory
    budget = [total_limit(max_bytes, max_total_bytes)] * 2
    work = functools.partial(read_rank, max_bytes=max_bytes, redact=redact, root=root)
    read: dict[str, tuple[tuple[RankDump, ...], tuple[FileOutcome, ...]]] = {}
    chosen = None
    plan = _Plan(tree.groups, budget, progress)
    for group in tree.groups:
        paths, over = _within_total(group.paths, budget)
        told = plan.group(paths)
        outcomes = map_files(paths, work, max_workers=max_workers, parallel=parallel, progress=told) if paths else ()
        dumps = tuple(outcome.value for outcome in outcomes if outcome.error is None)
        read[group.folder] = (dumps, group.skipped + tuple(o for o in outcomes if o.error is not None) + tuple(over))
        if any(dump.ran_out for dump in dumps):
            chosen = group
            break
    if progress is not None:  # the reading is over, short of every file or not
        progress(1.0)
    if chosen is None:
        chosen = next((group for group in tree.groups if read.get(group.folder, ((), ()))[0]), None)
    if chosen is None:
        failures = tuple(outcome for _, notes in read.values() for outcome in notes) + tree.skipped
        raise LoadError(_nothing_read(root, _named(failures, root, redact), recursive=True))
    dumps, notes = read[chosen.folder]
    summaries = tuple(
        FolderSummary(
            name=group.folder,
            file_count=len(group.paths),
            read=group.folder in read,
            readable_count=len(read.get(group.folder, ((), ()))[0]),
            ran_out_count=sum(dump.ran_out for dump in read.get(group.folder, ((), ()))[0]),
            step=group.step,
            chosen=group is chosen,
        )
        for group in tree.groups
    )
    return RankFolder(root, dumps, _named(tree.skipped + notes, root, redact), chosen.folder, summaries)


class _Plan:
    """`read_tree`'s progress: the groups are read in turn, and each group's files have their share
    of the bytes of every file the budget would let be read (fewer, when a folder holds an OOM)."""

    def __init__(
        self, groups: Sequence[FolderGroup], budget: list[int], progress: Callable[[float], None] | None
    ) -> None:
        self._progress = progress
        self._done = 0
        self._total = 0
        if progress is not None:
            left = list(budget)  # (`_within_total` spends it; the read spends its own)
            for group in groups:
                self._total += sum(max(file_size(path), 1) for path in _within_total(group.paths, left)[0])

    def group(self, paths: Sequence[str]) -> Callable[[float], None] | None:
        """The progress of one group's `paths` (map_files's), in the whole's."""
        progress = self._progress
        if progress is None or not paths:
            return None
        start, total = self._done, max(self._total, 1)
        self._done += sum(max(file_size(path), 1) for path in paths)
        share = self._done - start
        return lambda fraction: progress(min((start + share * fraction) / total, 1.0))


def _named(outcomes: tuple[FileOutcome, ...], root: str, redact: bool) -> tuple[SkippedFile, ...]:
    """Skipped entries of a tree, named by their paths under `root` (redacted like skipped names)."""
    skipped = tuple(SkippedFile(_relative(o.path, root), o.error) for o in outcomes if o.error is not None)
    return tuple(SkippedFile(_redacted_name(i.name), i.reason) for i in skipped) if redact else skipped


def info_row(
    path: str,
    *,
    max_bytes: int | None = None,
    root: str | None = None,
    progress: Callable[[float], None] | None = None,
) -> RankContents:
    """What one file holds, with the rank it was written by (what each worker runs for info;
    `progress` hears the fraction of the load done)."""
    from oomdoctor.analysis.contents import describe

    name = _relative(path, root)
    contents = describe(load_snapshot(path, max_bytes=max_bytes, progress=progress), name)
    recorded = contents.metadata.get("rank") if contents.metadata is not None else None
    return RankContents(contents, recorded if type(recorded) is int else rank_from_name(os.path.basename(path)))


def read_folder_info(
    directory: str | os.PathLike[str],
    *,
    max_bytes: int | None = None,
    parallel: bool = True,
    recursive: bool = False,
    max_total_bytes: int | None = None,
    progress: Callable[[float], None] | None = None,
) -> tuple[str, tuple[RankContents, ...], tuple[SkippedFile, ...]]:
    """(folder, one `info_row` per readable file, skipped files) for `oomdoctor info DIR`; with
    `recursive`, every file of every sub-folder (`find_dump_tree`), named by its path under DIR.
    `progress` hears the fraction of the files read (map_files)."""
    root: str | None = None
    if recursive:
        tree = find_dump_tree(directory)
        root = tree.directory
        budget = [total_limit(max_bytes, max_total_bytes)] * 2
        paths, over = _within_total(tuple(p for group in tree.groups for p in group.paths), budget)
        notes = tree.skipped + tuple(o for group in tree.groups for o in group.skipped) + tuple(over)
        listing = FolderListing(root, tuple(paths), notes)
    else:
        listing = find_dump_files(directory)
    work = functools.partial(info_row, max_bytes=max_bytes, root=root)
    outcomes = map_files(listing.paths, work, parallel=parallel, progress=progress)
    rows = tuple(outcome.value for outcome in outcomes if outcome.error is None)
    failures = _skipped(outcomes, root)
    if not rows:
        raise LoadError(_nothing_read(listing.directory, failures + _skipped(listing.skipped, root), recursive))
    return listing.directory, rows, _skipped(listing.skipped, root) + failures


def report_folder(
    directory: str,
    output_format: str,
    *,
    redact: bool = False,
    max_bytes: int | None = None,
    recursive: bool = False,
    progress: Callable[[float], None] | None = None,
) -> bytes:
    """`oomdoctor report DIR [--recursive]` in "text", "md" or "json" (`progress`: read_folder's)."""
    return report_folder_read(
        directory, output_format, redact=redact, max_bytes=max_bytes, recursive=recursive, progress=progress
    )[0]


def report_folder_read(
    directory: str,
    output_format: str,
    *,
    redact: bool = False,
    max_bytes: int | None = None,
    recursive: bool = False,
    progress: Callable[[float], None] | None = None,
) -> tuple[bytes, RankFolder]:
    """(`report_folder`'s bytes, the folder it read): for `report DIR --fail-if`."""
    from oomdoctor.analysis.ranks import compare_ranks
    from oomdoctor.views.ranks import render

    folder = read_folder(directory, max_bytes=max_bytes, redact=redact, recursive=recursive, progress=progress)
    shown = os.path.basename(os.path.normpath(folder.directory)) if redact else folder.directory
    comparison = compare_ranks(folder.dumps)
    rendered = render(output_format, shown, comparison, folder.dumps, folder.skipped, folders=folder.folders)
    return rendered, folder


def info_folder(
    directory: str,
    output_format: str,
    *,
    max_bytes: int | None = None,
    recursive: bool = False,
    progress: Callable[[float], None] | None = None,
) -> str:
    """`oomdoctor info DIR [--recursive]` in "text" or "json" (`progress`: read_folder_info's)."""
    from oomdoctor.views.ranks import info_json, info_text

    shown, rows, skipped = read_folder_info(directory, max_bytes=max_bytes, recursive=recursive, progress=progress)
    return info_json(shown, rows, skipped) + "\n" if output_format == "json" else info_text(shown, rows, skipped)


def _skipped(outcomes: tuple[FileOutcome, ...], root: str | None = None) -> tuple[SkippedFile, ...]:
    """The files not read (a listing's skipped entries, or files whose `work` failed), by name (by
    path under `root`, when given)."""
    return tuple(SkippedFile(_relative(o.path, root), o.error) for o in outcomes if o.error is not None)


def _redacted_name(name: str) -> str:
    """A file name without the host and pids in oomdoctor's dump names and capture's temporary files."""
    from oomdoctor.redact import PID, Redactor

    return re.sub(r"\.\d+\.tmp$", f".{PID}.tmp", Redactor().dump_name(name))


def _nothing_read(directory: str, skipped: tuple[SkippedFile, ...], recursive: bool = False) -> str:
    where = "this folder or its sub-folders" if recursive else "this folder"
    if not skipped:
        return f"{directory}: no snapshot files in {where}"
    first = skipped[0]
    more = f" (and {len(skipped) - 1} more)" if len(skipped) > 1 else ""
    return f"{directory}: no readable snapshot in {where}; {first.name}: {first.reason}{more}"


# -- two dumps, two steps of one, two ranks of a folder, compared ----------------------------------


def diff_side(
    snapshot,
    label: str,
    *,
    device: int | None = None,
    redact: bool = False,
    step: int | None = None,
    source: str | None = None,
    judge=None,
):
    """One side of `oomdoctor diff` (analysis.diff.Side): the snapshot at its target and at its
    peak, or, with `step`, at that step's peak and its OOM (else its last event). `judge`: the
    caller's `analysis.Analyser` of the snapshot's device, when it has one (each moment is then
    judged once, whoever asks)."""
    from oomdoctor.analysis import analyser
    from oomdoctor.analysis.diff import (
        MOMENT_DUMP,
        MOMENT_OOM,
        MOMENT_PEAK,
        MOMENT_STEP_END,
        Side,
        step_of,
        step_peak_index,
    )
    from oomdoctor.analysis.environment import environment_of

    if judge is None:
        judge = analyser(snapshot, device=device)
    analysis = judge.analyse()
    replay = analysis.replay
    target_moment = None
    peak_moment = MOMENT_PEAK
    if step is None:
        at_target = analysis
        same = replay.peak_index is None or replay.peak_index == replay.target_index
        at_peak = analysis if same else judge.analyse(replay.peak_index)
        if replay.peak_index is None:
            peak_moment = MOMENT_DUMP  # no allocation in a trace: the peak is unknown, the dump is what is known
    else:
        summary = step_of(analysis.steps, step)
        if summary is None:
            known = ", ".join(str(s.step) for s in analysis.steps) or "none are marked"
            raise OomdoctorError(f"{source or label}: no step {step} in this dump (steps: {known})")
        settings = snapshot.allocator_settings
        divisions = settings.rounding_divisions if settings is not None else ()
        peak_index = step_peak_index(snapshot.traces[analysis.device], summary, divisions)
        at_peak = judge.analyse(peak_index)
        fatal = replay.target_index if replay.target_kind == "oom" else None
        if fatal is not None and summary.first_index <= fatal <= summary.last_index:
            at_target, target_moment = analysis, MOMENT_OOM
        else:
            at_target = judge.analyse(summary.last_index)
            target_moment = MOMENT_STEP_END
    environment = environment_of(snapshot)
    if redact:
        from oomdoctor.redact import Redactor, redact_analysis, redact_environment

        redactor = Redactor.from_snapshot(snapshot)
        at_target, at_peak = redact_analysis(at_target, redactor), redact_analysis(at_peak, redactor)
        environment = redact_environment(environment, redactor)
    return Side.of(
        at_target,
        at_peak,
        label=label,
        metadata=snapshot.oomdoctor,
        environment=environment,
        argv=environment.argv,
        target_moment=target_moment,
        peak_moment=peak_moment,
    )


def _shown(path: str, redact: bool) -> str:
    """A path as a diff names its side: redacted, only its file name."""
    return os.path.basename(os.path.normpath(path)) if redact else str(path)


def diff_files(
    path_a: str,
    path_b: str,
    *,
    device: int | None = None,
    redact: bool = False,
    max_bytes: int | None = None,
    progress: Callable[[float], None] | None = None,
):
    """`oomdoctor diff A B`: analysis.diff.Diff of two files (`progress`: the fraction of the two
    files' work done, each weighted by its size)."""
    from oomdoctor.analysis.diff import DIFF_FILES, compare

    labels = (_shown(path_a, redact), _shown(path_b, redact))
    return compare(*_file_sides((path_a, path_b), labels, device, redact, max_bytes, progress), kind=DIFF_FILES)


# Two files are read in two worker processes at once when both are at least this large (and two
# CPUs are idle, and memory holds both): a smaller file is read in less than the pool costs to start.
PARALLEL_SIDE_MIN_BYTES = 4 << 20


def _file_sides(
    paths: tuple[str, str],
    labels: tuple[str, str],
    device: int | None,
    redact: bool,
    max_bytes: int | None,
    progress: Callable[[float], None] | None = None,
) -> list:
    """`diff_side` of each of two files (their `labels`: one per distinct path). Each side keeps
    what it compares, not its snapshot, which goes before the next file is read; two large files
    are read at once, in worker processes (`read_at_once`: a file they could not read is read
    here, so that its error is what it would be). `progress` hears the fraction of the two files'
    work done, each weighted by its size."""
    work = functools.partial(
        _file_side, labels=dict(zip(paths, labels)), device=device, redact=redact, max_bytes=max_bytes
    )
    done = read_at_once(paths, work, min_bytes=PARALLEL_SIDE_MIN_BYTES, progress=progress)
    if len(done) == len(paths) or progress is None:
        return [done[index] if index in done else work(path) for index, path in enumerate(paths)]
    # the rest here, in turn, each file's share of the progress by its size (those read, counted done)
    shares = Shares([file_size(path) for path in paths], progress, shared=False)
    shares.done(done)
    return [done[index] if index in done else shares.work(work, index, path) for index, path in enumerate(paths)]


def _file_side(
    path: str,
    *,
    labels: Mapping[str, str],
    device: int | None,
    redact: bool,
    max_bytes: int | None,
    progress: Callable[[float], None] | None = None,
):
    """`diff_side` of the file at `path` (named `labels[path]`), its snapshot let go once the side is
    made; `progress` hears the fraction of the work done (to LOAD_SHARE once its model is built)."""
    snapshot = load_snapshot(path, device=device, max_bytes=max_bytes, progress=_scaled(progress, 0.0, LOAD_SHARE))
    return diff_side(snapshot, labels[path], device=device, redact=redact)


def compare_files(
    path_a: str,
    path_b: str,
    *,
    device: int | None = None,
    max_bytes: int | None = None,
    enter_stage: Callable[[str], None] | None = None,
    progress: Callable[[float], None] | None = None,
):
    """What `oomdoctor open A --compare B` shows: (analysis of A, analysis of B, their diff), the
    diff made as `diff_files` makes it (the same sides, the same rows). `enter_stage` hears each
    stage ("reading B"), `progress` the fraction of the whole work done.

    Two large files are read at once (`read_beside`, under the rule `diff` reads them by): B in a
    worker process while A is read here, A's reading then most of the progress. Otherwise (each
    file half of the progress), or when the worker could not read B (the rest of it), B is read
    here after A, so that an error is raised as it would be without workers. Each file's snapshot
    goes once its analysis and side are made."""
    from oomdoctor.analysis.diff import DIFF_FILES, compare

    work = functools.partial(_analysed_side, device=device, max_bytes=max_bytes)
    beside = read_beside((path_a, path_b), 1, work, min_bytes=PARALLEL_SIDE_MIN_BYTES)
    try:
        a_done = 0.5 if beside is None else 0.9
        analysis_a, side_a = work(path_a, key="A", enter_stage=enter_stage, progress=_scaled(progress, 0, a_done))
        if progress is not None:
            progress(a_done)
        if beside is not None and enter_stage is not None:
            enter_stage("reading B")
        read, found = (False, None) if beside is None else beside.result()
    finally:
        if beside is not None:
            beside.close()
    if read:
        analysis_b, side_b = found
    else:
        analysis_b, side_b = work(path_b, key="B", enter_stage=enter_stage, progress=_scaled(progress, a_done, 1))
    if progress is not None:
        progress(1.0)
    if enter_stage is not None:
        enter_stage("comparing")
    return analysis_a, analysis_b, compare(side_a, side_b, kind=DIFF_FILES)


def _scaled(progress: Callable[[float], None] | None, start: float, end: float) -> Callable[[float], None] | None:
    """`progress` for a part of the work that runs from `start` to `end` of the whole: its own
    fractions, 0 to 1, told as the whole's (None without a progress)."""
    if progress is None:
        return None
    return lambda fraction: progress(start + fraction * (end - start))


def _analysed_side(
    path: str,
    *,
    device: int | None,
    max_bytes: int | None,
    key: str = "",
    enter_stage: Callable[[str], None] | None = None,
    progress: Callable[[float], None] | None = None,
):
    """(analysis, diff side) of one file of `compare_files` (here, or in its worker), named `key` in
    the stages; the snapshot is let go when they are made. `progress` hears the fraction of the work
    done (to LOAD_SHARE once its model is built)."""
    from oomdoctor.analysis import analyser

    if enter_stage is not None:
        enter_stage(f"reading {key}")
    snapshot = load_snapshot(path, device=device, max_bytes=max_bytes, progress=_scaled(progress, 0.0, LOAD_SHARE))
    if enter_stage is not None:
        enter_stage(f"analysing {key}")
    judge = analyser(snapshot, device=device)
    return judge.analyse(), diff_side(snapshot, _shown(path, False), device=device, judge=judge)


def diff_steps(
    path: str,
    step_a: int,
    step_b: int,
    *,
    device: int | None = None,
    redact: bool = False,
    max_bytes: int | None = None,
    progress: Callable[[float], None] | None = None,
):
    """`oomdoctor diff FILE --steps I J`: two steps of one dump (`progress`: the load's)."""
    from oomdoctor.analysis import analyser
    from oomdoctor.analysis.diff import DIFF_STEPS, compare

    snapshot = load_snapshot(path, device=device, max_bytes=max_bytes, progress=progress)
    judge = analyser(snapshot, device=device)  # one reading of the device for both steps' moments
    a, b = (
        diff_side(snapshot, f"step {step}", device=device, redact=redact, step=step, source=str(path), judge=judge)
        for step in (step_a, step_b)
    )
    return compare(a, b, kind=DIFF_STEPS)


def diff_ranks(
    directory: str,
    rank_a: int,
    rank_b: int,
    *,
    redact: bool = False,
    max_bytes: int | None = None,
    progress: Callable[[float], None] | None = None,
):
    """`oomdoctor diff DIR --ranks R S`: the files of two ranks of a folder, each at its failing
    device. `progress` hears the fraction of the work done: finding the ranks, then reading the two
    files, half of it each."""
    from oomdoctor.analysis.diff import DIFF_RANKS, compare

    # which file is which rank: each file loaded (in parallel), not analysed; then the two analysed
    listing = find_dump_files(directory)
    outcomes = map_files(
        listing.paths, functools.partial(_file_rank, max_bytes=max_bytes), progress=_scaled(progress, 0.0, 0.5)
    )
    ranked = [(_relative(outcome.path, None), outcome.value) for outcome in outcomes if outcome.error is None]
    if not ranked:
        raise LoadError(_nothing_read(listing.directory, _skipped(outcomes) + _skipped(listing.skipped)))
    chosen = []
    for rank in (rank_a, rank_b):
        files = [name for name, its_rank in ranked if its_rank == rank]
        if not files:
            # a file its name says is that rank's, that could not be read: say why, not only that none is
            unread = [o for o in outcomes if o.error is not None and rank_from_name(os.path.basename(o.path)) == rank]
            if unread:
                name = _relative(unread[0].path, None)
                raise OomdoctorError(
                    f"{directory}: the file of rank {rank}, {name}, could not be read: {unread[0].error}"
                )
            known = ", ".join(str(r) for r in sorted({r for _, r in ranked if r is not None})) or "none"
            raise OomdoctorError(f"{directory}: no file of rank {rank} in this folder (ranks: {known})")
        if len(files) > 1:
            raise OomdoctorError(
                f"{directory}: {len(files)} files are rank {rank} ({files[0]}, {files[1]}): pick two files"
            )
        chosen.append(os.path.join(listing.directory, files[0]))
    paths = (chosen[0], chosen[1])
    labels = (f"rank {rank_a}", f"rank {rank_b}")
    sides = _file_sides(paths, labels, None, redact, max_bytes, _scaled(progress, 0.5, 1.0))
    return compare(*sides, kind=DIFF_RANKS)


def render_diff(diff, output_format: str) -> bytes:
    """A diff in "text", "md" or "json", as `oomdoctor diff` prints it."""
    from oomdoctor.views import diff_report

    if output_format == "json":
        return diff_report.to_json(diff)
    if output_format == "md":
        return diff_report.to_markdown(diff).encode()
    return diff_report.to_text(diff).encode()
