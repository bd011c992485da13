"""Where a dump came from: versions, device, process and settings, read from the model for the reports.

Everything comes from oomdoctor's metadata key (DESIGN §4) when the dump has one, and from what the
loader recognised otherwise (the container and the torch versions its keys suggest). Every field is
optional: plain torch snapshots carry no versions, host or device name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from oomdoctor.model import Snapshot


@dataclass(frozen=True, slots=True)
class Environment:
    torch_version: str | None = None
    torch_version_hint: str | None = None  # from the snapshot's keys, when the dump does not say
    cuda_version: str | None = None
    python_version: str | None = None
    oomdoctor_version: str | None = None
    device_name: str | None = None
    device_capability: str | None = None  # "8.0"
    device_total_bytes: int | None = None
    host: str | None = None
    pid: int | None = None
    argv: tuple[str, ...] = ()
    rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None
    alloc_conf: str | None = None  # PYTORCH_CUDA_ALLOC_CONF as the allocator last parsed it
    recording: str | None = None  # "max_entries 100000, stacks python, context all"
    reason: str | None = None  # "oom" | "manual" | "peak"
    exception_type: str | None = None
    rehearsed: bool = False  # written by `oomdoctor rehearse` on a simulated allocator
    container: str | None = None
    source_format: str | None = None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def environment_of(snapshot: Snapshot) -> Environment:
    meta = _mapping(snapshot.oomdoctor)
    versions = _mapping(meta.get("versions"))
    device = _mapping(meta.get("device"))
    capability = device.get("capability")
    capability_text = None
    if isinstance(capability, (list, tuple)) and len(capability) == 2 and all(_int(c) is not None for c in capability):
        capability_text = f"{capability[0]}.{capability[1]}"
    argv = meta.get("argv")
    recording = _mapping(meta.get("recording"))
    recording_text = (
        ", ".join(
            f"{key} {recording[key]}"
            for key in ("max_entries", "stacks", "context")
            if type(recording.get(key)) in (str, int)
        )
        or None
    )
    alloc_conf = None
    if snapshot.allocator_settings is not None:
        alloc_conf = snapshot.allocator_settings.raw_conf
    else:
        conf = _mapping(meta.get("alloc_conf"))
        alloc_conf = _text(conf.get("PYTORCH_CUDA_ALLOC_CONF")) or _text(conf.get("PYTORCH_ALLOC_CONF"))
    exception = _mapping(meta.get("exception"))
    return Environment(
        torch_version=_text(versions.get("torch")),
        torch_version_hint=snapshot.torch_version_hint or None,
        cuda_version=_text(versions.get("cuda")),
        python_version=_text(versions.get("python")),
        oomdoctor_version=_text(versions.get("oomdoctor")),
        device_name=_text(device.get("name")),
        device_capability=capability_text,
        device_total_bytes=_int(device.get("total_memory_bytes")),
        host=_text(meta.get("host")),
        pid=_int(meta.get("pid")),
        argv=tuple(a for a in argv if isinstance(a, str)) if isinstance(argv, (list, tuple)) else (),
        rank=_int(meta.get("rank")),
        local_rank=_int(meta.get("local_rank")),
        world_size=_int(meta.get("world_size")),
        alloc_conf=alloc_conf,
        recording=recording_text,
        reason=_text(meta.get("reason")),
        exception_type=_text(exception.get("type")),
        rehearsed="rehearsal" in meta,
        container=snapshot.container or None,
        source_format=snapshot.source_format or None,
    )
