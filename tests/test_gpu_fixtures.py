"""Real GPU dumps (fixtures/gpu/) checked on the CPU, and a dry run of the GPU validation driver.

fixtures/gpu/ is written by benchmarks/gpu/import_results.py from a run of benchmarks/gpu/run_all.sh
on a GPU machine (docs/gpu-validation.md). Every dump there must load and `oomdoctor report` it;
where the real run stopped where its scenario was built to stop, the report must give the intended
verdict, at the phase and step the run really stopped, with the "Tried to allocate" figure torch
itself passed to the OOM observer, and with parameters, gradients, optimizer state and buffers as
found by identity in the process. The tests skip cleanly while the folder holds no dumps.

The dry run drives the whole pipeline on the CPU, with rehearsal standing in for CUDA: driver,
output layout (what the device tool brings back), summary schema, import, and the checks above.

Before any GPU run: each rehearsal fixture's metadata rewritten as a memory fraction on a big GPU
leaves it (the observer's total is then the allowed bytes, its free figure the whole GPU's) must
keep its verdict.
"""

from __future__ import annotations

import importlib.util
import json
import pickle
import re
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import orjson
import pytest

from oomdoctor.cli import main
from oomdoctor.load import load
from oomdoctor.metadata import VERDICTS
from tests.conftest import FIXTURES, ROOT

GPU_DIR = FIXTURES / "gpu"
GPU_BENCH = ROOT / "benchmarks" / "gpu"
MiB = 1 << 20
OUT_NAME = re.compile(r"^[A-Za-z0-9._-]+$")  # what the device tool brings back from $OUT


def _module(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"gpu_{name}", GPU_BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(GPU_BENCH))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(GPU_BENCH))
    return module


layout = _module("layout")


def gpu_entries(folder: Path) -> list[dict[str, Any]]:
    manifest = folder / "manifest.json"
    if not manifest.is_file():
        return []
    return [e for e in json.loads(manifest.read_text())["fixtures"] if (folder / e["file"]).is_file()]


def _params():
    entries = gpu_entries(GPU_DIR)
    if not entries:
        return [pytest.param(None, marks=pytest.mark.skip(reason="no real GPU dumps yet (docs/gpu-validation.md)"))]
    return [pytest.param(e, id=e["name"]) for e in entries]


def report_json(path: Path, capsys: Any) -> dict[str, Any]:
    capsys.readouterr()  # what was printed before
    assert main(["report", str(path), "--format", "json"]) == 0
    return orjson.loads(capsys.readouterr().out)


def check_gpu_fixture(folder: Path, entry: dict[str, Any], report: dict[str, Any]) -> None:
    """What a real dump and its manifest entry must satisfy (see module doc)."""
    provenance = json.loads((folder / entry["provenance"]).read_text())
    for key in ("torch_version", "date_utc", "command", "modified", "device_limit", "ground_truth", "variant"):
        assert key in provenance, key
    assert provenance["ground_truth"]["intended"]["verdict"] == entry["intended"]["verdict"]
    assert report["verdict"] in VERDICTS
    if entry["expected_verdict"] is not None:
        assert report["verdict"] == entry["expected_verdict"], report["summary"]
    real = entry["real"]
    assert (report["target_phase"], report["target_step"]) == (real["phase"], real["step"])
    if real["status"] == "oom":
        # oomdoctor derives the segment-sized figure from the oom event; torch passed its own
        assert report["accounting"]["message_bytes"] == real["message_bytes"]
        if real["tried_to_allocate"]:
            assert abs(real["tried_to_allocate"]["bytes"] - real["message_bytes"]) <= 0.01 * real["message_bytes"]
    components = report["components"]
    for name in layout.STATE_COMPONENTS:
        expected = real["state_components"][name]
        assert abs(components[name] - expected) <= max(0.05 * expected, MiB), (
            f"{name}: {components[name]} vs {expected}"
        )
    assert abs(sum(components.values()) - real["allocated_bytes"]) <= MiB


@pytest.mark.parametrize("entry", _params())
def test_real_gpu_dump_reports_what_happened(entry, capsys):
    load(GPU_DIR / entry["file"])
    check_gpu_fixture(GPU_DIR, entry, report_json(GPU_DIR / entry["file"], capsys))


def test_gpu_fixtures_hold_no_machine_paths():
    entries = gpu_entries(GPU_DIR)
    if not entries:
        pytest.skip("no real GPU dumps yet")
    for entry in entries:
        data = (GPU_DIR / entry["file"]).read_bytes()
        assert b"scenario_child.py" not in data and str(ROOT).encode() not in data, entry["name"]


# --------------------------------------------------------------------------- helpers, fast


def test_tried_to_allocate_is_read_from_torch_message():
    message = "CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 139.81 GiB"
    assert layout.parse_tried_to_allocate(message) == {"text": "20.00 MiB", "bytes": 20 * MiB}
    assert layout.parse_tried_to_allocate("Tried to allocate 512 bytes.")["bytes"] == 512
    assert layout.parse_tried_to_allocate("no such figure") is None
    assert layout.parse_tried_to_allocate(None) is None


def test_clean_dump_makes_paths_relative_and_drops_the_runner_frames():
    root = "/srv/checkout"
    shared = [
        {"filename": f"{root}/fixtures/scenarios/train.py", "line": 30, "name": "main"},
        {"filename": f"{root}/benchmarks/gpu/scenario_child.py", "line": 200, "name": "run_script"},
        {"filename": "<frozen runpy>", "line": 88, "name": "_run_code"},
        {"filename": "/usr/lib/python3.12/runpy.py", "line": 88, "name": "_run_code"},
        {"filename": f"{root}/fixtures/ground_truth.py", "line": 120, "name": "wrapper"},
        {"filename": "/usr/lib/python3/site-packages/torch/nn/modules/module.py", "line": 1, "name": "_call_impl"},
    ]
    snapshot = {
        "segments": [],
        "device_traces": [[{"action": "alloc", "frames": shared}, {"action": "free_requested", "frames": shared}]],
        "oomdoctor": {
            "argv": [f"{root}/fixtures/scenarios/train.py", "--steps", "2"],
            "exception": {
                "traceback": (
                    "Traceback (most recent call last):\n"
                    f'  File "{root}/benchmarks/gpu/scenario_child.py", line 200, in run_script\n'
                    '    runpy.run_path(str(script), run_name="__main__")\n'
                    '  File "<frozen runpy>", line 291, in run_path\n'
                    f'  File "{root}/fixtures/scenarios/train.py", line 30, in main\n'
                    "    loss.backward()\n"
                    "    ~~~~~~~~~~~~~^^\n"
                    "torch.OutOfMemoryError: CUDA out of memory.\n"
                )
            },
        },
    }
    cleaned = layout.clean_dump(snapshot, root)
    frames = cleaned["device_traces"][0][0]["frames"]
    assert [f["filename"] for f in frames] == [
        "fixtures/scenarios/train.py",
        "/usr/lib/python3/site-packages/torch/nn/modules/module.py",
    ]
    assert cleaned["device_traces"][0][1]["frames"] is frames  # still shared: the file stays small
    assert cleaned["oomdoctor"]["argv"][0] == "fixtures/scenarios/train.py"
    assert cleaned["oomdoctor"]["exception"]["traceback"] == (
        "Traceback (most recent call last):\n"
        '  File "fixtures/scenarios/train.py", line 30, in main\n'
        "    loss.backward()\n"
        "    ~~~~~~~~~~~~~^^\n"
        "torch.OutOfMemoryError: CUDA out of memory.\n"
    )


def _block(address: int, size: int, state: str = "active_allocated") -> dict[str, Any]:
    return {"address": address, "size": size, "requested_size": size, "state": state}


def test_truth_components_count_blocks_by_first_claim():
    segment = {
        "device": 0, "address": 0, "total_size": 40 * MiB, "allocated_size": 0, "active_size": 0, "stream": 0,
        "segment_type": "large",
        "blocks": [_block(0, 8 * MiB), _block(8 * MiB, 4 * MiB), _block(12 * MiB, 2 * MiB),
                   _block(14 * MiB, 6 * MiB, "inactive"), _block(20 * MiB, 20 * MiB)],
    }  # fmt: skip
    snapshot = load(pickle.dumps({"segments": [segment], "device_traces": [[]]}, protocol=4))
    moment = {
        "phase": "backward",
        "step": 1,
        "reason": "oom",
        "state_addresses": {
            "parameters": [0],
            "gradients": [8 * MiB, 0],  # a tied tensor: the parameter claimed it first
            "optimizer_state": [14 * MiB, 99],  # free block, and no block at all
        },
    }
    truth = layout.truth_components(snapshot, moment)
    assert truth["components"] == {
        "parameters": 8 * MiB,
        "gradients": 4 * MiB,
        "optimizer_state": 0,
        "buffers": 0,
        "rest": 22 * MiB,
    }
    assert truth["allocated_bytes"] == 34 * MiB
    assert truth["addresses_not_at_a_block_start"] == 2
    assert (truth["phase"], truth["step"]) == ("backward", 1)


def test_driver_command_line_hides_folders():
    driver = _module("driver")
    shown = driver._command_line(["--out", "/x/out", "--mode", "cuda", "--work=/x/w", "--jobs", "4"])
    assert shown == "python3 benchmarks/gpu/driver.py --out $OUT --mode cuda --work=$WORK --jobs 4"


# --------------------------------------------------------------------------- dry run, slow


@pytest.mark.slow
def test_driver_dry_run_then_import(tmp_path, capsys):
    out, work = tmp_path / "out", tmp_path / "work"
    scenario = "oversized-request-contrastive"
    completed = subprocess.run(
        [sys.executable, str(GPU_BENCH / "driver.py"), "--mode", "rehearsal", "--out", str(out), "--work", str(work),
         "--scenarios", scenario, "--variants", "default", "--bench-rounds", "2", "--bench-steps", "1",
         "--dump-events", "1000", "--jobs", "2"],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]

    # what the device tool brings back: at most 8 plain files, each under 16 MiB, plain names
    files = sorted(out.iterdir())
    assert {f.name for f in files} == {"summary.json", "log.txt", "results.tar.gz"}
    assert all(f.is_file() and OUT_NAME.match(f.name) and f.stat().st_size < 16 * MiB for f in files)

    summary = json.loads((out / "summary.json").read_text())
    assert summary["summary_version"] == layout.SUMMARY_VERSION and summary["mode"] == "rehearsal"
    assert summary["problems"] == []
    assert summary["environment"]["torch_version"] and summary["command"].startswith("python3 benchmarks/gpu/driver.py")
    assert "$OUT" in summary["command"] and str(out) not in summary["command"]
    assert {(r["run"], r["arm"], r["status"]) for r in summary["runs"]} == {
        (scenario, "real", "oom"),
        (scenario, "rehearsed", "oom"),
    }
    (row,) = summary["compare"]
    assert row["real_as_intended"] and row["verdict_matches"]
    for side in ("real", "rehearsed"):
        assert row[side]["verdict"] == row["intended"]["verdict"] == "oversized-request"
        assert (row[side]["phase"], row[side]["step"]) == (row["intended"]["phase"], row["intended"]["step"])
        assert row[side]["message_bytes"] == row["intended"]["message_bytes"]
        assert row[side]["tried_to_allocate"]["bytes"] == row["intended"]["message_bytes"]
        assert row[side]["state_components"]["parameters"] == row["intended"]["components"]["parameters"]
        assert row[side]["allocated_bytes"] == row["intended"]["allocated_bytes"]
    overhead, dump_time = summary["bench"]["overhead"], summary["bench"]["dump_time"]
    for arm in ("none", "torch", "oomdoctor"):
        assert len(overhead["step_seconds"][arm]) == 2 and overhead["median_step_seconds"][arm] > 0
    assert overhead["ratio_oomdoctor_to_torch_recording"] > 0 and overhead["ratio_torch_recording_to_none"] > 0
    assert dump_time["events_in_dump"] == 1000  # the ring filled and wrapped
    assert dump_time["frames_per_event"] > 16 and len(dump_time["dump_seconds"]) == 3
    assert dump_time["report_exit_code"] == 0

    with tarfile.open(out / "results.tar.gz") as tar:
        names = set(tar.getnames())
    for arm in ("real", "rehearsed"):
        for name in ("dump.pickle", "report.json", "report.txt", "result.json", "log.txt", "spec.json"):
            assert f"runs/{scenario}/{arm}/{name}" in names
    assert {"bench/result.json", "probe/default.json", "summary.json"} <= names

    into = tmp_path / "gpu"
    importer = _module("import_results")
    entries = importer.import_results(out, into, variants=["default"])
    assert [e["name"] for e in entries] == [scenario] == [e["name"] for e in gpu_entries(into)]
    (entry,) = entries
    assert entry["expected_verdict"] == "oversized-request"
    data = (into / entry["file"]).read_bytes()
    assert b"scenario_child.py" not in data and str(ROOT).encode() not in data
    check_gpu_fixture(into, entry, report_json(into / entry["file"], capsys))


# --------------------------------------------------------------------------- a fraction, before any GPU run

FIXTURE_MANIFEST = FIXTURES / "manifest.json"
H200_TOTAL_BYTES = 143771 * MiB  # what nvidia-smi reports for the GPU the validation runs on
CONTEXT_BYTES = 512 * MiB
# Verdicts that the accounting gets wrong under a memory fraction (docs/gpu-validation.md): the
# observer's total is the allowed bytes while its free figure is the whole GPU's.


def _fraction_params():
    if not FIXTURE_MANIFEST.is_file():
        return [pytest.param(None, marks=pytest.mark.skip(reason="no fixtures"))]
    entries = json.loads(FIXTURE_MANIFEST.read_text())["fixtures"]
    chosen = [e for e in entries if e["oom"] and not e["outside_bytes"] and (FIXTURES / e["file"]).is_file()]
    return [pytest.param(e, id=e["name"]) for e in chosen]


def as_if_under_a_fraction(snapshot: dict[str, Any]) -> dict[str, Any]:
    """A rehearsal dump's metadata as torch and capture write it on a big GPU limited by
    set_per_process_memory_fraction(capacity / total): the observer's total is the allowed bytes
    (the fixture's capacity), every free figure is the whole GPU's."""
    meta = snapshot["oomdoctor"]
    allowed_bytes = meta["oom"]["device_total_bytes"]
    reserved_bytes = allowed_bytes - meta["oom"]["device_free_bytes"]
    free_bytes = H200_TOTAL_BYTES - CONTEXT_BYTES - reserved_bytes
    meta.pop("rehearsal", None)
    meta["oom"]["device_free_bytes"] = free_bytes
    meta["device"]["total_memory_bytes"] = H200_TOTAL_BYTES
    meta["mem_get_info"] = {"free_bytes": free_bytes, "total_bytes": H200_TOTAL_BYTES}
    for trace in snapshot["device_traces"]:
        for event in trace:
            if event.get("action") == "oom":
                event["device_free"] = free_bytes
    return snapshot


@pytest.mark.parametrize("entry", _fraction_params())
def test_verdict_holds_under_a_memory_fraction(entry):
    from oomdoctor.analysis import analyse

    snapshot = as_if_under_a_fraction(layout.read_dump_dict((FIXTURES / entry["file"]).read_bytes()))
    analysis = analyse(load(pickle.dumps(snapshot, protocol=4)))
    assert analysis.verdict == entry["verdict"], analysis.summary
