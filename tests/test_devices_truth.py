"""What a report says about the other devices of a snapshot, checked against the file itself."""

from __future__ import annotations

import pickle

from oomdoctor.load import load_raw
from oomdoctor.pipeline import load_and_analyse
from oomdoctor.views import text_report
from tests.conftest import FIXTURES

DUMPS = FIXTURES / "dumps"


def _user_lines(trace: list[dict]) -> set[tuple[str, int]]:
    """The (file, line) of every frame of every allocation outside torch's own files."""
    return {
        (frame["filename"], frame["line"])
        for event in trace
        if event["action"] == "alloc"
        for frame in event.get("frames") or []
        if "/torch/" not in frame["filename"].replace("\\", "/")
    }


def test_two_devices_sharing_source_lines_are_not_said_to_run_other_code(tmp_path):
    """Two GPTs of one script, one per device, without DataParallel (as a model split by hand over
    two devices would be): their allocations come from the same user lines, so the report must not
    say device 0 'ran other code ... (no DataParallel frames or allocation sites in common)'. What
    it can say is why they are not compared as replicas: no DataParallel frames."""
    a = load_raw(DUMPS / "no-oom-gpt-adamw.pickle")
    b = load_raw(DUMPS / "activation-spike-gpt-longer-sequence.pickle")
    for segment in b["segments"]:
        segment["device"] = 1
    merged = {key: value for key, value in a.items() if key != "oomdoctor"}
    merged["segments"] = a["segments"] + b["segments"]
    merged["device_traces"] = [a["device_traces"][0], b["device_traces"][0]]
    path = tmp_path / "two-devices.pickle"
    path.write_bytes(pickle.dumps(merged, protocol=4))
    shared = _user_lines(merged["device_traces"][0]) & _user_lines(merged["device_traces"][1])
    assert shared  # the case is what it says

    _, analysis = load_and_analyse(str(path))
    assert analysis.device == 1
    text = text_report.render(analysis)
    assert "ran other code" not in text
    assert "allocation sites in common" not in text
    assert (
        "Device 0 not compared with device 1 as replicas of one model: device 1's trace shows no DataParallel"
        " frames (replicate, scatter, parallel_apply)"
    ) in text
