"""Hold all free GPU memory but TARGET_FREE_BYTES, as another job sharing the device would.

    python benchmarks/gpu/holder.py TARGET_FREE_BYTES

Prints `held BYTES` once it holds them, then keeps them until its stdin closes. Run by
scenario_child.py for the `outside-pytorch` fixtures: the memory is another process's, so the
scenario's own PyTorch counts it as memory outside PyTorch.
"""

from __future__ import annotations

import sys

import torch

CHUNK_BYTES = 8 << 30
SEGMENT_ROUNDING_BYTES = 2 << 20  # torch rounds large allocations up to 2 MiB: round down to stay below


def main(argv: list[str]) -> int:
    target_free_bytes = int(argv[0])
    torch.cuda.init()
    free_bytes, _ = torch.cuda.mem_get_info()
    to_hold = (free_bytes - target_free_bytes) // SEGMENT_ROUNDING_BYTES * SEGMENT_ROUNDING_BYTES
    held = []
    remaining = max(0, to_hold)
    while remaining:
        chunk = min(CHUNK_BYTES, remaining)
        held.append(torch.empty(chunk, dtype=torch.uint8, device="cuda"))
        remaining -= chunk
    torch.cuda.synchronize()
    print(f"held {max(0, to_hold)}", flush=True)
    sys.stdin.read()  # until the scenario is done
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
