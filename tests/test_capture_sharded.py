"""The registry names sharded models' tensors: FSDP2 (`fully_shard`) parameters, gradients and
optimizer state are DTensors, wrapper subclasses with no storage of their own, so the registry
names their local shards. Rehearsed on CPU with torch's fake process group: world size 2 in one
process, every collective a no-op, so each rank's shard is half of each tensor."""

from __future__ import annotations

import pickle
import sys
import textwrap
import threading

import pytest

torch = pytest.importorskip("torch")
if not torch.distributed.is_available():
    pytest.skip("torch was built without torch.distributed", allow_module_level=True)

from oomdoctor.metadata import METADATA_KEY  # noqa: E402
from oomdoctor.rehearse.session import RehearsalConfig, rehearse_script  # noqa: E402

FSDP2_SCRIPT = textwrap.dedent(
    """
    import sys
    import oomdoctor
    oomdoctor.install()

    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.distributed.fsdp import fully_shard
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 8))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(2):
        optimizer.zero_grad(set_to_none=False)
        model(torch.randn(4, 64)).square().mean().backward()
        optimizer.step()
    assert type(model[0].weight).__name__ == "DTensor"
    oomdoctor.dump(sys.argv[1])
    dist.destroy_process_group()
    """
)


@pytest.mark.slow  # about 3 s: torch.distributed's FSDP and a rehearsed training step
def test_fsdp2_shards_are_named_as_parameters_gradients_and_optimizer_state(tmp_path, monkeypatch):
    pytest.importorskip("torch.distributed.fsdp")
    pytest.importorskip("torch.testing._internal.distributed.fake_pg")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    script = tmp_path / "fsdp2.py"
    script.write_text(FSDP2_SCRIPT)
    target = tmp_path / "end.pickle"
    hooks = (sys.excepthook, threading.excepthook)
    result = rehearse_script(
        script, [str(target)], RehearsalConfig(device_memory_bytes=256 << 20), dump_dir=tmp_path / "oom-dumps"
    )
    assert result.exit_code == 0, result.error_text
    # init_process_group wrapped sys.excepthook ("[rank0]: " before every line) and
    # destroy_process_group left it: the rehearsal puts back the process's hooks
    assert (sys.excepthook, threading.excepthook) == hooks
    with open(target, "rb") as file:
        data = pickle.load(file)
    by_name = {(entry["component"], entry["name"]): entry for entry in data[METADATA_KEY]["tensors"]}
    full_shapes = {"0.weight": [128, 64], "0.bias": [128], "2.weight": [8, 128], "2.bias": [8]}
    expected = []
    for name, shape in full_shapes.items():
        shard = [shape[0] // 2, *shape[1:]]  # dim-0 sharding over 2 ranks
        expected += [
            ("parameter", name, shard),
            ("gradient", f"{name}.grad", shard),
            ("optimizer_state", f"{name}.exp_avg", shard),
            ("optimizer_state", f"{name}.exp_avg_sq", shard),
        ]
    live = {
        block["address"]: block["size"]
        for segment in data["segments"]
        for block in segment["blocks"]
        if block["state"] == "active_allocated"
    }
    for component, name, shard in expected:
        entry = by_name[(component, name)]
        assert entry["shape"] == shard, name
        assert entry["size_bytes"] == 4 * shard[0] * (shard[1] if len(shard) > 1 else 1)
        # the shard's storage is a live block of the (simulated) device
        assert entry["address"] in live and live[entry["address"]] >= entry["size_bytes"], name
