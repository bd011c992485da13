"""The allocator's sizing rules, shared by analysis and the rehearsal simulator (spec §4.1)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oomdoctor.allocator_rules import (
    AllocatorConfig,
    AllocatorConfigError,
    RecordedSettings,
    division_intervals,
    divisions_for,
    parse_alloc_conf,
    pool_of,
    read_alloc_conf,
    recorded_settings,
    round_size,
    roundup_power2_next_division,
    segment_size,
)
from oomdoctor.analysis import sizing
from oomdoctor.units import MIB as MiB


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


def test_rounding_divisions_of_a_dump():
    from oomdoctor.model import AllocatorSettings

    assert AllocatorSettings().rounding_divisions == ()
    assert AllocatorSettings(roundup_power2_divisions=((1, 0), (2, 1))).rounding_divisions == ()
    table = ((1, 0), (2, 4))
    assert AllocatorSettings(roundup_power2_divisions=table).rounding_divisions == table


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


# ------------------------------------------------------------------ settings

VALID_ITEMS = [
    "max_split_size_mb:128",
    "max_non_split_rounding_mb:40",
    "large_segment_size_mb:64",
    "garbage_collection_threshold:0.6",
    "expandable_segments:True",
    "expandable_segments:false",
    "roundup_power2_divisions:4",
    "roundup_power2_divisions:[256:1,512:2,>:4]",
    "roundup_power2_divisions:[2:2,64:4,>:8]",
    "per_process_memory_fraction:0.5",
    "backend:native",
    "release_lock_on_cudamalloc:1",
    "pinned_use_cuda_host_register:True",
    "pinned_num_register_threads:8",
    "pinned_use_background_threads:False",
    "graph_capture_record_stream_reuse:true",
    "throw_on_cudamalloc_oom:0",
    "pinned_max_round_threshold_mb:16",
    "pinned_max_cached_size_mb:512",
]
HOSTILE_ITEMS = [
    "large_segment_size_mb:\u00b2",
    "large_segment_size_mb:0",
    "large_segment_size_mb:-3",
    "max_split_size_mb:99999999999999999999999999999",
    "roundup_power2_divisions:[256:\u00b2,>:4]",
    "roundup_power2_divisions:3",
    "garbage_collection_threshold:nan",
    "garbage_collection_threshold:\uff10.\uff15",
    "expandable_segments:\x1b[2J",
    "backend:cudaMallocAsync",
    "no_such_key:1",
    "large_segment_size_mb:6 4",
    "]]",
    "",
]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from(VALID_ITEMS), max_size=6))
def test_a_conf_torch_accepts_reads_as_it_parses(items):
    text = ",".join(items)
    assert read_alloc_conf(text) == parse_alloc_conf(text)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from(VALID_ITEMS + HOSTILE_ITEMS), max_size=6))
def test_reading_a_recorded_conf_never_refuses_and_keeps_the_items_torch_accepts(items):
    config = read_alloc_conf(",".join(items))
    valid = ",".join(item for item in items if item in VALID_ITEMS)
    assert config == dataclasses.replace(parse_alloc_conf(valid), raw=",".join(items))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from(VALID_ITEMS + HOSTILE_ITEMS), max_size=6))
def test_the_recorded_settings_count_an_item_left_out_exactly_when_torch_refuses_the_conf(items):
    text = ",".join(items)
    try:
        parse_alloc_conf(text)
        accepted = True
    except AllocatorConfigError:
        accepted = False
    left_out = recorded_settings({"PYTORCH_CUDA_ALLOC_CONF": text}).conf_items_left_out
    assert (left_out == 0) == accepted
    assert left_out <= max(1, len(items))


def test_items_left_out_of_a_recorded_conf():
    def left_out(text: str) -> int:
        return recorded_settings({"PYTORCH_CUDA_ALLOC_CONF": text}).conf_items_left_out

    assert left_out("") == left_out("large_segment_size_mb:64,") == 0  # a trailing comma: torch accepts it
    assert left_out(",large_segment_size_mb:64") == 1
    assert left_out("large_segment_size_mb:\u00b2,no_such_key:1,expandable_segments:True") == 2
    assert left_out("expandable_segments:True," + "x," * 100_000) == 1  # overlong: the whole string
    assert recorded_settings({"PYTORCH_CUDA_ALLOC_CONF": 7}).conf_items_left_out == 0  # not a str: no conf


@pytest.mark.parametrize("conf", [item for item in HOSTILE_ITEMS if item not in ("", "]]")])
def test_the_strict_parser_refuses_what_the_reader_leaves_out(conf):
    with pytest.raises(AllocatorConfigError):
        parse_alloc_conf(conf)


def test_an_overlong_conf_reads_as_defaults_in_bounded_time():
    text = "expandable_segments:True," + "x," * 100_000 + "large_segment_size_mb:64"
    assert read_alloc_conf(text) == AllocatorConfig(raw=text)


def test_an_unclosed_list_runs_to_the_end_of_the_conf():
    text = "large_segment_size_mb:64,roundup_power2_divisions:[1:2,max_split_size_mb:128"
    assert read_alloc_conf(text) == dataclasses.replace(parse_alloc_conf("large_segment_size_mb:64"), raw=text)
    with pytest.raises(AllocatorConfigError):
        parse_alloc_conf(text)


def test_the_last_of_repeated_keys_wins_as_in_torch():
    assert read_alloc_conf("large_segment_size_mb:40,large_segment_size_mb:80").large_segment_size_bytes == 80 * MiB


def test_recorded_settings_of_a_torch_entry():
    config = parse_alloc_conf("max_split_size_mb:512,expandable_segments:True,roundup_power2_divisions:[2:4,>:8],"
                              "garbage_collection_threshold:0.5,large_segment_size_mb:64")  # fmt: skip
    recorded = recorded_settings(config.settings_dict())
    assert recorded == RecordedSettings(
        raw_conf=config.raw,
        max_split_size=512 * MiB,
        expandable_segments=True,
        garbage_collection_threshold=0.5,
        roundup_power2_divisions=tuple((1 << k, 4 if k < 2 else 8) for k in range(16)),
        large_segment_size_bytes=64 * MiB,
    )
    assert division_intervals(recorded.roundup_power2_divisions) == tuple(config.roundup_power2_divisions)
    assert recorded_settings({}) == RecordedSettings()


def test_recorded_settings_of_a_hostile_entry_are_the_defaults():
    raw = {
        "PYTORCH_CUDA_ALLOC_CONF": 7,
        "max_split_size": 1 << 70,
        "garbage_collection_threshold": 1 << 2000,
        "roundup_power2_divisions": {"\u00b2": 4, "2": "4", 4: 4, "9" * 5000: 4, "8": 1 << 64, "16": 2},
    }
    assert recorded_settings(raw) == RecordedSettings(roundup_power2_divisions=((16, 2),))
    assert recorded_settings({"PYTORCH_CUDA_ALLOC_CONF": "large_segment_size_mb:\u00b2"}).large_segment_size_bytes == (
        20 * MiB
    )
    assert recorded_settings({"garbage_collection_threshold": 3}).garbage_collection_threshold == 3.0


def test_the_reader_knows_every_key_the_parser_does():
    from oomdoctor import allocator_rules

    assert {item.split(":")[0] for item in VALID_ITEMS} == allocator_rules._KEYS
    for item in VALID_ITEMS:
        parse_alloc_conf(item)
