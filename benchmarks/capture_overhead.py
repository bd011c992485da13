"""What oomdoctor.install() adds to a training step on top of torch's own history recording.

History recording is torch's (and needs CUDA); this measures everything oomdoctor adds: the
wrapped `nn.Module.__call__`, `autograd.backward` and `zero_grad`, the optimizer step hooks and the
registry's weak references. It trains a small model on CPU against a backend whose history calls do
nothing. Target: end to end under 1.01.

* end to end (the headline): rounds of three blocks of real steps, two without install() and one
  with, in an order that rotates from round to round; each block settles for a few steps after
  install() / uninstall() and then times its steps one by one in this thread's CPU time (time other
  processes take from it does not count). Each round gives with / without (the with block against
  one without block) and, the same way, without / without (the other without block against that
  one): the A/A control, the noise of the measurement itself on this machine now. Printed: the
  median of each over the rounds. Every block starts right after the classes install() patches
  were changed (see touch_patched_classes), so the one-off cost of that change falls on all
  blocks alike. On a machine shared with other work, run more rounds until the A/A control is
  within 0.995..1.005.
* accounted (detail): the step's own calls, counted (module calls, backward, zero_grad, optimizer
  steps), times what oomdoctor adds to each: per module call measured through a chain of real
  modules, per marker through oomdoctor's wrappers around no-op functions in a tight loop. It
  counts only oomdoctor's own work, hot in the caches.

    python benchmarks/capture_overhead.py [--model mlp|transformer] [--rounds 40] [--steps 10]
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
    model = nn.Sequential(
        nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False), nn.Flatten(), nn.Linear(128 * 32, 10)
    )
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


def touch_patched_classes() -> None:
    """Set the class attributes install() replaces to what they are now. Changing a class makes
    Python drop what it specialized for it and its subclasses (every module and optimizer class);
    re-specializing takes dozens of executions of each affected instruction, that is dozens of
    steps for code that runs once a step. A process installs once, so that is no cost of
    oomdoctor's; done before every block, it costs the blocks without and with alike."""
    for owner, name in ((nn.Module, "__call__"), (nn.Module, "zero_grad"), (torch.optim.Optimizer, "zero_grad")):
        setattr(owner, name, owner.__dict__[name])


def end_to_end(step: Any, rounds: int, steps: int, settle: int) -> tuple[list[float], list[float], list[float]]:
    """Per round: (with / without, without / without) from median step times of three blocks."""
    # the with block's place among the three rotates, and so does which without block is the base
    orders = [("with", "a", "b"), ("a", "with", "b"), ("a", "b", "with")]
    ratios, controls, without_medians = [], [], []
    for round_index in range(rounds):
        medians: dict[str, float] = {}
        for block in orders[round_index % 3]:
            installed = block == "with"
            if installed:
                oomdoctor.install()
            else:
                touch_patched_classes()
            for _ in range(settle):
                step()
            times = []
            for _ in range(steps):
                start = time.thread_time_ns()
                step()
                times.append(time.thread_time_ns() - start)
            if installed:
                oomdoctor.uninstall()
            medians[block] = statistics.median(times) / 1e9
        base, other = ("a", "b") if (round_index // 3) % 2 == 0 else ("b", "a")
        ratios.append(medians["with"] / medians[base])
        controls.append(medians[other] / medians[base])
        without_medians += [medians["a"], medians["b"]]
    return ratios, controls, without_medians


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=("mlp", "transformer"), default="mlp")
    parser.add_argument("--rounds", type=int, default=60, help="rounds of three blocks (two without, one with)")
    parser.add_argument("--steps", type=int, default=10, help="timed training steps per block")
    parser.add_argument("--settle", type=int, default=5, help="untimed steps at the start of each block")
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
    for _ in range(20):
        step()
    ratios, controls, without_medians = end_to_end(step, args.rounds, args.steps, args.settle)
    measured = statistics.median(ratios)
    control = statistics.median(controls)

    module_calls = calls_per_step(step)
    base = statistics.median(without_medians)
    added, per_module_call = added_seconds_per_step(module_calls, inputs, targets)
    print(
        f"model: {args.model}, {module_calls} module calls per step, step time without oomdoctor {base * 1e6:.1f} us;"
        f" {args.rounds} rounds of 3 blocks x {args.steps} steps"
    )
    print(f"ratio (end to end, median step time with / without): {measured:.4f}  (target < 1.01)")
    print(
        f"  A/A control (without / without, measured the same way): {control:.4f}"
        f"  (the noise now; within 0.995..1.005 the end-to-end figure is to be trusted)"
    )
    print(f"  end to end, added per step: {(measured - 1) * base * 1e6:.1f} us")
    print(
        f"accounted (detail): oomdoctor's own work per step {added * 1e6:.2f} us"
        f" ({per_module_call * 1e9:.0f} ns per module call), ratio {(base + added) / base:.4f}"
    )


if __name__ == "__main__":
    main()
