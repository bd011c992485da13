"""The registry of named tensors: which storage is which parameter, gradient, optimizer state, buffer or input.

Walked at dump time only, over the root modules and optimizers the phase recorder saw (held weakly,
so a dump never keeps a model alive). Names are `named_parameters()` / `named_buffers()` names; when
the process used more than one root module with tensors, each name is prefixed with the root's class
name (`Generator.net.0.weight`). A gradient is named `<parameter>.grad`, an optimizer state tensor
`<parameter>.<state key>` (`fc.weight.exp_avg`); a parameter an optimizer holds that no module
names is `<Optimizer class>.param_groups.<g>.params.<i>`. Nothing here touches device memory: only
storage addresses, shapes and dtypes are read.

Sharded models: FSDP2 (`fully_shard`) parameters, their gradients and the optimizer state made for
them are DTensors, wrapper subclasses with no storage of their own; each is registered by its local
shard (`_local_tensor`, or `to_local()`), under the parameter's name, with the shard's shape and
bytes. While a forward or backward runs, FSDP2 puts the unsharded (all-gathered) parameters on the
modules: those are named as the parameters then, and the shards the optimizer holds get its
fallback names. DDP's gradient buckets live in its C++ reducer and are not named.

Last come the inputs: the tensors each root module's latest outermost call was given (remembered
weakly by the phase recorder) that are still alive, named `<ModelClass>.forward arg 0` or
`<ModelClass>.forward kwarg attention_mask`. A tensor that is already registered (a parameter, a
buffer, ...), shares a registered storage, is an autograd result (has a grad_fn: another model's
output, say) or is not on the device is left out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from oomdoctor.capture.markers import input_label
from oomdoctor.metadata import (
    COMPONENT_BUFFER,
    COMPONENT_GRADIENT,
    COMPONENT_INPUT,
    COMPONENT_OPTIMIZER_STATE,
    COMPONENT_PARAMETER,
)

StorageAddress = Callable[[Any], "int | None"]
# (root module, [(place in the call, weak reference to a tensor)]), as the phase recorder keeps them
InputRecords = Iterable[tuple[Any, Iterable[tuple[Any, Callable[[], Any]]]]]


def _count_tensors(module: Any) -> int:
    try:
        return sum(1 for _ in module.parameters()) + sum(1 for _ in module.buffers())
    except Exception:
        return 0


def _prefixes(modules: list[Any]) -> list[str]:
    """'' for a lone root; otherwise the class name, numbered when two roots share it."""
    if len(modules) <= 1:
        return [""] * len(modules)
    names = [type(module).__name__ for module in modules]
    prefixes = []
    for index, name in enumerate(names):
        if names.count(name) > 1:
            name = f"{name}[{names[:index].count(name)}]"
        prefixes.append(name + ".")
    return prefixes


def local_tensor(tensor: Any) -> Any:
    """The tensor whose storage holds `tensor`'s bytes on this rank: a DTensor's local shard (FSDP2
    parameters, their gradients and optimizer state are DTensors, wrapper subclasses with no storage
    of their own), else the tensor itself."""
    local = getattr(tensor, "_local_tensor", None)
    if local is not None:
        return local
    to_local = getattr(tensor, "to_local", None)
    if callable(to_local):
        try:
            return to_local()
        except Exception:
            return tensor
    return tensor


class _Collector:
    def __init__(self, storage_address: StorageAddress, default_device: int | None) -> None:
        self.storage_address = storage_address
        self.default_device = default_device
        self.entries: list[dict[str, Any]] = []
        self.seen: set[tuple[int, str]] = set()  # (id(tensor), component)
        self.addresses: set[int] = set()  # storages registered so far

    def add(self, tensor: Any, component: str, name: str) -> None:
        key = (id(tensor), component)
        if key in self.seen:
            return
        self.seen.add(key)
        try:
            tensor = local_tensor(tensor)  # a DTensor's shard: its shape and bytes are this rank's
            address = self.storage_address(tensor)
            if address is None:
                return
            if component == COMPONENT_INPUT and int(address) in self.addresses:
                return
            device = getattr(tensor.device, "index", None)
            self.entries.append(
                {
                    "address": int(address),
                    "device": self.default_device if device is None else int(device),
                    "component": component,
                    "name": name,
                    "shape": [int(size) for size in tensor.shape],
                    "dtype": str(tensor.dtype).removeprefix("torch."),
                    "size_bytes": int(tensor.numel()) * int(tensor.element_size()),
                }
            )
            self.addresses.add(int(address))
        except Exception:  # sparse, meta or otherwise unusual tensors: skip, never fail the dump
            return


def collect_tensors(
    modules: Iterable[Any],
    optimizers: Iterable[Any],
    storage_address: StorageAddress,
    default_device: int | None = None,
    forward_inputs: InputRecords = (),
) -> list[dict[str, Any]]:
    """Registry entries as the metadata contract's `tensors` list describes them."""
    import torch

    roots = [module for module in modules if _count_tensors(module) > 0]
    # the largest root first, so that a submodule also called on its own keeps its full name
    roots.sort(key=_count_tensors, reverse=True)
    collector = _Collector(storage_address, default_device)
    parameter_names: dict[int, str] = {}
    for prefix, module in zip(_prefixes(roots), roots):
        for name, parameter in module.named_parameters():
            parameter_names.setdefault(id(parameter), prefix + name)
        for name, buffer in module.named_buffers():
            if isinstance(buffer, torch.Tensor):
                collector.add(buffer, COMPONENT_BUFFER, prefix + name)

    optimizer_list = list(optimizers)
    for optimizer in optimizer_list:
        for group_index, group in enumerate(getattr(optimizer, "param_groups", [])):
            for index, parameter in enumerate(group.get("params", [])):
                parameter_names.setdefault(
                    id(parameter), f"{type(optimizer).__name__}.param_groups.{group_index}.params.{index}"
                )

    parameters: dict[int, Any] = {}
    for module in roots:
        for parameter in module.parameters():
            parameters.setdefault(id(parameter), parameter)
    for optimizer in optimizer_list:
        for group in getattr(optimizer, "param_groups", []):
            for parameter in group.get("params", []):
                parameters.setdefault(id(parameter), parameter)

    for key, parameter in parameters.items():
        name = parameter_names[key]
        collector.add(parameter, COMPONENT_PARAMETER, name)
        grad = getattr(parameter, "grad", None)
        if isinstance(grad, torch.Tensor):
            collector.add(grad, COMPONENT_GRADIENT, name + ".grad")

    for optimizer in optimizer_list:
        state = getattr(optimizer, "state", {})
        for parameter, values in list(state.items()):
            owner = parameter_names.get(id(parameter), f"{type(optimizer).__name__}.state")
            if not isinstance(values, dict):
                continue
            for state_key, value in values.items():
                if isinstance(value, torch.Tensor):
                    collector.add(value, COMPONENT_OPTIMIZER_STATE, f"{owner}.{state_key}")

    registered = {key for key, _ in collector.seen}
    for module, records in forward_inputs:
        for place, reference in records:
            tensor = reference()
            if tensor is None or id(tensor) in registered or isinstance(tensor, torch.nn.Parameter):
                continue
            if getattr(tensor, "grad_fn", None) is not None:
                continue
            registered.add(id(tensor))
            collector.add(tensor, COMPONENT_INPUT, f"{type(module).__name__}.forward {input_label(place)}")
    return collector.entries
