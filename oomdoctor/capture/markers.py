"""Step and phase markers, and the models and optimizers the process used, without user code.

Phases are bracketed by wrapping the few entry points every training loop goes through:

* forward: `nn.Module.__call__`; only the outermost call makes a marker (calls made inside a
  forward, a backward (activation checkpointing recomputes) or another module are part of it);
  a call made with gradients off (`torch.no_grad()`, `torch.inference_mode()`) is an evaluation;
* backward: `torch.autograd.backward`, which `Tensor.backward` calls;
* optimizer step: torch's global optimizer step pre/post hooks;
* zero_grad: `Optimizer.zero_grad` and `Module.zero_grad`.

Optimizers are remembered when they are made (`Optimizer.__init__`, wrapped) or first step.

`nn.Module.__call__` is wrapped rather than hooked with `register_module_forward_pre_hook` because
any global module hook sends every module call in the process down torch's slow path: about 3% of
the step time of a small model on CPU, against the 1% this package may cost. When the function it
wraps is torch's own `_wrapped_call_impl` (its compiled code is compared at install), the wrapper
does what that function does in its own frame, so a nested module call costs one flag test more
(about 40 ns) and no extra Python frame: stacks show `module_call` where `_wrapped_call_impl` was.
Anything else (someone else's wrapper) is called as it is, one frame deeper.

The step index is the largest number of `step()` calls any single optimizer has completed, so a GAN
with two optimizers that each step once per iteration counts iterations, and an optimizer wrapping
another (Lookahead, ZeroRedundancyOptimizer) is not counted twice.

Every wrapper does O(1) work per call: a flag test, and at the outermost call a tuple appended to a
bounded deque. Markers become dicts only when a dump is written. Modules and optimizers seen before
are found by id() in a plain dict whose entries hold a weak reference (checked to be the object,
and removing the entry when it dies), so the weak registry sets are touched once per object, not
once per call.

The outermost call also remembers what the model was given: weak references to the tensors among
its arguments and keyword arguments, one level deep (a tensor argument, or the tensors directly
inside a list, tuple or mapping argument, among its first MAX_INPUT_TENSORS items), at most MAX_INPUT_TENSORS of them, and only for the latest
call of each root module. The registry names the ones still alive at dump time as inputs.
"""

from __future__ import annotations

import functools
import importlib
import weakref
from collections import deque
from collections.abc import Callable, Mapping
from itertools import islice
from time import time_ns
from typing import Any

from oomdoctor.metadata import PHASE_BACKWARD, PHASE_EVALUATION, PHASE_FORWARD, PHASE_OPTIMIZER, PHASE_ZERO_GRAD

START = "start"
END = "end"

# Tensors remembered per outermost module call: a batch, its targets and masks, not a whole dataset.
MAX_INPUT_TENSORS = 32

# Where a remembered tensor sat in the call: ("arg", position, key) or ("kwarg", name, key); key is
# None for the argument itself, else the list/tuple index or dict key inside it.
InputPlace = tuple[str, "int | str", "int | str | None"]


def input_label(place: InputPlace) -> str:
    """`arg 0`, `kwarg attention_mask`, `arg 1[0]`, `kwarg batch[labels]`."""
    kind, where, key = place
    label = f"{kind} {where}"
    return label if key is None else f"{label}[{key}]"


def _torch_wrapped_call_impl(self: Any, *args: Any, **kwargs: Any) -> Any:
    # torch's nn.Module._wrapped_call_impl, token for token: the wrapper does this itself when
    # nn.Module.__call__ is that function (the compiled code is compared, see _is_torch_call_impl)
    if self._compiled_call_impl is not None:
        return self._compiled_call_impl(*args, **kwargs)  # type: ignore[misc]
    else:
        return self._call_impl(*args, **kwargs)


def _is_torch_call_impl(function: Any) -> bool:
    """Whether `function` compiles to exactly _torch_wrapped_call_impl (same torch, same Python)."""
    ours = _torch_wrapped_call_impl.__code__
    theirs = getattr(function, "__code__", None)
    if theirs is None or getattr(function, "__name__", None) != "_wrapped_call_impl":
        return False
    # co_flags without the bits of `from __future__` imports (this module has one, torch's not)
    return (ours.co_flags & 0xFFFF) == (getattr(theirs, "co_flags", 0) & 0xFFFF) and all(
        getattr(ours, name) == getattr(theirs, name, None)
        for name in (
            "co_code",
            "co_names",
            "co_consts",
            "co_varnames",
            "co_argcount",
            "co_kwonlyargcount",
            "co_freevars",
            "co_cellvars",
        )
    )


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
        # the optimizer phase has a start marker without its end (with step(closure), it starts
        # only when the closure returns)
        self.optimizer_open = False
        self.root_modules: weakref.WeakSet[Any] = weakref.WeakSet()
        self.optimizers: weakref.WeakSet[Any] = weakref.WeakSet()
        # root module -> [weak reference to it, the tensors its latest outermost call was given as
        # (place, weak reference)]; the list in the entry is replaced whole by each call
        self.forward_inputs: weakref.WeakKeyDictionary[Any, list[Any]] = weakref.WeakKeyDictionary()
        # The hot paths find a module or optimizer seen before by id() in a plain dict: an entry
        # holds a weak reference whose callback removes the entry when the object dies, and the
        # reference is checked to be the object. WeakSet and WeakKeyDictionary make a weak
        # reference on every lookup; these are touched once per object.
        self._roots_by_id: dict[int, list[Any]] = {}  # id -> [reference, inputs] (forward_inputs' entry)
        self._optimizers_by_id: dict[int, list[Any]] = {}  # id -> [reference, completed steps]
        self._tensor_type: type | None = None
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
        self._tensor_type = torch.Tensor
        self._refresh()
        self._wrap_attribute(nn.Module, "__call__", self._module_call_wrapper)
        self._wrap_attribute(torch.autograd, "backward", self._backward_wrapper)
        self._wrap_attribute(torch.optim.Optimizer, "zero_grad", self._zero_grad_wrapper)
        self._wrap_attribute(torch.optim.Optimizer, "__init__", self._optimizer_init_wrapper)
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
        markers = self.markers
        roots_by_id = self._roots_by_id
        # Every module call goes through here; all but the outermost only pass through. When the
        # wrapped function is torch's own _wrapped_call_impl, passing through does what it does
        # in this frame, so a nested module call costs one flag test more than without oomdoctor
        # instead of one more Python frame.
        inline_torch_call = _is_torch_call_impl(original)
        import torch

        grad_enabled = torch.is_grad_enabled

        @functools.wraps(original)
        def module_call(module: Any, *args: Any, **kwargs: Any) -> Any:
            if recorder.pass_module_calls:
                if not inline_torch_call:
                    return original(module, *args, **kwargs)
                if module._compiled_call_impl is not None:
                    return module._compiled_call_impl(*args, **kwargs)
                return module._call_impl(*args, **kwargs)
            recorder.in_forward = recorder.pass_module_calls = True
            root = roots_by_id.get(id(module))
            if root is None or root[0]() is not module:
                root = recorder._new_root(module)
            if root is not None:
                root[1] = recorder._tensors_given(args, kwargs)
            if recorder.stepping:  # a step() that raised never ran its post hook
                recorder.stepping.clear()
            phase = PHASE_FORWARD if grad_enabled() else PHASE_EVALUATION  # a pass that cannot train
            markers.append((phase, START, recorder.step, time_ns() // 1000))
            if recorder.on_phase_start is not None:
                recorder.on_phase_start()
            try:
                return original(module, *args, **kwargs)
            except BaseException as error:
                if recorder.on_exception is not None:
                    recorder.on_exception(error)
                raise
            finally:
                recorder.in_forward = False
                recorder.pass_module_calls = recorder.in_backward or not recorder.active
                markers.append((phase, END, recorder.step, time_ns() // 1000))

        return module_call

    def _backward_wrapper(self, original: Callable[..., Any]) -> Callable[..., Any]:
        recorder = self
        markers = self.markers

        @functools.wraps(original)
        def backward(*args: Any, **kwargs: Any) -> Any:
            if recorder.in_backward or not recorder.active:
                return original(*args, **kwargs)
            recorder.in_backward = recorder.pass_module_calls = True
            markers.append((PHASE_BACKWARD, START, recorder.step, time_ns() // 1000))
            if recorder.on_phase_start is not None:
                recorder.on_phase_start()
            try:
                return original(*args, **kwargs)
            except BaseException as error:
                if recorder.on_exception is not None:
                    recorder.on_exception(error)
                raise
            finally:
                recorder.in_backward = False
                recorder.pass_module_calls = recorder.in_forward or not recorder.active
                markers.append((PHASE_BACKWARD, END, recorder.step, time_ns() // 1000))

        return backward

    def _zero_grad_wrapper(self, original: Callable[..., Any]) -> Callable[..., Any]:
        recorder = self
        markers = self.markers

        @functools.wraps(original)
        def zero_grad(owner: Any, *args: Any, **kwargs: Any) -> Any:
            if recorder.in_zero_grad or recorder.in_forward or not recorder.active:
                return original(owner, *args, **kwargs)
            recorder.in_zero_grad = True
            markers.append((PHASE_ZERO_GRAD, START, recorder.step, time_ns() // 1000))
            if recorder.on_phase_start is not None:
                recorder.on_phase_start()
            try:
                return original(owner, *args, **kwargs)
            finally:
                recorder.in_zero_grad = False
                markers.append((PHASE_ZERO_GRAD, END, recorder.step, time_ns() // 1000))

        return zero_grad

    def _optimizer_init_wrapper(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """An optimizer is remembered when it is made (`torch.optim.Optimizer.__init__`, which every
        optimizer of torch's, and a subclass of it, runs), not only at its first step: a run that ran
        out in its first forward has made its optimizer, which tells that it trains. Once per
        optimizer; nothing here raises into the user's code."""
        recorder = self

        @functools.wraps(original)
        def optimizer_init(optimizer: Any, *args: Any, **kwargs: Any) -> None:
            original(optimizer, *args, **kwargs)
            if recorder.active:
                try:
                    recorder._optimizer_entry(optimizer)
                except Exception:  # an optimizer this cannot remember is no reason to fail its making
                    pass

        return optimizer_init

    # -- remembering (once per object, and the inputs of each outermost call) -------------------

    def _new_root(self, module: Any) -> list[Any] | None:
        """A module called at top level for the first time: register it, and its entry for inputs."""
        try:
            key = id(module)
            roots_by_id = self._roots_by_id

            def forget(reference: Any) -> None:
                entry = roots_by_id.get(key)
                if entry is not None and entry[0] is reference:
                    del roots_by_id[key]

            root: list[Any] = [weakref.ref(module, forget), []]
        except TypeError:  # no weak references to it: not remembered
            return None
        roots_by_id[key] = root
        try:
            self.root_modules.add(module)
            self.forward_inputs[module] = root
        except TypeError:  # a class that defines __eq__ without __hash__: not in the registry
            pass
        return root

    def _tensors_given(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[tuple[InputPlace, Any]]:
        """Weak references to the tensors an outermost call was given (see the module docstring)."""
        found: list[tuple[InputPlace, Any]] = []
        tensor_type = self._tensor_type
        if tensor_type is None:
            return found
        try:
            for position, value in enumerate(args):
                if isinstance(value, tensor_type):
                    if len(found) < MAX_INPUT_TENSORS:
                        found.append((("arg", position, None), weakref.ref(value)))
                else:
                    self._collect_inputs(value, "arg", position, found)
            for name, value in kwargs.items():
                self._collect_inputs(value, "kwarg", name, found)
        except Exception:  # an odd container: what was found so far
            pass
        return found

    def _collect_inputs(self, value: Any, kind: str, where: int | str, found: list[tuple[InputPlace, Any]]) -> None:
        tensor_type = self._tensor_type
        if tensor_type is None or len(found) >= MAX_INPUT_TENSORS:
            return
        if isinstance(value, tensor_type):
            found.append(((kind, where, None), weakref.ref(value)))
            return
        if isinstance(value, (list, tuple)):
            items: Any = enumerate(value)
        elif isinstance(value, Mapping):
            items = value.items()
        else:
            return
        for key, item in islice(items, MAX_INPUT_TENSORS):  # a long list is not walked to its end
            if isinstance(item, tensor_type):
                if len(found) >= MAX_INPUT_TENSORS:
                    return
                found.append(((kind, where, key), weakref.ref(item)))

    def input_records(self) -> list[tuple[Any, list[tuple[InputPlace, Any]]]]:
        """(root module, [(place, weak reference)]) for every root module's latest outermost call."""
        return [(module, root[1]) for module, root in list(self.forward_inputs.items())]

    def _optimizer_entry(self, optimizer: Any) -> list[Any] | None:
        """[weak reference, completed steps] of an optimizer; the first time, it is registered."""
        key = id(optimizer)
        entry = self._optimizers_by_id.get(key)
        if entry is not None and entry[0]() is optimizer:
            return entry
        optimizers_by_id = self._optimizers_by_id

        def forget(reference: Any) -> None:
            current = optimizers_by_id.get(key)
            if current is not None and current[0] is reference:
                del optimizers_by_id[key]

        try:
            entry = [weakref.ref(optimizer, forget), 0]
        except TypeError:  # no weak references to it: counted with the others, not registered
            return None
        optimizers_by_id[key] = entry
        try:
            self.optimizers.add(optimizer)
        except TypeError:  # a class that defines __eq__ without __hash__: not in the registry
            pass
        return entry

    def _optimizer_pre_hook(self, optimizer: Any, args: Any, kwargs: Any) -> Any:
        if not self.active:
            return None
        key = id(optimizer)
        stepping = self.stepping
        if key in stepping:  # the same optimizer cannot be inside its own step: stale state
            stepping.clear()
        self._optimizer_entry(optimizer)
        with_closure = self._outside_the_step(args, kwargs)
        if not stepping and with_closure is None:
            self._start(PHASE_OPTIMIZER)
            self.optimizer_open = True
        stepping.append(key)
        return with_closure

    def _outside_the_step(self, args: Any, kwargs: Any) -> Any:
        """`step(closure)` (PyTorch Lightning's automatic optimisation, LBFGS): the closure runs the
        step's forward, zero_grad and backward, so only what comes after it is the optimizer step.
        The optimizer is handed a wrapped closure that leaves the optimizer phase while it runs
        (and, for its duration, the stepping state, so that its forward is recorded as one).
        Without a closure: None, step() is called as it was. `args` are step()'s own, the
        optimizer first."""
        closure = kwargs.get("closure") if kwargs else None
        by_position = closure is None and len(args) > 1 and callable(args[1])
        if by_position:
            closure = args[1]
        if closure is None or not callable(closure):
            return None
        recorder = self

        @functools.wraps(closure)
        def closure_outside_the_step(*inner: Any, **inner_kwargs: Any) -> Any:
            stepping = recorder.stepping
            held = list(stepping)
            if recorder.optimizer_open:  # a second call (LBFGS): out of the update again
                recorder._end(PHASE_OPTIMIZER)
                recorder.optimizer_open = False
            stepping.clear()
            try:
                return closure(*inner, **inner_kwargs)
            finally:
                stepping[:] = held
                if held and recorder.active:
                    recorder._start(PHASE_OPTIMIZER)
                    recorder.optimizer_open = True

        if by_position:
            return (args[0], closure_outside_the_step, *args[2:]), kwargs
        return args, {**kwargs, "closure": closure_outside_the_step}

    def _optimizer_post_hook(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if not self.active:
            return None
        key = id(optimizer)
        stepping = self.stepping
        if key in stepping:
            stepping.remove(key)
        entry = self._optimizer_entry(optimizer)
        if entry is None:
            completed = self.step + 1
        else:
            entry[1] = completed = entry[1] + 1
        if not stepping:
            if not self.optimizer_open:  # step(closure) that never called its closure
                self._start(PHASE_OPTIMIZER)
            self._end(PHASE_OPTIMIZER)
            self.optimizer_open = False
            if completed > self.step:
                self.step = completed
        return None
