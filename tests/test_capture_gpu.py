"""oomdoctor.install() on a real CUDA device (skipped without one).

What only a GPU can show: torch's own observer call, history recording and snapshot, and its C++
OutOfMemoryError reaching Python through the wrapped exception class (the signal capture uses to
tell a surfaced OOM from one torch retried internally).
"""

from __future__ import annotations

import pickle
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

SCRIPT = textwrap.dedent(
    """
    import oomdoctor
    oomdoctor.install()
    import torch
    import torch.nn as nn

    torch.cuda.set_per_process_memory_fraction(0.02)  # run out quickly, whatever the card
    model = nn.Sequential(nn.Linear(4096, 4096), nn.ReLU(), nn.Linear(4096, 4096)).cuda()
    optimizer = torch.optim.Adam(model.parameters())
    kept = []
    for step in range(100000):
        optimizer.zero_grad()
        output = model(torch.randn(256, 4096, device="cuda"))
        kept.append(output)  # a leak: every step's activations stay alive
        output.square().mean().backward()
        optimizer.step()
    """
)


def test_real_oom_leaves_one_complete_dump(tmp_path):
    from torch.cuda import _memory_viz

    (tmp_path / "train.py").write_text(SCRIPT)
    result = subprocess.run([sys.executable, "train.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1 and "OutOfMemoryError" in result.stderr
    dumps = sorted((tmp_path / "oom-dumps").glob("*.pickle"))
    assert len(dumps) == 1, result.stderr[-3000:]
    data = pickle.loads(dumps[0].read_bytes())
    meta = data["oomdoctor"]
    assert meta["oom"]["surfaced"] is True
    assert meta["exception"]["type"].endswith("OutOfMemoryError") and "train.py" in meta["exception"]["traceback"]
    assert meta["recording"]["started_by"] == "oomdoctor" and meta["device"]["total_memory_bytes"] > 0
    assert any(event["action"] == "oom" for event in data["device_traces"][meta["oom"]["device"]])
    assert "raise OutOfMemoryError" in _memory_viz.trace(data)
    _memory_viz.segsum(data)
    live = {
        block["address"]
        for segment in data["segments"]
        for block in segment["blocks"]
        if block["state"] == "active_allocated"
    }
    parameters = [entry for entry in meta["tensors"] if entry["component"] == "parameter"]
    assert len(parameters) == 4 and all(entry["address"] in live for entry in parameters)
    phases = {marker["phase"] for marker in meta["markers"]}
    assert {"forward", "backward", "optimizer_step", "zero_grad"} <= phases
