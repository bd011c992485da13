"""Every number a report prints, checked against the file by a reader of its own (issue 11: "every
number a report prints is true of the file, or says it is a bound or an estimate").

The checker reads the snapshot pickle itself (fixtures/strip.py read_snapshot: plain data, no
oomdoctor code) and recomputes, per device, what the reports' figures claim, from the format
(../shared/reference/torch-snapshot-spec.md) and the definitions (docs/definitions.md):

* the dump's state: reserved (segments' `total_size`), allocated (`active_allocated` blocks),
  pending free, cached free, requested bytes, free blocks by pool and stream, block counts;
* the trace: its entries, its `oom` entries (the rounded request, `device_free`, the "Tried to
  allocate" figure of spec §3.4), the reserved bytes at any event (the dump's less the segments
  mapped after it, plus those released after it), and the allocated bytes after every event by the
  rule of docs/definitions.md "The peak" (a block live at the dump counts its size there; one freed
  in the trace `round_size` of its request; one from before the trace freed in it, `round_size` of
  the size its first free names), so the peak, the judged moment's total and each step's peak and
  end.

Each report is read in its three formats: the JSON's fields are compared with those figures; the
text and Markdown reports' number-carrying lines are parsed by the wording views use and compared
with the same figures (and with the JSON where the figure is a modelled one, a component's bytes or
a saving, which no reader of the file can recompute: then the three formats must agree and the
percentages add up).

Inputs: the fixtures and realism variants stripped of the `oomdoctor` key, as capture wrote them,
and without their trace (with block stacks and without), and the corpus snapshots.

What no reader of the file can recompute (how live memory splits into components, the savings, the
what-if's projections, each step's activations) is checked for what the file does decide: the
components add up to the moment's allocated bytes and hold its live blocks, their shares are of that
total, the text and Markdown print the JSON's figures, a largest fitting scale fits the what-if's own
arithmetic. Not checked: the peak and the other replayed totals are docs/definitions.md's rule, which
counts a block freed before the dump at round_size of its request (an unsplit remainder of under 1 MiB
per large block is not in the file), so they are checked against the rule, not against torch's
allocated bytes, which may be higher by that much.
"""

from __future__ import annotations

import bisect
import copy
import functools
import io
import json
import pickle
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import CORPUS, FIXTURES, fixture_module

strip = fixture_module("strip")
MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())
ENTRIES = [*MANIFEST["fixtures"], *MANIFEST.get("realism", [])]
MIB = 1 << 20

# ---- the file, read independently -----------------------------------------------------------------


def read_raw(path: Path) -> Any:
    try:
        return strip.read_snapshot(path)
    except Exception:  # a JSON export of the same data
        return json.loads(path.read_text())


def round_size(size: int, divisions: int = 0) -> int:
    """The allocator's round_size (spec §4.1)."""
    if size < 512:
        return 512
    if divisions > 1 and size > 512 * divisions:
        power = 1 << (size.bit_length() - 1)
        if power == size:
            return size
        step = power // divisions
        return -(-size // step) * step
    return -(-size // 512) * 512


def message_size(rounded: int) -> int:
    """The "Tried to allocate" figure for a rounded request (spec §3.4)."""
    if rounded <= MIB:
        return 2 * MIB
    if rounded < 10 * MIB:
        return 20 * MIB
    return -(-rounded // (2 * MIB)) * (2 * MIB)


@dataclass
class Device:
    reserved: int = 0
    allocated: int = 0
    pending: int = 0
    free_cached: int = 0
    requested: int = 0
    segments: int = 0
    blocks: int = 0
    live_blocks: int = 0
    free_by_pool: dict[tuple[str, int], list[int]] = field(default_factory=lambda: defaultdict(list))
    trace: list[dict[str, Any]] = field(default_factory=list)
    live_at_dump: dict[int, int] = field(default_factory=dict)  # address -> size, active_allocated
    stackless_at_dump: set[int] = field(default_factory=set)  # addresses of those without frames
    segment_rows: dict[int, dict[str, Any]] = field(default_factory=dict)  # address -> its figures
    requested_at_dump: dict[int, int] = field(default_factory=dict)  # address -> requested_size, live blocks
    releasable: int = 0  # segments with no active block: what empty_cache() returns (not expandable)
    expandable: bool = False
    series: list[int] = field(default_factory=list)  # allocated bytes after each event
    live_counts: list[int] = field(default_factory=list)  # live blocks after each event
    reserved_series: list[int] = field(default_factory=list)  # reserved bytes after each event
    # after each event, the live blocks counted at a rounded request (freed before the dump) that are
    # in the large pool: each may hold an unsplit remainder of up to 1 MiB the trace does not record
    unsized_series: list[int] = field(default_factory=list)

    @property
    def peak(self) -> tuple[int, int] | None:
        """(bytes, first index reaching them)."""
        if not self.series:
            return None
        top = max(self.series)
        return top, self.series.index(top)


def facts_of(raw: Any) -> dict[int, Device]:
    if isinstance(raw, list):
        raw = {"segments": raw, "device_traces": []}
    devices: dict[int, Device] = defaultdict(Device)
    for segment in raw.get("segments") or []:
        d = devices[segment.get("device", 0)]
        d.segments += 1
        d.reserved += segment["total_size"]
        pool = segment.get("segment_type", "large")
        pool_id = tuple(segment.get("segment_pool_id") or (0, 0))
        d.expandable = d.expandable or bool(segment.get("is_expandable"))
        if all(b.get("state") not in ("active_allocated", "active_pending_free") for b in segment.get("blocks") or []):
            d.releasable += segment["total_size"]
        if pool_id != (0, 0):
            pool = f"private {pool_id} {pool}"
        address = segment.get("address", 0)
        row = d.segment_rows[segment.get("address", 0)] = {
            "total_bytes": segment["total_size"],
            "allocated_bytes": 0,
            "pending_free_bytes": 0,
            "free_bytes": 0,
            "largest_free_block_bytes": 0,
            "block_count": len(segment.get("blocks") or []),
            "stream": segment.get("stream", 0),
            "is_expandable": bool(segment.get("is_expandable")),
        }
        for block in segment.get("blocks") or []:
            state = block.get("state")
            key = {"active_allocated": "allocated_bytes", "active_pending_free": "pending_free_bytes"}.get(
                state, "free_bytes"
            )
            row[key] += block["size"]
            if key == "free_bytes":
                row["largest_free_block_bytes"] = max(row["largest_free_block_bytes"], block["size"])
            block_address = block.get("address", address)  # 2.0 dumps: the segment's plus the sizes before
            address = block_address + block["size"]
            d.blocks += 1
            state = block.get("state")
            if state == "active_allocated":
                d.allocated += block["size"]
                d.live_blocks += 1
                d.requested += block.get("requested_size", block["size"])
                d.live_at_dump[block_address] = block["size"]
                d.requested_at_dump[block_address] = block.get("requested_size", block["size"])
                if not block.get("frames") and not block.get("history"):
                    d.stackless_at_dump.add(block_address)
            elif state == "active_pending_free":
                d.pending += block["size"]
            else:
                d.free_cached += block["size"]
                d.free_by_pool[(pool, segment.get("stream", 0))].append(block["size"])
    settings = raw.get("allocator_settings") or {}
    divisions = settings.get("roundup_power2_divisions") if isinstance(settings, dict) else None
    if isinstance(divisions, dict) and any(divisions.values()):
        pytest.skip("roundup_power2_divisions per size class: not modelled by this checker")
    for index, trace in enumerate(raw.get("device_traces") or []):
        d = devices[index]
        d.trace = list(trace)
        d.series = allocated_series(d.trace, d.live_at_dump, d.live_counts, d.unsized_series)
        d.reserved_series = reserved_series(d.trace, d.reserved)
    return dict(devices)


_FREES = ("free_requested", "free_completed", "free")


def allocated_series(
    trace: list[dict[str, Any]],
    live_at_dump: dict[int, int],
    counts: list[int] | None = None,
    unsized: list[int] | None = None,
) -> list[int]:
    """Allocated bytes after each event (docs/definitions.md, "The peak"); `counts` gets the number
    of live blocks after each, `unsized` the number of those counted at a rounded request (not the
    dump's exact size) above 1 MiB."""
    allocated_in_trace = {e.get("addr") for e in trace if e.get("action") == "alloc"}
    # the last alloc at an address, if nothing frees it after: the block the dump holds there
    last_alloc: dict[int, int] = {}
    for i, e in enumerate(trace):
        if e.get("action") == "alloc":
            last_alloc[e["addr"]] = i
        elif e.get("action") in _FREES:
            last_alloc.pop(e.get("addr"), None)
    live: dict[int, int] = {}
    rounded: set[int] = set()  # live blocks counted at a rounded request, above 1 MiB
    seen: set[int] = set()
    for e in trace:  # blocks from before the trace that it frees: round_size of the first free's size
        addr = e.get("addr")
        if e.get("action") == "alloc":
            seen.add(addr)
        elif e.get("action") in _FREES and addr not in seen:
            seen.add(addr)
            if e.get("action") != "free_completed":  # else its free was requested before the trace
                live[addr] = round_size(e.get("size", 0))
                if live[addr] > MIB:
                    rounded.add(addr)
    for addr, size in live_at_dump.items():  # from before the trace, never freed in it
        if addr not in allocated_in_trace and addr not in live:
            live[addr] = size
    total = sum(live.values())
    series = []
    for i, e in enumerate(trace):
        action, addr = e.get("action"), e.get("addr")
        if action == "alloc":
            size = live_at_dump.get(addr) if last_alloc.get(addr) == i and addr in live_at_dump else None
            rounded.discard(addr)
            if size is None:
                size = round_size(e.get("size", 0))
                if size > MIB:
                    rounded.add(addr)
            total -= live.get(addr, 0)
            live[addr] = size
            total += size
        elif action in _FREES and addr in live:
            total -= live.pop(addr)
            rounded.discard(addr)
        series.append(total)
        if counts is not None:
            counts.append(len(live))
        if unsized is not None:
            unsized.append(len(rounded))
    return series


def reserved_series(trace: list[dict[str, Any]], reserved_at_dump: int) -> list[int]:
    """Reserved bytes after each event: the dump's, less what was mapped after, plus what was released."""
    series = [0] * len(trace)
    reserved = reserved_at_dump
    for i in range(len(trace) - 1, -1, -1):
        series[i] = reserved
        action = trace[i].get("action")
        if action in ("segment_alloc", "segment_map"):
            reserved -= trace[i].get("size", 0)
        elif action in ("segment_free", "segment_unmap"):
            reserved += trace[i].get("size", 0)
    return series


# ---- the inputs ------------------------------------------------------------------------------------


def _fixture_raw(name: str, variant: str) -> Any:
    entry = next(entry for entry in ENTRIES if entry["name"] == name)
    raw = strip.read_snapshot(FIXTURES / entry["file"])
    if variant == "metadata":  # as capture wrote it
        return raw
    raw = copy.deepcopy(strip.strip_metadata(raw))
    if variant in ("state", "bare"):
        raw["device_traces"] = [[] for _ in raw.get("device_traces", [])]
    if variant == "bare":
        for segment in raw["segments"]:
            for block in segment["blocks"]:
                block.pop("frames", None)
    return raw


def input_params() -> list[Any]:
    params = []
    for entry in ENTRIES:
        for variant in ("stripped", "state", "bare", "metadata"):
            params.append(pytest.param(("fixture", entry["name"], variant), id=f"{entry['name']}-{variant}"))
    if CORPUS is not None:
        for path in sorted((CORPUS / "snapshots").iterdir()):
            params.append(pytest.param(("corpus", path.name, ""), id=path.name))
    return params


@dataclass
class Reports:
    raw: Any
    facts: dict[int, Device]
    json: dict[str, Any]
    text: str
    md: str


@functools.cache
def reports_of(key: tuple[str, str, str]) -> Reports:
    from oomdoctor.analysis import analyse
    from oomdoctor.load import load
    from oomdoctor.pipeline import render_report

    kind, name, variant = key
    if kind == "fixture":
        raw = _fixture_raw(name, variant)
        data = pickle.dumps(raw, protocol=4)
        snapshot = load(io.BytesIO(data))
    else:
        assert CORPUS is not None
        path = CORPUS / "snapshots" / name
        raw = read_raw(path)
        snapshot = load(str(path))
    analysis = analyse(snapshot)
    render = functools.partial(render_report, snapshot, analysis=analysis, source="FILE")
    return Reports(raw, facts_of(raw), json.loads(render("json")), render("text").decode(), render("md").decode())


# ---- the checks ------------------------------------------------------------------------------------


def json_mismatches(r: Reports) -> list[str]:
    out: list[str] = []
    j = r.json
    dev = j.get("device")
    d = r.facts.get(dev, Device())
    replay, acc, frag = j["replay"], j["accounting"], j["fragmentation"]

    def want(what: str, said: Any, true: Any) -> None:
        if said != true:
            out.append(f"{what}: report says {said!r}, the file {true!r}")

    want("replay.event_count", replay["event_count"], len(d.trace))
    for oom in replay.get("ooms") or []:
        i = oom["event_index"]
        e = d.trace[i] if 0 <= i < len(d.trace) else {}
        want(f"oom {i}: action", e.get("action"), "oom")
        want(f"oom {i}: request_bytes", oom["request_bytes"], e.get("size"))
        want(f"oom {i}: device_free_bytes", oom.get("device_free_bytes"), e.get("device_free"))
        if isinstance(e.get("size"), int):
            want(f"oom {i}: message_bytes", oom["message_bytes"], message_size(e["size"]))
    if d.series:
        peak, peak_index = d.peak
        want("replay.peak_allocated_bytes", replay["peak_allocated_bytes"], peak)
        if replay["peak_index"] is not None or len(set(d.series)) > 1:  # None: no event changed it
            want("replay.peak_index", replay["peak_index"], peak_index)
    wrong_points = [
        point["event_index"]
        for point in replay.get("series") or []
        if not 0 <= point["event_index"] < len(d.series)
        or (point["allocated_bytes"], point["reserved_bytes"])
        != (d.series[point["event_index"]], d.reserved_series[point["event_index"]])
        or sum(point["components"]) != point["allocated_bytes"]
    ]
    if wrong_points:
        out.append(f"replay.series: {len(wrong_points)} points not the file's (events {wrong_points[:5]})")
    kind, index = replay["target_kind"], replay.get("target_index")
    # the layout's figures are flagged as an estimate exactly where the moment was replayed
    replayed = Moment(d, kind, index).replayed
    want("fragmentation.estimated_as_laid_out", frag.get("estimated_as_laid_out", False), replayed)
    want("accounting.estimated_as_laid_out", bool(acc.get("estimated_as_laid_out")), replayed)
    if kind == "dump" or index is None:
        want("replay.target_allocated_bytes (dump)", replay["target_allocated_bytes"], d.allocated)
    else:
        want(f"replay.target_allocated_bytes ({kind} at {index})", replay["target_allocated_bytes"], d.series[index])
    # the accounting: at the dump exactly the dump's blocks; at an event, reserved replayed back
    at_dump = kind == "dump" or index is None or index == len(d.trace) - 1
    if index is not None and d.reserved_series:
        want(f"accounting.reserved_bytes (at event {index})", acc["reserved_bytes"], d.reserved_series[index])
    else:
        want("accounting.reserved_bytes (dump)", acc["reserved_bytes"], d.reserved)
    if at_dump and not (index is not None and any(e.get("action") != "oom" for e in d.trace[index + 1 :])):
        want("accounting.allocated_bytes (dump)", acc["allocated_bytes"], d.allocated)
        want("accounting.pending_free_bytes (dump)", acc["pending_free_bytes"], d.pending)
        want("accounting.free_cached_bytes (dump)", acc["free_cached_bytes"], d.free_cached)
        want("accounting.requested_bytes (dump)", acc["requested_bytes"], d.requested)
        pool, stream = frag.get("request_pool"), frag.get("request_stream")
        if pool is not None:
            sizes = d.free_by_pool.get((pool, stream), [])
            want("fragmentation.usable_free_bytes (dump)", frag["usable_free_bytes"], sum(sizes))
            want(
                "fragmentation.largest_usable_free_block_bytes",
                frag["largest_usable_free_block_bytes"],
                max(sizes, default=0),
            )
        for p in frag.get("pools") or []:
            sizes = d.free_by_pool.get((p["pool"], p["stream"]), [])
            want(f"fragmentation.pools[{p['pool']},{p['stream']}].free_bytes", p["free_bytes"], sum(sizes))
            want(
                f"fragmentation.pools[{p['pool']},{p['stream']}].largest",
                p["largest_free_block_bytes"],
                max(sizes, default=0),
            )
            want(f"fragmentation.pools[{p['pool']},{p['stream']}].count", p["free_block_count"], len(sizes))
        want("live_block_count (dump)", j.get("live_block_count"), d.live_blocks)
    if at_dump and not (index is not None and any(e.get("action") != "oom" for e in d.trace[index + 1 :])):
        for seg in frag.get("segments") or []:
            true_row = d.segment_rows.get(seg["address"])
            said = {k: seg.get(k) for k in (true_row or {})}
            want(f"fragmentation.segments[{seg['address']:#x}]", said, true_row)
        want("fragmentation.segments: how many", len(frag.get("segments") or []), len(d.segment_rows))
        want("fragmentation.internal_bytes (rounding)", frag["internal_bytes"], d.allocated - d.requested)
        want("fragmentation.external_bytes (cached free)", frag["external_bytes"], d.free_cached)
        for block in j.get("live_blocks") or []:
            address = block["address"]
            want(f"live block {address:#x} size", block["size_bytes"], d.live_at_dump.get(address))
            want(f"live block {address:#x} requested", block["requested_bytes"], d.requested_at_dump.get(address))
        if index is not None and d.trace[index].get("action") == "oom" and acc.get("headroom_bytes") is not None:
            sizes = d.free_by_pool.get((frag.get("request_pool"), frag.get("request_stream")), [])
            want("accounting.headroom_bytes", acc["headroom_bytes"], d.trace[index].get("device_free", 0) + sum(sizes))
    if index is not None and d.trace[index].get("action") == "oom" and j["what_if"].get("capacity_bytes") is not None:
        capacity = d.reserved_series[index] + d.trace[index].get("device_free", 0)
        if acc.get("device_total_bytes") is None:
            want("what_if.capacity_bytes (reserved + free at the OOM)", j["what_if"]["capacity_bytes"], capacity)
    device_total = metadata_total(r)
    if device_total is not None:
        want("accounting.device_total_bytes (the metadata's device)", acc["device_total_bytes"], device_total)
        if index is not None and d.trace[index].get("action") == "oom":
            outside = device_total - d.trace[index].get("device_free", 0) - d.reserved_series[index]
            want("accounting.non_pytorch_bytes (total - free - reserved at the OOM)", acc["non_pytorch_bytes"], outside)
    total = acc["allocated_bytes"] + acc["pending_free_bytes"] + acc["free_cached_bytes"]
    want("accounting: allocated + pending + cached free = reserved", total, acc["reserved_bytes"])
    want(
        "accounting: requested + rounding = allocated",
        acc["requested_bytes"] + acc["rounding_bytes"],
        acc["allocated_bytes"],
    )
    if acc.get("request_bytes") is not None and index is not None and d.trace[index].get("action") == "oom":
        want("accounting.request_bytes", acc["request_bytes"], d.trace[index].get("size"))
        want("accounting.message_bytes", acc["message_bytes"], message_size(d.trace[index]["size"]))
        want("accounting.device_free_bytes", acc.get("device_free_bytes"), d.trace[index].get("device_free"))
    rows = j.get("steps") or []
    for before, after in zip(rows, rows[1:]):
        if not (before["last_index"] < after["first_index"] and before["step"] < after["step"]):
            out.append(f"steps {before['step']} and {after['step']} overlap or are out of order")
    if rows and not (0 <= rows[0]["first_index"] and rows[-1]["last_index"] < len(d.trace)):
        out.append("the steps reach outside the trace")
    for block in j.get("live_blocks") or []:
        n = block.get("alloc_index")
        if n is not None:
            e = d.trace[n] if 0 <= n < len(d.trace) else {}
            want(
                f"live block {block['address']:#x}'s alloc event",
                (e.get("action"), e.get("addr")),
                ("alloc", block["address"]),
            )
            row_of = [row["step"] for row in rows if row["first_index"] <= n <= row["last_index"]]
            if row_of and block.get("step") is not None:
                want(f"live block {block['address']:#x}'s step (the row holding its alloc)", block["step"], row_of[0])
    holding = [row["step"] for row in rows if index is not None and row["first_index"] <= index <= row["last_index"]]
    if holding and j.get("target_step") is not None:
        want("target_step (the step row holding the judged event)", j["target_step"], holding[0])
    for row in rows:
        first, last = row["first_index"], row["last_index"]
        if d.series and 0 <= first <= last < len(d.series):
            want(
                f"step {row['step']} peak ({first}-{last})",
                row["peak_allocated_bytes"],
                max(d.series[first : last + 1]),
            )
            want(f"step {row['step']} end ({last})", row["end_allocated_bytes"], d.series[last])
    blocks = sum(c["block_count"] for c in j["component_detail"])
    live_blocks = d.live_blocks if index is None else d.live_counts[index]
    want("the components' blocks are the live blocks at the judged moment", blocks, live_blocks)
    components = sum(j["components"].values())
    want("the components add up to the judged moment's allocated bytes", components, replay["target_allocated_bytes"])
    if at_dump and not d.expandable and index is None:
        want("accounting.releasable_bytes (dump)", acc["releasable_bytes"], d.releasable)
    if d.trace:
        before, freed_at = pre_trace(d)
        want("replay.pre_existing_allocations", replay["pre_existing_allocations"], len(before))
        requested = [d.trace[i] for i in freed_at.values() if d.trace[i].get("action") != "free_completed"]
        true = sum(round_size(e.get("size", 0)) for e in requested) + sum(
            d.live_at_dump[a] for a in before - set(freed_at)
        )
        want("replay.pre_existing_bytes", replay["pre_existing_bytes"], true)
        if index is not None:
            want("replay.events_after_target", replay["events_after_target"], len(d.trace) - 1 - index)
    _torch_peak_mismatches(r, d, replay, out)
    for item in j.get("evidence") or []:
        m = re.search(r"\bat the (peak|dump|OOM)\b", item.get("text") or "")
        if item.get("metric") == "allocated_bytes" and m:
            want(
                f"evidence {item['text']!r}",
                item["bytes"],
                replay["peak_allocated_bytes"] if m.group(1) == "peak" else replay["target_allocated_bytes"],
            )
    return out


def _torch_peak_mismatches(r: Reports, d: Device, replay: dict[str, Any], out: list[str]) -> None:
    """`replay.torch_peak_at_most_bytes`, the most torch's own peak may be over the trace: none
    without an alloc to make a peak; at least the peak; with expandable segments the peak itself; else
    at most the checker's own cruder bound (the peak, plus the most over the allocs of 1 MiB for each
    live block above 1 MiB counted at a rounded request, when no max_split_size lets a block stay
    whole by more). Where
    oomdoctor's metadata records torch's own peak and nothing predates the trace, the bound holds it."""
    at_most, peak = replay.get("torch_peak_at_most_bytes"), replay["peak_allocated_bytes"]
    allocs = [i for i, e in enumerate(d.trace) if e.get("action") == "alloc"]
    if not allocs:
        if at_most is not None:
            out.append(f"torch_peak_at_most_bytes without an alloc in the trace: {at_most!r}, not None")
        return
    if at_most is None or at_most < peak:
        out.append(f"torch_peak_at_most_bytes {at_most!r} is not at least the peak {peak}")
        return
    settings = r.raw.get("allocator_settings") if isinstance(r.raw, dict) else None
    settings = settings if isinstance(settings, dict) else None
    expandable = bool(settings.get("expandable_segments")) if settings is not None else d.expandable
    max_split = settings.get("max_split_size", -1) if settings is not None else -1
    if expandable and at_most != peak:
        out.append(f"torch_peak_at_most_bytes {at_most} above the peak {peak} with expandable segments")
    elif isinstance(max_split, int) and not 0 < max_split < 1 << 62:
        crude = peak + max(MIB * d.unsized_series[i] for i in allocs)
        if at_most > crude:
            out.append(f"torch_peak_at_most_bytes {at_most} above the checker's bound {crude}")
    metadata = r.raw.get("oomdoctor") if isinstance(r.raw, dict) else None
    stats = metadata.get("memory_stats") if isinstance(metadata, dict) else None
    torch_peak = stats.get("peak_allocated_bytes") if isinstance(stats, dict) else None
    if isinstance(torch_peak, int) and replay["pre_existing_allocations"] == 0 and not peak <= torch_peak <= at_most:
        out.append(f"torch's own peak {torch_peak} (the metadata's) is not within [{peak}, {at_most}]")


@pytest.mark.parametrize("key", input_params())
def test_json_figures_are_the_files(key):
    r = reports_of(key)
    found = json_mismatches(r)
    assert not found, "\n  ".join(found)


# ---- the text and Markdown reports, read by their wording --------------------------------------------

_SIZE = r"(-?\d+(?:\.\d+)? (?:bytes?|KiB|MiB|GiB|TiB))"
ESTIMATED = " (an estimate, as laid out)"  # a figure of the layout rebuilt back from the dump


def shown(size: int | None) -> str:
    """A size as the reports print it (units of 1024, two decimals, whole bytes below 1 KiB)."""
    if size is None:
        return "unknown"
    value, sign = abs(size), "-" if size < 0 else ""
    if value < 1024:
        return f"{sign}{value} byte{'' if value == 1 else 's'}"
    for unit in ("KiB", "MiB", "GiB"):
        value /= 1024
        if value < 1024:
            return f"{sign}{value:.2f} {unit}"
    return f"{sign}{value / 1024:.2f} TiB"


def plain(line: str) -> str:
    """A Markdown line without its emphasis and code marks (the text report's wording is then the same)."""
    return line.replace("**", "").replace("`", "").replace("&nbsp;", "").strip()


@dataclass
class Moment:
    """What the file says of the moment a report judges, on its device."""

    d: Device
    kind: str  # "oom", "peak", "dump"
    index: int | None

    @property
    def at_dump(self) -> bool:
        """Whether the dump's blocks are the moment's: the dump itself, or nothing but the OOM after it."""
        if self.index is None:
            return True
        return all(e.get("action") == "oom" for e in self.d.trace[self.index + 1 :])

    @property
    def replayed(self) -> bool:
        """Whether blocks were allocated or freed after the moment: the layout there is rebuilt back
        from the dump, blocks freed since at their rounded requests, so its figures are estimates."""
        if self.index is None:
            return False
        later = self.d.trace[self.index + 1 :]
        return any(e.get("action") in ("alloc", "free_requested", "free_completed") for e in later)

    @property
    def allocated(self) -> int:
        return self.d.allocated if self.index is None else self.d.series[self.index]

    @property
    def reserved(self) -> int:
        return self.d.reserved if self.index is None else self.d.reserved_series[self.index]

    @property
    def oom(self) -> dict[str, Any] | None:
        if self.index is None or self.d.trace[self.index].get("action") != "oom":
            return None
        return self.d.trace[self.index]


def metadata_total(r: Reports) -> int | None:
    """The device's total memory where oomdoctor's capture recorded it (the dump's `oomdoctor` key)."""
    meta = r.raw.get("oomdoctor") if isinstance(r.raw, dict) else None
    return ((meta or {}).get("device") or {}).get("total_memory_bytes")


def moment_of(r: Reports) -> Moment:
    replay = r.json["replay"]
    d = r.facts.get(r.json["device"], Device())
    return Moment(d, replay["target_kind"], replay.get("target_index"))


def pre_trace(d: Device) -> tuple[set[int], dict[int, int]]:
    """The blocks from before the trace: their addresses, and for those it frees the event that does."""
    allocated_in_trace, freed_at, seen = set(), {}, set()
    for i, e in enumerate(d.trace):
        addr = e.get("addr")
        if e.get("action") == "alloc":
            allocated_in_trace.add(addr)
            seen.add(addr)
        elif e.get("action") in _FREES and addr not in seen:
            seen.add(addr)
            freed_at[addr] = i
    never_freed = {a for a in d.live_at_dump if a not in allocated_in_trace and a not in freed_at}
    return set(freed_at) | never_freed, freed_at


_UNIT_BYTES = {"byte": 1, "bytes": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}


def _parse(printed: str) -> float:
    number, unit = printed.split()
    return float(number) * _UNIT_BYTES[unit]


def _ratio(top: float, bottom: float, printed: str) -> str:
    """The printed ratio when the printed sizes it divides allow it (each within half its last
    digit), else the ratio of the printed sizes."""
    true = top / bottom if bottom else float("inf")
    return printed if abs(float(printed) - true) <= 0.05 + 0.01 * true else f"{true:.1f}"


def _end_note(m: Moment, row: dict[str, Any]) -> str:
    """What a step row's last figure is when not the end of a step: after the judged OOM (events of
    the step follow it), or at it (the step's last event is the OOM)."""
    if m.oom is None or m.index is None or not row["first_index"] <= m.index <= row["last_index"]:
        return ""
    return "at the OOM" if m.index == row["last_index"] else "after the OOM"


def text_figures(r: Reports, report: str) -> list[tuple[str, str, str]]:
    """(what, as printed, as the file says) for every figure of the text or Markdown report that
    the file decides; the caller compares the last two."""
    m = moment_of(r)
    d = m.d
    j = r.json
    out: list[tuple[str, str, str]] = []
    lines = [plain(line) for line in report.splitlines()]

    def add(what: str, printed: str, true: Any) -> None:
        out.append((what, printed, true if isinstance(true, str) else shown(true)))

    steps = {row["step"]: row for row in j.get("steps") or []}
    steps_said: int | None = None  # the steps the table's heading counts, where it leaves some out
    total_components = sum(j["components"].values()) or 1
    blocks_of = {c["name"]: c["block_count"] for c in j["component_detail"]}
    in_memory = None
    bound_said = False
    at_most = j["replay"].get("torch_peak_at_most_bytes")
    peak = j["replay"]["peak_allocated_bytes"]
    for line in lines:
        cells = [c.strip().replace("\\", "") for c in line.strip("|").split("|")] if line.startswith("|") else None
        # the figures of the layout rebuilt at the moment: each line says it is an estimate where blocks
        # were allocated or freed after the moment, and only there
        layout_line = (
            (cells and cells[0].removesuffix(ESTIMATED) in ("cached, free", "releasable", "fragments"))
            or re.match(r"cached, free\s", line)
            or re.search(r"pool on (?:this|the request's) stream: ", line)
            or "free cached blocks: " in line
            or "would fit if contiguous: " in line
            or "but in pieces: the largest was " in line  # the fragmentation verdict's sentence
            or line.startswith(("- free cached bytes usable for the request", "- largest usable free block"))
        )
        if layout_line:
            said = "an estimate, as laid out" in line
            add(f"says whether it is an estimate: {line[:40]!r}", str(said), str(m.replayed))
        if cells and cells[0].endswith(ESTIMATED):
            cells[0] = cells[0].removesuffix(ESTIMATED)
        if g := re.search(
            r"how much higher torch's own peak \(max_memory_allocated\) is: up to " + _SIZE + " more", line
        ):
            bound_said = True
            add("how much higher torch's own peak may be", g.group(1), at_most - peak if at_most is not None else None)
        if line.startswith(("Memory ", "### Memory ")):
            in_memory = True
        elif not line or line.startswith("#") and not line.startswith("### Memory"):
            in_memory = in_memory and not line.startswith("#")
        # the moment the report judges
        if g := re.match(
            r"Device (\d+) (at the OOM|at the peak|when the dump was written) \(.*?(?:event (\d+) of (\d+))?;", line
        ):
            if (h := re.search(r"\((?:step (\d+)(?: of the trace)?, )", line)) and m.index is not None:
                holding = [row["step"] for row in steps.values() if row["first_index"] <= m.index <= row["last_index"]]
                if holding:
                    add("the judged event's step (the step row holding it)", h.group(1), str(holding[0]))
            if g.group(4):
                add("trace entries", g.group(4), str(len(d.trace)))
                index = int(g.group(3))
                if g.group(2) == "at the OOM":
                    add(
                        "the OOM's event is an oom entry",
                        d.trace[index].get("action") if index < len(d.trace) else "-",
                        "oom",
                    )
                if g.group(2) == "at the peak" and d.peak:
                    add("the peak's event", g.group(3), str(d.peak[1]))
        for g in re.finditer(r"\bthe figures describe the (peak|dump) \(" + _SIZE + r" allocated\)", line):
            add(f"the {g.group(1)}'s total", g.group(2), d.peak[0] if g.group(1) == "peak" and d.peak else d.allocated)
        for g in re.finditer(r"\bat the dump \(" + _SIZE + r" allocated\)", line):
            add("the dump's total", g.group(1), d.allocated)
        if g := re.search(r"allocated bytes at the (peak|dump|OOM): " + _SIZE, line):
            true = {"peak": d.peak[0] if d.peak else None, "dump": d.allocated, "OOM": m.allocated}[g.group(1)]
            add(f"allocated bytes at the {g.group(1)}", g.group(2), true)
        if g := re.search(r"the dump was written (\d+) events? after the target", line):
            add("events after the target", g.group(1), str(len(d.trace) - 1 - (m.index or 0)))
        if g := re.search(r"(\d+) allocations? predates? the trace", line):
            add("allocations before the trace", g.group(1), str(len(pre_trace(d)[0])))
        if g := re.search(r"(\d+) of the blocks live at the target predate the trace and carry no stack", line):
            before, freed_at = pre_trace(d)  # freed after the target: no stack in the dump
            live = [
                a
                for a in before
                if (a not in freed_at and a in d.stackless_at_dump)
                or (m.index is not None and freed_at.get(a, -1) > m.index)
            ]
            add("blocks from before the trace live at the target", g.group(1), str(len(live)))
        if g := re.search(r"its trace holds only (\d+) entr", line) or re.search(
            r"the trace holds only (\d+) entr", line
        ):
            add("trace entries", g.group(1), str(len(d.trace)))
        # the OOM
        oom = m.oom
        if oom is not None:
            if g := re.search(
                r"failed request\s+" + _SIZE + r'\s+\(the OOM message would say "Tried to allocate ' + _SIZE, line
            ):
                add("failed request", g.group(1), oom["size"])
                add("Tried to allocate", g.group(2), message_size(oom["size"]))
            if cells and cells[0] == "failed request":
                add("failed request (md)", cells[1], oom["size"])
                add("failed request bytes (md)", cells[2], f"{oom['size']:,}")
            if cells and cells[0].startswith('"Tried to allocate"'):
                add("Tried to allocate (md)", cells[1], message_size(oom["size"]))
            if g := re.search(r"failed request \(rounded\): " + _SIZE, line):
                add("failed request (rounded)", g.group(1), oom["size"])
            if g := re.search(r"what the OOM message calls Tried to allocate: " + _SIZE, line):
                add("Tried to allocate", g.group(1), message_size(oom["size"]))
            if g := re.search(r"(?<!\+ )free device memory at the OOM: " + _SIZE, line):
                add("free device memory at the OOM", g.group(1), oom.get("device_free"))
            if g := re.search(r"^free on the device\s+" + _SIZE, line):
                add("free on the device", g.group(1), oom.get("device_free"))
            if cells and cells[0] == "free on the device":
                add("free on the device (md)", cells[1], oom.get("device_free"))
            capacity = m.reserved + oom.get("device_free", 0)
            if g := re.search(
                r"(?:reserved \+ free device memory at the OOM|capacity available to PyTorch): " + _SIZE, line
            ):
                add("reserved + free at the OOM", g.group(1), capacity)
            if g := re.search(
                r"PyTorch could use only " + _SIZE + r" of this device \(reserved \+ free at the OOM\)", line
            ):
                add("reserved + free at the OOM", g.group(1), capacity)
            if g := re.search(r"but PyTorch could have at most " + _SIZE + r" on this device", line):
                add("reserved + free at the OOM (at most)", g.group(1), capacity)
            if g := re.search(r"One allocation of " + _SIZE + r" failed: (\d+)% of what PyTorch could have", line):
                add("the one allocation", g.group(1), oom["size"])
                add("its share of reserved + free", g.group(2), f"{oom['size'] / capacity:.0%}".rstrip("%"))
            if g := re.search(
                _SIZE
                + r" sat free in PyTorch's cache for this pool and stream, more than the "
                + _SIZE
                + r" request, but in pieces: the largest was "
                + _SIZE,
                line,
            ):
                if m.at_dump:
                    pool = (j["fragmentation"]["request_pool"], j["fragmentation"]["request_stream"])
                    sizes = d.free_by_pool.get(pool, [])
                    add("free in the request's pool", g.group(1), sum(sizes))
                    add("largest free block there", g.group(3), max(sizes, default=0))
                add("the request", g.group(2), oom["size"])
            usable = None
            if m.at_dump and j["fragmentation"]["request_pool"] is not None:
                pool = (j["fragmentation"]["request_pool"], j["fragmentation"]["request_stream"])
                usable = d.free_by_pool.get(pool, [])
            if usable is not None and (g := re.search(r"bytes missing for the request: " + _SIZE, line)):
                add("bytes missing", g.group(1), max(0, oom["size"] - oom.get("device_free", 0) - sum(usable)))
            if g := re.search(
                r"bytes missing by count \(the request failed on placement: the largest usable free block was "
                + _SIZE
                + r", and cudaMalloc needed "
                + _SIZE
                + r" with "
                + _SIZE
                + r" free\): "
                + _SIZE,
                line,
            ):
                if usable is not None:
                    add("largest usable free block", g.group(1), max(usable, default=0))
                    add(
                        "bytes missing by count",
                        g.group(4),
                        max(0, oom["size"] - oom.get("device_free", 0) - sum(usable)),
                    )
                add("what cudaMalloc needed", g.group(2), message_size(oom["size"]))
                add("free on the device", g.group(3), oom.get("device_free"))
        if g := re.match(r"OOM events on this device: (\d+)", line):
            add("OOM events", g.group(1), str(sum(1 for e in d.trace if e.get("action") == "oom")))
        if g := re.match(r"event (\d+): " + _SIZE + r"\s+\((?:fatal|recovered)", line):
            e = d.trace[int(g.group(1))] if int(g.group(1)) < len(d.trace) else {}
            add(
                f"OOM event {g.group(1)}", g.group(2), e.get("size") if e.get("action") == "oom" else "not an oom entry"
            )
        if g := re.search(r"the trace holds (\d+) events?, as many as the ring buffer keeps", line):
            add("trace entries", g.group(1), str(len(d.trace)))
        if g := re.search(r"no trace entry carries frames \((\d+) entr", line):
            add("trace entries", g.group(1), str(len(d.trace)))
            add("entries with frames", str(sum(1 for e in d.trace if e.get("frames"))), "0")
        if line.startswith(("Steps", "### Steps")):
            g = re.search(r"the last (\d+) of (\d+)\)$", line)
            steps_said = int(g.group(2)) if g else None
        # Memory at ...
        if in_memory:
            label, printed = None, None
            if cells and len(cells) >= 3 and re.fullmatch(_SIZE, cells[1]):
                label, printed = cells[0], cells[1]
                number = cells[2]
            elif g := re.match(
                r"(reserved by PyTorch|allocated|cached, free|pending free|free on the device|device total|outside PyTorch)\s+"
                + _SIZE,
                line,
            ):
                label, printed, number = g.group(1), g.group(2), None
            if label is not None:
                device_total = metadata_total(r)
                true = {
                    "device total": device_total,
                    "outside PyTorch": device_total - m.oom.get("device_free", 0) - m.reserved
                    if device_total and m.oom
                    else None,
                    "reserved by PyTorch": m.reserved,
                    "allocated": m.allocated,
                    "allocated (the peak)": m.allocated,
                }.get(label)
                if m.at_dump:
                    true = {"cached, free": d.free_cached, "pending free": d.pending}.get(label, true)
                if label.startswith("allocated (each live block") and m.at_dump:
                    true = d.allocated
                if true is not None:
                    add(f"Memory: {label}", printed, true)
                    if number is not None:
                        add(f"Memory: {label} in bytes", number, f"{true:,}")
            if cells and cells[0] in ("releasable", "fragments") and len(cells) >= 3:
                acc = j["accounting"]
                key = "releasable_bytes" if cells[0] == "releasable" else "non_releasable_bytes"
                add(f"{cells[0]} (md) is the JSON's", cells[2], f"{acc[key]:,}")
                if cells[0] == "fragments":
                    both = shown(acc["releasable_bytes"] + acc[key])
                    add("releasable + fragments = cached free (md)", both, shown(acc["free_cached_bytes"]))
            if g := re.search(
                r"cached, free\s+"
                + _SIZE
                + r"\s+\((?:an estimate, as laid out: )?releasable "
                + _SIZE
                + r", fragments "
                + _SIZE,
                line,
            ):
                acc = j["accounting"]
                add(
                    "releasable + fragments = cached free",
                    shown(acc["releasable_bytes"] + acc["non_releasable_bytes"]),
                    g.group(1),
                )
        # components: the JSON's bytes (a modelled split), their shares of the components' total
        if g := re.match(r"([a-z][a-z ]*?)\s+" + _SIZE + r"\s+(\d+\.\d)%\s+\((\d+) blocks?, ", line.strip()):
            name = g.group(1).replace(" ", "_")
            if name in j["components"]:
                add(f"component {name}", g.group(2), j["components"][name])
                add(f"component {name} share", g.group(3), f"{100 * j['components'][name] / total_components:.1f}")
                add(f"component {name} blocks", g.group(4), str(blocks_of[name]))
        if (
            cells
            and len(cells) >= 6
            and cells[0].replace(" ", "_") in j["components"]
            and re.fullmatch(_SIZE, cells[1])
        ):
            name = cells[0].replace(" ", "_")
            add(f"component {name} (md)", cells[1], j["components"][name])
            add(f"component {name} bytes (md)", cells[2], f"{j['components'][name]:,}")
            add(f"component {name} share (md)", cells[3], f"{100 * j['components'][name] / total_components:.1f}%")
            add(f"component {name} blocks (md)", cells[4], str(blocks_of[name]))
        for g in re.finditer(
            r"(?:At the|at the) (peak|OOM|dump)(?: \([^)]*\))? (?:the largest part |it )?is [a-z -]+ \("
            + _SIZE
            + r", (\d+)%\)",
            line,
        ):
            moment_total = {"peak": d.peak[0] if d.peak else None, "dump": d.allocated, "OOM": m.allocated}[g.group(1)]
            if g.group(1) != "dump" or m.kind == "dump":
                if moment_total:
                    bytes_ = j["components"][max(j["components"], key=lambda k: j["components"][k])]
                    add(f"the largest part at the {g.group(1)}", g.group(2), bytes_)
                    add(f"its share at the {g.group(1)}", g.group(3), f"{100 * bytes_ / moment_total:.0f}")
            elif d.allocated:  # the dump's components are not in the JSON: the share of its printed size
                share = 100 * _parse(g.group(2)) / d.allocated
                said = g.group(3) if abs(int(g.group(3)) - share) <= 1 else f"{share:.0f}"
                add("the largest part's share at the dump", g.group(3), said)
        if (
            m.at_dump
            and m.index is None
            and (g := re.search(r"allocated\s+" + _SIZE + r"\s+\((?:.*; )?of which rounding " + _SIZE, line))
        ):
            add("rounding at the dump", g.group(2), d.allocated - d.requested)
        if m.at_dump and m.index is None and cells and cells[0] == "of which rounding":
            add("rounding at the dump (md)", cells[1], d.allocated - d.requested)
        if g := re.search(r"The (\d+) largest live blocks? \(of (\d+)\)", line):
            count = d.live_blocks if m.index is None else d.live_counts[m.index]
            add("live blocks at the judged moment", g.group(2), str(count))
            add("the largest live blocks listed", g.group(1), str(min(count, int(g.group(1)))))
        # the Markdown report's largest live blocks: each a block live at the moment, of its size there
        if g := re.match(
            r"(0x[0-9a-f]+) \(" + _SIZE + r", allocated (?:at event (\d+)|(before the trace began)"
            r"|at a time the file does not record \(no allocation history\))\):$",
            line,
        ):
            says_before = str(bool(g.group(4)))
            add(
                f"block {g.group(1)}: 'before the trace' only where there is one",
                says_before,
                str(bool(d.trace) and g.group(3) is None),
            )
            address = int(g.group(1), 16)
            if g.group(3) is not None:
                n = int(g.group(3))
                e = d.trace[n] if n < len(d.trace) else {}
                add(
                    f"block {g.group(1)}'s alloc event",
                    f"{e.get('action')} at {e.get('addr', -1):#x}",
                    f"alloc at {g.group(1)}",
                )
                later = [
                    i
                    for i, x in enumerate(d.trace[n + 1 :], n + 1)
                    if x.get("addr") == address and x.get("action") in _FREES
                ]
                live_at_dump = not later and address in d.live_at_dump
                add(
                    f"block {g.group(1)}'s size",
                    g.group(2),
                    d.live_at_dump[address] if live_at_dump else round_size(e.get("size", 0)),
                )
                if m.index is not None:
                    alive = n <= m.index and not any(i <= m.index for i in later)
                    add(f"block {g.group(1)} live at the judged moment", str(alive), "True")
            else:
                before, freed_at = pre_trace(d) if d.trace else (set(d.live_at_dump), {})
                add(f"block {g.group(1)} from before the trace", str(address in before), "True")
                if address in d.live_at_dump and address not in freed_at:
                    add(f"block {g.group(1)}'s size", g.group(2), d.live_at_dump[address])
        if g := re.search(r"what the blocks live at the dump without a stack are \((\d+)\)", line):
            add("live blocks without a stack", g.group(1), str(len(d.stackless_at_dump)))
        if g := re.search(
            r"PyTorch's cache holds more free than allocated: " + _SIZE + r" of the " + _SIZE + r" it reserves", line
        ):
            add("free in the cache", g.group(1), d.free_cached)
            add("reserved", g.group(2), d.reserved)
            if h := re.search(r"empty_cache\(\) would return " + _SIZE, line):
                if not d.expandable:
                    add("what empty_cache() returns", h.group(1), d.releasable)
        if g := re.search(
            r"Model states fill what PyTorch reserved \("
            + _SIZE
            + r" of "
            + _SIZE
            + r", "
            + _SIZE
            + r" free in the cache\)",
            line,
        ):
            add("reserved", g.group(2), d.reserved)
            add("free in the cache", g.group(3), d.free_cached)
        if in_memory and m.at_dump and not d.expandable and m.index is None:
            if g := re.search(
                r"cached, free\s+" + _SIZE + r"\s+\((?:an estimate, as laid out: )?releasable " + _SIZE, line
            ):
                add("releasable", g.group(2), d.releasable)
            if cells and cells[0] == "releasable":
                add("releasable (md)", cells[1], d.releasable)
        if m.at_dump and (
            g := re.search(
                r"free in the (large|small) pool on (?:this|the request's) stream: "
                + _SIZE
                + r",? largest block "
                + _SIZE,
                line,
            )
        ):
            sizes = d.free_by_pool.get((g.group(1), j["fragmentation"]["request_stream"]), [])
            add(f"free in the {g.group(1)} pool", g.group(2), sum(sizes))
            add(f"largest free block in the {g.group(1)} pool", g.group(3), max(sizes, default=0))
        if g := re.search(
            r"a "
            + _SIZE
            + r" request failed in cudaMalloc, the allocator freed "
            + _SIZE
            + r" of cache and retried it \(it succeeded at event (\d+)\)\. That one request is at least (\d+)% of the most"
            + r" the device could have held for PyTorch then \(under "
            + _SIZE
            + r"\)",
            line,
        ):
            n = int(g.group(3))
            e = d.trace[n] if n < len(d.trace) else {}
            add(
                "the retried request",
                g.group(1),
                e.get("size") if e.get("action") in ("segment_alloc", "segment_map") else "-",
            )
            first = n
            while first > 0 and d.trace[first - 1].get("action") in ("segment_free", "segment_unmap"):
                first -= 1
            add("the cache freed for it", g.group(2), sum(x.get("size", 0) for x in d.trace[first:n]))
            bound = (d.reserved_series[first - 1] if first else d.reserved_series[0]) + e.get("size", 0)
            add("the bound on what PyTorch could hold", g.group(5), bound)
            add("at least that share", str(min(int(g.group(4)), int(100 * e.get("size", 0) / bound))), g.group(4))
        if g := re.search(r"[Ll]argest scale that fits: (at most )?(\d+\.\d+)x", line):
            # a scale that fits: the what-if's fixed part and its scaled part fit the capacity at it
            w = j["what_if"]
            if w.get("capacity_bytes") is not None:
                need = w["fixed_bytes"] + float(g.group(2)) * w["scalable_bytes"]
                add("the what-if's need at the largest scale fits", str(need <= w["capacity_bytes"]), "True")
                # with the room it says it leaves for the cache's segments
                if r := re.search(r"with " + _SIZE + r" left for the cache's segments", line):
                    add("the room left for the cache's segments", r.group(1), w["cache_margin_bytes"])
                    room = w["capacity_bytes"] - need >= w["cache_margin_bytes"]
                    add("the largest scale leaves that room", str(room), "True")
            # by allocated bytes (the cache's layout at that size is not modelled beyond that room):
            # said so, and flagged in the JSON
            said = f"{g.group(0)} (an estimate by allocated bytes" in line
            add("the largest scale says it is an estimate by allocated bytes", str(said), "True")
            add(
                "the JSON flags the largest scale as by allocated bytes",
                str(w.get("largest_fitting_scale_by_allocated_bytes")),
                "True",
            )
        if g := re.search(
            r"end-of-step allocated memory grew over (\d+) consecutive steps?, (on average )?per step: " + _SIZE, line
        ):
            ends = [d.series[row["last_index"]] for row in list(steps.values())[:-1] if d.series]  # the last one failed
            growths = [after - before for before, after in zip(ends, ends[1:])][-int(g.group(1)) :]
            if growths:
                mean = sum(growths) // len(growths)
                exact = len(set(growths)) == 1
                add("end-of-step growth per step", g.group(3), mean)
                add("'on average' where the steps grew by different amounts", str(bool(g.group(2)) or exact), "True")
        if g := re.search(
            r"holds "
            + _SIZE
            + r" of copies(?: and asked for "
            + _SIZE
            + r" more)?, (\d+\.\d)x the "
            + _SIZE
            + r" of parameters",
            line,
        ):
            held = _parse(g.group(1)) + (_parse(g.group(2)) if g.group(2) else 0)
            add("the copies' ratio to the parameters", g.group(3), _ratio(held, _parse(g.group(4)), g.group(3)))
            if g.group(2) and oom is not None:
                add("what the save asked for", g.group(2), oom["size"])
        if g := re.search(
            r"Device (\d+) held "
            + _SIZE
            + r" at its OOM, (\d+\.\d)x the highest peak of every other device .*?\(device (\d+): "
            + _SIZE
            + r"\)",
            line,
        ):
            other = r.facts.get(int(g.group(4)), Device())
            if int(g.group(1)) == j["device"]:
                add("what the judged device held at its OOM", g.group(2), m.allocated)
            add(f"device {g.group(4)}'s peak", g.group(5), other.peak[0] if other.peak else None)
            add("the imbalance ratio", g.group(3), _ratio(_parse(g.group(2)), _parse(g.group(5)), g.group(3)))
        # the devices table: each device's own dump, trace and OOMs
        row = re.match(
            r"(\d+)(?: \(judged\))?\s{2,}"
            + _SIZE
            + r"\s{2,}"
            + _SIZE
            + r"\s{2,}("
            + _SIZE
            + r"|-)\s{2,}("
            + _SIZE
            + r"|-)\s{2,}(\d+|-)\s{2,}",
            line.strip(),
        )
        if (
            cells
            and len(cells) >= 6
            and re.fullmatch(r"\d+(?: \(judged\))?", cells[0])
            and re.fullmatch(_SIZE, cells[1])
        ):
            row_cells = (cells[0].split()[0], cells[1], cells[2], cells[3], cells[5], cells[4])
        elif row:
            row_cells = (row.group(1), row.group(2), row.group(3), row.group(4), row.group(8), row.group(6))
        else:
            row_cells = None
        if row_cells and len(r.facts) > 1:
            other = r.facts.get(int(row_cells[0]), Device())
            add(f"device {row_cells[0]} reserved at the dump", row_cells[1], other.reserved)
            add(f"device {row_cells[0]} allocated at the dump", row_cells[2], other.allocated)
            add(f"device {row_cells[0]} peak", row_cells[3], other.peak[0] if other.peak and other.trace else "-")
            judged_time = d.trace[m.index].get("time_us") if m.index is not None and d.trace else None
            if row_cells[0] == str(j["device"]):
                same_time = shown(m.allocated)
            elif other.trace and judged_time is not None:
                times = [e.get("time_us", 0) for e in other.trace]
                position = bisect.bisect_right(times, judged_time) - 1
                same_time = shown(other.series[position]) if position >= 0 else "-"
            else:
                same_time = None
            if same_time is not None and row_cells[5] is not None:
                add(f"device {row_cells[0]} at the same time", row_cells[5], same_time)
            ooms = sum(1 for e in other.trace if e.get("action") == "oom")
            add(f"device {row_cells[0]} OOMs", row_cells[4], str(ooms) if ooms else "-")
        if g := re.match(
            r"step (\d+)\s+peak\s+" + _SIZE + r"\s+(at its end|after OOM|at the OOM)\s+" + _SIZE, line.strip()
        ):
            row = steps.get(int(g.group(1)))
            if row and d.series:
                words = {"at its end": "", "after OOM": "after the OOM", "at the OOM": "at the OOM"}[g.group(3)]
                add(f"step {g.group(1)} end's words", words, _end_note(m, row))
                add(f"step {g.group(1)} peak", g.group(2), max(d.series[row["first_index"] : row["last_index"] + 1]))
                add(f"step {g.group(1)} end", g.group(4), d.series[row["last_index"]])
        if (
            cells
            and len(cells) == 4
            and cells[0].isdigit()
            and int(cells[0]) in steps
            and d.series
            and re.fullmatch(_SIZE, cells[1])
        ):
            row = steps[int(cells[0])]
            add(f"step {cells[0]} peak (md)", cells[1], max(d.series[row["first_index"] : row["last_index"] + 1]))
            end, _, note = cells[2].partition(" (")
            add(f"step {cells[0]} end (md)", end, d.series[row["last_index"]])
            add(f"step {cells[0]} end's note (md)", note.rstrip(")"), _end_note(m, row))
    material = at_most is not None and at_most - peak > 0 and at_most - peak >= 0.01 * peak
    out.append(("says how much higher torch's peak may be (1% of the peak or more)", str(bound_said), str(material)))
    rows_printed = len({what.split()[1] for what, _, _ in out if re.fullmatch(r"step \d+ peak(?: \(md\))?", what)})
    if rows_printed:
        said = steps_said if steps_said is not None else rows_printed
        out.append(("the steps the table shows or counts (of the JSON's)", str(said), str(len(steps))))
    return out


def text_mismatches(r: Reports, report: str) -> list[str]:
    return [
        f"{what}: printed {printed!r}, the file says {true!r}"
        for what, printed, true in text_figures(r, report)
        if printed != true
    ]


@pytest.mark.parametrize("key", input_params())
@pytest.mark.parametrize("fmt", ["text", "md"])
def test_printed_figures_are_the_files(key, fmt):
    r = reports_of(key)
    found = text_mismatches(r, getattr(r, fmt))
    assert not found, "\n  ".join(found)


# ---- the causes found, on made-up snapshots ----------------------------------------------------------


def _made_up(trace: list[dict[str, Any]]) -> Any:
    from oomdoctor.analysis import analyse
    from oomdoctor.load import load

    base = 0x7F0000000000
    blocks = [
        {"address": base, "size": 4 * MIB, "requested_size": 4 * MIB, "state": "active_allocated", "frames": []},
        {"address": base + 4 * MIB, "size": 16 * MIB, "requested_size": 0, "state": "inactive", "frames": []},
    ]
    segment = {
        "device": 0,
        "address": base,
        "total_size": 20 * MIB,
        "allocated_size": 4 * MIB,
        "active_size": 4 * MIB,
        "requested_size": 4 * MIB,
        "stream": 0,
        "segment_type": "large",
        "segment_pool_id": (0, 0),
        "is_expandable": False,
        "frames": [],
        "blocks": blocks,
    }
    for i, e in enumerate(trace):
        e.setdefault("stream", 0)
        e.setdefault("time_us", 1000 + i)
        e["addr"] = base + e["addr"]
    raw = {"segments": [segment], "device_traces": [trace]}
    return analyse(load(io.BytesIO(pickle.dumps(raw, protocol=4)))), raw


def _pre_trace_line(analysis) -> str:
    from oomdoctor.views import phrasing

    return next(line for line in phrasing.unknowns(analysis.unknowns) if "predate the trace;" in line)


def test_a_block_from_before_the_trace_freed_after_the_peak_is_one_allocation():
    # block A (4 MiB) lives throughout; B (4 MiB) from before the trace is freed after the peak
    analysis, raw = _made_up(
        [
            {"action": "alloc", "addr": 8 * MIB, "size": 8 * MIB},
            {"action": "free_requested", "addr": 8 * MIB, "size": 8 * MIB},
            {"action": "free_completed", "addr": 8 * MIB, "size": 8 * MIB},
            {"action": "free_requested", "addr": 4 * MIB, "size": 4 * MIB},
            {"action": "free_completed", "addr": 4 * MIB, "size": 4 * MIB},
        ]
    )
    assert analysis.replay.target_kind == "peak" and analysis.replay.target_index == 0
    assert analysis.replay.peak_allocated_bytes == 16 * MIB == facts_of(raw)[0].peak[0]
    assert analysis.replay.pre_existing_allocations == 2  # A and B, B once though freed after the peak
    assert _pre_trace_line(analysis).startswith("2 allocations predate the trace")


def test_a_free_completed_in_the_trace_but_requested_before_it_is_an_allocation_from_before_it():
    analysis, _ = _made_up(
        [
            {"action": "free_completed", "addr": 16 * MIB, "size": 4 * MIB},  # its free_requested came before
            {"action": "alloc", "addr": 4 * MIB, "size": 4 * MIB},
            {"action": "free_requested", "addr": 4 * MIB, "size": 4 * MIB},
            {"action": "free_completed", "addr": 4 * MIB, "size": 4 * MIB},
        ]
    )
    assert analysis.replay.pre_existing_allocations == 2  # A, and the block whose free completed
    assert _pre_trace_line(analysis).startswith("2 allocations predate the trace")


# ---- the checker itself ------------------------------------------------------------------------------

# figures every run of the checker must find somewhere (a wording change that silences one fails here)
MUST_READ = (
    "Memory: reserved by PyTorch",
    "Memory: allocated",
    "Memory: cached, free",
    "failed request",
    "Tried to allocate",
    "free on the device",
    "allocated bytes at the dump",
    "allocated bytes at the peak",
    "the dump's total",
    "the peak's total",
    "the largest part at the peak",
    "trace entries",
    "events after the target",
    "allocations before the trace",
    "step 0 peak",
    "step 0 end",
    "releasable",
    "live blocks without a stack",
    "bytes missing",
    "end-of-step growth per step",
    "rounding at the dump",
    "the largest part's share at the dump",
    "the judged event's step",
    "the what-if's need at the largest scale fits",
    "the largest scale says it is an estimate by allocated bytes",
    "the JSON flags the largest scale as by allocated bytes",
    "the copies' ratio to the parameters",
    "device 1 at the same time",
    "Memory: device total",
    "Memory: outside PyTorch",
    "says whether it is an estimate",
    "how much higher torch's own peak may be",
    "says how much higher torch's peak may be",
)
MUST_READ_MD = ("live blocks at the judged moment", "block 0x")  # the Markdown report's list of the largest blocks


def test_the_checker_reads_the_reports_figures():
    if CORPUS is None:
        pytest.skip("the corpus holds the traces these figures come from")
    read: dict[str, set[str]] = {"text": set(), "md": set()}
    for param in input_params():
        r = reports_of(param.values[0])
        for fmt in read:
            read[fmt] |= {what.removesuffix(" (md)") for what, _, _ in text_figures(r, getattr(r, fmt))}
    for fmt, kinds in read.items():
        must = MUST_READ + (MUST_READ_MD if fmt == "md" else ())
        missing = [kind for kind in must if not any(k.startswith(kind) for k in kinds)]
        assert not missing, (fmt, missing)


def test_the_checkers_own_arithmetic():
    assert [round_size(n) for n in (1, 512, 513, 1 << 20)] == [512, 512, 1024, 1 << 20]
    assert round_size(1200 << 20, 4) == 1280 << 20 and round_size(1 << 30, 4) == 1 << 30
    assert [message_size(n) for n in (512, MIB, MIB + 512, 11 * MIB)] == [2 * MIB, 2 * MIB, 20 * MIB, 12 * MIB]
    assert [shown(n) for n in (0, 1, 1023, 1024, 1536 * MIB)] == [
        "0 bytes",
        "1 byte",
        "1023 bytes",
        "1.00 KiB",
        "1.50 GiB",
    ]
    # a block from before the trace freed in it, one allocated and still live at the dump (its dump size)
    trace = [
        {"action": "alloc", "addr": 1, "size": 100},
        {"action": "free_requested", "addr": 2, "size": 1000},
        {"action": "alloc", "addr": 3, "size": 600},
        {"action": "free_completed", "addr": 2, "size": 1000},
        {"action": "free_requested", "addr": 1, "size": 100},
    ]
    assert allocated_series(trace, {3: 2048}) == [512 + 1024, 512, 512 + 2048, 512 + 2048, 2048]
    # the blocks counted at a rounded request above 1 MiB: one freed before the dump, not one live at it
    unsized: list[int] = []
    big = [
        {"action": "alloc", "addr": 1, "size": 3 * MIB},
        {"action": "alloc", "addr": 2, "size": 3 * MIB},
        {"action": "alloc", "addr": 3, "size": 4096},
        {"action": "free_requested", "addr": 1, "size": 3 * MIB},
    ]
    allocated_series(big, {2: 3 * MIB + 512}, unsized=unsized)
    assert unsized == [1, 1, 1, 0]
    assert reserved_series([{"action": "segment_alloc", "size": 10}, {"action": "segment_free", "size": 4}], 20) == [
        24,
        20,
    ]


def test_the_checker_catches_a_wrong_figure():
    name = MANIFEST["fixtures"][0]["name"]
    r = reports_of(("fixture", name, "stripped"))
    assert text_mismatches(r, r.text) == [] and json_mismatches(r) == []
    reserved = re.search(r"reserved by PyTorch\s+" + _SIZE, r.text)
    assert reserved is not None
    wrong = r.text.replace(reserved.group(1), shown(r.json["accounting"]["reserved_bytes"] + 3 * MIB), 1)
    assert any(m.startswith("Memory: reserved by PyTorch:") for m in text_mismatches(r, wrong))
    r.json["replay"]["event_count"] += 1
    try:
        assert any(m.startswith("replay.event_count") for m in json_mismatches(r))
    finally:
        r.json["replay"]["event_count"] -= 1


def test_the_checker_catches_an_estimate_not_said_and_a_bound_left_out():
    """A figure of a layout rebuilt back from the dump printed as if exact, the sentence on how much
    higher torch's own peak may be left out, and a JSON bound below the peak are each caught."""
    r = reports_of(("fixture", "no-oom-mlp-adam", "stripped"))
    for fmt in ("text", "md"):
        report = getattr(r, fmt)
        assert text_mismatches(r, report) == []
        unmarked = report.replace(ESTIMATED, "").replace("(an estimate, as laid out: ", "(")
        assert unmarked != report
        assert any(m.startswith("says whether it is an estimate") for m in text_mismatches(r, unmarked)), fmt
        unsaid = "\n".join(line for line in report.splitlines() if "torch's own peak" not in line)
        assert unsaid != report
        assert any(m.startswith("says how much higher torch's peak") for m in text_mismatches(r, unsaid)), fmt
    assert json_mismatches(r) == []
    bound = r.json["replay"]["torch_peak_at_most_bytes"]
    r.json["replay"]["torch_peak_at_most_bytes"] = r.json["replay"]["peak_allocated_bytes"] - 1
    try:
        assert any(m.startswith("torch_peak_at_most_bytes") for m in json_mismatches(r))
    finally:
        r.json["replay"]["torch_peak_at_most_bytes"] = bound


def format_mismatches(r: Reports, fmt: str) -> list[str]:
    """The modelled figures (evidence, savings, components' groups), which no reader of the file can
    recompute: the text and Markdown reports must print the JSON's, in its order."""
    report = getattr(r, fmt)
    j = r.json
    out = []
    section = report.split("Evidence", 1)[1] if "Evidence" in report else ""
    lines = [plain(line) for line in section.splitlines()[1:]]
    evidence_lines = []
    for line in lines:
        if not line.startswith("- "):
            if evidence_lines or (line and not line.startswith("#")):
                break
            continue
        evidence_lines.append(line)
    items = j.get("evidence") or []
    if len(evidence_lines) != len(items):
        out.append(f"{len(evidence_lines)} evidence lines for {len(items)} items")
    for line, item in zip(evidence_lines, items):
        if item.get("bytes") is not None:
            said = re.search(r": (" + _SIZE[1:-1] + r")(?:\s|$)", line)
            if not said or said.group(1) != shown(item["bytes"]):
                out.append(f"evidence {item['text']!r}: printed {line!r}, the JSON {shown(item['bytes'])}")
    # each saving as printed, with "at least" exactly where the JSON calls it a lower bound, the
    # bound on the run's peak exactly where the JSON gives one (a saving at the judged moment of what
    # is made again later), never above the saving, and "rule of thumb" exactly where the JSON
    # calls it one
    thumb = " (rule of thumb, not measured from the file)"
    peak_words = (
        r"(?: (?:at|when) [^;|\n]+; the next backward makes the gradients again, so the run's peak falls at most "
        + _SIZE
        + " below [^;|\n]+)?"
    )
    saves = (
        [
            (bound == "at least", size, peak or None, bool(said))
            for bound, size, peak, said in re.findall(
                r"saves (about|at least) " + _SIZE + peak_words + "(" + re.escape(thumb) + ")?", report
            )
        ]
        if fmt == "text"
        else []
    )
    if fmt == "md":
        table = report.split("### What to change", 1)[1].split("###", 1)[0] if "### What to change" in report else ""
        cells = [c.split("|")[3].strip() for c in table.splitlines() if re.match(r"\| \d+ \|", c)]
        saves = []
        for cell in cells:
            read = re.fullmatch(r"(at least )?" + _SIZE + peak_words + "(" + re.escape(thumb) + ")?", cell)
            saves.append(
                (bool(read.group(1)), read.group(2), read.group(3), bool(read.group(4)))
                if read
                else (False, cell, None, False)
            )
    recommendations = j.get("recommendations") or []
    wanted = [
        (
            bool(x.get("estimated_saved_is_lower_bound")),
            shown(x["estimated_saved_bytes"]),
            None if x.get("peak_saved_at_most_bytes") is None else shown(x["peak_saved_at_most_bytes"]),
            bool(x.get("estimated_saved_is_rule_of_thumb")),
        )
        for x in recommendations
    ]
    out += [
        f"{x['id']}: the run's peak said to fall by up to {x['peak_saved_at_most_bytes']}, more than the saving"
        for x in recommendations
        if (x.get("peak_saved_at_most_bytes") or 0) > x["estimated_saved_bytes"]
    ]
    if saves != wanted:
        out.append(f"savings printed {saves}, the JSON's {wanted}")
    return out


@pytest.mark.parametrize("key", input_params())
@pytest.mark.parametrize("fmt", ["text", "md"])
def test_modelled_figures_are_the_jsons(key, fmt):
    r = reports_of(key)
    found = format_mismatches(r, fmt)
    assert not found, "\n  ".join(found)


def test_without_any_history_no_block_is_said_to_predate_a_trace():
    """The Markdown report's largest blocks and the app's block labels, for a snapshot taken with no
    allocation history: there is no trace for a block to be older than."""
    from oomdoctor.tui import content

    name = MANIFEST["fixtures"][0]["name"]
    r = reports_of(("fixture", name, "bare"))
    assert r.json["replay"]["event_count"] == 0 and r.json["live_blocks"]
    assert "before the trace began" not in r.md and "no allocation history" in r.md
    from oomdoctor.analysis import analyse
    from oomdoctor.load import load

    analysis = analyse(load(io.BytesIO(pickle.dumps(_fixture_raw(name, "bare"), protocol=4))))
    labels = [row.label for row in content.allocation_rows(analysis)]
    assert labels and not any("before the trace" in label for label in labels), labels[:3]
