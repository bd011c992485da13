"""Whether expandable segments were on, from the dump's own segments when the allocator's settings
are not recorded (torch 2.1 to 2.4 write `is_expandable` on every segment, but no settings): off
when the default pool's segments all say they are not expandable, on when one is, unknown when the
key is missing or only a private pool's segments (which may not be expandable whatever the
setting) are there."""

from __future__ import annotations

from oomdoctor.analysis import analyse
from oomdoctor.load.convert import build_snapshot
from tests.builders import make_snapshot


def _expandable(raw: dict) -> bool | None:
    raw.pop("allocator_settings", None)
    return analyse(build_snapshot(raw, "pickle")).fragmentation.expandable_segments


def test_segments_that_say_they_are_not_expandable_mean_off():
    assert _expandable(make_snapshot()) is False


def test_one_expandable_segment_means_on():
    raw = make_snapshot()
    raw["segments"][0]["is_expandable"] = True
    assert _expandable(raw) is True


def test_without_the_key_it_is_unknown():
    raw = make_snapshot()
    del raw["segments"][0]["is_expandable"]
    assert _expandable(raw) is None
    assert build_snapshot(make_snapshot(), "pickle").expandable_recorded is True


def test_a_private_pool_alone_does_not_tell():
    raw = make_snapshot()
    raw["segments"][0]["segment_pool_id"] = (1, 2)
    assert _expandable(raw) is None


def test_recorded_settings_still_decide():
    raw = make_snapshot()
    raw["allocator_settings"]["expandable_segments"] = True
    assert analyse(build_snapshot(raw, "pickle")).fragmentation.expandable_segments is True
