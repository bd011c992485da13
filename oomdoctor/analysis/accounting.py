"""Accounting of device memory at the target event, and the fragmentation tests (spec §7.5).

device total = non-PyTorch + device free + reserved
reserved     = allocated + pending free + free cached (releasable + non-releasable)
allocated    = requested + rounding
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from oomdoctor.analysis.results import Accounting, Fragmentation, PoolFree, SegmentDetail, Unknown, UnknownKind
from oomdoctor.analysis.sizing import LARGE_SEGMENT_BYTES, SMALL_SEGMENT_BYTES, pool_of, segment_size
from oomdoctor.dump_metadata import DumpMetadata
from oomdoctor.model import ACTIVE_ALLOCATED, ACTIVE_PENDING_FREE, INACTIVE, AllocatorSettings, Segment


def pool_label(segment: Segment) -> str:
    if tuple(segment.pool_id) != (0, 0):
        return f"private {tuple(segment.pool_id)} {segment.segment_type}"
    return segment.segment_type


def device_total(metadata: DumpMetadata | None) -> int | None:
    """The device's total memory as the metadata records it (the first non-zero of the OOM's, the
    device's, mem_get_info's, a rehearsal's), or None."""
    if metadata is None:
        return None
    oom, device, info, rehearsal = metadata.oom, metadata.device, metadata.mem_get_info, metadata.rehearsal
    for total in (
        oom.device_total_bytes if oom is not None else None,
        device.total_memory_bytes if device is not None else None,
        info.total_bytes if info is not None else None,
        rehearsal.device_memory_bytes if rehearsal is not None else None,
    ):
        if total:
            return total
    return None


def _releasable_bytes(segment: Segment) -> int:
    if not segment.is_expandable:
        return segment.total_size if all(b.state == INACTIVE for b in segment.blocks) else 0
    page = SMALL_SEGMENT_BYTES if segment.segment_type == "small" else LARGE_SEGMENT_BYTES
    releasable = 0
    for block in segment.blocks:
        if block.state != INACTIVE:
            continue
        first_page = -(-(block.address - segment.address) // page)
        end_page = (block.address + block.size - segment.address) // page
        releasable += max(0, end_page - first_page) * page
    return releasable


def account(
    segments: Sequence[Segment],
    *,
    request_bytes: int | None,
    device_free_bytes: int | None,
    device_total_bytes: int | None,
    request_stream: int | None,
    fragmentation: Fragmentation | None = None,
    large_segment: int = LARGE_SEGMENT_BYTES,
) -> Accounting:
    reserved = allocated = pending = requested = releasable = 0
    for segment in segments:
        reserved += segment.total_size
        releasable += _releasable_bytes(segment)
        for block in segment.blocks:
            if block.state == ACTIVE_ALLOCATED:
                allocated += block.size
                requested += min(block.requested_size, block.size)
            elif block.state == ACTIVE_PENDING_FREE:
                pending += block.size
    free_cached = reserved - allocated - pending
    unknowns = []
    non_pytorch = None
    if device_total_bytes is None:
        unknowns.append(Unknown(UnknownKind.NO_DEVICE_TOTAL))
    elif device_free_bytes is None:
        unknowns.append(Unknown(UnknownKind.NO_DEVICE_FREE))
    else:
        non_pytorch = device_total_bytes - device_free_bytes - reserved
    headroom = missing = None
    if request_bytes is not None and device_free_bytes is not None:
        usable = fragmentation.usable_free_bytes if fragmentation is not None else free_cached
        headroom = device_free_bytes + usable
        missing = max(0, request_bytes - headroom)
    return Accounting(
        device_total_bytes=device_total_bytes,
        device_free_bytes=device_free_bytes,
        non_pytorch_bytes=non_pytorch,
        reserved_bytes=reserved,
        allocated_bytes=allocated,
        pending_free_bytes=pending,
        free_cached_bytes=free_cached,
        releasable_bytes=releasable,
        non_releasable_bytes=free_cached - releasable,
        requested_bytes=requested,
        rounding_bytes=allocated - requested,
        request_bytes=request_bytes,
        message_bytes=segment_size(request_bytes, large_segment) if request_bytes is not None else None,
        headroom_bytes=headroom,
        missing_bytes=missing,
        unknowns=tuple(unknowns),
    )


def fragmentation_of(
    segments: Sequence[Segment],
    *,
    request_bytes: int | None,
    request_stream: int | None,
    settings: AllocatorSettings | None,
    device_free_bytes: int | None,
    expandable_seen: bool | None = None,
) -> Fragmentation:
    """`expandable_seen`: whether expandable segments were on by the dump's own segments
    (`reading.expandable_from_segments`), for when the settings are not recorded."""
    pools: dict[tuple[str, int], list[int]] = {}
    details = []
    internal = external = 0
    for segment in segments:
        label = pool_label(segment)
        entry = pools.setdefault((label, segment.stream), [0, 0, 0])
        seg_allocated = seg_pending = seg_free = seg_largest = 0
        for block in segment.blocks:
            if block.state == INACTIVE:
                seg_free += block.size
                seg_largest = max(seg_largest, block.size)
                entry[0] += block.size
                entry[1] += 1
                entry[2] = max(entry[2], block.size)
            elif block.state == ACTIVE_ALLOCATED:
                seg_allocated += block.size
                internal += max(0, block.size - block.requested_size)
            else:
                seg_pending += block.size
        external += seg_free
        details.append(
            SegmentDetail(
                address=segment.address,
                total_bytes=segment.total_size,
                allocated_bytes=seg_allocated,
                pending_free_bytes=seg_pending,
                free_bytes=seg_free,
                largest_free_block_bytes=seg_largest,
                block_count=len(segment.blocks),
                stream=segment.stream,
                pool=label,
                is_expandable=segment.is_expandable,
            )
        )
    request_pool = pool_of(request_bytes) if request_bytes is not None else None
    usable = (
        pools.get((request_pool, request_stream), [0, 0, 0])
        if request_pool and request_stream is not None
        else [0, 0, 0]
    )
    if request_pool and request_stream is None:
        matching = [v for (label, _), v in pools.items() if label == request_pool]
        usable = [sum(v[0] for v in matching), sum(v[1] for v in matching), max((v[2] for v in matching), default=0)]
    would_fit = None
    if request_bytes is not None:
        # spec §7.5: enough free cached bytes on the request's pool and stream, no block that large
        would_fit = usable[2] < request_bytes <= usable[0]
    pool_rows = tuple(
        PoolFree(
            pool=label,
            stream=stream,
            free_bytes=v[0],
            free_block_count=v[1],
            largest_free_block_bytes=v[2],
            request_fits_largest=(v[2] >= request_bytes) if request_bytes is not None else None,
        )
        for (label, stream), v in sorted(pools.items(), key=lambda item: (-item[1][0], item[0][0], item[0][1]))
    )
    max_split = None
    if settings is not None and settings.max_split_size not in (-1, None) and settings.max_split_size < (1 << 62):
        max_split = settings.max_split_size
    return Fragmentation(
        internal_bytes=internal,
        external_bytes=external,
        request_pool=request_pool,
        request_stream=request_stream,
        usable_free_bytes=usable[0],
        largest_usable_free_block_bytes=usable[2],
        would_fit_if_contiguous=would_fit,
        pools=pool_rows,
        segments=tuple(details),
        expandable_segments=_expandable(settings, segments, expandable_seen),
        max_split_size_bytes=max_split,
        alloc_conf=settings.raw_conf if settings is not None else None,
    )


def place_after_freeing(
    layout: Sequence[Segment],
    freed: Collection[int],
    *,
    request_bytes: int,
    request_stream: int | None,
    device_free_bytes: int | None,
    message_bytes: int | None,
) -> bool:
    """Whether a request that failed for want of one place finds one once the blocks at the
    addresses `freed` are free: a run of adjacent free blocks in one segment of its pool (and
    stream) at least as large; or, as the allocator retries after releasing the cached segments
    left wholly free, room on the device for its cudaMalloc (spec §7)."""
    pool = pool_of(request_bytes)
    released = 0
    for segment in layout:
        run = 0
        whole = True
        same_place = pool_label(segment) == pool and (request_stream is None or segment.stream == request_stream)
        for block in sorted(segment.blocks, key=lambda b: b.address):
            if block.state == INACTIVE or (block.state == ACTIVE_ALLOCATED and block.address in freed):
                run += block.size
                if same_place and run >= request_bytes:
                    return True
            else:
                run = 0
                whole = False
        if whole and tuple(segment.pool_id) == (0, 0):
            released += segment.total_size
    return device_free_bytes is not None and message_bytes is not None and device_free_bytes + released >= message_bytes


def _expandable(settings: AllocatorSettings | None, segments: Sequence[Segment], seen: bool | None) -> bool | None:
    """The recorded setting; else on when a segment at the target is expandable; else what the
    dump's own segments say (`seen`)."""
    if settings is not None:
        return settings.expandable_segments
    return True if any(s.is_expandable for s in segments) else seen
