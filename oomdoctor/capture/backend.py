"""The seam between capture and the device: everything capture asks of CUDA goes through a Backend.

`CudaBackend` talks to torch.cuda; `oomdoctor.rehearse` provides a simulated one so that
`oomdoctor.install()` runs unchanged on CPU. `active_backend()` is what capture uses; rehearsal
calls `set_backend()` before running the user's script.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from typing import Any, Protocol

# cb(device, alloc_bytes, device_total_bytes, device_free_bytes), as torch calls OOM observers
OomObserver = Callable[[int, int, int, int], None]


class Backend(Protocol):
    name: str

    def unavailable_reason(self) -> str | None:
        """None when history can be recorded; otherwise one line saying why not."""

    def record_history(self, *, max_entries: int, stacks: str, context: str) -> None: ...

    def stop_history(self) -> None: ...

    def snapshot(self) -> dict[str, Any]:
        """torch's snapshot dict (segments, device_traces, allocator_settings, ...), unchanged."""

    def attach_oom_observer(self, observer: OomObserver) -> None: ...

    def current_device(self) -> int: ...

    def mem_get_info(self, device: int) -> tuple[int, int]:
        """(free_bytes, total_bytes)."""

    def memory_stats(self, device: int) -> dict[str, Any]: ...

    def device_properties(self, device: int) -> dict[str, Any]:
        """{"name", "capability": [major, minor], "total_memory_bytes"}."""

    def storage_address(self, tensor: Any) -> int | None:
        """Device address of the tensor's storage, or None when it is not on this backend's device."""

    def cuda_version(self) -> str | None: ...


_active: Backend | None = None


def set_backend(backend: Backend | None) -> None:
    global _active
    _active = backend


def active_backend() -> Backend:
    global _active
    if _active is None:
        _active = CudaBackend()
    return _active


class CudaBackend:
    name = "cuda"

    def unavailable_reason(self) -> str | None:
        import torch

        if not torch.cuda.is_available():
            return "torch reports no CUDA device"
        if os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING", "") not in ("", "0"):
            return "PYTORCH_NO_CUDA_MEMORY_CACHING is set, so the caching allocator keeps no history"
        conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "") + os.environ.get("PYTORCH_ALLOC_CONF", "")
        backend = getattr(torch.cuda, "get_allocator_backend", lambda: "native")()
        if backend != "native" or "cudaMallocAsync" in conf:
            return "the cudaMallocAsync allocator backend does not record history"
        return None

    def record_history(self, *, max_entries: int, stacks: str, context: str) -> None:
        import torch

        record = torch.cuda.memory._record_memory_history
        params = inspect.signature(record).parameters
        if "stacks" not in params:  # torch 2.0: the legacy boolean form only
            record(True, trace_alloc_max_entries=max_entries, trace_alloc_record_context=context != "state")
            return
        kwargs: dict[str, Any] = {"context": context, "stacks": stacks, "max_entries": max_entries}
        if "global_record_annotations" in params:
            kwargs["global_record_annotations"] = True
        record("all", **kwargs)

    def stop_history(self) -> None:
        import torch

        record = torch.cuda.memory._record_memory_history
        legacy = "stacks" not in inspect.signature(record).parameters  # torch 2.0: a bool
        record(False if legacy else None)

    def when_ready(self, callback: Callable[[], None]) -> None:
        """Run `callback` once CUDA is initialized: now if it is, else when torch initializes it.

        Optional for other backends (capture calls the callback at once without it). Recording
        history or attaching the OOM observer would otherwise initialize CUDA inside install(),
        on the default device before the script picks its own, and forked children could no
        longer use CUDA.
        """
        import torch

        lazy_call = getattr(torch.cuda, "_lazy_call", None)
        if lazy_call is None or torch.cuda.is_initialized():
            callback()
        else:
            lazy_call(callback)

    def history_enabled(self) -> bool:
        """Whether the script already records history (install() then keeps its settings).

        Optional for other backends: capture treats a backend without it as "not recording yet".
        """
        import torch

        is_enabled = getattr(torch._C, "_cuda_isHistoryEnabled", None)
        return bool(is_enabled()) if is_enabled is not None else False

    def snapshot(self) -> dict[str, Any]:
        import torch

        return torch.cuda.memory._snapshot()

    def attach_oom_observer(self, observer: OomObserver) -> None:
        import torch

        torch._C._cuda_attach_out_of_memory_observer(observer)

    def current_device(self) -> int:
        import torch

        return torch.cuda.current_device()

    def mem_get_info(self, device: int) -> tuple[int, int]:
        import torch

        free, total = torch.cuda.mem_get_info(device)
        return int(free), int(total)

    def memory_stats(self, device: int) -> dict[str, Any]:
        import torch

        return dict(torch.cuda.memory_stats(device))

    def device_properties(self, device: int) -> dict[str, Any]:
        import torch

        props = torch.cuda.get_device_properties(device)
        return {
            "name": props.name,
            "capability": [props.major, props.minor],
            "total_memory_bytes": int(props.total_memory),
        }

    def storage_address(self, tensor: Any) -> int | None:
        if getattr(tensor, "device", None) is None or tensor.device.type != "cuda":
            return None
        return int(tensor.untyped_storage().data_ptr())

    def cuda_version(self) -> str | None:
        import torch

        return torch.version.cuda

    def cudnn_version(self) -> str | None:
        """cuDNN's version as torch reports it ("90100"), or None without cuDNN (optional in a backend)."""
        import torch

        version = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
        return None if version is None else str(version)

    def nccl_version(self) -> str | None:
        """NCCL's version ("2.21.5"), or None when torch was built without it (optional in a backend)."""
        import torch

        if not torch.distributed.is_available() or not hasattr(torch.cuda, "nccl"):
            return None
        version = torch.cuda.nccl.version()
        return ".".join(str(part) for part in version) if isinstance(version, tuple) else str(version)
