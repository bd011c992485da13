"""Capture overhead and dump time on a real GPU (or, with --mode rehearsal, its dry run on CPU).

    python benchmarks/gpu/bench_child.py OUT.json [--mode cuda|rehearsal] [--rounds 12] [--steps 20]
                                         [--dump-events 100000]

Overhead: one small GPT training step (zero_grad, forward, backward, AdamW foreach step) timed in
three arms, interleaved round by round in rotating order so drift hits all alike:

* `none`: no history recording at all;
* `torch`: torch's own history recording, as oomdoctor sets it up (Python stacks, context "all",
  100 000 entries), started by the script;
* `oomdoctor`: the same recording plus `oomdoctor.install()` (which keeps the script's recording
  and adds its markers, module wrappers and registry).

In --mode rehearsal (the driver's dry run) the model is tiny and the numbers mean nothing.
Each arm's step time is the wall time of `--steps` steps between two synchronizations, divided by
the steps; ratios are of medians over rounds. `oomdoctor / torch` is what oomdoctor adds on top of
torch's recording (DESIGN §8: under 1.01); `torch / none` is the price of recording itself.

Dump time: with install() recording, a loop of small allocations (inside a 16-deep Python call
chain, so each event carries a realistic stack) fills the ring past `--dump-events`; then
`oomdoctor.dump()` is timed three times, against torch's own `_snapshot()` plus `pickle.dump` of
the same state, and `oomdoctor report --format json` of the dump is timed once.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPOSITORY_ROOT = HERE.parent.parent
sys.path.insert(0, str(REPOSITORY_ROOT / "fixtures" / "scenarios"))  # models.py: TinyGPT

RECORDING = {"max_entries": 100_000, "stacks": "python", "context": "all"}
CALL_DEPTH = 16


MODEL = "TinyGPT vocab 2048, width 256, 4 blocks, 8 heads; batch 16 x 128 tokens; AdamW foreach"
DRY_RUN_MODEL = "TinyGPT vocab 256, width 32, 1 block, 2 heads; batch 2 x 16 tokens; AdamW foreach"


def make_step(device: str, dry_run: bool) -> Callable[[], None]:
    import torch
    from models import TinyGPT

    torch.manual_seed(0)
    vocab, width, depth, heads, batch, length = (256, 32, 1, 2, 2, 16) if dry_run else (2048, 256, 4, 8, 16, 128)
    model = TinyGPT(vocab, width, depth, heads, 256).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    tokens = torch.randint(vocab, (batch, length + 1), generator=torch.Generator().manual_seed(0)).to(device)
    inputs, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        _, loss = model(inputs, targets)
        loss.backward()
        optimizer.step()

    return step


def measure_overhead(
    device: str, rounds: int, steps: int, synchronize: Callable[[], None], dry_run: bool
) -> dict[str, Any]:
    import oomdoctor
    from oomdoctor.capture.backend import active_backend

    backend = active_backend()
    step = make_step(device, dry_run)

    def set_arm(arm: str) -> None:
        oomdoctor.uninstall()
        backend.stop_history()
        if arm in ("torch", "oomdoctor"):
            backend.record_history(**RECORDING)
        if arm == "oomdoctor":
            oomdoctor.install()

    arms = ("none", "torch", "oomdoctor")
    times: dict[str, list[float]] = {arm: [] for arm in arms}
    for _ in range(3):
        step()
    for round_index in range(rounds):
        order = arms[round_index % 3 :] + arms[: round_index % 3]
        for arm in order:
            set_arm(arm)
            for _ in range(3):
                step()
            synchronize()
            start = time.perf_counter()
            for _ in range(steps):
                step()
            synchronize()
            times[arm].append((time.perf_counter() - start) / steps)
    set_arm("none")
    median = {arm: statistics.median(values) for arm, values in times.items()}
    return {
        "model": DRY_RUN_MODEL if dry_run else MODEL,
        "rounds": rounds,
        "steps_per_round": steps,
        "recording": RECORDING,
        "median_step_seconds": median,
        "min_step_seconds": {arm: min(values) for arm, values in times.items()},
        "step_seconds": times,
        "ratio_oomdoctor_to_torch_recording": median["oomdoctor"] / median["torch"],
        "ratio_torch_recording_to_none": median["torch"] / median["none"],
        "ratio_oomdoctor_to_none": median["oomdoctor"] / median["none"],
        # the same ratio between the two halves of the `torch` arm's rounds: the noise floor
        "noise_torch_halves": statistics.median(times["torch"][1::2]) / statistics.median(times["torch"][0::2])
        if rounds >= 2
        else None,
    }


def _allocate_in_a_loop(depth: int, count: int, device: str) -> None:
    import torch

    if depth:
        _allocate_in_a_loop(depth - 1, count, device)
        return
    for _ in range(count):
        block = torch.empty(256, device=device)
        del block


def measure_dump(device: str, events: int, synchronize: Callable[[], None], work_dir: Path) -> dict[str, Any]:
    import oomdoctor
    from oomdoctor.capture.backend import active_backend
    from oomdoctor.load import load

    backend = active_backend()
    oomdoctor.uninstall()
    backend.stop_history()
    os.environ["OOMDOCTOR_MAX_ENTRIES"] = str(events)
    oomdoctor.install()
    started = time.perf_counter()
    _allocate_in_a_loop(CALL_DEPTH, events // 2 + events // 5, device)  # >= 2 events per loop: the ring wraps
    synchronize()
    fill_seconds = time.perf_counter() - started
    dump_seconds, dump_bytes = [], 0
    for attempt in range(3):
        path = work_dir / f"dump-{attempt}.pickle"
        started = time.perf_counter()
        written = oomdoctor.dump(path)
        dump_seconds.append(time.perf_counter() - started)
        dump_bytes = Path(written).stat().st_size if written else 0
    snapshot = load(work_dir / "dump-0.pickle")
    trace = snapshot.trace_of(backend.current_device())
    frames = trace.frames_at(len(trace) // 2) if len(trace) else ()
    baseline_seconds = []
    for attempt in range(3):
        started = time.perf_counter()
        raw = backend.snapshot()
        with open(work_dir / f"torch-{attempt}.pickle", "wb") as file:
            pickle.dump(raw, file, protocol=4)
        baseline_seconds.append(time.perf_counter() - started)
        del raw
    started = time.perf_counter()
    report = subprocess.run(
        [sys.executable, "-m", "oomdoctor", "report", str(work_dir / "dump-0.pickle"), "--format", "json"],
        capture_output=True,
    )
    report_seconds = time.perf_counter() - started
    oomdoctor.uninstall()
    return {
        "max_entries": events,
        "events_in_dump": len(trace),
        "frames_per_event": len(frames),
        "fill_seconds": fill_seconds,
        "dump_seconds": dump_seconds,
        "dump_bytes": dump_bytes,
        "torch_snapshot_and_pickle_seconds": baseline_seconds,
        "ratio_dump_to_torch_snapshot_and_pickle": min(dump_seconds) / min(baseline_seconds),
        "report_json_seconds": report_seconds,
        "report_exit_code": report.returncode,
        "report_stderr": report.stderr.decode(errors="replace")[-1000:],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--mode", choices=("cuda", "rehearsal"), default="cuda")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--dump-events", type=int, default=100_000)
    args = parser.parse_args(argv)

    import torch

    session = None
    if args.mode == "cuda":
        device = "cuda"
        synchronize = torch.cuda.synchronize
    else:
        from oomdoctor.rehearse.session import RehearsalConfig, RehearsalSession

        session = RehearsalSession(RehearsalConfig(device_memory_bytes=64 << 30)).start()
        device = "cpu"

        def synchronize() -> None:
            pass

    result: dict[str, Any] = {"mode": args.mode}
    with tempfile.TemporaryDirectory(prefix="oomdoctor-bench-") as work:
        for name, measure in (
            (
                "overhead",
                lambda: measure_overhead(device, args.rounds, args.steps, synchronize, args.mode == "rehearsal"),
            ),
            ("dump_time", lambda: measure_dump(device, args.dump_events, synchronize, Path(work))),
        ):
            try:
                result[name] = measure()
            except Exception as error:  # one failing measurement must not lose the other
                import traceback

                result[name] = {
                    "error": f"{type(error).__name__}: {error}",
                    "traceback": traceback.format_exc()[-3000:],
                }
    if session is not None:
        session.stop()
    args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
