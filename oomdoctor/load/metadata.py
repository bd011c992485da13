"""oomdoctor's metadata key (plain data) to the typed `DumpMetadata`: the one place it is validated.

    metadata = parse_metadata(raw)  # raw: the frozen mapping convert._build_metadata returns, or None

Each field of the wrong kind or out of range is dropped (None, or left out of its list) and named in
`DumpMetadata.dropped`; no note is added for it, so that reports read the same. The rules are in the
docstring of `oomdoctor.dump_metadata`. Whole-key problems (not plain data, ints beyond 64 bits,
nesting or expansion bombs) are caught before this, by `freeze_builtins`, which drops the key with
a note. The parser does not rely on that: it checks int64 ranges itself and reads plain dicts and
lists as well as frozen ones, so tests can hand it a literal.

Entries of a list that are the same object (a pickle can share one dict many times) are parsed once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import fields
from typing import Any, TypeVar

from oomdoctor.dump_metadata import (
    DeviceInfo,
    DumpMetadata,
    Elastic,
    ExceptionInfo,
    Framework,
    HistoryCall,
    Marker,
    MemGetInfo,
    MemoryStats,
    OomRecord,
    OptimizerKind,
    Recording,
    RegisteredTensor,
    Rehearsal,
    Versions,
)
from oomdoctor.metadata import FRAMEWORK_STAGES, HISTORY_ACTIONS, MAX_OPTIMIZER_MOMENTS, PHASES
from oomdoctor.model import FrozenDict

__all__ = ["parse_metadata"]

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_LISTS = (list, tuple)
_MEMORY_STATS = tuple(f.name for f in fields(MemoryStats))

T = TypeVar("T")


# A marker's words are capture's: a phase name from a stranger's file is no phase (and would reach
# the views as text).
_MARKER_PHASES = frozenset(PHASES)
_HISTORY_ACTIONS = frozenset(HISTORY_ACTIONS)
_MARKER_EDGES = frozenset(("start", "end"))
_FRAMEWORK_STAGES = frozenset(FRAMEWORK_STAGES)


class _Fields:
    """Reads typed values out of one parse, remembering what it dropped."""

    def __init__(self) -> None:
        self.dropped: dict[str, None] = {}  # insertion-ordered set

    def drop(self, path: str) -> None:
        self.dropped[path] = None

    def integer(self, value: Any, path: str, *, signed: bool = False) -> int | None:
        if value is None:
            return None
        if type(value) is int and (_INT64_MIN if signed else 0) <= value <= _INT64_MAX:
            return value
        self.drop(path)
        return None

    def text(self, value: Any, path: str) -> str | None:
        if value is None or type(value) is str:
            return value
        self.drop(path)
        return None

    def word(self, value: Any, path: str, vocabulary: frozenset[str]) -> str | None:
        """A str that must be one of `vocabulary` (a marker's phase or edge); anything else is dropped."""
        if value is None or (type(value) is str and value in vocabulary):
            return value
        self.drop(path)
        return None

    def flag(self, value: Any, path: str) -> bool | None:
        if value is None or type(value) is bool:
            return value
        self.drop(path)
        return None

    def section(self, value: Any, path: str) -> Mapping[str, Any] | None:
        if value is None or isinstance(value, Mapping):
            return value
        self.drop(path)
        return None

    def entries(self, value: Any, path: str) -> tuple[Any, ...] | list[Any]:
        if value is None:
            return ()
        if type(value) in _LISTS:
            return value
        self.drop(path)
        return ()

    def each(
        self, value: Any, path: str, parse: Callable[[Mapping[str, Any], str, _Fields], T | None]
    ) -> tuple[T, ...]:
        """The parsed mapping entries of the list `value`, in order; other entries are dropped."""
        parsed: list[T] = []
        done: dict[int, T | None] = {}
        for entry in self.entries(value, path):
            key = id(entry)
            if key in done:
                item = done[key]
            elif isinstance(entry, Mapping):
                item = done[key] = parse(entry, path + "[]", self)
            else:
                self.drop(path + "[]")
                item = done[key] = None
            if item is not None:
                parsed.append(item)
        return tuple(parsed)


def _versions(raw: Mapping[str, Any], path: str, read: _Fields) -> Versions:
    return Versions(
        oomdoctor=read.text(raw.get("oomdoctor"), path + ".oomdoctor"),
        torch=read.text(raw.get("torch"), path + ".torch"),
        cuda=read.text(raw.get("cuda"), path + ".cuda"),
        python=read.text(raw.get("python"), path + ".python"),
        cudnn=read.text(raw.get("cudnn"), path + ".cudnn"),
        nccl=read.text(raw.get("nccl"), path + ".nccl"),
    )


def _capability(value: Any, path: str, read: _Fields) -> tuple[int, int] | None:
    if value is None:
        return None
    if (
        type(value) in _LISTS
        and len(value) == 2
        and all(type(v) is int and _INT64_MIN <= v <= _INT64_MAX for v in value)
    ):
        return (value[0], value[1])
    read.drop(path)
    return None


def _device(raw: Mapping[str, Any], path: str, read: _Fields) -> DeviceInfo:
    return DeviceInfo(
        index=read.integer(raw.get("index"), path + ".index"),
        name=read.text(raw.get("name"), path + ".name"),
        capability=_capability(raw.get("capability"), path + ".capability", read),
        total_memory_bytes=read.integer(raw.get("total_memory_bytes"), path + ".total_memory_bytes"),
    )


def _mem_get_info(raw: Mapping[str, Any], path: str, read: _Fields) -> MemGetInfo:
    return MemGetInfo(
        free_bytes=read.integer(raw.get("free_bytes"), path + ".free_bytes"),
        total_bytes=read.integer(raw.get("total_bytes"), path + ".total_bytes"),
    )


def _memory_stats(raw: Mapping[str, Any], path: str, read: _Fields) -> MemoryStats:
    return MemoryStats(**{name: read.integer(raw.get(name), f"{path}.{name}") for name in _MEMORY_STATS})


def _elastic(raw: Mapping[str, Any], path: str, read: _Fields) -> Elastic:
    return Elastic(
        run_id=read.text(raw.get("run_id"), path + ".run_id"),
        restart_count=read.integer(raw.get("restart_count"), path + ".restart_count"),
        max_restarts=read.integer(raw.get("max_restarts"), path + ".max_restarts"),
        group_rank=read.integer(raw.get("group_rank"), path + ".group_rank"),
        group_world_size=read.integer(raw.get("group_world_size"), path + ".group_world_size"),
        role_name=read.text(raw.get("role_name"), path + ".role_name"),
        role_rank=read.integer(raw.get("role_rank"), path + ".role_rank"),
        role_world_size=read.integer(raw.get("role_world_size"), path + ".role_world_size"),
        local_world_size=read.integer(raw.get("local_world_size"), path + ".local_world_size"),
    )


def _framework(raw: Mapping[str, Any], path: str, read: _Fields) -> Framework:
    return Framework(
        name=read.text(raw.get("name"), path + ".name"),
        version=read.text(raw.get("version"), path + ".version"),
        stage=read.word(raw.get("stage"), path + ".stage", _FRAMEWORK_STAGES),
        global_step=read.integer(raw.get("global_step"), path + ".global_step"),
        epoch=read.integer(raw.get("epoch"), path + ".epoch"),
    )


def _alloc_conf(raw: Mapping[str, Any], path: str, read: _Fields) -> Mapping[str, str]:
    conf = {}
    for name, value in raw.items():
        if type(name) is str and type(value) is str:
            conf[name] = value
        else:
            read.drop(path + "[]")
    return FrozenDict(conf)


def _oom(raw: Mapping[str, Any], path: str, read: _Fields) -> OomRecord:
    return OomRecord(
        device=read.integer(raw.get("device"), path + ".device"),
        alloc_bytes=read.integer(raw.get("alloc_bytes"), path + ".alloc_bytes"),
        device_total_bytes=read.integer(raw.get("device_total_bytes"), path + ".device_total_bytes"),
        device_free_bytes=read.integer(raw.get("device_free_bytes"), path + ".device_free_bytes"),
        time_us=read.integer(raw.get("time_us"), path + ".time_us", signed=True),
        surfaced=read.flag(raw.get("surfaced"), path + ".surfaced"),
        site=read.text(raw.get("site"), path + ".site"),
        occurrence=read.integer(raw.get("occurrence"), path + ".occurrence"),
    )


def _exception(raw: Mapping[str, Any], path: str, read: _Fields) -> ExceptionInfo:
    return ExceptionInfo(
        type=read.text(raw.get("type"), path + ".type"),
        message=read.text(raw.get("message"), path + ".message"),
        traceback=read.text(raw.get("traceback"), path + ".traceback"),
        caught=read.flag(raw.get("caught"), path + ".caught"),
    )


def _marker(raw: Mapping[str, Any], path: str, read: _Fields) -> Marker:
    phase, edge, step, time_us = raw.get("phase"), raw.get("edge"), raw.get("step"), raw.get("time_us")
    if (  # the common case, checked at once: markers can number in the hundreds of thousands
        type(phase) is str
        and type(edge) is str
        and phase in _MARKER_PHASES
        and edge in _MARKER_EDGES
        and type(step) is int
        and type(time_us) is int
        and 0 <= step <= _INT64_MAX
        and _INT64_MIN <= time_us <= _INT64_MAX
    ):
        return Marker(phase, edge, step, time_us)
    return Marker(
        phase=read.word(raw.get("phase"), path + ".phase", _MARKER_PHASES),
        edge=read.word(raw.get("edge"), path + ".edge", _MARKER_EDGES),
        step=read.integer(raw.get("step"), path + ".step"),
        time_us=read.integer(raw.get("time_us"), path + ".time_us", signed=True),
    )


def _shape(value: Any, path: str, read: _Fields) -> tuple[int, ...] | None:
    if value is None:
        return None
    if type(value) in _LISTS and all(type(v) is int and 0 <= v <= _INT64_MAX for v in value):
        return tuple(value)
    read.drop(path)
    return None


def _tensor(raw: Mapping[str, Any], path: str, read: _Fields) -> RegisteredTensor | None:
    get: Callable[[str], Any] = raw.get
    address, device, component, name = get("address"), get("device"), get("component"), get("name")
    shape, dtype, size, flag = get("shape"), get("dtype"), get("size_bytes"), get("requires_grad")
    if (  # the common case, checked at once: a large model registers hundreds of thousands
        type(address) is int
        and type(device) is int
        and type(size) is int
        and type(component) is str
        and type(name) is str
        and type(dtype) is str
        and type(shape) in _LISTS
        and 0 <= address <= _INT64_MAX
        and 0 <= device <= _INT64_MAX
        and 0 <= size <= _INT64_MAX
        and all(type(v) is int and 0 <= v <= _INT64_MAX for v in shape)
        and (flag is None or type(flag) is bool)
    ):
        return RegisteredTensor(address, device, component, name, tuple(shape), dtype, size, flag)
    address = read.integer(raw.get("address"), path + ".address")
    if address is None:
        read.drop(path + ".address")  # a missing address drops the entry too
        return None
    device = raw.get("device")
    if device is not None and read.integer(device, path + ".device") is None:
        return None
    return RegisteredTensor(
        address=address,
        device=device,
        component=read.text(raw.get("component"), path + ".component"),
        name=read.text(raw.get("name"), path + ".name"),
        shape=_shape(raw.get("shape"), path + ".shape", read),
        dtype=read.text(raw.get("dtype"), path + ".dtype"),
        size_bytes=read.integer(raw.get("size_bytes"), path + ".size_bytes"),
        requires_grad=read.flag(raw.get("requires_grad"), path + ".requires_grad"),
    )


def _options(raw: Mapping[str, Any], path: str, read: _Fields) -> Mapping[str, bool | int | float | None]:
    """An optimizer's deciding settings: str names to bool, int64, float or None; others dropped."""
    options: dict[str, bool | int | float | None] = {}
    for name, value in raw.items():
        if type(name) is str and (
            value is None or type(value) in (bool, float) or (type(value) is int and _INT64_MIN <= value <= _INT64_MAX)
        ):
            options[name] = value
        else:
            read.drop(path + "[]")
    return FrozenDict(options)


def _optimizer_kind(raw: Mapping[str, Any], path: str, read: _Fields) -> OptimizerKind:
    moments = read.integer(raw.get("moments"), path + ".moments")
    if moments is not None and moments > MAX_OPTIMIZER_MOMENTS:
        read.drop(path + ".moments")
        moments = None
    options = read.section(raw.get("options"), path + ".options")
    return OptimizerKind(
        class_name=read.text(raw.get("class"), path + ".class"),
        moments=moments,
        options=_options(options, path + ".options", read) if options is not None else None,
    )


def _recording(raw: Mapping[str, Any], path: str, read: _Fields) -> Recording:
    return Recording(
        max_entries=read.integer(raw.get("max_entries"), path + ".max_entries"),
        stacks=read.text(raw.get("stacks"), path + ".stacks"),
        context=read.text(raw.get("context"), path + ".context"),
        started_by=read.text(raw.get("started_by"), path + ".started_by"),
        rearmed=read.each(raw.get("rearmed"), path + ".rearmed", _history_call),
    )


def _history_call(raw: Mapping[str, Any], path: str, read: _Fields) -> HistoryCall:
    return HistoryCall(
        action=read.word(raw.get("action"), path + ".action", _HISTORY_ACTIONS),
        time_us=read.integer(raw.get("time_us"), path + ".time_us", signed=True),
        caller=read.text(raw.get("caller"), path + ".caller"),
        enabled=read.text(raw.get("enabled"), path + ".enabled"),
        context=read.text(raw.get("context"), path + ".context"),
        stacks=read.text(raw.get("stacks"), path + ".stacks"),
        max_entries=read.integer(raw.get("max_entries"), path + ".max_entries"),
    )


def _rehearsal(raw: Mapping[str, Any], path: str, read: _Fields) -> Rehearsal:
    return Rehearsal(
        device_memory_bytes=read.integer(raw.get("device_memory_bytes"), path + ".device_memory_bytes"),
        outside_bytes=read.integer(raw.get("outside_bytes"), path + ".outside_bytes"),
        alloc_conf=read.text(raw.get("alloc_conf"), path + ".alloc_conf"),
    )


def _sub(
    raw: Mapping[str, Any], key: str, read: _Fields, parse: Callable[[Mapping[str, Any], str, _Fields], T]
) -> T | None:
    section = read.section(raw.get(key), key)
    return parse(section, key, read) if section is not None else None


def parse_metadata(raw: Any) -> DumpMetadata | None:
    """The typed metadata of `raw` (the dump's `oomdoctor` key as plain data); None when `raw` is
    None or not a mapping."""
    if not isinstance(raw, Mapping):
        return None
    read = _Fields()
    argv = []
    for argument in read.entries(raw.get("argv"), "argv"):
        if type(argument) is str:
            argv.append(argument)
        else:
            read.drop("argv[]")

    metadata = DumpMetadata(
        schema_version=read.integer(raw.get("schema_version"), "schema_version", signed=True),
        versions=_sub(raw, "versions", read, _versions),
        host=read.text(raw.get("host"), "host"),
        pid=read.integer(raw.get("pid"), "pid"),
        argv=tuple(argv),
        rank=read.integer(raw.get("rank"), "rank"),
        local_rank=read.integer(raw.get("local_rank"), "local_rank"),
        world_size=read.integer(raw.get("world_size"), "world_size"),
        device=_sub(raw, "device", read, _device),
        mem_get_info=_sub(raw, "mem_get_info", read, _mem_get_info),
        memory_stats=_sub(raw, "memory_stats", read, _memory_stats),
        alloc_conf=_sub(raw, "alloc_conf", read, _alloc_conf),
        oom=_sub(raw, "oom", read, _oom),
        ooms_observed=read.each(raw.get("ooms_observed"), "ooms_observed", _oom),
        exception=_sub(raw, "exception", read, _exception),
        markers=read.each(raw.get("markers"), "markers", _marker),
        optimizers=read.integer(raw.get("optimizers"), "optimizers"),
        optimizer_kinds=read.each(raw.get("optimizer_kinds"), "optimizer_kinds", _optimizer_kind),
        tensors=read.each(raw.get("tensors"), "tensors", _tensor),
        recording=_sub(raw, "recording", read, _recording),
        reason=read.text(raw.get("reason"), "reason"),
        rehearsal=_sub(raw, "rehearsal", read, _rehearsal),
        elastic=_sub(raw, "elastic", read, _elastic),
        environment=_sub(raw, "environment", read, _alloc_conf),
        packages=_sub(raw, "packages", read, _alloc_conf),
        framework=_sub(raw, "framework", read, _framework),
        dropped=tuple(read.dropped),
    )
    return metadata
