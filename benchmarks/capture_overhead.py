"""What oomdoctor.install() adds to a training step on top of torch's own history recording.

History recording is torch's (and needs CUDA); this measures everything oomdoctor adds: the
wrapped `nn.Module.__call__`, `autograd.backward` and `zero_grad`, the optimizer step hooks and the
registry's weak sets. It trains a small model on CPU against a backend whose history calls do
nothing, and prints two ratios of step time with / without install() (target: under 1.01):

* accounted: the step's own calls (counted: module calls, backward, zero_grad, optimizer steps)
  replayed through oomdoctor's wrappers around no-op functions, timed in a tight loop, added to
  the step time. Stable, because it times only the added work, many times over.
* end to end: blocks of real steps, alternating without / with install(), lower-quartile block
  time of each. The direct measurement, but on a loaded machine its noise exceeds the effect.

    python benchmarks/capture_overhead.py [--model mlp|transformer] [--blocks 60] [--steps 5]
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


def lower_quartile(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[(len(ordered) - 1) // 4]


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


def added_seconds_per_step(module_calls: int, repeats: int = 7, loops: int = 2000) -> float:
    """Time one step's worth of oomdoctor's wrappers around no-op functions, minus the bare calls."""
    recorder = PhaseRecorder()
    recorder.active = True
    module = nn.Identity()

    def noop(*args: Any, **kwargs: Any) -> None:
        return None

    wrapped_call = recorder._module_call_wrapper(noop)
    wrapped_backward = recorder._backward_wrapper(noop)
    wrapped_zero_grad = recorder._zero_grad_wrapper(noop)
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1)
    inner_calls = max(module_calls - 2, 0)  # the model and the loss are outermost calls

    def outermost_call(function: Any) -> None:
        recorder.in_forward = False
        function(module)
        recorder.in_forward = True
        for _ in range(inner_calls):
            function(module)
        recorder.in_forward = False
        function(module)

    def with_oomdoctor() -> None:
        wrapped_zero_grad(optimizer)
        outermost_call(wrapped_call)
        wrapped_backward()
        recorder._optimizer_pre_hook(optimizer, (), {})
        recorder._optimizer_post_hook(optimizer, (), {})

    def without() -> None:
        noop(optimizer)
        outermost_call(noop)
        noop()

    def best(function: Any) -> float:
        timings = []
        for _ in range(repeats):
            start = time.perf_counter()
            for _ in range(loops):
                function()
            timings.append((time.perf_counter() - start) / loops)
        return min(timings)

    return max(best(with_oomdoctor) - best(without), 0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=("mlp", "transformer"), default="mlp")
    parser.add_argument("--blocks", type=int, default=60, help="blocks of steps per variant, alternating")
    parser.add_argument("--steps", type=int, default=5, help="training steps per block")
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

    def block() -> float:
        start = time.perf_counter()
        for _ in range(args.steps):
            step()
        return (time.perf_counter() - start) / args.steps

    backend_module.set_backend(NullHistoryBackend())
    for _ in range(3):  # warm up both paths
        block()
        oomdoctor.install()
        block()
        oomdoctor.uninstall()

    without, with_capture = [], []
    for index in range(args.blocks):
        order = (False, True) if index % 2 == 0 else (True, False)
        for installed in order:
            if installed:
                oomdoctor.install()
                with_capture.append(block())
                oomdoctor.uninstall()
            else:
                without.append(block())

    module_calls = calls_per_step(step)
    base = min(without)
    added = added_seconds_per_step(module_calls)
    measured = lower_quartile(with_capture) / lower_quartile(without)
    print(f"model: {args.model}, {module_calls} module calls per step; {args.blocks} blocks x {args.steps} steps")
    print(f"step time without oomdoctor (best block): {base * 1e6:9.1f} us")
    print(f"oomdoctor's added work per step:          {added * 1e6:9.2f} us")
    print(f"ratio (accounted): {(base + added) / base:.4f}  (target < 1.01)")
    print(f"ratio (end to end, lower quartile of interleaved blocks): {measured:.4f}")


if __name__ == "__main__":
    main()
