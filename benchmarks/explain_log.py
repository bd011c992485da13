"""Finding OOM messages in a long training log, as a ratio to reading the log and splitting its lines.

    python benchmarks/explain_log.py [--lines 1000000]

The log is --lines ordinary training lines (timestamps, loss, throughput, a "GPU memory" figure)
with two OOM messages in it, one wrapped and prefixed as torchrun writes it. Both measurements run
in this process, best of three: the baseline is `read + decode + split("\n")`, the work is the
same plus `find_messages`. A log that mentions "out of memory" on most of its lines is slower (every
mention is looked at), which the second ratio shows.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import textwrap
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from oomdoctor.messages import find_messages  # noqa: E402

MESSAGE = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 546.00 MiB. GPU 0 has a total capacity of "
    "15.77 GiB of which 514.19 MiB is free. Process 562167 has 15.25 GiB memory in use. Of the allocated memory "
    "13.73 GiB is allocated by PyTorch, and 736.86 MiB is reserved by PyTorch but unallocated. If reserved but "
    "unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid "
    "fragmentation.  See documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html)"
)


def _log(lines: int, mention: str) -> str:
    body = [f"2026-01-01 00:00:{i % 60:02d} INFO step {i} loss 0.{i % 997} GPU memory 12.{i % 10} GiB{mention}"
            for i in range(lines)]  # fmt: skip
    body.insert(lines // 3, MESSAGE)
    body.insert(2 * lines // 3, "\n".join("[rank3]: " + part for part in textwrap.wrap(MESSAGE, 80)))
    return "\n".join(body) + "\n"


def _best(function, path: Path) -> float:
    times = []
    for _ in range(3):
        started = time.perf_counter()
        function(path)
        times.append(time.perf_counter() - started)
    return min(times)


def _baseline(path: Path) -> None:
    path.read_bytes().decode("utf-8", errors="replace").split("\n")


def _work(path: Path) -> None:
    text = path.read_bytes().decode("utf-8", errors="replace")
    text.split("\n")
    assert len(find_messages(text)) == 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=1_000_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        for name, mention in (("ordinary log", ""), ("'out of memory' on every line", " (no out of memory)")):
            path = Path(folder) / "train.log"
            path.write_text(_log(args.lines, mention))
            base, work = _best(_baseline, path), _best(_work, path)
            size_mb = path.stat().st_size / 1e6
            print(
                f"{name}: {size_mb:.0f} MB, read+split {base:.3f} s, with find_messages {work:.3f} s, ratio {work / base:.1f}x"
            )


if __name__ == "__main__":
    main()
