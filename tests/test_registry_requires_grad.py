"""A parameter's registry entry says whether it `requires_grad`: a frozen one (a LoRA base, a
reference model) gets no gradient and no optimizer state, which analysis cannot tell from the
memory before the first backward. The loader reads the flag, refuses any other value with a note,
and redaction keeps it. Driven on CPU storages, as test_registry_flat_buffers.py is."""

from __future__ import annotations

import pytest

from oomdoctor.load.metadata import parse_metadata
from oomdoctor.redact import redact_snapshot_data, redactor_for_data

torch = pytest.importorskip("torch")
nn = torch.nn

from oomdoctor.capture.registry import collect_tensors  # noqa: E402


def _address(tensor):
    return int(tensor.untyped_storage().data_ptr()) if tensor.device.type == "cpu" else None


class _Lora(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.base = nn.Linear(8, 8)
        self.base.requires_grad_(False)
        self.adapter = nn.Parameter(torch.zeros(2, 8))


def test_each_parameter_entry_says_whether_it_requires_grad():
    model = _Lora()
    optimizer = torch.optim.AdamW([model.adapter])
    entries = collect_tensors([model], [optimizer], _address, 0)
    flags = {e["name"]: e.get("requires_grad") for e in entries if e["component"] == "parameter"}
    assert flags == {"base.weight": False, "base.bias": False, "adapter": True}


def test_a_flat_buffer_of_parameters_trains_where_any_of_them_does():
    model = _Lora()
    flat = torch.zeros(sum(p.numel() for p in model.parameters()))
    offset = 0
    for parameter in model.parameters():
        parameter.data = flat[offset : offset + parameter.numel()].view_as(parameter)
        offset += parameter.numel()
    (entry,) = [e for e in collect_tensors([model], [], _address, 0) if e["component"] == "parameter"]
    assert entry["requires_grad"] is True


def _tensor(**extra):
    return {"address": 4096, "device": 0, "component": "parameter", "name": "base.weight", "shape": [8]}, extra


@pytest.mark.parametrize("value", [True, False, None])
def test_the_loader_reads_the_flag(value):
    entry, _ = _tensor()
    if value is not None:
        entry["requires_grad"] = value
    entry.update(dtype="float32", size_bytes=32)
    meta = parse_metadata({"tensors": [entry]})
    assert meta is not None and meta.tensors[0].requires_grad is value and not meta.dropped


def test_the_loader_refuses_a_flag_that_is_not_a_bool():
    entry, _ = _tensor()
    entry.update(dtype="float32", size_bytes=32, requires_grad="no")
    meta = parse_metadata({"tensors": [entry]})
    assert meta is not None and meta.tensors[0].requires_grad is None
    assert "tensors[].requires_grad" in meta.dropped


def test_redaction_keeps_the_flag():
    entry, _ = _tensor()
    entry.update(dtype="float32", size_bytes=32, requires_grad=False)
    data = {"segments": [], "device_traces": [], "oomdoctor": {"tensors": [entry]}}
    redact_snapshot_data(data, redactor_for_data(data))
    assert data["oomdoctor"]["tensors"][0]["requires_grad"] is False
