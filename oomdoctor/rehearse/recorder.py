"""Feed every tensor storage a script creates on CPU into the simulated caching allocator.

A TorchDispatchMode sees every aten op, factory functions included. After each op, an output whose
untyped storage was not seen before and is not one of the op's inputs' storages is a fresh
allocation of `storage.nbytes()` bytes: torch allocates per storage, and views share one. The
storage's Python object lives exactly as long as its StorageImpl (torch preserves it), so a weak
reference to it tells when the memory is released. A tracked storage whose size changed (resize_,
out= arguments) is a new allocation followed by the release of the old one, as CUDA's resize does.
`UntypedStorage.resize_` bypasses the dispatcher (FSDP frees and re-allocates unsharded parameters
with it), so while the recorder runs it is wrapped to do the same. Ops on wrapper subclasses
(DTensor) are handed back to the subclass, whose local ops on the shards then come here; the ops
DTensor's sharding propagation runs on global-shape fake tensors are not allocations and are ignored.

Allocations made while autograd runs backward get no Python frames, like those of CUDA's autograd
device thread. When the simulator cannot satisfy a request, the OOM observers run and the op raises
`torch.OutOfMemoryError` with torch's message, so the script sees what it would see on a GPU.
`record_function` scopes (Optimizer.step#..., Optimizer.zero_grad#..., user scopes) become the
simulator's external annotations, as torch's RecordFunction callback makes them.
"""

from __future__ import annotations

import collections
import os
import runpy
import sys
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass_type

from oomdoctor.metadata import PHASE_BACKWARD, PHASE_FORWARD, PHASE_OPTIMIZER, PHASE_ZERO_GRAD

MAX_FRAMES = 64

Frame = dict  # {"filename": str, "line": int, "name": str}, shared between stacks
OomObserver = Callable[[int, int, int, int], None]

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
# oomdoctor's own frames are never the user's: the rehearsal runner, capture and the CLI.
_OWN_PREFIXES = tuple(_PACKAGE_DIR + name for name in ("rehearse" + os.sep, "capture" + os.sep, "commands" + os.sep))
_OWN_FILES = frozenset({_PACKAGE_DIR + "cli.py", _PACKAGE_DIR + "__main__.py", _PACKAGE_DIR + "__init__.py"})
_RUNNER_FILES = frozenset({runpy.__file__, "<frozen runpy>"})
# Frames between the op the user called and the dispatch mode; a CUDA trace has none of them.
_DISPATCH_FILES = frozenset(
    _TORCH_DIR + path for path in ("utils/_python_dispatch.py", "_dynamo/eval_frame.py", "_compile.py", "_ops.py")
)
_MODULE_FILE = _TORCH_DIR + "nn/modules/module.py"
_OPTIM_DIR = _TORCH_DIR + "optim" + os.sep
_MODULE_CALL_NAMES = frozenset({"_wrapped_call_impl", "_call_impl"})

_RECORD_FUNCTION_ENTER = (
    torch.ops.profiler._record_function_enter_new,
    torch.ops.profiler._record_function_enter,
)
_RECORD_FUNCTION_EXIT = torch.ops.profiler._record_function_exit
_LIFT_FRESH = torch.ops.aten.lift_fresh.default
# torch.OutOfMemoryError is the newer name of torch.cuda.OutOfMemoryError (the same class)
OUT_OF_MEMORY_ERROR = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError
_current_graph_task_id = getattr(torch._C, "_current_graph_task_id", lambda: -1)

_interned_frames: dict[tuple[Any, int], Frame] = {}
_in_forked_child = False


def _forget_in_forked_child() -> None:
    # A forked child (a DataLoader worker) inherits the dispatch mode on its main thread, but its
    # tensors are host memory: they must neither allocate in nor raise from the simulator.
    global _in_forked_child
    _in_forked_child = True


os.register_at_fork(after_in_child=_forget_in_forked_child)


def _is_own_file(filename: str) -> bool:
    return filename in _OWN_FILES or filename.startswith(_OWN_PREFIXES) or filename in _RUNNER_FILES


def is_machinery_file(filename: str) -> bool:
    """Frames of oomdoctor's rehearsal and capture, runpy, or torch's dispatch-mode plumbing."""
    return filename in _DISPATCH_FILES or _is_own_file(filename)


def python_frames(frame: Any, limit: int = MAX_FRAMES) -> list[Frame]:
    """The Python stack from `frame` outwards, innermost first, as a CUDA allocation trace shows it.

    Dispatch machinery at the inner end and oomdoctor's or runpy's frames anywhere are left out.
    Identical frames are one shared dict, as in torch's snapshots.
    """
    while frame is not None and (frame.f_code.co_filename in _DISPATCH_FILES or _is_own_file(frame.f_code.co_filename)):
        frame = frame.f_back
    frames: list[Frame] = []
    while frame is not None and len(frames) < limit:
        code = frame.f_code
        if not _is_own_file(code.co_filename):
            key = (code, frame.f_lineno)
            interned = _interned_frames.get(key)
            if interned is None:
                interned = {"filename": code.co_filename, "line": frame.f_lineno, "name": code.co_name}
                _interned_frames[key] = interned
            frames.append(interned)
        frame = frame.f_back
    return frames


def user_frame(frames: list[Frame]) -> Frame | None:
    """The innermost frame outside torch: the line of the user's code that led to an allocation."""
    for frame in frames:
        if not frame["filename"].startswith(_TORCH_DIR):
            return frame
    return None


def in_backward() -> bool:
    """True while autograd's engine runs a backward pass (on CUDA: the autograd device thread)."""
    return _current_graph_task_id() != -1


@dataclass(frozen=True)
class LiveAllocation:
    """One storage that is allocated in the simulator now.

    `storage` is a weak reference to the CPU `torch.UntypedStorage` (call it; None once released),
    so ground truth can be computed by identity, e.g. with `p.untyped_storage()` of a parameter.
    """

    address: int
    block_bytes: int
    requested_bytes: int
    storage: weakref.ref
    frames: list[Frame] | None
    in_backward: bool


@dataclass(frozen=True)
class OomRecord:
    """Where and why the simulated allocator ran out, as seen in the script."""

    message: str
    op: str
    request_bytes: int
    alloc_bytes: int
    device_total_bytes: int
    device_free_bytes: int
    phase: str | None
    frames: list[Frame]  # the Python stack at the op, even in backward

    @property
    def user_frame(self) -> Frame | None:
        return user_frame(self.frames)


class _StorageRef(weakref.ref):
    __slots__ = ("key",)


class _Tracked:
    __slots__ = ("ref", "address", "nbytes", "frames", "in_backward")

    def __init__(self, ref: _StorageRef, address: int | None, nbytes: int, frames: Any, backward: bool):
        self.ref = ref
        self.address = address
        self.nbytes = nbytes
        self.frames = frames
        self.in_backward = backward


class _SimulatedOom(Exception):
    def __init__(self, error: BaseException, record: OomRecord):
        super().__init__(str(error))
        self.error = error
        self.record = record


class StorageRecorder:
    """Tracks CPU storages as simulated device allocations while `start()`..`stop()` is active.

    `simulator` is a CachingAllocatorSimulator (malloc/free/annotate/snapshot). The dispatch mode is
    entered on the calling thread; storages created on other threads are not seen.
    """

    def __init__(self, simulator: Any) -> None:
        self.simulator = simulator
        self.observers: list[OomObserver] = []
        self.ooms: list[OomRecord] = []
        self.capture_frames = True
        self._live: dict[int, _Tracked] = {}
        self._released: collections.deque[tuple[_StorageRef, list[Frame] | None]] = collections.deque()
        self._lock = threading.Lock()
        self._scope_names: list[str] = []
        self._mode: _RecordingMode | None = None
        self._thread: int | None = None
        # >0 while torch runs ops that allocate nothing on the device (DTensor's sharding propagation)
        self.suspended = 0
        self._unpatch: list[Callable[[], None]] = []
        from oomdoctor.rehearse.allocator import SimulatedOutOfMemory

        self._out_of_memory_type = SimulatedOutOfMemory

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        if self._mode is not None:
            raise RuntimeError("the recorder is already started")
        self._thread = threading.get_ident()
        self._unpatch.append(_patch_storage_resize(self))
        self._unpatch.append(_patch_sharding_propagation(self))
        self._mode = _RecordingMode(self)
        self._mode.__enter__()

    def stop(self) -> None:
        if self._mode is None:
            return
        mode, self._mode = self._mode, None
        mode.__exit__(None, None, None)
        while self._unpatch:
            self._unpatch.pop()()
        self.drain()

    @property
    def active(self) -> bool:
        return self._mode is not None

    # -- queries -------------------------------------------------------------------------------

    def live_allocations(self) -> list[LiveAllocation]:
        """Every storage allocated in the simulator now, in address order."""
        self.drain()
        found = []
        for tracked in list(self._live.values()):
            if tracked.address is None:
                continue
            found.append(
                LiveAllocation(
                    address=tracked.address,
                    block_bytes=self._block_bytes(tracked.address, tracked.nbytes),
                    requested_bytes=tracked.nbytes,
                    storage=tracked.ref,
                    frames=tracked.frames,
                    in_backward=tracked.in_backward,
                )
            )
        found.sort(key=lambda allocation: allocation.address)
        return found

    def storage_address(self, tensor: Any) -> int | None:
        """The simulated address of a tensor's storage, or None when it is not tracked."""
        if not isinstance(tensor, torch.Tensor) or tensor.device.type != "cpu":
            return None
        try:
            storage = tensor.untyped_storage()
        except (NotImplementedError, RuntimeError):
            return None
        tracked = self._live.get(storage._cdata)
        if tracked is None or tracked.ref() is not storage:
            return None
        return tracked.address

    def current_phase(self, frames: list[Frame] | None = None) -> str | None:
        """backward, optimizer_step, zero_grad or forward when it can tell; else None."""
        if in_backward():
            return PHASE_BACKWARD
        for name in reversed(self._scope_names):
            if name.startswith("Optimizer.step#"):
                return PHASE_OPTIMIZER
            if name.startswith("Optimizer.zero_grad#"):
                return PHASE_ZERO_GRAD
        for frame in frames or ():
            if frame["name"] in _MODULE_CALL_NAMES and frame["filename"] == _MODULE_FILE:
                return PHASE_FORWARD
        return None

    def _block_bytes(self, address: int, default_bytes: int) -> int:
        # Read the block table directly: snapshot() would add a `snapshot` event to the trace.
        block = getattr(self.simulator, "_blocks", {}).get(address)
        return int(block.size) if block is not None else default_bytes

    # -- releases ------------------------------------------------------------------------------

    def _storage_released(self, ref: _StorageRef) -> None:
        # Runs wherever the last reference died: maybe inside a simulator call on this thread
        # (a GC pass), maybe on another thread. Queue it; whoever holds the lock drains the queue.
        if _in_forked_child:
            return
        self._released.append((ref, self._release_frames()))
        if self._lock.acquire(blocking=False):
            try:
                self._drain_locked()
            finally:
                self._lock.release()

    def drain(self) -> None:
        """Apply releases queued while the simulator was busy."""
        with self._lock:
            self._drain_locked()

    def empty_cache(self) -> None:
        """torch.cuda.empty_cache() on the simulator, after the releases it has not seen yet."""
        with self._lock:
            self._drain_locked()
            self.simulator.empty_cache()

    def _drain_locked(self) -> None:
        while self._released:
            ref, frames = self._released.popleft()
            tracked = self._live.get(ref.key)
            if tracked is None or tracked.ref is not ref:
                continue
            del self._live[ref.key]
            if tracked.address is not None:
                self.simulator.free(tracked.address, frames=frames)

    def _release_frames(self) -> list[Frame] | None:
        """The free-site stack (kept by the simulator only under context="all")."""
        if in_backward():
            return []
        if not self.capture_frames:
            return None
        return python_frames(sys._getframe(2))

    # -- allocations ---------------------------------------------------------------------------

    def after_op(self, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        """Account for the storages `func` created or resized; raises _SimulatedOom."""
        fresh: list[Any] = []
        resized: list[tuple[Any, _Tracked]] = []
        input_keys: set[int] | None = None
        seen: set[int] = set()
        for tensor in _tensors(out):
            if not tensor.is_cpu:
                continue
            try:
                storage = tensor.untyped_storage()
            except (NotImplementedError, RuntimeError):  # sparse and other storage-less layouts
                continue
            key = storage._cdata
            if key in seen:
                continue
            seen.add(key)
            tracked = self._live.get(key)
            if tracked is not None and tracked.ref() is storage:
                if storage.nbytes() != tracked.nbytes:
                    resized.append((storage, tracked))
                continue
            if func is _LIFT_FRESH:  # torch.tensor(data) builds the storage before lift_fresh
                if _made_by_optimizer(sys._getframe(1)):
                    continue  # step counters and scalars that optimizers keep on the host on CUDA too
            else:
                if input_keys is None:
                    input_keys = _storage_keys(args, kwargs)
                if key in input_keys:  # an alias of an input that predates the session
                    continue
            fresh.append(storage)
        if not fresh and not resized:
            return
        backward = in_backward()
        frames = self._allocation_frames(backward)
        with self._lock:
            self._drain_locked()
            for storage, tracked in resized:
                self._reallocate(func, storage, tracked, frames, backward)
            for storage in fresh:
                self._track(func, storage, frames, backward)
            self._drain_locked()

    def storage_resized(self, storage: Any) -> None:
        """`UntypedStorage.resize_` ran on `storage` (no dispatch mode sees it): FSDP frees and
        re-allocates unsharded parameters this way. A tracked storage is reallocated at its new size
        (released at 0 bytes); one from before the session stays host memory."""
        if _in_forked_child or self._mode is None or threading.get_ident() != self._thread or self.suspended:
            return
        tracked = self._live.get(storage._cdata)
        if tracked is None or tracked.ref() is not storage or storage.nbytes() == tracked.nbytes:
            return
        backward = in_backward()
        frames = self._allocation_frames(backward)
        with self._lock:
            self._drain_locked()
            self._reallocate(_RESIZE_OP, storage, tracked, frames, backward)
            self._drain_locked()

    def _allocation_frames(self, backward: bool) -> list[Frame] | None:
        if backward:
            return []
        if not self.capture_frames:
            return None
        return python_frames(sys._getframe(2))

    def _track(self, func: Any, storage: Any, frames: Any, backward: bool) -> None:
        key = storage._cdata
        stale = self._live.pop(key, None)  # its release is still queued; the address is reused
        if stale is not None and stale.address is not None:
            self.simulator.free(stale.address)
        nbytes = storage.nbytes()
        address = self._malloc(func, nbytes, frames) if nbytes > 0 else None
        ref = _StorageRef(storage, self._storage_released)
        ref.key = key
        self._live[key] = _Tracked(ref, address, nbytes, frames, backward)

    def _reallocate(self, func: Any, storage: Any, tracked: _Tracked, frames: Any, backward: bool) -> None:
        nbytes = storage.nbytes()
        old_address = tracked.address
        # CUDA's resize allocates the new block, copies, then frees the old one.
        tracked.address = self._malloc(func, nbytes, frames) if nbytes > 0 else None
        tracked.nbytes = nbytes
        tracked.frames = frames
        tracked.in_backward = backward
        if old_address is not None:
            self.simulator.free(old_address)

    def _malloc(self, func: Any, nbytes: int, frames: Any) -> int:
        try:
            return self.simulator.malloc(nbytes, frames=frames)
        except self._out_of_memory_type as error:
            stack = frames if frames else python_frames(sys._getframe(1))
            record = OomRecord(
                message=str(error),
                op=str(func),
                request_bytes=int(error.request_bytes),
                alloc_bytes=int(error.alloc_bytes),
                device_total_bytes=int(error.device_total_bytes),
                device_free_bytes=int(error.device_free_bytes),
                phase=self.current_phase(stack),
                frames=stack,
            )
            self.ooms.append(record)
            raise _SimulatedOom(error, record) from None

    def notify_observers(self, oom: _SimulatedOom) -> None:
        """Run the OOM observers, as torch's malloc does before it throws."""
        error = oom.error
        for observer in list(self.observers):
            observer(
                int(error.device),
                int(error.alloc_bytes),
                int(error.device_total_bytes),
                int(error.device_free_bytes),
            )

    # -- record_function scopes ----------------------------------------------------------------

    def scope_entered(self, name: str) -> None:
        self._scope_names.append(name)
        with self._lock:
            self.simulator.annotate(name, "START")

    def scope_exited(self) -> None:
        # The handle torch passes back is a fresh Python wrapper, so pair scopes by nesting order.
        if not self._scope_names:
            return
        name = self._scope_names.pop()
        with self._lock:
            self.simulator.annotate(name, "END")


_RESIZE_OP = "torch.UntypedStorage.resize_"


def _patch_storage_resize(recorder: StorageRecorder) -> Callable[[], None]:
    """Wrap `torch.UntypedStorage.resize_`, which bypasses the dispatcher, as torch's MemTracker does."""
    original = torch.UntypedStorage.resize_

    def resize_(storage: Any, size: int) -> Any:
        result = original(storage, size)
        try:
            recorder.storage_resized(storage)
        except _SimulatedOom as oom:
            recorder.notify_observers(oom)
            raise OUT_OF_MEMORY_ERROR(oom.record.message) from None
        return result

    torch.UntypedStorage.resize_ = resize_  # type: ignore[method-assign]

    def restore() -> None:
        torch.UntypedStorage.resize_ = original  # type: ignore[method-assign]

    return restore


def _patch_sharding_propagation(recorder: StorageRecorder) -> Callable[[], None]:
    """Ignore the ops DTensor's sharding propagation runs on global-shape fake tensors to learn an
    output's shape: they allocate nothing on a device."""
    try:
        from torch.distributed.tensor._sharding_prop import ShardingPropagator
    except ImportError:  # torch built without distributed
        return lambda: None
    original = ShardingPropagator.__dict__.get("_propagate_tensor_meta_non_cached")
    if original is None:
        return lambda: None

    def propagate(self: Any, *args: Any, **kwargs: Any) -> Any:
        recorder.suspended += 1
        try:
            return original(self, *args, **kwargs)
        finally:
            recorder.suspended -= 1

    ShardingPropagator._propagate_tensor_meta_non_cached = propagate  # type: ignore[method-assign]

    def restore() -> None:
        ShardingPropagator._propagate_tensor_meta_non_cached = original  # type: ignore[method-assign]

    return restore


def _made_by_optimizer(frame: Any) -> bool:
    """Whether the innermost frame outside the dispatch machinery and oomdoctor is in torch/optim."""
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename not in _DISPATCH_FILES and not _is_own_file(filename):
            return filename.startswith(_OPTIM_DIR)
        frame = frame.f_back
    return False


def _tensors(value: Any) -> list[Any]:
    """The tensors in an op's output or arguments (tensors, nested tuples, lists and dicts), in order."""
    if isinstance(value, torch.Tensor):
        return [value]
    found: list[Any] = []
    _collect_tensors(value, found)
    return found


def _collect_tensors(value: Any, found: list[Any]) -> None:
    if isinstance(value, torch.Tensor):
        found.append(value)
    elif isinstance(value, (tuple, list)):
        for item in value:
            _collect_tensors(item, found)
    elif isinstance(value, dict):
        for item in value.values():
            _collect_tensors(item, found)


def _storage_keys(args: tuple, kwargs: dict) -> set[int]:
    keys = set()
    for value in _tensors((args, kwargs)):
        try:
            keys.add(value.untyped_storage()._cdata)
        except (NotImplementedError, RuntimeError):
            continue
    return keys


_wrapper_subclasses: dict[type, bool] = {}


def _is_wrapper_subclass(kind: type) -> bool:
    known = _wrapper_subclasses.get(kind)
    if known is None:
        known = _wrapper_subclasses[kind] = bool(is_traceable_wrapper_subclass_type(kind))
    return known


class _RecordingMode(TorchDispatchMode):
    def __init__(self, recorder: StorageRecorder) -> None:
        super().__init__()
        self.recorder = recorder

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _in_forked_child or self.recorder.suspended:
            return func(*args, **kwargs)
        if any(_is_wrapper_subclass(kind) for kind in types):
            # DTensor and other wrapper subclasses: let the subclass run its local ops, which come
            # back here on the tensors that hold the memory (a DTensor has no storage of its own).
            return NotImplemented
        packet = func.overloadpacket
        if packet in _RECORD_FUNCTION_ENTER:
            self.recorder.scope_entered(str(args[0]))
            return func(*args, **kwargs)
        if packet is _RECORD_FUNCTION_EXIT:
            self.recorder.scope_exited()
            return func(*args, **kwargs)
        out = func(*args, **kwargs)
        try:
            self.recorder.after_op(func, args, kwargs, out)
        except _SimulatedOom as oom:
            failed = oom
        else:
            return out
        del out  # the outputs that did not fit are released unaccounted, as on a GPU
        self.recorder.notify_observers(failed)
        message = failed.record.message
        # The internal exception's traceback holds this frame, whose local holds the exception: a
        # cycle that would keep the failed op's tensors (and the script's frames) alive until the
        # cyclic GC runs, so that a script which catches the OOM and retries (a batch-size finder)
        # would find less memory than on a GPU. Break it before raising what torch raises.
        failed.__traceback__ = None
        failed.error.__traceback__ = None
        del failed
        raise OUT_OF_MEMORY_ERROR(message)
