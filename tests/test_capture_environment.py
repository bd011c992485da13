"""What a dump records about where it ran: torchrun's run id (and the folder the ranks of one launch
share), the environment block (versions, the variables that bear on memory, secret-looking names
filtered out), the frameworks imported; and how the reports show them."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import oomdoctor  # noqa: E402
from oomdoctor.capture import environment, writer  # noqa: E402
from oomdoctor.capture.backend import CudaBackend  # noqa: E402
from oomdoctor.load.folder import find_dump_files, rank_from_name  # noqa: E402
from oomdoctor.metadata import METADATA_KEY  # noqa: E402
from tests import test_capture  # noqa: E402
from tests.test_capture import MiB, dumps_in, load  # noqa: E402

# capture's fake backend, made active, with a clean environment (test_capture.py's fixture)
fake = test_capture.fake

ELASTIC = {
    "TORCHELASTIC_RUN_ID": "4f1c2d3e-aaaa-bbbb-cccc-0123456789ab",
    "TORCHELASTIC_RESTART_COUNT": "1",
    "TORCHELASTIC_MAX_RESTARTS": "3",
    "GROUP_RANK": "0",
    "LOCAL_WORLD_SIZE": "2",
    "ROLE_NAME": "default",
    "ROLE_RANK": "1",
    "WORLD_SIZE": "2",
}


def oom_as_rank(fake, monkeypatch, rank: int) -> None:
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("LOCAL_RANK", str(rank))
    oomdoctor.install()
    with pytest.raises(torch.OutOfMemoryError):
        fake.oom(10 * MiB)
    oomdoctor.uninstall()


def test_ranks_of_one_torchrun_launch_share_a_folder_named_by_its_run_id(fake, monkeypatch):
    for name, value in ELASTIC.items():
        monkeypatch.setenv(name, value)
    oom_as_rank(fake, monkeypatch, 1)
    oom_as_rank(fake, monkeypatch, 0)
    run_folder = Path("oom-dumps") / f"run-{ELASTIC['TORCHELASTIC_RUN_ID']}"
    assert dumps_in(Path("oom-dumps")) == []  # nothing directly in the dump folder
    files = dumps_in(run_folder)
    assert len(files) == 2
    # the names are the ones of runs without torchrun, so the folder reader orders the ranks by name
    listing = find_dump_files(run_folder)
    assert [rank_from_name(path) for path in listing.paths] == [0, 1] and listing.skipped == ()
    meta = load(Path(listing.paths[1]))[METADATA_KEY]
    assert meta["rank"] == 1 and meta["world_size"] == 2
    assert meta["elastic"] == {
        "run_id": ELASTIC["TORCHELASTIC_RUN_ID"],
        "restart_count": 1,
        "max_restarts": 3,
        "group_rank": 0,
        "group_world_size": None,
        "role_name": "default",
        "role_rank": 1,
        "role_world_size": None,
        "local_world_size": 2,
    }
    # the parent folder's listing says where they went
    (skipped,) = find_dump_files("oom-dumps").skipped
    assert skipped.path.endswith(run_folder.name) and "folder" in (skipped.error or "")


def test_without_torchrun_names_and_folder_are_unchanged(fake, monkeypatch):
    oom_as_rank(fake, monkeypatch, 3)
    (path,) = dumps_in(Path("oom-dumps"))
    assert path.name.startswith("oom-rank3-")
    assert load(path)[METADATA_KEY]["elastic"] is None


@pytest.mark.parametrize(
    ("run_id", "folder"),
    [
        ("none", None),  # torchrun's default id for a static multi-node rendezvous: every launch's
        ("", None),
        (None, None),
        ("job 42/../x", "run-job_42_.._x"),
        ("...", None),
        ("12345", "run-12345"),
    ],
)
def test_run_folder_names(run_id, folder):
    assert writer.run_folder_name(run_id) == folder


def test_a_manual_dump_under_torchrun_goes_to_the_run_folder_too(fake, monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job42")
    oomdoctor.install()
    path = oomdoctor.dump()
    assert path is not None and path.parent == (Path("oom-dumps") / "run-job42").resolve()
    assert path.name.startswith("manual-")


SECRETS = {
    "HF_TOKEN": "hf_abc",
    "NCCL_IB_KEY": "k",
    "TORCH_HUB_TOKEN": "t",
    "CUDA_SECRET_THING": "s",
    "PYTORCH_PASSWORD": "p",
    "TORCH_CREDENTIALS_FILE": "/home/alice/creds",
    "WANDB_API_KEY": "w",
    "AWS_SECRET_ACCESS_KEY": "a",
    "NVIDIA_AUTH": "x",
}
KEPT = {
    "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
    "CUDA_VISIBLE_DEVICES": "0,1",
    "NCCL_DEBUG": "INFO",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
    "TORCHELASTIC_RUN_ID": "abc",
    "OMP_NUM_THREADS": "8",
    "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
    "LOCAL_RANK": "0",
    "TORCHINDUCTOR_CACHE_DIR": "/tmp/inductor",
}


def test_the_environment_block_keeps_what_bears_on_memory_and_never_a_secret():
    recorded = environment.environment_variables({**SECRETS, **KEPT, "HOME": "/home/alice", "PATH": "/usr/bin"})
    assert recorded == dict(sorted(KEPT.items()))
    assert list(recorded) == sorted(recorded)
    for name in SECRETS:
        assert environment.looks_secret(name)


def test_the_environment_block_cuts_passwords_out_of_urls_and_is_bounded():
    recorded = environment.environment_variables(
        {"TORCH_HUB_URL": "https://alice:hunter2@example.com/hub", "NCCL_X": "y" * 5000}
    )
    assert recorded["TORCH_HUB_URL"] == "https://example.com/hub"
    assert len(recorded["NCCL_X"]) == environment.MAX_ENVIRONMENT_VALUE
    many = environment.environment_variables({f"NCCL_{i:04d}": "1" for i in range(1000)})
    assert len(many) == environment.MAX_ENVIRONMENT_VARIABLES


def test_imported_frameworks_are_named_and_none_is_imported():
    modules = {"transformers": types.SimpleNamespace(__version__="5.23.0"), "deepspeed": types.SimpleNamespace()}
    assert environment.imported_packages(modules) == {"transformers": "5.23.0"}
    before = set(sys.modules)
    environment.imported_packages()
    assert set(sys.modules) == before


def test_cuda_backend_versions_without_cuda_say_none_or_fail_quietly():
    versions = environment.versions(CudaBackend())
    assert set(versions) == {"oomdoctor", "torch", "cuda", "python", "cudnn", "nccl"}
    assert versions["cudnn"] is None or versions["cudnn"].isdigit()


def test_a_dump_records_the_environment_and_the_reports_show_it(fake, monkeypatch, tmp_path):
    from oomdoctor.analysis.environment import environment_of
    from oomdoctor.pipeline import load_and_analyse
    from oomdoctor.redact import Redactor, redact_environment
    from oomdoctor.views import markdown_report

    for name, value in {**SECRETS, **KEPT, "TORCH_HOME": "/home/alice/.cache/torch"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setitem(sys.modules, "transformers", types.SimpleNamespace(__version__="5.23.0"))
    fake.cudnn_version = lambda: "90100"
    fake.nccl_version = lambda: "2.21.5"
    oomdoctor.install()
    with pytest.raises(torch.OutOfMemoryError):
        fake.oom(10 * MiB)
    (path,) = dumps_in(Path("oom-dumps") / "run-abc")
    meta = load(path)[METADATA_KEY]
    assert meta["versions"]["cudnn"] == "90100" and meta["versions"]["nccl"] == "2.21.5"
    assert meta["packages"]["transformers"] == "5.23.0"
    assert not set(SECRETS) & set(meta["environment"])
    assert meta["environment"]["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert "hf_abc" not in path.read_bytes().decode("latin-1")

    snapshot, analysis = load_and_analyse(str(path))
    env = environment_of(snapshot)
    assert (env.cudnn_version, env.nccl_version, env.run_id) == ("90100", "2.21.5", "abc")
    assert ("transformers", "5.23.0") in env.packages
    report = markdown_report.render(analysis, environment=env)
    for row in ("| cuDNN | `90100` |", "| NCCL | `2.21.5` |", "| torchrun run | `abc` |", "transformers 5.23.0"):
        assert row in report
    assert "<summary>Environment variables (" in report and "NCCL_DEBUG=INFO" in report
    assert "HF_TOKEN" not in report
    redacted = redact_environment(env, Redactor())
    assert "alice" not in repr(redacted.environment_variables)
