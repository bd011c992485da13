"""Another tool re-arming torch's allocator history after oomdoctor.install(): torchtitan's
MemoryProfiler calls `torch.cuda.memory._record_memory_history(max_entries=100000)` (torch's default
stacks="all"), which replaces capture's settings; other code may stop recording (`enabled=None`).
Capture wraps the function while installed, records each such call in the dump (`recording.rearmed`),
starts recording again with its own settings after a stop, and uninstall() puts the function back.

End to end under rehearsal (the simulated allocator answers `_record_memory_history` as torch does:
stopping clears the ring), and against test_capture.py's fake backend for the bookkeeping.
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import oomdoctor  # noqa: E402
from oomdoctor.capture import session as session_module  # noqa: E402
from oomdoctor.metadata import METADATA_KEY  # noqa: E402
from oomdoctor.rehearse.session import RehearsalConfig, rehearse_script  # noqa: E402
from tests.test_capture import FakeBackend, dumps_in, load, small_training  # noqa: E402, F401
from tests.test_capture import fake as fake  # noqa: E402, F401  (the fixture)

MiB = 1 << 20

# torchtitan's torchtitan/tools/profiler.py, in miniature: MemoryProfiler.__init__ re-arms history
PROFILER = textwrap.dedent(
    """
    import torch

    MEMORY_SNAPSHOT_MAX_ENTRIES = 100000


    class MemoryProfiler:
        def __init__(self):
            torch.cuda.memory._record_memory_history(max_entries=MEMORY_SNAPSHOT_MAX_ENTRIES)


    def stop_recording():
        torch.cuda.memory._record_memory_history(enabled=None)
    """
)

TRAIN = textwrap.dedent(
    """
    import sys
    import oomdoctor
    oomdoctor.install()

    import torch
    import torch.nn as nn
    import profiler

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    for step in range(3):
        if step == 1:
            if sys.argv[1] == "rearm":
                profiler.MemoryProfiler()
            else:
                profiler.stop_recording()
        batch = 16384 if step == 2 else 8
        optimizer.zero_grad()
        model(torch.randn(batch, 1024)).square().mean().backward()
        optimizer.step()
    """
)


def _rehearse(tmp_path, monkeypatch, mode: str) -> dict:
    monkeypatch.chdir(tmp_path)
    for name in ("OOMDOCTOR_DIR", "OOMDOCTOR_MAX_DUMPS", "OOMDOCTOR_DISABLE", "OOMDOCTOR_STACKS"):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "profiler.py").write_text(PROFILER)
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "profiler", raising=False)  # each test's own profiler.py
    dump_dir = tmp_path / "oom-dumps"
    result = rehearse_script(script, [mode], RehearsalConfig(device_memory_bytes=96 * MiB), dump_dir=dump_dir)
    assert result.exit_code == 1
    (dump,) = sorted(dump_dir.glob("*.pickle"))
    return load(dump) | {"path": dump}


@pytest.mark.slow
def test_a_torchtitan_style_rearm_is_recorded_in_the_dump_and_the_report(tmp_path, monkeypatch, capsys):
    from oomdoctor.cli import main

    data = _rehearse(tmp_path, monkeypatch, "rearm")
    recording = data[METADATA_KEY]["recording"]
    (call,) = recording["rearmed"]
    assert call["action"] == "rearmed" and call["enabled"] == "all"
    assert (call["max_entries"], call["stacks"], call["context"]) == (100000, "all", "all")
    assert call["caller"].endswith("profiler.py:9 in __init__")
    # the dump says the settings it was recorded with: the latest call's
    assert (recording["max_entries"], recording["stacks"], recording["started_by"]) == (100000, "all", "oomdoctor")
    assert data["device_traces"][0] and data["device_traces"][0][-1]["action"] == "oom"
    err = capsys.readouterr().err
    assert "profiler.py:9 in __init__ re-armed torch's memory history after oomdoctor.install()" in err
    assert "can take minutes" in err

    assert main(["report", str(data["path"]), "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert any("_record_memory_history once after oomdoctor.install()" in item for item in report["unknowns"])
    assert "re-armed after install() by" in report["environment"]["recording"]


def test_a_stop_while_installed_is_answered_by_recording_again(tmp_path, monkeypatch, capsys):
    data = _rehearse(tmp_path, monkeypatch, "stop")
    calls = data[METADATA_KEY]["recording"]["rearmed"]
    assert [(c["action"], c["enabled"]) for c in calls] == [("stopped", None), ("restored", "all")]
    assert calls[0]["caller"].endswith("profiler.py:13 in stop_recording") and calls[1]["caller"] == "oomdoctor"
    recording = data[METADATA_KEY]["recording"]
    assert (recording["max_entries"], recording["stacks"]) == (100000, "python")  # capture's own again
    trace = data["device_traces"][0]
    assert trace and trace[-1]["action"] == "oom"  # the history after the stop is there
    assert "recording it again with oomdoctor's settings" in capsys.readouterr().err


# -- the bookkeeping, against the fake backend ------------------------------------------------------


@pytest.fixture
def recorded(monkeypatch):
    """torch.cuda.memory._record_memory_history replaced by a stand-in that notes its calls."""
    calls: list = []

    def stand_in(enabled="all", *args, **kwargs):
        calls.append((enabled, args, kwargs))

    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history", stand_in)
    return stand_in, calls


def test_uninstall_puts_the_function_back_and_nothing_is_seen_after(fake, recorded):
    stand_in, calls = recorded
    oomdoctor.install()
    wrapper = torch.cuda.memory._record_memory_history
    assert wrapper is not stand_in and wrapper.__wrapped__ is stand_in
    torch.cuda.memory._record_memory_history("state", None, "python", 500)
    assert calls == [("state", (None, "python", 500), {})]  # the caller's call is made as it asked
    oomdoctor.uninstall()
    assert torch.cuda.memory._record_memory_history is stand_in
    assert fake.history_calls[-1] == ("stop", None)


def test_a_rearm_goes_into_every_later_dump(fake, recorded):
    oomdoctor.install()
    torch.cuda.memory._record_memory_history(max_entries=100000)
    with pytest.raises(torch.OutOfMemoryError):
        small_training(1, (0, "forward"), fake)
    (dump,) = dumps_in(Path("oom-dumps"))
    recording = load(dump)[METADATA_KEY]["recording"]
    assert [(c["action"], c["stacks"], c["max_entries"]) for c in recording["rearmed"]] == [("rearmed", "all", 100000)]
    assert recording["stacks"] == "all" and recording["started_by"] == "oomdoctor"
    assert fake.history_calls == [("start", {"max_entries": 100000, "stacks": "python", "context": "all"})]


def test_a_stop_restarts_capture_settings_and_a_failed_restart_is_said(fake, recorded, capsys):
    oomdoctor.install()
    torch.cuda.memory._record_memory_history(None)
    assert fake.history_calls[-1] == ("start", {"max_entries": 100000, "stacks": "python", "context": "all"})
    assert [c["action"] for c in oomdoctor.capture._session.history_calls] == ["stopped", "restored"]

    def broken(**kwargs):
        raise RuntimeError("no device")

    fake.record_history = broken
    torch.cuda.memory._record_memory_history(enabled=None)
    assert "could not be started again (RuntimeError: no device)" in capsys.readouterr().err
    metadata = oomdoctor.capture._session.build_metadata(reason="manual", oom=None, device=0, snapshot={})
    assert metadata["recording"]["rearmed"][-1]["action"] == "stopped"


def test_history_started_by_the_script_and_stopped_later_is_stopped_again_at_uninstall(fake, recorded):
    fake.history_enabled = lambda: True
    oomdoctor.install()
    torch.cuda.memory._record_memory_history(enabled=None)
    assert fake.history_calls == [("start", {"max_entries": 100000, "stacks": "python", "context": "all"})]
    oomdoctor.uninstall()
    assert fake.history_calls[-1] == ("stop", None)


@pytest.mark.parametrize(
    "args, kwargs, settings",
    [
        ((), {"max_entries": 100000}, ("all", "all", "all", 100000)),
        ((None,), {}, (None, "all", "all", None)),
        (("state", "alloc", "python", 10), {}, ("state", "alloc", "python", 10)),
        ((True,), {"trace_alloc_max_entries": 7}, ("all", "all", "all", 7)),  # torch 2.0's boolean form
        ((False,), {}, (None, "all", "all", None)),
        ((), {"max_entries": 2**63 - 1}, ("all", "all", "all", None)),  # sys.maxsize: torch's unbounded default
        ((), {"stacks": 3}, ("all", "all", "int", None)),
    ],
)
def test_history_call_settings(args, kwargs, settings):
    got = session_module.history_call_settings(args, kwargs)
    assert (got["enabled"], got["context"], got["stacks"], got["max_entries"]) == settings


def test_the_rearmed_calls_load_and_redact():
    from oomdoctor.load.metadata import parse_metadata
    from oomdoctor.redact import redact_snapshot_data, redactor_for_data

    call = {"action": "rearmed", "time_us": 5, "caller": "/home/alice/titan/torchtitan/tools/profiler.py:9 in __init__",
            "enabled": "all", "context": "all", "stacks": "all", "max_entries": 100000}  # fmt: skip
    meta = parse_metadata({"recording": {"max_entries": 100000, "stacks": "all", "rearmed": [call, {"action": "x"}]}})
    assert meta.recording.rearmed[0].caller.endswith("profiler.py:9 in __init__")
    assert meta.recording.rearmed[1].action is None and not meta.recording.stopped
    data = {"segments": [], METADATA_KEY: {"recording": {"rearmed": [dict(call)]}}}
    redacted = redact_snapshot_data(data, redactor_for_data(data))
    (shown,) = redacted[METADATA_KEY]["recording"]["rearmed"]
    assert "alice" not in shown["caller"] and shown["caller"].endswith("profiler.py:9 in __init__")
    assert shown["max_entries"] == 100000 and shown["stacks"] == "all"
