"""The tests' builders, in one place (import them as `from tests.builders import ...`).

- `Sim`: a tiny scripted allocator that builds model objects with a known story, for the analysis
  tests. Each allocation gets its own segment (so layouts stay obvious); frees leave the segment
  cached. Markers and the registry are written the way capture writes them.
- Snapshot dicts in torch's shape, to pickle into a file and read back through `load`:
  `make_snapshot` (torch 2.13's shape, shared frames), `one_block_snapshot` (the least that loads),
  `plain_oom_snapshot` (a plain torch snapshot that ran out of memory) and `payload_dump` (a dump
  with one text in every string field torch or oomdoctor writes).
- `write_pickle`: a dict to a file, the way torch writes it (protocol 4).
- `two_rank_folder`: a folder of two ranks' oomdoctor dumps, copies of two fixture dumps.

Fixture dumps (`fixtures/dumps/`) are made by `fixtures/generate.py`, not here.
"""

from __future__ import annotations

import dataclasses
import pickle
import shutil
from pathlib import Path
from typing import Any

from oomdoctor.analysis.sizing import round_size
from oomdoctor.load import freeze_builtins
from oomdoctor.load.metadata import parse_metadata
from oomdoctor.model import (
    ACTIVE_ALLOCATED,
    INACTIVE,
    Block,
    DeviceTrace,
    Frame,
    Segment,
    Snapshot,
    TraceEvent,
)

MiB = 1 << 20
GiB = 1 << 30
BASE = 0x7F0000000000  # where the snapshot dicts' first segment starts

# --- model objects with a known story ---------------------------------------------------------
FORWARD_STACK = (
    Frame("/usr/lib/python3/site-packages/torch/nn/functional.py", 100, "linear"),
    Frame("model.py", 12, "forward"),
    Frame("/usr/lib/python3/site-packages/torch/nn/modules/module.py", 1751, "_wrapped_call_impl"),
    Frame("train.py", 40, "train_step"),
)
ADAM_INIT_STACK = (
    Frame("/usr/lib/python3/site-packages/torch/optim/adam.py", 160, "_init_group"),
    Frame("/usr/lib/python3/site-packages/torch/optim/adam.py", 230, "step"),
    Frame("train.py", 44, "train_step"),
)
FOREACH_STACK = (
    Frame("/usr/lib/python3/site-packages/torch/optim/adam.py", 540, "_multi_tensor_adam"),
    Frame("/usr/lib/python3/site-packages/torch/optim/adam.py", 230, "step"),
    Frame("train.py", 44, "train_step"),
)
SETUP_STACK = (
    Frame("/usr/lib/python3/site-packages/torch/nn/modules/module.py", 1340, "_apply"),
    Frame("train.py", 20, "main"),
)
USER_STACK = (Frame("train.py", 38, "train_step"),)
BACKWARD_STACK = (  # loss.backward() in the training step: the autograd engine's Python entry
    Frame("/usr/lib/python3/site-packages/torch/autograd/graph.py", 825, "_engine_run_backward"),
    Frame("/usr/lib/python3/site-packages/torch/autograd/__init__.py", 347, "backward"),
    Frame("/usr/lib/python3/site-packages/torch/_tensor.py", 648, "backward"),
    Frame("train.py", 42, "train_step"),
)


def metadata_fields(meta: Any) -> dict[str, Any]:
    """`Snapshot(**metadata_fields(meta))`: a metadata dict typed by the loader's parser, and frozen
    as the raw key. The parser reads it as written (without the loader's whole-key checks first), so
    that its own checks of each field are what a test exercises."""
    return {"oomdoctor": parse_metadata(meta), "oomdoctor_raw": freeze_builtins(meta) if meta is not None else None}


class Sim:
    def __init__(self, total_bytes: int = 1 * GiB, outside_bytes: int = 0):
        self.events: list[TraceEvent] = []
        self.time_us = 1_700_000_000_000_000
        self.segments: dict[int, list] = {}  # address -> [size, state, requested, frames]
        self.next_address = 0x7F0000000000
        self.markers: list[dict] = []
        self.tensors: list[dict] = []
        self.total_bytes = total_bytes
        self.outside_bytes = outside_bytes
        self.step = 0

    def _tick(self) -> int:
        self.time_us += 10
        return self.time_us

    def alloc(self, nbytes: int, frames=(), component: str | None = None, name: str = "", *, remainder: int = 0) -> int:
        """A block of round_size(nbytes) in its own segment; `remainder` bytes more (at most 1 MiB)
        make the segment larger and stay in the block, unsplit, as the allocator leaves them: the
        dump shows the block at round_size + remainder while it lives, the whole segment free after."""
        rounded = round_size(nbytes)
        address = self.next_address
        self.next_address += rounded + remainder + 4 * MiB
        self.events.append(TraceEvent("segment_alloc", address, rounded + remainder, 0, frames, self._tick()))
        self.events.append(TraceEvent("alloc", address, nbytes, 0, frames, self._tick()))
        self.segments[address] = [rounded + remainder, ACTIVE_ALLOCATED, nbytes, frames]
        if component:
            self.tensors.append(
                {"address": address, "device": 0, "component": component, "name": name, "size_bytes": nbytes}
            )
        return address

    def free(self, address: int, frames=None) -> None:
        """Free the block at `address`; its free events carry `frames` (the code that freed it, as a
        trace recorded with context="all" shows), or the allocation's stack when None."""
        entry = self.segments[address]
        stack = entry[3] if frames is None else frames
        self.events.append(TraceEvent("free_requested", address, entry[2], 0, stack, self._tick()))
        self.events.append(TraceEvent("free_completed", address, entry[2], 0, stack, self._tick()))
        entry[1] = INACTIVE
        self.tensors = [t for t in self.tensors if t["address"] != address]

    def start_recording(self) -> None:
        """Forget the events so far, as a trace recorded from here on would: the blocks live now
        become allocations from before the trace, known only by their segments (and frames)."""
        self.events = []

    def release_cache(self) -> None:
        for address, entry in list(self.segments.items()):
            if entry[1] == INACTIVE:
                self.events.append(TraceEvent("segment_free", address, entry[0], 0, (), self._tick()))
                del self.segments[address]

    def reserved(self) -> int:
        return sum(e[0] for e in self.segments.values())

    def oom(self, nbytes: int, frames=()) -> int:
        """The fatal OOM of a request of `nbytes`, its event carrying the failing allocation's `frames`."""
        self.release_cache()
        free = self.total_bytes - self.outside_bytes - self.reserved()
        self.events.append(TraceEvent("oom", 0, round_size(nbytes), 0, frames, self._tick(), device_free=free))
        return len(self.events) - 1

    def marker(self, phase: str, edge: str) -> None:
        self.markers.append({"phase": phase, "edge": edge, "step": self.step, "time_us": self._tick()})
        if phase == "optimizer_step" and edge == "end":
            self.step += 1

    def snapshot(
        self,
        *,
        metadata: bool = True,
        registry: bool = True,
        oom_device_free: int | None = None,
        extra: dict[str, Any] | None = None,
    ) -> Snapshot:
        """The snapshot so far; with `metadata`, oomdoctor's key as capture writes it (its markers,
        its registry unless `registry` is False), and the keys of `extra` besides."""
        segments = tuple(
            Segment(
                device=0,
                address=address,
                total_size=entry[0],
                stream=0,
                segment_type="small" if entry[0] <= MiB else "large",
                blocks=(
                    Block(
                        address,
                        entry[0],
                        entry[2] if entry[1] != INACTIVE else 0,
                        entry[1],
                        entry[3] if entry[1] != INACTIVE else (),
                    ),
                ),
            )
            for address, entry in sorted(self.segments.items())
        )
        meta = None
        if metadata:
            meta = {
                "schema_version": 1,
                "device": {"index": 0, "name": "Simulated", "total_memory_bytes": self.total_bytes},
                "markers": list(self.markers),
                "tensors": list(self.tensors) if registry else [],
                **(extra or {}),
            }
        return Snapshot(segments=segments, traces=(DeviceTrace.from_events(0, self.events),), **metadata_fields(meta))


def spike_sim(
    allocations: int = 400, spike_after: int = 250, spike_bytes: int = 512 * MiB, oom_after: int | None = None
) -> Sim:
    """A trace of more than a thousand events whose memory rises and falls in small steps, with one
    sharp spike: after the `spike_after`th small allocation, a `spike_bytes` block allocated and
    freed at once, so the peak is the one event of that alloc (a sample of the series misses it
    unless it lands on it). With `oom_after`, an OOM after that small allocation, the run going on."""
    sim = Sim(total_bytes=1 << 40)
    live: list[int] = []
    for number in range(allocations):
        live.append(sim.alloc((1 + number % 7) * MiB, USER_STACK))
        if number % 3 == 2:
            sim.free(live.pop(0))
        if number == spike_after:
            sim.free(sim.alloc(spike_bytes, USER_STACK))
        if number == oom_after:
            sim.oom(1 << 41)
    return sim


def several_devices(*sims: Sim) -> Snapshot:
    """A plain snapshot of one process that drives several devices (DataParallel, say): the
    segments and trace of `sims[d]` become device d's. No oomdoctor metadata."""
    segments: list[Segment] = []
    for device, sim in enumerate(sims):
        segments.extend(dataclasses.replace(s, device=device) for s in sim.snapshot(metadata=False).segments)
    traces = tuple(DeviceTrace.from_events(device, sim.events) for device, sim in enumerate(sims))
    return Snapshot(segments=tuple(segments), traces=traces, **metadata_fields(None))


# --- snapshot dicts in torch's shape ------------------------------------------------------------


def write_pickle(path: Path, data: Any, protocol: int = 4) -> Path:
    path.write_bytes(pickle.dumps(data, protocol=protocol))
    return path


def two_rank_folder(tmp_path: Path) -> Path:
    """`tmp_path/ranks`, holding two ranks' dumps by oomdoctor's names: rank 0 the fixture
    activation-spike-gpt-longer-sequence, rank 1 optimizer-state-buildup-gpt-adamw."""
    from tests.conftest import FIXTURES

    ranks = tmp_path / "ranks"
    ranks.mkdir()
    shutil.copy(
        FIXTURES / "dumps" / "activation-spike-gpt-longer-sequence.pickle",
        ranks / "oom-rank0-node-1-20260101T000000Z.pickle",
    )
    shutil.copy(
        FIXTURES / "dumps" / "optimizer-state-buildup-gpt-adamw.pickle",
        ranks / "oom-rank1-node-2-20260101T000000Z.pickle",
    )
    return ranks


def make_snapshot() -> dict:
    """A small snapshot in torch 2.13's shape, frames shared the way torch shares them."""
    inner = {"filename": "train.py", "line": 10, "name": "forward"}
    outer = {"filename": "train.py", "line": 50, "name": "<module>"}
    stack = [inner, outer]
    base = BASE
    return {
        "segments": [
            {
                "device": 0, "address": base, "total_size": 2 * MiB, "allocated_size": 1024,
                "active_size": 1024, "requested_size": 1000, "stream": 0, "segment_type": "small",
                "segment_pool_id": (0, 0), "is_expandable": False, "frames": stack,
                "blocks": [
                    {"address": base, "size": 1024, "requested_size": 1000, "state": "active_allocated", "frames": stack},
                    {"address": base + 1024, "size": 2 * MiB - 1024, "requested_size": 0, "state": "inactive", "frames": []},
                ],
            }
        ],
        "device_traces": [
            [
                {"action": "segment_alloc", "addr": base, "size": 2 * MiB, "stream": 0, "time_us": 100, "frames": stack},
                {"action": "alloc", "addr": base, "size": 1000, "stream": 0, "time_us": 101, "frames": stack},
                {"action": "alloc", "addr": base + 1024, "size": 512, "stream": 0, "time_us": 102, "frames": [inner]},
                {"action": "free_requested", "addr": base + 1024, "size": 512, "stream": 0, "time_us": 103, "frames": [inner]},
                {"action": "free_completed", "addr": base + 1024, "size": 512, "stream": 0, "time_us": 104, "frames": [inner]},
                {"action": "oom", "device_free": 5 * MiB, "size": 40 * MiB, "stream": 0, "time_us": 105, "frames": stack},
            ]
        ],
        "allocator_settings": {
            "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False", "max_split_size": -1,
            "garbage_collection_threshold": 0.0, "expandable_segments": False,
            "roundup_power2_divisions": {"1": 0, "2": 4}, "release_lock_on_cudamalloc": False,
        },
        "external_annotations": [
            {"name": "Optimizer.step#Adam.step", "stage": "START", "device": 0, "time_us": 101},
            {"name": "Optimizer.step#Adam.step", "stage": "END", "device": 0, "time_us": 104},
        ],
    }  # fmt: skip


def one_block_snapshot(
    *,
    filename: str | None = None,
    name: str = "main",
    segment_type: str = "large",
    tensor_name: str | None = None,
    **top: Any,
) -> dict:
    """The least that loads: one 2 MiB segment holding one allocated block, one alloc event.

    With `filename`, the block and the event share a one-frame stack (`filename`:1 in `name`);
    with `tensor_name`, the registry names the block as a parameter; `top` adds top-level keys
    (`oomdoctor=`, `allocator_settings=`, ...), replacing those.
    """
    stack = [] if filename is None else [{"filename": filename, "line": 1, "name": name}]
    segment = {
        "device": 0, "address": BASE, "total_size": 2 * MiB, "stream": 0, "segment_type": segment_type,
        "blocks": [{"address": BASE, "size": 2 * MiB, "requested_size": 2 * MiB, "state": "active_allocated", "frames": stack}],
    }  # fmt: skip
    data: dict[str, Any] = {
        "segments": [segment],
        "device_traces": [[{"action": "alloc", "addr": BASE, "size": 2 * MiB, "stream": 0, "time_us": 1, "frames": stack}]],
    }  # fmt: skip
    if tensor_name is not None:
        tensor = {
            "address": BASE,
            "device": 0,
            "component": "parameter",
            "name": tensor_name,
            "shape": [512, 1024],
            "dtype": "float32",
            "size_bytes": 2 * MiB,
        }
        data["oomdoctor"] = {"tensors": [tensor]}
    data.update(top)
    return data


def plain_oom_snapshot(filename: str = "train.py") -> dict:
    """A plain torch snapshot (no oomdoctor key): one live 300 MiB block and an OOM for 600 MiB."""
    frames = [{"filename": filename, "line": 3, "name": "main"}]
    return {
        "segments": [
            {
                "device": 0, "address": 0x1000, "total_size": 300 * MiB, "allocated_size": 300 * MiB,
                "active_size": 300 * MiB, "requested_size": 300 * MiB, "stream": 0, "segment_type": "large",
                "segment_pool_id": (0, 0), "is_expandable": False, "frames": frames,
                "blocks": [{"address": 0x1000, "size": 300 * MiB, "requested_size": 300 * MiB, "state": "active_allocated", "frames": frames}],
            }
        ],
        "device_traces": [
            [
                {"action": "segment_alloc", "addr": 0x1000, "size": 300 * MiB, "stream": 0, "time_us": 1, "frames": frames},
                {"action": "alloc", "addr": 0x1000, "size": 300 * MiB, "stream": 0, "time_us": 2, "frames": frames},
                {"action": "oom", "size": 600 * MiB, "device_free": 100 * MiB, "stream": 0, "time_us": 3},
            ]
        ],
        "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "", "expandable_segments": False, "max_split_size": -1},
    }  # fmt: skip


def tagged(field: str, payload: str) -> str:
    """How `payload_dump` writes `payload` into `field`: the tag finds the field's text in an output."""
    return f"{field}:{payload}:end"


def payload_dump(payload: str) -> dict:
    """A small dump with `payload` in every string field torch or oomdoctor writes (frames, segment
    type, annotations, event metadata, allocator settings, every metadata text), each as
    `tagged(field, payload)`: a parameter, its gradient and its optimizer state fill the device
    (model-states-too-large, whose evidence names the tensors and their frame), then a request for
    1 GiB fails."""

    def v(field: str) -> str:
        return tagged(field, payload)

    frames = [
        {"filename": v("filename") + ".py", "line": 7, "name": v("function")},
        {"filename": "train.py", "line": 3, "name": "main"},
    ]
    blocks, events = [], []
    for i in range(3):
        address = BASE + i * 2 * MiB
        blocks.append(
            {
                "address": address,
                "size": 2 * MiB,
                "requested_size": 2 * MiB,
                "state": "active_allocated",
                "frames": frames,
            }
        )
        events.append({
            "action": "alloc", "addr": address, "size": 2 * MiB, "stream": 0, "time_us": i + 1, "frames": frames,
            "compile_context": v("compile_context"), "user_metadata": v("user_metadata"),
        })  # fmt: skip
    events.append({
        "action": "oom", "addr": 0, "size": 1 << 30, "stream": 0, "time_us": 9, "frames": frames, "device_free": 0,
        "compile_context": v("compile_context"), "user_metadata": v("user_metadata"),
    })  # fmt: skip
    segment = {
        "device": 0,
        "address": BASE,
        "total_size": 6 * MiB,
        "stream": 0,
        "segment_type": v("segment_type"),
        "blocks": blocks,
        "frames": frames,
    }
    tensors = [
        {
            "address": BASE,
            "device": 0,
            "component": "parameter",
            "name": v("tensor"),
            "shape": [512, 1024],
            "dtype": v("dtype"),
            "size_bytes": 2 * MiB,
        },
        {"address": BASE + 2 * MiB, "device": 0, "component": "gradient", "name": v("gradient"), "size_bytes": 2 * MiB},
        {
            "address": BASE + 4 * MiB,
            "device": 0,
            "component": "optimizer_state",
            "name": v("optimizer_state"),
            "size_bytes": 2 * MiB,
        },
    ]
    meta = {
        "schema_version": 1, "argv": ["train.py", v("argv")], "host": v("host"), "pid": 4242,
        "versions": {"torch": v("torch"), "cuda": v("cuda"), "python": v("python"), "oomdoctor": v("oomdoctor")},
        "device": {"index": 0, "name": v("device"), "total_memory_bytes": 6 * MiB},
        "exception": {"type": v("exception_type"), "message": v("exception_message"), "traceback": v("traceback")},
        "alloc_conf": {"PYTORCH_CUDA_ALLOC_CONF": v("alloc_conf")},
        "recording": {"max_entries": 100, "stacks": v("stacks"), "context": v("context")},
        "reason": v("reason"), "oom": {"device": 0, "alloc_bytes": 1 << 30}, "tensors": tensors,
        "markers": [{"phase": v("phase"), "edge": v("edge"), "step": 0, "time_us": 1}],
        v("extra_key"): v("extra_value"),
    }  # fmt: skip
    return {
        "segments": [segment],
        "device_traces": [events],
        "allocator_settings": {
            "PYTORCH_CUDA_ALLOC_CONF": v("settings_conf"),
            "max_split_size": -1,
            v("settings_key"): v("settings_value"),
        },
        "external_annotations": [{"name": v("annotation"), "stage": "START", "device": 0, "time_us": 2}],
        "oomdoctor": meta,
    }
