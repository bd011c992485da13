"""`analyser(snapshot)`: one device read and replayed once, any number of its moments judged from it.
Each moment's judgement is what `analyse(snapshot, at_event=...)` gives on a snapshot of its own;
the device (and each other device) is read once however many moments are judged; the commands
that judge several moments (diff, a folder's ranks, a plan) read it once."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

import oomdoctor.analysis as analysis_module
import oomdoctor.analysis.devices as devices_module
from oomdoctor import pipeline
from oomdoctor.analysis import analyse, analyser
from oomdoctor.load import load
from oomdoctor.views import json_report
from tests.test_devices import imbalanced

DUMPS = Path(__file__).resolve().parent.parent / "fixtures" / "dumps"
FIXTURES = (
    "optimizer-state-buildup-gpt-adamw",  # an OOM
    "no-oom-gpt-adamw",  # a peak, no OOM
    "fragmentation-gpt-bucketed-lengths",
)


def as_json(result) -> str:
    return json.dumps(json_report.to_dict(result), sort_keys=True)


def moments_of(result) -> list[int | None]:
    """The default moment, the peak, each step's last event, and a few events spread over the trace."""
    count = result.replay.event_count
    chosen: list[int | None] = [None, result.replay.peak_index]
    chosen += [step.last_index for step in result.steps][:4]
    chosen += [0, count // 3, count // 2, count - 1]
    return list(dict.fromkeys(chosen))


@pytest.mark.parametrize("name", FIXTURES)
def test_each_moment_is_what_analyse_gives(name):
    path = DUMPS / f"{name}.pickle"
    judge = analyser(load(path))
    moments = moments_of(judge.analyse())
    assert len(moments) >= 5
    for at_event in moments:
        alone = analyse(load(path), at_event=at_event)  # a snapshot of its own: nothing shared
        assert as_json(judge.analyse(at_event)) == as_json(alone), at_event


def test_a_moment_asked_again_is_the_same_judgement():
    judge = analyser(load(DUMPS / "no-oom-gpt-adamw.pickle"))
    first = judge.analyse()
    assert judge.analyse() is first
    assert judge.analyse(3) is judge.analyse(3)
    assert judge.analyse(3) is not first


def counting(monkeypatch, module, name: str) -> list[int]:
    calls: list[int] = []
    original = getattr(module, name)

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return calls


def test_the_device_is_read_and_replayed_once_for_every_moment(monkeypatch):
    reads = counting(monkeypatch, analysis_module, "read_device")
    replays = counting(monkeypatch, analysis_module, "replay")
    judge = analyser(load(DUMPS / "optimizer-state-buildup-gpt-adamw.pickle"))
    for at_event in moments_of(judge.analyse()):
        judge.analyse(at_event)
    assert (len(reads), len(replays)) == (1, 1)
    analyse(judge.snapshot, at_event=5)  # analyse alone reads it again: nothing is kept between calls
    assert (len(reads), len(replays)) == (2, 2)


def test_other_devices_are_read_once_and_judged_at_each_moment(monkeypatch):
    peer_reads = counting(monkeypatch, devices_module, "read_device")
    snapshot = imbalanced()
    judge = analyser(snapshot)
    assert judge.device == 1
    count = judge.analyse().replay.event_count
    moments = [None, 0, count // 2, count - 1]
    for at_event in moments:
        judge.analyse(at_event)
    assert len(peer_reads) == 1  # device 0, once
    for at_event in moments:
        alone = analyse(imbalanced(), at_event=at_event)
        assert alone.device_summaries and as_json(judge.analyse(at_event)) == as_json(alone)


def test_a_diff_of_two_steps_reads_its_file_once(monkeypatch):
    reads = counting(monkeypatch, analysis_module, "read_device")
    path = DUMPS / "optimizer-state-buildup-gpt-adamw.pickle"
    steps = [step.step for step in analyse(load(path)).steps]
    assert len(steps) >= 2
    reads.clear()
    diff = pipeline.diff_steps(str(path), steps[0], steps[-1])
    assert len(reads) == 1
    assert diff.a.label == f"step {steps[0]}" and diff.b.label == f"step {steps[-1]}"


def test_a_diff_of_two_files_reads_each_once(monkeypatch):
    reads = counting(monkeypatch, analysis_module, "read_device")
    pipeline.diff_files(str(DUMPS / "no-oom-gpt-adamw.pickle"), str(DUMPS / "optimizer-state-buildup-gpt-adamw.pickle"))
    assert len(reads) == 2


def test_the_dumps_live_blocks_are_gathered_once(monkeypatch):
    reading_module = importlib.import_module("oomdoctor.analysis.reading")
    replay_module = importlib.import_module("oomdoctor.analysis.replay")  # (the package's `replay` is a function)

    gathered = counting(monkeypatch, reading_module, "final_live_blocks")
    again = counting(monkeypatch, replay_module, "final_live_blocks")
    snapshot = load(DUMPS / "fragmentation-gpt-bucketed-lengths.pickle")
    dump = reading_module.read_device(snapshot, snapshot.oomdoctor, 0)
    state = reading_module.replay(dump, 480)
    assert (len(gathered), len(again)) == (1, 0)
    assert state.history.final_blocks is dump.final_blocks and dump.final_blocks
    walked = replay_module.walk(dump.trace, dump.segments, dump.spans, None, lambda address, size: 0, 8, 0)
    assert len(again) == 1 and walked.history.final_blocks == dump.final_blocks  # without them, walk finds them
