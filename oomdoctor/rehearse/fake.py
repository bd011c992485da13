"""`rehearse --fake`: run the script on tensors that carry no data (torch's FakeTensorMode).

Every tensor the script makes is a FakeTensor on the "cpu" device: it has a shape, a dtype and a
storage of the right size, so the storage recorder sees the same allocations as in the real-CPU
rehearsal, but no kernel computes anything and host RAM stays small whatever the model's size.
What needs data is handled here:

- a scalar read from a fake tensor (`.item()`, `bool()`, `tolist()`, `float()`) returns a
  placeholder (0, 0.0 or False) and its call site is reported with a count;
- an op whose tensor inputs are all real runs for real (optimizer step counters, `torch.tensor(data)`,
  host scalars), so arithmetic on them stays right;
- an op whose output size depends on the data (`nonzero`, `masked_select`, `x[bool_mask]`) is sized
  at its upper bound and reported;
- torch quirks: `Module.to()` / `.float()` (torch's `swap_tensors` refuses the fake mode's memo
  weakrefs), the optimizers' and `clip_grad_norm_`'s foreach path (chosen by exact type), `torch.save`
  of fake tensors (skipped, with a line), DataLoader workers (fork without the fake mode and deliver
  real host batches);
- what cannot run without data raises `FakeDataError` or one of torch's fake-tensor exceptions;
  `explain_failure()` turns it into one line naming the user's line and what to do.

Fake cuda tensors are refused: on a torch without CUDA, autograd on one aborts the process.
"""

from __future__ import annotations

import collections
import os
import sys
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensor,
    FakeTensorMode,
    UnsupportedFakeTensorException,
    UnsupportedOperatorException,
    unset_fake_temporarily,
)
from torch.utils._python_dispatch import TorchDispatchMode

from oomdoctor.rehearse import recorder as recorder_module
from oomdoctor.rehearse.recorder import _is_wrapper_subclass, _tensors, python_frames, user_frame

PREFIX = "oomdoctor rehearse --fake"
SKIP_HINT = "skip that code when OOMDOCTOR_REHEARSAL=1"

aten = torch.ops.aten
_SCALAR_OPS = frozenset({aten._local_scalar_dense.default, aten.item.default})
_DYNAMIC_OPS = frozenset({aten.nonzero.default, aten.masked_select.default, aten.index.Tensor})
_active: FakeRehearsal | None = None


class FakeDataError(BaseException):
    """The script did something fake tensors cannot do; `line` says what and where (one line).

    A BaseException, so that a script's `except Exception` does not swallow it.
    """

    def __init__(self, line: str) -> None:
        super().__init__(line)
        self.line = line


def site_of(frames: list[Any]) -> str:
    """'train.py:42' for the innermost frame outside torch (the user's line), else 'unknown line'."""
    frame = user_frame(frames)
    if frame is None:
        return "unknown line"
    return f"{short_path(frame['filename'])}:{frame['line']}"


def short_path(filename: str) -> str:
    """`filename` relative to the working folder when it lies below it, else as it is."""
    try:
        relative = os.path.relpath(filename)
    except ValueError:
        return filename
    return filename if relative.startswith("..") else relative


def _caller_site() -> str:
    return site_of(python_frames(sys._getframe(2)))


@dataclass
class FakeNotes:
    """What the fake run assumed: placeholders, sizes taken at their upper bound, saves skipped."""

    placeholders: collections.Counter[tuple[str, str]] = field(default_factory=collections.Counter)
    dynamic_sizes: collections.Counter[tuple[str, str]] = field(default_factory=collections.Counter)
    saves_skipped: collections.Counter[str] = field(default_factory=collections.Counter)

    def to_json(self) -> dict[str, Any]:
        return {
            "placeholders": [
                {"site": site, "value": value, "count": count} for (site, value), count in self.placeholders.items()
            ],
            "dynamic_sizes": [
                {"site": site, "op": op, "count": count} for (site, op), count in self.dynamic_sizes.items()
            ],
            "saves_skipped": [{"site": site, "count": count} for site, count in self.saves_skipped.items()],
        }

    def lines(self) -> list[str]:
        """The fake section of the report."""
        lines = ["  fake tensors: no data was computed; loss values are placeholders and the model did not train"]
        for (site, value), count in self.placeholders.items():
            lines.append(f"    placeholder {value} read at {site} ({count}x)")
        for (site, op), count in self.dynamic_sizes.items():
            lines.append(f"    {op} at {site} sized at its upper bound ({count}x)")
        for site, count in self.saves_skipped.items():
            lines.append(f"    torch.save at {site} skipped ({count}x)")
        if self.placeholders:
            lines.append(
                "    code that branches on one of these (early stopping, NaN checks) took the placeholder's way"
            )
        return lines


class FakeRehearsal:
    """The fake mode, the top mode that handles what needs data, and torch's shims, between start() and stop()."""

    def __init__(self) -> None:
        self.notes = FakeNotes()
        self.mode = FakeTensorMode(allow_non_fake_inputs=True)
        self._top: _FakeTopMode | None = None
        self._undo: list[Callable[[], None]] = []
        self._printed: set[tuple[str, str]] = set()

    def enter_fake_mode(self) -> None:
        """Below the storage recorder: call before the recorder starts."""
        global _active
        self.mode.__enter__()
        self._undo.append(lambda: self.mode.__exit__(None, None, None))
        _active = self
        self._undo.append(_clear_active)
        for patch in (_patch_swap_tensors, _patch_foreach_types, _patch_save, _patch_dataloader):
            self._undo.append(patch(self))

    def enter_top_mode(self) -> None:
        """Above the storage recorder: call after it started."""
        self._top = _FakeTopMode(self)
        self._top.__enter__()
        top = self._top
        self._undo.append(lambda: top.__exit__(None, None, None))

    def stop(self) -> None:
        while self._undo:
            self._undo.pop()()

    def say_once(self, key: tuple[str, str], line: str) -> None:
        if key in self._printed:
            return
        self._printed.add(key)
        print(f"{PREFIX}: {line}", file=sys.stderr)


def _clear_active() -> None:
    global _active
    _active = None


def _placeholder(dtype: torch.dtype) -> bool | int | float:
    if dtype is torch.bool:
        return False
    if dtype.is_floating_point or dtype.is_complex:
        return 0.0
    return 0


class _FakeTopMode(TorchDispatchMode):
    def __init__(self, fake: FakeRehearsal) -> None:
        super().__init__()
        self.fake = fake

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if recorder_module._in_forked_child:
            return func(*args, **kwargs)
        if any(_is_wrapper_subclass(kind) for kind in types):
            return NotImplemented
        tensors = _tensors((args, kwargs))
        if tensors and not any(isinstance(tensor, FakeTensor) for tensor in tensors):
            with unset_fake_temporarily():  # all inputs real: run it for real (host scalars, step counters)
                return func(*args, **kwargs)
        if func in _SCALAR_OPS:
            return self._scalar(func, args, kwargs)
        if func in _DYNAMIC_OPS:
            out = self._dynamic(func, args, kwargs)
        else:
            out = func(*args, **kwargs)
        for tensor in _tensors(out):
            if tensor.device.type == "cuda":
                raise FakeDataError(
                    f"{_caller_site()} makes a tensor on cuda, and this torch has no CUDA (autograd on a fake"
                    ' cuda tensor aborts the process). Make the device a parameter ("cpu" under'
                    " rehearsal, when OOMDOCTOR_REHEARSAL=1)."
                )
        return out

    def _scalar(self, func: Any, args: tuple, kwargs: dict) -> Any:
        try:
            return func(*args, **kwargs)  # a constant the fake mode knows
        except DataDependentOutputException:
            pass
        value = _placeholder(args[0].dtype)
        site = _caller_site()
        self.fake.notes.placeholders[(site, repr(value))] += 1
        self.fake.say_once(
            (site, "scalar"), f"{site} reads a value from a fake tensor; it gets the placeholder {value!r}"
        )
        return value

    def _dynamic(self, func: Any, args: tuple, kwargs: dict) -> Any:
        if func is aten.index.Tensor:
            source, indices = args[0], list(args[1])
            if not any(_is_mask(index) for index in indices):
                return func(*args, **kwargs)
            expanded: list[Any] = []
            for index in indices:
                if _is_mask(index):
                    expanded.extend(self._nonzero(index).unbind(1))
                else:
                    expanded.append(index)
            self._note_dynamic("x[bool_mask]")
            return func(source, expanded)
        if func is aten.nonzero.default:
            self._note_dynamic("nonzero")
            return self._nonzero(args[0])
        # masked_select: as many elements as the broadcast of input and mask
        source, mask = args[0], args[1]
        self._note_dynamic("masked_select")
        numel = torch.broadcast_shapes(source.shape, mask.shape).numel()
        return torch.empty(numel, dtype=source.dtype, device=source.device)

    def _nonzero(self, mask: Any) -> Any:
        return torch.empty((mask.numel(), mask.dim()), dtype=torch.long, device=mask.device)

    def _note_dynamic(self, op: str) -> None:
        site = site_of(python_frames(sys._getframe(3)))
        self.fake.notes.dynamic_sizes[(site, op)] += 1
        self.fake.say_once((site, op), f"{site}: {op} depends on the data; sized at its upper bound")


def _is_mask(index: Any) -> bool:
    return isinstance(index, torch.Tensor) and index.dtype in (torch.bool, torch.uint8)


# -- torch shims, each returning its undo -------------------------------------------------------


def _patch_swap_tensors(fake: FakeRehearsal) -> Callable[[], None]:
    """Module._apply swaps fake parameters with `swap_tensors`, which refuses tensors with weakrefs,
    and the fake mode's memo holds one to each tensor it converted: drop those entries first."""
    import torch.utils

    original = torch.utils.swap_tensors
    memo = fake.mode.fake_tensor_converter.tensor_memo

    def forget(t1: Any, t2: Any) -> None:
        data = getattr(memo, "data", None)
        if data is None:
            return
        stale = [key for key, ref in list(data.items()) if ref() is t1 or ref() is t2]
        for key in stale:
            del data[key]

    def swap_tensors(t1: Any, t2: Any) -> Any:
        if weakref.getweakrefs(t1) or weakref.getweakrefs(t2):
            forget(t1, t2)  # in its own frame, so that no reference to a KeyedRef is left here
        return original(t1, t2)

    torch.utils.swap_tensors = swap_tensors

    def restore() -> None:
        torch.utils.swap_tensors = original

    return restore


def _patch_foreach_types(fake: FakeRehearsal) -> Callable[[], None]:
    """Optimizers and clip_grad_norm_ take the foreach path only for exact types; add FakeTensor."""
    import torch.optim.optimizer as optimizer_module
    import torch.utils._foreach_utils as foreach_utils

    lists = [optimizer_module._foreach_supported_types, foreach_utils._foreach_supported_types]
    added = [types for types in lists if FakeTensor not in types]
    for types in added:
        types.append(FakeTensor)

    def restore() -> None:
        for types in added:
            if FakeTensor in types:
                types.remove(FakeTensor)

    return restore


def _holds_fake(value: Any, depth: int = 0) -> bool:
    if isinstance(value, FakeTensor):
        return True
    if depth > 8:
        return False
    if isinstance(value, torch.nn.Module):
        return any(isinstance(tensor, FakeTensor) for tensor in value.state_dict().values())
    if isinstance(value, dict):
        return any(_holds_fake(item, depth + 1) for item in value.values())
    if isinstance(value, (list, tuple)):
        return any(_holds_fake(item, depth + 1) for item in value)
    return False


def _patch_save(fake: FakeRehearsal) -> Callable[[], None]:
    """torch.save of fake tensors cannot pickle them (they hold no data): skip it, with a line."""
    original = torch.save

    def save(obj: Any, *args: Any, **kwargs: Any) -> None:
        if not _holds_fake(obj):
            return original(obj, *args, **kwargs)
        site = _caller_site()
        fake.notes.saves_skipped[site] += 1
        fake.say_once((site, "save"), f"{site}: torch.save skipped (fake tensors hold no data)")
        return None

    torch.save = save

    def restore() -> None:
        torch.save = original

    return restore


def _leave_fake_mode_in_forked_child() -> None:
    # A DataLoader worker builds real host batches: the fake mode the parent's thread had is not
    # wanted there (the recorder and the top mode already pass everything through in a child).
    if _active is None:
        return
    try:
        torch._C._unset_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE)
    except Exception:  # noqa: BLE001 - best effort in a child process
        pass


os.register_at_fork(after_in_child=_leave_fake_mode_in_forked_child)


def _patch_dataloader(fake: FakeRehearsal) -> Callable[[], None]:
    """Batches from worker processes are rebuilt in the parent as real host tensors."""
    try:
        from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter
    except ImportError:
        return lambda: None
    original = _MultiProcessingDataLoaderIter.__dict__.get("_try_get_data")
    if original is None:
        return lambda: None

    def try_get_data(self: Any, *args: Any, **kwargs: Any) -> Any:
        with unset_fake_temporarily():
            return original(self, *args, **kwargs)

    _MultiProcessingDataLoaderIter._try_get_data = try_get_data  # type: ignore[method-assign]

    def restore() -> None:
        _MultiProcessingDataLoaderIter._try_get_data = original  # type: ignore[method-assign]

    return restore


# -- clear errors ---------------------------------------------------------------------------------


def explain_failure(error: BaseException, script_filename: str) -> str | None:
    """One line for a failure that comes from running without data (the user's line, what to do), else None."""
    if isinstance(error, FakeDataError):
        return error.line
    site = _traceback_site(error.__traceback__, script_filename)
    chain = _chain(error)
    for cause in chain:
        if isinstance(cause, DynamicOutputShapeException):
            return (
                f"{site} runs {cause.func}, whose output size depends on the data; fake tensors have no"
                f" data. Rehearse without --fake (real CPU), or {SKIP_HINT}."
            )
        if isinstance(cause, DataDependentOutputException):
            return (
                f"{site} runs {cause.func}, whose result depends on the data; fake tensors have no"
                f" data. Rehearse without --fake (real CPU), or {SKIP_HINT}."
            )
        if isinstance(cause, UnsupportedOperatorException):
            return (
                f"{site} runs {cause.func}, which has no fake implementation; register one with"
                f" torch.library.register_fake, rehearse without --fake, or {SKIP_HINT}."
            )
        if isinstance(cause, UnsupportedFakeTensorException):
            return f"{site}: {cause.reason}; rehearse without --fake, or {SKIP_HINT}."
    for cause in chain:
        text = str(cause)
        if ".numpy()" in text or "data_ptr" in text or "Cannot access data pointer" in text:
            return (
                f"{site} reads the memory of a fake tensor (NumPy or C++ code), and fake tensors have"
                f" no data. Rehearse without --fake (real CPU), or {SKIP_HINT}."
            )
        if "no fake impl registered" in text or "register_fake" in text:
            return (
                f"{site} runs a custom op without a fake implementation; register one with"
                f" torch.library.register_fake, rehearse without --fake, or {SKIP_HINT}."
            )
        if "meta" in text and ("NotImplementedError" in type(cause).__name__ or "not implemented" in text.lower()):
            return (
                f"{site} runs an op without a fake (meta) implementation; register one with"
                f" torch.library.register_fake, rehearse without --fake, or {SKIP_HINT}."
            )
    return None


def _chain(error: BaseException) -> list[BaseException]:
    found: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and current not in found and len(found) < 16:
        found.append(current)
        current = current.__cause__ or current.__context__
    return found


def _traceback_site(trace: Any, script_filename: str) -> str:
    """The user's line: the innermost traceback entry outside torch and oomdoctor."""
    entries = []
    while trace is not None:
        entries.append(trace)
        trace = trace.tb_next
    torch_dir = os.path.dirname(torch.__file__) + os.sep
    for entry in reversed(entries):
        filename = entry.tb_frame.f_code.co_filename
        if filename.startswith(torch_dir) or recorder_module.is_machinery_file(filename) or filename.startswith("<"):
            continue
        return f"{short_path(filename)}:{entry.tb_lineno}"
    return f"{short_path(script_filename)}"
