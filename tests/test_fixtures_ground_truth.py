"""The fixtures' ground truth (fixtures/ground_truth.py) on a tiny training step, in process."""

from __future__ import annotations

import pytest

from tests.conftest import fixture_module

torch = pytest.importorskip("torch")


ground_truth = fixture_module("ground_truth")
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
    table = torch.randn(128, 64)  # before any phase began, never given to a forward: "other"
    first_batch = torch.randn(256, 64)  # before any phase began, given to the forward: "inputs"

    assert tracker.phase == ground_truth.BETWEEN_STEPS
    output = model(first_batch)
    after_forward = truth.moment()
    assert after_forward["components"]["parameters"] == parameter_bytes
    assert after_forward["components"]["other"] == _block_bytes(session, [table])
    assert after_forward["components"]["inputs"] == _block_bytes(session, [first_batch])
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
    # the first batch is still the latest call's argument; the second was made between steps
    assert components["inputs"] == _block_bytes(session, [first_batch, second_batch])
    assert components["activations"] == 0  # the graph is gone with the output
    allocated = session.backend.memory_stats(0)["allocated_bytes.all.current"]
    assert sum(components.values()) == allocated


class Tagger(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(64, 16)

    def forward(self, tokens, extras, attention_mask=None):
        return self.embed(tokens) * attention_mask.unsqueeze(-1)


def test_inputs_are_the_latest_outermost_calls_tensors_by_identity(rehearsal):
    tracker, truth, session = rehearsal
    model = Tagger()
    loss_function = torch.nn.MSELoss()
    old_tokens = torch.randint(64, (32, 16))
    model(old_tokens, [], attention_mask=torch.ones(32, 16))  # an earlier call: not the latest
    tokens = torch.randint(64, (64, 128))
    mask = torch.ones(64, 128)
    extras = [torch.zeros(64, 128), "text"]
    targets = torch.randn(64, 128, 16)
    output = model(tokens, extras, attention_mask=mask)
    loss = loss_function(output, targets)  # a parameterless root module: targets are its input
    moment = truth.moment()
    # output has a grad_fn: an autograd result passed on, not an input
    assert moment["components"]["inputs"] == _block_bytes(session, [tokens, mask, extras[0], targets])
    assert moment["components"]["other"] == _block_bytes(session, [old_tokens])
    loss.backward()
    del tokens
    after = truth.moment()
    assert after["components"]["inputs"] == _block_bytes(session, [mask, extras[0], targets])


def test_request_figures_follow_the_allocator_rules():
    assert ground_truth.round_size(1) == 512
    assert ground_truth.round_size(1025) == 1536
    assert ground_truth.allocation_size(512) == 2 * MiB
    assert ground_truth.allocation_size(1 * MiB + 512) == 20 * MiB
    assert ground_truth.allocation_size(10 * MiB + 1) == 12 * MiB


def test_a_loss_computed_in_the_loop_is_the_forwards_until_its_backward(rehearsal):
    """The loop's own code after the model returned and before the backward: what autograd holds for
    that backward (F.cross_entropy's log-softmax of the logits, the loss) is an activation; what it
    makes without autograd, or keeps past the backward, is an input (docs/definitions.md)."""
    tracker, truth, session = rehearsal
    model = torch.nn.Linear(64, 1000)
    batch = torch.randn(256, 64)
    targets = torch.randint(1000, (256,))
    logits = model(batch)
    log_probs_bytes = _block_bytes(session, [logits])  # the log-softmax is the logits' shape
    activations_after_forward = truth.moment()["components"]["activations"]
    loss = torch.nn.functional.cross_entropy(logits, targets)  # in the loop, outside every module
    with torch.no_grad():
        predicted = logits.argmax(dim=-1)  # the loop's, without autograd: an input
    kept = logits * 2  # an autograd result the loop keeps past the backward
    before = truth.moment()
    assert before["phase"] == ground_truth.BETWEEN_STEPS
    loss_code = before["components"]["activations"] - activations_after_forward
    # the log-softmax, the loss and the kept product (autograd results, a backward still to come)
    assert loss_code >= log_probs_bytes + _block_bytes(session, [loss, kept])
    assert before["components"]["inputs"] == _block_bytes(session, [batch, predicted])
    assert before["components"]["other"] == _block_bytes(session, [targets])  # never given to a module

    loss.backward()
    del logits
    after = truth.moment()
    # the backward freed what autograd saved; the loss and the product outlived it: the loop's
    assert after["components"]["inputs"] == _block_bytes(session, [batch, predicted, loss, kept])
    assert after["components"]["activations"] == 0  # the log-softmax went with the graph
