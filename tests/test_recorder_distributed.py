"""The recorder's three fixes for FSDP and DTensor (issue 16), in the real-CPU rehearsal and under fake tensors.

`UntypedStorage.resize_` bypasses the dispatcher, yet FSDP frees and re-allocates unsharded
parameters with it; DTensor's local ops must reach the recorder (a DTensor holds no storage of its
own); DTensor's sharding propagation runs each new op once on global-shape fake tensors, which
allocate nothing on a device. Distributed cases run in a subprocess: a process group is global.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

from oomdoctor.rehearse.session import RehearsalConfig, RehearsalSession  # noqa: E402

MiB = 1024 * 1024


def allocated(session: RehearsalSession) -> int:
    return session.backend.memory_stats(0)["allocated_bytes.all.current"]


def test_storage_resized_to_zero_and_back_is_released_and_reallocated():
    with RehearsalSession(RehearsalConfig(device_memory_bytes=64 * MiB)) as session:
        session.backend.record_history(max_entries=1000, stacks="python", context="all")
        tensor = torch.empty(256 * 1024)  # 1 MiB
        assert allocated(session) == MiB
        tensor.untyped_storage().resize_(0)
        assert allocated(session) == 0
        tensor.untyped_storage().resize_(2 * MiB)
        assert allocated(session) == 2 * MiB
        del tensor
        assert allocated(session) == 0
        actions = [entry["action"] for entry in session.backend.snapshot()["device_traces"][0]]
        assert actions.count("alloc") == 2 and actions.count("free_completed") == 2


def test_a_storage_from_before_the_session_resized_stays_host_memory():
    original = torch.UntypedStorage.resize_
    outside = torch.empty(1024)
    with RehearsalSession(RehearsalConfig(device_memory_bytes=8 * MiB)) as session:
        outside.untyped_storage().resize_(0)
        outside.untyped_storage().resize_(8192)
        assert allocated(session) == 0
    assert torch.UntypedStorage.resize_ is original  # the wrapper is gone after stop()


def test_resize_beyond_the_device_raises_torchs_out_of_memory_error():
    with RehearsalSession(RehearsalConfig(device_memory_bytes=8 * MiB)) as session:
        tensor = torch.empty(1024)
        with pytest.raises(torch.OutOfMemoryError, match="CUDA out of memory"):
            tensor.untyped_storage().resize_(64 * MiB)
        assert len(session.ooms) == 1


def test_resize_under_fake_tensors_is_seen_too():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(), RehearsalSession(RehearsalConfig(device_memory_bytes=64 * MiB)) as session:
        tensor = torch.empty(256 * 1024)
        assert allocated(session) == MiB
        tensor.untyped_storage().resize_(0)
        assert allocated(session) == 0
        tensor.untyped_storage().resize_(MiB)
        assert allocated(session) == MiB


DTENSOR_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import torch, torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import distribute_tensor, Shard
    import oomdoctor.rehearse.recorder as recorder
    from oomdoctor.rehearse.session import RehearsalConfig, RehearsalSession

    if sys.argv[1] == "no-propagation-fix":
        recorder._patch_sharding_propagation = lambda r: (lambda: None)
    fake = sys.argv[2] == "fake"
    dist.init_process_group("fake", rank=0, world_size=4, store=FakeStore())
    mesh = init_device_mesh("cpu", (4,))
    global_tensor = torch.randn(1024, 1024)  # 4 MiB, 1 MiB a shard
    sharded = distribute_tensor(global_tensor, mesh, [Shard(0)])
    if fake:
        from torch._subclasses.fake_tensor import FakeTensorMode
        mode = FakeTensorMode(allow_non_fake_inputs=True)
        mode.__enter__()
    with RehearsalSession(RehearsalConfig(device_memory_bytes=512 * 2**20)) as session:
        doubled = sharded * 2
        after_mul = session.backend.memory_stats(0)["allocated_bytes.all.current"]
        tripled = torch._foreach_mul([sharded, doubled], 3.0)
        stats = session.backend.memory_stats(0)
        print(json.dumps({"after_mul": after_mul, "after_foreach": stats["allocated_bytes.all.current"],
                          "peak": stats["allocated_bytes.all.peak"], "local": list(doubled.to_local().shape)}))
    """
)


def run_dtensor(tmp_path, variant: str, mode: str) -> dict:
    script = tmp_path / "dtensor_case.py"
    script.write_text(DTENSOR_SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script), variant, mode], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["real", "fake"])
def test_dtensor_local_ops_are_counted_and_its_propagation_is_not(tmp_path, mode):
    figures = run_dtensor(tmp_path, "fixed", mode)
    assert figures["local"] == [256, 1024]
    assert figures["after_mul"] == MiB  # the local shard, not the 4 MiB global tensor
    assert figures["after_foreach"] == 3 * MiB
    assert figures["peak"] == 3 * MiB  # no global-shape probe tensor ever counted


@pytest.mark.slow
def test_without_the_propagation_fix_the_probe_tensors_would_be_counted(tmp_path):
    figures = run_dtensor(tmp_path, "no-propagation-fix", "real")
    assert figures["peak"] > 4 * MiB


FSDP_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import torch, torch.nn as nn, torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    import oomdoctor.rehearse.recorder as recorder
    from oomdoctor.rehearse.session import RehearsalConfig, RehearsalSession

    dist.init_process_group("fake", rank=0, world_size=8, store=FakeStore())
    mesh = init_device_mesh("cpu", (8,))

    def build():
        torch.manual_seed(0)
        model = nn.Sequential(*[nn.Sequential(nn.Linear(512, 2048), nn.ReLU(), nn.Linear(2048, 512)) for _ in range(4)])
        for layer in model:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model

    def train(model, optimizer, tracker=None):
        batch = torch.randn(16, 512)
        for step in range(2):
            model(batch).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad()
            if tracker is not None and step == 0:
                tracker.reset_mod_stats()

    figures = {}
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    model = build()
    optimizer = torch.optim.AdamW(model.parameters(), foreach=True)
    tracker = FSDPMemTracker(model, optimizer)
    with tracker:
        train(model, optimizer, tracker)
    figures["tracker"] = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]
    del model, optimizer, tracker

    def rehearse():
        with RehearsalSession(RehearsalConfig(device_memory_bytes=8 * 2**30)) as session:
            model = build()
            train(model, torch.optim.AdamW(model.parameters(), foreach=True))
            return session.backend.memory_stats(0)["requested_bytes.all.peak"]

    figures["fixed"] = rehearse()
    recorder._patch_sharding_propagation = lambda r: (lambda: None)
    recorder._patch_storage_resize = lambda r: (lambda: None)
    recorder._is_wrapper_subclass = lambda kind: False
    figures["unfixed"] = rehearse()
    print(json.dumps(figures))
    """
)


@pytest.mark.slow
def test_fsdp2_rank_at_world_size_8_matches_torchs_fsdp_mem_tracker(tmp_path):
    script = tmp_path / "fsdp_case.py"
    script.write_text(FSDP_SCRIPT)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert abs(figures["fixed"] - figures["tracker"]) <= 0.001 * figures["tracker"], figures
    assert figures["unfixed"] > 1.5 * figures["fixed"], figures  # the fixes matter
