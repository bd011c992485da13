"""What a snapshot file holds (oomdoctor.analysis.contents) as plain data, JSON or text: what
`oomdoctor info FILE` prints. The byte totals and how they relate to torch's own accounting are
described in oomdoctor.analysis.contents.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

from oomdoctor.analysis.contents import ByteTotals, Contents
from oomdoctor.model import AllocatorSettings
from oomdoctor.safetext import json_printable, printable_lines
from oomdoctor.units import human_size as format_bytes
from oomdoctor.units import plural

INFO_SCHEMA_VERSION = 1


def _totals(totals: ByteTotals) -> dict[str, int]:
    return {
        "segments": totals.segments,
        "blocks": totals.blocks,
        "reserved_bytes": totals.reserved_bytes,
        "allocated_bytes": totals.allocated_bytes,
        "requested_bytes": totals.requested_bytes,
        "rounding_bytes": totals.rounding_bytes,
        "active_bytes": totals.active_bytes,
        "free_bytes": totals.free_bytes,
    }


def to_dict(contents: Contents) -> dict[str, Any]:
    """Plain data (str, int, float, bool, None, lists, dicts): the JSON `info` writes."""
    devices = []
    for part in contents.devices:
        row: dict[str, Any] = {"device": part.device}
        row.update(_totals(part.totals))
        row["trace_events"] = part.trace_events
        row["actions"] = dict(part.actions)
        row["events_with_stacks"] = part.events_with_stacks
        row["first_time_us"] = part.first_time_us
        row["last_time_us"] = part.last_time_us
        devices.append(row)
    info: dict[str, Any] = {
        "schema_version": INFO_SCHEMA_VERSION,
        "file": contents.file,
        "container": contents.container,
        "format": contents.format,
        "torch_version_hint": contents.torch_version_hint,
        "era_hints": list(contents.era_hints),
        "torch_version": contents.torch_version,
        "device_list": list(contents.device_list),
    }
    info.update(_totals(contents.totals))
    info["trace_events"] = list(contents.trace_events)
    span = contents.time_span_us
    info["time_span_us"] = (
        {"first": span[0], "last": span[1], "seconds": (span[1] - span[0]) / 1e6} if span is not None else None
    )
    info["stacks_recorded"] = bool(contents.stack_kinds)
    info["stack_kinds"] = list(contents.stack_kinds)
    info["oom_events"] = [
        {
            "device": oom.device,
            "event_index": oom.event_index,
            "request_bytes": oom.request_bytes,
            "device_free_bytes": oom.device_free_bytes,
            "stream": oom.stream,
            "time_us": oom.time_us,
        }
        for oom in contents.ooms
    ]
    info["annotations"] = contents.annotations
    info["allocator_settings"] = _settings(contents.allocator_settings)
    meta = contents.metadata
    info["oomdoctor_metadata"] = None if meta is None else {"keys": list(meta.keys), **dict(meta.fields)}
    info["devices"] = devices
    return info


def _settings(settings: AllocatorSettings | None) -> dict[str, Any] | None:
    if settings is None:
        return None
    extra = {k: v for k, v in settings.extra.items() if isinstance(v, (str, int, float, bool)) or v is None}
    return {
        "PYTORCH_CUDA_ALLOC_CONF": settings.raw_conf,
        "max_split_size_bytes": None if settings.max_split_size < 0 else settings.max_split_size,
        "expandable_segments": settings.expandable_segments,
        "garbage_collection_threshold": settings.garbage_collection_threshold,
        "roundup_power2_divisions": {str(k): v for k, v in settings.roundup_power2_divisions if v},
        "other": extra,
    }


def json_text(document: dict[str, Any]) -> str:
    """`document` as indented JSON, every string printable."""
    try:
        return json_printable(orjson.dumps(document, option=orjson.OPT_INDENT_2)).decode()
    except TypeError:  # an int beyond 64 bits in a strange file: the stdlib encoder copes
        return json.dumps(document, indent=2)


def to_json(contents: Contents) -> str:
    return json_text(to_dict(contents))


_FORMAT_WORDS = {
    "dict": "snapshot dict (torch.cuda.memory._snapshot / _dump_snapshot)",
    "segment-list": "bare list of segments (torch.cuda.memory_snapshot())",
    "legacy-history": "snapshot dict with torch 2.0 per-block history",
}


def to_text(contents: Contents) -> str:
    lines = []

    def add(label: str, text: str) -> None:
        lines.append(f"{label:<20}{text}")

    add("file", contents.file)
    add("container", contents.container)
    add("format", _FORMAT_WORDS.get(contents.format, contents.format))
    if contents.torch_version:
        add("torch", f"{contents.torch_version} (recorded by oomdoctor)")
    elif contents.torch_version_hint:
        add("torch", f"{contents.torch_version_hint} (inferred from the keys present)")
    add("devices", ", ".join(map(str, contents.device_list)) or "none")
    totals = contents.totals
    add("segments", f"{totals.segments} ({plural(totals.blocks, 'block')})")
    for key in ("reserved_bytes", "allocated_bytes", "requested_bytes", "rounding_bytes", "active_bytes", "free_bytes"):
        value = getattr(totals, key)
        exact = f" ({value} bytes)" if abs(value) >= 1024 else ""
        add(key.removesuffix("_bytes"), format_bytes(value) + exact)
    add(
        "trace events",
        " + ".join(map(str, contents.trace_events)) + " (per device)" if contents.trace_events else "none recorded",
    )
    span = contents.time_span_us
    if span:
        add("time span", f"{(span[1] - span[0]) / 1e6:.3f} s")
    add("stacks", ", ".join(contents.stack_kinds) if contents.stack_kinds else "none recorded")
    add("annotations", str(contents.annotations))
    if contents.ooms:
        for oom in contents.ooms:
            free = oom.device_free_bytes
            add(
                "OOM",
                f"device {oom.device}, event {oom.event_index}: request {format_bytes(oom.request_bytes)}"
                + (f", device free {format_bytes(free)}" if free is not None else ""),
            )
    else:
        add("OOM events", "none")
    settings = _settings(contents.allocator_settings)
    if settings is None:
        add("allocator settings", "not recorded (torch < 2.3 or a segment list)")
    else:
        split = settings["max_split_size_bytes"]
        add(
            "allocator settings",
            f"PYTORCH_CUDA_ALLOC_CONF={settings['PYTORCH_CUDA_ALLOC_CONF']!r}; "
            f"expandable_segments {'on' if settings['expandable_segments'] else 'off'}; "
            f"max_split_size {'unlimited' if split is None else format_bytes(split)}; "
            f"garbage_collection_threshold {settings['garbage_collection_threshold']}",
        )
    meta = contents.metadata
    add("oomdoctor metadata", "none (a plain torch snapshot)" if meta is None else ", ".join(meta.keys))
    for row in contents.devices:
        actions = ", ".join(f"{name} {count}" for name, count in row.actions)
        lines.append("")
        lines.append(f"device {row.device}")
        add("  segments", f"{row.totals.segments} ({plural(row.totals.blocks, 'block')})")
        add("  reserved", format_bytes(row.totals.reserved_bytes))
        add("  allocated", format_bytes(row.totals.allocated_bytes))
        add("  free (cached)", format_bytes(row.totals.free_bytes))
        add("  trace events", f"{row.trace_events}" + (f" ({actions})" if actions else ""))
        if row.trace_events:
            add("  with stacks", str(row.events_with_stacks))
    return printable_lines(lines) + "\n"
