"""`oomdoctor report --format json` on dumps of many live blocks over few stacks, as ratios to the
floor (a bare restricted pickle.load of the same file, GC paused), at two sizes.

    python benchmarks/blocks.py [--blocks 25600] [--stacks 50] [--runs 3]

What a dump holds at an OOM can be tens of thousands of live blocks (a model of many small
tensors, a cache of many entries) over a few hundred distinct stacks. The analysis places every
block, and what its rules read in a stack is worked out once per distinct stack
(`frame_kinds.per_stack`), so its time should grow with the blocks at a small cost per block, not
with blocks times frames. Each dump: --blocks blocks of 8 KiB in 2 MiB segments, their stacks
(nine frames of the user's code) drawn in turn from --stacks distinct ones, each block allocated
by the trace, then an OOM. Measured at --blocks and at 4x --blocks, each run in a fresh process,
the sides alternating --runs times; medians. Prints the time per block and how the time grows.
"""

from __future__ import annotations

import argparse
import pickle
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from analyse import measure  # noqa: E402  (benchmarks/analyse.py)

BLOCK_BYTES = 8 * 1024
SEGMENT_BYTES = 2 * 1024 * 1024
BASE = 0x7F0000000000


def build(path: Path, blocks: int, stacks: int) -> None:
    pool = [
        [{"filename": f"/home/user/model{j}.py", "line": 10 + i, "name": f"forward{i}"} for i in range(8)]
        + [{"filename": "train.py", "line": 5, "name": "main"}]
        for j in range(stacks)
    ]
    per_segment = SEGMENT_BYTES // BLOCK_BYTES
    segments: list[dict[str, Any]] = []
    trace: list[dict[str, Any]] = []
    time_us = 1_700_000_000_000_000
    for s in range(-(-blocks // per_segment)):
        start = BASE + s * SEGMENT_BYTES
        trace.append(
            {
                "action": "segment_alloc",
                "addr": start,
                "size": SEGMENT_BYTES,
                "stream": 0,
                "frames": [],
                "time_us": time_us,
            }
        )
        time_us += 1
        kept = []
        for b in range(per_segment):
            frames = pool[(s * per_segment + b) % stacks]
            address = start + b * BLOCK_BYTES
            event = {"action": "alloc", "addr": address, "size": BLOCK_BYTES, "stream": 0, "frames": list(frames)}
            trace.append(dict(event, time_us=time_us))
            time_us += 1
            kept.append(
                {
                    "address": address,
                    "size": BLOCK_BYTES,
                    "requested_size": BLOCK_BYTES,
                    "state": "active_allocated",
                    "frames": list(frames),
                }
            )
        segments.append(
            {"device": 0, "address": start, "total_size": SEGMENT_BYTES, "allocated_size": SEGMENT_BYTES,
             "active_size": SEGMENT_BYTES, "requested_size": SEGMENT_BYTES, "stream": 0, "segment_type": "large",
             "segment_pool_id": (0, 0), "is_expandable": False, "frames": [], "blocks": kept}
        )  # fmt: skip
    trace.append(
        {"action": "oom", "size": 64 << 20, "stream": 0, "frames": list(pool[0]), "time_us": time_us, "device_free": 0}
    )
    with open(path, "wb") as handle:
        pickle.dump({"segments": segments, "device_traces": [trace], "allocator_settings": {}}, handle, protocol=4)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--blocks", type=int, default=25_600)
    parser.add_argument("--stacks", type=int, default=50)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    seconds = {}
    with tempfile.TemporaryDirectory() as folder:
        for blocks in (args.blocks, 4 * args.blocks):
            path = Path(folder) / f"blocks-{blocks}.pickle"
            build(path, blocks, args.stacks)
            floors, ours = [], []
            for _ in range(args.runs):
                floors.append(measure("pickle", path)["seconds"])
                ours.append(measure("report", path)["seconds"])
            floor, mine = statistics.median(floors), statistics.median(ours)
            seconds[blocks] = mine
            print(
                f"{blocks} live blocks over {args.stacks} stacks: floor {floor:.2f} s, report {mine:.2f} s"
                f" ({mine / floor:.1f}x the floor, {mine / blocks * 1e6:.0f} us a block)"
            )
    small, large = args.blocks, 4 * args.blocks
    print(f"4x the blocks: {seconds[large] / seconds[small]:.2f}x the time (proportional: 4x)")
    print(f"(medians of {args.runs} alternating runs, each in a fresh process)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
