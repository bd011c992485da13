"""Child processes (issue 14): a `torch.multiprocessing.spawn` child keeps its traceback in the dump
though `_wrap` catches the exception; DataLoader workers (spawn, forkserver, fork) never keep
capture on and write nothing. Run as users would, under `oomdoctor rehearse` in a subprocess; a
spawned child rehearses on a simulated device of its own (it re-imports the script).
"""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from oomdoctor.metadata import METADATA_KEY  # noqa: E402

SPAWN_SCRIPT = 'import os\n\nif __name__ == "__mp_main__" and os.environ.get("OOMDOCTOR_REHEARSAL"):\n    # the spawned child re-imports this file: it rehearses on a simulated GPU of its own\n    from oomdoctor.rehearse.session import RehearsalConfig, RehearsalSession\n\n    RehearsalSession(RehearsalConfig(device_memory_bytes=64 << 20)).start()\n\nimport oomdoctor\n\noomdoctor.install()\n\nimport torch\nimport torch.multiprocessing as mp\n\n\ndef worker(rank):\n    kept = []\n    for _ in range(100):\n        kept.append(torch.ones(1024, 1024))  # 4 MiB each: the 17th does not fit\n\n\nif __name__ == "__main__":\n    try:\n        mp.spawn(worker, nprocs=1)\n    except mp.ProcessRaisedException as error:\n        print("child failed:", str(error).strip().splitlines()[-1][:60])\n'

LOADER_SCRIPT = 'import os\nimport sys\n\nif __name__ == "__mp_main__" and os.environ.get("OOMDOCTOR_REHEARSAL"):\n    from oomdoctor.rehearse.session import RehearsalConfig, RehearsalSession\n\n    RehearsalSession(RehearsalConfig(device_memory_bytes=64 << 20)).start()\n\nimport oomdoctor\n\noomdoctor.install()\n\nimport torch\nfrom torch.utils.data import DataLoader, Dataset\n\n\nclass Probe(Dataset):\n    def __len__(self):\n        return 4\n\n    def __getitem__(self, index):\n        from oomdoctor import capture\n\n        return torch.tensor([capture.is_installed(), os.getpid()])\n\n\nif __name__ == "__main__":\n    for epoch in range(2):\n        loader = DataLoader(Probe(), batch_size=1, num_workers=2, multiprocessing_context=sys.argv[1])\n        rows = torch.cat(list(loader))\n        print("installed in workers:", sorted(set(rows[:, 0].tolist())), "workers:", len(set(rows[:, 1].tolist())))\n    print("installed here:", oomdoctor.capture.is_installed() if hasattr(oomdoctor, "capture") else None)\n'


def rehearse(tmp_path: Path, name: str, text: str, *args: str) -> subprocess.CompletedProcess:
    script = tmp_path / name
    script.write_text(text)
    command = [sys.executable, "-m", "oomdoctor", "rehearse", str(script), "--device-memory", "64MiB", "--", *args]
    return subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)


def oom_dumps(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "oom-dumps").glob("oom-*.pickle"))


@pytest.mark.slow
def test_a_spawned_child_keeps_its_traceback(tmp_path):
    result = rehearse(tmp_path, "spawn_train.py", SPAWN_SCRIPT)
    assert "child failed: torch.OutOfMemoryError" in result.stdout, result.stderr[-3000:]
    (path,) = oom_dumps(tmp_path)
    with open(path, "rb") as file:
        exception = pickle.load(file)[METADATA_KEY]["exception"]
    assert exception["caught"] is False
    assert "in worker" in exception["traceback"] and "kept.append(torch.ones(1024, 1024))" in exception["traceback"]
    assert "oomdoctor: the dump of this OOM is" in result.stderr


@pytest.mark.slow
@pytest.mark.parametrize("context", ["spawn", "fork"])
def test_dataloader_workers_never_keep_capture_on(tmp_path, context):
    result = rehearse(tmp_path, "loader.py", LOADER_SCRIPT, context)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("installed in workers: [0] workers: 2") == 2
    assert "installed here: True" in result.stdout
    assert oom_dumps(tmp_path) == []
    assert "not recording CUDA memory" not in result.stderr  # no worker says it either


def test_wrappers_pickle_by_reference_like_the_originals():
    import torch.utils.data._utils.worker as worker_module

    spawn_module = sys.modules["torch.multiprocessing.spawn"]  # the attribute is the spawn() function

    from oomdoctor.capture import processes

    undo_spawn = processes.patch_spawn_wrap()
    undo_worker = processes.patch_worker_loop(lambda: None)
    try:
        for module, name in ((spawn_module, "_wrap"), (worker_module, "_worker_loop")):
            wrapper = getattr(module, name)
            assert wrapper.__oomdoctor_wrapper__ and wrapper.__module__ == module.__name__
            assert pickle.loads(pickle.dumps(wrapper)) is wrapper
        assert processes.patch_spawn_wrap() is None  # never wrapped twice
    finally:
        undo_spawn()
        undo_worker()
    assert not hasattr(spawn_module._wrap, "__oomdoctor_wrapper__")
    assert not processes.in_dataloader_worker() and not processes.in_child_process()
