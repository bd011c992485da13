"""Each optimizer's kind, as the metadata contract's `optimizer_kinds` describes it.

An optimizer's state does not exist before its first `step()`: a run that runs out of memory in its
first forward or backward holds none, and what it will hold depends on the optimizer and its
settings (SGD keeps nothing without momentum and one buffer per parameter with it; Adam two
moments, three with amsgrad). Capture records, for each optimizer it remembers, the class's
qualified name and, for torch's own optimizers, the settings that decide their state and the
number of parameter-sized state tensors (`moments`) they make for each parameter they update. A
class this does not know (a subclass of torch's too: it may keep other state), or whose state is
no whole number of its parameters (Adafactor's factored second moment, LBFGS's history of flat
vectors), is recorded by name only.

Read at dump time only; nothing here touches device memory or raises into the user's code.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

# The settings each known class's state depends on, and the moments per parameter they make.
# Keyed by the class's name inside torch.optim; a class is known only where it *is* torch's.
_Rule = tuple[tuple[str, ...], Callable[[dict[str, Any]], int]]


def _sgd(options: dict[str, Any]) -> int:
    return 1 if options["momentum"] else 0  # momentum_buffer, made only with momentum


def _adam(options: dict[str, Any]) -> int:
    return 3 if options["amsgrad"] else 2  # exp_avg, exp_avg_sq (+ max_exp_avg_sq)


def _rmsprop(options: dict[str, Any]) -> int:
    # square_avg (+ momentum_buffer with momentum, + grad_avg when centered)
    return 1 + (1 if options["momentum"] else 0) + (1 if options["centered"] else 0)


def _constant(moments: int) -> Callable[[dict[str, Any]], int]:
    return lambda options: moments


_RULES: dict[str, _Rule] = {
    "SGD": (("momentum",), _sgd),
    "Adam": (("amsgrad",), _adam),
    "AdamW": (("amsgrad",), _adam),
    "RMSprop": (("momentum", "centered"), _rmsprop),
    "Adamax": ((), _constant(2)),  # exp_avg, exp_inf
    "NAdam": ((), _constant(2)),  # exp_avg, exp_avg_sq
    "RAdam": ((), _constant(2)),  # exp_avg, exp_avg_sq
    "Adadelta": ((), _constant(2)),  # square_avg, acc_delta
    "Rprop": ((), _constant(2)),  # prev, step_size
    "SparseAdam": ((), _constant(2)),  # exp_avg, exp_avg_sq
    "Adagrad": ((), _constant(1)),  # sum (made with the optimizer, not at its first step)
    "ASGD": ((), _constant(1)),  # ax
    "Muon": ((), _constant(1)),  # momentum_buffer
}
# The scalar state beside them (`step`, ASGD's eta and mu, NAdam's mu_product) is no parameter's size.

_OPTION_TYPES = (bool, int, float)


def _torch_class(optimizer: Any) -> str | None:
    """The name in torch.optim of the optimizer's class where the class is torch's own, else None."""
    import torch

    cls = type(optimizer)
    name = cls.__name__
    return name if getattr(torch.optim, name, None) is cls else None


def _setting(groups: list[Any], name: str) -> Any:
    """The value `name` has in every param group; None where a group lacks it, or they differ."""
    values = [group.get(name) if isinstance(group, dict) else None for group in groups]
    first = values[0] if values else None
    if type(first) not in _OPTION_TYPES or any(type(v) is not type(first) or v != first for v in values):
        return None
    return first


def optimizer_kind(optimizer: Any) -> dict[str, Any]:
    """{"class", "moments", "options"} of one optimizer (see the module docstring)."""
    cls = type(optimizer)
    entry: dict[str, Any] = {"class": f"{cls.__module__}.{cls.__qualname__}", "moments": None, "options": {}}
    name = _torch_class(optimizer)
    rule = _RULES.get(name) if name is not None else None
    if rule is None:
        return entry
    settings, moments = rule
    groups = list(getattr(optimizer, "param_groups", None) or [])
    options = {setting: _setting(groups, setting) for setting in settings}
    entry["options"] = options
    if groups and all(value is not None for value in options.values()):
        entry["moments"] = moments(options)  # else the groups differ: no one count says it
    return entry


def optimizer_kinds(optimizers: Iterable[Any]) -> list[dict[str, Any]]:
    """`optimizer_kinds` of the optimizers `optimizers` counts, in its order; one that cannot be
    read is recorded by its class's name alone."""
    kinds = []
    for optimizer in optimizers:
        try:
            kinds.append(optimizer_kind(optimizer))
        except Exception:  # a strange optimizer is no reason to lose the dump
            cls = type(optimizer)
            kinds.append({"class": f"{cls.__module__}.{cls.__qualname__}", "moments": None, "options": {}})
    return kinds
