"""`oomdoctor diff` as text, Markdown and JSON: the summary first, then per component and per
allocation site what changed at the peak and at the target, memory and fragmentation, the verdicts.

The words are `diff_phrasing`'s; strings from the dumps are escaped as the report's views escape
them (`safetext.printable` for text and JSON, Markdown's `inline_text` and `code_span`). The JSON's
keys, units and meaning are in docs/schema/diff.schema.json (`schema_version`).
"""

from __future__ import annotations

from typing import Any

from oomdoctor.analysis.diff import LAYOUT_FIGURES, Diff, Figure, Moment, MomentDiff, Side, SiteChange
from oomdoctor.safetext import printable_lines
from oomdoctor.units import human_size as human
from oomdoctor.views import diff_phrasing as words
from oomdoctor.views.json_report import dumps
from oomdoctor.views.markdown_report import code_span, inline_text

JSON_SCHEMA_VERSION = 1
SITES_SHOWN = 12  # in text and Markdown, per moment
SITE_LIMIT = 500  # in JSON, per moment (`site_count` says how many changed)


def _same_moment(moments: MomentDiff, other: MomentDiff) -> bool:
    return moments.a == other.a and moments.b == other.b


def _side_line(side: Side) -> str:
    return f"{side.verdict} (confidence {side.confidence:.0%}), judged at {words.moment(side.at_target)}"


# -- text ----------------------------------------------------------------------------------------


def _quoted(text: str) -> str:
    return f"'{text}'"


def to_text(diff: Diff) -> str:
    lines: list[str] = []
    add = lines.append
    add(f"Diff of {words.KINDS[diff.kind]}: A = {diff.a.label}, B = {diff.b.label}")
    add(words.summary(diff, quote=_quoted))
    add("")
    add(f"A  {diff.a.label}: {_side_line(diff.a)}")
    add(f"B  {diff.b.label}: {_side_line(diff.b)}")
    add(f"Verdict {words.verdicts(diff)}")
    add("")
    _text_moment(diff.at_peak, "At the peak", add)
    if _same_moment(diff.at_peak, diff.at_target):
        add(f"At {words.MOMENTS[diff.at_target.a.kind]}: the same moments as the peak on both sides.")
        add("")
    else:
        _text_moment(diff.at_target, "At the target", add)
    return printable_lines(lines) + "\n"


def _text_moment(moments: MomentDiff, title: str, add) -> None:
    add(f"{title}: A at {words.moment(moments.a)}, B at {words.moment(moments.b)}")
    add(f"  {'':<20}{'A':>12}{'B':>12}  change")
    for figure in (*moments.memory, *(c for c in moments.components if c.changed)):
        add(
            f"  {words.label(figure.name):<20}{human(figure.a_bytes):>12}{human(figure.b_bytes):>12}  {words.change(figure)}"
        )
    note = words.layout_note(moments.a, moments.b)
    if note is not None:
        add(f"  {note}")
    if moments.sites:
        add(
            f"  Sites that changed (largest change first, {min(len(moments.sites), SITES_SHOWN)} of {len(moments.sites)})"
        )
        for item in moments.sites[:SITES_SHOWN]:
            add(f"    {words.signed(item.delta_bytes):>12}  {words.site(item, quote=_quoted)}")
    else:
        add("  No allocation site changed.")
    add("")


# -- Markdown ------------------------------------------------------------------------------------


def to_markdown(diff: Diff) -> str:
    lines: list[str] = []
    add = lines.append
    a, b = inline_text(diff.a.label), inline_text(diff.b.label)
    add(f"## oomdoctor diff: {a} → {b}")
    add("")
    add(words.summary(diff, quote=code_span, name=inline_text))
    add("")
    add(f"| | {words.KINDS[diff.kind]} | verdict | judged at |")
    add("|---|---|---|---|")
    for key, side in (("A", diff.a), ("B", diff.b)):
        add(
            f"| {key} | {inline_text(side.label, cell=True)} | {side.verdict} ({side.confidence:.0%}) "
            f"| {words.moment(side.at_target)} |"
        )
    add("")
    add(f"Verdict {words.verdicts(diff)}.")
    add("")
    _markdown_moment(diff.at_peak, "At the peak", add)
    if _same_moment(diff.at_peak, diff.at_target):
        add(f"At {words.MOMENTS[diff.at_target.a.kind]}: the same moments as the peak on both sides.")
        add("")
    else:
        _markdown_moment(diff.at_target, "At the target", add)
    return "\n".join(lines).rstrip("\n") + "\n"


def _markdown_moment(moments: MomentDiff, title: str, add) -> None:
    add(f"### {title}")
    add("")
    add(f"A at {words.moment(moments.a)}, B at {words.moment(moments.b)}.")
    add("")
    add("| | A | B | change |")
    add("|---|---:|---:|---|")
    for figure in (*moments.memory, *(c for c in moments.components if c.changed)):
        add(
            f"| {words.label(figure.name)} | {human(figure.a_bytes)} | {human(figure.b_bytes)} | {words.change(figure)} |"
        )
    add("")
    note = words.layout_note(moments.a, moments.b)
    if note is not None:
        add(f"{note[:1].upper()}{note[1:]}.")
        add("")
    if moments.sites:
        shown = min(len(moments.sites), SITES_SHOWN)
        add(f"Sites that changed, largest change first ({shown} of {len(moments.sites)}):")
        add("")
        for item in moments.sites[:SITES_SHOWN]:
            add(f"- {words.signed(item.delta_bytes)}: {words.site(item, quote=code_span)}")
    else:
        add("No allocation site changed.")
    add("")


# -- JSON ----------------------------------------------------------------------------------------


def _figure(figure: Figure) -> dict[str, Any]:
    return {
        "name": figure.name,
        "a_bytes": figure.a_bytes,
        "b_bytes": figure.b_bytes,
        "delta_bytes": figure.delta_bytes,
        "ratio": figure.ratio,
        "growth_percent": figure.growth_percent,
        "changed": figure.changed,
    }


def _site(item: SiteChange) -> dict[str, Any]:
    return {
        "kind": item.kind,
        "key": item.key,
        "component": item.component,
        "status": item.status,
        "a_bytes": item.a_bytes,
        "b_bytes": item.b_bytes,
        "delta_bytes": item.delta_bytes,
        "ratio": item.ratio,
        "a_blocks": item.a_blocks,
        "b_blocks": item.b_blocks,
        "text": words.site(item),
    }


def _moment(item: Moment) -> dict[str, Any]:
    out: dict[str, Any] = {
        "kind": item.kind,
        "event_index": item.event_index,
        "step": item.step,
        "phase": item.phase,
        "text": words.moment(item),
    }
    if item.layout_estimated:  # only where it is (so other diffs keep their bytes)
        out["estimated_as_laid_out"] = list(LAYOUT_FIGURES)
    return out


def _moments(moments: MomentDiff) -> dict[str, Any]:
    return {
        "a": _moment(moments.a),
        "b": _moment(moments.b),
        "memory": {f.name: _figure(f) for f in moments.memory},
        "components": {f.name: _figure(f) for f in moments.components},
        "site_count": len(moments.sites),
        "sites": [_site(item) for item in moments.sites[:SITE_LIMIT]],
    }


def _side(side: Side) -> dict[str, Any]:
    return {
        "label": side.label,
        "verdict": side.verdict,
        "confidence": side.confidence,
        "target_kind": side.target_kind,
        "argv": list(side.argv),
        "inputs": [{"name": name, "shape": list(shape)} for name, shape in side.inputs],
    }


def to_dict(diff: Diff) -> dict[str, Any]:
    head = diff.headline
    return {
        "schema_version": JSON_SCHEMA_VERSION,
        "diff_schema_version": diff.schema_version,
        "kind": diff.kind,
        "summary": words.summary(diff),
        "a": _side(diff.a),
        "b": _side(diff.b),
        "verdict_changed": diff.verdict_changed,
        "peak": _figure(head.peak),
        "headline": {
            "component": head.component.name if head.component is not None else None,
            "site": _site(head.site) if head.site is not None else None,
        },
        "at_peak": _moments(diff.at_peak),
        "at_target": _moments(diff.at_target),
        "inputs": [
            {"name": item.name, "a_shape": list(item.a_shape), "b_shape": list(item.b_shape)} for item in diff.inputs
        ],
        "arguments": [
            {"option": item.option, "a_value": item.a_value, "b_value": item.b_value} for item in diff.arguments
        ],
        "unlike": [
            {
                "what": item.what,
                "a": item.a,
                "b": item.b,
                "count": item.count,
                "of": item.of,
                "text": words.unlike(item),
            }
            for item in diff.unlike
        ],
    }


def to_json(diff: Diff) -> bytes:
    return dumps(to_dict(diff))
