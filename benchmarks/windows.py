"""Phases of a plain snapshot with many `record_function` windows: does the time grow with the
windows, or with their square?

    python benchmarks/windows.py [--windows 2500] [--runs 3]

A trace of training steps (forward, backward, optimizer step, each allocation freed at once)
followed by one window each — torch's `Optimizer.step#…` windows, or Lightning's profiler's
`validation_step` windows — is built with WINDOWS and with four times as many steps, and the phases
of each (`build_spans`) are timed, medians of --runs. Four times the windows over four times the
events should take about four times as long: the script prints that ratio for each kind of window
(a quadratic pass would show about 16x).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from oomdoctor.analysis.phases import build_spans  # noqa: E402
from oomdoctor.model import Annotation, Frame  # noqa: E402
from tests.builders import MiB, Sim  # noqa: E402

TORCH = "/venv/lib/python3.11/site-packages/torch"
LOOP = (Frame("train.py", 60, "main"), Frame("train.py", 70, "<module>"))
MODULE_CALL = (Frame(f"{TORCH}/nn/modules/module.py", 1, "_call_impl"),)
FORWARD = (Frame(f"{TORCH}/nn/modules/linear.py", 1, "forward"), *MODULE_CALL, *LOOP)
BACKWARD = (Frame(f"{TORCH}/autograd/__init__.py", 1, "backward"), *LOOP)
STEP = (Frame(f"{TORCH}/optim/adam.py", 1, "step"), *LOOP)
LOSS = (Frame("losses.py", 8, "cross_entropy"), *LOOP)
WINDOWS = {
    "Optimizer.step": ("Optimizer.step#AdamW.step", (STEP,)),
    "validation_step": ("[LightningModule]Model.validation_step", (FORWARD, LOSS)),
}


def build(windows: int, name: str, inside: tuple) -> tuple:
    sim = Sim(total_bytes=1 << 50)
    annotations: list[Annotation] = []
    for _ in range(windows):
        sim.free(sim.alloc(MiB, FORWARD))
        sim.free(sim.alloc(MiB, LOSS))
        sim.free(sim.alloc(MiB, BACKWARD))
        annotations.append(Annotation(name, "START", 0, sim._tick()))
        for stack in inside:
            sim.free(sim.alloc(MiB, stack))
        annotations.append(Annotation(name, "END", 0, sim._tick()))
    snapshot = dataclasses.replace(sim.snapshot(metadata=False), annotations=tuple(annotations))
    return snapshot.trace_of(0), snapshot.annotations


def timed(trace, annotations, runs: int) -> float:
    times = []
    gc.collect()
    gc.freeze()  # the built trace is no work of the cycle collector's during the runs
    for _ in range(runs):
        start = time.perf_counter()
        build_spans(trace, markers=None, annotations=annotations, device=0)
        times.append(time.perf_counter() - start)
    gc.unfreeze()
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--windows", type=int, default=2500)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    for kind, (name, inside) in WINDOWS.items():
        small, large = (timed(*build(n, name, inside), args.runs) for n in (args.windows, 4 * args.windows))
        print(
            f"{kind} windows: {args.windows} in {small:.3f} s, {4 * args.windows} in {large:.3f} s: "
            f"{large / small:.1f}x for 4x the windows (proportional: 4x; quadratic: 16x)"
        )


if __name__ == "__main__":
    main()
