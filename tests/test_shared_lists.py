"""Lists a pickle shares among many places, where torch writes each place its own list.

A pickle writes a shared list once and refers to it again in a few bytes, so a small file can put
one list of thousands of events, blocks, frames or lines under thousands of devices, segments,
blocks or events. Each distinct list is read once or the file is refused; the answers are those
of the same lists written apart. (tests/test_hostile_inputs.py runs such files of a megabyte or
two through the commands.)
"""

from __future__ import annotations

import pickle

import pytest

import oomdoctor.model
from oomdoctor.analysis.contents import describe
from oomdoctor.errors import LoadError
from oomdoctor.load import load
from oomdoctor.load.stacks import StackTable
from oomdoctor.model import Frame
from oomdoctor.redact import Redactor, redact_data, redact_snapshot_data, redactor_for_data
from tests.builders import BASE, MiB, make_snapshot


def _events(count: int, frames: list | None = None, **extra) -> list[dict]:
    return [
        {"action": "alloc", "addr": BASE + i * 512, "size": 512, "stream": 0, "time_us": i,
         "frames": [] if frames is None else frames, **extra}
        for i in range(count)
    ]  # fmt: skip


def _blocks(count: int, frames: list | None = None) -> list[dict]:
    return [
        {"address": BASE + i * 512, "size": 512, "requested_size": 512, "state": "active_allocated",
         "frames": [] if frames is None else frames}
        for i in range(count)
    ]  # fmt: skip


def _segment(blocks: list[dict], address: int = BASE) -> dict:
    return {"device": 0, "address": address, "total_size": 2 * MiB, "stream": 0, "segment_type": "large",
            "blocks": blocks}  # fmt: skip


def _stack(depth: int, home: str = "/home/alice") -> list[dict]:
    return [{"filename": f"{home}/src/m{i}.py", "line": i, "name": f"f{i}"} for i in range(depth)]


def test_a_trace_shared_by_two_devices_is_refused() -> None:
    events = _events(3)
    data = {"segments": [], "device_traces": [_events(2), events, [], events]}
    with pytest.raises(LoadError) as raised:
        load(pickle.dumps(data, protocol=4))
    assert "device 3's trace is the same list as device 1's (the pickle shares it)" in str(raised.value)


def test_blocks_shared_by_two_segments_are_refused() -> None:
    blocks = _blocks(2)
    segments = [_segment(_blocks(1), BASE), _segment(blocks, BASE + (1 << 30)), _segment(blocks, BASE + (2 << 30))]
    with pytest.raises(LoadError) as raised:
        load(pickle.dumps({"segments": segments, "device_traces": [[]]}, protocol=4))
    assert "segment 2's blocks are the same list as segment 1's (the pickle shares it)" in str(raised.value)
    # one segment dict listed twice shares its blocks too
    with pytest.raises(LoadError, match="segment 1's blocks are the same list as segment 0's"):
        load(pickle.dumps({"segments": [segments[1]] * 2, "device_traces": [[]]}, protocol=4))


def test_empty_lists_may_be_shared() -> None:
    """Nothing is read twice in an empty list: a pickle that shares one is read as written."""
    empty: list = []
    data = {"segments": [_segment(empty), _segment(empty, BASE + (1 << 30))], "device_traces": [empty, empty]}
    snapshot = load(pickle.dumps(data, protocol=4))
    assert [len(t) for t in snapshot.traces] == [0, 0]
    assert [len(s.blocks) for s in snapshot.segments] == [0, 0]


def test_shared_forward_frames_are_converted_once_and_read_as_written_apart() -> None:
    lines = [f'  File "/src/m.py", line {i}, in f' for i in range(5)] + [7]
    shared = _events(4, user_metadata="", forward_frames=lines)
    apart = [dict(event, forward_frames=list(lines)) for event in _events(4, user_metadata="")]
    read_shared = load(pickle.dumps({"segments": [], "device_traces": [shared]}, protocol=4)).traces[0]
    read_apart = load(pickle.dumps({"segments": [], "device_traces": [apart]}, protocol=4)).traces[0]
    assert read_shared.forward_frames == read_apart.forward_frames
    assert len(read_shared.forward_frames) == 4 and read_shared.forward_frames[0][-1] == "7"
    assert len({id(v) for v in read_shared.forward_frames.values()}) == 1
    assert len({id(v) for v in read_apart.forward_frames.values()}) == 4


@pytest.mark.parametrize("depth", [3, 100])  # keyed at every reference / once a list
def test_a_frame_list_shared_by_blocks_is_one_stack(depth) -> None:
    table = StackTable()
    frames = _stack(depth)
    first = table.stack_of(frames)
    assert table.stack_of(frames) is first
    assert table.stack_of(list(frames)) is first  # the same frames in another list: the same stack
    table.forget_lists()
    assert table.stack_of(frames) is first
    assert [f.filename for f in first] == [f"/home/alice/src/m{i}.py" for i in range(depth)]


@pytest.mark.parametrize("threshold", [0, 10**9])  # each distinct list keyed once / each event's list keyed
def test_stack_numbers_are_one_per_distinct_stack_either_way(monkeypatch, threshold) -> None:
    """The numbering's two ways (keying each event's list, or each distinct list once when the lists
    hold many frames an event) give the same stacks and the same partition of the events."""
    monkeypatch.setattr(oomdoctor.model, "KEYED_PER_REFERENCE_FRAMES", threshold)
    deep, other = _stack(80), _stack(80, "/home/bob")
    events = _events(3, deep) + _events(2, list(deep)) + _events(2, other) + _events(2) + _events(1, deep)
    trace = load(pickle.dumps({"segments": [], "device_traces": [events]}, protocol=4)).traces[0]
    indices = list(range(len(events)))
    numbers, stacks = trace.stacks_at(indices)
    assert numbers[:5] == [numbers[0]] * 5 and numbers[9] == numbers[0]  # same frames: one number
    assert numbers[5] == numbers[6] != numbers[0]
    assert numbers[7] == numbers[8] and stacks[numbers[7]] == ()
    assert len(set(numbers)) == 3
    assert [stacks[n] for n in numbers] == [trace.frames_at(i) for i in indices]
    assert stacks[numbers[0]][0] == Frame("/home/alice/src/m0.py", 0, "f0")
    again, _ = trace.stacks_at(indices[3:])  # asked again: the numbers given before
    assert again == numbers[3:]


def test_stack_kinds_read_each_stack_once_and_are_those_written_apart() -> None:
    deep = _stack(50)
    cpp = [{"filename": "??", "line": 0, "name": "at::native::empty_cuda"}]
    shared = {"segments": [_segment(_blocks(40, deep))], "device_traces": [_events(40, deep) + _events(1, cpp)]}
    apart = {
        "segments": [_segment([dict(b, frames=list(deep)) for b in _blocks(40)])],
        "device_traces": [[dict(e, frames=list(deep)) for e in _events(40)] + _events(1, list(cpp))],
    }
    kinds = [describe(load(pickle.dumps(d, protocol=4)), "x").stack_kinds for d in (shared, apart)]
    assert kinds[0] == kinds[1] == ("c++", "python")


def test_results_sharing_a_stack_are_redacted_once_alike() -> None:
    frames = tuple(Frame(f"/home/alice/src/m{i}.py", i, f"f{i}") for i in range(3))
    redactor = Redactor.learn(filenames=[f.filename for f in frames])
    walked = redactor.walk({"a": (frames, frames), "b": [frames]})
    assert walked["a"][0] is walked["a"][1] is walked["b"][0]
    assert [f.filename for f in walked["a"][0]] == [f"<project>/m{i}.py" for i in range(3)]
    assert walked == {"a": (walked["a"][0],) * 2, "b": [walked["a"][0]]}


def _sharing_dump() -> dict:
    """Lists torch writes apart shared anyway, frame lists shared as well as frames, a tuple among
    frames: whatever the rewriter meets first, once."""
    data = make_snapshot()
    deep = _stack(5)
    events = data["device_traces"][0]
    for event in events[:3]:
        event["frames"] = deep
    events[3]["frames"] = [deep[0], ("not", "a", "dict")]
    data["segments"][0]["blocks"][0]["frames"] = deep
    data["device_traces"] = [events, events[:2]]  # the same event dicts under two devices
    data["oomdoctor"] = {"argv": ["/home/alice/src/train.py"], "host": "node7"}
    return data


@pytest.mark.parametrize("make", [make_snapshot, _sharing_dump])
def test_redacting_in_one_go_writes_what_the_two_steps_write(make) -> None:
    """`redact_data` reads each column of stacks once for learning and rewriting; what it writes is
    what learning and then rewriting write apart."""
    two_steps = make()
    redact_snapshot_data(two_steps, redactor_for_data(two_steps))
    one_go = make()
    redact_data(one_go)
    assert pickle.dumps(one_go, protocol=4) == pickle.dumps(two_steps, protocol=4)
    assert b"alice" not in pickle.dumps(one_go, protocol=4)
