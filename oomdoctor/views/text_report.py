"""The analysis as plain text: the verdict first, then the numbers that prove it and what to change."""

from __future__ import annotations

from oomdoctor.analysis.results import Analysis, StepSummary
from oomdoctor.safetext import printable_lines
from oomdoctor.units import human_size as human
from oomdoctor.units import plural
from oomdoctor.views import phrasing
from oomdoctor.views.report_rows import (
    COMPONENT_LABELS,
    DEVICE_COLUMNS,
    ESTIMATE_NOTE,
    allocated_rows,
    changes_title,
    component_rows,
    device_rows,
    evidence_line,
    largest_groups,
    layout_estimated,
    main_risk,
    risk_line,
    step_end_note,
    steps_shown,
    target_context,
    verdict_words,
    where_label,
)

# "would fit if contiguous": no answer is unknown, never "no" (as the app says it)
_CONTIGUOUS_WORDS = {True: "yes", False: "no", None: "unknown"}


def render(analysis: Analysis, *, source: str | None = None) -> str:
    lines: list[str] = []
    add = lines.append
    add(f"Verdict: {verdict_words(analysis)}  (confidence {analysis.confidence:.0%})")
    add(phrasing.summary(analysis.summary))
    risk, others, others_title = main_risk(analysis)
    if risk is not None:
        add(risk_line(risk))
    if source:
        add(f"File: {source}")
    replay = analysis.replay
    where = where_label(analysis)
    add(target_context(analysis))
    add("")

    add("Evidence")
    for item in analysis.evidence:
        add(f"  - {evidence_line(item)}")
    add("")

    if analysis.recommendations:
        add(changes_title(analysis))
        for position, rec in enumerate(analysis.recommendations, 1):
            fits = {True: "would fit on its own", False: "not enough on its own", None: ""}[rec.would_fit_alone]
            add(f"  {position}. {phrasing.recommendation(rec)}")
            add(f"     {phrasing.saving(rec, where)}{'; ' + fits if fits else ''}")
            regions = phrasing.regions_line(rec)
            if regions:
                add(f"     {regions}")
        add("")

    acc = analysis.accounting
    add("Memory " + where)
    if acc.device_total_bytes is not None:
        add(f"  device total          {human(acc.device_total_bytes):>12}")
    if acc.non_pytorch_bytes is not None:
        add(f"  outside PyTorch       {human(acc.non_pytorch_bytes):>12}")
    if acc.device_free_bytes is not None:
        add(f"  free on the device    {human(acc.device_free_bytes):>12}")
    add(f"  reserved by PyTorch   {human(acc.reserved_bytes):>12}")
    rows = allocated_rows(analysis)
    for position, (label, value, note) in enumerate(rows, 1):
        if position == len(rows):
            note += f"{'; ' if note else ''}of which rounding {human(acc.rounding_bytes)}"
        add(f"    {label:<20}{human(value):>12}  ({note})")
    estimated = f"{ESTIMATE_NOTE}: " if layout_estimated(analysis) else ""
    add(
        f"    cached, free        {human(acc.free_cached_bytes):>12}  ({estimated}releasable {human(acc.releasable_bytes)}, fragments {human(acc.non_releasable_bytes)})"
    )
    if acc.pending_free_bytes:
        add(f"    pending free        {human(acc.pending_free_bytes):>12}")
    if acc.request_bytes is not None:
        add(
            f'  failed request        {human(acc.request_bytes):>12}  (the OOM message would say "Tried to allocate {human(acc.message_bytes)}")'
        )
    add("")

    add("Live memory by component")
    for share, fraction in component_rows(analysis):
        percent = f"{fraction:6.1%}" if fraction is not None else "     -"
        add(
            f"  {COMPONENT_LABELS.get(share.name, share.name):<16} {human(share.bytes):>12} {percent}  ({plural(share.block_count, 'block')}, {share.method}, confidence {share.confidence:.0%})"
        )
        for group in largest_groups(share):
            add(f"      {human(group.bytes):>12}  {group.key}")
    add("")

    frag = analysis.fragmentation
    add("Fragmentation")
    if frag.request_pool is not None:
        estimate = f" ({ESTIMATE_NOTE})" if layout_estimated(analysis) else ""
        add(
            f"  free in the {frag.request_pool} pool on this stream: {human(frag.usable_free_bytes)}, largest block {human(frag.largest_usable_free_block_bytes)}{estimate}"
        )
        add(
            f"  would fit if contiguous: {_CONTIGUOUS_WORDS[frag.would_fit_if_contiguous]}{estimate}; expandable segments: {phrasing.expandable_words(frag.expandable_segments)}"
        )
    else:  # no failed request: the setting still tells what the cache can do with its free memory
        add(f"  expandable segments: {phrasing.expandable_words(frag.expandable_segments)}")
    if frag.alloc_conf:
        add(f"  PYTORCH_CUDA_ALLOC_CONF: {frag.alloc_conf}")
    add("")

    wi = analysis.what_if
    note = phrasing.what_if_note(wi)
    add("What if the batch (or sequence) were scaled")
    if wi.largest_fitting_scale is not None:
        add(f"  largest scale that fits: {phrasing.largest_scale(wi)}  ({note})")
    else:
        add(f"  {note}")
    add("")

    if len(replay.ooms) > 1:
        add(f"OOM events on this device: {len(replay.ooms)}")
        for oom in replay.ooms:
            add(
                f"  event {oom.event_index}: {human(oom.request_bytes)}{'  (fatal: the one judged here)' if oom.fatal else '  (recovered or caught)'}"
            )
        add("")

    if analysis.steps:
        step_rows, shown = steps_shown(analysis)
        add(f"Steps (allocated bytes{'; ' + shown if shown else ''})")
        for step in step_rows:
            # after the OOM's unwinding, or at the OOM that cut the step short: not a step's end
            end = {"after the OOM": "after OOM ", "at the OOM": "at the OOM"}.get(
                step_end_note(analysis, step), "at its end"
            )
            at_end = f"{'at least ' if step.end_at_least else ''}{human(step.end_allocated_bytes)}"
            add(
                f"  step {step.step:<4} peak {human(step.peak_allocated_bytes):>12}   {end} {at_end:>12}   activations peak {_activation_peak(step):>12}"
            )
        add("")

    if others:
        add(others_title)
        for finding in others:
            add(f"  - {finding.verdict}: {phrasing.summary(finding.summary)}")
        add("")
    if analysis.device_summaries:
        _devices(analysis, add)
    if analysis.unknowns:
        add("Not determined from this file")
        for unknown in phrasing.unknowns(analysis.unknowns):
            add(f"  - {unknown}")
    # file names, frames, tensor names and settings come from the file: no line may carry a control
    # character to the terminal, or run on without bound
    return printable_lines(lines).rstrip() + "\n"


def _activation_peak(step: StepSummary) -> str:
    """A step's activations peak, or 'unknown' where the trace names no forward pass."""
    return "unknown" if step.peak_activation_bytes is None else human(step.peak_activation_bytes)


def _devices(analysis: Analysis, add) -> None:
    """The devices compared, one row each, when the snapshot holds several."""
    add("Devices")
    add(f"  {phrasing.devices_intro(analysis.device_summaries)}")
    rows = [DEVICE_COLUMNS, *device_rows(analysis)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(DEVICE_COLUMNS) - 1)]
    for row in rows:
        cells = [
            cell.rjust(width) if 0 < i < 6 else cell.ljust(width) for i, (cell, width) in enumerate(zip(row, widths))
        ]
        add("  " + "  ".join(cells) + "  " + row[-1])
    for note in phrasing.device_notes(analysis.device_summaries):
        add(f"  - {note}")
    add("")
