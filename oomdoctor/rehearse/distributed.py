"""One simulated rank of a distributed run: `oomdoctor rehearse --world-size N --rank R`.

The script runs as rank R of N would under torchrun, alone in this process: torchrun's environment
is set (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT; a
node holds up to 8 ranks, so LOCAL_RANK is R mod 8), and `init_process_group`, whatever backend,
init method or store the script gives, becomes torch's fake process group (backend "fake",
`FakeStore`) at rank R of N: collectives return at once without moving data, so every rank's
allocations are its own, as on its GPU. What torch's distributed code does to host-side
bookkeeping tensors is kept off the device: a DeviceMesh is built from real tensors (under --fake
its rank lookups would read placeholders) and what it makes is not counted.

DDP needs shims, each undone when the rehearsal ends:
- a comm hook that hands each bucket back as reduced (`Future` set to the bucket's buffer),
  registered at the first forward when the script registered none: the fake process group's
  all-reduce future carries no value, and the reducer asserts on that;
- under --fake, DDP's start-up check and broadcast of the parameters are skipped, and its buckets
  are not rebuilt in gradient order after the first step (each reads tensor data in C++); the
  buckets' memory (one copy of the gradients) is the same.
FSDP2 (`fully_shard`) and DTensor need nothing more than the recorder's own fixes.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

RANKS_PER_NODE = 8
MASTER_ADDR = "127.0.0.1"
MASTER_PORT = "29500"


def torchrun_environment(world_size: int, rank: int) -> dict[str, str]:
    """The variables torchrun gives rank `rank` of `world_size` (up to 8 ranks a node)."""
    local_world_size = min(world_size, RANKS_PER_NODE)
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(rank % local_world_size),
        "WORLD_SIZE": str(world_size),
        "LOCAL_WORLD_SIZE": str(local_world_size),
        "GROUP_RANK": str(rank // local_world_size),
        "ROLE_RANK": str(rank),
        "ROLE_WORLD_SIZE": str(world_size),
        "MASTER_ADDR": MASTER_ADDR,
        "MASTER_PORT": MASTER_PORT,
    }


class SimulatedWorld:
    """The fake process group, DeviceMesh and DDP shims for one rank, between start() and stop()."""

    def __init__(self, world_size: int, rank: int, recorder: Any, *, fake: bool) -> None:
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in a world of {world_size}")
        self.world_size = world_size
        self.rank = rank
        self.recorder = recorder
        self.fake = fake
        self._undo: list[Callable[[], None]] = []

    def start(self) -> None:
        try:
            self._undo.append(self._patch_init_process_group())
            self._undo.append(self._patch_device_mesh())
            self._undo.append(self._patch_ddp())
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        while self._undo:
            self._undo.pop()()
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()  # the script left it: the next rehearsal starts without one

    # -- init_process_group -> the fake process group --------------------------------------------

    def _patch_init_process_group(self) -> Callable[[], None]:
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d
        from torch.testing._internal.distributed.fake_pg import FakeStore  # registers the "fake" backend

        original = c10d.init_process_group
        world = self

        @functools.wraps(original)
        def init_process_group(backend: Any = None, init_method: Any = None, timeout: Any = None, **kwargs: Any) -> Any:
            kept = {"timeout": timeout} if timeout is not None else {}
            if kwargs.get("group_name"):
                kept["group_name"] = kwargs["group_name"]
            return original(
                "fake", store=FakeStore(), rank=world.rank, world_size=world.world_size, **kept
            )  # device_id, pg_options and the init method name a real backend's resources: not here

        return _replace([(c10d, "init_process_group"), (dist, "init_process_group")], init_process_group)

    # -- DeviceMesh from real tensors, not counted --------------------------------------------------

    def _patch_device_mesh(self) -> Callable[[], None]:
        import torch.distributed as dist
        import torch.distributed.device_mesh as device_mesh

        undo: list[Callable[[], None]] = []
        mesh_type = device_mesh.DeviceMesh
        for name in ("__init__", "__getitem__", "_flatten", "_unflatten"):
            original = mesh_type.__dict__.get(name)
            if original is not None:
                undo.append(_replace([(mesh_type, name)], self._off_device(original)))
        init_device_mesh = device_mesh.init_device_mesh
        places = [(device_mesh, "init_device_mesh")]
        if getattr(dist, "init_device_mesh", None) is init_device_mesh:
            places.append((dist, "init_device_mesh"))
        undo.append(_replace(places, self._off_device(init_device_mesh)))
        return _undo_all(undo)

    def _off_device(self, function: Callable[..., Any]) -> Callable[..., Any]:
        """`function` with real tensors (fake mode unset) and the recorder suspended: host bookkeeping."""
        recorder = self.recorder

        @functools.wraps(function)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            from torch._subclasses.fake_tensor import unset_fake_temporarily

            recorder.suspended += 1
            try:
                with unset_fake_temporarily():
                    return function(*args, **kwargs)
            finally:
                recorder.suspended -= 1

        return wrapped

    # -- DDP ------------------------------------------------------------------------------------

    def _patch_ddp(self) -> Callable[[], None]:
        import torch.distributed as dist
        import torch.nn.parallel.distributed as ddp_module

        ddp = ddp_module.DistributedDataParallel
        undo: list[Callable[[], None]] = []
        original_pre_forward = ddp._pre_forward
        original_builtin = ddp._register_builtin_comm_hook

        def _pre_forward(module: Any, *inputs: Any, **kwargs: Any) -> Any:
            if not module._comm_hooks and not getattr(module, "_oomdoctor_builtin_hook", False):
                module.register_comm_hook(None, _bucket_as_reduced)
            return original_pre_forward(module, *inputs, **kwargs)

        def _register_builtin_comm_hook(module: Any, comm_hook_type: Any) -> Any:
            module._oomdoctor_builtin_hook = True
            return original_builtin(module, comm_hook_type)

        undo.append(_replace([(ddp, "_pre_forward")], _pre_forward))
        undo.append(_replace([(ddp, "_register_builtin_comm_hook")], _register_builtin_comm_hook))
        if self.fake:
            undo.append(_replace([(ddp_module, "_verify_param_shape_across_processes")], _skip))
            undo.append(_replace([(ddp_module, "_sync_module_states")], _skip))
            undo.append(_replace([(dist.Reducer, "_rebuild_buckets")], _no_rebuild))
        return _undo_all(undo)


def _bucket_as_reduced(state, bucket):  # type: ignore[no-untyped-def]
    """DDP comm hook: the bucket as if all-reduced in place (the fake process group moves no data).
    No annotations: DDP checks a hook's against its own types, and these would be strings here."""
    import torch

    future: Any = torch.futures.Future()
    future.set_result(bucket.buffer())
    return future


def _skip(*args: Any, **kwargs: Any) -> None:
    return None


def _no_rebuild(reducer: Any) -> bool:
    return False


def _replace(places: list[tuple[Any, str]], replacement: Any) -> Callable[[], None]:
    originals = [(owner, name, getattr(owner, name)) for owner, name in places]
    for owner, name, _ in originals:
        setattr(owner, name, replacement)

    def restore() -> None:
        for owner, name, original in originals:
            setattr(owner, name, original)

    return restore


def _undo_all(undo: list[Callable[[], None]]) -> Callable[[], None]:
    def restore() -> None:
        while undo:
            undo.pop()()

    return restore
