"""`oomdoctor rehearse`: a script on CPU against the simulated allocator, end to end."""

from __future__ import annotations

import argparse
import os
import pickle
import subprocess
import sys
import textwrap

import pytest

from oomdoctor.cli import main
from oomdoctor.commands.rehearse import parse_size_bytes, split_command
from oomdoctor.errors import OomdoctorError
from oomdoctor.metadata import METADATA_KEY

torch = pytest.importorskip("torch")

TRAIN_SCRIPT = textwrap.dedent(
    """
    import argparse, os, torch

    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batch", type=int, default=4)
    args = parser.parse_args()
    print("rehearsal", os.environ.get("OOMDOCTOR_REHEARSAL"), "device", args.device, "batch", args.batch)


    def train():
        model = torch.nn.Linear(2048, 2048, bias=False).to(args.device)  # 16 MiB
        optimizer = torch.optim.Adam(model.parameters())
        for step in range(2):
            batch = torch.randn(args.batch, 2048, device=args.device)
            model(batch).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad()


    if __name__ == "__main__":
        train()
    """
)


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("OOMDOCTOR_DIR", raising=False)
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    (tmp_path / "train.py").write_text(TRAIN_SCRIPT)
    return tmp_path


def rehearse(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["rehearse", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_a_script_that_fits_exits_0_and_says_so(workdir, capsys):
    code, out, _ = rehearse(capsys, "train.py", "--device-memory", "128MiB", "--", "--batch", "8")
    assert code == 0
    assert "rehearsal 1 device cpu batch 8" in out
    assert "Fits: train.py ran to completion on a simulated 128.00 MiB GPU" in out
    # no OOM dump; the end-of-run dump the memory plan is read from
    assert [path.name.split("-")[0] for path in (workdir / "oom-dumps").iterdir()] == ["rehearsal"]
    assert os.environ.get("OOMDOCTOR_REHEARSAL") is None


def test_a_script_that_runs_out_says_where_and_leaves_a_dump(workdir, capsys):
    # weight + grad + exp_avg = 48 MiB: exp_avg_sq's 16 MiB do not fit in 56 MiB
    code, out, err = rehearse(capsys, "train.py", "--device-memory", "56MiB", "--out", "dumps")
    assert code == 1
    # the traceback a GPU run would print: from the script to torch's frame, no rehearsal machinery
    traceback_lines = err[err.index("Traceback (most recent call last):") :].splitlines()
    assert traceback_lines[1].strip() == 'File "train.py", line 22, in <module>'
    assert "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 16.00 MiB" in err
    # torch's own frames stay (torch._dynamo's wrappers too, once any code imported dynamo)
    assert "oomdoctor" + os.sep + "rehearse" not in err
    lines = out.splitlines()
    headline = next(line for line in lines if line.startswith("Out of memory:"))
    assert "simulated 56.00 MiB GPU" in headline
    where = next(line for line in lines if line.strip().startswith("where:"))
    assert "train.py:17 in train" in where and "phase: optimizer_step" in where
    assert any("torch: CUDA out of memory. Tried to allocate 16.00 MiB. GPU 0" in line for line in lines)
    dumps = sorted((workdir / "dumps").glob("*.pickle"))
    assert len(dumps) == 1
    assert f"dump: {os.path.join('dumps', dumps[0].name)}" in out
    with open(dumps[0], "rb") as file:
        snapshot = pickle.load(file)
    oom_entries = [entry for entry in snapshot["device_traces"][0] if entry["action"] == "oom"]
    assert len(oom_entries) == 1 and oom_entries[0]["size"] == 16 * 1024 * 1024
    assert snapshot[METADATA_KEY]["rehearsal"]["device_memory_bytes"] == 56 * 1024 * 1024
    names = {entry["name"] for entry in snapshot["external_annotations"]}
    assert "Optimizer.step#Adam.step" in names


def test_outside_memory_and_alloc_conf_reach_the_simulator(workdir, capsys):
    code, out, _ = rehearse(
        capsys, "train.py", "--device-memory", "128MiB", "--outside-memory", "100MiB",
        "--alloc-conf", "expandable_segments:True", "--out", "dumps",
    )  # fmt: skip
    assert code == 1
    assert "Process " in out and "has 100.00 MiB memory in use" in out
    with open(next((workdir / "dumps").glob("*.pickle")), "rb") as file:
        snapshot = pickle.load(file)
    assert snapshot["allocator_settings"]["expandable_segments"] is True


def test_the_scripts_exit_status_and_errors_come_through(workdir, capsys):
    (workdir / "exits.py").write_text("import sys\nsys.exit(3)\n")
    code, out, _ = rehearse(capsys, "exits.py", "--device-memory", "1GiB")
    assert code == 3 and "exit status 3" in out
    (workdir / "fails.py").write_text("raise ValueError('broken script')\n")
    code, out, err = rehearse(capsys, "fails.py", "--device-memory", "1GiB")
    assert code == 1
    assert "Failed: fails.py" in out
    assert "ValueError: broken script" in err
    (workdir / "hardcoded.py").write_text("import torch\ntorch.ones(3).cuda()\n")
    code, out, err = rehearse(capsys, "hardcoded.py", "--device-memory", "1GiB")
    assert code == 1 and "hint: the script asked for CUDA" in out


def test_an_oom_the_script_catches_is_reported_but_not_fatal(workdir, capsys):
    (workdir / "retries.py").write_text(
        textwrap.dedent(
            """
            import torch
            try:
                torch.empty(64 * 1024 * 1024)
            except torch.OutOfMemoryError:
                small = torch.empty(1024)
            """
        )
    )
    code, out, _ = rehearse(capsys, "retries.py", "--device-memory", "64MiB", "--out", "dumps")
    assert code == 0
    assert "the script caught 1 out-of-memory error, the first at retries.py:4" in out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["missing.py", "--device-memory", "1GiB"], "no such script"),
        (["train.py"], "--device-memory SIZE is required"),
        (["train.py", "--device-memory", "lots"], "not a size"),
        (["train.py", "--device-memory", "1GiB", "--alloc-conf", "no_such_key:1"], "bad --alloc-conf"),
        (["train.py", "--device-memory", "1GiB", "--outside-memory", "2GiB"], "leave no device memory"),
        ([], "needs a script"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(workdir, capsys, argv, message):
    code, out, err = rehearse(capsys, *argv)
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1
    assert "Traceback" not in err + out


def test_sizes():
    assert parse_size_bytes("24GiB") == 24 * 2**30
    assert parse_size_bytes("512MiB") == 512 * 2**20
    assert parse_size_bytes("1.5GB") == 1_500_000_000
    assert parse_size_bytes("2g") == 2 * 2**30
    assert parse_size_bytes("4096") == 4096
    with pytest.raises(OomdoctorError):
        parse_size_bytes("12 parsecs")


def test_options_after_the_script_belong_to_rehearse_until_the_separator():
    def split(*command: str):
        args = argparse.Namespace(command=list(command), device_memory=None, out=None)
        script, script_args = split_command(args)
        return str(script), script_args, args.device_memory, args.out

    assert split("t.py", "--device-memory", "1G", "--", "--out", "x") == ("t.py", ["--out", "x"], "1G", None)
    assert split("t.py", "--device-memory=1G", "--out", "d", "--lr", "3") == ("t.py", ["--lr", "3"], "1G", "d")
    assert split("--", "t.py", "a") == ("t.py", ["a"], None, None)


def test_the_verb_is_labelled_experimental_and_importing_the_cli_loads_no_torch():
    code = (
        "import sys; from oomdoctor.cli import build_parser; build_parser(); "
        "import oomdoctor.commands.rehearse as r; "
        "assert 'experimental' in r.__doc__.splitlines()[0]; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
