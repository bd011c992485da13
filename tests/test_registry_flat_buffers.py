"""The registry folds a flat buffer into one entry: a storage that several registered tensors of
one component are views into (DDP's buckets, Megatron's grad buffers, FSDP1's flat parameters) is
named once, for what it holds, with its own bytes. Driven on CPU storages (`storage_address` reads
a CPU tensor's data pointer, as capture's backend reads a CUDA one)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from oomdoctor.capture.registry import collect_tensors, flat_buffer_name  # noqa: E402


def _address(tensor):
    return int(tensor.untyped_storage().data_ptr()) if tensor.device.type == "cpu" else None


def _grads_into_one_buffer(model: nn.Module) -> torch.Tensor:
    """Every parameter's .grad a view into one flat tensor, the way a flat gradient buffer lays them."""
    parameters = list(model.parameters())
    flat = torch.zeros(sum(p.numel() for p in parameters) + 16)  # and some padding at the end
    offset = 0
    for parameter in parameters:
        parameter.grad = flat[offset : offset + parameter.numel()].view_as(parameter)
        offset += parameter.numel()
    return flat


def test_gradients_sharing_one_storage_are_one_flat_buffer_with_its_bytes():
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    flat = _grads_into_one_buffer(model)
    entries = collect_tensors([model], [], _address, 0)
    gradients = [e for e in entries if e["component"] == "gradient"]
    assert len(gradients) == 1
    (entry,) = gradients
    assert entry["name"] == "flat gradient buffer (4 gradients: 0.weight.grad … 2.bias.grad)"
    assert entry["address"] == _address(flat)
    assert entry["size_bytes"] == flat.numel() * 4 and entry["shape"] == [flat.numel()]
    assert entry["dtype"] == "float32"
    # the parameters themselves are separate storages: one entry each, as before
    assert [e["name"] for e in entries if e["component"] == "parameter"] == ["0.weight", "0.bias", "2.weight", "2.bias"]


def test_two_gradients_in_one_buffer_are_both_named():
    model = nn.Linear(8, 4)
    _grads_into_one_buffer(model)
    (entry,) = [e for e in collect_tensors([model], [], _address, 0) if e["component"] == "gradient"]
    assert entry["name"] == "flat gradient buffer (2 gradients: weight.grad, bias.grad)"


def test_parameters_that_are_views_into_one_flat_parameter_are_one_entry():
    # FSDP1 with use_orig_params=True, DeepSpeed ZeRO's 16-bit groups: parameters viewing one flat tensor
    model = nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 4))
    flat = torch.zeros(sum(p.numel() for p in model.parameters()))
    offset = 0
    for parameter in model.parameters():
        parameter.data = flat[offset : offset + parameter.numel()].view_as(parameter)
        offset += parameter.numel()
    (entry,) = [e for e in collect_tensors([model], [], _address, 0) if e["component"] == "parameter"]
    assert entry["name"] == "flat parameter buffer (4 parameters: 0.weight … 1.bias)"
    assert entry["size_bytes"] == flat.numel() * 4


def test_tied_weights_keep_an_entry_each():
    # two Parameter objects over one whole storage are aliases of one tensor, not a flat buffer
    model = nn.Sequential(nn.Embedding(10, 8), nn.Linear(8, 10, bias=False))
    model[1].weight = nn.Parameter(model[0].weight.data)
    entries = [e for e in collect_tensors([model], [], _address, 0) if e["component"] == "parameter"]
    assert [(e["name"], e["size_bytes"]) for e in entries] == [("0.weight", 320), ("1.weight", 320)]


def test_a_gradient_alone_in_its_storage_is_named_as_itself():
    model = nn.Linear(8, 4)
    model(torch.randn(2, 8)).sum().backward()
    names = {e["name"] for e in collect_tensors([model], [], _address, 0) if e["component"] == "gradient"}
    assert names == {"weight.grad", "bias.grad"}


def test_flat_buffer_names_stay_bounded_whatever_the_names():
    long = "model." + ".".join(f"block_with_a_long_name_{i}" for i in range(40)) + ".weight.grad"
    name = flat_buffer_name("DDP gradient bucket", "gradients", [long, "x.grad", long + "2"])
    assert len(name) < 220
    assert name.startswith("DDP gradient bucket (3 gradients: model.block_with")
    assert name.endswith("weight.grad2)") and "…" in name
    assert flat_buffer_name("ZeRO-2 gradient bucket (bf16)", "gradients", []) == "ZeRO-2 gradient bucket (bf16)"
