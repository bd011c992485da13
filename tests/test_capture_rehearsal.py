"""oomdoctor.install() end to end: real training scripts run on CPU under rehearsal into an OOM.

The rehearsal simulator plays the GPU (capture's backend seam answers from it), so these dumps are
written by exactly the code that runs on a real device: the OOM observer, the exception hooks,
the markers and the registry.
"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from oomdoctor.metadata import METADATA_KEY  # noqa: E402
from oomdoctor.rehearse.session import RehearsalConfig, rehearse_script  # noqa: E402

MiB = 1 << 20

# Adam on a 2 x 2048-wide MLP: 32 MiB of parameters, 32 MiB of gradients, then 64 MiB of state
# created lazily in the first step(). Model states (128 MiB) fit in 148 MiB; with the step's
# foreach temporaries on top they do not: the optimizer-state buildup of DESIGN §5.
BUILDUP_DEVICE_BYTES = 148 * (1 << 20)
TRAIN_SCRIPT = textwrap.dedent(
    """
    import oomdoctor
    oomdoctor.install()

    import argparse
    import torch
    import torch.nn as nn

    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--big-batch-at", type=int, default=-1)
    args = parser.parse_args()


    class MLP(nn.Module):
        def __init__(self, width=2048, depth=2):
            super().__init__()
            self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
            self.norm = nn.BatchNorm1d(width)

        def forward(self, x):
            for layer in self.layers:
                x = torch.relu(layer(x))
            return self.norm(x)


    def main():
        torch.manual_seed(0)
        model = MLP()
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        for step in range(args.steps):
            batch = 4096 if step == args.big_batch_at else 8
            optimizer.zero_grad()
            loss = model(torch.randn(batch, 2048)).square().mean()
            loss.backward()
            optimizer.step()


    main()
    """
)


@pytest.fixture
def script(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ("OOMDOCTOR_DIR", "OOMDOCTOR_MAX_DUMPS", "OOMDOCTOR_DISABLE", "PYTORCH_CUDA_ALLOC_CONF"):
        monkeypatch.delenv(name, raising=False)
    path = tmp_path / "train.py"
    path.write_text(TRAIN_SCRIPT)
    return path


def rehearse(script: Path, args: list[str], device_memory_bytes: int):
    dump_dir = script.parent / "oom-dumps"
    result = rehearse_script(script, args, RehearsalConfig(device_memory_bytes=device_memory_bytes), dump_dir=dump_dir)
    return result, sorted(dump_dir.glob("*.pickle"))


def load(path: Path) -> dict:
    with open(path, "rb") as file:
        return pickle.load(file)


def phase_at(markers: list[dict], time_us: int) -> tuple[str, int] | None:
    """The phase open at `time_us`: the latest start marker at or before it without its end."""
    open_phase = None
    for marker in markers:
        if marker["time_us"] > time_us:
            break
        if marker["edge"] == "start":
            open_phase = (marker["phase"], marker["step"])
        elif open_phase is not None and open_phase[0] == marker["phase"]:
            open_phase = None
    return open_phase


def active_blocks(data: dict) -> dict[int, int]:
    return {
        block["address"]: block["size"]
        for segment in data["segments"]
        for block in segment["blocks"]
        if block["state"] == "active_allocated"
    }


def test_optimizer_state_buildup_leaves_one_dump_that_everything_reads(script, capsys):
    from torch.cuda import _memory_viz

    from oomdoctor.cli import main

    result, dumps = rehearse(script, [], BUILDUP_DEVICE_BYTES)
    assert result.exit_code == 1 and result.dump_writer == "capture"
    assert len(dumps) == 1
    err = capsys.readouterr().err
    assert f"wrote oom-dumps/{dumps[0].name}" in err

    data = load(dumps[0])
    meta = data[METADATA_KEY]
    # memory_viz reads it unchanged, including the OOM event
    assert "raise OutOfMemoryError" in _memory_viz.trace(data)
    assert "Summary of segments" in _memory_viz.segsum(data)
    assert meta["reason"] == "oom" and meta["rehearsal"]["device_memory_bytes"] == BUILDUP_DEVICE_BYTES

    # the OOM happened in the first step's optimizer step, and the markers say so
    assert phase_at(meta["markers"], meta["oom"]["time_us"]) == ("optimizer_step", 0)
    oom_events = [event for event in data["device_traces"][0] if event["action"] == "oom"]
    assert len(oom_events) == 1 and phase_at(meta["markers"], oom_events[0]["time_us"]) == ("optimizer_step", 0)

    # the registry names every parameter, gradient and the optimizer state created so far
    by_component: dict[str, set[str]] = {}
    for entry in meta["tensors"]:
        by_component.setdefault(entry["component"], set()).add(entry["name"])
    parameters = {f"layers.{i}.{kind}" for i in range(2) for kind in ("weight", "bias")} | {"norm.weight", "norm.bias"}
    assert by_component["parameter"] == parameters
    assert by_component["gradient"] == {name + ".grad" for name in parameters}
    assert "layers.0.weight.exp_avg" in by_component["optimizer_state"]
    assert by_component["buffer"] >= {"norm.running_mean", "norm.running_var"}
    # and its addresses are the live blocks of the snapshot
    live = active_blocks(data)
    for entry in meta["tensors"]:
        if entry["component"] in ("parameter", "gradient"):
            assert entry["address"] in live and live[entry["address"]] >= entry["size_bytes"]

    # the exception reached the script's runner, which caught it: type and message are recorded
    assert meta["exception"]["type"] == "torch.OutOfMemoryError"
    assert "CUDA out of memory" in meta["exception"]["message"]

    # oomdoctor report diagnoses it
    code = main(["report", str(dumps[0]), "--format", "json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0
    assert report["verdict"] == "optimizer-state-buildup"


@pytest.mark.slow
def test_activation_spike_in_a_later_forward(script):
    result, dumps = rehearse(script, ["--big-batch-at", "2"], 200 * MiB)
    assert result.exit_code == 1 and len(dumps) == 1
    meta = load(dumps[0])[METADATA_KEY]
    assert phase_at(meta["markers"], meta["oom"]["time_us"]) == ("forward", 2)
    # two completed steps: gradients were set to None by zero_grad, Adam's state is all there
    components = {entry["component"] for entry in meta["tensors"]}
    assert "gradient" not in components and "optimizer_state" in components


def test_a_script_that_fits_leaves_no_dump(script):
    result, dumps = rehearse(script, ["--steps", "2"], 512 * MiB)
    assert result.exit_code == 0 and dumps == []


@pytest.mark.slow
def test_uncaught_oom_in_a_plain_process_gets_its_traceback(script, tmp_path):
    runner = tmp_path / "run_rehearsed.py"
    runner.write_text(
        textwrap.dedent(
            f"""
            import runpy, sys
            from oomdoctor.rehearse.session import RehearsalConfig, RehearsalSession
            session = RehearsalSession(RehearsalConfig(device_memory_bytes={BUILDUP_DEVICE_BYTES})).start()
            sys.argv = [{str(script)!r}]
            runpy.run_path({str(script)!r}, run_name="__main__")
            """
        )
    )
    result = subprocess.run([sys.executable, str(runner)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, result.stderr[-2000:]
    dumps = sorted((tmp_path / "oom-dumps").glob("*.pickle"))
    assert len(dumps) == 1
    assert "Traceback" in result.stderr and "oomdoctor: the dump of this OOM is oom-dumps/" in result.stderr
    meta = load(dumps[0])[METADATA_KEY]
    traceback_text = meta["exception"]["traceback"]
    assert "optimizer.step()" in traceback_text and "OutOfMemoryError" in traceback_text
    assert phase_at(meta["markers"], meta["oom"]["time_us"]) == ("optimizer_step", 0)


FIRST_FORWARD_SCRIPT = textwrap.dedent(
    """
    import oomdoctor
    oomdoctor.install()

    import torch
    import torch.nn as nn

    torch.manual_seed(0)
    layers = [nn.Linear(2048, 2048) for _ in range(4)]
    model = nn.Sequential(layers[0], nn.ReLU(), layers[1], nn.ReLU(), layers[2], nn.ReLU(), layers[3])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)  # no momentum: no state, ever
    for step in range(2):
        optimizer.zero_grad()
        model(torch.randn(4096, 2048)).square().mean().backward()
        optimizer.step()
    """
)


def test_sgd_without_momentum_out_of_memory_in_its_first_forward_records_its_kind(script, capsys):
    """64 MiB of parameters and a 32 MiB batch on 144 MiB: the first layer's output fits, the ReLU's
    does not. The dump says which optimizer the run made, so the report projects no optimizer state
    for it: the model states fit at full size (parameters and gradients, 128 MiB), and the forward
    is too large for the device in one pass (with Adam's two moments assumed they would not fit, and
    the verdict was unknown)."""
    from oomdoctor.cli import main

    first = script.parent / "first_forward.py"
    first.write_text(FIRST_FORWARD_SCRIPT)
    result, dumps = rehearse(first, [], 144 * MiB)
    assert result.exit_code == 1 and len(dumps) == 1
    meta = load(dumps[0])[METADATA_KEY]
    assert phase_at(meta["markers"], meta["oom"]["time_us"]) == ("forward", 0)
    assert meta["optimizers"] == 1
    assert meta["optimizer_kinds"] == [{"class": "torch.optim.sgd.SGD", "moments": 0, "options": {"momentum": 0}}]
    capsys.readouterr()
    assert main(["report", str(dumps[0]), "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["verdict"] == "activation-spike", report["summary"]
    (states,) = [e for e in report["evidence"] if e["metric"] == "model_states_full_bytes"]
    parameters = sum(e["size_bytes"] for e in meta["tensors"] if e["component"] == "parameter")
    assert states["bytes"] == 2 * parameters  # the parameters and their gradients to come, no state
    assert "no optimizer state: its optimizer keeps none, recorded at capture" in states["text"], states
    assert "Adam" not in json.dumps(report)


RETRY_SCRIPT = textwrap.dedent(
    """
    import oomdoctor
    oomdoctor.install()

    import torch
    import torch.nn as nn

    model = nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    batch_size = 16384
    while True:  # what find_executable_batch_size does: halve the batch until a step fits
        try:
            optimizer.zero_grad()
            model(torch.randn(batch_size, 1024)).square().mean().backward()
            optimizer.step()
            break
        except torch.OutOfMemoryError:
            batch_size //= 2
    print("fits at batch", batch_size)
    """
)


@pytest.mark.slow
def test_caught_and_retried_oom_leaves_two_useful_dumps(script, capsys):
    retry = script.parent / "retry.py"
    retry.write_text(RETRY_SCRIPT)
    result, dumps = rehearse(retry, [], 200 * MiB)
    assert result.exit_code == 0 and "fits at batch 4096" in capsys.readouterr().out
    assert len(dumps) == 2
    metas = sorted((load(path)[METADATA_KEY] for path in dumps), key=lambda meta: meta["oom"]["time_us"])
    # 16384 runs out in forward; 8192, with the first attempt's tensors released as on a GPU, in backward
    phases = [phase_at(meta["markers"], meta["oom"]["time_us"]) for meta in metas]
    assert phases == [("forward", 0), ("backward", 0)]
    for meta in metas:
        assert meta["oom"]["surfaced"] is True and meta["exception"]["type"] == "torch.OutOfMemoryError"
        # the batch being tried is alive in the failing forward: the model's input
        assert {entry["component"] for entry in meta["tensors"]} == {"parameter", "input"}
        (batch,) = [entry for entry in meta["tensors"] if entry["component"] == "input"]
        assert batch["name"] == "Sequential.forward arg 0" and batch["shape"][1] == 1024
    assert metas[0]["oom"]["alloc_bytes"] > metas[1]["oom"]["alloc_bytes"]
    assert len(metas[1]["ooms_observed"]) == 2
