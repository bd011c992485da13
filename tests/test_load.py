"""The loader: every container and shape torch writes, the normalisations of spec §7.7, the model."""

from __future__ import annotations

import base64
import dataclasses
import gzip
import pickle
import sys

import orjson
import pytest

from oomdoctor.errors import LoadError
from oomdoctor.load import freeze_builtins, load, load_raw
from oomdoctor.model import (
    ACTIVE_PENDING_FREE,
    DEFAULT_POOL,
    NO_STACK,
    DeviceTrace,
    Frame,
    Snapshot,
    TraceEvent,
)
from tests.builders import MiB, make_snapshot, plain_oom_snapshot


def _check_contents(snapshot: Snapshot) -> None:
    (segment,) = snapshot.segments
    assert segment.total_size == 2 * MiB and segment.segment_type == "small"
    assert segment.allocated_bytes == 1024 and segment.requested_bytes == 1000
    assert segment.pool_id == DEFAULT_POOL
    trace = snapshot.traces[0]
    assert list(trace.actions) == ["segment_alloc", "alloc", "alloc", "free_requested", "free_completed", "oom"]
    oom = trace[-1]
    assert (oom.action, oom.addr, oom.size, oom.device_free, oom.time_us) == ("oom", 0, 40 * MiB, 5 * MiB, 105)
    assert trace[1].frames == (Frame("train.py", 10, "forward"), Frame("train.py", 50, "<module>"))
    assert snapshot.allocator_settings.raw_conf == "expandable_segments:False"
    assert snapshot.allocator_settings.roundup_power2_divisions == ((1, 0), (2, 4))
    assert snapshot.allocator_settings.extra["release_lock_on_cudamalloc"] is False
    assert [a.stage for a in snapshot.annotations] == ["START", "END"]


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_pickle_protocols(tmp_path, protocol: int) -> None:
    path = tmp_path / "snapshot.pickle"
    path.write_bytes(pickle.dumps(make_snapshot(), protocol=protocol))
    snapshot = load(path)
    _check_contents(snapshot)
    assert snapshot.container == f"pickle-protocol-{protocol}"


def test_old_pickle_protocols_and_bytes_and_file_objects(tmp_path) -> None:
    for protocol in (0, 1):
        _check_contents(load(pickle.dumps(make_snapshot(), protocol=protocol)))
    path = tmp_path / "snapshot.pickle"
    path.write_bytes(pickle.dumps(make_snapshot(), protocol=4))
    with open(path, "rb") as handle:
        _check_contents(load(handle))
    _check_contents(load(str(path)))


def test_gzip_and_pickle_named_json(tmp_path) -> None:
    gz = tmp_path / "snapshot.pickle.gz"
    gz.write_bytes(gzip.compress(pickle.dumps(make_snapshot(), protocol=4)))
    snapshot = load(gz)
    _check_contents(snapshot)
    assert snapshot.container == "gzip+pickle-protocol-4"
    named_json = tmp_path / "memory_snapshot.json"
    named_json.write_bytes(pickle.dumps(make_snapshot(), protocol=4))
    assert load(named_json).container == "pickle-protocol-4"


def test_real_json_snapshot_pool_ids_as_lists(tmp_path) -> None:
    data = make_snapshot()
    private = dict(data["segments"][0], address=0x7E0000000000, segment_pool_id=(1, 2), blocks=[])
    private["blocks"] = [dict(b, address=b["address"] - 0x10000000000) for b in data["segments"][0]["blocks"]]
    data["segments"].append(private)
    for event in data["device_traces"][0]:
        event["pool_id"] = (0, 0)
    path = tmp_path / "snapshot.json"
    path.write_bytes(b"\n  " + orjson.dumps(data))  # tuples become lists, frames are no longer shared
    snapshot = load(path)
    assert snapshot.container == "json"
    assert snapshot.segments[0].pool_id == (0, 0) and snapshot.segments[1].pool_id == (1, 2)
    assert snapshot.traces[0][0].pool_id == (0, 0) and isinstance(snapshot.traces[0][0].pool_id, tuple)
    # frames are deduplicated by value when the file shares nothing
    trace = snapshot.traces[0]
    assert trace.frames_at(1)[0] is trace.frames_at(2)[0]
    gz = tmp_path / "snapshot.json.gz"
    gz.write_bytes(gzip.compress(path.read_bytes()))
    assert load(gz).container == "gzip+json"


def test_memory_viz_html_export_written_by_torch(tmp_path) -> None:
    memory_viz = pytest.importorskip("torch.cuda._memory_viz")
    path = tmp_path / "export.html"
    path.write_text(memory_viz._format_viz(make_snapshot(), "Active Memory Timeline", None))
    snapshot = load(path)
    _check_contents(snapshot)
    assert snapshot.container.startswith("html+pickle-protocol-")


def test_html_without_a_snapshot_is_refused(tmp_path) -> None:
    path = tmp_path / "page.html"
    path.write_text("<!DOCTYPE html><html><body>hello</body></html>")
    with pytest.raises(LoadError, match="without an embedded snapshot"):
        load(path)
    path.write_text('<html><script>const f = [{"name": "x", "base64": "%s"}]</script>'
                    % base64.b64encode(b"\x80\x04K\x05.").decode())  # fmt: skip
    with pytest.raises(LoadError, match="wrong structure"):
        load(path)


def test_bare_segment_list() -> None:
    data = make_snapshot()
    snapshot = load(pickle.dumps(data["segments"], protocol=4))
    assert snapshot.source_format == "segment-list"
    assert snapshot.traces == () and len(snapshot.segments) == 1
    assert snapshot.allocator_settings is None


def test_torch20_history_blocks_without_addresses() -> None:
    base = 0x7F0000000000
    frames = [{"filename": "model.py", "line": 3, "name": "allocate"}]
    data = {
        "segments": [
            {
                "device": 0, "address": base, "total_size": 4096, "allocated_size": 3072, "active_size": 3072,
                "requested_size": 3000, "stream": 0, "segment_type": "small",
                "blocks": [
                    {"size": 3072, "requested_size": 3072, "state": "active_allocated",
                     "history": [{"addr": base, "real_size": 3000, "frames": frames}]},
                    {"size": 1024, "requested_size": 0, "state": "inactive"},
                ],
            }
        ],
        "device_traces": [[{"action": "snapshot", "addr": 0, "size": 3072, "stream": 0}]],
    }  # fmt: skip
    snapshot = load(pickle.dumps(data, protocol=4))
    assert snapshot.source_format == "legacy-history"
    first, second = snapshot.segments[0].blocks
    assert (first.address, first.requested_size, first.frames[0].name) == (base, 3000, "allocate")
    assert (second.address, second.frames) == (base + 3072, NO_STACK)
    assert snapshot.traces[0][0].time_us is None and snapshot.traces[0].times_us is None


def test_variants_of_spec_7_7_are_normalised() -> None:
    data = make_snapshot()
    data["segments"][0]["blocks"][1]["state"] = "active_awaiting_free"
    data["segments"][0]["segment_pool_id"] = [0, 0]
    events = data["device_traces"][0]
    del events[1]["frames"]
    del events[2]["time_us"]
    snapshot = load(pickle.dumps(data, protocol=4))
    assert snapshot.segments[0].blocks[1].state == ACTIVE_PENDING_FREE
    assert snapshot.segments[0].pending_free_bytes == 2 * MiB - 1024
    assert snapshot.segments[0].pool_id == (0, 0)
    trace = snapshot.traces[0]
    assert trace[1].frames == NO_STACK and not trace.has_frames_at(1)
    assert trace[2].time_us is None and trace[3].time_us == 103
    assert trace[5].addr == 0  # oom events have no addr


def test_missing_optional_keys_are_absent_not_invented() -> None:
    snapshot = load(pickle.dumps({"segments": [], "device_traces": [[], []]}, protocol=4))
    assert snapshot.traces[0] == () or len(snapshot.traces[0]) == 0
    assert snapshot.allocator_settings is None and snapshot.annotations == () and snapshot.oomdoctor is None
    assert snapshot.devices == ()


def test_device_trace_is_a_sequence_of_events() -> None:
    trace = load(pickle.dumps(make_snapshot(), protocol=4)).traces[0]
    events = list(trace)
    assert len(events) == len(trace) == 6
    assert events[-1] == trace[-1] == trace[5]
    assert trace[1:3] == (events[1], events[2])
    assert all(isinstance(e, TraceEvent) for e in events)
    with pytest.raises(IndexError):
        trace[6]
    rebuilt = DeviceTrace.from_events(0, events)
    assert list(rebuilt) == events and rebuilt.device_free == {5: 5 * MiB}


def test_frames_are_shared_not_copied() -> None:
    trace = load(pickle.dumps(make_snapshot(), protocol=4)).traces[0]
    assert trace.frames_at(0) is trace.frames_at(1)  # same raw frames list content: one tuple
    assert trace.frames_at(2)[0] is trace.frames_at(1)[0]  # the shared frame dict: one Frame
    assert trace.events_with_frames == 6


def test_times_for_bisecting_are_the_times_when_every_event_has_one() -> None:
    raw = make_snapshot()
    trace = load(pickle.dumps(raw, protocol=4)).traces[0]
    assert trace.times_us is not None and None not in trace.times_us
    assert trace.times_or_zero() is trace.times_us  # the loader proved every time an int: nothing to fill
    raw["device_traces"][0][2]["time_us"] = None  # one event without a time
    gappy = load(pickle.dumps(raw, protocol=4)).traces[0]
    filled = gappy.times_or_zero()
    assert gappy.times_us[2] is None and filled[2] == 0
    assert [t for i, t in enumerate(filled) if i != 2] == [t for i, t in enumerate(gappy.times_us) if i != 2]
    assert gappy.times_or_zero() is filled  # made once
    rebuilt = DeviceTrace.from_events(0, list(gappy))
    assert list(rebuilt.times_or_zero()) == filled
    assert DeviceTrace.from_events(0, list(trace)).times_or_zero() == trace.times_us


@pytest.mark.parametrize(
    ("key", "value", "said"),
    [
        ("size", "1024", "segment 0 block 1 'size' is a str, not an int"),
        ("size", True, "segment 0 block 1 'size' is a bool, not an int"),
        ("address", 2**64, "segment 0 block 1 'address' does not fit in 64 bits"),
        ("requested_size", 1.5, "segment 0 block 1 'requested_size' is a float, not an int"),
        ("state", 3, "segment 0 block 1 'state' is a int, not a str"),
        ("history", {}, "segment 0 block 1 'history' is a dict, not a list"),
    ],
)
def test_a_bad_block_is_named_by_its_segment_and_number(key, value, said) -> None:
    raw = make_snapshot()
    block = raw["segments"][0]["blocks"][1]
    block[key] = value
    if key == "history":
        del block["frames"]
    with pytest.raises(LoadError) as refused:
        load(pickle.dumps(raw, protocol=4))
    assert said in str(refused.value)
    raw["segments"][0]["blocks"][1] = ["not", "a", "dict"]
    with pytest.raises(LoadError, match="segment 0 block 1 is a list, not a dict"):
        load(pickle.dumps(raw, protocol=4))


def test_actions_are_interned() -> None:
    trace = load(orjson.dumps(make_snapshot())).traces[0]
    assert trace.actions[1] is trace.actions[2] is sys.intern("alloc")


def test_oomdoctor_metadata_passes_through_read_only() -> None:
    data = make_snapshot()
    data["oomdoctor"] = {"schema_version": 1, "versions": {"torch": "2.13.0"}, "markers": [{"phase": "forward"}]}
    snapshot = load(pickle.dumps(data, protocol=4))
    assert snapshot.oomdoctor.versions.torch == "2.13.0"
    assert snapshot.oomdoctor.markers[0].phase == "forward"
    raw = snapshot.oomdoctor_raw  # the key as written
    assert raw["versions"]["torch"] == "2.13.0"
    assert raw["markers"][0]["phase"] == "forward"
    assert isinstance(raw["markers"], tuple) and isinstance(raw, dict)
    with pytest.raises(TypeError):
        raw["schema_version"] = 2  # type: ignore[index]
    with pytest.raises(TypeError):
        raw["versions"].update(torch="2.0")
    with pytest.raises(AttributeError):
        snapshot.oomdoctor.versions.torch = "2.0"  # type: ignore[misc]
    assert orjson.loads(orjson.dumps(raw)) == data["oomdoctor"]


@pytest.mark.parametrize("bad", ["not a dict", [1, 2], {"a": {1, 2}}, {1: "int key"}])
def test_malformed_oomdoctor_metadata_is_ignored(bad) -> None:
    data = make_snapshot()
    data["oomdoctor"] = bad
    assert load(pickle.dumps(data, protocol=4)).oomdoctor is None


def test_self_containing_metadata_is_ignored() -> None:
    data = make_snapshot()
    loop: dict = {"schema_version": 1}
    loop["self"] = loop
    data["oomdoctor"] = loop
    assert load(pickle.dumps(data, protocol=4)).oomdoctor is None


def test_size_cap_names_the_limit_and_how_to_raise_it(tmp_path, monkeypatch) -> None:
    path = tmp_path / "snapshot.pickle"
    path.write_bytes(pickle.dumps(make_snapshot(), protocol=4))
    with pytest.raises(LoadError, match=r"larger than the 100 bytes limit.*--max-bytes.*OOMDOCTOR_MAX_BYTES"):
        load(path, max_bytes=100)
    monkeypatch.setenv("OOMDOCTOR_MAX_BYTES", "1KiB")
    with pytest.raises(LoadError, match="1 KiB limit"):
        load(path)
    _check_contents(load(path, max_bytes=10**6))


def test_size_cap_counts_decompressed_bytes(tmp_path) -> None:
    data = make_snapshot()
    data["padding"] = "x" * 10**6
    path = tmp_path / "bomb.pickle.gz"
    path.write_bytes(gzip.compress(pickle.dumps(data, protocol=4)))
    assert path.stat().st_size < 100_000
    with pytest.raises(LoadError, match="decompressed data is larger than"):
        load(path, max_bytes=100_000)
    assert load(path, max_bytes=2 * 10**6).segments


def test_load_raw_returns_plain_data() -> None:
    raw = load_raw(gzip.compress(pickle.dumps(make_snapshot(), protocol=4)))
    assert raw["segments"][0]["segment_pool_id"] == (0, 0)
    assert raw["device_traces"][0][1]["action"] == "alloc"


def test_trace_of_a_device_without_a_trace_is_empty() -> None:
    snapshot = load(pickle.dumps(make_snapshot()["segments"], protocol=4))
    assert len(snapshot.trace_of(0)) == 0 and snapshot.trace_of(0).device == 0
    snapshot = load(pickle.dumps(make_snapshot(), protocol=4))
    assert snapshot.trace_of(0) is snapshot.traces[0]


def test_a_snapshot_pickles_for_other_processes() -> None:
    snapshot = load(pickle.dumps(make_snapshot(), protocol=4))
    copied = pickle.loads(pickle.dumps(snapshot))
    assert copied.segments == snapshot.segments
    assert list(copied.traces[0]) == list(snapshot.traces[0])
    assert copied.traces[0].device_free == {5: 5 * MiB}
    assert copied.allocator_settings == snapshot.allocator_settings


def test_device_view() -> None:
    device = load(pickle.dumps(make_snapshot(), protocol=4)).device(0)
    assert (device.index, len(device.segments), len(device.trace)) == (0, 1, 6)
    assert (device.reserved_bytes, device.allocated_bytes, device.requested_bytes) == (2 * MiB, 1024, 1000)


def test_forward_frames_and_newer_event_keys() -> None:
    data = make_snapshot()
    for event in data["device_traces"][0]:
        event.update(compile_context="N/A", user_metadata="", pool_id=(0, 0))
    data["device_traces"][0][2]["forward_frames"] = ['  File "model.py", line 3, in forward']
    data["allocator_settings"]["graph_capture_record_stream_reuse"] = False
    snapshot = load(pickle.dumps(data, protocol=4))
    trace = snapshot.traces[0]
    assert trace.forward_frames == {2: ('  File "model.py", line 3, in forward',)}
    assert trace[1].compile_context == "N/A" and trace[1].user_metadata == "" and trace[1].pool_id == (0, 0)
    assert snapshot.torch_version_hint == "2.12"


def test_bad_max_bytes_setting_is_one_line(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("OOMDOCTOR_MAX_BYTES", "plenty")
    with pytest.raises(LoadError, match="OOMDOCTOR_MAX_BYTES: not a size"):
        load(pickle.dumps(make_snapshot(), protocol=4))


def _conf_snapshot(conf: str) -> dict:
    """plain_oom_snapshot with a 3 MiB + 7 request that comes and goes, an OOM for 3 MiB and `conf`
    recorded as torch records it (with the divisions table of 4 up to 4 MiB, then 8)."""
    data = plain_oom_snapshot()
    trace = data["device_traces"][0]
    trace[2:2] = [
        {"action": action, "addr": 0x9000000, "size": 3 * MiB + 7, "stream": 0, "time_us": 2}
        for action in ("alloc", "free_requested", "free_completed")
    ]
    trace[-1]["size"] = 3 * MiB
    data["allocator_settings"] = {
        "PYTORCH_CUDA_ALLOC_CONF": conf, "expandable_segments": False, "max_split_size": -1,
        "roundup_power2_divisions": {str(1 << k): 4 if k < 2 else 8 for k in range(16)},
    }  # fmt: skip
    return data


def test_allocator_settings_reach_analysis_typed_by_the_loader() -> None:
    from oomdoctor.analysis import analyse, replayer

    snapshot = load(pickle.dumps(_conf_snapshot("large_segment_size_mb:64,roundup_power2_divisions:[2:4,>:8]")))
    settings = snapshot.allocator_settings
    assert settings.large_segment_size_bytes == 64 * MiB and snapshot.notes == ()
    assert settings.rounding_divisions == tuple((1 << k, 4 if k < 2 else 8) for k in range(16))
    assert analyse(snapshot).accounting.message_bytes == 64 * MiB  # "Tried to allocate": a large segment
    live = {entry.alloc_index: entry.size_bytes for entry in replayer(snapshot, 0).state_at(2).live}
    assert live[2] == 3 * MiB + 512 * 1024  # rounded to the next of 4 divisions in [2, 4) MiB
    # analysis reads the typed fields, never the conf string: the same text with the default field
    untyped = dataclasses.replace(settings, large_segment_size_bytes=20 * MiB, roundup_power2_divisions=())
    plain = dataclasses.replace(snapshot, allocator_settings=untyped)
    assert analyse(plain).accounting.message_bytes == 20 * MiB
    assert {e.alloc_index: e.size_bytes for e in replayer(plain, 0).state_at(2).live}[2] == 3 * MiB + 512


def test_a_malformed_alloc_conf_is_a_loader_note_not_an_analysis_error() -> None:
    from oomdoctor.analysis import analyse
    from oomdoctor.load.convert import ALLOC_CONF_ITEMS_LEFT_OUT_NOTE

    conf = "large_segment_size_mb:\u00b2,roundup_power2_divisions:[2:3],no_such_key:1,expandable_segments:True"
    snapshot = load(pickle.dumps(_conf_snapshot(conf)))
    assert snapshot.notes == (ALLOC_CONF_ITEMS_LEFT_OUT_NOTE.format(items="3 items"),)
    assert snapshot.allocator_settings.raw_conf == conf  # kept as recorded, for showing
    assert snapshot.allocator_settings.large_segment_size_bytes == 20 * MiB  # the default stands
    assert analyse(snapshot).accounting.message_bytes == 20 * MiB


def test_stacks_at_numbers_each_distinct_stack_once_and_keeps_the_numbers():
    shared = [
        {"filename": "model.py", "line": 3, "name": "forward"},
        {"filename": "train.py", "line": 9, "name": "main"},
    ]
    other = [{"filename": "train.py", "line": 12, "name": "main"}]

    def event(frames):
        return {"action": "alloc", "addr": 512, "size": 512, "stream": 0, "frames": frames}

    events = [event(list(shared)), event(list(other)), event(list(shared)), event([]), event(list(shared))]
    raw = {"segments": [], "device_traces": [events]}
    trace = load(pickle.dumps(raw)).traces[0]
    numbers, stacks = trace.stacks_at([0, 1, 2, 3])
    assert numbers[0] == numbers[2] != numbers[1] != numbers[3]
    assert stacks[numbers[0]] == trace.frames_at(0) and stacks[numbers[0]] is trace.frames_at(2)
    assert stacks[numbers[3]] == ()
    again, _ = trace.stacks_at([4, 2, 1])  # a later call gives the same numbers
    assert again == [numbers[0], numbers[0], numbers[1]]


def test_stacks_of_one_actions_events_are_made_once_and_agree_with_any_other_call():
    first = [{"filename": "model.py", "line": 3, "name": "forward"}]
    second = [{"filename": "train.py", "line": 12, "name": "main"}]

    def event(action, frames):
        return {"action": action, "addr": 512, "size": 512, "stream": 0, "frames": frames}

    events = [event("alloc", list(first)), event("free_requested", list(second)), event("alloc", list(second))]
    events.append(event("alloc", list(first)))
    trace = load(pickle.dumps({"segments": [], "device_traces": [events]})).traces[0]
    allocs = trace.positions("alloc")
    numbers, stacks = trace.stacks_at(allocs)
    assert trace.stacks_at(allocs)[0] is numbers  # made once: the allocations' stacks are asked for often
    assert trace.stacks_at(list(allocs)) == (numbers, stacks)  # any other list of them: the same answer
    assert numbers[0] == numbers[2] != numbers[1]
    assert stacks[numbers[1]] == trace.frames_at(2) == trace.stacks_at([1])[1][trace.stacks_at([1])[0][0]]


def test_oomdoctor_load_stays_callable_after_the_load_subpackage_is_imported():
    """`import oomdoctor; oomdoctor.load(path)`: importing `oomdoctor.load` (the analysis and the
    views do) rebinds the package attribute to the subpackage; the call must still load."""
    import importlib

    import oomdoctor
    from oomdoctor.examples import EXAMPLE_DUMP

    importlib.import_module("oomdoctor.load")
    snapshot = oomdoctor.load(EXAMPLE_DUMP)
    assert snapshot.segments and oomdoctor.load(EXAMPLE_DUMP.read_bytes()).segments == snapshot.segments


def _trace_of(events: list[dict]) -> DeviceTrace:
    return load(pickle.dumps({"segments": [], "device_traces": [events]}, protocol=4)).traces[0]


def _event(action: str, **keys: object) -> dict:
    return {"action": action, "size": 512, "stream": 0, "frames": [], **keys}


@pytest.mark.parametrize("runs", [1, 3, 1100])  # up to and beyond the oom events read in runs between them
def test_oom_events_read_their_addr_where_they_have_one(runs: int) -> None:
    events = []
    for run in range(runs):
        events += [_event("alloc", addr=4096 * run + 512), _event("oom"), _event("oom", addr=None)]
        events += [_event("oom", addr=4096 * run + 1024), _event("free_requested", addr=4096 * run + 512)]
    trace = _trace_of(events)
    expected = []
    for run in range(runs):
        expected += [4096 * run + 512, 0, 0, 4096 * run + 1024, 4096 * run + 512]
    assert trace.addrs == tuple(expected)
    assert len(trace.addrs) == len(trace.actions) == 5 * runs


def test_an_addr_missing_beside_an_oom_event_reads_as_zero() -> None:
    trace = _trace_of([_event("alloc", addr=512), _event("oom"), _event("alloc"), _event("oom", addr=1024)])
    assert trace.addrs == (512, 0, 0, 1024)


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ("x", "device 0 trace event 1: 'addr' is a str"),
        (True, "device 0 trace event 1: 'addr' is a bool"),
        (2**64, "device 0 trace event 1: 'addr' does not fit in 64 bits"),
    ],
)
def test_a_bad_addr_on_an_oom_event_is_refused(bad: object, message: str) -> None:
    with pytest.raises(LoadError, match=message):
        _trace_of([_event("alloc", addr=512), _event("oom", addr=bad), _event("free_requested", addr=512)])


def test_addrs_beside_oom_events_keep_0_and_1_and_refuse_bools() -> None:
    oom, alloc = _event("oom"), _event("alloc", addr=512)
    assert _trace_of([_event("alloc", addr=1), oom, _event("alloc", addr=0), oom]).addrs == (1, 0, 0, 0)
    assert _trace_of([oom, oom]).addrs == (0, 0)
    for events, at in [
        ([alloc, oom, _event("alloc", addr=False), alloc], 2),
        ([_event("alloc", addr=True), oom], 0),
        ([alloc, oom, alloc, _event("oom", addr=False)], 3),
    ]:
        with pytest.raises(LoadError, match=f"device 0 trace event {at}: 'addr' is a bool"):
            _trace_of(events)


def test_one_text_value_in_many_objects_is_one_interned_object() -> None:
    data = make_snapshot()
    for event in data["device_traces"][0]:
        event["compile_context"] = "N/A"
    trace = load(orjson.dumps(data)).traces[0]  # JSON: a str object per event
    assert trace.compile_contexts == ("N/A",) * len(trace)
    assert all(value is sys.intern("N/A") for value in trace.compile_contexts)


@pytest.mark.parametrize("at", ["dict", "list"])
def test_frozen_metadata_keeps_int64_leaves_and_refuses_wider_ones(at: str) -> None:
    def holding(value: object) -> dict:
        return {"x": value, "y": [1, 2.5, None, True]} if at == "dict" else {"x": [0, value, "s"]}

    for fits in (2**63 - 1, -(2**63)):
        frozen = freeze_builtins(holding(fits))
        assert frozen is not None and orjson.loads(orjson.dumps(frozen)) == holding(fits)
    for wide in (2**63, -(2**63) - 1, 2**64):
        assert freeze_builtins(holding(wide)) is None


def test_frozen_metadata_counts_every_leaf_against_the_expansion_limit(monkeypatch) -> None:
    import oomdoctor.load.convert as convert

    monkeypatch.setattr(convert, "FREEZE_MAX_EXPANDED", 100)
    # a list costs 1 and each item its own cost: 1 a scalar, 1 more per 64 characters of a str;
    # a dict costs 1 and each item its value's cost, 1, and 1 more per 64 characters of its key
    assert freeze_builtins({"k": [7] * 97}) is not None  # 1 + (1 + 97) + 1 = 100
    assert freeze_builtins({"k": [7] * 98}) is None
    assert freeze_builtins({"k": [None, 1.5, True] * 32 + ["a" * 63]}) is not None  # 1 + (1 + 96 + 1) + 1
    assert freeze_builtins({"k": [None, 1.5, True] * 32 + ["a" * 64]}) is None
    assert freeze_builtins({f"k{i:02}": "v" for i in range(49)}) is not None  # 1 + 49 * 2
    assert freeze_builtins({f"k{i:02}": "v" for i in range(50)}) is None
    assert freeze_builtins({f"k{i:02}": "v" * 64 for i in range(33)}) is not None  # 1 + 33 * 3
    assert freeze_builtins({f"k{i:02}": "v" * 64 for i in range(34)}) is None
    assert freeze_builtins({"k" * 62 + f"{i:02}": 1.5 for i in range(33)}) is not None  # 1 + 33 * 3
    assert freeze_builtins({"k" * 62 + f"{i:02}": 1.5 for i in range(34)}) is None
    shared = ["s"] * 9  # costs 10 at each of its references
    assert freeze_builtins({"k": [shared] * 9}) is not None  # 1 + (1 + 90) + 1 = 93
    assert freeze_builtins({"k": [shared] * 10}) is None


@pytest.mark.parametrize("key", ["size", "addr", "time_us", "stream"])
def test_int_columns_take_every_int64_and_refuse_the_first_bad_value_by_kind_before_range(key: str) -> None:
    def events(*values: object) -> list[dict]:
        made = [_event("alloc", addr=4096, time_us=7) for _ in values]
        for event, value in zip(made, values):
            event[key] = value
        return made

    column = "times_us" if key == "time_us" else f"{key}s"
    assert getattr(_trace_of(events(2**63 - 1, -(2**63), 0, 1, 5)), column) == (2**63 - 1, -(2**63), 0, 1, 5)
    for values, message in [
        ((5, 2**63, 7), "event 1: '{key}' does not fit in 64 bits"),
        ((5, 6, -(2**63) - 1), "event 2: '{key}' does not fit in 64 bits"),
        ((5, True, 7), "event 1: '{key}' is a bool"),
        ((5, 6, False), "event 2: '{key}' is a bool"),
        ((2**64, 6, False), "event 2: '{key}' is a bool"),  # a wrong kind is named before a wrong range
        ((2**64, 1.0, 7), "event 1: '{key}' is a float"),
        ((5, 0.0, 7), "event 1: '{key}' is a float"),
        ((5, 6, "7"), "event 2: '{key}' is a str"),
    ]:
        with pytest.raises(LoadError, match=f"device 0 trace {message.format(key=key)};"):
            _trace_of(events(*values))


def test_a_stream_column_of_zeros_is_told_from_false_and_float_zeros() -> None:
    def streams(*values: object) -> list[dict]:
        return [_event("alloc", addr=512, stream=value) for value in values]

    assert _trace_of(streams(0, 0, 0)).streams == (0, 0, 0)
    assert _trace_of(streams(0, None, 0)).streams == (0, 0, 0)
    assert _trace_of(streams(0, 7, 0)).streams == (0, 7, 0)
    for values, message in [
        ((0, False, 0), "event 1: 'stream' is a bool"),
        ((0, 0, 0.0), "event 2: 'stream' is a float"),
    ]:
        with pytest.raises(LoadError, match=f"device 0 trace {message};"):
            _trace_of(streams(*values))


@pytest.mark.parametrize(
    ("fill", "bad"),
    [
        ([0] * 5000, False),  # more 0s than are typed one by one
        ([1] * 5000, True),
        ([1, 0] * 2500, False),
        ([512, 2**21] * 2000, False),  # 0 bytes across words: searching for a stored 0 gives up
        ([2**8, 512] * 2000, True),  # and so for a stored 1
        ([7] * 100, True),
        ([2**21] * 3000, False),
    ],
)
def test_a_bool_among_many_ints_is_found_however_the_ints_are_stored(fill: list[int], bad: bool) -> None:
    events = [_event("alloc", addr=512, size=value) for value in fill]
    assert _trace_of(events).sizes == tuple(fill)
    for at in (0, len(fill) // 2, len(fill)):
        with pytest.raises(LoadError, match=f"device 0 trace event {at}: 'size' is a bool"):
            _trace_of([*events[:at], _event("alloc", addr=512, size=bad), *events[at:]])


@pytest.mark.parametrize(
    ("device", "time_us", "message"),
    [
        ("0", 5, "annotation 1 'device' is a str, not an int"),
        (True, 5, "annotation 1 'device' is a bool, not an int"),
        (2**63, 5, "annotation 1 'device' does not fit in 64 bits"),
        (0, None, "annotation 1 'time_us' is a None, not an int"),
        (0, -(2**63) - 1, "annotation 1 'time_us' does not fit in 64 bits"),
        ("0", 2**64, "annotation 1 'device' is a str, not an int"),
    ],
)
def test_an_annotation_with_a_bad_device_or_time_is_refused(device: object, time_us: object, message: str) -> None:
    data = make_snapshot()
    data["external_annotations"][1].update(device=device, time_us=time_us)
    with pytest.raises(LoadError, match=f"input: wrong structure: {message};"):
        load(pickle.dumps(data, protocol=4))
    data["external_annotations"][1].update(device=2**63 - 1, time_us=-(2**63))
    assert load(pickle.dumps(data, protocol=4)).annotations[1].time_us == -(2**63)
