"""How much slower a training step runs under rehearsal than plain on the CPU.

Rehearsal sees every aten op through a TorchDispatchMode, tracks each new storage, walks the Python
stack for each allocation and runs the allocator simulator. This runs the same small model in
alternating blocks of steps, plain and inside a RehearsalSession (history recorded with Python
stacks, as `oomdoctor rehearse` does), and prints the ratio of median step times, plus the
simulator's share of the rehearsed time.

    python benchmarks/rehearse_overhead.py [--model mlp|transformer] [--blocks 7] [--steps 20]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn as nn

from oomdoctor.rehearse.session import RehearsalConfig, RehearsalSession


def build(kind: str) -> tuple[nn.Module, torch.Tensor]:
    if kind == "transformer":
        layer = nn.TransformerEncoderLayer(128, 4, 256, batch_first=True)
        return nn.TransformerEncoder(layer, 2, enable_nested_tensor=False), torch.randn(8, 32, 128)
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
    return model, torch.randn(64, 256)


def steps(kind: str, count: int) -> float:
    """Seconds per step, model and optimizer created inside (so they are device memory too)."""
    model, batch = build(kind)
    optimizer = torch.optim.AdamW(model.parameters())
    start = time.perf_counter()
    for _ in range(count):
        model(batch).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    return (time.perf_counter() - start) / count


class TimedSimulator:
    """Wraps a simulator's malloc and free to measure their share."""

    def __init__(self, simulator) -> None:
        self.seconds = 0.0
        for name in ("malloc", "free"):
            original = getattr(simulator, name)
            setattr(simulator, name, self._timed(original))

    def _timed(self, function):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start

        return timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("mlp", "transformer"), default="mlp")
    parser.add_argument("--blocks", type=int, default=7)
    parser.add_argument("--steps", type=int, default=20)
    options = parser.parse_args()
    torch.manual_seed(0)
    config = RehearsalConfig(device_memory_bytes=80 * 2**30)
    plain, rehearsed, simulator_shares = [], [], []
    for block in range(options.blocks + 1):
        plain_step = steps(options.model, options.steps)
        with RehearsalSession(config) as session:
            session.backend.record_history(max_entries=100_000, stacks="python", context="all")
            timer = TimedSimulator(session.simulator)
            rehearsed_step = steps(options.model, options.steps)
        if block == 0:
            continue  # warm-up: first use of the dispatch mode imports parts of torch
        plain.append(plain_step)
        rehearsed.append(rehearsed_step)
        simulator_shares.append(timer.seconds / (rehearsed_step * options.steps))
    plain_median, rehearsed_median = statistics.median(plain), statistics.median(rehearsed)
    print(f"model: {options.model}, {options.blocks} blocks of {options.steps} steps")
    print(f"plain CPU step:     {plain_median * 1e3:8.2f} ms")
    print(f"rehearsed step:     {rehearsed_median * 1e3:8.2f} ms")
    print(f"ratio rehearsed/plain: {rehearsed_median / plain_median:.2f}")
    print(f"simulator share of rehearsed time: {statistics.median(simulator_shares):.1%}")


if __name__ == "__main__":
    main()
