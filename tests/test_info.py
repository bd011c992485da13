"""`oomdoctor info`: what a file holds, in text and JSON, with torch's byte accounting."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

from oomdoctor.analysis.contents import describe
from oomdoctor.cli import main
from oomdoctor.load import load
from oomdoctor.views.info import format_bytes, to_dict
from tests.builders import MiB, make_snapshot


def _write(tmp_path: Path, data, name: str = "snapshot.pickle") -> Path:
    path = tmp_path / name
    path.write_bytes(pickle.dumps(data, protocol=4))
    return path


def _json(path: Path, capsys, *extra: str) -> dict:
    assert main(["info", str(path), "--format", "json", *extra]) == 0
    return json.loads(capsys.readouterr().out)


def test_json_reports_the_byte_totals_and_trace(tmp_path, capsys) -> None:
    info = _json(_write(tmp_path, make_snapshot()), capsys)
    assert info["format"] == "dict" and info["container"] == "pickle-protocol-4"
    assert info["device_list"] == [0]
    assert (info["segments"], info["blocks"]) == (1, 2)
    assert info["reserved_bytes"] == 2 * MiB
    assert info["allocated_bytes"] == 1024
    assert info["requested_bytes"] == 1000
    assert info["rounding_bytes"] == 24
    assert info["active_bytes"] == 1024
    assert info["free_bytes"] == 2 * MiB - 1024
    assert info["trace_events"] == [6]
    assert info["time_span_us"] == {"first": 100, "last": 105, "seconds": 5e-06}
    assert info["stacks_recorded"] is True and info["stack_kinds"] == ["python"]
    assert info["oom_events"] == [
        {
            "device": 0,
            "event_index": 5,
            "request_bytes": 40 * MiB,
            "device_free_bytes": 5 * MiB,
            "stream": 0,
            "time_us": 105,
        }
    ]
    assert info["annotations"] == 2
    settings = info["allocator_settings"]
    assert settings["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:False"
    assert settings["max_split_size_bytes"] is None and settings["expandable_segments"] is False
    assert settings["roundup_power2_divisions"] == {"2": 4}
    assert info["oomdoctor_metadata"] is None
    (device,) = info["devices"]
    assert device["actions"] == {"alloc": 2, "free_completed": 1, "free_requested": 1, "oom": 1, "segment_alloc": 1}
    assert device["events_with_stacks"] == 6


def test_pending_free_blocks_are_active_but_not_allocated(tmp_path, capsys) -> None:
    data = make_snapshot()
    data["segments"][0]["blocks"][1]["state"] = "active_pending_free"
    info = _json(_write(tmp_path, data), capsys)
    assert info["active_bytes"] == 2 * MiB and info["allocated_bytes"] == 1024
    assert info["free_bytes"] == 2 * MiB - 1024  # cached, not allocated


def test_text_output_says_what_the_file_is(tmp_path, capsys) -> None:
    assert main(["info", str(_write(tmp_path, make_snapshot()))]) == 0
    text = capsys.readouterr().out
    assert "snapshot dict" in text
    assert "2.00 MiB (2097152 bytes)" in text
    assert "OOM                 device 0, event 5: request 40.00 MiB, device free 5.00 MiB" in text
    assert "expandable_segments off" in text
    assert "none (a plain torch snapshot)" in text


def test_oomdoctor_metadata_and_recorded_torch_version(tmp_path, capsys) -> None:
    data = make_snapshot()
    data["oomdoctor"] = {"schema_version": 1, "reason": "oom", "versions": {"torch": "2.13.0"}, "rank": 3}
    info = _json(_write(tmp_path, data), capsys)
    assert info["torch_version"] == "2.13.0"
    assert info["oomdoctor_metadata"]["reason"] == "oom" and info["oomdoctor_metadata"]["rank"] == 3


def test_segment_list_and_empty_snapshot(tmp_path, capsys) -> None:
    info = _json(_write(tmp_path, make_snapshot()["segments"]), capsys)
    assert info["format"] == "segment-list" and info["trace_events"] == [] and info["allocator_settings"] is None
    assert info["time_span_us"] is None and info["oom_events"] == []
    info = _json(_write(tmp_path, {"segments": [], "device_traces": [[]]}), capsys)
    assert info["reserved_bytes"] == 0 and info["device_list"] == [] and info["stacks_recorded"] is False
    assert main(["info", str(tmp_path / "snapshot.pickle")]) == 0
    assert "none recorded" in capsys.readouterr().out


def test_max_bytes_option(tmp_path, capsys) -> None:
    path = _write(tmp_path, make_snapshot())
    assert main(["info", str(path), "--max-bytes", "1KiB"]) == 2
    assert "1 KiB limit" in capsys.readouterr().err
    assert main(["info", str(path), "--max-bytes", "1MiB"]) == 0
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        main(["info", str(path), "--max-bytes", "lots"])
    assert exited.value.code == 2


def test_help_is_the_module_docstring(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["info", "--help"])
    assert "requested_bytes" in capsys.readouterr().out


def test_several_devices_and_a_real_oom(corpus_dir: Path, capsys) -> None:
    path = corpus_dir / "snapshots" / "multi_device_expandable__constructor_sun_code_location__memory_snapshot.pickle"
    info = _json(path, capsys)
    assert info["trace_events"] == [6445, 596, 882, 0]
    assert info["device_list"] == [0, 1, 2]
    (oom,) = info["oom_events"]
    assert oom["device"] == 1 and oom["device_free_bytes"] > 0 and oom["request_bytes"] > 0
    assert info["allocator_settings"]["expandable_segments"] is True
    assert sum(d["reserved_bytes"] for d in info["devices"]) == info["reserved_bytes"]
    assert info["torch_version_hint"] == "2.8"
    assert set(info["stack_kinds"]) == {"python", "c++"}


def test_format_bytes() -> None:
    assert format_bytes(0) == "0 bytes"
    assert format_bytes(1023) == "1023 bytes"
    assert format_bytes(1536) == "1.50 KiB"
    assert format_bytes(3 * 1024**3) == "3.00 GiB"


def test_build_info_is_plain_data() -> None:
    info = to_dict(describe(load(pickle.dumps(make_snapshot(), protocol=4)), "x"))
    assert json.loads(json.dumps(info)) == info
