"""What oomdoctor.install() adds to a training step on top of torch's own history recording.

History recording is torch's (and needs CUDA); this measures everything oomdoctor adds: the
wrapped `nn.Module.__call__`, `autograd.backward` and `zero_grad`, the optimizer step hooks and the
registry's weak sets. It trains a small model on CPU against a backend whose history calls do
nothing, and prints two ratios of step time with / without install() (target: under 1.01):

* accounted: the step's own calls, counted (module calls, backward, zero_grad, optimizer steps),
  times what oomdoctor adds to each: per module call measured through a chain of real modules,
  per marker through oomdoctor's wrappers around no-op functions in a tight loop. Stable, because
  it times only the added work, many times over.
* end to end: real steps in rounds alternating without / with install(), each step timed in
  this thread's CPU time; median step time of each. The direct measurement, but on a loaded
  machine its noise (a few percent) exceeds the effect.

    python benchmarks/capture_overhead.py [--model mlp|transformer] [--rounds 20] [--steps 20]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch
import torch.nn as nn
from torch.nn.modules import module as module_globals

import oomdoctor
from oomdoctor.capture import backend as backend_module
from oomdoctor.capture.markers import PhaseRecorder


class NullHistoryBackend:
    """The capture seam with every device call a no-op: only oomdoctor's own work is timed."""

    name = "null"

    def unavailable_reason(self) -> str | None:
        return None

    def record_history(self, **options: Any) -> None:
        pass

    def stop_history(self) -> None:
        pass

    def snapshot(self) -> dict[str, Any]:
        return {"segments": [], "device_traces": [[]]}

    def attach_oom_observer(self, observer: Any) -> None:
        pass

    def current_device(self) -> int:
        return 0

    def mem_get_info(self, device: int) -> tuple[int, int]:
        return 0, 0

    def memory_stats(self, device: int) -> dict[str, Any]:
        return {}

    def device_properties(self, device: int) -> dict[str, Any]:
        return {"name": "none", "capability": [0, 0], "total_memory_bytes": 0}

    def storage_address(self, tensor: Any) -> int | None:
        return None

    def cuda_version(self) -> str | None:
        return None


def make_model(kind: str) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    if kind == "mlp":
        layers: list[nn.Module] = []
        for _ in range(4):
            layers += [nn.Linear(256, 256), nn.GELU(), nn.LayerNorm(256)]
        model = nn.Sequential(*layers, nn.Linear(256, 10))
        return model, torch.randn(64, 256), torch.randint(0, 10, (64,))
    layer = nn.TransformerEncoderLayer(d_model=128, nhead=4, dim_feedforward=256, batch_first=True, dropout=0.0)
    model = nn.Sequential(nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False), nn.Flatten(), nn.Linear(128 * 32, 10))
    return model, torch.randn(16, 32, 128), torch.randint(0, 10, (16,))


def calls_per_step(step: Any) -> int:
    """How many nn.Module calls one training step makes (counted once with a temporary hook)."""
    count = 0

    def count_call(module: Any, args: Any) -> None:
        nonlocal count
        count += 1

    handle = module_globals.register_module_forward_pre_hook(count_call)
    try:
        step()
    finally:
        handle.remove()
    return count


def best_of(function: Any, repeats: int, loops: int) -> float:
    timings = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(loops):
            function()
        timings.append((time.perf_counter() - start) / loops)
    return min(timings)


def added_seconds_per_module_call(chain_length: int = 200, repeats: int = 15) -> float:
    """Through real nn.Module calls: a chain of Identity modules with and without install()."""
    chain = nn.Sequential(*[nn.Identity() for _ in range(chain_length)])
    inputs = torch.zeros(1)
    without, with_capture = [], []
    for _ in range(repeats):
        without.append(best_of(lambda: chain(inputs), 1, 50))
        oomdoctor.install()
        with_capture.append(best_of(lambda: chain(inputs), 1, 50))
        oomdoctor.uninstall()
    return max(min(with_capture) - min(without), 0.0) / chain_length


def added_seconds_per_step(
    module_calls: int, inputs: torch.Tensor, targets: torch.Tensor, repeats: int = 7, loops: int = 2000
) -> tuple[float, float]:
    """One step's worth of oomdoctor's work: each module call's wrapper (measured through real
    modules), plus the markers of the outermost calls, backward, zero_grad and the optimizer step
    (their wrappers around no-op functions, timed in a tight loop, minus the bare calls). The
    outermost calls get the step's real arguments, so remembering them as inputs is counted."""
    recorder = PhaseRecorder()
    recorder.active = True
    recorder._tensor_type = torch.Tensor  # what install() sets
    recorder._refresh()
    output = torch.zeros(inputs.shape[0], 10)
    module = nn.Identity()

    def noop(*args: Any, **kwargs: Any) -> None:
        return None

    wrapped_call = recorder._module_call_wrapper(noop)
    wrapped_backward = recorder._backward_wrapper(noop)
    wrapped_zero_grad = recorder._zero_grad_wrapper(noop)
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1)

    def with_oomdoctor() -> None:
        wrapped_zero_grad(optimizer)
        wrapped_call(module, inputs)  # the model
        wrapped_call(module, output, targets)  # the loss
        wrapped_backward()
        recorder._optimizer_pre_hook(optimizer, (), {})
        recorder._optimizer_post_hook(optimizer, (), {})

    def without() -> None:
        noop(optimizer)
        noop(module, inputs)
        noop(module, output, targets)
        noop()

    markers = max(best_of(with_oomdoctor, repeats, loops) - best_of(without, repeats, loops), 0.0)
    per_module_call = added_seconds_per_module_call()
    return markers + module_calls * per_module_call, per_module_call


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=("mlp", "transformer"), default="mlp")
    parser.add_argument("--rounds", type=int, default=20, help="rounds per variant, alternating")
    parser.add_argument("--steps", type=int, default=20, help="timed training steps per round")
    args = parser.parse_args()

    torch.set_num_threads(1)  # steadier timings on a shared machine
    model, inputs, targets = make_model(args.model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss_function = nn.CrossEntropyLoss()

    def step() -> None:
        optimizer.zero_grad()
        loss = loss_function(model(inputs), targets)
        loss.backward()
        optimizer.step()

    backend_module.set_backend(NullHistoryBackend())
    for _ in range(10):
        step()
    # rounds alternate without / with install(); each times its steps one by one in CPU time of
    # this thread (time other processes take from it does not count), after a few settling steps
    step_times: dict[bool, list[float]] = {False: [], True: []}
    for round_index in range(2 * args.rounds):
        installed = round_index % 2 == 1
        if installed:
            oomdoctor.install()
        for _ in range(3):
            step()
        for _ in range(args.steps):
            start = time.thread_time_ns()
            step()
            step_times[installed].append((time.thread_time_ns() - start) / 1e9)
        if installed:
            oomdoctor.uninstall()
    without, with_capture = step_times[False], step_times[True]
    # the same split between two halves of the rounds without: the noise floor of this machine now
    halves = [
        [t for index, t in enumerate(without) if (index // args.steps) % 2 == parity] for parity in (0, 1)
    ]

    module_calls = calls_per_step(step)
    base = min(without)  # the fastest step: the least favourable base for the accounted ratio
    added, per_module_call = added_seconds_per_step(module_calls, inputs, targets)
    measured = statistics.median(with_capture) / statistics.median(without)
    print(f"model: {args.model}, {module_calls} module calls per step; {args.rounds} rounds x {args.steps} steps each way")
    print(f"step time without oomdoctor (fastest):    {base * 1e6:9.1f} us")
    print(f"oomdoctor's added work per step:          {added * 1e6:9.2f} us"
          f"  ({per_module_call * 1e9:.0f} ns per module call)")
    print(f"ratio (accounted): {(base + added) / base:.4f}  (target < 1.01)")
    print(f"ratio (end to end, median step time with / without): {measured:.4f}"
          f"  (same measure between two halves of the runs without: "
          f"{statistics.median(halves[1]) / statistics.median(halves[0]):.4f})")


if __name__ == "__main__":
    main()
