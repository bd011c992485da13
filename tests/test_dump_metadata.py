"""The typed metadata key (oomdoctor.dump_metadata) and its one parser (oomdoctor.load.metadata)."""

from __future__ import annotations

import copy
import pickle
from pathlib import Path

import orjson
import pytest

from oomdoctor.dump_metadata import (
    NO_METADATA,
    DeviceInfo,
    DumpMetadata,
    ExceptionInfo,
    Marker,
    MemGetInfo,
    MemoryStats,
    OomRecord,
    OptimizerKind,
    Recording,
    RegisteredTensor,
    Rehearsal,
    Versions,
)
from oomdoctor.load import freeze_builtins, load_raw
from oomdoctor.load.metadata import parse_metadata
from oomdoctor.model import FrozenDict

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "dumps"
INT64_MAX = 2**63 - 1

OOM = {
    "device": 1,
    "alloc_bytes": 20 << 20,
    "device_total_bytes": 80 << 30,
    "device_free_bytes": 3 << 20,
    "time_us": 1_700_000_000_000_123,
    "surfaced": False,
}
FULL = {
    "schema_version": 1,
    "versions": {"oomdoctor": "0.1.0", "torch": "2.13.0", "cuda": "12.8", "python": "3.11.7"},
    "host": "node7",
    "pid": 4242,
    "argv": ["train.py", "--batch-size", "64"],
    "rank": 3,
    "local_rank": 1,
    "world_size": 8,
    "device": {"index": 1, "name": "NVIDIA H100", "capability": [9, 0], "total_memory_bytes": 80 << 30},
    "mem_get_info": {"free_bytes": 3 << 20, "total_bytes": 80 << 30},
    "memory_stats": {
        "num_alloc_retries": 2,
        "num_ooms": 1,
        "inactive_split_bytes": 5,
        "allocated_bytes": 6,
        "reserved_bytes": 7,
        "active_bytes": 8,
        "peak_allocated_bytes": 9,
        "peak_reserved_bytes": 10,
        "num_device_alloc": 11,
        "num_device_free": 12,
    },
    "alloc_conf": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "CUDA_VISIBLE_DEVICES": "0,1"},
    "oom": OOM,
    "ooms_observed": [OOM, {**OOM, "surfaced": None}],
    "exception": {"type": "torch.OutOfMemoryError", "message": "CUDA out of memory.", "traceback": "Traceback..."},
    "markers": [
        {"phase": "forward", "edge": "start", "step": 0, "time_us": 10},
        {"phase": "forward", "edge": "end", "step": 0, "time_us": 20},
    ],
    "tensors": [
        {
            "address": 0x7F0000000000,
            "device": 1,
            "component": "parameter",
            "name": "fc.weight",
            "shape": [4, 8],
            "dtype": "float32",
            "size_bytes": 128,
        }
    ],
    "recording": {"max_entries": 100000, "stacks": "python", "context": "all", "started_by": "oomdoctor"},
    "reason": "oom",
    "rehearsal": {"device_memory_bytes": 24 << 30, "outside_bytes": 1 << 30, "alloc_conf": ""},
    "optimizers": 1,
    "optimizer_kinds": [{"class": "torch.optim.sgd.SGD", "moments": 0, "options": {"momentum": 0.0}}],
}


def test_every_field_is_typed():
    meta = parse_metadata(freeze_builtins(FULL))
    assert isinstance(meta, DumpMetadata)
    assert meta.schema_version == 1
    assert meta.versions == Versions(oomdoctor="0.1.0", torch="2.13.0", cuda="12.8", python="3.11.7")
    assert (meta.host, meta.pid, meta.argv) == ("node7", 4242, ("train.py", "--batch-size", "64"))
    assert (meta.rank, meta.local_rank, meta.world_size) == (3, 1, 8)
    assert meta.device == DeviceInfo(index=1, name="NVIDIA H100", capability=(9, 0), total_memory_bytes=80 << 30)
    assert meta.mem_get_info == MemGetInfo(free_bytes=3 << 20, total_bytes=80 << 30)
    assert meta.memory_stats == MemoryStats(2, 1, 5, 6, 7, 8, 9, 10, 11, 12)
    assert meta.alloc_conf == FULL["alloc_conf"] and isinstance(meta.alloc_conf, FrozenDict)
    oom = OomRecord(1, 20 << 20, 80 << 30, 3 << 20, 1_700_000_000_000_123, False)
    assert meta.oom == oom
    assert meta.ooms_observed == (oom, OomRecord(1, 20 << 20, 80 << 30, 3 << 20, 1_700_000_000_000_123, None))
    assert meta.exception == ExceptionInfo("torch.OutOfMemoryError", "CUDA out of memory.", "Traceback...")
    assert meta.markers == (Marker("forward", "start", 0, 10), Marker("forward", "end", 0, 20))
    assert meta.tensors == (RegisteredTensor(0x7F0000000000, 1, "parameter", "fc.weight", (4, 8), "float32", 128),)
    assert meta.recording == Recording(100000, "python", "all", "oomdoctor")
    assert meta.reason == "oom"
    assert meta.rehearsal == Rehearsal(24 << 30, 1 << 30, "")
    assert meta.optimizers == 1
    assert meta.optimizer_kinds == (OptimizerKind("torch.optim.sgd.SGD", 0, {"momentum": 0.0}),)
    assert isinstance(meta.optimizer_kinds[0].options, FrozenDict)
    assert meta.dropped == ()


def test_a_plain_dict_parses_like_its_frozen_copy():
    assert parse_metadata(FULL) == parse_metadata(freeze_builtins(FULL))
    assert parse_metadata(FULL).markers == parse_metadata(freeze_builtins(FULL)).markers


def test_absent_fields_are_none_or_empty():
    meta = parse_metadata({})
    assert meta is not None and meta.dropped == ()
    for name in (
        "schema_version",
        "versions",
        "host",
        "pid",
        "rank",
        "device",
        "oom",
        "recording",
        "rehearsal",
        "optimizers",
    ):
        assert getattr(meta, name) is None
    assert meta.argv == meta.markers == meta.tensors == meta.ooms_observed == meta.optimizer_kinds == ()
    assert parse_metadata({"oom": None, "exception": None, "rank": None}).dropped == ()


@pytest.mark.parametrize("raw", [None, "nope", [1, 2], 5])
def test_no_mapping_no_metadata(raw):
    assert parse_metadata(raw) is None


@pytest.mark.parametrize(
    ("key", "bad", "attribute"),
    [
        ("schema_version", "1", "schema_version"),
        ("versions", ["2.13"], "versions"),
        ("host", 7, "host"),
        ("pid", "4242", "pid"),
        ("pid", True, "pid"),
        ("pid", -1, "pid"),
        ("rank", 2.0, "rank"),
        ("local_rank", -1, "local_rank"),
        ("world_size", False, "world_size"),
        ("device", "cuda:0", "device"),
        ("mem_get_info", 3, "mem_get_info"),
        ("memory_stats", [], "memory_stats"),
        ("alloc_conf", "expandable_segments:True", "alloc_conf"),
        ("oom", [], "oom"),
        ("exception", "OOM", "exception"),
        ("recording", 100000, "recording"),
        ("reason", 7, "reason"),
        ("rehearsal", True, "rehearsal"),
        ("optimizers", "1", "optimizers"),
        ("optimizers", -1, "optimizers"),
    ],
)
def test_a_top_level_field_of_the_wrong_kind_is_dropped(key, bad, attribute):
    meta = parse_metadata({**FULL, key: bad})
    assert getattr(meta, attribute) is None
    assert meta.dropped == (key,)
    assert parse_metadata({**FULL, key: bad}).host == (None if key == "host" else "node7")  # the rest stays


@pytest.mark.parametrize(
    ("section", "key", "bad"),
    [
        ("versions", "torch", 2.13),
        ("device", "index", -1),
        ("device", "name", 0),
        ("device", "capability", [9]),
        ("device", "capability", [9, "0"]),
        ("device", "capability", "9.0"),
        ("device", "total_memory_bytes", -(1 << 30)),
        ("mem_get_info", "free_bytes", "lots"),
        ("memory_stats", "num_ooms", 1.0),
        ("oom", "device", "0"),
        ("oom", "alloc_bytes", -5),
        ("oom", "time_us", "now"),
        ("oom", "surfaced", 1),
        ("exception", "traceback", ["line"]),
        ("recording", "max_entries", True),
        ("recording", "stacks", 1),
        ("rehearsal", "outside_bytes", -1),
        ("rehearsal", "alloc_conf", {"a": "b"}),
    ],
)
def test_a_field_of_the_wrong_kind_inside_a_section_is_dropped(section, key, bad):
    meta = parse_metadata({**FULL, section: {**FULL[section], key: bad}})
    parsed = getattr(meta, section)
    assert getattr(parsed, key) is None
    assert meta.dropped == (f"{section}.{key}",)
    good = getattr(parse_metadata(FULL), section)
    others = [f for f in parsed.__slots__ if f != key]
    assert all(getattr(parsed, f) == getattr(good, f) for f in others)


def test_times_and_versions_may_be_negative_sizes_may_not():
    meta = parse_metadata(
        {"oom": {"time_us": -5, "alloc_bytes": -5}, "schema_version": -1, "markers": [{"time_us": -3}]}
    )
    assert meta.oom == OomRecord(time_us=-5)
    assert meta.schema_version == -1 and meta.markers == (Marker(time_us=-3),)
    assert meta.dropped == ("oom.alloc_bytes",)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({"pid": INT64_MAX}, INT64_MAX),
        ({"pid": INT64_MAX + 1}, None),
        ({"pid": 2**64}, None),
        ({"pid": 2**1100}, None),
    ],
)
def test_ints_outside_int64_are_dropped_by_the_parser(raw, expected):
    meta = parse_metadata(raw)
    assert meta.pid == expected
    assert meta.dropped == (() if expected is not None else ("pid",))


def test_ints_outside_int64_in_signed_fields_and_lists():
    meta = parse_metadata(
        {
            "oom": {"time_us": -(2**63) - 1},
            "markers": [{"time_us": 2**70, "phase": "forward"}],
            "tensors": [{"address": 2**64}, {"address": 1, "shape": [2**64]}],
            "device": {"capability": [2**64, 0]},
        }
    )
    assert meta.oom.time_us is None and meta.markers == (Marker(phase="forward"),)
    assert meta.tensors == (RegisteredTensor(address=1),) and meta.device.capability is None
    assert set(meta.dropped) == {
        "oom.time_us",
        "markers[].time_us",
        "tensors[].address",
        "tensors[].shape",
        "device.capability",
    }


def test_ints_outside_int64_drop_the_whole_key_with_a_note_when_loaded():
    from oomdoctor.load import load

    data = {"segments": [], "device_traces": [[]], "oomdoctor": {"host": "h", "rank": 2**64}}
    snapshot = load(pickle.dumps(data, protocol=4))
    assert snapshot.oomdoctor is None
    assert len(snapshot.notes) == 1 and "ignored" in snapshot.notes[0]


def test_lists_keep_only_entries_of_the_right_kind():
    meta = parse_metadata(
        {
            "argv": ["train.py", 3, None, "--x"],
            "markers": [1, None, {"phase": 3, "edge": "start", "time_us": "t"}, {"phase": "forward", "step": -1}],
            "ooms_observed": ["oom", {"device": 0}],
            "tensors": [None, {"address": "a"}, {"component": "parameter"}, {"address": 5, "device": "cuda:0"}],
        }
    )
    assert meta.argv == ("train.py", "--x")
    assert meta.markers == (Marker(edge="start"), Marker(phase="forward"))
    assert meta.ooms_observed == (OomRecord(device=0),)
    assert meta.tensors == ()
    assert set(meta.dropped) == {
        "argv[]",
        "markers[]",
        "markers[].phase",
        "markers[].time_us",
        "markers[].step",
        "ooms_observed[]",
        "tensors[]",
        "tensors[].address",
        "tensors[].device",
    }


@pytest.mark.parametrize("bad", ["argv", {"a": 1}, 5])
def test_a_list_of_the_wrong_kind_is_empty(bad):
    meta = parse_metadata({"argv": bad, "markers": bad, "tensors": bad, "ooms_observed": bad})
    assert meta.argv == meta.markers == meta.tensors == meta.ooms_observed == ()
    assert set(meta.dropped) == {"argv", "markers", "tensors", "ooms_observed"}


def test_a_tensor_without_device_is_kept_and_bad_optional_fields_are_dropped_alone():
    meta = parse_metadata(
        {"tensors": [{"address": 16, "component": ["x"], "name": 3, "shape": [2, -1], "dtype": 1, "size_bytes": -8}]}
    )
    assert meta.tensors == (RegisteredTensor(address=16),)
    assert set(meta.dropped) == {f"tensors[].{k}" for k in ("component", "name", "shape", "dtype", "size_bytes")}


def test_optimizer_kinds_keep_only_what_is_of_the_right_kind():
    # a stranger's file: names are data, counts bounded, settings plain numbers or flags
    meta = parse_metadata(
        {
            "optimizer_kinds": [
                "SGD",
                None,
                {"class": "<b>x</b>\x1b[31m", "moments": 2, "options": {"amsgrad": False, "lr": None, "k": 2}},
                {"class": 7, "moments": "2", "options": ["momentum", 0.9]},
                {"class": "A", "moments": -1, "options": {"momentum": "0.9", 3: 1, "x": [1], "big": 2**64}},
                {"class": "B", "moments": True},
                {"class": "C", "moments": 17},
                {"class": "D", "moments": 16, "options": {"momentum": float("nan")}},
            ]
        }
    )
    assert meta.optimizer_kinds[0] == OptimizerKind("<b>x</b>\x1b[31m", 2, {"amsgrad": False, "lr": None, "k": 2})
    assert meta.optimizer_kinds[1:5] == (
        OptimizerKind(),
        OptimizerKind("A", None, {}),
        OptimizerKind("B"),
        OptimizerKind("C"),
    )
    last = meta.optimizer_kinds[5]
    assert (last.class_name, last.moments, list(last.options)) == ("D", 16, ["momentum"])
    assert set(meta.dropped) == {
        "optimizer_kinds[]",
        "optimizer_kinds[].class",
        "optimizer_kinds[].moments",
        "optimizer_kinds[].options",
        "optimizer_kinds[].options[]",
    }
    assert parse_metadata({"optimizer_kinds": {"class": "SGD"}}).optimizer_kinds == ()
    assert parse_metadata({"optimizer_kinds": "SGD"}).dropped == ("optimizer_kinds",)


def test_alloc_conf_keeps_str_values_only():
    meta = parse_metadata({"alloc_conf": {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128", "NCCL_BUFFSIZE": 4}})
    assert meta.alloc_conf == {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128"}
    assert meta.dropped == ("alloc_conf[]",)


def test_shared_entries_are_parsed_once():
    entry = {"address": 64, "component": "parameter", "size_bytes": 8}
    meta = parse_metadata(freeze_builtins({"tensors": [entry] * 10_000}))
    assert len(meta.tensors) == 10_000 and len({id(t) for t in meta.tensors}) == 1


def test_the_parsed_metadata_is_read_only_and_pickles():
    meta = parse_metadata(freeze_builtins(FULL))
    with pytest.raises(AttributeError):
        meta.host = "other"  # type: ignore[misc]
    with pytest.raises(AttributeError):
        meta.oom.device = 0  # type: ignore[misc]
    with pytest.raises(TypeError):
        meta.alloc_conf["X"] = "y"  # type: ignore[index]
    again = pickle.loads(pickle.dumps(meta))
    assert type(again) is DumpMetadata and again.tensors == meta.tensors and again.dropped == meta.dropped
    assert copy.deepcopy(meta).markers == meta.markers


def test_no_metadata_is_empty():
    assert NO_METADATA.oom is None and NO_METADATA.tensors == () and NO_METADATA.markers == ()
    assert pickle.loads(pickle.dumps(parse_metadata(freeze_builtins(FULL)))) == parse_metadata(freeze_builtins(FULL))


@pytest.mark.parametrize("name", sorted(p.name for p in FIXTURES.glob("*.pickle")))
def test_fixture_metadata_parses_without_drops(name):
    raw = load_raw(FIXTURES / name)["oomdoctor"]
    meta = parse_metadata(freeze_builtins(raw))
    assert meta.dropped == ()
    assert meta.schema_version == 1 and meta.reason in ("oom", "manual", "peak")
    assert meta.tensors and len(meta.tensors) == len(raw["tensors"])
    assert len(meta.markers) == len(raw["markers"]) and len(meta.argv) == len(raw["argv"])


def test_a_full_fixture_dump_parses_with_every_field():
    raw = load_raw(FIXTURES / "outside-pytorch-cnn.pickle")["oomdoctor"]
    meta = parse_metadata(freeze_builtins(raw))
    assert meta.dropped == ()
    for section in ("versions", "device", "mem_get_info", "memory_stats", "oom", "exception", "recording", "rehearsal"):
        parsed = getattr(meta, section)
        assert parsed is not None, section
        for key, value in raw[section].items():
            expected = tuple(value) if isinstance(value, list) else value
            assert getattr(parsed, key) == expected, (section, key)
    assert (meta.host, meta.pid, meta.argv) == (raw["host"], raw["pid"], tuple(raw["argv"]))
    assert (meta.rank, meta.local_rank, meta.world_size) == (None, None, None)
    assert meta.alloc_conf == raw["alloc_conf"] and meta.reason == raw["reason"]
    assert meta.ooms_observed == (meta.oom,)
    for parsed, written in zip(meta.markers, raw["markers"], strict=True):
        assert parsed == Marker(**written)
    for parsed, written in zip(meta.tensors, raw["tensors"], strict=True):
        assert parsed == RegisteredTensor(**{**written, "shape": tuple(written["shape"])})


def test_load_gives_the_typed_key_and_the_raw_key_as_written():
    from oomdoctor.load import load

    data = {"segments": [], "device_traces": [[]], "oomdoctor": {**FULL, "pid": "not an int", "extra": [1, {"a": 2}]}}
    snapshot = load(pickle.dumps(data, protocol=4))
    assert snapshot.oomdoctor == parse_metadata(freeze_builtins(data["oomdoctor"]))
    assert snapshot.oomdoctor.pid is None and snapshot.oomdoctor.dropped == ("pid",) and snapshot.notes == ()
    raw = snapshot.oomdoctor_raw
    assert type(raw) is FrozenDict and raw == freeze_builtins(data["oomdoctor"])
    assert orjson.loads(orjson.dumps(raw)) == data["oomdoctor"]
    assert raw["pid"] == "not an int" and raw["extra"] == (1, {"a": 2})


def test_no_key_or_a_dropped_key_is_none_in_both_fields():
    from oomdoctor.load import load

    plain = load(pickle.dumps({"segments": [], "device_traces": [[]]}, protocol=4))
    assert plain.oomdoctor is None and plain.oomdoctor_raw is None
    bad = load(pickle.dumps({"segments": [], "device_traces": [[]], "oomdoctor": {1: "int key"}}, protocol=4))
    assert bad.oomdoctor is None and bad.oomdoctor_raw is None and bad.notes


def test_marker_words_outside_captures_vocabulary_are_dropped():
    from oomdoctor.load.metadata import parse_metadata

    parsed = parse_metadata({"markers": [
        {"phase": "\x1b[31mred", "edge": "start", "step": 0, "time_us": 1},
        {"phase": "forward", "edge": ["x"], "step": 0, "time_us": 2},
        {"phase": "backward", "edge": "end", "step": 0, "time_us": 3},
    ]})  # fmt: skip
    assert [(m.phase, m.edge) for m in parsed.markers] == [(None, "start"), ("forward", None), ("backward", "end")]
    assert parsed.dropped
