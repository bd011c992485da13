"""The text report says whether expandable segments were on, and the allocator's configuration, in
every report (the Markdown one always did; the text one only beside a failed request)."""

from __future__ import annotations

from oomdoctor.analysis import analyse
from oomdoctor.load.convert import build_snapshot
from oomdoctor.views import text_report
from tests.builders import make_snapshot


def _section(raw: dict) -> list[str]:
    lines = text_report.render(analyse(build_snapshot(raw, "pickle"))).splitlines()
    start = lines.index("Fragmentation")
    return lines[start + 1 : lines.index("", start)]


def test_without_an_oom_the_setting_and_the_configuration_are_said():
    raw = make_snapshot()
    raw["device_traces"][0] = [e for e in raw["device_traces"][0] if e["action"] != "oom"]
    raw["allocator_settings"]["PYTORCH_CUDA_ALLOC_CONF"] = "max_split_size_mb:512"
    assert _section(raw) == ["  expandable segments: off", "  PYTORCH_CUDA_ALLOC_CONF: max_split_size_mb:512"]


def test_with_an_oom_the_request_s_pool_comes_first():
    lines = _section(make_snapshot())
    assert lines[0].startswith("  free in the ") and "expandable segments: off" in lines[1]
    assert lines[-1] == "  PYTORCH_CUDA_ALLOC_CONF: expandable_segments:False"
