"""Every sentence `oomdoctor diff` says, in one place, for the text, Markdown and JSON views.

The comparison (`oomdoctor.analysis.diff`) is data; these functions word it. Strings that come from
the dumps or the command line (site keys, tensor names, arguments, file names) go through the
`quote` (a site, a name, an argument) and `label` (a side's name) functions the view passes in, so
that each view escapes them its own way: the text view makes the whole line printable, Markdown
puts them in code spans or escaped text.
"""

from __future__ import annotations

from collections.abc import Callable

from oomdoctor.analysis.diff import (
    APPEARED,
    DIFF_FILES,
    DIFF_RANKS,
    DIFF_STEPS,
    GREW,
    LAYOUT_FIGURES,
    MOMENT_DUMP,
    MOMENT_OOM,
    MOMENT_PEAK,
    MOMENT_STEP_END,
    SAME_BYTES,
    SHRANK,
    SITE_MODULE,
    UNLIKE_DEVICE_INDEX,
    UNLIKE_DEVICE_MEMORY,
    UNLIKE_DEVICE_NAME,
    UNLIKE_MODEL,
    UNLIKE_PROGRAM,
    UNLIKE_TORCH,
    UNLIKE_WORLD_SIZE,
    WENT,
    ArgumentChange,
    Diff,
    Figure,
    InputChange,
    Moment,
    SiteChange,
    Unlike,
)
from oomdoctor.units import human_size as human
from oomdoctor.units import plural
from oomdoctor.views.phrasing import LAYOUT_ESTIMATE
from oomdoctor.views.report_rows import COMPONENT_LABELS

Quote = Callable[[str], str]

KINDS = {DIFF_FILES: "two files", DIFF_STEPS: "two steps of one dump", DIFF_RANKS: "two ranks of a folder"}
MOMENTS = {
    MOMENT_OOM: "the OOM",
    MOMENT_PEAK: "the peak",
    MOMENT_DUMP: "the dump",
    MOMENT_STEP_END: "the step's end",
}
MEMORY_LABELS = {
    "allocated": "allocated",
    "reserved": "reserved",
    "free_cached": "free cached",
    "fragmented": "fragmented",
    "largest_free_block": "largest free block",
    "rounding": "rounding",
}
MEMORY_NOTES = {
    "fragmented": "free cached bytes outside the largest free block of each pool",
}
STATUS = {APPEARED: "appeared", WENT: "went", GREW: "grew", SHRANK: "shrank"}


def _plain(text: str) -> str:
    return text


def label(name: str) -> str:
    """A component's or a memory figure's label: 'optimizer state', 'free cached'."""
    return COMPONENT_LABELS.get(name) or MEMORY_LABELS.get(name) or name.replace("_", " ")


def layout_note(a: Moment, b: Moment) -> str | None:
    """Where a side's moment was replayed back from its dump, which of its figures are an estimate
    (the layout rebuilt there: blocks freed since count at their rounded requests); None where neither."""
    sides = [key for key, item in (("A", a), ("B", b)) if item.layout_estimated]
    if not sides:
        return None
    figures = [label(name) for name in LAYOUT_FIGURES]
    which = " and ".join(sides)
    dumps = "its dump was" if len(sides) == 1 else "their dumps were"
    return (
        f"{', '.join(figures[:-1])} and {figures[-1]} are {LAYOUT_ESTIMATE} (for {which}: {dumps} written after"
        " this moment, and blocks freed since count at their rounded requests)"
    )


def signed(size_bytes: int) -> str:
    """'+1.50 GiB', '-3.00 MiB', '0 bytes'."""
    return f"+{human(size_bytes)}" if size_bytes > 0 else human(size_bytes)


def ratio(value: float | None) -> str:
    return f"{value:.2f}×" if value is not None else "new"


def change(figure: Figure) -> str:
    """'+1.50 GiB (2.00×)', '-3.00 MiB (0.50×)', 'new', 'unchanged', '+1016 bytes (under 4.00 KiB: not a change)'."""
    if not figure.changed:
        # below SAME_BYTES a difference is not counted as a change, but the two figures printed beside
        # this differ: say by how much rather than 'unchanged'
        return (
            "unchanged"
            if not figure.delta_bytes
            else f"{signed(figure.delta_bytes)} (under {human(SAME_BYTES)}: not a change)"
        )
    if figure.b_bytes == 0:
        return f"{signed(figure.delta_bytes)} (gone)"
    return f"{signed(figure.delta_bytes)} ({ratio(figure.ratio)})"


def moment(item: Moment) -> str:
    """'the peak (step 1, backward, event 728)'."""
    where = []
    if item.step is not None:
        where.append(f"step {item.step}")
    where.append(item.phase.replace("_", " "))
    if item.event_index is not None:
        where.append(f"event {item.event_index}")
    return f"{MOMENTS.get(item.kind, item.kind)} ({', '.join(where)})"


def _short(item: Moment) -> str:
    """'its peak', 'its dump', 'its OOM'."""
    return "its " + MOMENTS.get(item.kind, item.kind).removeprefix("the ")


def site(item: SiteChange, quote: Quote = _plain) -> str:
    """'activations of `models.py:87 in forward` grew 1.89× (+16.01 MiB, 4 → 5 blocks)'."""
    what = "module" if item.kind == SITE_MODULE else "line"
    if item.status == APPEARED:
        how = f"appeared ({human(item.b_bytes)}, {plural(item.b_blocks, 'block')})"
    elif item.status == WENT:
        how = f"went ({human(item.a_bytes)}, {plural(item.a_blocks, 'block')})"
    else:
        how = f"{STATUS[item.status]} {ratio(item.ratio)} ({signed(item.delta_bytes)}, {item.a_blocks} → {plural(item.b_blocks, 'block')})"
    return f"{label(item.component)} of {what} {quote(item.key)} {how}"


def input_change(item: InputChange, quote: Quote = _plain) -> str:
    shape_a = "×".join(str(n) for n in item.a_shape) or "scalar"
    shape_b = "×".join(str(n) for n in item.b_shape) or "scalar"
    return f"the input {quote(item.name)} went from {shape_a} to {shape_b}"


def summary(diff: Diff, quote: Quote = _plain, name: Quote = _plain) -> str:
    """The one paragraph a diff opens with: how the peak moved, what moved it (the component and
    the site that changed most), the verdicts, and what the dumps record that may explain it."""
    head = diff.headline
    peak = head.peak
    a, b = name(diff.a.label), name(diff.b.label)
    unknown = [side for side in (diff.a, diff.b) if side.at_peak.kind != MOMENT_PEAK]
    growth = f", {peak.growth_percent:+.1f}%" if peak.growth_percent is not None else ""
    if unknown:
        # a side without allocations in a trace: its peak is unknown, at least what its dump holds
        moments = (
            f"{human(peak.a_bytes)} at {_short(diff.a.at_peak)} → {human(peak.b_bytes)} at {_short(diff.b.at_peak)}"
        )
        if not peak.changed:
            sentences = [f"{b} holds as much as {a} ({moments})"]
        else:
            more = "more" if peak.delta_bytes > 0 else "less"
            sentences = [f"{b} holds {human(abs(peak.delta_bytes))} {more} than {a} ({moments}{growth})"]
    elif not peak.changed:
        sentences = [f"{b} peaks as {a} does ({human(peak.b_bytes)})"]
    else:
        direction = "higher" if peak.delta_bytes > 0 else "lower"
        sentences = [
            f"{b} peaks {human(abs(peak.delta_bytes))} {direction} than {a} "
            f"({human(peak.a_bytes)} → {human(peak.b_bytes)}{growth})"
        ]
    details = []
    if head.component is not None:
        details.append(f"{label(head.component.name)} {change(head.component)}")
    if head.site is not None:
        details.append(site(head.site, quote))
    if details:
        sentences[0] += ": " + "; ".join(details)
    if head.verdict_changed:
        sentences.append(f"The verdict changed: {diff.a.verdict} → {diff.b.verdict}")
    else:
        sentences.append(f"Both are judged {diff.a.verdict}")
    if diff.inputs:
        changes = "; ".join(input_change(item, quote) for item in diff.inputs)
        sentences.append(f"oomdoctor's registry records that {changes}")
    if diff.arguments:
        sentences.append("The command lines differ: " + "; ".join(argument(item, quote) for item in diff.arguments))
    for side in unknown:
        sentences.append(
            f"{name(side.label)} records no allocation in a trace, so its peak is unknown: at least what its dump holds"
        )
    if diff.unlike:
        sentences.append("Not like for like: " + "; ".join(unlike(item, quote) for item in diff.unlike))
    return ". ".join(sentences) + "."


def unlike(item: Unlike, quote: Quote = _plain) -> str:
    """'A ran on a 24.00 GiB device, B on a 80.00 GiB one', 'the models differ: 12 of 40 parameters ...'."""
    if item.what == UNLIKE_DEVICE_INDEX:
        return f"A's figures are device {item.a}'s, B's device {item.b}'s"
    if item.what == UNLIKE_DEVICE_MEMORY:
        return f"A ran on a {human(int(item.a))} device, B on a {human(int(item.b))} one"
    if item.what == UNLIKE_DEVICE_NAME:
        return f"A ran on {quote(item.a)}, B on {quote(item.b)}"
    if item.what == UNLIKE_WORLD_SIZE:
        return f"A ran at world size {item.a}, B at {item.b} (what each rank holds of a sharded model differs)"
    if item.what == UNLIKE_MODEL:
        return (
            f"the models differ: {item.count} of the {plural(item.of, 'parameter')} oomdoctor's registries name "
            "are on one side only or shaped differently"
        )
    if item.what == UNLIKE_PROGRAM:
        return f"A ran {quote(item.a)}, B {quote(item.b)}"
    if item.what == UNLIKE_TORCH:
        return f"A was recorded by torch {quote(item.a)}, B by torch {quote(item.b)}"
    return f"{item.what}: {quote(item.a)} against {quote(item.b)}"


def argument(item: ArgumentChange, quote: Quote = _plain) -> str:
    """'`--batch-size` went from `8` to `16`', or '`--seq-lens` became `--seq-len`'."""
    if item.option:
        return f"{quote(item.option)} went from {quote(item.a_value)} to {quote(item.b_value)}"
    return f"{quote(item.a_value)} became {quote(item.b_value)}"


def verdicts(diff: Diff) -> str:
    if diff.verdict_changed:
        return f"changed: {diff.a.verdict} → {diff.b.verdict}"
    return f"unchanged: {diff.a.verdict}"
