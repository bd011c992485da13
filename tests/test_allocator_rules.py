"""The allocator's sizing rules, shared by analysis and the rehearsal simulator (spec §4.1)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oomdoctor.allocator_rules import (
    division_intervals,
    divisions_for,
    parse_alloc_conf,
    pool_of,
    round_size,
    roundup_power2_next_division,
    segment_size,
)
from oomdoctor.analysis import sizing

MiB = 1024 * 1024


@pytest.mark.parametrize(
    "size_bytes, divisions, rounded_bytes",
    [
        (1, 0, 512),
        (511, 4, 512),
        (1200, 0, 1536),
        (1200, 4, 1536),  # not above 512 * divisions: plain 512 rounding
        (5 * MiB + 1, 4, 6 * MiB),
        (4 * MiB, 4, 4 * MiB),
        (600 * MiB, 4, 640 * MiB),
        (600 * MiB, 1, 600 * MiB),
    ],
)
def test_round_size(size_bytes, divisions, rounded_bytes):
    assert round_size(size_bytes, divisions) == rounded_bytes


def test_roundup_power2_next_division():
    assert roundup_power2_next_division(1200, 4) == 1280
    assert roundup_power2_next_division(2048, 4) == 2048
    assert roundup_power2_next_division(1025, 4096) == 2048  # more divisions than bytes: next power


def test_segment_size_and_pool():
    assert segment_size(512) == 2 * MiB
    assert segment_size(MiB) == 2 * MiB
    assert segment_size(MiB + 512) == 20 * MiB
    assert segment_size(3 * MiB, 64 * MiB) == 64 * MiB
    assert segment_size(10 * MiB) == 10 * MiB
    assert segment_size(21 * MiB + 1) == 22 * MiB
    assert pool_of(MiB) == "small" and pool_of(MiB + 512) == "large"


def test_analysis_and_simulator_agree_where_their_inputs_do():
    config = parse_alloc_conf("roundup_power2_divisions:[2:2,64:4,>:8],large_segment_size_mb:64")
    table = tuple(sorted((int(k), v) for k, v in config.settings_dict()["roundup_power2_divisions"].items()))
    for size_bytes in (MiB + 1, 3 * MiB + 7, 70 * MiB + 1, 900 * MiB + 3, 5000 * MiB + 1):
        rounded_bytes = sizing.round_size(size_bytes, table)
        assert rounded_bytes == config.round_size(size_bytes)
        assert sizing.segment_size(rounded_bytes, 64 * MiB) == config.allocation_size(rounded_bytes)


def test_analysis_does_not_import_the_simulator():
    code = "import sys, oomdoctor.analysis; print(sorted(m for m in sys.modules if m.startswith('oomdoctor.rehearse')))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_roundup_divisions_of_a_dump():
    from oomdoctor.model import AllocatorSettings

    assert sizing.roundup_divisions(None) == ()
    assert sizing.roundup_divisions(AllocatorSettings(roundup_power2_divisions=((1, 0), (2, 1)))) == ()
    table = ((1, 0), (2, 4))
    assert sizing.roundup_divisions(AllocatorSettings(roundup_power2_divisions=table)) == table


def test_analysis_rounds_small_requests_with_the_first_interval_like_the_simulator():
    from oomdoctor.analysis.sizing import round_size as analysis_round_size

    config = parse_alloc_conf("roundup_power2_divisions:4")
    divisions = tuple((1 << k, config.roundup_power2_divisions[k]) for k in range(16))
    for size in (600_000, 1_200, 3_000_000, 70 * 2**20, 2**20 + 1):
        assert analysis_round_size(size, divisions) == config.round_size(size)
    assert analysis_round_size(600_000, divisions) == 655_360


def _last_bound_at_most(size_bytes: int, table: tuple[tuple[int, int], ...]) -> int:
    # the reference: the divisions of the last pair whose bound is at most the request's interval key
    key_mib = 1 << min(max(size_bytes.bit_length() - 21, 0), 15)
    found = 0
    for lower_mib, count in table:
        if lower_mib <= key_mib:
            found = count
    return found


@settings(max_examples=200, deadline=None)
@given(
    table=st.lists(st.tuples(st.integers(0, 1 << 17), st.integers(-2, 64)), max_size=20).map(tuple),
    size_bytes=st.integers(0, 1 << 50),
)
def test_one_divisions_for_serves_a_dump_table_and_a_parsed_config(table, size_bytes):
    assert divisions_for(size_bytes, division_intervals(table)) == _last_bound_at_most(size_bytes, table)


def test_division_intervals_of_torch_table_and_config_agree():
    config = parse_alloc_conf("roundup_power2_divisions:[2:2,64:4,>:8]")
    table = tuple(sorted((int(k), v) for k, v in config.settings_dict()["roundup_power2_divisions"].items()))
    assert division_intervals(table) == tuple(config.roundup_power2_divisions)
    assert division_intervals(((3, 4),)) == (0, 0) + (4,) * 14  # a bound between keys: from the next key on
    assert division_intervals(()) == (0,) * 16
