"""Notebooks (issue 14): IPython never calls sys.excepthook, so capture registers IPython's custom
exception handler for OOM errors. Driven through IPython's own API (an InteractiveShell in this
process) with the rehearsal simulator as the GPU; skipped without IPython.
"""

from __future__ import annotations

import pickle
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("IPython")

import oomdoctor  # noqa: E402
from oomdoctor.metadata import METADATA_KEY  # noqa: E402
from oomdoctor.rehearse.session import RehearsalConfig, RehearsalSession, rehearse_script  # noqa: E402

MiB = 1 << 20

STEP_CELL = textwrap.dedent(
    """
    import torch

    def step(n):
        hidden = torch.ones(n, 1024)
        more = torch.ones(n, 1024)
        return torch.ones(n * 4, 1024)
    """
)


@pytest.fixture
def shell(tmp_path, monkeypatch):
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    for name in ("OOMDOCTOR_DIR", "OOMDOCTOR_MAX_DUMPS", "OOMDOCTOR_DISABLE", "PYTORCH_CUDA_ALLOC_CONF"):
        monkeypatch.delenv(name, raising=False)
    config = Config()
    config.HistoryManager.enabled = False
    instance = InteractiveShell.instance(config=config)
    yield instance
    oomdoctor.uninstall()
    instance.set_custom_exc((), None)
    instance.reset()


@pytest.fixture
def rehearsal():
    session = RehearsalSession(RehearsalConfig(device_memory_bytes=64 * MiB)).start()
    yield session
    session.stop()


def dumps() -> list[Path]:
    return sorted(Path("oom-dumps").glob("*.pickle"))


def test_load_ext_gives_the_dump_its_traceback_and_says_what_holds_memory(shell, rehearsal, capsys):
    assert shell.run_cell("%load_ext oomdoctor").success
    assert shell.run_cell(STEP_CELL).success
    result = shell.run_cell("out = step(4096)")
    assert isinstance(result.error_in_exec, torch.OutOfMemoryError)
    err = capsys.readouterr().err
    (path,) = dumps()
    with open(path, "rb") as file:
        exception = pickle.load(file)[METADATA_KEY]["exception"]
    assert exception["caught"] is False and "in step" in exception["traceback"]
    assert "return torch.ones(n * 4, 1024)" in exception["traceback"]
    # the two 16 MiB tensors of the failed step stay alive in the traceback's frame
    assert "32.0 MiB of device memory is still held by the frames of this traceback" in err
    assert "hidden in step() 16.0 MiB" in err and "oomdoctor.release()" in err
    assert torch.cuda.memory_allocated() == 32 * MiB

    assert shell.run_cell("%oomdoctor release").success
    assert "released 32.0 MiB (allocated now 0 bytes)" in capsys.readouterr().err
    assert torch.cuda.memory_allocated() == 0


def test_install_under_ipython_registers_the_handler_and_uninstall_removes_it(shell, rehearsal):
    oomdoctor.install()
    assert torch.OutOfMemoryError in shell.custom_exceptions
    oomdoctor.uninstall()
    assert shell.custom_exceptions == ()


def test_another_custom_handler_is_left_alone(shell, rehearsal, capsys):
    seen = []
    shell.set_custom_exc((KeyError,), lambda shell, etype, value, tb, tb_offset=None: seen.append(value))
    oomdoctor.install()
    assert shell.custom_exceptions == (KeyError,)
    shell.run_cell(STEP_CELL)
    shell.run_cell("out = step(4096)")
    (path,) = dumps()
    with open(path, "rb") as file:
        exception = pickle.load(file)[METADATA_KEY]["exception"]
    assert "in step" in exception["traceback"]  # read after the cell ran (post_run_cell)
    assert "still held by the frames" in capsys.readouterr().err
    shell.run_cell("raise KeyError('x')")
    assert len(seen) == 1


NOTEBOOK_SCRIPT = textwrap.dedent(
    """
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    cells = [
        "%load_ext oomdoctor",
        '''
    import torch
    model = torch.nn.Linear(1024, 1024)
    ''',
        "logits = model(torch.randn(65536, 1024))",
        "print('after the failing cell')",
    ]
    for cell in cells:
        shell.run_cell(cell)
    """
)


def test_rehearse_reports_an_oom_raised_in_a_cell(shell, tmp_path, capsys):
    from oomdoctor.commands.rehearse import format_result

    script = tmp_path / "notebook.py"
    script.write_text(NOTEBOOK_SCRIPT)
    config = RehearsalConfig(device_memory_bytes=64 * MiB)
    result = rehearse_script(script, [], config, dump_dir=tmp_path / "oom-dumps")
    assert "after the failing cell" in capsys.readouterr().out
    assert result.exit_code == 1 and result.oom is not None and result.oom_in_cell
    text = format_result(script, config, result)
    assert text.startswith("Out of memory: notebook.py ran out of memory in a notebook cell")
    (path,) = result.dump_paths
    with open(path, "rb") as file:
        assert "logits = model(" in pickle.load(file)[METADATA_KEY]["exception"]["traceback"]
