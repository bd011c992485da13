"""The registry of named tensors: which storage is which parameter, gradient, optimizer state, buffer or input.

Walked at dump time only, over the root modules and optimizers the phase recorder saw (held weakly,
so a dump never keeps a model alive). Names are `named_parameters()` / `named_buffers()` names; when
the process used more than one root module with tensors, each name is prefixed with the root's class
name (`Generator.net.0.weight`). A gradient is named `<parameter>.grad`, an optimizer state tensor
`<parameter>.<state key>` (`fc.weight.exp_avg`); a parameter an optimizer holds that no module
names is `<Optimizer class>.param_groups.<g>.params.<i>`. A parameter's entry also says whether it
`requires_grad`: a frozen one (a LoRA base) gets neither a gradient nor optimizer state. Nothing here touches device memory: only
storage addresses, shapes and dtypes are read.

Sharded models: FSDP2 (`fully_shard`) parameters, their gradients and the optimizer state made for
them are DTensors, wrapper subclasses with no storage of their own; each is registered by its local
shard (`_local_tensor`, or `to_local()`), under the parameter's name, with the shard's shape and
bytes. While a forward or backward runs, FSDP2 puts the unsharded (all-gathered) parameters on the
modules: those are named as the parameters then, and the shards the optimizer holds get its
fallback names.

Flat buffers: when several registered tensors of one component are views into one storage (DDP's
gradient buckets with `gradient_as_bucket_view=True`, FSDP2's reduce-scatter output, FSDP1's flat
parameters with `use_orig_params=True`, Megatron's param-and-grad buffers, DeepSpeed ZeRO's flat
groups), that storage is registered once, under a name that says what it is and which tensors it
holds (`DDP gradient bucket (12 gradients: fc1.weight.grad … fc3.bias.grad)`), with the storage's
shape and bytes. Tensors that all cover their whole storage (tied weights) keep an entry each.
Without `gradient_as_bucket_view`, DDP's buckets are allocations of its C++ reducer that nothing in
Python reaches: the analysis places them by their allocation frames.

DeepSpeed: a root module holding a ZeRO optimizer (`DeepSpeedEngine.optimizer`: stage 1 and 2's
`DeepSpeedZeroOptimizer`, stage 3's `DeepSpeedZeroOptimizer_Stage3`, told apart by their
attributes, DeepSpeed is never imported here) has its flat 16-bit parameter groups, fp32 master
partitions, gradient partitions and reduction buckets named (`ZeRO-2 bf16 parameters of group 0`,
`ZeRO-2 fp32 partition of group 0`, `ZeRO-2 gradient bucket (bf16)`), and the optimizer it wraps
joins the registry's optimizers: its state is named after the partition it belongs to
(`ZeRO-2 fp32 partition of group 0.exp_avg`).

Last come the inputs: the tensors each root module's latest outermost call was given (remembered
weakly by the phase recorder) that are still alive, named `<ModelClass>.forward arg 0` or
`<ModelClass>.forward kwarg attention_mask`. A tensor that is already registered (a parameter, a
buffer, ...), shares a registered storage, is an autograd result (has a grad_fn: another model's
output, say) or is not on the device is left out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
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

_MEMBER_NAME_LIMIT = 80  # characters of a member's name in a flat buffer's name (cut in the middle)
_DDP_BUCKET = "DDP gradient bucket"
_FLAT_LABEL = {
    COMPONENT_PARAMETER: ("flat parameter buffer", "parameters"),
    COMPONENT_GRADIENT: ("flat gradient buffer", "gradients"),
    COMPONENT_OPTIMIZER_STATE: ("flat optimizer state buffer", "tensors"),
    COMPONENT_BUFFER: ("flat buffer storage", "buffers"),
}
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


def _storage_bytes(tensor: Any) -> int | None:
    try:
        return int(tensor.untyped_storage().nbytes())
    except Exception:
        return None


def _cut(name: str, limit: int = _MEMBER_NAME_LIMIT) -> str:
    if len(name) <= limit:
        return name
    head = (limit - 1) // 2
    return f"{name[:head]}…{name[len(name) - (limit - 1 - head) :]}"


def flat_buffer_name(label: str, noun: str, members: list[str]) -> str:
    """`label (n noun: first … last)`, bounded in length whatever the members' names."""
    if not members:
        return label
    if len(members) == 1:
        return f"{label} ({_cut(members[0])})"
    joint = ", " if len(members) == 2 else " … "
    return f"{label} ({len(members)} {noun}: {_cut(members[0])}{joint}{_cut(members[-1])})"


# a parameter entry's keys that say whether it trains (metadata.py's `tensors`)
_TRAINING_KEYS = ("requires_grad",)


class _Collector:
    def __init__(self, storage_address: StorageAddress, default_device: int | None) -> None:
        self.storage_address = storage_address
        self.default_device = default_device
        self.entries: list[dict[str, Any]] = []
        # per entry: (bytes of its whole storage or None, whether it owns a flat buffer, the label
        # of a flat buffer it is a view into, when one holds several registered tensors)
        self.layout: list[tuple[int | None, bool, str | None]] = []
        self.seen: set[tuple[int, str]] = set()  # (id(tensor), component)
        self.addresses: set[int] = set()  # storages registered so far

    def add(
        self,
        tensor: Any,
        component: str,
        name: str,
        *,
        owner: bool = False,
        label: str | None = None,
        extra: dict[str, bool] | None = None,
    ) -> None:
        """Register `tensor`; `owner`: it is a flat buffer that others registered are views into
        (its name names the buffer); `label`: what to call its storage if it is a view into one
        that holds other registered tensors too; `extra`: more keys of its entry (a parameter's
        `requires_grad`)."""
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
                    **(extra or {}),
                }
            )
            self.layout.append((_storage_bytes(tensor), owner, label))
            self.addresses.add(int(address))
        except Exception:  # sparse, meta or otherwise unusual tensors: skip, never fail the dump
            return

    def finish(self) -> list[dict[str, Any]]:
        """The entries, with each flat buffer (a storage that several registered tensors of one
        component are views into, or one registered as an owner) folded into one entry."""
        groups: dict[tuple[int, str], list[int]] = {}
        for index, entry in enumerate(self.entries):
            if entry["component"] != COMPONENT_INPUT:
                groups.setdefault((entry["address"], entry["component"]), []).append(index)
        replaced: dict[int, dict[str, Any] | None] = {}
        for (_, component), indices in groups.items():
            merged = self._merge(component, indices)
            if merged is not None:
                replaced[indices[0]] = merged
                replaced.update((index, None) for index in indices[1:])
        if not replaced:
            return self.entries
        kept = (replaced.get(index, entry) for index, entry in enumerate(self.entries))
        return [entry for entry in kept if entry is not None]

    def _merge(self, component: str, indices: list[int]) -> dict[str, Any] | None:
        storage = self.layout[indices[0]][0]
        owners = [index for index in indices if self.layout[index][1]]
        members = [index for index in indices if index not in owners[:1]]
        names = list(dict.fromkeys(self.entries[index]["name"] for index in members))
        if storage is None:
            return None
        if not owners:
            if len(names) < 2 or all(self.entries[index]["size_bytes"] >= storage for index in indices):
                return None  # one tensor, or aliases of one (tied weights): each keeps its entry
            generic, noun = _FLAT_LABEL.get(component, ("flat storage", "tensors"))
            label = self.layout[indices[0]][2] or generic
        else:
            label = self.entries[owners[0]]["name"]
            noun = _FLAT_LABEL.get(component, ("", "tensors"))[1]
            if len(indices) == 1 and self.entries[indices[0]]["size_bytes"] >= storage:
                return None  # an owner alone, its whole storage: as registered
        first = self.entries[owners[0] if owners else indices[0]]
        element = max(1, first["size_bytes"] // max(1, _numel(first["shape"])))
        # a flat buffer of parameters trains where any of its members does
        trains = {
            key: any(self.entries[index].get(key) for index in indices)
            for key in _TRAINING_KEYS
            if any(key in self.entries[index] for index in indices)
        }
        return {
            **first,
            **trains,
            "name": flat_buffer_name(label, noun, names),
            "shape": [storage // element],
            "size_bytes": storage,
        }


def _numel(shape: list[int]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count


def _precision(tensor: Any) -> str:
    name = str(getattr(tensor, "dtype", "")).removeprefix("torch.")
    return {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "float64": "fp64"}.get(name, name)


def _tensors_in(value: Any) -> Iterator[Any]:
    """The tensors of a value DeepSpeed keeps: a tensor, or a list, tuple or dict of them."""
    import torch

    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            if isinstance(item, torch.Tensor):
                yield item
    elif isinstance(value, dict):
        for item in value.values():
            if isinstance(item, torch.Tensor):
                yield item


def zero_stage(optimizer: Any) -> str | None:
    """The stage of a DeepSpeed ZeRO optimizer, told by its attributes ("ZeRO-1", "ZeRO-2",
    "ZeRO-3"), or None for anything else."""
    attributes = getattr(optimizer, "__dict__", None)
    if not isinstance(attributes, dict):
        return None
    if "single_partition_of_fp32_groups" in attributes and "bit16_groups_flat" in attributes:
        return "ZeRO-2" if attributes.get("partition_gradients") else "ZeRO-1"
    if "fp32_partitioned_groups_flat" in attributes and "fp16_partitioned_groups_flat" in attributes:
        return "ZeRO-3"
    return None


def _zero_optimizers(modules: Iterable[Any]) -> list[Any]:
    """The DeepSpeed ZeRO optimizers the root modules hold (a DeepSpeedEngine's `optimizer`)."""
    found = []
    for module in modules:
        attributes = getattr(module, "__dict__", None)
        optimizer = attributes.get("optimizer") if isinstance(attributes, dict) else None
        if zero_stage(optimizer) is not None and all(optimizer is not seen for seen in found):
            found.append(optimizer)
    return found


class _ZeroLayout:
    """What one ZeRO optimizer holds: the names of its fp32 partitions (the parameters of the
    optimizer it wraps) and its flat buffers and the views into them, each (tensor, component,
    name, owner, label) as `_Collector.add` takes them."""

    def __init__(self, optimizer: Any, parameter_names: dict[int, str]) -> None:
        self.stage = zero_stage(optimizer) or "ZeRO"
        self.attributes: dict[str, Any] = vars(optimizer)
        self.parameter_names = parameter_names
        self.inner = self.attributes.get("optimizer")
        self.partitions: list[tuple[Any, str]] = []  # (fp32 partition, name)
        self.buffers: list[tuple[Any, str, str, bool, str | None]] = []
        # DeepSpeed's attributes change between versions: what cannot be read is left unnamed
        for read in (self._stage3 if self.stage == "ZeRO-3" else self._stage1_and_2, self._buckets):
            try:
                read()
            except Exception:
                continue

    def _param_name(self, parameter: Any) -> str | None:
        return self.parameter_names.get(id(parameter))

    def _stage1_and_2(self) -> None:
        stage, attributes = self.stage, self.attributes
        for group, flat in enumerate(_tensors_in(attributes.get("bit16_groups_flat"))):
            self.buffers.append(
                (flat, COMPONENT_PARAMETER, f"{stage} {_precision(flat)} parameters of group {group}", True, None)
            )
        for group, partition in enumerate(_tensors_in(attributes.get("single_partition_of_fp32_groups"))):
            self.partitions.append((partition, f"{stage} {_precision(partition)} partition of group {group}"))
        for flat in _tensors_in(attributes.get("grads_in_partition")):
            self.buffers.append((flat, COMPONENT_GRADIENT, f"{stage} gradient partition", True, None))
        averaged = attributes.get("averaged_gradients")
        in_partition = attributes.get("params_in_partition")
        for group, gradients in averaged.items() if isinstance(averaged, dict) else ():
            flat = getattr(gradients, "flat_partition", None)
            if flat is not None:  # one flat buffer the group's gradient partitions are views into
                self.buffers.append(
                    (flat, COMPONENT_GRADIENT, f"{stage} gradient partition of group {group}", True, None)
                )
            params = in_partition[group] if isinstance(in_partition, list) and group < len(in_partition) else []
            for index, gradient in enumerate(_tensors_in(gradients)):
                owner = self._param_name(params[index]) if index < len(params) else None
                name = f"{owner}.grad" if owner else f"{stage} averaged gradient {index} of group {group}"
                label = f"{stage} gradient partition of group {group}"
                self.buffers.append((gradient, COMPONENT_GRADIENT, name, False, label))

    def _stage3(self) -> None:
        stage, attributes = self.stage, self.attributes
        parameters = [p for group in attributes.get("fp16_groups") or () for p in group]
        lp_buffer = attributes.get("lp_param_buffer")
        for flat in _tensors_in(lp_buffer):
            self.buffers.append(
                (flat, COMPONENT_PARAMETER, f"{stage} {_precision(flat)} parameter partitions", True, None)
            )
        if lp_buffer is None:  # parameters offloaded: a flat buffer per sub-group
            for group, flat in enumerate(_tensors_in(attributes.get("fp16_partitioned_groups_flat"))):
                name = f"{stage} {_precision(flat)} partition of sub-group {group}"
                self.buffers.append((flat, COMPONENT_PARAMETER, name, True, None))
        for parameter in parameters:  # each parameter's partition: a view into the flat buffer
            name = self._param_name(parameter)
            for shard in _tensors_in(getattr(parameter, "ds_tensor", None)):
                if name:
                    self.buffers.append((shard, COMPONENT_PARAMETER, name, False, None))
        for group, partition in enumerate(_tensors_in(attributes.get("fp32_partitioned_groups_flat"))):
            self.partitions.append((partition, f"{stage} {_precision(partition)} partition of sub-group {group}"))
        for flat in _tensors_in(attributes.get("grad_partitions_flat_buffer")):
            self.buffers.append((flat, COMPONENT_GRADIENT, f"{stage} gradient partitions", True, None))
        by_id = {getattr(p, "ds_id", None): p for p in parameters}
        grad_partitions = attributes.get("_DeepSpeedZeroOptimizer_Stage3__param_id_to_grad_partition")
        for ds_id, gradient in grad_partitions.items() if isinstance(grad_partitions, dict) else ():
            name = self._param_name(by_id.get(ds_id))
            for tensor in _tensors_in(gradient):
                if name:
                    self.buffers.append((tensor, COMPONENT_GRADIENT, f"{name}.grad", False, None))

    def _buckets(self) -> None:
        buckets = self.attributes.get("ipg_buckets")
        for bucket in buckets.values() if isinstance(buckets, dict) else ():
            tensors = list(_tensors_in(getattr(bucket, "buffer", None)))
            for index, tensor in enumerate(tensors):
                number = f" {index}" if len(tensors) > 1 else ""
                name = f"{self.stage} gradient bucket ({_precision(tensor)}){number}"
                self.buffers.append((tensor, COMPONENT_GRADIENT, name, True, None))


def _is_ddp(module: Any) -> bool:
    """Whether a root module is torch's DistributedDataParallel (by its reducer, not its class)."""
    attributes = getattr(module, "__dict__", None)
    return (
        isinstance(attributes, dict)
        and attributes.get("reducer") is not None
        and "module" in attributes.get("_modules", {})
    )


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
    bucketed: set[int] = set()  # parameters whose gradients DDP buckets
    for prefix, module in zip(_prefixes(roots), roots):
        ddp = _is_ddp(module)
        for name, parameter in module.named_parameters():
            parameter_names.setdefault(id(parameter), prefix + name)
            if ddp:
                bucketed.add(id(parameter))
        for name, buffer in module.named_buffers():
            if isinstance(buffer, torch.Tensor):
                collector.add(buffer, COMPONENT_BUFFER, prefix + name)

    optimizer_list = list(optimizers)
    zero = [_ZeroLayout(optimizer, parameter_names) for optimizer in _zero_optimizers(roots)]
    for layout in zero:
        inner = layout.inner
        if inner is not None and getattr(inner, "param_groups", None) is not None:
            if all(inner is not seen for seen in optimizer_list):
                optimizer_list.append(inner)  # the optimizer it wraps, stepped or not
        for partition, name in layout.partitions:
            parameter_names.setdefault(id(partition), name)

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
    for layout in zero:
        for partition, _ in layout.partitions:
            parameters.setdefault(id(partition), partition)
    for optimizer in optimizer_list:
        for group in getattr(optimizer, "param_groups", []):
            for parameter in group.get("params", []):
                parameters.setdefault(id(parameter), parameter)

    for key, parameter in parameters.items():
        name = parameter_names[key]
        # a frozen parameter (a LoRA base, a reference model) gets no gradient and no optimizer state
        training = {"requires_grad": bool(getattr(parameter, "requires_grad", True))}
        collector.add(parameter, COMPONENT_PARAMETER, name, extra=training)
        grad = getattr(parameter, "grad", None)
        if isinstance(grad, torch.Tensor):
            collector.add(grad, COMPONENT_GRADIENT, name + ".grad", label=_DDP_BUCKET if key in bucketed else None)

    for layout in zero:
        for tensor, component, name, owner, label in layout.buffers:
            collector.add(tensor, component, name, owner=owner, label=label)

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
    return collector.finish()
