"""How far the work on several files has got (oomdoctor.load.folder.Shares): each file weighted by
its size, told from this process or from worker processes through memory they share; and the
progress line of the commands that read folders or two files."""

from __future__ import annotations

import io
import os
import shutil
import time
from pathlib import Path

import pytest

from oomdoctor import pipeline
from oomdoctor.cli import main
from oomdoctor.commands import ReadProgress
from oomdoctor.load import folder
from oomdoctor.load.folder import Shares, map_files, read_at_once

from .builders import two_rank_folder
from .conftest import FIXTURES

SPIKE = FIXTURES / "dumps" / "activation-spike-gpt-longer-sequence.pickle"
OPTIMIZER = FIXTURES / "dumps" / "optimizer-state-buildup-gpt-adamw.pickle"


def _halfway(path: str, progress=None) -> str:
    if progress is not None:
        progress(0.5)
    return Path(path).name


def _until_heard(path: str, progress=None) -> bool:
    """Half done, then wait until the parent says it heard a fraction between 0 and 1 (a file it
    writes): whether it did, within a bound far above what a poll takes."""
    progress(0.5)
    heard = Path(path + ".heard")
    end = time.monotonic() + 30
    while time.monotonic() < end:
        if heard.exists():
            return True
        time.sleep(0.01)
    return False


def _no_progress_asked(path: str, **kwargs) -> bool:
    return "progress" not in kwargs


def _sized(tmp_path: Path, *sizes: int) -> list[str]:
    paths = []
    for index, size in enumerate(sizes):
        path = tmp_path / f"f{index}"
        path.write_bytes(b"x" * size)
        paths.append(str(path))
    return paths


def test_each_file_weighs_its_size_and_counts_whole_once_done():
    heard: list[float] = []
    shares = Shares([100, 300, 0], heard.append, shared=False)
    shares.set(1, 0.5)
    shares.done([0])
    shares.set(2, 2.0)  # out of range: counted as whole
    assert heard == [pytest.approx(150 / 401), pytest.approx(250 / 401), pytest.approx(251 / 401)]
    shares.done([1])
    assert heard[-1] == pytest.approx(1.0)


def test_in_this_process_each_file_tells_its_share_in_turn(tmp_path):
    paths = _sized(tmp_path, 100, 300)
    heard: list[float] = []
    outcomes = map_files(paths, _halfway, parallel=False, progress=heard.append)
    assert [outcome.value for outcome in outcomes] == ["f0", "f1"]
    assert heard == [pytest.approx(0.125), pytest.approx(0.25), pytest.approx(0.625), pytest.approx(1.0)]


def test_without_progress_the_work_is_asked_nothing_more(tmp_path):
    paths = _sized(tmp_path, 10, 20)
    for parallel in (False, True):
        assert [o.value for o in map_files(paths, _no_progress_asked, parallel=parallel, max_workers=2)] == [True, True]
    assert read_at_once(paths, _no_progress_asked) in ({}, {0: True, 1: True})


@pytest.mark.parametrize("reader", ["map_files", "one worker", "read_at_once"])
def test_a_workers_progress_reaches_the_parent_while_it_works(tmp_path, monkeypatch, reader):
    paths = _sized(tmp_path, 100, 100)
    heard: list[float] = []

    def hear(fraction: float) -> None:
        heard.append(fraction)
        if 0 < fraction < 1:
            for path in paths:
                Path(path + ".heard").touch()

    if reader != "read_at_once":
        if reader == "one worker":  # what a command does with parallel=False: one worker reads both in turn
            monkeypatch.setattr(folder.guard, "enabled", lambda: True)
        outcomes = map_files(paths, _until_heard, max_workers=2, parallel=reader == "map_files", progress=hear)
        assert [outcome.value for outcome in outcomes] == [True, True]
    else:
        monkeypatch.setattr(folder, "worker_count", lambda *args, **kwargs: 2)
        assert read_at_once(paths, _until_heard, progress=hear) == {0: True, 1: True}
    assert heard[-1] == pytest.approx(1.0)
    assert heard == sorted(heard) and all(0 <= fraction <= 1 for fraction in heard)


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _on_a_terminal(monkeypatch) -> Terminal:
    monkeypatch.setattr(ReadProgress, "DELAY_SECONDS", 0.0)
    monkeypatch.setattr(ReadProgress, "INTERVAL_SECONDS", 0.0)
    monkeypatch.setenv("TERM", "xterm")
    terminal = Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    return terminal


def _blanked(sent: str) -> bool:
    """Whether the line ends blank, the cursor at its start."""
    last = sent.rstrip("\r").rpartition("\r")[2]
    return sent.endswith("\r") and last.strip() == ""


@pytest.mark.parametrize(
    ("verb", "said"),
    [
        (["report", "{ranks}", "--format", "json"], ["comparing ranks"]),
        (["report", "{ranks}", "--fail-if", "peak > 1TiB"], ["comparing ranks"]),
        (["info", "{ranks}"], []),
        (["diff", "{ranks}", "--ranks", "0", "1", "--format", "json"], ["comparing ranks"]),
        (["diff", "{spike}", "{optimizer}", "--format", "json"], ["reading {both}", "comparing {both}"]),
        (
            ["diff", "{spike}", "--steps", "0", "1", "--format", "json"],
            ["reading {spike_name}", "analysing {spike_name}"],
        ),
    ],
)
def test_folders_and_diffs_draw_then_blank_the_line_and_print_the_same(verb, said, tmp_path, monkeypatch, capsys):
    shutil.copy(SPIKE, tmp_path / "a.pickle")
    shutil.copy(OPTIMIZER, tmp_path / "b.pickle")
    names = {
        "ranks": str(two_rank_folder(tmp_path)),
        "spike": str(tmp_path / "a.pickle"),
        "optimizer": str(tmp_path / "b.pickle"),
        "spike_name": "a.pickle",
        "both": "a.pickle and b.pickle",
    }
    argv = [word.format(**names) for word in verb]
    code = main(argv)
    plain = capsys.readouterr()
    assert plain.err == ""
    terminal = _on_a_terminal(monkeypatch)
    assert main(argv) == code
    assert capsys.readouterr().out == plain.out
    sent = terminal.getvalue()
    for words in said:
        assert f"oomdoctor: {words.format(**names)}" in sent
    assert sent == "" or _blanked(sent)  # (info's line, blanked once read, may never be drawn)
    assert sent or not said


@pytest.mark.parametrize("verb", ["report", "info"])
def test_a_folder_read_in_this_process_says_how_far_it_has_got(verb, tmp_path, monkeypatch, capsys):
    ranks = str(two_rank_folder(tmp_path))
    monkeypatch.setattr(folder, "worker_count", lambda *args, **kwargs: 1)
    monkeypatch.setattr(folder.guard, "enabled", lambda: False)  # (else one worker process reads them)
    terminal = _on_a_terminal(monkeypatch)
    assert main([verb, ranks]) == 0
    sent = terminal.getvalue()
    shown = [line.strip() for line in sent.split("\r") if line.strip()]
    fractions = [int(line.rpartition(" ")[2].rstrip("%")) for line in shown if line.startswith("oomdoctor: reading")]
    assert len(set(fractions)) > 1 and fractions == sorted(fractions) and fractions[-1] < 100
    assert (shown[-1] == "oomdoctor: comparing ranks") == (verb == "report") and _blanked(sent)


def test_a_recursive_read_tells_the_share_of_every_folder_it_may_read(tmp_path, monkeypatch):
    tree = tmp_path / "runs"
    for step, fixture in (("iteration_20", OPTIMIZER), ("iteration_10", SPIKE)):
        (tree / step).mkdir(parents=True)
        shutil.copy(fixture, tree / step / "oom-rank0-node-1-20260101T000000Z.pickle")
    heard: list[float] = []
    monkeypatch.setattr(folder.guard, "enabled", lambda: False)  # read in this process
    read = pipeline.read_folder(str(tree), recursive=True, parallel=False, progress=heard.append)
    assert read.folder == "iteration_20"  # it held an OOM: the other folder is not read
    first = os.path.getsize(OPTIMIZER) / (os.path.getsize(OPTIMIZER) + os.path.getsize(SPIKE))
    assert heard == sorted(heard)
    assert heard[-2] == pytest.approx(first)  # its share: stopped short of the folder not read
    assert heard[-1] == 1.0  # then the reading is over


def _fails_on_b(path: str, progress=None) -> str:
    if progress is not None:
        progress(0.5)
    if Path(path).name == "f1":
        raise ValueError(path)
    return Path(path).name


def test_a_file_whose_work_raised_counts_done_only_where_it_is_given_up(tmp_path, monkeypatch):
    paths = _sized(tmp_path, 100, 100)
    heard: list[float] = []
    outcomes = map_files(paths, _fails_on_b, parallel=False, progress=heard.append)  # its error is its note
    assert outcomes[1].error is not None and heard[-1] == pytest.approx(1.0)
    heard.clear()
    monkeypatch.setattr(folder, "worker_count", lambda *args, **kwargs: 2)
    assert read_at_once(paths, _fails_on_b, progress=heard.append) == {0: "f0"}  # f1: read again by the caller
    assert heard[-1] < 1.0
    shares = Shares([100, 100], heard.append, shared=False)
    with pytest.raises(ValueError):
        shares.work(_fails_on_b, 1, paths[1])
    assert heard[-1] == pytest.approx(0.25)


def test_a_diff_whose_file_fails_never_says_it_is_comparing(tmp_path, monkeypatch, capsys):
    cut = tmp_path / "cut.pickle"
    cut.write_bytes(SPIKE.read_bytes()[: os.path.getsize(SPIKE) // 2])
    terminal = _on_a_terminal(monkeypatch)
    assert main(["diff", str(OPTIMIZER), str(cut)]) == 2
    progress, _, error = terminal.getvalue().rpartition("\r")
    assert "oomdoctor: reading" in progress and "comparing" not in progress
    assert error.startswith("oomdoctor: ") and "cut.pickle" in error and _blanked(progress + "\r")


def test_within_a_stage_the_line_never_goes_back():
    """A file read again (its worker died after 90% of it, or a diff's file failed in its worker)
    starts over from 0: the line holds what it said until the new read passes it."""
    terminal = Terminal()
    progress = ReadProgress("ranks", terminal, then="comparing", clock=lambda: 100.0)

    def shown(fraction: float) -> str:
        progress._next = 0.0  # (drawn at once)
        progress(fraction)
        return terminal.getvalue().rstrip("\r").rpartition("\r")[2].strip()

    assert [shown(f) for f in (0.5, 0.9, 0.1, 0.95)] == [f"oomdoctor: reading ranks  {p}%" for p in (50, 90, 90, 95)]
    progress.stage("checking")
    assert shown(0.2) == "oomdoctor: checking ranks  20%"  # a new stage starts from its own 0


def _dies_on_b(path: str, progress=None) -> str:
    if Path(path).name == "f1":
        os._exit(1)
    return Path(path).name


def test_a_file_whose_worker_died_twice_is_given_up_and_counted_done(tmp_path):
    paths = _sized(tmp_path, 100, 100)
    heard: list[float] = []
    outcomes = map_files(paths, _dies_on_b, max_workers=2, progress=heard.append)
    assert outcomes[0].value == "f0" and outcomes[1].error == folder.WORKER_DIED
    assert heard[-1] == pytest.approx(1.0)
