"""Rank dumps in sub-folders (`report DIR --recursive`, `info DIR --recursive`) and the names other
tools give them: torchtitan's `memory_snapshot/iteration_10/rank0_memory_snapshot.pickle` and
`step_000000000010_exit/000003_step_10.pickle`, capture's own `run-{id}/` folders."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pytest

from oomdoctor.analysis.ranks import RANK_FROM_FILE_NAME
from oomdoctor.cli import main
from oomdoctor.errors import LoadError
from oomdoctor.load import folder as folder_module
from oomdoctor.load import load_raw
from oomdoctor.load.folder import find_dump_tree, rank_from_name, step_from_name
from oomdoctor.pipeline import read_folder, read_folder_info
from oomdoctor.views import ranks as ranks_view
from tests.conftest import ROOT
from tests.test_json_schema import validate
from tests.test_ranks import BIG, CALM, DUMPS, SMALL, write_rank


def write_plain(path: Path, fixture: str) -> Path:
    """A fixture dump as torch's own `_snapshot()` pickled it (torchtitan's MemoryProfiler): no oomdoctor key."""
    raw = load_raw(DUMPS / f"{fixture}.pickle")
    raw.pop("oomdoctor", None)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps(raw, protocol=4))
    return path


def torchtitan_tree(root: Path) -> Path:
    """Two ranks' periodic snapshots at step 10 (older naming), and their snapshots at the OOM of step 20."""
    snapshots = root / "outputs" / "memory_snapshot"
    for rank in (0, 1):
        write_plain(snapshots / "iteration_10" / f"rank{rank}_memory_snapshot.pickle", CALM)
    write_plain(snapshots / "step_000000000020_exit" / "000000_step_20.pickle", SMALL)
    write_plain(snapshots / "step_000000000020_exit" / "000001_step_20.pickle", BIG)
    (root / "outputs" / "train.log").write_text("step 20: CUDA out of memory\n")
    return root / "outputs"


# -- names ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, rank",
    [
        ("000003_step_10.pickle", 3),  # torchtitan: {rank:06d}_step_{N}.pickle
        ("000000_step_0.pickle", 0),
        ("000127_step_5000.pickle.gz", 127),
        ("rank3_memory_snapshot.pickle", 3),  # torchtitan's older name, and common scripts'
        ("rank_12_memory_snapshot.pickle", 12),
        ("3_step_10.pickle", None),  # a number before _step_ is a rank only zero-padded to six digits
        ("20260101_step_10.pickle", None),
        ("000003_step_10_copy.pickle", None),
        ("run_000003_step_10.pickle", None),
        ("snapshot_000003.pickle", None),
    ],
)
def test_rank_from_torchtitan_names(name, rank):
    assert rank_from_name(name) == rank


@pytest.mark.parametrize(
    "name, step",
    [
        ("iteration_10", 10),
        ("iteration_10_exit", 10),
        ("step_000000000020_exit", 20),
        ("000003_step_10.pickle", 10),
        ("run-a1b2", None),
        ("oom-rank0-host-12-20260101T000000Z.pickle", None),
    ],
)
def test_step_from_name(name, step):
    assert step_from_name(name) == step


# -- the tree ----------------------------------------------------------------------------------------


def test_the_oom_folder_is_compared_first_and_the_others_are_listed(tmp_path):
    outputs = torchtitan_tree(tmp_path)
    folder = read_folder(outputs, recursive=True, parallel=False)
    assert folder.folder == "memory_snapshot/step_000000000020_exit"
    assert [(d.rank, d.rank_source, d.file) for d in folder.dumps] == [
        (0, RANK_FROM_FILE_NAME, "memory_snapshot/step_000000000020_exit/000000_step_20.pickle"),
        (1, RANK_FROM_FILE_NAME, "memory_snapshot/step_000000000020_exit/000001_step_20.pickle"),
    ]
    assert [(f.name, f.read, f.file_count, f.step, f.chosen) for f in folder.folders] == [
        ("memory_snapshot/step_000000000020_exit", True, 2, 20, True),
        ("memory_snapshot/iteration_10", False, 2, 10, False),  # the OOM was found: not read
    ]
    notes = ranks_view.folder_notes(folder.folders)
    assert "ranks of memory_snapshot/step_000000000020_exit/ (the folder holding the OOM dumps)" in notes[0]
    assert notes[1] == "also found memory_snapshot/iteration_10/ (step 10): 2 snapshot files, not read"
    assert folder.skipped == ()  # train.log is in no folder holding snapshots


def test_report_recursive_text_and_json(tmp_path, capsys):
    outputs = torchtitan_tree(tmp_path)
    assert main(["report", str(outputs), "--recursive"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("rank 1 ran out first")
    assert "read with --recursive: these are the ranks of memory_snapshot/step_000000000020_exit/" in out
    assert "Rank 1 (ran out first): memory_snapshot/step_000000000020_exit/000001_step_20.pickle" in out

    assert main(["report", str(outputs), "-r", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [row["rank"] for row in data["ranks"]] == [0, 1]
    assert [item["chosen"] for item in data["folders"]] == [True, False]
    schema = json.loads((ROOT / "docs" / "schema" / "ranks.schema.json").read_text())
    assert validate(data, schema, schema) == []


def test_without_recursive_the_report_is_unchanged_and_says_how_to_read_sub_folders(tmp_path, capsys):
    outputs = torchtitan_tree(tmp_path)
    assert main(["report", str(outputs / "memory_snapshot")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--recursive reads sub-folders" in err
    write_rank(tmp_path, 0, SMALL)
    assert main(["report", str(tmp_path), "--format", "json"]) == 0
    assert "folders" not in json.loads(capsys.readouterr().out)


def test_reading_goes_on_until_a_folder_holds_an_oom(tmp_path):
    snapshots = tmp_path / "memory_snapshot"
    for rank in (0, 1):
        write_plain(snapshots / "iteration_20" / f"rank{rank}_memory_snapshot.pickle", CALM)
        write_plain(snapshots / "iteration_10" / f"rank{rank}_memory_snapshot.pickle", SMALL)
    folder = read_folder(tmp_path, recursive=True, parallel=False)
    assert folder.folder == "memory_snapshot/iteration_10"
    assert [(f.name, f.read, f.ran_out_count) for f in folder.folders] == [
        ("memory_snapshot/iteration_20", True, 0),  # the latest step is read first; no OOM in it
        ("memory_snapshot/iteration_10", True, 2),
    ]
    assert "read, 2 readable, none ran out" in ranks_view.folder_notes(folder.folders)[1]


def test_without_any_oom_the_first_folder_read_is_compared(tmp_path):
    for step in (10, 20):
        write_plain(tmp_path / f"iteration_{step}" / "rank0_memory_snapshot.pickle", CALM)
    folder = read_folder(tmp_path, recursive=True, parallel=False)
    assert folder.folder == "iteration_20" and all(f.read for f in folder.folders)
    assert "no folder read holds an OOM: the first one read" in ranks_view.folder_notes(folder.folders)[0]


def test_the_newest_run_folder_of_capture_is_compared(tmp_path):
    old, new = tmp_path / "run-1111", tmp_path / "run-2222"
    for run in (old, new):
        run.mkdir()
        write_rank(run, 0, SMALL)
        write_rank(run, 1, BIG)
    for path in old.iterdir():
        os.utime(path, (1_000_000_000, 1_000_000_000))
    folder = read_folder(tmp_path, recursive=True, parallel=False)
    assert folder.folder == "run-2222" and [f.read for f in folder.folders] == [True, False]
    assert folder.dumps[0].file == "run-2222/oom-rank0-node0-4000-20260101T000000Z.pickle"


def test_files_directly_inside_are_a_folder_of_their_own(tmp_path):
    write_rank(tmp_path, 0, SMALL)
    write_plain(tmp_path / "iteration_5" / "rank0_memory_snapshot.pickle", CALM)
    folder = read_folder(tmp_path, recursive=True, parallel=False)
    assert folder.folder == "" and folder.folders[0].name == ""  # oomdoctor's oom- dumps: named for an OOM
    assert ranks_view.folder_notes(folder.folders)[0].startswith(
        "read with --recursive: these are the ranks of the folder itself"
    )


# -- the safety rules --------------------------------------------------------------------------------


def test_links_out_of_the_folder_and_to_folders_are_not_followed(tmp_path):
    outside = tmp_path / "elsewhere"
    write_plain(outside / "rank7_memory_snapshot.pickle", BIG)
    root = tmp_path / "root"
    write_plain(root / "iteration_1" / "rank0_memory_snapshot.pickle", SMALL)
    (root / "iteration_1" / "rank7_memory_snapshot.pickle").symlink_to(outside / "rank7_memory_snapshot.pickle")
    (root / "iteration_1" / "rank1_memory_snapshot.pickle").symlink_to(
        root / "iteration_1" / "rank0_memory_snapshot.pickle"
    )
    (root / "elsewhere").symlink_to(outside, target_is_directory=True)
    (root / "iteration_1" / "loop").symlink_to(root, target_is_directory=True)
    tree = find_dump_tree(root)
    assert [Path(p).name for group in tree.groups for p in group.paths] == [
        "rank0_memory_snapshot.pickle",
        "rank1_memory_snapshot.pickle",  # a link to a file inside is read
    ]
    reasons = {Path(item.path).name: item.error for item in tree.skipped}
    assert reasons == {
        "elsewhere": "a link to a folder (not followed)",
        "loop": "a link to a folder (not followed)",
        "rank7_memory_snapshot.pickle": "a link to a file outside the folder (not followed)",
    }


def test_depth_folder_and_file_limits(tmp_path, monkeypatch):
    write_plain(tmp_path / "a" / "rank0_memory_snapshot.pickle", SMALL)
    write_plain(tmp_path / "a" / "b" / "rank1_memory_snapshot.pickle", SMALL)
    monkeypatch.setattr(folder_module, "MAX_DEPTH", 1)
    tree = find_dump_tree(tmp_path)
    assert [group.folder for group in tree.groups] == ["a"]
    assert [(Path(i.path).name, i.error) for i in tree.skipped] == [("b", "a folder more than 1 levels deep")]
    monkeypatch.setattr(folder_module, "MAX_DEPTH", 8)
    monkeypatch.setattr(folder_module, "MAX_FILES", 1)
    tree = find_dump_tree(tmp_path)
    assert [Path(i.path).name for i in tree.skipped] == ["rank1_memory_snapshot.pickle"]
    assert "past the first 1 snapshot files" in tree.skipped[0].error


def test_the_files_read_are_bounded_in_total(tmp_path, capsys):
    for rank in (0, 1):
        write_plain(tmp_path / "iteration_3" / f"rank{rank}_memory_snapshot.pickle", SMALL)
    size = (tmp_path / "iteration_3" / "rank0_memory_snapshot.pickle").stat().st_size
    folder = read_folder(tmp_path, recursive=True, parallel=False, max_total_bytes=size + 1)
    assert [d.rank for d in folder.dumps] == [0]
    (note,) = folder.skipped
    assert note.name == "iteration_3/rank1_memory_snapshot.pickle"
    assert note.reason.startswith("not read: the files of a recursive read may total")
    # a file over --max-bytes is refused as without --recursive
    assert main(["report", str(tmp_path), "-r", "--max-bytes", str(size - 1)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "iteration_3/rank0_memory_snapshot.pickle" in err


def test_recursive_needs_a_folder_and_a_tree_without_snapshots_is_one_line(tmp_path, capsys):
    dump = write_rank(tmp_path, 0, SMALL)
    for verb in ("report", "info"):
        assert main([verb, str(dump), "--recursive"]) == 2
        assert "--recursive applies to a folder" in capsys.readouterr().err
    empty = tmp_path / "empty"
    (empty / "logs").mkdir(parents=True)
    (empty / "logs" / "train.log").write_text("nothing here")
    with pytest.raises(LoadError, match="no snapshot files in this folder or its sub-folders"):
        read_folder(empty, recursive=True, parallel=False)


def test_info_recursive_lists_every_file_by_its_path(tmp_path, capsys):
    outputs = torchtitan_tree(tmp_path)
    shown, rows, skipped = read_folder_info(outputs, recursive=True, parallel=False)
    assert sorted((row.contents.file, row.rank) for row in rows) == [
        ("memory_snapshot/iteration_10/rank0_memory_snapshot.pickle", 0),
        ("memory_snapshot/iteration_10/rank1_memory_snapshot.pickle", 1),
        ("memory_snapshot/step_000000000020_exit/000000_step_20.pickle", 0),
        ("memory_snapshot/step_000000000020_exit/000001_step_20.pickle", 1),
    ]
    assert skipped == ()


def test_redacted_recursive_report_keeps_folder_names_and_redacts_dump_names(tmp_path, capsys):
    run = tmp_path / "run-77"
    run.mkdir()
    write_rank(run, 0, SMALL, host="secrethost")
    (run / "oom-rank1-secrethost-99-20260101T000000Z.pickle").write_bytes(b"\x80\x04broken")
    assert main(["report", str(tmp_path), "-r", "--redact"]) == 0
    out = capsys.readouterr().out
    assert "secrethost" not in out and "run-77/" in out
