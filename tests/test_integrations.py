"""The framework callbacks (oomdoctor.integrations): a real Trainer fit on CPU, rehearsed on a
simulated device, in a child process where nothing but the callback installs capture. The dumps'
markers and `framework` entry are checked through the analysis, as `oomdoctor report` reads them."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from oomdoctor.analysis import analyse  # noqa: E402

# (not oomdoctor.load(): once any code imported the subpackage oomdoctor.load, the package's
# attribute `load` is that module, no longer the function)
from oomdoctor.load import load  # noqa: E402

REPOSITORY = Path(__file__).resolve().parent.parent
MiB = 1 << 20
# 2 x 2048-wide Linear layers: 32 MiB of parameters and 32 MiB of gradients; Adam's 64 MiB of state,
# made in the first step, does not fit beside them with the step's temporaries (as in
# test_capture_rehearsal.py)
DEVICE_BYTES = 148 * MiB

RUNNER = textwrap.dedent(
    """
    import runpy, sys
    from oomdoctor.rehearse.session import RehearsalConfig, RehearsalSession
    RehearsalSession(RehearsalConfig(device_memory_bytes=int(sys.argv[2]))).start()
    sys.argv = [sys.argv[1]]
    runpy.run_path(sys.argv[0], run_name="__main__")
    """
)


def run_rehearsed(tmp_path: Path, script: str, extra_path: str = "") -> subprocess.CompletedProcess[str]:
    (tmp_path / "train.py").write_text(script)
    (tmp_path / "runner.py").write_text(RUNNER)
    env = {key: value for key, value in os.environ.items() if not key.startswith(("OOMDOCTOR_", "TORCHELASTIC_"))}
    env["PYTHONPATH"] = os.pathsep.join(
        part for part in (extra_path, str(REPOSITORY), os.environ.get("PYTHONPATH", "")) if part
    )
    return subprocess.run(
        [sys.executable, "runner.py", "train.py", str(DEVICE_BYTES)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def dumps(tmp_path: Path, kind: str) -> list[Path]:
    return sorted((tmp_path / "oom-dumps").glob(f"{kind}-*.pickle"))


LIGHTNING_SCRIPT = textwrap.dedent(
    """
    import oomdoctor
    from oomdoctor import capture
    import torch
    import torch.nn as nn
    import pytorch_lightning as pl
    from torch.utils.data import DataLoader, TensorDataset

    from oomdoctor.integrations.lightning import OomdoctorCallback


    class MLP(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layers = nn.Sequential(nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 2048))

        def forward(self, x):
            return self.layers(x)

        def training_step(self, batch, batch_idx):
            (x,) = batch
            return self(x).square().mean()

        def validation_step(self, batch, batch_idx):
            (x,) = batch
            self(x)
            assert capture.is_installed()  # by the callback's setup()
            oomdoctor.dump()  # the sanity check's validation batch

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=1e-3)


    assert not capture.is_installed()
    data = DataLoader(TensorDataset(torch.randn(32, 2048)), batch_size=8)
    trainer = pl.Trainer(
        accelerator="cpu", max_steps=3, callbacks=[OomdoctorCallback()], logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=1, limit_val_batches=1,
    )
    trainer.fit(MLP(), data, data)
    """
)


@pytest.mark.slow  # a child process that imports torch and Lightning: about 10 s
def test_lightning_callback_installs_capture_and_the_dump_reads_right(tmp_path):
    if importlib.util.find_spec("pytorch_lightning") is None:
        pytest.skip("pytorch_lightning is not installed")
    result = run_rehearsed(tmp_path, LIGHTNING_SCRIPT)
    assert result.returncode == 1, result.stderr[-3000:]
    assert "OutOfMemoryError" in result.stderr

    (manual,) = dumps(tmp_path, "manual")
    snapshot = load(str(manual))
    framework = snapshot.oomdoctor.framework
    assert (framework.name, framework.stage, framework.global_step) == ("lightning", "sanity_checking", 0)
    assert framework.version and snapshot.oomdoctor.packages.get("pytorch_lightning") == framework.version

    (oom,) = dumps(tmp_path, "oom")
    snapshot = load(str(oom))
    meta = snapshot.oomdoctor
    assert (meta.framework.stage, meta.framework.global_step, meta.framework.epoch) == ("training", 0, 0)
    assert meta.exception is not None and meta.exception.traceback  # Lightning re-raised it
    phases = [(marker.phase, marker.edge) for marker in meta.markers]
    # Lightning's closure: forward, zero_grad and backward come before the optimizer phase opens
    assert phases[-1] == ("optimizer_step", "start")
    assert phases[-6:-1] == [
        ("forward", "end"),
        ("zero_grad", "start"),
        ("zero_grad", "end"),
        ("backward", "start"),
        ("backward", "end"),
    ]
    analysis = analyse(snapshot)
    assert analysis.verdict == "optimizer-state-buildup"
    assert (analysis.target_phase, analysis.target_step) == ("optimizer_step", 0)
    names = {tensor.name for tensor in meta.tensors if tensor.component == "parameter"}
    assert names == {"layers.0.weight", "layers.0.bias", "layers.2.weight", "layers.2.bias"}


HF_SCRIPT = textwrap.dedent(
    """
    import oomdoctor
    from oomdoctor import capture
    import torch
    import torch.nn as nn
    from transformers import Trainer, TrainingArguments

    from oomdoctor.integrations.transformers import OomdoctorCallback


    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.Sequential(nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 2048))
            self.eval_calls = 0

        def forward(self, x, labels=None):
            out = self.layers(x)
            if not self.training:
                self.eval_calls += 1
                if self.eval_calls == 2:  # the evaluation loop's second batch
                    oomdoctor.dump()
            return {"loss": (out - labels).square().mean()}


    data = [{"x": torch.randn(2048), "labels": torch.randn(2048)} for _ in range(32)]
    args = TrainingArguments(
        output_dir="out", use_cpu=True, per_device_train_batch_size=8, per_device_eval_batch_size=8,
        max_steps=3, report_to=[], save_strategy="no", logging_strategy="no", optim="adamw_torch",
        dataloader_num_workers=0,
    )
    trainer = Trainer(model=MLP(), args=args, train_dataset=data, eval_dataset=data[:16], callbacks=[OomdoctorCallback()])
    assert capture.is_installed()  # by on_init_end
    trainer.evaluate()
    trainer.train()
    """
)


@pytest.mark.slow  # a child process that imports torch and transformers: about 15 s
def test_transformers_callback_installs_capture_and_the_dump_reads_right(tmp_path):
    # transformers is not a test dependency: run where it is installed, or with its site folder in
    # OOMDOCTOR_TEST_TRANSFORMERS_PATH (a `pip install --target` of transformers and accelerate)
    extra = os.environ.get("OOMDOCTOR_TEST_TRANSFORMERS_PATH", "")
    if extra:
        sys.path.insert(0, extra)
    try:
        found = importlib.util.find_spec("transformers") is not None and importlib.util.find_spec("accelerate")
    finally:
        if extra:
            sys.path.remove(extra)
    if not found:
        pytest.skip("transformers and accelerate are not installed (the HF Trainer needs both)")
    result = run_rehearsed(tmp_path, HF_SCRIPT, extra)
    assert result.returncode == 1, result.stderr[-3000:]
    assert "OutOfMemoryError" in result.stderr

    (manual,) = dumps(tmp_path, "manual")
    framework = load(str(manual)).oomdoctor.framework
    assert (framework.name, framework.stage, framework.global_step) == ("transformers", "evaluating", 0)

    (oom,) = dumps(tmp_path, "oom")
    snapshot = load(str(oom))
    meta = snapshot.oomdoctor
    assert (meta.framework.stage, meta.framework.global_step) == ("training", 0)
    analysis = analyse(snapshot)
    assert analysis.verdict == "optimizer-state-buildup"
    assert (analysis.target_phase, analysis.target_step) == ("optimizer_step", 0)
