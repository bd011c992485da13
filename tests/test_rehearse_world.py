"""`oomdoctor rehearse --world-size N [--rank R | --ranks all]`: one simulated rank of a distributed run.

The rank's script runs under torch's fake process group with torchrun's environment. A process
group is global to its process, so every rehearsal of a distributed script here is a fresh
`python -m oomdoctor` (with this checkout on PYTHONPATH); the rows, the maximum and the argument
checks are tested without torch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from oomdoctor.analysis.sweep import FAILED, FITS, OUT_OF_MEMORY, FailedRequest, Probe
from oomdoctor.analysis.world import world
from oomdoctor.cli import main
from oomdoctor.rehearse.distributed import torchrun_environment
from oomdoctor.views.world import render_world

ROOT = Path(__file__).resolve().parent.parent
MiB = 1024 * 1024

# A torchrun-style FSDP2 script: RANK and WORLD_SIZE from the environment, init_process_group() with
# no arguments. With TRACKER=1 it is the reference: plain python, the fake process group made by
# hand, and torch's FSDPMemTracker around the same model and the same two steps.
FSDP_SCRIPT = textwrap.dedent(
    """
    import os
    import torch, torch.nn as nn, torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if os.environ.get("TRACKER"):
        from torch.testing._internal.distributed.fake_pg import FakeStore
        dist.init_process_group("fake", rank=rank, world_size=world_size, store=FakeStore())
    else:
        dist.init_process_group()
    mesh = init_device_mesh("cpu", (world_size,))
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(512, 2048), nn.ReLU(), nn.Linear(2048, 512)) for _ in range(4)])
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), foreach=True)
    tracker = None
    if os.environ.get("TRACKER"):
        from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
        tracker = FSDPMemTracker(model, optimizer)
        tracker.__enter__()
    batch = torch.randn(16, 512)
    for step in range(2):
        model(batch).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        if tracker is not None and step == 0:
            tracker.reset_mod_stats()  # the tracker cannot see a second forward without it
    if tracker is not None:
        tracker.__exit__(None, None, None)
        print("TRACKER", tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"])
    dist.destroy_process_group()
    """
)

# The recorder with its three fixes for FSDP and DTensor turned off, then the CLI.
WITHOUT_FIXES = textwrap.dedent(
    """
    import sys
    import oomdoctor.rehearse.recorder as recorder
    recorder._patch_sharding_propagation = lambda r: (lambda: None)
    recorder._patch_storage_resize = lambda r: (lambda: None)
    recorder._is_wrapper_subclass = lambda kind: False
    from oomdoctor.cli import main
    sys.exit(main(sys.argv[1:]))
    """
)

DDP_SCRIPT = textwrap.dedent(
    """
    import sys
    import torch, torch.nn as nn, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    model = nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024))
    if "--no-ddp" not in sys.argv:
        model = DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), foreach=True)
    for step in range(3):
        loss = model(torch.randn(32, 1024)).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        print(f"rank {dist.get_rank()} of {dist.get_world_size()}: loss {loss.item():.4f}")
    """
)
DDP_PARAMETERS = 2 * (1024 * 1024 + 1024)

ENV_SCRIPT = textwrap.dedent(
    """
    import os, json
    import torch, torch.distributed as dist
    dist.init_process_group()
    names = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    seen = {name: os.environ[name] for name in names}
    seen.update(rank=dist.get_rank(), world_size=dist.get_world_size(), backend=dist.get_backend())
    total = torch.ones(4)
    dist.all_reduce(total)
    print("ENV " + json.dumps(seen))
    dist.destroy_process_group()
    """
)


def run_python(*argv: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    environment = dict(os.environ)
    environment.pop("OOMDOCTOR_DIR", None)
    environment.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    environment["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), environment.get("PYTHONPATH")) if p)
    environment.update(env or {})
    return subprocess.run(
        [sys.executable, *argv], cwd=cwd, env=environment, capture_output=True, text=True, timeout=600
    )


def rehearse(cwd: Path, *argv: str, wrapper: Path | None = None) -> tuple[int, str]:
    entry = [str(wrapper)] if wrapper is not None else ["-m", "oomdoctor"]
    done = run_python(*entry, "rehearse", *argv, cwd=cwd)
    return done.returncode, done.stdout + done.stderr


def plan_json(output: str) -> dict:
    return json.loads(output[output.index("{\n") : output.rindex("}") + 1])


@pytest.fixture
def scripts(tmp_path):
    pytest.importorskip("torch")
    for name, source in (("fsdp.py", FSDP_SCRIPT), ("ddp.py", DDP_SCRIPT), ("env.py", ENV_SCRIPT)):
        (tmp_path / name).write_text(source)
    (tmp_path / "without_fixes.py").write_text(WITHOUT_FIXES)
    return tmp_path


# -- FSDP2 at world size 8, against torch's FSDPMemTracker -----------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("fake", [True, False], ids=["fake", "real"])
def test_fsdp2_rank_0_of_8_matches_fsdp_mem_tracker_and_the_recorder_fixes_matter(scripts, fake):
    done = run_python("fsdp.py", cwd=scripts, env={"TRACKER": "1", "RANK": "0", "WORLD_SIZE": "8"})
    assert done.returncode == 0, done.stderr[-3000:]
    tracker = int(done.stdout.split("TRACKER")[1].split()[0])
    options = ["--world-size", "8", *(["--fake"] if fake else []), "fsdp.py", "--device-memory", "8GiB"]
    options += ["--format", "json", "--out", "dumps"]
    code, output = rehearse(scripts, *options)
    assert code == 0, output[-3000:]
    plan = plan_json(output)
    assert plan["world_size"] == 8 and plan["rank"] == 0 and plan["fits"]
    requested = plan["peak_requested_bytes"]
    assert abs(requested - tracker) <= 0.001 * tracker, (requested, tracker)  # measured: 64 bytes apart
    code, output = rehearse(scripts, *options, wrapper=scripts / "without_fixes.py")
    assert code == 0, output[-3000:]
    unfixed = plan_json(output)["peak_requested_bytes"]
    assert unfixed > 1.5 * requested, (unfixed, requested)  # unsharded parameters never released, and more


# -- DDP, torchrun's environment, every rank --------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("fake", [True, False], ids=["fake", "real"])
def test_a_ddp_script_at_world_size_2_runs_and_its_buckets_are_counted(scripts, fake):
    peaks = {}
    for variant in ("ddp", "--no-ddp"):
        argv = ["--world-size", "2", "--rank", "1", *(["--fake"] if fake else []), "ddp.py"]
        argv += ["--device-memory", "1GiB", "--format", "json", "--out", "dumps", "--", variant]
        code, output = rehearse(scripts, *argv)
        assert code == 0, output[-3000:]
        assert "rank 1 of 2: loss" in output
        peaks[variant] = plan_json(output)["peak_requested_bytes"]
    assert peaks["ddp"] - peaks["--no-ddp"] == 4 * DDP_PARAMETERS  # the buckets: one copy of the gradients


@pytest.mark.slow
def test_an_unmodified_torchrun_script_sees_torchruns_environment_and_a_process_group(scripts):
    code, output = rehearse(scripts, "--world-size", "16", "--rank", "11", "env.py", "--device-memory", "1GiB")
    assert code == 0, output[-3000:]
    seen = json.loads(output.split("ENV ")[1].splitlines()[0])
    assert seen == {
        "RANK": "11",
        "LOCAL_RANK": "3",
        "WORLD_SIZE": "16",
        "LOCAL_WORLD_SIZE": "8",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500",
        "rank": 11,
        "world_size": 16,
        "backend": "fake",
    }
    assert "(rank 11 of 16, rehearsal, experimental)" in output


@pytest.mark.slow
def test_every_rank_in_its_own_process_a_row_each_and_the_maximum(scripts):
    code, output = rehearse(
        scripts, "--fake", "--world-size", "4", "--ranks", "all", "fsdp.py", "--device-memory", "1GiB", "--out", "dumps"
    )
    assert code == 0, output[-3000:]
    lines = output.splitlines()
    assert lines[0].startswith("Fits on every rank: fsdp.py at world size 4, a simulated 1024.00 MiB GPU a rank")
    rows = [line.split() for line in lines if line.startswith("  ") and line.split()[0].isdigit()]
    assert [(row[0], row[1]) for row in rows] == [(str(rank), "fits") for rank in range(4)]
    assert any(line.startswith("  max: ") and "to spare" in line for line in lines)
    code, output = rehearse(
        scripts, "--fake", "--world-size", "4", "--ranks", "0,3", "fsdp.py", "--device-memory", "40MiB",
        "--format", "json", "--out", "dumps",
    )  # fmt: skip
    assert code == 1
    answer = json.loads(output[output.index("{") : output.rindex("}") + 1])
    assert [rank["rank"] for rank in answer["ranks"]] == [0, 3]
    assert all(rank["outcome"] == "out_of_memory" and rank["request"]["site"] for rank in answer["ranks"])
    for rank in answer["ranks"]:
        assert [Path(dump).name.startswith(f"oom-rank{rank['rank']}-") for dump in rank["dumps"]] == [True]
        assert (scripts / rank["dumps"][0]).is_file()
    assert answer["headline"].startswith("Out of memory on 2 of the 2 ranks rehearsed (0, 3)")


# -- without torch: the rows, the maximum, the arguments ---------------------------------------------


def test_torchruns_environment_has_up_to_8_ranks_a_node():
    assert torchrun_environment(2, 1) == {
        "RANK": "1",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "2",
        "LOCAL_WORLD_SIZE": "2",
        "GROUP_RANK": "0",
        "ROLE_RANK": "1",
        "ROLE_WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500",
    }
    assert {key: torchrun_environment(32, 17)[key] for key in ("LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK")} == {
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "8",
        "GROUP_RANK": "2",
    }


def ranks_result():
    request = FailedRequest(192 * MiB, "aten._foreach_sqrt.default", "optimizer_step", "train.py:40 in main", "CUDA")
    return world(
        8,
        [
            Probe(7, OUT_OF_MEMORY, 70 * MiB, 80 * MiB, request=request, dumps=("oom-rank7.pickle",)),
            Probe(0, FITS, 60 * MiB, 64 * MiB, peak_requested_bytes=60 * MiB - 8),
            Probe(3, FAILED, 1 * MiB, 2 * MiB, reason="ValueError: no"),
        ],
    )


def test_the_ranks_in_order_the_maximum_and_what_went_wrong():
    result = ranks_result()
    assert [rank.value for rank in result.ranks] == [0, 3, 7]
    assert result.most_reserved.value == 7 and result.most_allocated.value == 7
    assert not result.all_fit and not result.every_rank
    assert [rank.value for rank in result.out_of_memory] == [7] and [rank.value for rank in result.failed] == [3]
    with pytest.raises(ValueError):
        world(2, [Probe(2, FITS, 0, 0)])


def test_the_ranks_as_text_markdown_and_json():
    result = ranks_result()
    options = {"device_memory_bytes": 80 * MiB, "usable_bytes": 80 * MiB, "script": "train.py", "fake": True}
    text = render_world(result, "text", **options, dumps=["oom-dumps/oom-rank7.pickle"])
    lines = text.splitlines()
    assert lines[0] == (
        "Out of memory on 1 of the 3 ranks rehearsed (7): train.py at world size 8, a simulated 80.00 MiB GPU a rank"
        " — rehearsal without data, experimental"
    )
    assert lines[1].split() == ["rank", "result", "peak", "allocated", "peak", "reserved"]
    assert lines[2].split()[:2] == ["0", "fits"] and lines[3].endswith("ValueError: no")
    assert "the request of 192.00 MiB (aten._foreach_sqrt.default) in optimizer step at train.py:40" in lines[4]
    assert lines[5] == "  max: 70.00 MiB allocated (rank 7), 80.00 MiB reserved by PyTorch (rank 7)"
    assert lines[6].startswith("  dump: oom-dumps/oom-rank7.pickle")
    markdown = render_world(result, "md", **options)
    assert "| 7 | runs out | 70.00 MiB | 80.00 MiB |" in markdown
    answer = json.loads(render_world(result, "json", **options))
    assert answer["max_reserved_rank"] == 7 and answer["max_reserved_bytes"] == 80 * MiB
    assert answer["ranks"][0]["peak_requested_bytes"] == 60 * MiB - 8 and not answer["all_fit"]
    fitting = world(2, [Probe(1, FITS, 10 * MiB, 12 * MiB), Probe(0, FITS, 10 * MiB, 12 * MiB)])
    text = render_world(fitting, "text", **options)
    assert text.startswith("Fits on every rank: train.py at world size 2")
    assert "max: 10.00 MiB allocated (rank 0), 12.00 MiB reserved by PyTorch (rank 0); 68.00 MiB to spare" in text


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--rank", "1"], "--rank and --ranks go with --world-size N"),
        (["--world-size", "0"], "--world-size must be 1 or more"),
        (["--world-size", "two"], "--world-size must be a whole number"),
        (["--world-size", "4", "--rank", "4"], "--rank 4 is not in a world of 4 (ranks 0 to 3)"),
        (["--world-size", "4", "--ranks", "1,9"], "--ranks: rank 9 is not in a world of 4"),
        (["--world-size", "4", "--rank", "1", "--ranks", "all"], "give --rank R or --ranks, not both"),
        (["--world-size", "4", "--ranks", "all", "--sweep", "batch"], "--sweep plans one rank"),
    ],
)
def test_bad_world_input_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys, argv, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "script.py").write_text("pass\n")
    code = main(["rehearse", "script.py", "--device-memory", "1GiB", *argv])
    captured = capsys.readouterr()
    assert code == 2 and message in captured.err and len(captured.err.strip().splitlines()) == 1
    assert not captured.out
