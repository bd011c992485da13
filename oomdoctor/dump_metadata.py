"""oomdoctor's own metadata key of a dump, typed: what `Snapshot.oomdoctor` holds.

The loader (`oomdoctor.load.metadata.parse_metadata`) builds these objects once, from the read-only
plain data of the dump's `oomdoctor` key (schema in `oomdoctor/metadata.py`), and validates every
field there: readers read attributes and never re-check types. Every field is optional, as in the
schema: None (or an empty tuple) when the dump omits it, writes None, or writes a value of the wrong
kind. The rules the loader applies:

- ints are ints (never bools) within int64; sizes, byte counts, indices, counts, steps, ranks and
  pids are also non-negative. Times (`time_us`), `capability` and `schema_version` only need int64.
- strings are str, booleans bool.
- a section (`versions`, `device`, `oom`, ...) that is not a mapping is None; a list that is not a
  list is empty; entries of the wrong kind are left out of it (a marker that is not a mapping, an
  argv entry that is not a str). A registry entry (`tensors`) without a valid `address`, or with a
  `device` that is not a valid index, is left out whole: it could not be placed.
- `dropped` names each field the loader left out this way (`"tensors[].address"`, `"argv[]"`),
  once each; the loader adds no note for these (the whole key is dropped with a note only when it
  is not plain data at all: see `oomdoctor.load.convert`).

Unknown keys are ignored here; the key exactly as written is `Snapshot.oomdoctor_raw`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Versions:
    oomdoctor: str | None = None
    torch: str | None = None
    cuda: str | None = None
    python: str | None = None
    cudnn: str | None = None  # torch.backends.cudnn.version(), as text ("90100")
    nccl: str | None = None  # torch.cuda.nccl.version(), "2.21.5"


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    index: int | None = None
    name: str | None = None
    capability: tuple[int, int] | None = None  # (major, minor)
    total_memory_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class MemGetInfo:
    """torch.cuda.mem_get_info at dump time."""

    free_bytes: int | None = None
    total_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class MemoryStats:
    """The torch.cuda.memory_stats values capture records (current values unless named peak)."""

    num_alloc_retries: int | None = None
    num_ooms: int | None = None
    inactive_split_bytes: int | None = None
    allocated_bytes: int | None = None
    reserved_bytes: int | None = None
    active_bytes: int | None = None
    peak_allocated_bytes: int | None = None
    peak_reserved_bytes: int | None = None
    num_device_alloc: int | None = None
    num_device_free: int | None = None


@dataclass(frozen=True, slots=True)
class OomRecord:
    """One OOM observer call (`oom`, and each of `ooms_observed`)."""

    device: int | None = None
    alloc_bytes: int | None = None
    device_total_bytes: int | None = None
    device_free_bytes: int | None = None
    time_us: int | None = None
    surfaced: bool | None = None  # True: reached Python; False: torch caught and retried it; None: not known
    site: str | None = None  # "file:line in function": the innermost frame outside oomdoctor and torch
    occurrence: int | None = None  # the how-manieth OOM observed at its site (its Python stack)


@dataclass(frozen=True, slots=True)
class ExceptionInfo:
    type: str | None = None
    message: str | None = None
    traceback: str | None = None  # None when the script caught the exception and went on
    caught: bool | None = None  # True: the script (a batch-size finder, say) caught it and went on


@dataclass(frozen=True, slots=True)
class Marker:
    phase: str | None = None  # one of metadata.PHASES as capture writes it; any str is kept
    edge: str | None = None  # "start" | "end"
    step: int | None = None
    time_us: int | None = None


@dataclass(frozen=True, slots=True)
class RegisteredTensor:
    """One entry of the registry of named tensors (`tensors`)."""

    address: int
    device: int | None = None
    component: str | None = None  # one of metadata.REGISTRY_COMPONENTS as capture writes it
    name: str | None = None
    shape: tuple[int, ...] | None = None
    dtype: str | None = None
    size_bytes: int | None = None
    requires_grad: bool | None = None  # a parameter's: False frozen (no gradient, no state); None not known


@dataclass(frozen=True, slots=True)
class OptimizerKind:
    """One optimizer the process held (`optimizer_kinds`): what decides its state before it exists."""

    class_name: str | None = None  # its class's qualified name ("torch.optim.sgd.SGD"), as written: data
    # parameter-sized state tensors it makes per parameter it updates (0: SGD without momentum);
    # None: not known (a class capture does not know, or settings that differ between param groups)
    moments: int | None = None
    options: Mapping[str, bool | int | float | None] | None = None  # the settings that decide it


@dataclass(frozen=True, slots=True)
class HistoryCall:
    """A call to torch's `_record_memory_history` by someone else while capture was installed (and
    capture's answer to a call that stopped recording)."""

    action: str | None = None  # "rearmed" | "stopped" | "restored" (metadata.HISTORY_ACTIONS)
    time_us: int | None = None
    caller: str | None = None  # "file:line in function"; "oomdoctor" for "restored"
    enabled: str | None = None  # as the call gave it: "all", "state"; None when it stopped recording
    context: str | None = None
    stacks: str | None = None
    max_entries: int | None = None  # None: not given (torch's default keeps every event)


@dataclass(frozen=True, slots=True)
class Recording:
    max_entries: int | None = None
    stacks: str | None = None
    context: str | None = None
    started_by: str | None = None  # "oomdoctor" | "user"
    rearmed: tuple[HistoryCall, ...] = ()  # calls by others after install(), oldest first

    @property
    def stopped(self) -> bool:
        """The last call stopped recording and it was not started again: the history ends there."""
        return bool(self.rearmed) and self.rearmed[-1].action == "stopped"


@dataclass(frozen=True, slots=True)
class Rehearsal:
    """Present only in dumps written under `oomdoctor rehearse`."""

    device_memory_bytes: int | None = None
    outside_bytes: int | None = None
    alloc_conf: str | None = None


@dataclass(frozen=True, slots=True)
class Elastic:
    """torchrun's (torchelastic's) facts about the worker; present only under torchelastic."""

    run_id: str | None = None  # TORCHELASTIC_RUN_ID: every rank of one launch shares it
    restart_count: int | None = None
    max_restarts: int | None = None
    group_rank: int | None = None
    group_world_size: int | None = None
    role_name: str | None = None
    role_rank: int | None = None
    role_world_size: int | None = None
    local_world_size: int | None = None


@dataclass(frozen=True, slots=True)
class Framework:
    """The training framework whose callback installed capture, and where its loop was at the dump."""

    name: str | None = None  # "lightning" | "transformers"
    version: str | None = None
    stage: str | None = None  # one of metadata.FRAMEWORK_STAGES (any other word is dropped)
    global_step: int | None = None
    epoch: int | None = None


@dataclass(frozen=True, slots=True)
class DumpMetadata:
    """The `oomdoctor` key of a dump, validated (see the module docstring for the rules).

    Equality compares the typed fields (not the raw items: a list and a tuple parse alike).
    """

    schema_version: int | None = None
    versions: Versions | None = None
    host: str | None = None
    pid: int | None = None
    argv: tuple[str, ...] = ()
    rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None
    device: DeviceInfo | None = None
    mem_get_info: MemGetInfo | None = None
    memory_stats: MemoryStats | None = None
    alloc_conf: Mapping[str, str] | None = None  # only the variables that were set; str values only
    oom: OomRecord | None = None  # None for dump() and peak dumps
    ooms_observed: tuple[OomRecord, ...] = ()
    exception: ExceptionInfo | None = None
    markers: tuple[Marker, ...] = ()
    optimizers: int | None = None  # optimizers the process had made and still held (None: not recorded)
    optimizer_kinds: tuple[OptimizerKind, ...] = ()  # each of them (() in older dumps: not recorded)
    tensors: tuple[RegisteredTensor, ...] = ()
    recording: Recording | None = None
    reason: str | None = None  # "oom" | "manual" | "peak"
    rehearsal: Rehearsal | None = None
    elastic: Elastic | None = None
    # environment variables that matter to memory (PYTORCH_*, CUDA_*, NCCL_*, ...), secret-looking
    # names left out at capture; str values only
    environment: Mapping[str, str] | None = None
    packages: Mapping[str, str] | None = None  # versions of the frameworks the process had imported
    framework: Framework | None = None
    dropped: tuple[str, ...] = field(default=(), repr=False)  # fields left out as malformed


# What readers use when a dump has no metadata, so that they need no None checks of their own.
NO_METADATA = DumpMetadata()

__all__ = [
    "NO_METADATA",
    "DeviceInfo",
    "DumpMetadata",
    "Elastic",
    "ExceptionInfo",
    "Framework",
    "HistoryCall",
    "Marker",
    "MemGetInfo",
    "MemoryStats",
    "OomRecord",
    "OptimizerKind",
    "Recording",
    "RegisteredTensor",
    "Rehearsal",
    "Versions",
]
