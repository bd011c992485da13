"""The fixtures' ground truth (fixtures/ground_truth.py) on a tiny training step, in process."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from tests.conftest import FIXTURES

torch = pytest.importorskip("torch")


def _load_ground_truth():
    spec = importlib.util.spec_from_file_location("fixtures_ground_truth", FIXTURES / "ground_truth.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


ground_truth = _load_ground_truth()
MiB = 1024 * 1024


@pytest.fixture
def rehearsal():
    from oomdoctor.rehearse.session import RehearsalConfig, RehearsalSession

    tracker = ground_truth.PhaseTracker()
    tracker.install()
    try:
        with RehearsalSession(RehearsalConfig(device_memory_bytes=256 * MiB)) as session:
            yield tracker, ground_truth.GroundTruth(tracker, session.recorder), session
    finally:
        tracker.uninstall()


def _block_bytes(session, tensors) -> int:
    addresses = {session.recorder.storage_address(tensor) for tensor in tensors}
    return sum(allocation.block_bytes for allocation in session.live_allocations() if allocation.address in addresses)


def test_components_and_phases_of_one_training_step(rehearsal):
    tracker, truth, session = rehearsal
    model = torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.ReLU(), torch.nn.Linear(512, 8))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    parameter_bytes = _block_bytes(session, model.parameters())
    first_batch = torch.randn(256, 64)  # before any phase began: "other"

    assert tracker.phase == ground_truth.BETWEEN_STEPS
    output = model(first_batch)
    after_forward = truth.moment()
    assert after_forward["components"]["parameters"] == parameter_bytes
    assert after_forward["components"]["other"] == _block_bytes(session, [first_batch])
    assert after_forward["components"]["activations"] >= _block_bytes(session, [output])
    assert (after_forward["phase"], after_forward["step"]) == (ground_truth.BETWEEN_STEPS, 0)

    output.square().mean().backward()
    optimizer.step()
    del output
    second_batch = torch.randn(256, 64)  # between steps, after the first phase: "inputs"
    after_step = truth.moment()
    components = after_step["components"]
    assert after_step["step"] == 1
    assert components["gradients"] == parameter_bytes
    assert components["optimizer_state"] == parameter_bytes  # one momentum buffer per parameter
    assert components["inputs"] == _block_bytes(session, [second_batch])
    assert components["activations"] == 0  # the graph is gone with the output
    allocated = session.backend.memory_stats(0)["allocated_bytes.all.current"]
    assert sum(components.values()) == allocated


def test_request_figures_follow_the_allocator_rules():
    assert ground_truth.round_size(1) == 512
    assert ground_truth.round_size(1025) == 1536
    assert ground_truth.allocation_size(512) == 2 * MiB
    assert ground_truth.allocation_size(1 * MiB + 512) == 20 * MiB
    assert ground_truth.allocation_size(10 * MiB + 1) == 12 * MiB
