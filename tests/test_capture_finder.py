"""The dump budget under a batch-size finder (issue 14): accelerate's `find_executable_batch_size`
loop, run under rehearsal, probes 7 batch sizes that run out before one fits, then the run dies of
a real OOM elsewhere. The probes share one site, so they keep two files (the first and the latest);
the fatal OOM gets its own dump with its traceback, and the report of a probe says it was caught.
"""

from __future__ import annotations

import json
import pickle
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from oomdoctor.metadata import METADATA_KEY  # noqa: E402
from oomdoctor.rehearse.session import RehearsalConfig, rehearse_script  # noqa: E402

MiB = 1 << 20

FINDER_SCRIPT = textwrap.dedent(
    """
    import gc
    import sys

    import oomdoctor
    oomdoctor.install()

    import torch
    import torch.nn as nn


    def should_reduce_batch_size(exception):  # accelerate.utils.memory
        statements = ["CUDA out of memory.", "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED."]
        if isinstance(exception, RuntimeError) and len(exception.args) == 1:
            return any(statement in exception.args[0] for statement in statements)
        return False


    def find_executable_batch_size(function, starting_batch_size=128):  # accelerate.utils.memory
        batch_size = starting_batch_size

        def decorator(*args, **kwargs):
            nonlocal batch_size
            gc.collect()
            while True:
                if batch_size == 0:
                    raise RuntimeError("No executable batch size found, reached zero.")
                try:
                    return function(batch_size, *args, **kwargs)
                except Exception as e:
                    if should_reduce_batch_size(e):
                        gc.collect()
                        torch.cuda.empty_cache()
                        batch_size //= 2
                    else:
                        raise

        return decorator


    model = nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)


    def train(batch_size):
        optimizer.zero_grad()
        model(torch.randn(batch_size, 1024)).square().mean().backward()
        optimizer.step()
        return batch_size


    found = find_executable_batch_size(train, starting_batch_size=int(sys.argv[1]))()
    print("fits at batch", found, flush=True)
    with torch.no_grad():  # evaluation that keeps every output: the real OOM
        outputs = [model(torch.randn(found, 1024)) for _ in range(200)]
    """
)


def load(path: Path) -> dict:
    with open(path, "rb") as file:
        return pickle.load(file)


@pytest.mark.slow
def test_probes_share_two_files_and_the_fatal_oom_gets_its_dump(tmp_path, monkeypatch, capsys):
    from oomdoctor.cli import main

    monkeypatch.chdir(tmp_path)
    for name in ("OOMDOCTOR_DIR", "OOMDOCTOR_MAX_DUMPS", "OOMDOCTOR_DISABLE", "PYTORCH_CUDA_ALLOC_CONF"):
        monkeypatch.delenv(name, raising=False)
    script = tmp_path / "finder.py"
    script.write_text(FINDER_SCRIPT)
    dump_dir = tmp_path / "oom-dumps"
    result = rehearse_script(script, ["32768"], RehearsalConfig(device_memory_bytes=48 * MiB), dump_dir=dump_dir)
    assert "fits at batch 1024" in capsys.readouterr().out  # each failed probe's tensors released, as on a GPU
    assert result.exit_code == 1 and result.oom is not None
    assert len(result.ooms_seen) == 6  # 5 probes (32768 .. 2048), then the real one

    metas = {path: load(path)[METADATA_KEY] for path in sorted(dump_dir.glob("*.pickle"))}
    assert len(metas) == 3  # the first probe, the latest probe, the fatal OOM: 3 files for 6 OOMs
    by_time = sorted(metas.items(), key=lambda item: item[1]["oom"]["time_us"])
    (first_path, first), (_, latest), (fatal_path, fatal) = by_time
    assert first["oom"]["occurrence"] == 1 and latest["oom"]["occurrence"] == 5
    assert first["oom"]["site"] == latest["oom"]["site"] and first["oom"]["site"].endswith(" in train")
    for probe in (first, latest):
        assert probe["exception"]["caught"] is True and probe["exception"]["traceback"] is None
    assert fatal["exception"]["caught"] is False
    assert "outputs = [model(" in fatal["exception"]["traceback"]
    assert len(fatal["ooms_observed"]) == 6

    assert main(["report", str(first_path)]) == 0
    assert "the script caught this OOM and went on" in capsys.readouterr().out
    assert main(["report", str(fatal_path), "--format", "json"]) == 0
    unknowns = json.loads(capsys.readouterr().out)["unknowns"]
    assert not any("caught this OOM" in sentence for sentence in unknowns)
