"""A modern snapshot rewritten as an older torch would have written the same run (spec §1.9, §1.4,
§1.6, §7.7): what each release leaves out is dropped, never invented.

    as_written_by(snapshot, minor)   # the plain snapshot dict (oomdoctor's key stripped) as 2.<minor> wrote it

Going back in time, a release loses: host_segments/host_traces and `annotate` events (before 2.14);
the pinned-host limits `max_round_threshold`/`max_cached_size` in `allocator_settings` (2.13); the
trace's `pool_id` (2.12); `forward_frames` on events, blocks and segments (2.11); the trace's
`user_metadata` (2.10); `graph_capture_record_stream_reuse` in `allocator_settings` (2.9);
`compile_context` (2.8); `external_annotations` (2.5); `allocator_settings` (2.3); `time_us` (2.2).

torch 2.0 wrote blocks without `address` or `frames`: a block handed out while history was recorded
carried `history`, newest first, each entry `{addr, real_size, frames}` (real_size the un-rounded
request; `frames` only when a stack was recorded), and a block allocated before recording carried no
`history` key; its trace recorded a block's frees from that history, so only for blocks allocated
while recording and with the allocation's stack, not the free's (its allocator's `free` and
`free_block` record `block->history->h.context`); segments had no `segment_pool_id`, `is_expandable` or `frames` (the real 2.0 file in
the corpus has exactly these keys: segments device, address, total_size, allocated_size,
active_size, requested_size, stream, segment_type, blocks; blocks size, requested_size, state and
history). 2.0 had no expandable segments, so a run that used them has no 2.0 form: None.

Only an active block's present allocation is written into `history`: what a 2.0 block's chain kept
of earlier allocations at the same address (inactive blocks kept theirs after a free) is not in a
modern snapshot, so it cannot be rebuilt.
"""

from __future__ import annotations

import copy
from typing import Any

# The releases whose snapshot format differs in a key an analysis could read, newest first, each
# named by the oldest release that writes it (2.12 also stands for ..., 2.8 for 2.8 and 2.9, ...).
ERAS = (12, 11, 10, 8, 5, 3, 2, 1, 0)

_SETTINGS_SINCE = {"max_round_threshold": 13, "max_cached_size": 13, "graph_capture_record_stream_reuse": 9}
_EVENT_KEYS_SINCE = {"pool_id": 12, "forward_frames": 11, "user_metadata": 10, "compile_context": 8, "time_us": 2}
_TOP_SINCE = {"host_segments": 14, "host_traces": 14, "external_annotations": 5, "allocator_settings": 3}
_SEGMENT_KEYS_2_0 = (
    "device",
    "address",
    "total_size",
    "allocated_size",
    "active_size",
    "requested_size",
    "stream",
    "segment_type",
)


def representable(snapshot: dict[str, Any], minor: int) -> bool:
    """Whether torch 2.<minor> could have written this run at all (2.0 had no expandable segments)."""
    if minor >= 1:
        return True
    if any(segment.get("is_expandable") for segment in snapshot.get("segments", [])):
        return False
    return not any(
        event.get("action") in ("segment_map", "segment_unmap")
        for events in snapshot.get("device_traces", [])
        for event in events
    )


def as_written_by(snapshot: dict[str, Any], minor: int) -> dict[str, Any] | None:
    """A copy of the plain snapshot dict `snapshot` as torch 2.<minor> would have written it, or None
    where that release could not have (see `representable`). The input is not changed."""
    if not representable(snapshot, minor):
        return None
    out = copy.deepcopy(snapshot)
    for key, since in _TOP_SINCE.items():
        if minor < since:
            out.pop(key, None)
    settings = out.get("allocator_settings")
    if isinstance(settings, dict):
        for key, since in _SETTINGS_SINCE.items():
            if minor < since:
                settings.pop(key, None)
    dropped = [key for key, since in _EVENT_KEYS_SINCE.items() if minor < since]
    traces = out.get("device_traces", [])
    for device, events in enumerate(traces):
        kept = [event for event in events if minor >= 14 or event.get("action") != "annotate"]
        for event in kept:
            for key in dropped:
                event.pop(key, None)
        traces[device] = kept
    if minor < 1:
        for device, events in enumerate(traces):
            traces[device] = _frees_as_2_0(events)
    for segment in out.get("segments", []):
        if minor < 11:
            segment.pop("forward_frames", None)
            for block in segment["blocks"]:
                block.pop("forward_frames", None)
        if minor < 1:
            _segment_as_2_0(segment)
    return out


def _frees_as_2_0(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """torch 2.0 recorded a block's frees from its history: only for a block handed out while
    recording (one allocated before has no history, and its frees no entry), with the allocation's
    stack, not the free's (free-site stacks came with 2.1's context="all")."""
    frames_at: dict[int, Any] = {}  # address -> the stack of the allocation live there (None: no stack)
    kept = []
    for event in events:
        action = event.get("action")
        if action == "alloc":
            frames_at[event["addr"]] = event.get("frames")
        elif action in ("free_requested", "free_completed"):
            if event["addr"] not in frames_at:
                continue  # allocated before the trace: no history, no entry
            frames = frames_at[event["addr"]]
            event.pop("frames", None)
            if frames is not None:
                event["frames"] = frames
            if action == "free_completed":
                del frames_at[event["addr"]]
        kept.append(event)
    return kept


def _segment_as_2_0(segment: dict[str, Any]) -> None:
    blocks = segment["blocks"]
    for key in list(segment):
        if key not in _SEGMENT_KEYS_2_0:
            del segment[key]
    address = segment["address"]
    written = []
    for block in blocks:
        frames = block.get("frames") or []
        legacy = {key: block[key] for key in ("size", "requested_size", "state") if key in block}
        if "history" in block:  # written by 2.0 already
            legacy["history"] = block["history"]
        elif block["state"] != "inactive" and frames:
            legacy["history"] = [{"addr": address, "real_size": block["requested_size"], "frames": frames}]
        written.append(legacy)
        address += block["size"]
    segment["blocks"] = written
