"""A tiny scripted allocator for analysis tests: builds model objects with a known story.

Each allocation gets its own segment (so layouts stay obvious); frees leave the segment cached.
Markers and the registry are written the way capture writes them.
"""

from __future__ import annotations

from oomdoctor.analysis.sizing import round_size
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

    def alloc(self, nbytes: int, frames=(), component: str | None = None, name: str = "") -> int:
        rounded = round_size(nbytes)
        address = self.next_address
        self.next_address += rounded + 4 * MiB
        self.events.append(TraceEvent("segment_alloc", address, rounded, 0, frames, self._tick()))
        self.events.append(TraceEvent("alloc", address, nbytes, 0, frames, self._tick()))
        self.segments[address] = [rounded, ACTIVE_ALLOCATED, nbytes, frames]
        if component:
            self.tensors.append(
                {"address": address, "device": 0, "component": component, "name": name, "size_bytes": nbytes}
            )
        return address

    def free(self, address: int) -> None:
        entry = self.segments[address]
        self.events.append(TraceEvent("free_requested", address, entry[2], 0, entry[3], self._tick()))
        self.events.append(TraceEvent("free_completed", address, entry[2], 0, entry[3], self._tick()))
        entry[1] = INACTIVE
        self.tensors = [t for t in self.tensors if t["address"] != address]

    def release_cache(self) -> None:
        for address, entry in list(self.segments.items()):
            if entry[1] == INACTIVE:
                self.events.append(TraceEvent("segment_free", address, entry[0], 0, (), self._tick()))
                del self.segments[address]

    def reserved(self) -> int:
        return sum(e[0] for e in self.segments.values())

    def oom(self, nbytes: int) -> int:
        self.release_cache()
        free = self.total_bytes - self.outside_bytes - self.reserved()
        self.events.append(TraceEvent("oom", 0, round_size(nbytes), 0, (), self._tick(), device_free=free))
        return len(self.events) - 1

    def marker(self, phase: str, edge: str) -> None:
        self.markers.append({"phase": phase, "edge": edge, "step": self.step, "time_us": self._tick()})
        if phase == "optimizer_step" and edge == "end":
            self.step += 1

    def snapshot(self, *, metadata: bool = True, registry: bool = True, oom_device_free: int | None = None) -> Snapshot:
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
            }
        return Snapshot(segments=segments, traces=(DeviceTrace.from_events(0, self.events),), oomdoctor=meta)
