"""Step and phase markers, and the models and optimizers the process used, without user code.

Phases are bracketed by wrapping the few entry points every training loop goes through:

* forward: `nn.Module.__call__`; only the outermost call makes a marker (calls made inside a
  forward, a backward (activation checkpointing recomputes) or another module are part of it);
* backward: `torch.autograd.backward`, which `Tensor.backward` calls;
* optimizer step: torch's global optimizer step pre/post hooks;
* zero_grad: `Optimizer.zero_grad` and `Module.zero_grad`.

`nn.Module.__call__` is wrapped rather than hooked with `register_module_forward_pre_hook` because
any global module hook sends every module call in the process down torch's slow path: about 3% of
the step time of a small model on CPU, against the 1% this package may cost. The wrapper adds one
Python call per module call and keeps torch's fast path.

The step index is the largest number of `step()` calls any single optimizer has completed, so a GAN
with two optimizers that each step once per iteration counts iterations, and an optimizer wrapping
another (Lookahead, ZeroRedundancyOptimizer) is not counted twice.

Every wrapper does O(1) work per call: a flag test, and at the outermost call a tuple appended to a
bounded deque. Markers become dicts only when a dump is written.
"""

from __future__ import annotations

import functools
import importlib
import weakref
from collections import deque
from time import time_ns
from typing import Any, Callable

from oomdoctor.metadata import PHASE_BACKWARD, PHASE_FORWARD, PHASE_OPTIMIZER, PHASE_ZERO_GRAD

START = "start"
END = "end"


class PhaseRecorder:
    """Records (phase, edge, step, time_us) tuples; remembers root modules and optimizers weakly."""

    def __init__(self, max_markers: int = 100_000) -> None:
        self.markers: deque[tuple[str, str, int, int]] = deque(maxlen=max_markers)
        self.step = 0
        self.active = False
        self.in_forward = False
        self.in_backward = False
        self.in_zero_grad = False
        # in_forward or in_backward or not active: the one flag the per-module-call path reads
        self.pass_module_calls = True
        self.stepping: list[int] = []  # ids of optimizers inside step(), outermost first
        self.root_modules: weakref.WeakSet[Any] = weakref.WeakSet()
        self.optimizers: weakref.WeakSet[Any] = weakref.WeakSet()
        self._steps_by_optimizer: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
        # set by the capture session; each must not raise
        self.on_phase_start: Callable[[], None] | None = None
        self.on_exception: Callable[[BaseException], None] | None = None
        self._restore: list[Callable[[], None]] = []

    # -- recording (hot path) -------------------------------------------------------------------

    def _start(self, phase: str) -> None:
        self.markers.append((phase, START, self.step, time_ns() // 1000))
        if self.on_phase_start is not None:
            self.on_phase_start()

    def _end(self, phase: str) -> None:
        self.markers.append((phase, END, self.step, time_ns() // 1000))

    def _exception(self, error: BaseException) -> None:
        if self.on_exception is not None:
            self.on_exception(error)

    def marker_dicts(self) -> list[dict[str, Any]]:
        return [
            {"phase": phase, "edge": edge, "step": step, "time_us": time_us}
            for phase, edge, step, time_us in list(self.markers)
        ]

    # -- installing -----------------------------------------------------------------------------

    def install(self) -> None:
        import torch
        import torch.nn as nn

        self.active = True
        self._refresh()
        self._wrap_attribute(nn.Module, "__call__", self._module_call_wrapper)
        self._wrap_attribute(torch.autograd, "backward", self._backward_wrapper)
        self._wrap_attribute(torch.optim.Optimizer, "zero_grad", self._zero_grad_wrapper)
        self._wrap_attribute(nn.Module, "zero_grad", self._zero_grad_wrapper)
        optimizer_module = importlib.import_module("torch.optim.optimizer")
        register_pre = getattr(optimizer_module, "register_optimizer_step_pre_hook", None)
        register_post = getattr(optimizer_module, "register_optimizer_step_post_hook", None)
        if register_pre is not None and register_post is not None:
            handles = [register_pre(self._optimizer_pre_hook), register_post(self._optimizer_post_hook)]
            self._restore.append(lambda: [handle.remove() for handle in handles])

    def uninstall(self) -> None:
        self.active = False
        self._refresh()
        self.on_phase_start = None
        self.on_exception = None
        while self._restore:
            self._restore.pop()()

    def _refresh(self) -> None:
        self.pass_module_calls = self.in_forward or self.in_backward or not self.active

    def _wrap_attribute(self, owner: Any, name: str, make_wrapper: Callable[[Any], Any]) -> None:
        original = owner.__dict__[name] if name in owner.__dict__ else getattr(owner, name)
        wrapper = make_wrapper(original)
        setattr(owner, name, wrapper)

        def restore() -> None:
            # someone may have wrapped us in turn; then leave theirs in place (ours is inert now)
            current = owner.__dict__.get(name) if isinstance(owner, type) else getattr(owner, name, None)
            if current is wrapper:
                setattr(owner, name, original)

        self._restore.append(restore)

    def _module_call_wrapper(self, original: Callable[..., Any]) -> Callable[..., Any]:
        recorder = self

        @functools.wraps(original)
        def module_call(module: Any, *args: Any, **kwargs: Any) -> Any:
            if recorder.pass_module_calls:
                return original(module, *args, **kwargs)
            recorder.in_forward = recorder.pass_module_calls = True
            recorder._remember(recorder.root_modules, module)
            if recorder.stepping:  # a step() that raised never ran its post hook
                recorder.stepping.clear()
            recorder._start(PHASE_FORWARD)
            try:
                return original(module, *args, **kwargs)
            except BaseException as error:
                recorder._exception(error)
                raise
            finally:
                recorder.in_forward = False
                recorder._refresh()
                recorder._end(PHASE_FORWARD)

        return module_call

    def _backward_wrapper(self, original: Callable[..., Any]) -> Callable[..., Any]:
        recorder = self

        @functools.wraps(original)
        def backward(*args: Any, **kwargs: Any) -> Any:
            if recorder.in_backward or not recorder.active:
                return original(*args, **kwargs)
            recorder.in_backward = recorder.pass_module_calls = True
            recorder._start(PHASE_BACKWARD)
            try:
                return original(*args, **kwargs)
            except BaseException as error:
                recorder._exception(error)
                raise
            finally:
                recorder.in_backward = False
                recorder._refresh()
                recorder._end(PHASE_BACKWARD)

        return backward

    def _zero_grad_wrapper(self, original: Callable[..., Any]) -> Callable[..., Any]:
        recorder = self

        @functools.wraps(original)
        def zero_grad(owner: Any, *args: Any, **kwargs: Any) -> Any:
            if recorder.in_zero_grad or recorder.in_forward or not recorder.active:
                return original(owner, *args, **kwargs)
            recorder.in_zero_grad = True
            recorder._start(PHASE_ZERO_GRAD)
            try:
                return original(owner, *args, **kwargs)
            finally:
                recorder.in_zero_grad = False
                recorder._end(PHASE_ZERO_GRAD)

        return zero_grad

    @staticmethod
    def _remember(weak_set: Any, owner: Any) -> None:
        try:
            if owner not in weak_set:
                weak_set.add(owner)
        except TypeError:  # a class that defines __eq__ without __hash__: not remembered
            pass

    def _optimizer_pre_hook(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if not self.active:
            return None
        key = id(optimizer)
        if key in self.stepping:  # the same optimizer cannot be inside its own step: stale state
            self.stepping.clear()
        self._remember(self.optimizers, optimizer)
        if not self.stepping:
            self._start(PHASE_OPTIMIZER)
        self.stepping.append(key)
        return None

    def _optimizer_post_hook(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if not self.active:
            return None
        key = id(optimizer)
        if key in self.stepping:
            self.stepping.remove(key)
        try:
            completed = self._steps_by_optimizer.get(optimizer, 0) + 1
            self._steps_by_optimizer[optimizer] = completed
        except TypeError:  # unhashable: count it with the others
            completed = self.step + 1
        if not self.stepping:
            self._end(PHASE_OPTIMIZER)
            if completed > self.step:
                self.step = completed
        return None
