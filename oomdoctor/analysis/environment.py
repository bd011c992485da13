"""Where a dump came from: versions, device, process and settings, read from the model for the reports.

Everything comes from oomdoctor's metadata key (DESIGN §4) when the dump has one, and from what the
loader recognised otherwise (the container and the torch versions its keys suggest). Every field is
optional: plain torch snapshots carry no versions, host or device name.
"""

from __future__ import annotations

from dataclasses import dataclass

from oomdoctor.dump_metadata import NO_METADATA, DeviceInfo, Framework, Recording, Versions
from oomdoctor.metadata import HISTORY_RESTORED, HISTORY_STOPPED
from oomdoctor.model import Snapshot
from oomdoctor.records import pickled_by_fields


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
    cudnn_version: str | None = None
    nccl_version: str | None = None
    run_id: str | None = None  # TORCHELASTIC_RUN_ID: the torchrun launch the rank belonged to
    restart_count: int | None = None  # torchelastic's restarts of the worker group before this one
    framework: str | None = None  # "lightning 2.6.6: validating, global step 2, epoch 0"
    packages: tuple[tuple[str, str], ...] = ()  # (import name, version) of the imported frameworks
    # (name, value) of the environment variables capture recorded (secret-looking names never are)
    environment_variables: tuple[tuple[str, str], ...] = ()


def _framework_text(framework: Framework | None) -> str | None:
    if framework is None or not framework.name:
        return None
    text = f"{framework.name} {framework.version}" if framework.version else framework.name
    where = [framework.stage.replace("_", " ")] if framework.stage else []
    if framework.global_step is not None:
        where.append(f"global step {framework.global_step}")
    if framework.epoch is not None:
        where.append(f"epoch {framework.epoch}")
    return f"{text}: {', '.join(where)}" if where else text


def environment_of(snapshot: Snapshot) -> Environment:
    meta = snapshot.oomdoctor if snapshot.oomdoctor is not None else NO_METADATA
    versions = meta.versions if meta.versions is not None else Versions()
    device = meta.device if meta.device is not None else DeviceInfo()
    capability = device.capability
    recording = meta.recording if meta.recording is not None else Recording()
    recording_text = (
        ", ".join(
            f"{key} {value}"
            for key, value in (
                ("max_entries", recording.max_entries),
                ("stacks", recording.stacks),
                ("context", recording.context),
            )
            if value is not None
        )
        or None
    )
    others = [call for call in recording.rearmed if call.action != HISTORY_RESTORED]
    if recording_text is not None and others:
        latest = others[-1]
        how = "stopped" if latest.action == HISTORY_STOPPED else "re-armed"
        settings = ", ".join(
            f"{key} {value}"
            for key, value in (
                ("max_entries", latest.max_entries),
                ("stacks", latest.stacks),
                ("context", latest.context),
            )
            if value is not None and latest.action != HISTORY_STOPPED
        )
        by = f" by {latest.caller}" if latest.caller else ""
        more = f" ({len(others)} calls, the latest shown)" if len(others) > 1 else ""
        recording_text += f"; {how} after install(){by}{f' ({settings})' if settings else ''}{more}"
        if recording.rearmed[-1].action == HISTORY_RESTORED:
            recording_text += "; oomdoctor then recorded again with its settings"
    alloc_conf = None
    if snapshot.allocator_settings is not None:
        alloc_conf = snapshot.allocator_settings.raw_conf
    elif meta.alloc_conf is not None:
        alloc_conf = meta.alloc_conf.get("PYTORCH_CUDA_ALLOC_CONF") or meta.alloc_conf.get("PYTORCH_ALLOC_CONF") or None
    # an empty text reads as not recorded (`or None`)
    return Environment(
        torch_version=versions.torch or None,
        torch_version_hint=snapshot.torch_version_hint or None,
        cuda_version=versions.cuda or None,
        python_version=versions.python or None,
        oomdoctor_version=versions.oomdoctor or None,
        device_name=device.name or None,
        device_capability=f"{capability[0]}.{capability[1]}" if capability is not None else None,
        device_total_bytes=device.total_memory_bytes,
        host=meta.host or None,
        pid=meta.pid,
        argv=meta.argv,
        rank=meta.rank,
        local_rank=meta.local_rank,
        world_size=meta.world_size,
        alloc_conf=alloc_conf,
        recording=recording_text,
        reason=meta.reason or None,
        exception_type=(meta.exception.type or None) if meta.exception is not None else None,
        rehearsed=meta.rehearsal is not None,
        container=snapshot.container or None,
        source_format=snapshot.source_format or None,
        cudnn_version=versions.cudnn or None,
        nccl_version=versions.nccl or None,
        run_id=(meta.elastic.run_id or None) if meta.elastic is not None else None,
        restart_count=meta.elastic.restart_count if meta.elastic is not None else None,
        framework=_framework_text(meta.framework),
        packages=tuple(sorted(meta.packages.items())) if meta.packages else (),
        environment_variables=tuple(sorted(meta.environment.items())) if meta.environment else (),
    )


pickled_by_fields(globals())  # sent from a folder's worker processes to their parent: each class pickles fast
