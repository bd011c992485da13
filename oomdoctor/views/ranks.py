"""A folder of per-rank dumps as text, Markdown or JSON: the headline, one row per rank, live memory
by component for each rank and the median, how the ranks differ, then the full report of the rank
that ran out first (or of the largest, when none did). Every word said about a comparison
(oomdoctor.analysis.ranks) is made here: the headline, the notes, "step 3, backward".

JSON keys: `schema_version`, `kind` ("ranks"), `directory`, `headline`, `file_count`,
`world_size`, `ran_out_count`, `order_known`, `first` (the first rank's row, or null), `ranks`
(rows: `file`, `rank`, `rank_source`, `host`, `ran_out`, `oom_time_us`, `seconds_after_first`,
`verdict`, `confidence`, `target_kind`, `step`, `phase`, `allocated_bytes`, `reserved_bytes`,
`request_bytes`, `components`), `median` (`allocated_bytes`, `components`), `differences`,
`first_standout` (what stands out most in the first rank, like with like: `what`, `bytes`,
`median_bytes`, `difference_bytes`, `moment` ("compared": every rank at the same step and phase;
"step": each rank's peak in `step`; "trace peak": each rank's peak over its trace; "different": at
moments that differ), or null), `largest_standout` (the same for the file that differs most from
the median, when a rank ran out and that file is another; else null), `verdicts`, `verdicts_agree`, `missing_ranks`, `repeated_ranks`, `notes`, `skipped`
(`file`, `reason`), and `report`: the featured rank's full report as `oomdoctor report FILE
--format json` writes it, with its `file`. Read with --recursive, also `folders`: every folder of
the tree holding snapshot files (`name`, `file_count`, `read`, `readable_count`, `ran_out_count`,
`step`, `chosen`), and the notes say which folder's ranks are compared.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from oomdoctor.analysis.ranks import (
    ALLOCATED,
    MOMENT_DIFFERENT,
    MOMENT_STEP,
    MOMENT_TRACE_PEAK,
    FolderSummary,
    RankComparison,
    RankContents,
    RankDifference,
    RankDump,
    RankRow,
    SkippedFile,
    standout,
)
from oomdoctor.safetext import printable_lines
from oomdoctor.units import human_size as human
from oomdoctor.units import plural

RANKS_SCHEMA_VERSION = 1
DIFFERENCE_LIMIT = 12
FOLDER_LIMIT = 12  # other folders of a recursive read named in the notes


def where(row: RankRow) -> str:
    """ "step 3, backward" (or just the phase when the step is unknown)."""
    phase = row.phase.replace("_", " ")
    return f"step {row.step}, {phase}" if row.step is not None else phase


def component_label(name: str) -> str:
    return "memory" if name == ALLOCATED else name.replace("_", " ")


def label(item: RankRow | RankDifference, repeated: tuple[int, ...] = ()) -> str:
    """ "rank 5", or the file's name when its rank is unknown; "rank 5 (FILE)" when rank 5 is one of
    the `repeated` ranks, those that left more than one file."""
    if item.rank is None:
        return item.file
    return f"rank {item.rank} ({item.file})" if item.rank in repeated else f"rank {item.rank}"


def headline(comparison: RankComparison) -> str:
    """ "rank 5 ran out first (step 3, backward), 1.2 GiB more activations than the median rank; ..." """
    rows = comparison.rows
    first = comparison.first
    if first is None:
        if len(rows) == 1:
            return f"{label(rows[0], comparison.repeated_ranks)} did not run out of memory; it is the only file"
        text = f"no rank ran out of memory in these {plural(len(rows), 'file')} (compared at their peaks{_untraced_words(comparison)})"
        largest = comparison.differences[0] if comparison.differences else None
        if largest is not None:
            text += f"; {label(largest, comparison.repeated_ranks)} holds {_difference_words(standout(comparison, largest.index) or largest)}"
        return text
    if len(rows) == 1:
        return f"{label(first, comparison.repeated_ranks)} ran out ({where(first)}); it is the only file"
    if len(comparison.launches) > 1 and first.oom_time_us is not None:
        # files of different launches or restarts: their ranks did not run side by side
        count = len(comparison.launches)
        text = (
            f"{label(first, comparison.repeated_ranks)} ran out earliest ({where(first)}) "
            f"of files from {count} launches or restarts of the job"
        )
    elif comparison.order_known or first.oom_time_us is not None:
        text = f"{label(first, comparison.repeated_ranks)} ran out first ({where(first)})"
    else:
        text = f"{label(first, comparison.repeated_ranks)} ran out ({where(first)}; which rank was first is unknown: no OOM time recorded)"
    own = comparison.first_standout
    if own is not None:
        text += f", {_difference_words(own)}"
    others = [row for row in rows if row.ran_out and row is not first]
    same = sum(row.verdict == first.verdict for row in others)
    later = "later" if comparison.order_known else "too"
    # a rank that left several files (a restart, an earlier run) is not several ranks: count files
    unit = _unit(comparison)
    parts = []
    if others:
        if same == len(others):
            parts.append(f"{_count(len(others), f'other {unit}')} ran out {later} with the same verdict")
        else:
            verdicts = Counter(row.verdict for row in others if row.verdict != first.verdict)
            shown = ", ".join(
                f"{count} {verdict}" for verdict, count in sorted(verdicts.items(), key=lambda i: (-i[1], i[0]))
            )
            if same:
                shown = f"{same} with the same verdict, {shown}"
            else:
                shown = f"{'a different verdict' if len(others) == 1 else 'other verdicts'}: {shown}"
            parts.append(f"{_count(len(others), f'other {unit}')} ran out {later} ({shown})")
    calm = len(rows) - 1 - len(others)
    if calm:
        parts.append(
            f"{_count(calm, unit)} did not run out" if others else f"the other {_count(calm, unit)} did not run out"
        )
    text += "; " + ", ".join(parts) if parts else ""
    largest = comparison.largest_standout
    if largest is not None:
        text += f"; {label(largest, comparison.repeated_ranks)} holds {_difference_words(largest)}"
    return text


def _unit(comparison: RankComparison) -> str:
    """What the rows are counted as: ranks, or files when a rank left more than one, or ranks are unknown."""
    if comparison.repeated_ranks or any(row.rank is None for row in comparison.rows):
        return "file"
    return "rank"


def _difference_words(difference: RankDifference) -> str:
    more = "more" if difference.difference_bytes > 0 else "less"
    text = f"{human(abs(difference.difference_bytes), decimals=1)} {more} {component_label(difference.what)} than the median rank"
    if difference.moment == MOMENT_STEP:
        return f"{text} at their peaks in step {difference.step}"
    if difference.moment == MOMENT_TRACE_PEAK:
        return f"{text} at their peaks over their traces (the ranks stopped at different moments)"
    if difference.moment == MOMENT_DIFFERENT:
        return f"{text} (compared at moments that differ)"
    return text


def _count(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def notes(comparison: RankComparison) -> tuple[str, ...]:
    """What the comparison cannot tell, one sentence each."""
    rows = comparison.rows
    found = []
    if comparison.ran_out_count and comparison.untimed_count == comparison.ran_out_count:
        found.append("no OOM time is recorded, so which rank ran out first is unknown")
    elif comparison.untimed_count:
        one = comparison.untimed_count == 1
        verbs = "has no OOM time and is" if one else "have no OOM time and are"
        found.append(f"{plural(comparison.untimed_count, 'rank')} that ran out {verbs} not ordered")
    if comparison.clock_hosts > 1:
        found.append(
            f"the ranks ran on {comparison.clock_hosts} hosts; their order rests on those hosts' clocks agreeing"
        )
    if len(comparison.launches) > 1:
        shown = ", ".join(_launch_words(run_id, restarts) for run_id, restarts in comparison.launches)
        found.append(
            f"the files come from {len(comparison.launches)} launches or restarts of the job ({shown}): "
            "ranks of different ones did not run side by side, so which ran out first compares separate runs"
        )
    if len(comparison.world_sizes) > 1:
        found.append(f"the dumps record different world sizes ({', '.join(map(str, comparison.world_sizes))})")
    missing = comparison.missing_ranks
    if missing:
        shown = ", ".join(map(str, missing[:16])) + (", ..." if len(missing) > 16 else "")
        found.append(f"{plural(len(missing), 'rank')} left no dump here: {shown}")
    if comparison.repeated_ranks:
        found.append(
            f"{'rank' if len(comparison.repeated_ranks) == 1 else 'ranks'} {', '.join(map(str, comparison.repeated_ranks))}"
            " left more than one dump; each file is a row"
        )
    if any(row.rank is None for row in rows):
        found.append("some files say neither in their metadata nor in their name which rank wrote them")
    if comparison.ran_out_count and comparison.ran_out_count < len(rows):
        found.append(
            "ranks that did not run out are compared at their peak, the others at the OOM" + _untraced_words(comparison)
        )
    return tuple(found)


def _launch_words(run_id: str | None, restarts: int | None) -> str:
    run = f"run {run_id}" if run_id is not None else "run unknown"
    return f"{run}, restart {restarts}" if restarts is not None else run


def _folder_name(name: str) -> str:
    return f"{name}/" if name else "the folder itself"


def folder_notes(folders: tuple[FolderSummary, ...]) -> tuple[str, ...]:
    """What a recursive read compared and what else it found, one sentence each."""
    chosen = next((item for item in folders if item.chosen), None)
    if chosen is None:
        return ()
    count = plural(len(folders), "folder")
    if chosen.ran_out_count:
        why = "the folder holding the OOM dumps"
    else:
        why = "no folder read holds an OOM: the first one read"
    found = [
        f"read with --recursive: these are the ranks of {_folder_name(chosen.name)} ({why}), one of {count} "
        "holding snapshot files (read in this order: folders named for an OOM first, then the latest step, "
        "then the newest files)"
    ]
    others = [item for item in folders if not item.chosen]
    for item in others[:FOLDER_LIMIT]:
        step = f" (step {item.step})" if item.step is not None else ""
        if not item.read:
            state = "not read"
        elif item.ran_out_count:
            state = f"read, {item.ran_out_count} ran out"
        else:
            state = f"read, {item.readable_count} readable, none ran out"
        found.append(f"also found {_folder_name(item.name)}{step}: {plural(item.file_count, 'snapshot file')}, {state}")
    if len(others) > FOLDER_LIMIT:
        found.append(f"... and {len(others) - FOLDER_LIMIT} more folders (see --format json)")
    return tuple(found)


def skipped_note(item: SkippedFile) -> str:
    return f"skipped {item.name}: {item.reason}"


def featured(comparison: RankComparison, dumps: tuple[RankDump, ...]) -> RankDump:
    """The dump whose full report follows the table: the first to run out, else the largest."""
    row = comparison.first or max(comparison.rows, key=lambda r: (r.allocated_bytes, -(r.rank or 0)))
    return dumps[row.index]


def _rank(row: RankRow) -> str:
    return "?" if row.rank is None else str(row.rank)


def _first_words(comparison: RankComparison) -> str | None:
    """What the featured rank that ran out is called: first, earliest (of files of several launches),
    or, without its OOM time, neither. None when no rank ran out."""
    first = comparison.first
    if first is None:
        return None
    if first.oom_time_us is None:
        return "ran out; which rank was first is unknown"
    return "ran out earliest" if len(comparison.launches) > 1 else "ran out first"


def _when(row: RankRow, comparison: RankComparison) -> str:
    if not row.ran_out:
        return "no OOM"
    if comparison.first is row and row.oom_time_us is not None:
        return "earliest" if len(comparison.launches) > 1 else "first"
    if row.seconds_after_first is None:
        return "time unknown"
    return f"+{row.seconds_after_first:.3f} s"


def _main_component(row: RankRow) -> str:
    name, size = max(row.components, key=lambda item: item[1])
    return f"{component_label(name)} {human(size, decimals=1)}" if size else "-"


def _difference_lines(comparison: RankComparison) -> list[str]:
    lines = []
    for item in comparison.differences[:DIFFERENCE_LIMIT]:
        more = "more" if item.difference_bytes > 0 else "less"
        what = "allocated memory" if item.what == ALLOCATED else component_label(item.what)
        lines.append(
            f"{label(item, comparison.repeated_ranks)}: {human(abs(item.difference_bytes), decimals=1)} {more} {what} than the median "
            f"({human(item.bytes, decimals=1)} against {human(item.median_bytes, decimals=1)})"
        )
    if len(comparison.differences) > DIFFERENCE_LIMIT:
        lines.append(
            f"... and {len(comparison.differences) - DIFFERENCE_LIMIT} smaller differences (see --format json)"
        )
    if not comparison.differences and len(comparison.rows) > 1:
        lines.append("no rank's memory or components stand out from the median")
    like = comparison.first_standout
    if like is not None and like.moment in (MOMENT_STEP, MOMENT_TRACE_PEAK):
        # the headline's figure, at a moment alike on every rank: beside the rows' own, which differ
        when = (
            f"each rank at its peak in step {like.step}"
            if like.moment == MOMENT_STEP
            else "each rank at its peak over its trace"
        )
        what = "allocated memory" if like.what == ALLOCATED else component_label(like.what)
        lines.append(
            f"{label(like, comparison.repeated_ranks)}, {when}: {human(like.difference_bytes, decimals=1)} more {what} "
            f"than the median ({human(like.bytes, decimals=1)} against {human(like.median_bytes, decimals=1)})"
        )
    return lines


def _moment_line(comparison: RankComparison) -> str | None:
    """Where the ranks that ran out did so, when that was not one step and phase for all."""
    moments: dict[str, int] = {}
    for row in comparison.rows:
        if row.ran_out:
            moments[where(row)] = moments.get(where(row), 0) + 1
    if len(moments) < 2:
        return None
    shown = "; ".join(f"{moment} on {count}" for moment, count in sorted(moments.items(), key=lambda item: -item[1]))
    return f"they ran out at different moments: {shown}"


def _moment_words(comparison: RankComparison) -> str:
    if comparison.ran_out_count == len(comparison.rows):
        return "(at each rank's OOM)"
    if comparison.ran_out_count == 0:
        return f"(at each rank's peak{_untraced_words(comparison)})"
    return f"(at the OOM, or the peak for ranks that did not run out{_untraced_words(comparison)})"


def _untraced_words(comparison: RankComparison) -> str:
    """Files that did not run out and hold no allocation in a trace are compared at their dump: their
    peak is unknown. "" when there are none."""
    untraced = sum(1 for row in comparison.rows if not row.ran_out and row.target_kind == "dump")
    if not untraced:
        return ""
    whose = "its" if untraced == 1 else "their"
    return f"; {plural(untraced, 'file')} without a trace at {whose} dump ({whose} peak is unknown)"


def _verdict_line(comparison: RankComparison) -> str:
    unit = _unit(comparison)
    among = f"{unit}s that ran out" if comparison.ran_out_count else f"{unit}s"
    if comparison.verdicts_agree:
        verdict, count = comparison.verdicts[0]
        return f"verdicts agree: {verdict} on all {count} {among}" if count > 1 else f"verdict: {verdict}"
    shown = ", ".join(f"{verdict} on {count}" for verdict, count in comparison.verdicts)
    return f"verdicts differ among the {among}: {shown}"


def _summary_lines(comparison: RankComparison) -> list[str]:
    moment = _moment_line(comparison)
    return [_verdict_line(comparison)] + ([moment] if moment else []) + _difference_lines(comparison)


def _row_cells(row: RankRow, comparison: RankComparison) -> list[str]:
    return [
        _rank(row),
        _when(row, comparison),
        row.verdict,
        where(row),
        human(row.allocated_bytes, decimals=1),
        human(row.reserved_bytes, decimals=1),
        human(row.request_bytes, decimals=1) if row.request_bytes is not None else "-",
        _main_component(row),
        row.file,
    ]


_HEADER = ["rank", "OOM", "verdict", "where", "allocated", "reserved", "request", "largest component", "file"]


def _component_table(comparison: RankComparison) -> tuple[list[str], list[list[str]]]:
    """Bytes per component by rank (components that are zero on every rank left out), then the median."""
    names = [
        name for name, _ in comparison.median_components if any(dict(row.components)[name] for row in comparison.rows)
    ]
    header = ["rank"] + [component_label(name) for name in names]
    rows = [[_rank(row)] + [human(dict(row.components)[name], decimals=1) for name in names] for row in comparison.rows]
    median = dict(comparison.median_components)
    rows.append(["median"] + [human(median[name], decimals=1) for name in names])
    return header, rows


def _text_table(header: list[str], rows: list[list[str]], right: set[int]) -> list[str]:
    cells = [header] + rows
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return [
        "  " + "  ".join(c.rjust(widths[i]) if i in right else c.ljust(widths[i]) for i, c in enumerate(row)).rstrip()
        for row in cells
    ]


def _md_table(header: list[str], rows: list[list[str]], right: set[int]) -> list[str]:
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---:" if i in right else "---" for i in range(len(header))) + "|",
    ]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def _folder_line(directory: str, comparison: RankComparison, skipped: tuple[SkippedFile, ...]) -> str:
    world = f" of world size {comparison.world_size}" if comparison.world_size is not None else ""
    ran_out = f"{comparison.ran_out_count} ran out of memory"
    extra = f", {len(skipped)} skipped" if skipped else ""
    return f"{directory}: {plural(len(comparison.rows), 'dump file')}{world}, {ran_out}{extra}"


def render_text(
    directory: str,
    comparison: RankComparison,
    dumps: tuple[RankDump, ...],
    skipped: tuple[SkippedFile, ...],
    folders: tuple[FolderSummary, ...] = (),
) -> str:
    from oomdoctor.views.text_report import render as render_report

    lines = [headline(comparison), _folder_line(directory, comparison, skipped), "", "Ranks"]
    lines += _text_table(_HEADER, [_row_cells(row, comparison) for row in comparison.rows], {4, 5, 6})
    header, rows = _component_table(comparison)
    lines += ["", "Live memory by component " + _moment_words(comparison)]
    lines += _text_table(header, rows, set(range(1, len(header))))
    lines.append("")
    lines.append("How the ranks differ")
    lines.extend(f"  - {line}" for line in _summary_lines(comparison))
    lines.append("")
    shown_notes = list(folder_notes(folders)) + list(notes(comparison)) + [skipped_note(item) for item in skipped]
    if shown_notes:
        lines.append("Notes")
        lines.extend(f"  - {note}" for note in shown_notes)
        lines.append("")
    dump = featured(comparison, dumps)
    title = _first_words(comparison) or "the largest"
    banner = f"{_label(dump)} ({title}): {dump.file}"
    lines.append(banner)
    lines.append("=" * len(banner))
    # file names in a stranger's folder are data: no control character reaches the terminal
    return printable_lines(lines) + "\n" + render_report(dump.analysis, source=dump.file)


def _label(dump: RankDump) -> str:
    return f"Rank {dump.rank}" if dump.rank is not None else "File"


def _md_cell(text: str) -> str:
    from oomdoctor.views.markdown_report import inline_text

    return inline_text(text, cell=True)


def _md_text(text: str) -> str:
    from oomdoctor.views.markdown_report import inline_text

    return inline_text(text)


# GitHub refuses an issue or comment body over 65,536 characters: past this budget the Markdown
# tables keep the ranks that matter (the edges, the first to run out, those that stand out or have
# another verdict) and say how many they leave out
MD_BUDGET_CHARS = 60_000
MD_SUMMARY_EDGE_ROWS = 4  # the lowest and the highest ranks kept
MD_SUMMARY_STANDOUT_ROWS = 24  # ranks that differ most from the median
MD_SUMMARY_OTHER_VERDICT_ROWS = 8  # ranks whose verdict is not the most common one


def _md_summary_rows(comparison: RankComparison) -> list[RankRow]:
    rows = comparison.rows
    keep = set(range(min(MD_SUMMARY_EDGE_ROWS, len(rows)))) | set(
        range(max(0, len(rows) - MD_SUMMARY_EDGE_ROWS), len(rows))
    )
    if comparison.first_index is not None:
        keep.add(comparison.first_index)
    position = {row.index: at for at, row in enumerate(rows)}
    for difference in comparison.differences:
        if len(keep) >= 2 * MD_SUMMARY_EDGE_ROWS + 1 + MD_SUMMARY_STANDOUT_ROWS:
            break
        keep.add(position[difference.index])
    common = comparison.verdicts[0][0] if comparison.verdicts else None
    others = [
        at for at, row in enumerate(rows) if row.verdict != common and (row.ran_out or not comparison.ran_out_count)
    ]
    keep.update(others[:MD_SUMMARY_OTHER_VERDICT_ROWS])
    return [rows[at] for at in sorted(keep)]


def render_markdown(
    directory: str,
    comparison: RankComparison,
    dumps: tuple[RankDump, ...],
    skipped: tuple[SkippedFile, ...],
    folders: tuple[FolderSummary, ...] = (),
) -> str:
    full = _render_markdown(directory, comparison, dumps, skipped, folders, summarise=False)
    if len(full) <= MD_BUDGET_CHARS:
        return full
    return _render_markdown(directory, comparison, dumps, skipped, folders, summarise=True)


def _render_markdown(
    directory: str,
    comparison: RankComparison,
    dumps: tuple[RankDump, ...],
    skipped: tuple[SkippedFile, ...],
    folders: tuple[FolderSummary, ...],
    *,
    summarise: bool,
) -> str:
    from oomdoctor.views.markdown_report import code_span
    from oomdoctor.views.markdown_report import render as render_report

    lines = [f"## oomdoctor: {plural(len(comparison.rows), 'rank')}", ""]
    lines += [
        f"> {_md_text(headline(comparison))}",
        "",
        _md_text(_folder_line(directory, comparison, skipped)) + ".",
        "",
    ]
    shown = _md_summary_rows(comparison) if summarise else list(comparison.rows)
    left_out = (
        [
            "",
            f"_{len(comparison.rows) - len(shown)} of {len(comparison.rows)} ranks left out to fit an issue comment "
            "(shown: the lowest and highest ranks, the first to run out, those that stand out from the median or "
            "have another verdict); `--format json` lists every rank._",
        ]
        if summarise
        else []
    )
    table = []
    for row in shown:
        cells = [_md_cell(cell) for cell in _row_cells(row, comparison)]
        cells[2] = code_span(row.verdict, cell=True)
        cells[-1] = code_span(row.file, cell=True)
        table.append(cells)
    lines += ["### Ranks", ""] + _md_table(_HEADER, table, {4, 5, 6}) + left_out
    header, rows = _component_table(comparison)
    if summarise:
        kept = {row.index for row in shown}
        rows = [cells for row, cells in zip(comparison.rows, rows) if row.index in kept] + rows[-1:]
    lines += ["", f"### Live memory by component {_moment_words(comparison)}", ""]
    lines += _md_table(header, rows, set(range(1, len(header))))
    lines += ["", "### How the ranks differ", ""]
    lines += [f"- {_md_text(line)}" for line in _summary_lines(comparison)]
    shown_notes = list(folder_notes(folders)) + list(notes(comparison)) + [skipped_note(item) for item in skipped]
    if shown_notes:
        lines += ["", "### Notes", ""] + [f"- {_md_text(note)}" for note in shown_notes]
    dump = featured(comparison, dumps)
    lines += ["", f"### {_label(dump)}: the full report", ""]
    report = render_report(dump.analysis, source=dump.file, environment=dump.environment)
    return "\n".join(lines) + "\n\n" + report


def _difference_fields(d: RankDifference) -> dict[str, Any]:
    return {
        "file": d.file,
        "rank": d.rank,
        "what": d.what,
        "bytes": d.bytes,
        "median_bytes": d.median_bytes,
        "difference_bytes": d.difference_bytes,
    }


def _plain_difference(d: RankDifference | None) -> dict[str, Any] | None:
    """A standout: a difference and the moment it compares."""
    if d is None:
        return None
    return {**_difference_fields(d), "moment": d.moment, "step": d.step}


def _plain_row(row: RankRow) -> dict[str, Any]:
    return {
        "file": row.file,
        "rank": row.rank,
        "rank_source": row.rank_source,
        "host": row.host,
        "world_size": row.world_size,
        "ran_out": row.ran_out,
        "oom_time_us": row.oom_time_us,
        "seconds_after_first": row.seconds_after_first,
        "verdict": row.verdict,
        "confidence": row.confidence,
        "target_kind": row.target_kind,
        "step": row.step,
        "phase": row.phase,
        "allocated_bytes": row.allocated_bytes,
        "reserved_bytes": row.reserved_bytes,
        "request_bytes": row.request_bytes,
        "components": dict(row.components),
    }


def to_dict(
    directory: str,
    comparison: RankComparison,
    dumps: tuple[RankDump, ...],
    skipped: tuple[SkippedFile, ...],
    folders: tuple[FolderSummary, ...] = (),
) -> dict[str, Any]:
    from oomdoctor.views.json_report import to_dict as report_dict

    dump = featured(comparison, dumps)
    report = report_dict(dump.analysis, dump.environment)
    report["file"] = dump.file
    document: dict[str, Any] = {
        "schema_version": RANKS_SCHEMA_VERSION,
        "kind": "ranks",
        "directory": directory,
        "headline": headline(comparison),
        "file_count": len(comparison.rows),
        "world_size": comparison.world_size,
        "ran_out_count": comparison.ran_out_count,
        "order_known": comparison.order_known,
        "first": _plain_row(comparison.first) if comparison.first is not None else None,
        "ranks": [_plain_row(row) for row in comparison.rows],
        "median": {
            "allocated_bytes": comparison.median_allocated_bytes,
            "components": dict(comparison.median_components),
        },
        "differences": [_difference_fields(d) for d in comparison.differences],
        "first_standout": _plain_difference(comparison.first_standout),
        "largest_standout": _plain_difference(comparison.largest_standout),
        "verdicts": dict(comparison.verdicts),
        "verdicts_agree": comparison.verdicts_agree,
        "missing_ranks": list(comparison.missing_ranks),
        "repeated_ranks": list(comparison.repeated_ranks),
        "notes": list(folder_notes(folders)) + list(notes(comparison)),
        "skipped": [{"file": item.name, "reason": item.reason} for item in skipped],
        "report": report,
    }
    if folders:
        document["folders"] = [
            {
                "name": item.name,
                "file_count": item.file_count,
                "read": item.read,
                "readable_count": item.readable_count,
                "ran_out_count": item.ran_out_count,
                "step": item.step,
                "chosen": item.chosen,
            }
            for item in folders
        ]
    return document


def render_json(
    directory: str,
    comparison: RankComparison,
    dumps: tuple[RankDump, ...],
    skipped: tuple[SkippedFile, ...],
    folders: tuple[FolderSummary, ...] = (),
) -> bytes:
    from oomdoctor.views.json_report import dumps as dumps_json

    return dumps_json(to_dict(directory, comparison, dumps, skipped, folders))


def render(
    output_format: str,
    directory: str,
    comparison: RankComparison,
    dumps: tuple[RankDump, ...],
    skipped: tuple[SkippedFile, ...],
    *,
    folders: tuple[FolderSummary, ...] = (),
) -> bytes:
    """The folder report in "text", "md" or "json", as `oomdoctor report DIR` prints it (`folders`:
    what a recursive read found, `RankFolder.folders`)."""
    if output_format == "json":
        return render_json(directory, comparison, dumps, skipped, folders)
    if output_format == "md":
        return render_markdown(directory, comparison, dumps, skipped, folders).encode()
    return render_text(directory, comparison, dumps, skipped, folders).encode()


def info_line(row: RankContents) -> str:
    """One line of `oomdoctor info DIR` for a readable file."""
    contents, rank = row.contents, row.rank
    ooms = contents.ooms
    oom = f"{plural(len(ooms), 'OOM')} (request {human(ooms[-1].request_bytes, decimals=1)})" if ooms else "no OOM"
    events = sum(contents.trace_events)
    torch = contents.torch_version or contents.torch_version_hint or "unknown"
    devices = ",".join(map(str, contents.device_list)) or "none"
    return (
        f"{contents.file}  rank {'?' if rank is None else rank}  {contents.container} {contents.format}  "
        f"torch {torch}  devices {devices}  reserved {human(contents.totals.reserved_bytes, decimals=1)}  "
        f"allocated {human(contents.totals.allocated_bytes, decimals=1)}  {plural(events, 'event')}  {oom}"
    )


def info_text(directory: str, rows: tuple[RankContents, ...], skipped: tuple[SkippedFile, ...]) -> str:
    lines = [info_line(row) for row in rows]
    lines += [f"{item.name}  skipped: {item.reason}" for item in skipped]
    return printable_lines(lines) + "\n"


def info_json(directory: str, rows: tuple[RankContents, ...], skipped: tuple[SkippedFile, ...]) -> str:
    """Every readable file's full info (as `oomdoctor info FILE --format json`, with its rank)."""
    from oomdoctor.views.info import json_text
    from oomdoctor.views.info import to_dict as info_dict

    document = {
        "schema_version": RANKS_SCHEMA_VERSION,
        "kind": "folder-info",
        "directory": directory,
        "files": [{**info_dict(row.contents), "rank": row.rank} for row in rows],
        "skipped": [{"file": item.name, "reason": item.reason} for item in skipped],
    }
    return json_text(document)
