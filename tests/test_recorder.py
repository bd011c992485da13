"""The rehearsal recorder: CPU storages become simulated device allocations, with torch's OOM behaviour."""

from __future__ import annotations

import gc
import re

import pytest

torch = pytest.importorskip("torch")

from oomdoctor.rehearse.backend import SimulatedBackend  # noqa: E402
from oomdoctor.rehearse.session import RehearsalConfig, RehearsalSession, current_session  # noqa: E402

MiB = 1024 * 1024
TORCH_OOM_MESSAGE = re.compile(
    r"^CUDA out of memory\. Tried to allocate \d+\.\d\d (KiB|MiB|GiB)\. GPU 0 has a total capacity of "
    r"\d+\.\d\d (MiB|GiB) of which .+ is free\. .*Of the allocated memory .+ is allocated by PyTorch, and "
    r".+ is reserved by PyTorch but unallocated\."
)


def allocated_bytes(session: RehearsalSession) -> int:
    return session.backend.memory_stats(0)["allocated_bytes.all.current"]


def trace(session: RehearsalSession) -> list[dict]:
    return session.backend.snapshot()["device_traces"][0]


@pytest.fixture
def session():
    with RehearsalSession(RehearsalConfig(device_memory_bytes=64 * MiB)) as running:
        running.backend.record_history(max_entries=10_000, stacks="python", context="all")
        yield running


def test_session_is_current_only_while_running():
    assert current_session() is None
    with RehearsalSession(RehearsalConfig(device_memory_bytes=8 * MiB)) as running:
        assert current_session() is running
        assert isinstance(running.backend, SimulatedBackend)
    assert current_session() is None


def test_tensors_made_in_the_session_are_allocated_and_released(session):
    baseline = allocated_bytes(session)
    first = torch.empty(1000)  # 4000 bytes -> one 4096-byte block
    second = torch.zeros(256, 1024)  # 1 MiB
    assert allocated_bytes(session) == baseline + 4096 + MiB
    del first
    assert allocated_bytes(session) == baseline + MiB
    view = second[3:7]
    del second
    assert allocated_bytes(session) == baseline + MiB  # the view keeps the storage alive
    del view
    assert allocated_bytes(session) == baseline
    actions = [entry["action"] for entry in trace(session)]
    assert actions.count("alloc") == 2 and actions.count("free_requested") == 2


def test_tensors_from_before_the_session_are_not_device_memory():
    outside = torch.ones(1000)
    with RehearsalSession(RehearsalConfig(device_memory_bytes=8 * MiB)) as running:
        view = outside[10:]
        outside.add_(1)
        assert allocated_bytes(running) == 0
        made_inside = outside * 2
        assert allocated_bytes(running) == 4096
        assert running.backend.storage_address(view) is None
        assert running.backend.storage_address(made_inside) is not None


def test_torch_tensor_from_python_data_is_counted(session):
    baseline = allocated_bytes(session)
    values = torch.tensor([1.0] * 300)
    assert allocated_bytes(session) == baseline + 1536  # 1200 bytes rounded up to 512
    assert session.backend.storage_address(values) is not None


def test_resize_reallocates_and_releases_the_old_block(session):
    tensor = torch.empty(10)
    baseline = allocated_bytes(session)
    old_address = session.backend.storage_address(tensor)
    tensor.resize_(256 * 1024)  # 1 MiB
    assert allocated_bytes(session) == baseline - 512 + MiB
    new_address = session.backend.storage_address(tensor)
    assert new_address != old_address
    actions = [
        (entry["action"], entry["addr"]) for entry in trace(session) if entry["action"] in ("alloc", "free_requested")
    ]
    assert actions[-2:] == [("alloc", new_address), ("free_requested", old_address)]


def test_storage_addresses_are_simulated_blocks_in_the_snapshot(session):
    model = torch.nn.Linear(64, 32)
    snapshot = session.backend.snapshot()
    blocks = {
        block["address"]: block
        for segment in snapshot["segments"]
        for block in segment["blocks"]
        if block["state"] == "active_allocated"
    }
    for parameter in model.parameters():
        address = session.backend.storage_address(parameter)
        assert address in blocks
        assert blocks[address]["requested_size"] == parameter.untyped_storage().nbytes()
    assert session.backend.storage_address(model.weight[0]) == session.backend.storage_address(model.weight)


def test_live_allocations_expose_block_sizes_and_storages(session):
    weight = torch.empty(100, 10)
    found = [
        allocation for allocation in session.live_allocations() if allocation.storage() is weight.untyped_storage()
    ]
    assert len(found) == 1
    allocation = found[0]
    assert allocation.requested_bytes == 4000
    assert allocation.block_bytes == 4096
    assert allocation.address == session.backend.storage_address(weight)
    assert not allocation.in_backward


def forward_and_backward(model, batch):
    output = model(batch)  # this line's frame must appear on the forward allocations
    output.square().mean().backward()
    return output


def test_backward_allocations_have_no_frames_and_forward_ones_have_the_user_frame(session):
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    batch = torch.randn(16, 32)
    output = forward_and_backward(model, batch)
    output_address = session.backend.storage_address(output)
    gradient_addresses = {session.backend.storage_address(p.grad) for p in model.parameters()}
    assert None not in gradient_addresses
    allocs = {entry["addr"]: entry for entry in trace(session) if entry["action"] == "alloc"}
    forward_frames = allocs[output_address]["frames"]
    assert any(frame["name"] == "forward_and_backward" and frame["filename"] == __file__ for frame in forward_frames)
    assert forward_frames[0]["filename"].endswith("torch/nn/modules/linear.py")  # no dispatch machinery
    assert not any("oomdoctor" in frame["filename"] for frame in forward_frames)
    for address in gradient_addresses:
        assert not allocs[address].get("frames")
    live = {allocation.address: allocation for allocation in session.live_allocations()}
    assert all(live[address].in_backward and live[address].frames == [] for address in gradient_addresses)


def test_identical_frames_are_shared_dicts(session):
    first = torch.empty(10)
    second = torch.empty(10)  # noqa: F841
    del first
    allocs = [entry for entry in trace(session) if entry["action"] == "alloc"]
    outer_frames = [entry["frames"][-1] for entry in allocs[-2:]]
    assert outer_frames[0] is outer_frames[1]


def test_optimizer_scopes_become_external_annotations(session):
    model = torch.nn.Linear(8, 8)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randn(2, 8)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
    names = [(entry["name"], entry["stage"]) for entry in session.backend.snapshot()["external_annotations"]]
    assert names == [
        ("Optimizer.step#SGD.step", "START"),
        ("Optimizer.step#SGD.step", "END"),
        ("Optimizer.zero_grad#SGD.zero_grad", "START"),
        ("Optimizer.zero_grad#SGD.zero_grad", "END"),
    ]


def test_torch_cuda_memory_functions_answer_from_the_simulator():
    original = torch.cuda.memory_allocated
    with RehearsalSession(RehearsalConfig(device_memory_bytes=8 * MiB)) as running:
        kept = torch.empty(256 * 1024)  # noqa: F841
        assert not torch.cuda.is_available()
        assert torch.cuda.memory_allocated() == MiB
        assert torch.cuda.memory_reserved() == running.backend.memory_stats(0)["reserved_bytes.all.current"]
        free_bytes, total_bytes = torch.cuda.mem_get_info()
        assert total_bytes == 8 * MiB and free_bytes < total_bytes
    assert torch.cuda.memory_allocated is original
    import sys

    assert "cpu" not in sys.modules["torch.optim.optimizer"]._get_foreach_kernels_supported_devices()


def mlp_and_adam():
    # 16 MiB weights: each is its own 16 MiB segment, so the arithmetic is exact.
    model = torch.nn.Linear(2048, 2048, bias=False)
    optimizer = torch.optim.Adam(model.parameters())
    return model, optimizer


def test_out_of_memory_in_the_optimizer_step_raises_torchs_error_after_the_observers():
    # weight + grad + exp_avg = 48 MiB (the small batch's segment is flushed before the OOM):
    # 8 MiB are free and exp_avg_sq's 16 MiB do not fit.
    events = []
    with RehearsalSession(RehearsalConfig(device_memory_bytes=56 * MiB)) as running:
        running.backend.record_history(max_entries=10_000, stacks="python", context="all")

        def observer(device, alloc_bytes, device_total_bytes, device_free_bytes):
            oom_entries = [entry for entry in trace(running) if entry["action"] == "oom"]
            events.append(("observer", device, alloc_bytes, device_total_bytes, device_free_bytes, len(oom_entries)))
            live = running.live_allocations()  # what fixtures read for ground truth at the OOM
            assert sum(allocation.block_bytes for allocation in live) == allocated_bytes(running)
            exp_avg = optimizer.state[model.weight]["exp_avg"].untyped_storage()
            assert any(allocation.storage() is exp_avg for allocation in live)

        running.backend.attach_oom_observer(observer)
        model, optimizer = mlp_and_adam()
        model(torch.randn(4, 2048)).sum().backward()
        before_step = allocated_bytes(running)
        with pytest.raises(torch.OutOfMemoryError) as raised:
            optimizer.step()
        events.append(("raised",))
        assert events[0] == ("observer", 0, 16 * MiB, 56 * MiB, 8 * MiB, 1)
        assert events[1] == ("raised",)
        message = str(raised.value)
        assert TORCH_OOM_MESSAGE.match(message), message
        assert "Tried to allocate 16.00 MiB" in message
        oom = running.ooms[-1]
        assert oom.message == message
        assert oom.op == "aten.zeros_like.default"
        assert oom.phase == "optimizer_step"
        assert oom.frames[0]["filename"].endswith("torch/optim/adam.py")
        assert (
            oom.user_frame["name"] == "test_out_of_memory_in_the_optimizer_step_raises_torchs_error_after_the_observers"
        )
        del raised
        gc.collect()
        # Adam keeps what it made before the failure (step counter, exp_avg) in its state, as on a
        # GPU; the step counter lives on the host; the storage that did not fit was never counted.
        state = optimizer.state[model.weight]
        assert set(state) == {"step", "exp_avg"}
        assert running.backend.storage_address(state["step"]) is None
        assert allocated_bytes(running) == before_step + 16 * MiB


def test_out_of_memory_in_backward_calls_observers_and_reports_the_phase():
    calls = []
    with RehearsalSession(RehearsalConfig(device_memory_bytes=32 * MiB)) as running:
        running.backend.attach_oom_observer(lambda *arguments: calls.append(arguments))
        model, _ = mlp_and_adam()
        batch = torch.randn(4, 2048, requires_grad=True)
        loss = model(batch).sum()
        with pytest.raises(torch.OutOfMemoryError):
            loss.backward()  # weight 16 MiB + a 2 MiB small segment: the 16 MiB weight grad does not fit
        assert calls == [(0, 16 * MiB, 32 * MiB, 14 * MiB)]
        oom = running.ooms[-1]
        assert oom.phase == "backward"
        assert oom.user_frame["name"] == "test_out_of_memory_in_backward_calls_observers_and_reports_the_phase"


def test_an_oom_caught_by_the_script_leaves_the_accounting_consistent():
    with RehearsalSession(RehearsalConfig(device_memory_bytes=32 * MiB)) as running:
        kept = torch.empty(4 * MiB // 4)  # noqa: F841
        baseline = allocated_bytes(running)
        for _ in range(3):
            with pytest.raises(torch.OutOfMemoryError):
                torch.empty(64 * MiB // 4)
        assert allocated_bytes(running) == baseline
        assert len(running.ooms) == 3
        assert running.backend.memory_stats(0)["num_ooms"] == 3


def test_current_session_is_reachable_from_the_package_without_torch_machinery():
    import oomdoctor.rehearse

    assert oomdoctor.rehearse.current_session() is None
    with RehearsalSession(RehearsalConfig(device_memory_bytes=8 * MiB)) as running:
        assert oomdoctor.rehearse.current_session() is running


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs fork")
def test_a_forked_child_such_as_a_dataloader_worker_allocates_nothing():
    import os

    with RehearsalSession(RehearsalConfig(device_memory_bytes=8 * MiB)) as running:
        kept = torch.empty(1024)
        pid = os.fork()
        if pid == 0:  # child: host memory, bigger than the simulated device
            try:
                del kept
                torch.empty(64 * MiB // 4)
                os._exit(0)
            except BaseException:
                os._exit(1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert allocated_bytes(running) == 4096


def test_optimizers_take_the_foreach_path_they_take_on_cuda(session):
    model = torch.nn.Linear(64, 64)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 64)).sum().backward()
    optimizer.step()
    step_allocations = [
        entry
        for entry in trace(session)
        if entry["action"] == "alloc"
        and entry.get("frames")
        and any(frame["name"] == "_multi_tensor_adam" for frame in entry["frames"])
    ]
    assert len(step_allocations) >= 2  # e.g. the _foreach_sqrt list, one per parameter
    assert all(session.backend.storage_address(state["step"]) is None for state in optimizer.state.values())
    import sys

    optimizer_module = sys.modules["torch.optim.optimizer"]
    assert optimizer_module._get_foreach_kernels_supported_devices().count("cpu") == 1


def test_a_fixed_clock_makes_event_times_reproducible():
    import itertools

    ticks = itertools.count(1_000_000)
    with RehearsalSession(RehearsalConfig(device_memory_bytes=8 * MiB, clock_us=lambda: next(ticks))) as running:
        running.backend.record_history(max_entries=100, stacks="python", context="all")
        kept = torch.empty(10)  # noqa: F841
        assert [entry["time_us"] for entry in trace(running)] == [1_000_000, 1_000_001]


def test_empty_cache_from_the_script_releases_the_simulators_cached_segments():
    with RehearsalSession(RehearsalConfig(device_memory_bytes=64 * MiB)) as running:
        block = torch.empty(16 * MiB // 4)
        del block
        assert torch.cuda.memory_reserved() == 16 * MiB  # cached, as CUDA's allocator keeps it
        torch.cuda.empty_cache()
        assert torch.cuda.memory_reserved() == 0
        assert running.backend.mem_get_info(0) == (64 * MiB, 64 * MiB)
