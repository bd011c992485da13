"""A long read's progress on a terminal (oomdoctor.commands.ReadProgress): one line of standard
error, rewritten in place, blanked before anything else is written; nothing at all when standard
error is not a terminal."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from oomdoctor import supervise
from oomdoctor.cli import main
from oomdoctor.commands import ReadProgress, read_progress

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "dumps" / "creeping-leak-gpt-adamw.pickle"


class Terminal(io.StringIO):
    """What a terminal is sent, as one string (no fileno: 80 columns)."""

    def isatty(self) -> bool:
        return True


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _screen(sent: str) -> str:
    """What the line shows after `sent`: each \\r goes back to its start, text overwrites."""
    line: list[str] = []
    column = 0
    for char in sent:
        if char == "\r":
            column = 0
            continue
        if column < len(line):
            line[column] = char
        else:
            line.append(char)
        column += 1
    return "".join(line)


def test_nothing_is_drawn_before_the_delay_then_the_fraction_read():
    terminal, clock = Terminal(), Clock()
    progress = ReadProgress("/data/run/oom.pickle", terminal, clock=clock)
    progress(0.2)
    clock.now += ReadProgress.DELAY_SECONDS / 2
    progress(0.3)
    assert terminal.getvalue() == ""
    clock.now += ReadProgress.DELAY_SECONDS
    progress(0.42)
    assert _screen(terminal.getvalue()) == "oomdoctor: reading oom.pickle  42%"


def test_redrawn_at_most_every_interval_and_analysing_at_once():
    terminal, clock = Terminal(), Clock()
    progress = ReadProgress("oom.pickle", terminal, clock=clock)
    clock.now += ReadProgress.DELAY_SECONDS
    progress(0.5)
    sent = terminal.getvalue()
    clock.now += ReadProgress.INTERVAL_SECONDS / 4
    progress(0.6)
    assert terminal.getvalue() == sent  # too soon
    progress(1.0)  # the model is built: said at once
    assert _screen(terminal.getvalue()) == "oomdoctor: analysing oom.pickle   "
    progress.clear()
    assert _screen(terminal.getvalue()).strip() == ""
    assert terminal.getvalue().endswith("\r")


def test_without_a_next_stage_the_line_is_blanked_once_read():
    terminal, clock = Terminal(), Clock()
    progress = ReadProgress("oom.pickle", terminal, then=None, clock=clock)
    clock.now += ReadProgress.DELAY_SECONDS
    progress(0.9)
    progress(1.0)
    assert _screen(terminal.getvalue()).strip() == ""
    sent = terminal.getvalue()
    progress.clear()  # nothing left to blank
    assert terminal.getvalue() == sent


def test_a_name_is_data_and_the_line_fits_the_terminal():
    terminal, clock = Terminal(), Clock()
    progress = ReadProgress("dir/\x1b[31mred\x07" + "x" * 200 + ".pickle", terminal, clock=clock)
    clock.now += ReadProgress.DELAY_SECONDS
    progress(0.5)
    shown = _screen(terminal.getvalue())
    assert "\x1b" not in terminal.getvalue() and "\x07" not in terminal.getvalue()
    assert shown.startswith("oomdoctor: reading \\x1b[31mred\\x07xxx")
    assert len(shown) <= 79


def test_a_wide_name_is_clipped_by_the_columns_it_takes():
    terminal, clock = Terminal(), Clock()
    progress = ReadProgress("模型" * 30 + ".pickle", terminal, clock=clock)
    clock.now += ReadProgress.DELAY_SECONDS
    progress(0.5)
    shown = _screen(terminal.getvalue())
    assert shown.startswith("oomdoctor: reading 模型")
    assert sum(2 if "\u4e00" <= c <= "\u9fff" else 1 for c in shown) <= 79


def test_no_progress_where_standard_error_is_no_terminal(monkeypatch):
    monkeypatch.setattr("sys.stderr", io.StringIO())
    with read_progress("oom.pickle") as progress:
        assert progress is None
    monkeypatch.setattr("sys.stderr", Terminal())
    monkeypatch.setenv("TERM", "dumb")
    with read_progress("oom.pickle") as progress:
        assert progress is None


@pytest.mark.parametrize("verb", [["report", "--format", "json"], ["report", "--fail-if", "peak > 1TiB"], ["info"]])
def test_report_and_info_draw_then_blank_the_line_and_print_the_same(verb, monkeypatch, capsys):
    assert main([*verb, str(FIXTURE)]) == 0
    plain = capsys.readouterr()
    assert plain.err == ""
    monkeypatch.setattr(ReadProgress, "DELAY_SECONDS", 0.0)
    monkeypatch.setattr(ReadProgress, "INTERVAL_SECONDS", 0.0)
    monkeypatch.setenv("TERM", "xterm")
    terminal = Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    assert main([*verb, str(FIXTURE)]) == 0
    assert capsys.readouterr().out == plain.out
    sent = terminal.getvalue()
    assert "oomdoctor: reading creeping-leak-gpt-adamw.pickle" in sent
    assert ("oomdoctor: analysing creeping-leak-gpt-adamw.pickle" in sent) == (verb[0] == "report")
    assert _screen(sent).strip() == "" and sent.endswith("\r")  # blanked, the cursor at the line's start


def test_an_error_is_printed_on_a_blanked_line(tmp_path, monkeypatch, capsys):
    cut = tmp_path / "cut.pickle"
    cut.write_bytes(FIXTURE.read_bytes()[: os.path.getsize(FIXTURE) // 2])
    monkeypatch.setattr(ReadProgress, "DELAY_SECONDS", 0.0)
    monkeypatch.setattr(ReadProgress, "INTERVAL_SECONDS", 0.0)
    monkeypatch.setenv("TERM", "xterm")
    terminal = Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    assert main(["report", str(cut)]) == 2
    sent = terminal.getvalue()
    progress, _, error = sent.rpartition("\r")
    assert "oomdoctor: reading cut.pickle" in progress and _screen(progress).strip() == ""
    assert error.startswith("oomdoctor: ") and "cut.pickle" in error and error.count("\n") == 1


def test_the_watching_parent_blanks_the_line_a_dead_child_left(monkeypatch):
    terminal = Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    monkeypatch.setattr("sys.stdout", io.StringIO())
    supervise._restore_terminal(None)
    assert terminal.getvalue() == supervise.CLEAR_LINE


def test_a_stage_is_said_at_once_and_names_the_fractions_after_it():
    terminal, clock = Terminal(), Clock()
    progress = ReadProgress("oom.pickle", terminal, then="redacting", clock=clock)
    progress.stage("writing")  # before the delay: nothing
    assert terminal.getvalue() == ""
    clock.now += ReadProgress.DELAY_SECONDS
    progress.stage("writing")
    assert _screen(terminal.getvalue()) == "oomdoctor: writing oom.pickle"
    progress.stage("checking")
    clock.now += ReadProgress.INTERVAL_SECONDS
    progress(0.5)
    assert _screen(terminal.getvalue()).rstrip() == "oomdoctor: checking oom.pickle  50%"
    progress(1.0)  # the stage said no next one: blanked
    assert _screen(terminal.getvalue()).strip() == ""


def test_redact_says_its_stages_and_writes_the_same_copy(tmp_path, monkeypatch, capsys):
    assert main(["redact", str(FIXTURE), str(tmp_path / "plain.pickle")]) == 0
    plain = capsys.readouterr()
    assert plain.err.startswith("wrote ") and plain.err.count("\n") == 1  # its one line, on stderr
    monkeypatch.setattr(ReadProgress, "DELAY_SECONDS", 0.0)
    monkeypatch.setattr(ReadProgress, "INTERVAL_SECONDS", 0.0)
    monkeypatch.setenv("TERM", "xterm")
    terminal = Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    assert main(["redact", str(FIXTURE), str(tmp_path / "shown.pickle")]) == 0
    assert capsys.readouterr().out == plain.out
    assert (tmp_path / "shown.pickle").read_bytes() == (tmp_path / "plain.pickle").read_bytes()
    progress, _, said = terminal.getvalue().rpartition("\r")
    assert said == plain.err.replace("plain.pickle", "shown.pickle")  # on a blanked line
    stages = ["reading", "redacting", "writing", "checking the copy of"]
    positions = [progress.find(f"oomdoctor: {stage} creeping-leak-gpt-adamw.pickle") for stage in stages]
    assert -1 not in positions and positions == sorted(positions)
    assert _screen(progress).strip() == ""
