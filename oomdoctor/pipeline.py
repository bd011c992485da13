"""Load, analyse, render: the one place the layers are put together, for one file and for a folder
of per-rank dumps. The verbs (oomdoctor/commands) call these; the terminal app runs
`load_and_analyse` in its worker, handed to it by `open` and `demo`.

    snapshot, analysis = load_and_analyse(path, device=None, max_bytes=None, enter_stage=print)
    report_file(path, "md", redact=True)         # bytes: `oomdoctor report FILE`
    render_report(snapshot, "json", source=...)  # bytes: the report of a loaded snapshot
    info_file(path, "text")                      # str: `oomdoctor info FILE`

    folder = read_folder("oom-dumps")            # RankFolder: one RankDump per file, skipped files
    report_folder("oom-dumps", "text")           # bytes: `oomdoctor report DIR`
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
from collections.abc import Callable, Mapping

from oomdoctor.analysis.ranks import (
    RANK_FROM_FILE_NAME,
    RANK_FROM_METADATA,
    RANK_UNKNOWN,
    RankContents,
    RankDump,
    RankFolder,
    SkippedFile,
)
from oomdoctor.errors import LoadError, OomdoctorError
from oomdoctor.load.folder import FileOutcome, find_dump_files, map_files, rank_from_name

# -- one file ------------------------------------------------------------------------------------


def require_device(snapshot, device: int | None, source: str) -> None:
    """Refuse a --device the snapshot has no memory of (None: the failing one, always there)."""
    if device is not None and (device < 0 or device not in snapshot.devices):
        known = ", ".join(str(d) for d in snapshot.devices) or "none"
        raise OomdoctorError(f"{source}: no device {device} in this snapshot (devices: {known})")


def load_snapshot(path, *, device: int | None = None, max_bytes: int | None = None):
    """The snapshot in `path`, refused when it has no `device` (None: the failing one)."""
    from oomdoctor.load import load

    snapshot = load(path, max_bytes=max_bytes)
    require_device(snapshot, device, str(path))
    return snapshot


def load_and_analyse(
    path,
    *,
    device: int | None = None,
    max_bytes: int | None = None,
    enter_stage: Callable[[str], None] | None = None,
):
    """(snapshot, analysis of `device`): what the terminal app shows. `enter_stage` hears of each
    stage after reading the file ("analysing")."""
    from oomdoctor.analysis import analyse

    snapshot = load_snapshot(path, device=device, max_bytes=max_bytes)
    if enter_stage is not None:
        enter_stage("analysing")
    return snapshot, analyse(snapshot, device=device)


def render_report(
    snapshot, output_format: str, *, source: str | None = None, redact: bool = False, device: int | None = None
) -> bytes:
    """The report of a loaded snapshot in one format ("text", "md", "json"), as `report` prints it."""
    from oomdoctor.analysis import analyse
    from oomdoctor.analysis.environment import environment_of

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
    path: str, output_format: str, *, redact: bool = False, device: int | None = None, max_bytes: int | None = None
) -> bytes:
    """`oomdoctor report FILE` in "text", "md" or "json"."""
    snapshot = load_snapshot(path, device=device, max_bytes=max_bytes)
    return render_report(snapshot, output_format, source=str(path), redact=redact, device=device)


def info_file(path: str, output_format: str, *, max_bytes: int | None = None) -> str:
    """`oomdoctor info FILE` in "text" or "json"."""
    from oomdoctor.analysis.contents import describe
    from oomdoctor.views.info import to_json, to_text

    contents = describe(load_snapshot(path, max_bytes=max_bytes), path)
    return to_json(contents) + "\n" if output_format == "json" else to_text(contents)


# -- a folder of per-rank dumps ------------------------------------------------------------------


def read_rank(path: str, *, max_bytes: int | None = None, redact: bool = False) -> RankDump:
    """Load and analyse one rank's file (what each worker process runs)."""
    from oomdoctor.analysis import analyse
    from oomdoctor.analysis.environment import environment_of

    snapshot = load_snapshot(path, max_bytes=max_bytes)
    analysis = analyse(snapshot)
    environment = environment_of(snapshot)
    metadata = snapshot.oomdoctor_raw if isinstance(snapshot.oomdoctor_raw, Mapping) else {}
    name = os.path.basename(path)
    if environment.rank is not None:
        rank, rank_source = environment.rank, RANK_FROM_METADATA
    else:
        rank = rank_from_name(name)
        rank_source = RANK_FROM_FILE_NAME if rank is not None else RANK_UNKNOWN
    oom = metadata.get("oom")
    recorded_time = oom.get("time_us") if isinstance(oom, Mapping) else None
    ran_out = analysis.replay.target_kind == "oom"
    if redact:
        from oomdoctor.redact import Redactor, redact_analysis, redact_environment

        redactor = Redactor.from_snapshot(snapshot)
        analysis = redact_analysis(analysis, redactor)
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
    )


def read_folder(
    directory: str | os.PathLike[str],
    *,
    max_bytes: int | None = None,
    redact: bool = False,
    parallel: bool = True,
    max_workers: int | None = None,
) -> RankFolder:
    """Every dump in `directory`, loaded and analysed in parallel worker processes."""
    listing = find_dump_files(directory)
    work = functools.partial(read_rank, max_bytes=max_bytes, redact=redact)
    outcomes = map_files(listing.paths, work, max_workers=max_workers, parallel=parallel)
    dumps = tuple(outcome.value for outcome in outcomes if outcome.error is None)
    failures = _skipped(outcomes)
    if not dumps:
        raise LoadError(_nothing_read(listing.directory, failures + _skipped(listing.skipped)))
    skipped = _skipped(listing.skipped) + failures
    if redact:
        skipped = tuple(SkippedFile(_redacted_name(item.name), item.reason) for item in skipped)
    return RankFolder(listing.directory, dumps, skipped)


def info_row(path: str, *, max_bytes: int | None = None) -> RankContents:
    """What one file holds, with the rank it was written by (what each worker runs for info)."""
    from oomdoctor.analysis.contents import describe

    name = os.path.basename(path)
    contents = describe(load_snapshot(path, max_bytes=max_bytes), name)
    recorded = contents.metadata.get("rank") if contents.metadata is not None else None
    return RankContents(contents, recorded if type(recorded) is int else rank_from_name(name))


def read_folder_info(
    directory: str | os.PathLike[str], *, max_bytes: int | None = None, parallel: bool = True
) -> tuple[str, tuple[RankContents, ...], tuple[SkippedFile, ...]]:
    """(folder, one `info_row` per readable file, skipped files) for `oomdoctor info DIR`."""
    listing = find_dump_files(directory)
    outcomes = map_files(listing.paths, functools.partial(info_row, max_bytes=max_bytes), parallel=parallel)
    rows = tuple(outcome.value for outcome in outcomes if outcome.error is None)
    failures = _skipped(outcomes)
    if not rows:
        raise LoadError(_nothing_read(listing.directory, failures + _skipped(listing.skipped)))
    return listing.directory, rows, _skipped(listing.skipped) + failures


def report_folder(directory: str, output_format: str, *, redact: bool = False, max_bytes: int | None = None) -> bytes:
    """`oomdoctor report DIR` in "text", "md" or "json"."""
    from oomdoctor.analysis.ranks import compare_ranks
    from oomdoctor.views.ranks import render

    folder = read_folder(directory, max_bytes=max_bytes, redact=redact)
    shown = os.path.basename(os.path.normpath(folder.directory)) if redact else folder.directory
    return render(output_format, shown, compare_ranks(folder.dumps), folder.dumps, folder.skipped)


def info_folder(directory: str, output_format: str, *, max_bytes: int | None = None) -> str:
    """`oomdoctor info DIR` in "text" or "json"."""
    from oomdoctor.views.ranks import info_json, info_text

    shown, rows, skipped = read_folder_info(directory, max_bytes=max_bytes)
    return info_json(shown, rows, skipped) + "\n" if output_format == "json" else info_text(shown, rows, skipped)


def _skipped(outcomes: tuple[FileOutcome, ...]) -> tuple[SkippedFile, ...]:
    """The files not read (a listing's skipped entries, or files whose `work` failed), by name."""
    return tuple(SkippedFile(os.path.basename(o.path), o.error) for o in outcomes if o.error is not None)


def _redacted_name(name: str) -> str:
    """A file name without the host and pids in oomdoctor's dump names and capture's temporary files."""
    from oomdoctor.redact import PID, Redactor

    return re.sub(r"\.\d+\.tmp$", f".{PID}.tmp", Redactor().dump_name(name))


def _nothing_read(directory: str, skipped: tuple[SkippedFile, ...]) -> str:
    if not skipped:
        return f"{directory}: no snapshot files in this folder"
    first = skipped[0]
    more = f" (and {len(skipped) - 1} more)" if len(skipped) > 1 else ""
    return f"{directory}: no readable snapshot in this folder; {first.name}: {first.reason}{more}"
