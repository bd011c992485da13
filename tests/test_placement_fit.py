"""A request that failed for want of one place (the free bytes added up to it, no single block took
it) is helped only by a change that leaves a place: freeing known blocks fits where the layout at
the OOM shows their freeing makes a run of free blocks large enough in the request's pool (or
segments wholly free that the allocator's retry releases); a change that frees blocks elsewhere is
not said to fit."""

from __future__ import annotations

from oomdoctor.analysis import analyse
from oomdoctor.analysis.accounting import place_after_freeing
from oomdoctor.model import ACTIVE_ALLOCATED, INACTIVE, Block, DeviceTrace, Frame, Segment, Snapshot, TraceEvent
from tests.builders import FORWARD_STACK, SETUP_STACK, MiB, metadata_fields

BASE = 0x7F0000000000
BACKWARD = (Frame("train.py", 42, "train_step"),)


def _segment(base: int, blocks: list[tuple[int, bool]]) -> Segment:
    """A segment of consecutive blocks (MiB, live)."""
    out, at = [], base
    for mib, live in blocks:
        size = mib * MiB
        out.append(Block(at, size, size if live else 0, ACTIVE_ALLOCATED if live else INACTIVE))
        at += size
    return Segment(device=0, address=base, total_size=at - base, stream=0, segment_type="large", blocks=tuple(out))


def test_freeing_a_block_between_two_holes_makes_their_run():
    segment = _segment(BASE, [(4, True), (4, False), (4, True), (4, False), (4, True)])
    middle = BASE + 8 * MiB
    common = dict(request_stream=0, device_free_bytes=0, message_bytes=12 * MiB)
    assert place_after_freeing([segment], {middle}, request_bytes=12 * MiB, **common)
    assert not place_after_freeing([segment], {middle}, request_bytes=16 * MiB, **common)
    assert not place_after_freeing([segment], set(), request_bytes=12 * MiB, **common)
    other = _segment(BASE + (1 << 30), [(12, True)])  # freeing a whole segment elsewhere: released on the retry
    assert not place_after_freeing([segment, other], set(), request_bytes=16 * MiB, **common)
    assert place_after_freeing(
        [segment, other],
        {BASE + (1 << 30)},
        request_bytes=16 * MiB,
        **{**common, "message_bytes": 16 * MiB, "device_free_bytes": 4 * MiB},
    )


def test_stale_gradients_between_live_blocks_leave_no_place_for_the_request():
    """Each of step 0's gradients sits at the head of a segment whose tail step 1's code filled
    before its forward: zero_grad frees 4 MiB holes, and the 32 MiB request still finds no place
    (by count the 16 MiB it frees covers the 8 MiB the largest free block lacked)."""
    t = [1_700_000_000_000_000]

    def tick() -> int:
        t[0] += 10
        return t[0]

    events: list[TraceEvent] = []
    markers = []
    segments = []
    tensors = []
    for i in range(4):  # parameters
        base = BASE + i * 0x10000000
        events += [
            TraceEvent("segment_alloc", base, 2 * MiB, 0, (), tick()),
            TraceEvent("alloc", base, 2 * MiB, 0, SETUP_STACK, tick()),
        ]
        segments.append(_segment(base, [(2, True)]))
        tensors.append({"address": base, "device": 0, "component": "parameter", "name": f"w{i}", "size_bytes": 2 * MiB})
    markers += [{"phase": "backward", "edge": "start", "step": 0, "time_us": tick()}]
    for i in range(4):  # step 0's gradients, then step 1's activations after each
        base = BASE + (16 + i) * 0x10000000
        events += [
            TraceEvent("segment_alloc", base, 20 * MiB, 0, (), tick()),
            TraceEvent("alloc", base, 4 * MiB, 0, BACKWARD, tick()),
        ]
        tensors.append(
            {"address": base, "device": 0, "component": "gradient", "name": f"w{i}.grad", "size_bytes": 4 * MiB}
        )
    markers += [
        {"phase": "backward", "edge": "end", "step": 0, "time_us": tick()},
        {"phase": "optimizer_step", "edge": "start", "step": 0, "time_us": tick()},
        {"phase": "optimizer_step", "edge": "end", "step": 0, "time_us": tick()},
    ]
    for i in range(4):
        base = BASE + (16 + i) * 0x10000000
        events.append(TraceEvent("alloc", base + 4 * MiB, 16 * MiB, 0, FORWARD_STACK, tick()))
        segments.append(_segment(base, [(4, True), (16, True)]))
    big = BASE + 40 * 0x10000000
    events += [
        TraceEvent("segment_alloc", big, 40 * MiB, 0, (), tick()),
        TraceEvent("alloc", big, 8 * MiB, 0, FORWARD_STACK, tick()),
        TraceEvent("alloc", big + 8 * MiB, 24 * MiB, 0, FORWARD_STACK, tick()),
        TraceEvent("alloc", big + 32 * MiB, 8 * MiB, 0, FORWARD_STACK, tick()),
        TraceEvent("free_requested", big + 8 * MiB, 24 * MiB, 0, FORWARD_STACK, tick()),
        TraceEvent("free_completed", big + 8 * MiB, 24 * MiB, 0, FORWARD_STACK, tick()),
    ]
    segments.append(_segment(big, [(8, True), (24, False), (8, True)]))
    events.append(TraceEvent("oom", 0, 32 * MiB, 0, FORWARD_STACK, tick(), device_free=8 * MiB))
    reserved = sum(s.total_size for s in segments)
    meta = {
        "schema_version": 1,
        "device": {"index": 0, "name": "Simulated", "total_memory_bytes": reserved + 8 * MiB},
        "markers": markers,
        "tensors": tensors,
    }
    snapshot = Snapshot(
        segments=tuple(sorted(segments, key=lambda s: s.address)),
        traces=(DeviceTrace.from_events(0, tuple(events)),),
        **metadata_fields(meta),
    )
    analysis = analyse(snapshot)
    fits = {r.id: r.would_fit_alone for r in analysis.recommendations}
    assert "zero-grad-set-to-none" in fits
    assert fits["zero-grad-set-to-none"] is None
