"""`oomdoctor run` and the opt-in start-up hook (issue 14): capture without editing the script.

`run` is driven through the CLI; where an OOM must happen, the process first starts a rehearsal
session (the simulated GPU), as `oomdoctor rehearse` does, then hands over to `oomdoctor run`. The
start-up hook is the repository's `oomdoctor-startup.pth`, processed by `site.addsitedir` in a fresh
interpreter exactly as Python processes it in site-packages at start-up.
"""

from __future__ import annotations

import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from oomdoctor.capture import startup
from oomdoctor.cli import main

REPO = Path(__file__).resolve().parent.parent
PTH = REPO / "oomdoctor-startup.pth"
MiB = 1 << 20

OOM_SCRIPT = textwrap.dedent(
    """
    import sys
    import torch

    print("training with", sys.argv[1:], flush=True)

    def step():
        kept = []
        for _ in range(100):
            kept.append(torch.ones(1024, 1024))  # 4 MiB each on a 64 MiB device

    step()
    """
)


def rehearsed_run(tmp_path: Path, *run_args: str) -> subprocess.CompletedProcess:
    """`oomdoctor run RUN_ARGS` in a fresh process whose GPU is a simulated 64 MiB one."""
    runner = textwrap.dedent(
        """
        import sys
        from oomdoctor.rehearse.session import RehearsalConfig, RehearsalSession
        RehearsalSession(RehearsalConfig(device_memory_bytes=64 << 20)).start()
        from oomdoctor.cli import main
        sys.exit(main(["run", *sys.argv[1:]]))
        """
    )
    return subprocess.run(
        [sys.executable, "-c", runner, *run_args], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )


def dumps(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.pickle")) if folder.is_dir() else []


# -- run ----------------------------------------------------------------------------------------


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    """In-process runs change sys.argv, sys.path[0] and the environment: put them back."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delenv(startup.VARIABLE, raising=False)
    monkeypatch.setenv("OOMDOCTOR_DISABLE", "1")  # capture itself is tested below, in subprocesses
    return tmp_path


def test_run_passes_argv_stdout_and_exit_status_through(isolated, capsys):
    script = isolated / "argv.py"
    script.write_text("import sys\nprint('args', sys.argv, __name__)\nsys.exit(int(sys.argv[1]))\n")
    assert main(["run", str(script), "3", "--lr", "1e-4"]) == 3
    out = capsys.readouterr().out
    assert f"args [{str(script)!r}, '3', '--lr', '1e-4'] __main__" in out
    assert sys.path[0] == str(isolated)


def test_run_m_runs_a_module_as_python_does(isolated, capsys):
    package = isolated / "trainpkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "__main__.py").write_text("import sys\nprint('module', __name__, sys.argv[1:])\n")
    assert main(["run", "-m", "trainpkg", "--help", "x"]) == 0  # --help is the module's
    assert "module __main__ ['--help', 'x']" in capsys.readouterr().out


def test_run_an_uncaught_exception_exits_1_with_the_scripts_traceback(isolated, capsys):
    script = isolated / "boom.py"
    script.write_text("def f():\n    raise ValueError('boom')\n\nf()\n")
    assert main(["run", str(script)]) == 1
    err = capsys.readouterr().err
    assert 'boom.py", line 4, in <module>' in err and "ValueError: boom" in err
    assert "runpy" not in err and "commands/run.py" not in err


def test_run_bad_input_is_one_line(isolated, capsys):
    assert main(["run"]) == 2
    assert main(["run", "missing.py"]) == 2
    assert main(["run", "-m", "no_such_module_here"]) == 2
    assert capsys.readouterr().err.count("oomdoctor: ") == 3


@pytest.mark.slow
def test_run_of_a_script_leaves_one_dump_at_the_oom(tmp_path):
    pytest.importorskip("torch")
    (tmp_path / "train.py").write_text(OOM_SCRIPT)
    result = rehearsed_run(tmp_path, "--dir", "dumps", "train.py", "--epochs", "2")
    assert result.returncode == 1, result.stderr[-2000:]
    assert "training with ['--epochs', '2']" in result.stdout
    (path,) = dumps(tmp_path / "dumps")
    with open(path, "rb") as file:
        exception = pickle.load(file)["oomdoctor"]["exception"]
    assert "kept.append(torch.ones(1024, 1024))" in exception["traceback"]
    assert 'train.py", line 12, in <module>' in result.stderr


@pytest.mark.slow
def test_run_m_of_a_module_leaves_one_dump_at_the_oom(tmp_path):
    pytest.importorskip("torch")
    (tmp_path / "trainmod.py").write_text(OOM_SCRIPT)
    result = rehearsed_run(tmp_path, "-m", "trainmod", "--lr", "3")
    assert result.returncode == 1, result.stderr[-2000:]
    assert "training with ['--lr', '3']" in result.stdout
    assert len(dumps(tmp_path / "oom-dumps")) == 1


# -- the start-up hook --------------------------------------------------------------------------


def test_the_pth_file_holds_the_hooks_line():
    assert PTH.read_text().strip() == startup.PTH_LINE
    pyproject = (REPO / "pyproject.toml").read_text()
    assert '"oomdoctor-startup.pth" = "oomdoctor-startup.pth"' in pyproject
    assert 'oomdoctor = "oomdoctor.capture.startup:vllm_plugin"' in pyproject


def python_with_hook(tmp_path: Path, code: str, **environ: str) -> subprocess.CompletedProcess:
    site_dir = tmp_path / "site"
    site_dir.mkdir(exist_ok=True)
    (site_dir / PTH.name).write_text(PTH.read_text())
    program = f"import site; site.addsitedir({str(site_dir)!r})\n" + textwrap.dedent(code)
    env = {key: value for key, value in __import__("os").environ.items() if not key.startswith("OOMDOCTOR")}
    env.update(environ)
    return subprocess.run(
        [sys.executable, "-c", program], cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env
    )


def test_the_hook_is_inert_without_the_variable(tmp_path):
    result = python_with_hook(
        tmp_path,
        """
        import sys
        print("imported:", "oomdoctor" in sys.modules)
        """,
    )
    assert result.returncode == 0, result.stderr
    assert "imported: False" in result.stdout and result.stderr == ""
    for value in ("", "0"):
        assert (
            "imported: False"
            in python_with_hook(
                tmp_path, "import sys; print('imported:', 'oomdoctor' in sys.modules)", OOMDOCTOR_INSTALL=value
            ).stdout
        )


@pytest.mark.slow
def test_the_hook_installs_capture_once_torch_is_imported(tmp_path):
    pytest.importorskip("torch")
    result = python_with_hook(
        tmp_path,
        """
        import sys
        print("torch before:", "torch" in sys.modules)
        import torch
        """,
        OOMDOCTOR_INSTALL="1",
    )
    assert result.returncode == 0, result.stderr
    assert "torch before: False" in result.stdout
    # install() ran right after `import torch`: on this CPU-only machine it says why it cannot record
    assert "oomdoctor: not recording CUDA memory: torch reports no CUDA device" in result.stderr


@pytest.mark.slow
def test_the_hook_in_a_process_that_already_imported_torch_leaves_a_dump(tmp_path):
    pytest.importorskip("torch")
    program = f"""
    import os
    from oomdoctor.rehearse.session import RehearsalConfig, RehearsalSession
    RehearsalSession(RehearsalConfig(device_memory_bytes=64 << 20)).start()
    import site
    # set only now: an installed copy of the hook (a fresh install puts one in site-packages) ran at
    # start-up without it, as it does in any process that does not ask for capture
    os.environ["OOMDOCTOR_INSTALL"] = "1"
    site.addsitedir({str(tmp_path / "site")!r})  # what site-packages' .pth files do, a little late
    from oomdoctor import capture
    print("installed:", capture.is_installed())
    exec(compile({OOM_SCRIPT!r}, "train.py", "exec"))
    """
    site_dir = tmp_path / "site"
    site_dir.mkdir()
    (site_dir / PTH.name).write_text(PTH.read_text())
    env = {key: value for key, value in __import__("os").environ.items() if not key.startswith("OOMDOCTOR")}
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(program), "x"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert result.returncode == 1 and "installed: True" in result.stdout, result.stderr[-2000:]
    (path,) = dumps(tmp_path / "oom-dumps")
    with open(path, "rb") as file:
        assert 'train.py", line 10, in step' in pickle.load(file)["oomdoctor"]["exception"]["traceback"]
