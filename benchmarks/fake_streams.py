"""Compare the allocation streams of two rehearsal dumps: the fake one against the real-CPU one.

    python benchmarks/fake_streams.py REAL.pickle FAKE.pickle

Prints the number of allocations in each, whether the allocation sequences (sizes, in order) and
the interleaved streams (every alloc and free, by size and simulated address) are identical, and
the peaks. Exit status 0 when they are identical. `streams()` is what tests/test_rehearse_fake.py uses.
"""

from __future__ import annotations

import sys

from oomdoctor.load import load

STREAM_ACTIONS = frozenset({"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "oom"})


def streams(path: str) -> list[tuple[str, int, int]]:
    """(action, size, address) of every allocator event of device 0, oldest first."""
    snapshot = load(path)
    trace = snapshot.traces[0] if snapshot.traces else ()
    return [(event.action, event.size, event.addr) for event in trace if event.action in STREAM_ACTIONS]


def peaks(stream: list[tuple[str, int, int]]) -> tuple[int, int]:
    """(allocated, reserved) peaks in bytes, replayed from a stream."""
    allocated = reserved = peak_allocated = peak_reserved = 0
    for action, size, _ in stream:
        if action == "alloc":
            allocated += size
        elif action == "free_completed":
            allocated -= size
        elif action == "segment_alloc":
            reserved += size
        elif action == "segment_free":
            reserved -= size
        peak_allocated = max(peak_allocated, allocated)
        peak_reserved = max(peak_reserved, reserved)
    return peak_allocated, peak_reserved


def main(argv: list[str]) -> int:
    real, fake = streams(argv[0]), streams(argv[1])
    real_allocs = [size for action, size, _ in real if action == "alloc"]
    fake_allocs = [size for action, size, _ in fake if action == "alloc"]
    print(f"allocations: real {len(real_allocs):,}, fake {len(fake_allocs):,}")
    print(f"identical allocation sequence: {'yes' if real_allocs == fake_allocs else 'no'}")
    print(f"identical interleaved stream: {'yes' if real == fake else 'no'}")
    print(f"peaks (allocated, reserved): real {peaks(real)}, fake {peaks(fake)}")
    return 0 if real == fake else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
