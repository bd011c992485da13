"""The analysis as JSON: every field of the result, sizes in bytes, with a versioned schema.

Top-level keys a script can rely on: `schema_version`, `verdict` (one of
`oomdoctor.metadata.VERDICTS`), `confidence`, `summary`, `components` (bytes per component at the
OOM, or at the peak when there was none), `evidence`, `recommendations`, `what_if`, `accounting`,
`fragmentation`, `replay`, `phases`, `steps`, `secondary`, `unknowns`; `devices_compared` (one summary
per device, `analysis.results.DeviceSummary`) when the snapshot holds several devices. `live_blocks` lists the
largest live blocks only (`live_block_count` says how many there were). `environment` (versions,
device, host, argv, ...) is there when the caller passes it, as `oomdoctor report` does.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import orjson

from oomdoctor.analysis.results import (
    Accounting,
    Analysis,
    Evidence,
    Finding,
    LiveBlock,
    Recommendation,
    ReplaySummary,
    StepSummary,
    WhatIf,
)
from oomdoctor.model import Stack
from oomdoctor.safetext import clip, json_printable
from oomdoctor.views import phrasing
from oomdoctor.views.report_rows import layout_estimated

JSON_SCHEMA_VERSION = 1
LIVE_BLOCK_LIMIT = 200
FRAME_LIMIT = 8


# A frame's file or function name longer than this is cut (saying so): one shared 1.5 MB name
# otherwise becomes gigabytes of JSON, once for every frame of every block that shares it.
FRAME_TEXT_LIMIT = 4096


def _frames(stack: Stack) -> list[str]:
    return [
        f"{clip(f.filename, FRAME_TEXT_LIMIT)}:{f.line} in {clip(f.name, FRAME_TEXT_LIMIT)}"
        for f in stack[:FRAME_LIMIT]
    ]


# a class -> the names of its dataclass fields, or None when it is not a dataclass
_FIELD_NAMES: dict[type, tuple[str, ...] | None] = {}


def _field_names(kind: type) -> tuple[str, ...] | None:
    names = _FIELD_NAMES.get(kind, ())
    if names == ():
        names = tuple(f.name for f in dataclasses.fields(kind)) if dataclasses.is_dataclass(kind) else None
        _FIELD_NAMES[kind] = names
    return names


def _plain(value: Any) -> Any:
    """`value` as JSON-ready data: dataclasses (their fields) and dicts to dicts, lists and tuples
    to lists. The field names are looked up once per class (a report has thousands of spans)."""
    names = _field_names(type(value))
    if names is not None:
        return {name: _plain(getattr(value, name)) for name in names}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def _component_detail(analysis: Analysis) -> list[dict[str, Any]]:
    """Each component's share; the unknown one with `reason` (why its blocks are unknown) where the
    analysis says."""
    detail = _plain(analysis.components)
    reasons = phrasing.unknown_component_reasons(analysis.unknowns)
    if reasons:
        for row in detail:
            if row["name"] == "unknown":
                row["reason"] = "; ".join(reasons)
    return detail


def _block(block: LiveBlock) -> dict[str, Any]:
    row = _plain(dataclasses.replace(block, frames=()))
    row["frames"] = _frames(block.frames)
    return row


# the accounting's figures read from the layout (the free blocks), estimates where it was rebuilt
LAYOUT_FIGURES = ("free_cached_bytes", "releasable_bytes", "non_releasable_bytes", "headroom_bytes", "missing_bytes")


def _accounting(accounting: Accounting, estimated: bool) -> dict[str, Any]:
    """The accounting; `estimated_as_laid_out` (the figures that are the rebuilt layout's estimate)
    only where the moment was replayed back from the dump."""
    row = _plain(accounting)
    row["unknowns"] = list(phrasing.unknowns(accounting.unknowns))
    if estimated:
        row["estimated_as_laid_out"] = [name for name in LAYOUT_FIGURES if row[name] is not None]
    return row


def _fragmentation(analysis: Analysis) -> dict[str, Any]:
    """The fragmentation figures; `estimated_as_laid_out` only where the moment was replayed back from
    the dump (blocks allocated or freed after it), so its free blocks, and whether the request would
    fit if they were contiguous, are the rebuilt layout's estimate (so other reports keep their bytes)."""
    row = _plain(analysis.fragmentation)
    if layout_estimated(analysis):
        row["estimated_as_laid_out"] = True
    return row


def _replay(replay: ReplaySummary) -> dict[str, Any]:
    """The replay's summary; its series' peaks (the app's chart) are left out, the series is there."""
    row = _plain(dataclasses.replace(replay, series_peaks=()))
    del row["series_peaks"]
    if not replay.torch_peak_bound_assumes_defaults:  # only where it does (so other reports keep their bytes)
        del row["torch_peak_bound_assumes_defaults"]
    return row


def _evidence(items: tuple[Evidence, ...]) -> list[dict[str, Any]]:
    return [
        {
            "text": phrasing.evidence(item),
            "metric": item.metric,
            "bytes": item.bytes,
            "event_index": item.event_index,
            "address": item.address,
            "frame": item.frame,
            "value": item.value,
        }
        for item in items
    ]


def _finding(finding: Finding) -> dict[str, Any]:
    return {
        "verdict": finding.verdict,
        "confidence": finding.confidence,
        "summary": phrasing.summary(finding.summary),
        "evidence": _evidence(finding.evidence),
    }


def _step(step: StepSummary) -> dict[str, Any]:
    """A step's row; `end_at_least` only where its end figure is a lower bound (so other reports keep their bytes)."""
    row = _plain(step)
    if not step.end_at_least:
        del row["end_at_least"]
    return row


def _recommendation(item: Recommendation) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": item.id,
        "text": phrasing.recommendation(item),
        "estimated_saved_bytes": item.estimated_saved_bytes,
        "would_fit_alone": item.would_fit_alone,
    }
    if item.saved_at_least:  # the saving is a lower bound (the rest of the interrupted pass is unknown)
        out["estimated_saved_is_lower_bound"] = True
    if item.if_trains:  # advice for a run that trains, where the file cannot tell whether it does
        out["if_trains"] = True
    if item.peak_saved_at_most_bytes is not None:
        # the saving is the judged moment's; what it frees is made again later, and the run's peak
        # drops by at most this
        out["peak_saved_at_most_bytes"] = item.peak_saved_at_most_bytes
    if item.rule_of_thumb:  # the saving is a fixed share, not measured from the file
        out["estimated_saved_is_rule_of_thumb"] = True
    regions = item.regions
    if regions is not None and regions.count:  # activation checkpointing measured from the regions these lines call
        out["regions"] = {"count": regions.count, "called_from": _frames(regions.called_from)}
        if regions.sequential:  # segments of a Sequential of torch's own modules
            out["regions"]["sequential"] = True
        if regions.replayed_step is not None:  # replayed on that step's completed pass
            out["regions"]["replayed_step"] = regions.replayed_step
        if regions.so_far:  # an interrupted pass's calls so far: a lower bound
            out["regions"]["so_far"] = True
        if regions.gradients_beside_bytes:  # gradients to come counted beside the largest: a lower bound
            out["regions"]["gradients_beside_bytes"] = regions.gradients_beside_bytes
    return out


def _what_if(what_if: WhatIf) -> dict[str, Any]:
    out: dict[str, Any] = {
        "scalable_bytes": what_if.scalable_bytes,
        "fixed_bytes": what_if.fixed_bytes,
        "capacity_bytes": what_if.capacity_bytes,
        "largest_fitting_scale": what_if.largest_fitting_scale,
        "predicted_peaks": _plain(what_if.predicted_peaks),
        "note": phrasing.what_if_note(what_if),
        "unusable_bytes": what_if.unusable_bytes,
        "projected_states": what_if.projected_states,
        "placement_limit_scale": what_if.placement_limit_scale,
        "case": what_if.case,
        "upper_bound_scale": what_if.upper_bound_scale,
        "capacity_bound_bytes": what_if.capacity_bound_bytes,
        "capacity_at_most": what_if.capacity_at_most,
        "rest_of_pass": _plain(dataclasses.asdict(what_if.rest_of_pass)) if what_if.rest_of_pass is not None else None,
    }
    if what_if.beyond_the_moment is not None:
        out["beyond_the_moment"] = what_if.beyond_the_moment  # why no scale is said to fit
    if phrasing.scale_estimated(what_if):
        # the largest fitting scale is an estimate by allocated bytes: the cache's layout at another
        # size (fragments, cached blocks reused unsplit, segments to cut) is left out
        out["largest_fitting_scale_by_allocated_bytes"] = True
        if what_if.cache_margin_bytes:
            # the room the largest fitting scale leaves for the cache's segments, and the scale allocated
            # bytes alone would allow (null where the room did not lower it): between the two, unknown
            out["cache_margin_bytes"] = what_if.cache_margin_bytes
            out["by_bytes_scale"] = what_if.by_bytes_scale
    return out


def to_dict(analysis: Analysis, environment: Any = None) -> dict[str, Any]:
    result = {
        "schema_version": JSON_SCHEMA_VERSION,
        "analysis_schema_version": analysis.schema_version,
        "verdict": analysis.verdict,
        "confidence": analysis.confidence,
        "summary": phrasing.summary(analysis.summary),
        "device": analysis.device,
        "devices": list(analysis.devices),
        "source_format": analysis.source_format,
        "components": analysis.component_bytes(),
        "component_detail": _component_detail(analysis),
        "evidence": _evidence(analysis.evidence),
        "recommendations": [_recommendation(r) for r in analysis.recommendations],
        "what_if": _what_if(analysis.what_if),
        "secondary": [_finding(f) for f in analysis.secondary],
        "accounting": _accounting(analysis.accounting, layout_estimated(analysis)),
        "fragmentation": _fragmentation(analysis),
        "replay": _replay(analysis.replay),
        "phase_source": analysis.phase_source,
        "target_phase": analysis.target_phase,
        "target_step": analysis.target_step,
        "phases": _plain(analysis.phases),
        "steps": [_step(step) for step in analysis.steps],
        "live_block_count": len(analysis.live_blocks),
        "live_blocks": [_block(b) for b in analysis.live_blocks[:LIVE_BLOCK_LIMIT]],
        "unknowns": list(phrasing.unknowns(analysis.unknowns)),
    }
    if analysis.device_summaries:  # a snapshot of several devices
        result["devices_compared"] = {
            "text": phrasing.devices_intro(analysis.device_summaries),
            "notes": phrasing.device_notes(analysis.device_summaries),
            "devices": _plain(analysis.device_summaries),
        }
    if environment is not None:
        result["environment"] = _plain(environment)
    return result


def render(analysis: Analysis, *, environment: Any = None) -> bytes:
    return dumps(to_dict(analysis, environment))


def dumps(data: Any) -> bytes:
    """Indented JSON and a newline; integers beyond 64 bits (sums of hostile sizes) are written
    exactly by the standard library, which orjson refuses."""
    try:
        return json_printable(orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_APPEND_NEWLINE))
    except TypeError:
        return (json.dumps(data, indent=2) + "\n").encode("ascii")
