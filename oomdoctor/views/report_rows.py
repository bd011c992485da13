"""What the text, Markdown and terminal reports say alike, as plain strings and rows they each format."""

from __future__ import annotations

from collections.abc import Callable

from oomdoctor.analysis.attribution import GROUP_LIMIT
from oomdoctor.analysis.recommendations import BATCH_SIZED_CHANGES
from oomdoctor.analysis.results import (
    Analysis,
    ComponentShare,
    Evidence,
    Finding,
    Group,
    StepSummary,
    UnknownKind,
)
from oomdoctor.metadata import COMPONENTS
from oomdoctor.units import human_size
from oomdoctor.views import phrasing
from oomdoctor.vocabulary import Verdict

COMPONENT_LABELS = {name: name.replace("_", " ") for name in COMPONENTS}
GROUPS_PER_COMPONENT = 3
_WHERE = {"oom": "at the OOM", "peak": "at the peak", "dump": "when the dump was written"}


def where_label(analysis: Analysis) -> str:
    """'at the OOM', 'at the peak' or 'when the dump was written': the moment the numbers describe."""
    return _WHERE[analysis.replay.target_kind]


def target_step_words(analysis: Analysis) -> str:
    """'step 3, ' (nothing when the step is unknown); 'step 0 of the trace, ' where optimizer
    state from before the trace shows that steps ran before it, which its numbers do not count, or
    where the trace began after the model's parameters were made (steps may have run before it);
    'step 0 or later, ' where passes counted in a step may be steps of their own."""
    if analysis.target_step is None:
        return ""
    before = any(
        item.kind in (UnknownKind.STEPS_BEFORE_TRACE, UnknownKind.TRACE_AFTER_SETUP) for item in analysis.unknowns
    )
    later = any(item.kind == UnknownKind.PASSES_MAY_BE_STEPS for item in analysis.unknowns)
    return f"step {analysis.target_step}{' of the trace' if before else ''}{' or later' if later else ''}, "


def target_context(analysis: Analysis) -> str:
    """'Device 0 at the OOM (step 3, backward, event 812 of 900; phases from markers)'."""
    replay = analysis.replay
    step = target_step_words(analysis)
    event = f", event {replay.target_index} of {replay.event_count}" if replay.target_index is not None else ""
    phase = analysis.target_phase.replace("_", " ")
    return f"Device {analysis.device} {where_label(analysis)} ({step}{phase}{event}; {phrasing.phase_source(analysis.phase_source)})"


def cut_by_the_oom(analysis: Analysis, step: StepSummary) -> bool:
    """Whether the step holds the judged OOM and events after it (the exception's unwinding frees):
    what it holds at its last event is after the OOM, not the end of a step that ran."""
    replay = analysis.replay
    index = replay.target_index
    return replay.target_kind == "oom" and index is not None and step.first_index <= index < step.last_index


STEPS_SHOWN = 8  # the steps table's rows: the last ones, where the oldest matter least


def steps_shown(analysis: Analysis) -> tuple[list[StepSummary], str]:
    """The steps table's rows, and '' or 'the last 8 of 72' where it leaves earlier steps out."""
    rows = list(analysis.steps[-STEPS_SHOWN:])
    left_out = len(analysis.steps) > len(rows)
    shown = f"the last {len(rows)} of {len(analysis.steps)}" if left_out else ""
    if any(row.end_at_least for row in rows):
        bound = "'at least': no mark shows where the step ended, so its end is read where the next step first allocates"
        shown = f"{shown}; {bound}" if shown else bound
    return rows, shown


def ended_at_the_oom(analysis: Analysis, step: StepSummary) -> bool:
    """Whether the step's last event is the judged OOM: it did not end, and what it holds then is
    what it held when it ran out."""
    replay = analysis.replay
    return replay.target_kind == "oom" and replay.target_index is not None and step.last_index == replay.target_index


def step_end_note(analysis: Analysis, step: StepSummary) -> str:
    """What a step's 'allocated at its end' figure is, where that is not a step's end: '' when it is,
    'after the OOM' (the exception's unwinding) or 'at the OOM' (nothing after it)."""
    if cut_by_the_oom(analysis, step):
        return "after the OOM"
    return "at the OOM" if ended_at_the_oom(analysis, step) else ""


def changes_basis(analysis: Analysis) -> str | None:
    """Where the rest of a pass the OOM interrupted was extrapolated, the batch-sized changes'
    savings are at that pass's projected peak (the what-if gives it), which may be more than the
    device held at the OOM; where the what-if was made from a recorded step's peak (a report of the
    dump), at that peak, which may be more than the dump holds; where the rest of the pass is
    unknown, the savings that grow with it are lower bounds at the OOM: said so (None otherwise)."""
    rest = analysis.what_if.rest_of_pass
    basis = analysis.what_if.basis
    if rest is not None and rest.extrapolated:
        return f"batch-sized changes at the interrupted pass's projected peak, {human_size(rest.projected_pass_bytes)} of its own"
    # (a checkpointing saving 'at least' for the gradients a backward has yet to make says why itself)
    if any(
        r.saved_at_least and not (r.regions is not None and r.regions.gradients_beside_bytes)
        for r in analysis.recommendations
    ):
        return "a saving 'at least' is estimated at the OOM: the rest of the interrupted pass, which nothing shows, only adds to it"
    if basis is not None and any(r.id in BATCH_SIZED_CHANGES for r in analysis.recommendations):
        # the what-if was made from a recorded step's peak, not the moment the report describes
        return f"batch-sized changes at step {basis.step}'s peak, {human_size(basis.peak_allocated_bytes)}"
    return None


def changes_title(analysis: Analysis) -> str:
    """The heading of the recommendations, with their savings' basis when not the OOM instant."""
    basis = changes_basis(analysis)
    return f"What to change (largest saving first{'; ' + basis if basis else ''})"


def cannot_tell(analysis: Analysis) -> bool:
    """Whether the file could not have kept an OOM event (no history, or too short a trace: the
    summary says which)."""
    return analysis.verdict == Verdict.NO_OOM and analysis.summary.facts.get("entries") is not None


def verdict_words(analysis: Analysis) -> str:
    """The verdict as the header shows it: 'no-oom, cannot tell' where `cannot_tell`."""
    return f"{analysis.verdict}, cannot tell" if cannot_tell(analysis) else analysis.verdict


def main_risk(analysis: Analysis) -> tuple[Finding | None, tuple[Finding, ...], str]:
    """Without an OOM, the strongest risk found is said right under the summary (the headline
    stays "no-oom": nothing ran out): (that risk, the other findings, their section's title).
    With an OOM: (None, every secondary finding, "Also found")."""
    if analysis.verdict == Verdict.NO_OOM and analysis.secondary:
        return analysis.secondary[0], analysis.secondary[1:], "Other risks"
    return None, analysis.secondary, "Also found"


def risk_line(finding: Finding) -> str:
    """'Main risk, inference-with-grad (confidence 50%): At the peak, ...'."""
    return f"Main risk, {finding.verdict} (confidence {finding.confidence:.0%}): {phrasing.summary(finding.summary)}"


LAYOUT_LABEL = "as laid out"
LAYOUT_NOTE = "the blocks as the rebuilt segments hold them, unsplit remainders included"
ESTIMATE = "an estimate"  # how a line from a replayed layout says what its figures are
ESTIMATE_NOTE = phrasing.LAYOUT_ESTIMATE  # "an estimate, as laid out"


def layout_estimated(analysis: Analysis) -> bool:
    """Whether the figures read from the rebuilt layout at the judged moment (the as-laid-out
    allocated bytes, cached free, releasable, fragments, the free blocks of the pools) are
    estimates: allocations or frees came after the moment, so the layout was replayed back from the
    dump, and blocks freed since count at their rounded requests, an unsplit remainder in them
    unknown (docs/definitions.md, "The peak"). Reserved bytes and the allocated line are not."""
    return any(u.kind == UnknownKind.REPLAYED_AFTER_TARGET for u in analysis.unknowns)


def allocated_rows(analysis: Analysis) -> list[tuple[str, int, str]]:
    """The allocated lines of "Memory at ...", as (label, bytes, note); the accounting's rounding
    belongs to the last. One line when the accounting's layout holds what docs/definitions.md counts
    there; else that figure (at the peak, the peak every report names) and then the layout's, with
    the unsplit remainders it gives large blocks (and without the blocks it could not place)."""
    allocated = analysis.replay.target_allocated_bytes
    laid_out = analysis.accounting.allocated_bytes
    if allocated == laid_out:
        return [("allocated", allocated, "")]
    note = "the peak" if analysis.replay.target_kind == "peak" else "each live block at its own size"
    layout_note = f"{ESTIMATE}: {LAYOUT_NOTE}" if layout_estimated(analysis) else LAYOUT_NOTE
    return [("allocated", allocated, note), (LAYOUT_LABEL, laid_out, layout_note)]


def evidence_value(item: Evidence) -> str | None:
    """The figure shown after a piece of evidence: its size, else its value (not for flags and the step)."""
    if item.bytes is not None:
        return human_size(item.bytes)
    if item.value is not None and not (item.metric or "").endswith("_seen") and item.metric != "target_step":
        return str(item.value)
    return None


def evidence_places(item: Evidence, code: Callable[[str], str] = str) -> list[str]:
    """Where a piece of evidence was read: its event, block and frame; `code` marks up the
    block's address and the frame (Markdown's code spans)."""
    where = []
    if item.event_index is not None:
        where.append(f"event {item.event_index}")
    if item.address is not None:
        where.append(f"block {code(f'{item.address:#x}')}")
    if item.frame:
        where.append(code(item.frame))
    return where


def evidence_line(item: Evidence) -> str:
    """One piece of evidence as plain text: 'text: figure  [event 3; block 0x7f00; train.py:30]'."""
    value = evidence_value(item)
    where = evidence_places(item)
    return (
        phrasing.evidence(item)
        + (f": {value}" if value is not None else "")
        + (f"  [{'; '.join(where)}]" if where else "")
    )


def component_rows(analysis: Analysis) -> list[tuple[ComponentShare, float | None]]:
    """The components holding live memory, in the analysis's order, each with its share of the
    total (None when nothing is live)."""
    total_bytes = sum(share.bytes for share in analysis.components)
    return [(share, share.bytes / total_bytes if total_bytes else None) for share in analysis.components if share.bytes]


NO_FRAMES_GROUP = "(no Python frames)"


def largest_groups(share: ComponentShare) -> tuple[Group, ...]:
    """The component's largest module paths (else source lines) to name under it: module paths when
    the named blocks hold at least half of its bytes. Under source
    lines, the blocks that have none (no Python frames: from before the trace, or the autograd
    engine's) are a group of their own (`NO_FRAMES_GROUP`) when every line is listed, so a small
    block's line does not stand alone for a component that frame-less blocks fill."""
    # module paths name the registry's blocks only: where those hold less than half of the component
    # (a few named inputs beside many unnamed kept tensors) they would stand for bytes they are not
    if share.by_module and 2 * sum(g.bytes for g in share.by_module) >= share.bytes:
        return share.by_module[:GROUPS_PER_COMPONENT]
    groups = list(share.by_source_line)
    if groups and len(groups) < GROUP_LIMIT:
        rest = share.bytes - sum(g.bytes for g in groups)
        if rest > 0:
            groups.append(Group(NO_FRAMES_GROUP, rest, share.block_count - sum(g.block_count for g in groups)))
            groups.sort(key=lambda g: -g.bytes)
    return tuple(groups[:GROUPS_PER_COMPONENT])


DEVICE_COLUMNS = (
    "device",
    "reserved at the dump",
    "allocated at the dump",
    "peak",
    "at the same time",
    "OOMs",
    "phases reached",
    "largest component",
)


def device_rows(analysis: Analysis) -> list[tuple[str, ...]]:
    """One row per device of a snapshot that holds several (DEVICE_COLUMNS); none for one device."""
    rows: list[tuple[str, ...]] = []
    for d in analysis.device_summaries:
        at_same_time = "-"
        if d.judged:
            at_same_time = human_size(analysis.replay.target_allocated_bytes)
        elif d.allocated_at_judged_bytes is not None:
            at_same_time = human_size(d.allocated_at_judged_bytes)
        largest = "-"
        if d.largest_component is not None:
            name = COMPONENT_LABELS.get(d.largest_component, d.largest_component)
            largest = f"{name} {human_size(d.largest_component_bytes)} at {phrasing.DEVICE_MOMENTS[d.moment]}"
        rows.append(
            (
                f"{d.device} (judged)" if d.judged else str(d.device),
                human_size(d.reserved_bytes),
                human_size(d.allocated_bytes),
                human_size(d.peak_allocated_bytes) if d.event_count else "-",
                at_same_time,
                str(d.oom_count) if d.oom_count else "-",
                ", ".join(p.replace("_", " ") for p in d.phases) or "-",
                largest,
            )
        )
    return rows
