"""What a snapshot file holds, as plain data (`build_info`) and as text or JSON.

Byte totals follow torch's own accounting (`torch.cuda._memory_viz.segsum`, spec §1.10):

    reserved_bytes   = Σ segment total_size                     (segsum total_reserved)
    allocated_bytes  = Σ size of active_allocated blocks        (memory_stats allocated_bytes)
    requested_bytes  = Σ requested_size of those blocks         (segsum total_allocated)
    rounding_bytes   = allocated_bytes − requested_bytes        (free inside allocated blocks)
    free_bytes       = reserved_bytes − allocated_bytes         (cached, not allocated)
    active_bytes     = allocated + active_pending_free blocks   (memory_stats active_bytes)

so segsum's total_free, which counts rounding inside allocated blocks as free, is
free_bytes + rounding_bytes.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import orjson

from oomdoctor.model import ACTIVE_ALLOCATED, INACTIVE, OOM, Segment, Snapshot, Stack
from oomdoctor.safetext import json_printable, printable
from oomdoctor.units import human_size as format_bytes

INFO_SCHEMA_VERSION = 1
_STACK_SAMPLE_EVENTS = 256


def _byte_totals(segments: list[Segment] | tuple[Segment, ...]) -> dict[str, int]:
    reserved = allocated = requested = active = blocks = 0
    for segment in segments:
        reserved += segment.total_size
        blocks += len(segment.blocks)
        for block in segment.blocks:
            state = block.state
            if state == ACTIVE_ALLOCATED:
                allocated += block.size
                requested += block.requested_size
                active += block.size
            elif state != INACTIVE:
                active += block.size
    return {
        "segments": len(segments),
        "blocks": blocks,
        "reserved_bytes": reserved,
        "allocated_bytes": allocated,
        "requested_bytes": requested,
        "rounding_bytes": allocated - requested,
        "active_bytes": active,
        "free_bytes": reserved - allocated,
    }


def _stack_kind(stack: Stack, kinds: set[str]) -> None:
    for frame in stack:
        filename = frame.filename
        if filename.endswith(".py") or filename.startswith("<"):
            kinds.add("python")
        elif filename == "??" or "::" in frame.name or filename.endswith((".cpp", ".h", ".cc", ".cu", ".hpp", ".so")):
            kinds.add("c++")
        else:
            kinds.add("python")


def build_info(snapshot: Snapshot, name: str) -> dict[str, Any]:
    """Plain data (str, int, float, bool, None, lists, dicts) describing `snapshot`."""
    devices = []
    ooms = []
    stack_kinds: set[str] = set()
    first_times, last_times = [], []
    for segment in snapshot.segments:
        _stack_kind(segment.frames, stack_kinds)
        for block in segment.blocks:
            _stack_kind(block.frames, stack_kinds)
    for device in snapshot.devices:
        part = snapshot.device(device)
        trace = part.trace
        row: dict[str, Any] = {"device": device}
        row.update(_byte_totals(part.segments))
        count = len(trace)
        row["trace_events"] = count
        row["actions"] = dict(sorted(Counter(trace.actions).items())) if count else {}
        row["events_with_stacks"] = trace.events_with_frames if count else 0
        times = [t for t in trace.times_us if t is not None] if count and trace.times_us else []
        row["first_time_us"] = min(times) if times else None
        row["last_time_us"] = max(times) if times else None
        if times:
            first_times.append(row["first_time_us"])
            last_times.append(row["last_time_us"])
        if count:
            step = max(1, count // _STACK_SAMPLE_EVENTS)
            for index in range(0, count, step):
                _stack_kind(trace.frames_at(index), stack_kinds)
            if OOM in row["actions"]:
                for index, action in enumerate(trace.actions):
                    if action == OOM:
                        ooms.append(
                            {
                                "device": device,
                                "event_index": index,
                                "request_bytes": trace.sizes[index],
                                "device_free_bytes": trace.device_free.get(index),
                                "stream": trace.streams[index],
                                "time_us": trace.times_us[index] if trace.times_us else None,
                            }
                        )
        devices.append(row)

    trace_counts = [len(t) for t in snapshot.traces]
    info: dict[str, Any] = {
        "schema_version": INFO_SCHEMA_VERSION,
        "file": name,
        "container": snapshot.container,
        "format": snapshot.source_format,
        "torch_version_hint": snapshot.torch_version_hint or None,
        "era_hints": list(snapshot.era_hints),
        "torch_version": _recorded_torch_version(snapshot),
        "device_list": [row["device"] for row in devices],
    }
    info.update(_byte_totals(snapshot.segments))
    info["trace_events"] = trace_counts
    info["time_span_us"] = (
        {"first": min(first_times), "last": max(last_times), "seconds": (max(last_times) - min(first_times)) / 1e6}
        if first_times
        else None
    )
    info["stacks_recorded"] = bool(stack_kinds)
    info["stack_kinds"] = sorted(stack_kinds)
    info["oom_events"] = ooms
    info["annotations"] = len(snapshot.annotations)
    info["allocator_settings"] = _settings(snapshot)
    info["oomdoctor_metadata"] = _metadata_summary(snapshot)
    info["devices"] = devices
    return info


def _recorded_torch_version(snapshot: Snapshot) -> str | None:
    meta = snapshot.oomdoctor
    versions = meta.get("versions") if meta else None
    version = versions.get("torch") if hasattr(versions, "get") else None
    return version if isinstance(version, str) else None


def _settings(snapshot: Snapshot) -> dict[str, Any] | None:
    settings = snapshot.allocator_settings
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


def _metadata_summary(snapshot: Snapshot) -> dict[str, Any] | None:
    meta = snapshot.oomdoctor
    if meta is None:
        return None
    summary: dict[str, Any] = {"keys": sorted(meta)}
    for key in ("schema_version", "reason", "host", "pid", "rank", "world_size"):
        value = meta.get(key)
        if isinstance(value, (str, int, float, bool)):
            summary[key] = value
    return summary


def to_json(info: dict[str, Any]) -> str:
    try:
        return json_printable(orjson.dumps(info, option=orjson.OPT_INDENT_2)).decode()
    except TypeError:  # an int beyond 64 bits in a strange file: the stdlib encoder copes
        return json.dumps(info, indent=2)


_FORMAT_WORDS = {
    "dict": "snapshot dict (torch.cuda.memory._snapshot / _dump_snapshot)",
    "segment-list": "bare list of segments (torch.cuda.memory_snapshot())",
    "legacy-history": "snapshot dict with torch 2.0 per-block history",
}


def to_text(info: dict[str, Any]) -> str:
    lines = []

    def add(label: str, text: str) -> None:
        lines.append(f"{label:<20}{text}")

    add("file", info["file"])
    add("container", info["container"])
    add("format", _FORMAT_WORDS.get(info["format"], info["format"]))
    if info["torch_version"]:
        add("torch", f"{info['torch_version']} (recorded by oomdoctor)")
    elif info["torch_version_hint"]:
        add("torch", f"{info['torch_version_hint']} (inferred from the keys present)")
    add("devices", ", ".join(map(str, info["device_list"])) or "none")
    add("segments", f"{info['segments']} ({info['blocks']} blocks)")
    for key in ("reserved_bytes", "allocated_bytes", "requested_bytes", "rounding_bytes", "active_bytes", "free_bytes"):
        exact = f" ({info[key]} bytes)" if abs(info[key]) >= 1024 else ""
        add(key.removesuffix("_bytes"), format_bytes(info[key]) + exact)
    add(
        "trace events",
        " + ".join(map(str, info["trace_events"])) + " (per device)" if info["trace_events"] else "none recorded",
    )
    span = info["time_span_us"]
    if span:
        add("time span", f"{span['seconds']:.3f} s")
    add("stacks", ", ".join(info["stack_kinds"]) if info["stacks_recorded"] else "none recorded")
    add("annotations", str(info["annotations"]))
    if info["oom_events"]:
        for oom in info["oom_events"]:
            free = oom["device_free_bytes"]
            add(
                "OOM",
                f"device {oom['device']}, event {oom['event_index']}: request {format_bytes(oom['request_bytes'])}"
                + (f", device free {format_bytes(free)}" if free is not None else ""),
            )
    else:
        add("OOM events", "none")
    settings = info["allocator_settings"]
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
    meta = info["oomdoctor_metadata"]
    add("oomdoctor metadata", "none (a plain torch snapshot)" if meta is None else ", ".join(meta["keys"]))
    for row in info["devices"]:
        actions = ", ".join(f"{name} {count}" for name, count in row["actions"].items())
        lines.append("")
        lines.append(f"device {row['device']}")
        add("  segments", f"{row['segments']} ({row['blocks']} blocks)")
        add("  reserved", format_bytes(row["reserved_bytes"]))
        add("  allocated", format_bytes(row["allocated_bytes"]))
        add("  free (cached)", format_bytes(row["free_bytes"]))
        add("  trace events", f"{row['trace_events']}" + (f" ({actions})" if actions else ""))
        if row["trace_events"]:
            add("  with stacks", str(row["events_with_stacks"]))
    return "\n".join(printable(line, 8192) for line in lines) + "\n"
