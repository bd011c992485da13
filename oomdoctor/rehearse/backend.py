"""SimulatedBackend: the capture seam (`oomdoctor.capture.backend.Backend`) answered by the simulator.

Under `oomdoctor rehearse`, capture's `active_backend()` is this object, so `oomdoctor.install()` runs
unchanged: history, snapshots, OOM observers, memory figures and storage addresses all come from the
simulated caching allocator and the storage recorder. `patch_torch_cuda()` makes the script's own
calls to `torch.cuda.memory_allocated()` and friends answer from the simulator too, while
`torch.cuda.is_available()` stays False so the script keeps choosing the CPU.
`patch_optimizer_defaults()` sends optimizers down the foreach path they take on CUDA.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from oomdoctor.capture.backend import OomObserver

SIMULATED_DEVICE_NAME = "Simulated GPU (oomdoctor rehearse)"


class SimulatedBackend:
    name = "rehearsal"

    def __init__(self, simulator: Any, recorder: Any, *, rehearsal: dict[str, Any] | None = None) -> None:
        self.simulator = simulator
        self.recorder = recorder
        # what the dump's metadata `rehearsal` entry holds: device_memory_bytes, outside_bytes, alloc_conf
        self.rehearsal = dict(rehearsal or {})
        self.device = int(getattr(simulator, "device", 0))

    def unavailable_reason(self) -> str | None:
        return None

    def record_history(self, *, max_entries: int, stacks: str = "python", context: str | None = "all") -> None:
        self.simulator.record_history(True, max_entries=max_entries, context=context)
        self.recorder.capture_frames = context is not None

    def stop_history(self) -> None:
        self.simulator.record_history(False)

    def history_enabled(self) -> bool:
        """Whether history is being recorded (the script may have started it itself)."""
        return bool(getattr(self.simulator, "_history_enabled", False))

    def snapshot(self) -> dict[str, Any]:
        self.recorder.drain()
        return self.simulator.snapshot()

    def attach_oom_observer(self, observer: OomObserver) -> None:
        self.recorder.observers.append(observer)

    def current_device(self) -> int:
        return self.device

    def mem_get_info(self, device: int | None = None) -> tuple[int, int]:
        self.recorder.drain()
        free_bytes, total_bytes = self.simulator.mem_get_info()
        return int(free_bytes), int(total_bytes)

    def memory_stats(self, device: int | None = None) -> dict[str, Any]:
        self.recorder.drain()
        return dict(self.simulator.memory_stats())

    def device_properties(self, device: int | None = None) -> dict[str, Any]:
        return {
            "name": SIMULATED_DEVICE_NAME,
            "capability": [0, 0],
            "total_memory_bytes": int(self.simulator.mem_get_info()[1]),
        }

    def storage_address(self, tensor: Any) -> int | None:
        return self.recorder.storage_address(tensor)

    def cuda_version(self) -> str | None:
        return None

    def patch_torch_cuda(self) -> Callable[[], None]:
        """Route torch.cuda's memory functions to the simulator; returns the function that undoes it."""
        import torch
        import torch.cuda.memory as cuda_memory

        def memory_stats(device: Any = None) -> dict[str, Any]:
            return self.memory_stats(self.device)

        def stat(name: str) -> Callable[..., int]:
            return lambda device=None: int(self.memory_stats(self.device).get(name, 0))

        def empty_cache() -> None:
            self.recorder.empty_cache()

        def reset_peak_memory_stats(device: Any = None) -> None:
            reset = getattr(self.simulator, "reset_peak_memory_stats", None)
            if reset is not None:
                reset()

        def record_memory_history(
            enabled: Any = "all",
            context: Any = "all",
            stacks: str = "all",
            max_entries: int = 100_000,
            *args: Any,
            **kwargs: Any,
        ) -> None:
            if enabled is None or enabled is False:
                self.stop_history()
            else:
                self.record_history(max_entries=max_entries, stacks=stacks, context=context)

        def dump_snapshot(filename: str = "dump_snapshot.pickle", *args: Any, **kwargs: Any) -> None:
            import pickle

            with open(filename, "wb") as file:
                pickle.dump(self.snapshot(), file, protocol=4)

        replacements: dict[str, Any] = {
            "memory_stats": memory_stats,
            "memory_allocated": stat("allocated_bytes.all.current"),
            "max_memory_allocated": stat("allocated_bytes.all.peak"),
            "memory_reserved": stat("reserved_bytes.all.current"),
            "max_memory_reserved": stat("reserved_bytes.all.peak"),
            "mem_get_info": lambda device=None: self.mem_get_info(self.device),
            "empty_cache": empty_cache,
            "reset_peak_memory_stats": reset_peak_memory_stats,
            "reset_max_memory_allocated": reset_peak_memory_stats,
            "synchronize": lambda device=None: None,
            "memory_snapshot": lambda *args, **kwargs: self.snapshot()["segments"],
        }
        memory_only = {
            "_record_memory_history": record_memory_history,
            "_snapshot": lambda *args, **kwargs: self.snapshot(),
            "_dump_snapshot": dump_snapshot,
        }
        saved: list[tuple[Any, str, Any]] = []
        tables = ((torch.cuda, replacements), (cuda_memory, replacements), (cuda_memory, memory_only))
        for module, table in tables:
            for attribute, replacement in table.items():
                if hasattr(module, attribute):
                    saved.append((module, attribute, getattr(module, attribute)))
                    setattr(module, attribute, replacement)

        def restore() -> None:
            for module, attribute, original in reversed(saved):
                setattr(module, attribute, original)

        return restore


def patch_optimizer_defaults() -> Callable[[], None]:
    """Make optimizers default to their foreach implementations on CPU, as they do on CUDA.

    The foreach path allocates differently (whole lists of temporaries in `step()`), so a
    rehearsal on the single-tensor CPU default would underestimate the step's peak. Returns the
    function that undoes it.
    """
    import torch.optim.optimizer as optimizer_module

    original = optimizer_module._get_foreach_kernels_supported_devices

    def with_cpu() -> list[str]:
        return [*original(), "cpu"]

    optimizer_module._get_foreach_kernels_supported_devices = with_cpu

    def restore() -> None:
        optimizer_module._get_foreach_kernels_supported_devices = original

    return restore
