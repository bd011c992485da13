"""`oomdoctor rehearse --fake`: the script's tensors carry no data, the allocations are the same."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from oomdoctor.cli import main  # noqa: E402
from oomdoctor.rehearse.session import FAKE_FAILURE_EXIT, RehearsalConfig, RehearsalSession  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from fake_streams import peaks, streams  # noqa: E402

MiB = 1024 * 1024


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("OOMDOCTOR_DIR", raising=False)
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    return tmp_path


def rehearse_fake(capsys, workdir, source: str, *options: str) -> tuple[int, str, str]:
    (workdir / "script.py").write_text(textwrap.dedent(source))
    code = main(["rehearse", "--fake", "script.py", "--device-memory", "1GiB", "--out", "dumps", *options])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def fake_session():
    with RehearsalSession(RehearsalConfig(device_memory_bytes=256 * MiB, fake=True)) as session:
        yield session


def allocated(session) -> int:
    return session.backend.memory_stats(0)["allocated_bytes.all.current"]


def test_fake_tensors_are_allocated_with_their_real_sizes_and_hold_no_host_memory(fake_session):
    from torch._subclasses.fake_tensor import FakeTensor

    big = torch.empty(64, MiB // 4)  # 64 MiB on the simulated device, none on the host
    assert isinstance(big, FakeTensor)
    assert allocated(fake_session) == 64 * MiB
    del big
    assert allocated(fake_session) == 0


def test_scalars_are_placeholders_and_each_site_is_counted(fake_session):
    loss = torch.randn(8).square().mean()
    assert loss.item() == 0.0
    assert bool(loss > 1) is False
    for _ in range(3):
        assert int(torch.randint(10, ()).item()) == 0
    notes = fake_session.fake.notes
    assert sum(notes.placeholders.values()) == 5
    counts = sorted(notes.placeholders.values())
    assert counts == [1, 1, 3]


def test_ops_on_real_inputs_run_for_real(fake_session):
    from torch._subclasses.fake_tensor import FakeTensor

    counter = torch.tensor(2.0)  # torch.tensor(data) stays real
    assert not isinstance(counter, FakeTensor)
    counter += 1
    assert counter.item() == 3.0
    assert 1 - 0.9 ** counter.item() == pytest.approx(0.271)
    assert not fake_session.fake.notes.placeholders


def test_data_dependent_sizes_are_taken_at_their_upper_bound(fake_session):
    values = torch.randn(1000)
    assert values.nonzero().shape == (1000, 1)
    assert values[values > 0].shape == (1000,)
    assert torch.masked_select(values, values > 0).shape == (1000,)
    assert sum(fake_session.fake.notes.dynamic_sizes.values()) == 3


def test_module_to_and_float_work_under_fake_tensors(fake_session):
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.LayerNorm(64))
    model.to("cpu").float().to(torch.bfloat16)
    assert model[0].weight.dtype is torch.bfloat16


def test_optimizers_take_the_foreach_path_with_fake_parameters(fake_session):
    from torch.optim.optimizer import _default_to_fused_or_foreach

    model = torch.nn.Linear(16, 16)
    _, foreach = _default_to_fused_or_foreach(list(model.parameters()), differentiable=False, use_fused=False)
    assert foreach
    model(torch.randn(4, 16)).sum().backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer = torch.optim.AdamW(model.parameters())
    optimizer.step()
    assert not isinstance(optimizer.state[model.weight]["step"], type(model.weight))


def test_torch_save_of_fake_state_is_skipped_with_a_line(fake_session, tmp_path, capsys):
    model = torch.nn.Linear(4, 4)
    target = tmp_path / "checkpoint.pt"
    torch.save(model.state_dict(), target)
    assert not target.exists()
    assert "torch.save skipped" in capsys.readouterr().err
    assert sum(fake_session.fake.notes.saves_skipped.values()) == 1


def test_a_script_that_fits_reports_its_placeholders(capsys, workdir):
    code, out, err = rehearse_fake(
        capsys,
        workdir,
        """
        import torch
        model = torch.nn.Linear(256, 256)
        optimizer = torch.optim.AdamW(model.parameters())
        for step in range(2):
            loss = model(torch.randn(32, 256)).square().mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            print(f"loss {loss.item():.3f}")
        """,
    )
    assert code == 0, out + err
    assert "Fits:" in out
    assert "placeholder 0.0 read at script.py:10 (2x)" in out
    assert "the model did not train" in out


UNSUPPORTED = {
    "unique": ("values = torch.randn(100)\ntorch.unique(values)\n", "aten._unique2.default", "script.py:3"),
    "custom op": (
        """
        @torch.library.custom_op("oomdoctor_test::double", mutates_args=())
        def double(x: torch.Tensor) -> torch.Tensor:
            return x * 2
        double(torch.randn(4))
        """,
        "without a fake implementation; register one with torch.library.register_fake",
        "script.py:6",
    ),
    "numpy": ("torch.randn(4).numpy()\n", "reads the memory of a fake tensor", "script.py:2"),
    "fake cuda": ("torch.randn(4, device='cuda')\n", "Make the device a parameter", "script.py:2"),
}


@pytest.mark.parametrize("case", sorted(UNSUPPORTED))
def test_what_cannot_run_without_data_is_one_line_naming_the_users_line(capsys, workdir, case):
    body, expected, site = UNSUPPORTED[case]
    code, out, err = rehearse_fake(capsys, workdir, "import torch\n" + textwrap.dedent(body))
    assert code == FAKE_FAILURE_EXIT == 3
    assert "Traceback" not in err
    line = next(line for line in out.splitlines() if line.startswith("Cannot rehearse without data"))
    assert expected in line and site in line, line


def test_a_dataloader_with_workers_delivers_real_batches(capsys, workdir):
    code, out, err = rehearse_fake(
        capsys,
        workdir,
        """
        import torch
        from torch.utils.data import DataLoader, Dataset
        from torch._subclasses.fake_tensor import FakeTensor

        class Numbers(Dataset):
            def __len__(self):
                return 8
            def __getitem__(self, index):
                return torch.full((4,), float(index))

        model = torch.nn.Linear(4, 4)
        for batch in DataLoader(Numbers(), batch_size=4, num_workers=2):
            assert not isinstance(batch, FakeTensor)
            print("batch", batch[:, 0].tolist())
            model(batch).sum().backward()
        """,
    )
    assert code == 0, out + err
    assert "batch [0.0, 1.0, 2.0, 3.0]" in out and "batch [4.0, 5.0, 6.0, 7.0]" in out


def run_cli(*argv: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("OOMDOCTOR_DIR", None)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    return subprocess.run(
        [sys.executable, "-m", "oomdoctor", *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )


def fixture_scenarios() -> list[dict]:
    """One manifest entry per scenario script, plus the GPT for train.py (the MLP is its first)."""
    manifest = json.loads((ROOT / "fixtures" / "manifest.json").read_text())
    chosen: dict[str, dict] = {}
    for entry in manifest["fixtures"]:
        key = entry["scenario"]
        if key == "train.py" and "gpt" in entry["args"]:
            key = "train.py gpt"
        chosen.setdefault(key, entry)
    return list(chosen.values())


@pytest.mark.slow
@pytest.mark.parametrize("entry", fixture_scenarios(), ids=lambda entry: entry["name"])
def test_fake_and_real_give_the_same_allocation_stream_on_the_fixture_scenarios(tmp_path, entry):
    dumps = {}
    for mode in ("real", "fake"):
        argv = ["rehearse", *(["--fake"] if mode == "fake" else [])]
        argv += [str(ROOT / "fixtures" / "scenarios" / entry["scenario"])]
        argv += ["--device-memory", str(entry["device_memory_bytes"]), "--out", mode]
        argv += ["--outside-memory", str(entry["outside_bytes"]), "--alloc-conf", entry["alloc_conf"] or ""]
        done = run_cli(*argv, "--", *entry["args"], cwd=tmp_path)
        assert done.returncode in (0, 1), done.stdout[-2000:] + done.stderr[-2000:]
        files = sorted((tmp_path / mode).glob("*.pickle"))
        assert files, done.stdout[-2000:]
        dumps[mode] = files[-1]
    real, fake = streams(str(dumps["real"])), streams(str(dumps["fake"]))
    assert [event for event in real if event[0] == "alloc"], "no allocation recorded"
    assert real == fake  # ops' sizes, addresses and the order of allocations and frees
    assert peaks(real) == peaks(fake)


PLAN_SCRIPT = """
import torch
model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 512))
optimizer = torch.optim.Adam(model.parameters(), foreach=True)
for step in range(2):
    model(torch.randn(64, 512)).square().mean().backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
"""


def test_the_memory_plan_by_phase_component_and_step(capsys, workdir):
    (workdir / "script.py").write_text(PLAN_SCRIPT)
    assert main(["rehearse", "--fake", "script.py", "--device-memory", "256MiB", "--format", "json"]) == 0
    out = capsys.readouterr().out
    plan = json.loads(out[out.index("{") :])
    parameters = (512 * 2048 + 2048 + 2048 * 512 + 512) * 4
    assert plan["fits"] and plan["fake"]
    assert plan["peak_components"]["parameters"] == pytest.approx(parameters, rel=0.01)
    assert plan["peak_components"]["optimizer_state"] == pytest.approx(2 * parameters, rel=0.01)
    assert plan["dominant"] == "optimizer_state"
    assert plan["headroom_bytes"] == 256 * MiB - plan["peak_reserved_bytes"]
    assert {"forward", "backward", "optimizer_step"} <= {phase["phase"] for phase in plan["phases"]}
    assert plan["step_two_jump_bytes"] == pytest.approx(2 * parameters, rel=0.05)  # the Adam moments
    assert plan["fake_notes"]["placeholders"] == []
    for output_format, marker in (("text", "Memory plan:"), ("md", "| phase | step |")):
        assert main(["rehearse", "--fake", "script.py", "--device-memory", "256MiB", "--format", output_format]) == 0
        assert marker in capsys.readouterr().out
