"""`oomdoctor report`: text leads with the verdict, JSON carries the full result, bad input exits 2."""

from __future__ import annotations

import pickle

import orjson
import pytest

from oomdoctor.analysis import analyse
from oomdoctor.cli import main
from oomdoctor.metadata import COMPONENTS, VERDICTS
from oomdoctor.views import json_report, text_report
from tests.builders import USER_STACK, MiB, Sim, plain_oom_snapshot


@pytest.fixture
def snapshot_file(tmp_path):
    path = tmp_path / "snap.pickle"
    path.write_bytes(pickle.dumps(plain_oom_snapshot(), protocol=4))
    return path


def test_json_report_has_the_contract_fields(snapshot_file, capsys):
    assert main(["report", str(snapshot_file), "--format", "json"]) == 0
    data = orjson.loads(capsys.readouterr().out)
    for key in ("verdict", "confidence", "components", "evidence", "recommendations", "what_if", "schema_version"):
        assert key in data
    assert data["verdict"] in VERDICTS
    assert data["verdict"] == "oversized-request"
    assert set(data["components"]) == set(COMPONENTS)
    assert sum(data["components"].values()) == 300 * MiB
    assert data["accounting"]["request_bytes"] == 600 * MiB
    assert data["accounting"]["message_bytes"] == 600 * MiB
    assert all(isinstance(v, int) for v in data["components"].values())


def test_text_report_leads_with_the_verdict(snapshot_file, capsys):
    assert main(["report", str(snapshot_file)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("Verdict: oversized-request")
    assert "Tried to allocate 600.00 MiB" in out
    assert "Not determined from this file" in out  # plain snapshot: total memory unknown


def test_text_and_json_agree_on_the_headline(snapshot_file):
    from oomdoctor.load import load

    analysis = analyse(load(snapshot_file))
    data = json_report.to_dict(analysis)
    text = text_report.render(analysis)
    assert data["verdict"] in text.splitlines()[0]
    assert f"{data['confidence']:.0%}" in text.splitlines()[0]


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"not a pickle at all",
        pickle.dumps({"segments": "nope"}, protocol=4),
        pickle.dumps(plain_oom_snapshot())[:40],
    ],
    ids=["empty", "garbage", "wrong-shape", "truncated"],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, content):
    path = tmp_path / "bad.pickle"
    path.write_bytes(content)
    assert main(["report", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("oomdoctor: ") and err.count("\n") == 1
    assert "Traceback" not in err


def test_missing_file_and_unknown_device_exit_2(tmp_path, snapshot_file, capsys):
    assert main(["report", str(tmp_path / "absent.pickle")]) == 2
    assert main(["report", str(snapshot_file), "--device", "7"]) == 2
    err = capsys.readouterr().err
    assert "no device 7" in err


def test_json_of_a_model_built_analysis_roundtrips():
    sim = Sim()
    sim.alloc(10 * MiB, USER_STACK)
    sim.oom(2000 * MiB)
    data = orjson.loads(json_report.render(analyse(sim.snapshot())))
    assert data["schema_version"] == json_report.JSON_SCHEMA_VERSION
    assert data["live_blocks"][0]["frames"] == ["train.py:38 in train_step"]
    assert data["replay"]["ooms"][0]["fatal"] is True
