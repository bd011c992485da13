"""The registry names sharded models' tensors: FSDP2 (`fully_shard`) parameters, gradients and
optimizer state are DTensors, wrapper subclasses with no storage of their own, so the registry
names their local shards. Rehearsed on CPU with torch's fake process group: world size 2 in one
process, every collective a no-op, so each rank's shard is half of each tensor.

DDP's gradient buckets (gloo, world size 1) and DeepSpeed ZeRO's flat groups and partitions
(stages 1 to 3 on DeepSpeed's CPU accelerator, in a child process) are rehearsed too."""

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
            ("optimizer_state", f"{name}.exp_avg", shard),
            ("optimizer_state", f"{name}.exp_avg_sq", shard),
        ]
    # each layer's gradient shards are views into the one output of its reduce-scatter: that
    # storage is named once, with its bytes (the two shards')
    for layer in ("0", "2"):
        weight, bias = full_shapes[f"{layer}.weight"], full_shapes[f"{layer}.bias"]
        entry = by_name[("gradient", f"flat gradient buffer (2 gradients: {layer}.weight.grad, {layer}.bias.grad)")]
        assert entry["size_bytes"] == 4 * (weight[0] * weight[1] + bias[0]) // 2
        assert entry["shape"] == [entry["size_bytes"] // 4]
    assert not any(component == "gradient" and name.endswith(".grad") for component, name in by_name)
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


# -- DDP's gradient buckets ---------------------------------------------------------------------

DDP_SCRIPT = textwrap.dedent(
    """
    import json
    import sys
    import oomdoctor
    oomdoctor.install()

    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel

    target, mode, truth = sys.argv[1], sys.argv[2], sys.argv[3]
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 8))
    # small buckets (find_unused_parameters keeps the construction-time bucketing): two of them
    ddp = DistributedDataParallel(
        model, gradient_as_bucket_view=mode == "view", bucket_cap_mb=0.04, find_unused_parameters=True
    )
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    for _ in range(2):
        optimizer.zero_grad(set_to_none=False)
        ddp(torch.randn(4, 64)).square().mean().backward()
        optimizer.step()
    # DDP's own account of its buckets' bytes
    sizes = [int(size) for size in ddp._get_ddp_logging_data()["bucket_sizes"].split(",")]
    with open(truth, "w") as file:
        json.dump(sizes, file)
    oomdoctor.dump(target)
    dist.destroy_process_group()
    """
)
DDP_GRADIENTS = ["0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias"]


def _rehearse_ddp(tmp_path, monkeypatch, mode: str):
    import json

    from oomdoctor.pipeline import load_and_analyse

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    script = tmp_path / "ddp.py"
    script.write_text(DDP_SCRIPT)
    target, truth = tmp_path / "end.pickle", tmp_path / "buckets.json"
    hooks = (sys.excepthook, threading.excepthook)
    try:
        result = rehearse_script(
            script,
            [str(target), mode, str(truth)],
            RehearsalConfig(device_memory_bytes=256 << 20),
            dump_dir=tmp_path / "oom-dumps",
        )
    finally:
        if torch.distributed.is_initialized():  # the script failed before it could
            torch.distributed.destroy_process_group()
    assert result.exit_code == 0, result.error_text
    assert (sys.excepthook, threading.excepthook) == hooks  # init_process_group's wrapper is gone
    with open(target, "rb") as file:
        data = pickle.load(file)
    _, analysis = load_and_analyse(target)
    return data, analysis, json.loads(truth.read_text())


def test_ddp_buckets_of_gradients_as_bucket_views_are_named_once_with_their_bytes(tmp_path, monkeypatch):
    data, analysis, bucket_sizes = _rehearse_ddp(tmp_path, monkeypatch, "view")
    assert len(bucket_sizes) == 2
    gradients = [entry for entry in data[METADATA_KEY]["tensors"] if entry["component"] == "gradient"]
    # one entry per bucket, not one per gradient (each gradient is a view into its bucket)
    assert sorted(entry["size_bytes"] for entry in gradients) == sorted(bucket_sizes)
    names = [entry["name"] for entry in gradients]
    assert all(name.startswith("DDP gradient bucket (3 gradients: module.") for name in names), names
    named = " ".join(names)
    # DDP buckets in reverse order: the last layers' gradients share a bucket, the first layers' another
    assert "module.0.weight.grad … module.2.weight.grad" in named and "module.2.bias.grad … module.4.bias.grad" in named
    assert not any(entry["name"] == f"module.{name}.grad" for entry in gradients for name in DDP_GRADIENTS)
    for entry in gradients:
        assert entry["shape"] == [entry["size_bytes"] // 4] and entry["dtype"] == "float32"
    # the analysis names each bucket's block after it, with the bucket's bytes
    blocks = {block.address: block for block in analysis.live_blocks}
    for entry in gradients:
        block = blocks[entry["address"]]
        assert (block.component, block.method, block.name) == ("gradients", "registry", entry["name"])
        assert block.requested_bytes == entry["size_bytes"]


def test_ddp_buckets_outside_the_gradients_are_gradients_by_their_allocation_frames(tmp_path, monkeypatch):
    data, analysis, bucket_sizes = _rehearse_ddp(tmp_path, monkeypatch, "copy")
    registered = {entry["address"] for entry in data[METADATA_KEY]["tensors"]}
    gradients = {entry["name"] for entry in data[METADATA_KEY]["tensors"] if entry["component"] == "gradient"}
    assert gradients == {f"module.{name}.grad" for name in DDP_GRADIENTS}  # separate tensors, named as ever
    # the buckets: allocations of DDP's C++ reducer that nothing in Python reaches
    buckets = [b for b in analysis.live_blocks if b.address not in registered and b.requested_bytes in bucket_sizes]
    assert sorted(b.requested_bytes for b in buckets) == sorted(bucket_sizes)
    for block in buckets:
        assert (block.component, block.method) == ("gradients", "frames"), block
        assert any(frame.name == "_ddp_init_helper" for frame in block.frames)


# -- DeepSpeed ZeRO -----------------------------------------------------------------------------

DEEPSPEED_SCRIPT = textwrap.dedent(
    """
    import importlib
    import sys
    import oomdoctor
    oomdoctor.install()

    import torch
    import torch.nn as nn
    import deepspeed

    target, stage = sys.argv[1], int(sys.argv[2])
    # DeepSpeed's CPU accelerator compiles a shared-memory all-reduce kernel (a C++ build of a
    # minute) when its communication backend starts; a single rank needs none
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))  # 676 parameters
    config = {
        "train_micro_batch_size_per_gpu": 2,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": True}},
        "bf16": {"enabled": True},
        "zero_optimization": {
            "stage": stage,
            "reduce_bucket_size": 4096,
            "allgather_bucket_size": 4096,
            "stage3_prefetch_bucket_size": 4096,
            "stage3_param_persistence_threshold": 0,
        },
    }
    engine, optimizer, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    for step in range(2):
        loss = engine(torch.randn(2, 16, dtype=torch.bfloat16)).float().square().mean()
        engine.backward(loss)
        if step == 1:  # the gradients reduced, the optimizer state made by the first step
            oomdoctor.dump(target)
        engine.step()
    """
)
ZERO_PARAMETERS = 16 * 32 + 32 + 32 * 4 + 4
ZERO_NAMES = "module.0.weight … module.2.bias"


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.slow  # about 5 s a stage: DeepSpeed's import and engine, in a child process
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_deepspeed_zero_flat_groups_partitions_and_state_are_named(tmp_path, stage):
    import importlib.util
    import os
    import subprocess
    from pathlib import Path

    from oomdoctor.pipeline import load_and_analyse

    if importlib.util.find_spec("deepspeed") is None:
        pytest.skip("deepspeed is not installed (the test extra installs it)")
    script = tmp_path / "zero.py"
    script.write_text(DEEPSPEED_SCRIPT)
    target = tmp_path / "zero.pickle"
    root = str(Path(__file__).resolve().parents[1])
    environment = {
        key: value for key, value in os.environ.items() if not key.startswith(("OOMDOCTOR_", "TORCHELASTIC_"))
    }
    environment.update(
        PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])),
        DS_ACCELERATOR="cpu",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(_free_port()),
        RANK="0",
        LOCAL_RANK="0",
        WORLD_SIZE="1",
        TORCH_EXTENSIONS_DIR=str(tmp_path / "extensions"),
    )
    command = [sys.executable, "-m", "oomdoctor", "rehearse", str(script), "--device-memory", "256MiB"]
    command += ["--out", str(tmp_path / "oom-dumps"), "--", str(target), str(stage)]
    done = subprocess.run(command, cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and target.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    with open(target, "rb") as file:
        data = pickle.load(file)
    entries = {(entry["component"], entry["name"]): entry for entry in data[METADATA_KEY]["tensors"]}
    zero = f"ZeRO-{stage}"
    if stage < 3:
        flat16 = f"{zero} bf16 parameters of group 0 (4 parameters: {ZERO_NAMES})"
        fp32 = f"{zero} fp32 partition of group 0"
        gradients = f"{zero} gradient partition of group 0 (4 gradients: module.0.weight.grad … module.2.bias.grad)"
    else:
        flat16 = f"{zero} bf16 parameter partitions (4 parameters: {ZERO_NAMES})"
        fp32 = f"{zero} fp32 partition of sub-group 0"
        gradients = f"{zero} gradient partitions (4 gradients: module.0.weight.grad … module.2.bias.grad)"
    expected = {
        ("parameter", flat16): 2 * ZERO_PARAMETERS,  # one rank holds them all: no padding
        ("parameter", fp32): 4 * ZERO_PARAMETERS,
        ("optimizer_state", f"{fp32}.exp_avg"): 4 * ZERO_PARAMETERS,
        ("optimizer_state", f"{fp32}.exp_avg_sq"): 4 * ZERO_PARAMETERS,
        ("gradient", gradients): 2 * ZERO_PARAMETERS,
    }
    for key, size in expected.items():
        assert key in entries, (key, sorted(entries))
        assert entries[key]["size_bytes"] == size, key
    # nothing left to the fallback names of the optimizer DeepSpeed wraps, nor one entry per view
    assert not any(".param_groups." in name or name.startswith("AdamW.") for _, name in entries)
    assert not any(name in ("module.0.weight", "module.0.weight.grad") for _, name in entries)
    _, analysis = load_and_analyse(target)
    blocks = {block.address: block for block in analysis.live_blocks}
    component = {"parameter": "parameters", "gradient": "gradients", "optimizer_state": "optimizer_state"}
    for (kind, name), size in expected.items():
        block = blocks[entries[(kind, name)]["address"]]
        assert (block.component, block.method, block.name) == (component[kind], "registry", name)
        assert block.requested_bytes == size
