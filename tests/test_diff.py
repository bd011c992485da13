"""`oomdoctor diff`: the comparison (analysis.diff), its views, the verb and its bad inputs."""

from __future__ import annotations

import dataclasses
import functools
import gc
import json
import os
import shutil
import sys
import threading
from pathlib import Path

import pytest

from oomdoctor import pipeline
from oomdoctor.analysis import analyse
from oomdoctor.analysis.diff import (
    APPEARED,
    GREW,
    MOMENT_OOM,
    MOMENT_STEP_END,
    SITE_SOURCE_LINE,
    Figure,
    argument_changes,
    compare,
    site_changes,
)
from oomdoctor.analysis.results import LiveBlock
from oomdoctor.cli import main
from oomdoctor.errors import OomdoctorError
from oomdoctor.load import folder, load
from oomdoctor.load.folder import map_files
from oomdoctor.model import Frame, Snapshot
from oomdoctor.views import diff_report
from tests.builders import two_rank_folder
from tests.conftest import FIXTURES

MiB = 1 << 20
OPTIMIZER = FIXTURES / "dumps" / "optimizer-state-buildup-gpt-adamw.pickle"
SPIKE = FIXTURES / "dumps" / "activation-spike-gpt-longer-sequence.pickle"


def _block(size: int, line: int, component: str = "activations", name: str | None = None) -> LiveBlock:
    frames = (Frame("model.py", line, "forward"),)
    return LiveBlock(0, size, size, 1, "forward", 0, component, "phase", 0.9, name, frames)


def test_analyse_at_an_event_judges_that_moment():
    snapshot = load(OPTIMIZER)
    whole = analyse(snapshot)
    first_step = whole.steps[0]
    at = analyse(snapshot, at_event=first_step.last_index)
    assert at.replay.target_index == first_step.last_index
    assert at.replay.target_kind == "peak"
    assert at.accounting.request_bytes is None  # the OOM of step 1 is not this moment's
    assert analyse(snapshot, at_event=whole.replay.target_index).replay.target_kind == "oom"


def test_sites_appear_grow_and_go_largest_change_first():
    a = [_block(4 * MiB, 10), _block(2 * MiB, 20)]
    b = [_block(8 * MiB, 10), _block(1 * MiB, 30, "optimizer_state")]
    changes = site_changes(a, b)
    lines = [(c.key, c.component, c.status, c.delta_bytes) for c in changes if c.kind == SITE_SOURCE_LINE]
    assert lines == [
        ("model.py:10 in forward", "activations", GREW, 4 * MiB),
        ("model.py:20 in forward", "activations", "went", -2 * MiB),
        ("model.py:30 in forward", "optimizer_state", APPEARED, 1 * MiB),
    ]
    assert site_changes(a, a) == ()


def test_figures_ratio_and_growth():
    figure = Figure("activations", 2 * MiB, 5 * MiB)
    assert (figure.delta_bytes, figure.ratio, figure.growth_percent) == (3 * MiB, 2.5, 150.0)
    assert Figure("x", 0, 1).ratio is None and not Figure("x", 10, 11).changed


def test_argument_changes_only_for_comparable_command_lines():
    a = ("train.py", "--batch-size", "8", "--steps", "2")
    b = ("train.py", "--batch-size", "16", "--steps", "2")
    [change] = argument_changes(a, b)
    assert (change.option, change.a_value, change.b_value) == ("--batch-size", "8", "16")
    assert argument_changes(a, ("other.py", *a[1:])) == ()
    assert argument_changes(a, a[:3]) == ()


def test_steps_of_an_optimizer_dump_show_the_state_appear_at_the_optimizer_line():
    diff = pipeline.diff_steps(str(OPTIMIZER), 0, 1)
    state = next(f for f in diff.at_peak.components if f.name == "optimizer_state")
    assert state.a_bytes == 0 and state.b_bytes > 20 * MiB
    top = diff.headline.site
    assert top is not None and top.status == APPEARED and top.component == "optimizer_state"
    assert top.key.startswith("fixtures/scenarios/train.py:36 ")  # optimizer.step()
    assert diff.b.at_target.kind == MOMENT_OOM and diff.a.at_target.kind == MOMENT_STEP_END
    assert diff.verdict_changed and diff.b.verdict == "optimizer-state-buildup"
    assert diff.at_peak.a.step == 0 and diff.at_peak.b.step == 1


def test_file_diff_in_three_formats():
    diff = pipeline.diff_files(str(SPIKE), str(OPTIMIZER))
    text = diff_report.to_text(diff)
    assert "peaks 54.56 MiB higher" in text
    assert "'--optimizer' went from 'sgd' to 'adamw'" in text
    markdown = diff_report.to_markdown(diff)
    assert "`--optimizer` went from `sgd` to `adamw`" in markdown
    data = json.loads(diff_report.to_json(diff))
    assert data["peak"]["delta_bytes"] == diff.headline.peak.delta_bytes
    assert data["a"]["verdict"] == "activation-spike" and data["verdict_changed"] is True
    assert (
        data["at_peak"]["components"]["activations"]["b_bytes"]
        > data["at_peak"]["components"]["activations"]["a_bytes"]
    )


def test_a_dump_against_itself_changes_nothing():
    diff = pipeline.diff_files(str(OPTIMIZER), str(OPTIMIZER))
    assert diff.at_peak.sites == () and not diff.verdict_changed
    assert "peaks as" in diff_report.to_text(diff)


def test_ranks_of_a_folder(tmp_path, capsys):
    folder = two_rank_folder(tmp_path)
    diff = pipeline.diff_ranks(str(folder), 0, 1)
    assert (diff.a.label, diff.b.label) == ("rank 0", "rank 1")
    assert diff.a.verdict == "activation-spike" and diff.b.verdict == "optimizer-state-buildup"
    assert main(["diff", str(folder), "--ranks", "0", "1", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["kind"] == "ranks"


def test_a_rank_whose_file_cannot_be_read_says_why(tmp_path, capsys):
    folder = two_rank_folder(tmp_path)
    (folder / "oom-rank2-node-3-20260101T000000Z.pickle").write_bytes(b"not a pickle at all")
    assert main(["diff", str(folder), "--ranks", "0", "2"]) == 2
    err = capsys.readouterr().err
    assert "the file of rank 2, oom-rank2-node-3-20260101T000000Z.pickle, could not be read: not a snapshot" in err
    assert main(["diff", str(folder), "--ranks", "0", "3"]) == 2
    assert "no file of rank 3 in this folder (ranks: 0, 1)" in capsys.readouterr().err


def test_ranks_analyse_only_the_two_files_compared(tmp_path, monkeypatch):
    """The other ranks' files are loaded to learn their ranks, never analysed."""
    import oomdoctor.analysis

    folder = two_rank_folder(tmp_path)
    shutil.copy(BATCH_16, folder / "oom-rank2-node-3-20260101T000000Z.pickle")
    analysed = []
    analyser = oomdoctor.analysis.analyser

    def counting(snapshot, *args, **kwargs):
        analysed.append(snapshot)
        return analyser(snapshot, *args, **kwargs)

    monkeypatch.setattr(oomdoctor.analysis, "analyser", counting)
    monkeypatch.setattr(pipeline, "map_files", functools.partial(map_files, parallel=False))
    diff = pipeline.diff_ranks(str(folder), 2, 1)
    assert (diff.a.label, diff.b.label) == ("rank 2", "rank 1")
    assert diff.b.verdict == "optimizer-state-buildup"
    assert len(analysed) == 2


def _in_workers(monkeypatch, tmp_path, die: bool = False) -> Path:
    """Two files of any size read in worker processes; each load notes the process it ran in, and
    with `die` a worker process ends itself instead of loading."""
    parent, load, log = os.getpid(), pipeline.load_snapshot, tmp_path / "pids"

    def noting(path, *args, **kwargs):
        with open(log, "a") as handle:
            handle.write(f"{os.getpid()}\n")
        if die and os.getpid() != parent:
            os._exit(1)
        return load(path, *args, **kwargs)

    monkeypatch.setattr(pipeline, "PARALLEL_SIDE_MIN_BYTES", 0)
    monkeypatch.setattr(folder, "worker_count", lambda *args, **kwargs: 2)
    monkeypatch.setattr(pipeline, "load_snapshot", noting)
    return log


def _pids(log: Path) -> list[int]:
    return [int(line) for line in log.read_text().split()]


def test_two_large_files_are_read_at_once_in_workers_with_the_same_diff(tmp_path, monkeypatch):
    one_by_one = diff_report.to_json(pipeline.diff_files(str(SPIKE), str(OPTIMIZER)))
    log = _in_workers(monkeypatch, tmp_path)
    diff = pipeline.diff_files(str(SPIKE), str(OPTIMIZER))
    assert diff_report.to_json(diff) == one_by_one
    pids = _pids(log)
    assert len(pids) == 2 and os.getpid() not in pids and len(set(pids)) == 2


def test_a_file_the_workers_cannot_read_fails_as_it_does_in_one_process(tmp_path, monkeypatch, capsys):
    bad = tmp_path / "bad.pickle"
    bad.write_bytes(b"not a pickle at all")
    assert main(["diff", str(SPIKE), str(bad)]) == 2
    alone = capsys.readouterr().err
    log = _in_workers(monkeypatch, tmp_path)
    assert main(["diff", str(SPIKE), str(bad)]) == 2
    assert capsys.readouterr().err == alone
    assert _pids(log).count(os.getpid()) == 1  # the bad file, read again here


def test_a_worker_that_dies_leaves_both_files_to_this_process(tmp_path, monkeypatch):
    one_by_one = diff_report.to_json(pipeline.diff_files(str(SPIKE), str(OPTIMIZER)))
    log = _in_workers(monkeypatch, tmp_path, die=True)
    assert diff_report.to_json(pipeline.diff_files(str(SPIKE), str(OPTIMIZER))) == one_by_one
    assert _pids(log).count(os.getpid()) == 2


def _beside(monkeypatch, work, path: str = "anything"):
    monkeypatch.setattr(folder, "worker_count", lambda *args, **kwargs: 2)
    beside = folder.read_beside((path, path), 1, work)
    assert beside is not None
    return beside


def test_read_beside_returns_what_the_worker_made_in_another_process(monkeypatch, capfd):
    from tests import beside_work

    done, (path, pid) = _beside(monkeypatch, beside_work.echo).result()
    assert done and path == "anything" and pid != os.getpid()
    # what the work prints reaches neither the answer nor the terminal (this process's own outputs)
    capfd.readouterr()
    assert _beside(monkeypatch, beside_work.noisy).result() == (True, "anything")
    out, err = capfd.readouterr()
    assert "standard" not in out + err


@pytest.mark.parametrize("work", ["fails", "dies"])
def test_read_beside_leaves_the_file_to_the_caller_when_the_worker_fails_or_dies(monkeypatch, work):
    from tests import beside_work

    assert _beside(monkeypatch, getattr(beside_work, work)).result() == (False, None)


def test_read_beside_close_ends_a_worker_still_at_work(monkeypatch):
    from tests import beside_work

    beside = _beside(monkeypatch, beside_work.sleeps)
    process = beside._process
    beside.close()
    assert process.poll() is not None  # killed, not waited for the minute


def test_read_beside_needs_every_file_large_and_the_host_able(tmp_path, monkeypatch):
    from tests import beside_work

    small = tmp_path / "small.pickle"
    small.write_bytes(b"x" * 10)
    monkeypatch.setattr(folder, "worker_count", lambda *args, **kwargs: 2)
    assert folder.read_beside((str(small), str(SPIKE)), 1, beside_work.echo, min_bytes=100) is None
    monkeypatch.setattr(folder, "worker_count", lambda *args, **kwargs: 1)
    assert folder.read_beside((str(SPIKE), str(SPIKE)), 1, beside_work.echo) is None
    monkeypatch.setattr(folder, "worker_count", lambda *args, **kwargs: 2)
    monkeypatch.setattr(sys, "frozen", True, raising=False)  # a frozen app: its executable is itself
    assert folder.read_beside((str(SPIKE), str(SPIKE)), 1, beside_work.echo) is None


@pytest.mark.parametrize("in_thread", [False, True])
def test_open_compare_reads_b_in_a_worker_beside_a_with_the_same_results(tmp_path, monkeypatch, in_thread):
    """The app loads in a thread: the worker is a new interpreter there as anywhere (never a fork)."""
    one_by_one = pipeline.compare_files(str(SPIKE), str(OPTIMIZER))
    log = _in_workers(monkeypatch, tmp_path)
    stages: list[str] = []
    fractions: list[float] = []
    found = {}

    def run():
        found["both"] = pipeline.compare_files(
            str(SPIKE), str(OPTIMIZER), enter_stage=stages.append, progress=fractions.append
        )

    if in_thread:
        thread = threading.Thread(target=run)
        thread.start()
        thread.join()
    else:
        run()
    a, b, diff = found["both"]
    assert (a, b) == one_by_one[:2] and diff_report.to_json(diff) == diff_report.to_json(one_by_one[2])
    assert _pids(log) == [os.getpid()]  # A here; B in the worker, which the patch does not reach
    assert stages == ["reading A", "analysing A", "reading B", "comparing"]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0


def test_open_compare_with_b_unreadable_in_the_worker_fails_as_in_one_process(tmp_path, monkeypatch):
    bad = tmp_path / "bad.pickle"
    bad.write_bytes(b"not a pickle at all")
    with pytest.raises(OomdoctorError) as alone:
        pipeline.compare_files(str(SPIKE), str(bad))
    log = _in_workers(monkeypatch, tmp_path)
    fractions: list[float] = []
    with pytest.raises(OomdoctorError) as beside:
        pipeline.compare_files(str(SPIKE), str(bad), progress=fractions.append)
    assert str(beside.value) == str(alone.value) and beside.value.exit_code == alone.value.exit_code
    assert fractions == sorted(fractions) and fractions[-1] >= 0.9  # B's second reading goes on from A's share
    assert _pids(log) == [os.getpid(), os.getpid()]  # A, then B read again here


@pytest.mark.parametrize("diff_of", ["files", "ranks", "open --compare"])
def test_the_first_snapshot_is_let_go_before_the_second_is_read(tmp_path, monkeypatch, diff_of):
    """A side keeps what it compares: read one after the other, two dumps take the memory of the larger."""
    load = pipeline.load_snapshot
    alive_at_each_load = []

    def counting(*args, **kwargs):
        gc.collect()
        alive_at_each_load.append(sum(type(o) is Snapshot for o in gc.get_objects()))
        return load(*args, **kwargs)

    monkeypatch.setattr(pipeline, "load_snapshot", counting)
    if diff_of == "files":
        diff = pipeline.diff_files(str(SPIKE), str(OPTIMIZER))
    elif diff_of == "open --compare":
        _, _, diff = pipeline.compare_files(str(SPIKE), str(OPTIMIZER))
    else:
        monkeypatch.setattr(pipeline, "map_files", functools.partial(map_files, parallel=False))
        diff = pipeline.diff_ranks(str(two_rank_folder(tmp_path)), 0, 1)
    assert diff.a.verdict == "activation-spike" and diff.b.verdict == "optimizer-state-buildup"
    assert alive_at_each_load[-2:] == [0, 0]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["diff", "missing.pickle", "other.pickle"], "no such file"),
        (["diff", str(OPTIMIZER)], "give two files"),
        (["diff", str(OPTIMIZER), "--steps", "0", "9"], "no step 9"),
        (["diff", str(OPTIMIZER), str(SPIKE), "--steps", "0", "1"], "give one file"),
        (["diff", str(OPTIMIZER), "--ranks", "0", "1"], "not one"),
        (["diff", str(OPTIMIZER), "--steps", "0", "1", "--ranks", "0", "1"], "do not go together"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("oomdoctor: ") and message in err and err.count("\n") == 1


def test_bad_folder_inputs(tmp_path, capsys):
    folder = two_rank_folder(tmp_path)
    assert main(["diff", str(folder), "--ranks", "0", "7"]) == 2
    assert "no file of rank 7" in capsys.readouterr().err
    assert main(["diff", str(folder), str(OPTIMIZER)]) == 2
    assert "--ranks R S" in capsys.readouterr().err
    (tmp_path / "junk.pickle").write_bytes(b"not a pickle")
    assert main(["diff", str(tmp_path / "junk.pickle"), str(OPTIMIZER)]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_hostile_site_names_are_escaped():
    hostile = "x.py\x1b[31m`](http://evil)<img src=x>"
    diff = pipeline.diff_files(str(OPTIMIZER), str(OPTIMIZER))
    grown = LiveBlock(
        0, 8 * MiB, 8 * MiB, 1, "forward", 0, "activations", "phase", 0.9, None, (Frame(hostile, 1, "f"),)
    )
    side_a = dataclasses.replace(diff.a, at_peak=dataclasses.replace(diff.a.at_peak, blocks=(_block(4 * MiB, 10),)))
    side_b = dataclasses.replace(diff.b, at_peak=dataclasses.replace(diff.b.at_peak, blocks=(grown,)))
    hostile_diff = compare(side_a, side_b, kind="files")
    assert "\x1b" not in diff_report.to_text(hostile_diff)
    markdown = diff_report.to_markdown(hostile_diff)
    assert "\x1b" not in markdown and "<img" not in markdown.replace("`` x.py", "")
    for line in markdown.splitlines():
        if "evil" in line:
            assert "``" in line  # the backtick inside makes the span's fence longer: never a link
    assert b"\x1b" not in diff_report.to_json(hostile_diff)


BATCH_16 = FIXTURES / "dumps" / "no-oom-gpt-adamw.pickle"
BATCH_32 = FIXTURES / "dumps" / "no-oom-gpt-adamw-batch-32.pickle"


def test_the_same_run_at_twice_the_batch_doubles_its_activations_and_their_sites():
    """A fixture pair with a known difference: train.py at --batch-size 16 and 32 (the manifest's
    ground truth and the registry say the same model, optimizer and steps)."""
    diff = pipeline.diff_files(str(BATCH_16), str(BATCH_32))
    components = {row.name: row for row in diff.at_peak.components}
    activations = components["activations"]
    assert activations.b_bytes == pytest.approx(2 * activations.a_bytes, rel=0.02)
    parameters_a = sum(b.size_bytes for b in analyse(load(BATCH_16)).live_blocks if b.component == "parameters")
    parameters_b = sum(b.size_bytes for b in analyse(load(BATCH_32)).live_blocks if b.component == "parameters")
    assert parameters_a == parameters_b  # the model is the same: its parameters do not move
    if "parameters" in components:
        assert components["parameters"].a_bytes == components["parameters"].b_bytes
    grown = [site for site in diff.at_peak.sites if site.component == "activations"]
    assert grown and all(site.status == GREW for site in grown)
    assert all(site.b_bytes == pytest.approx(2 * site.a_bytes, rel=0.02) for site in grown)
    assert grown[0] is diff.at_peak.sites[0]  # the largest change first is an activation site
    text = diff_report.to_text(diff)
    assert "'--batch-size' went from '16' to '32'" in text and "activations +" in text
    assert "16×64 to 32×64" in text  # the registry's record of the inputs


def test_two_ranks_where_one_does_more_work(tmp_path):
    folder = tmp_path / "ranks"
    folder.mkdir()
    shutil.copy(BATCH_16, folder / "oom-rank0-node-1-20260101T000000Z.pickle")
    shutil.copy(BATCH_32, folder / "oom-rank1-node-1-20260101T000000Z.pickle")
    diff = pipeline.diff_ranks(str(folder), 0, 1)
    assert (diff.a.label, diff.b.label) == ("rank 0", "rank 1")
    assert diff.headline.peak.delta_bytes > 0
    sites = [site for site in diff.at_peak.sites if site.component == "activations"]
    assert sites and all(site.status == GREW for site in sites)


def test_the_layout_figures_of_a_moment_the_dump_postdates_say_they_are_an_estimate():
    """Two no-OOM dumps written after their peaks: at the peaks the layout is rebuilt back from the
    dumps (blocks freed since at their rounded requests), so free cached, fragmented, the largest
    free block and rounding are an estimate there, as the reports' memory tables say; at the dumps
    themselves they are exact and nothing is said."""
    a = FIXTURES / "dumps" / "no-oom-gpt-adamw.pickle"
    b = FIXTURES / "dumps" / "no-oom-gpt-adamw-batch-32.pickle"
    diff = pipeline.diff_files(str(a), str(b))
    assert diff.at_peak.a.layout_estimated and diff.at_peak.b.layout_estimated
    assert not diff.at_target.a.layout_estimated and not diff.at_target.b.layout_estimated
    note = (
        "free cached, fragmented, largest free block and rounding are an estimate, as laid out (for A and B:"
        " their dumps were written after this moment, and blocks freed since count at their rounded requests)"
    )
    text = diff_report.to_text(diff)
    assert text.count(note) == 1
    assert text.index(note) < text.index("At the target")  # the peak's table, not the dump's
    markdown = diff_report.to_markdown(diff)
    assert markdown.count(note[:1].upper() + note[1:] + ".") == 1
    data = json.loads(diff_report.to_json(diff))
    figures = ["free_cached", "fragmented", "largest_free_block", "rounding"]
    assert data["at_peak"]["a"]["estimated_as_laid_out"] == figures
    assert data["at_peak"]["b"]["estimated_as_laid_out"] == figures
    assert "estimated_as_laid_out" not in data["at_target"]["a"]
