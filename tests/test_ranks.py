"""Folders of per-rank dumps: finding the files, reading them in worker processes, comparing ranks,
and `oomdoctor report DIR` / `oomdoctor info DIR` in every format."""

from __future__ import annotations

import gzip
import pickle
import time
from pathlib import Path

import orjson
import pytest

from oomdoctor.analysis.ranks import (
    ALLOCATED,
    RANK_FROM_FILE_NAME,
    RANK_FROM_METADATA,
    RANK_UNKNOWN,
    compare_ranks,
)
from oomdoctor.cli import main
from oomdoctor.errors import LoadError
from oomdoctor.load import load_raw
from oomdoctor.load.folder import find_dump_files, map_files, rank_from_name
from oomdoctor.metadata import COMPONENTS
from oomdoctor.pipeline import read_folder
from oomdoctor.units import human_size
from oomdoctor.views import ranks as ranks_view
from tests.conftest import FIXTURES

DUMPS = FIXTURES / "dumps"
SMALL = "oversized-request-gpt-logits"  # 22.5 MiB allocated, activations 5 MiB
BIG = "activation-spike-gpt-longer-sequence"  # same model, 125 MiB allocated, activations 103 MiB
CALM = "no-oom-gpt-adamw"
BASE_TIME_US = 1_800_000_000_000_000


def _shift_times(raw: dict, delta_us: int) -> None:
    """Move every clock reading of a dump by delta_us, as if the rank had run that much later."""
    for trace in raw.get("device_traces") or []:
        for event in trace:
            if event.get("time_us") is not None:
                event["time_us"] += delta_us
    for annotation in raw.get("external_annotations") or []:
        if annotation.get("time_us") is not None:
            annotation["time_us"] += delta_us
    meta = raw["oomdoctor"]
    for marker in meta.get("markers") or []:
        marker["time_us"] += delta_us
    for oom in [meta.get("oom")] + list(meta.get("ooms_observed") or []):
        if oom and oom.get("time_us") is not None:
            oom["time_us"] += delta_us


def write_rank(
    folder: Path,
    rank: int | None,
    fixture: str,
    oom_after_s: float = 0.0,
    *,
    name: str | None = None,
    host: str | None = None,
    world_size: int = 4,
) -> Path:
    """A copy of a fixture dump as `rank` would have written it, its OOM `oom_after_s` after BASE_TIME_US."""
    raw = load_raw(DUMPS / f"{fixture}.pickle")
    meta = raw["oomdoctor"]
    host = host or f"node{0 if rank is None else rank // 2}"
    meta.update(rank=rank, local_rank=rank, world_size=world_size, host=host, pid=4000 + (rank or 0))
    oom = meta.get("oom")
    if oom:
        _shift_times(raw, BASE_TIME_US - oom["time_us"] + round(oom_after_s * 1e6))
    path = folder / (name or f"oom-rank{rank}-{host}-{4000 + (rank or 0)}-20260101T000000Z.pickle")
    path.write_bytes(pickle.dumps(raw, protocol=4))
    return path


@pytest.fixture(scope="module")
def uneven(tmp_path_factory) -> Path:
    """Four ranks of one job: rank 2 got the bigger batch and ran out first, rank 3 never ran out."""
    folder = tmp_path_factory.mktemp("uneven")
    write_rank(folder, 0, SMALL, 5.0)
    write_rank(folder, 1, SMALL, 3.0)
    write_rank(folder, 2, BIG, 0.0)
    write_rank(folder, 3, CALM)
    (folder / "README.txt").write_text("these are the dumps of job 17\n")
    return folder


@pytest.fixture(scope="module")
def agreeing(tmp_path_factory) -> Path:
    """Four copies of one dump whose OOMs happened at different times: rank 3 first."""
    folder = tmp_path_factory.mktemp("agreeing")
    for rank, after_s in ((0, 2.5), (1, 1.0), (2, 4.0), (3, 0.0)):
        write_rank(folder, rank, SMALL, after_s)
    return folder


# -- finding the files ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, rank",
    [
        ("oom-rank5-gpu-node-7-4242-20250101T000000Z.pickle", 5),
        ("manual-rank12-host-1-20250101T000000Z-2.pickle", 12),
        ("snapshot_rank3.pickle", 3),
        ("RANK-7.pickle.gz", 7),
        ("memory_rank_10_step4.json", 10),
        ("snapshot.pickle", None),
        ("frank2.pickle", None),
    ],
)
def test_rank_from_name(name, rank):
    assert rank_from_name(name) == rank


def test_listing_puts_oomdoctor_dumps_first_in_rank_order_and_skips_with_notes(tmp_path):
    for rank in (10, 2, 0):
        write_rank(tmp_path, rank, SMALL, world_size=11)
    raw = load_raw(DUMPS / f"{SMALL}.pickle")
    (tmp_path / "a-snapshot.pickle.gz").write_bytes(gzip.compress(pickle.dumps(raw, protocol=4)))
    (tmp_path / "notes.txt").write_text("not a dump")
    (tmp_path / "empty.pickle").write_bytes(b"")
    (tmp_path / ".oom-rank4-h-1-20260101T000000Z.pickle.77.tmp").write_bytes(b"\x80\x04half")
    (tmp_path / ".DS_Store").write_bytes(b"\x00\x00")
    (tmp_path / "older").mkdir()

    listing = find_dump_files(tmp_path)
    names = [Path(p).name for p in listing.paths]
    assert names[:3] == [
        "oom-rank0-node0-4000-20260101T000000Z.pickle",
        "oom-rank2-node1-4002-20260101T000000Z.pickle",
        "oom-rank10-node5-4010-20260101T000000Z.pickle",
    ]
    assert names[3:] == ["a-snapshot.pickle.gz"]
    skipped = {Path(item.path).name: item.error for item in listing.skipped}
    assert set(skipped) == {"notes.txt", "empty.pickle", ".oom-rank4-h-1-20260101T000000Z.pickle.77.tmp", "older"}
    assert "not a snapshot" in skipped["notes.txt"]
    assert "empty" in skipped["empty.pickle"]
    assert "still being written" in skipped[".oom-rank4-h-1-20260101T000000Z.pickle.77.tmp"]


def test_listing_a_missing_folder_is_a_load_error(tmp_path):
    with pytest.raises(LoadError, match="no such folder"):
        find_dump_files(tmp_path / "nowhere")


def _fails_on_b(path: str) -> str:
    if path.endswith("b"):
        raise ValueError("boom")
    return path.upper()


@pytest.mark.parametrize("parallel", [True, False], ids=["parallel", "sequential"])
def test_map_files_keeps_order_and_turns_errors_into_notes(parallel):
    outcomes = map_files(["x/a", "x/b", "x/c"], _fails_on_b, parallel=parallel, max_workers=2)
    assert [o.path for o in outcomes] == ["x/a", "x/b", "x/c"]
    assert [o.value for o in outcomes] == ["X/A", None, "X/C"]
    assert outcomes[1].error == "could not be analysed (ValueError: boom)"
    assert outcomes[0].error is None and outcomes[2].error is None


def _started_at(path: str) -> float:
    started = time.monotonic()  # one clock for every process of the machine
    time.sleep(0.2)
    return started


def test_map_files_gives_the_workers_the_largest_files_first(tmp_path):
    paths = []
    for name, kib in (("small", 1), ("largest", 4), ("medium", 2), ("large", 3)):
        path = tmp_path / name
        path.write_bytes(b"x" * kib * 1024)
        paths.append(str(path))
    outcomes = map_files(paths, _started_at, max_workers=2)
    assert [o.path for o in outcomes] == paths  # returned in the listing's order
    started = {Path(o.path).name: o.value for o in outcomes}
    assert max(started["largest"], started["large"]) < min(started["medium"], started["small"])


# -- reading and comparing -------------------------------------------------------------------------


def test_first_rank_standouts_and_verdicts(uneven):
    folder = read_folder(uneven)
    comparison = compare_ranks(folder.dumps)

    assert [row.rank for row in comparison.rows] == [0, 1, 2, 3]
    assert all(row.rank_source == RANK_FROM_METADATA for row in comparison.rows)
    first = comparison.first
    assert first is not None and first.rank == 2
    assert (first.step, first.phase, first.verdict) == (2, "forward", "activation-spike")
    assert comparison.order_known and comparison.ran_out_count == 3
    assert [row.ran_out for row in comparison.rows] == [True, True, True, False]
    assert [row.seconds_after_first for row in comparison.rows] == [5.0, 3.0, 0.0, None]
    assert comparison.world_size == 4 and comparison.missing_ranks == ()

    # rank 2's activations are what stands out most, above the median of all four
    top = comparison.differences[0]
    assert (top.rank, top.what) == (2, "activations") and top.difference_bytes > 0
    activations = [dict(row.components)["activations"] for row in comparison.rows]
    assert top.median_bytes == round(sorted(activations)[1] / 2 + sorted(activations)[2] / 2)
    assert top.difference_bytes == top.bytes - top.median_bytes
    assert any(d.rank == 2 and d.what == ALLOCATED and d.difference_bytes > 0 for d in comparison.differences)

    assert not comparison.verdicts_agree
    assert dict(comparison.verdicts) == {"oversized-request": 2, "activation-spike": 1}
    assert ranks_view.headline(comparison).startswith("rank 2 ran out first (step 2, forward), ")
    assert "more activations than the median rank" in ranks_view.headline(comparison)
    assert "2 other ranks ran out later (other verdicts: 2 oversized-request)" in ranks_view.headline(comparison)
    assert ranks_view.headline(comparison).endswith("1 rank did not run out")
    assert any("2 hosts" in note for note in ranks_view.notes(comparison))
    assert (comparison.untimed_count, comparison.clock_hosts, comparison.world_sizes) == (0, 2, (4,))
    assert [item.name for item in folder.skipped] == ["README.txt"]


def test_same_verdict_on_every_rank(agreeing):
    comparison = compare_ranks(read_folder(agreeing).dumps)
    assert comparison.first.rank == 3
    assert comparison.verdicts_agree and dict(comparison.verdicts) == {"oversized-request": 4}
    assert comparison.differences == ()
    assert (
        ranks_view.headline(comparison)
        == "rank 3 ran out first (step 0, forward); 3 other ranks ran out later with the same verdict"
    )
    assert [row.seconds_after_first for row in comparison.rows] == [2.5, 1.0, 4.0, 0.0]


def test_parallel_and_sequential_reads_agree(uneven):
    parallel = read_folder(uneven, max_workers=2)
    sequential = read_folder(uneven, parallel=False)
    assert parallel == sequential
    assert compare_ranks(parallel.dumps) == compare_ranks(sequential.dumps)
    rendered = [
        ranks_view.render("json", "dumps", compare_ranks(f.dumps), f.dumps, f.skipped) for f in (parallel, sequential)
    ]
    assert rendered[0] == rendered[1]


def test_rank_from_the_file_name_or_unknown_and_missing_ranks(tmp_path):
    write_rank(tmp_path, None, SMALL, 1.0, name="snapshot_rank5.pickle", world_size=8)
    write_rank(tmp_path, None, BIG, 0.0, name="mystery.pickle", world_size=8)
    comparison = compare_ranks(read_folder(tmp_path).dumps)
    assert [(row.rank, row.rank_source) for row in comparison.rows] == [(5, RANK_FROM_FILE_NAME), (None, RANK_UNKNOWN)]
    assert comparison.first.file == "mystery.pickle"
    assert ranks_view.headline(comparison).startswith("mystery.pickle ran out first")
    assert comparison.missing_ranks == (0, 1, 2, 3, 4, 6, 7)
    assert any("neither in their metadata nor in their name" in note for note in ranks_view.notes(comparison))


def test_no_rank_ran_out(tmp_path):
    write_rank(tmp_path, 0, CALM)
    write_rank(tmp_path, 1, "no-oom-mlp-adam")
    comparison = compare_ranks(read_folder(tmp_path).dumps)
    assert comparison.first is None and comparison.ran_out_count == 0
    assert ranks_view.headline(comparison).startswith("no rank ran out of memory in these 2 files")
    assert dict(comparison.verdicts) == {"no-oom": 2}


def test_unknown_oom_times_leave_the_order_unknown(uneven):
    import dataclasses

    dumps = read_folder(uneven, parallel=False).dumps
    untimed = []
    for dump in dumps:
        replay = dump.analysis.replay
        ooms = tuple(dataclasses.replace(oom, time_us=None) for oom in replay.ooms)
        analysis = dataclasses.replace(dump.analysis, replay=dataclasses.replace(replay, ooms=ooms))
        untimed.append(dataclasses.replace(dump, oom_time_us=None, analysis=analysis))
    comparison = compare_ranks(untimed)
    assert not comparison.order_known
    assert comparison.first.rank == 0  # the lowest rank that ran out, said to be of unknown order
    assert "which rank was first is unknown" in ranks_view.headline(comparison)
    assert "ran out too" in ranks_view.headline(comparison)
    assert any("no OOM time is recorded" in note for note in ranks_view.notes(comparison))


def test_a_broken_file_is_a_note_and_the_others_are_read(tmp_path):
    write_rank(tmp_path, 0, SMALL)
    write_rank(tmp_path, 1, BIG)
    (tmp_path / "oom-rank2-node1-4002-20260101T000000Z.pickle").write_bytes(
        pickle.dumps({"segments": []}, protocol=4)[:-5]
    )
    folder = read_folder(tmp_path)
    assert [dump.rank for dump in folder.dumps] == [0, 1]
    (note,) = [ranks_view.skipped_note(item) for item in folder.skipped]
    assert note.startswith("skipped oom-rank2-node1-4002-20260101T000000Z.pickle: ")
    assert str(tmp_path) not in note


# -- the commands ------------------------------------------------------------------------------------


def test_report_text_has_the_table_and_the_first_ranks_full_report(uneven, capsys):
    assert main(["report", str(uneven)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith("rank 2 ran out first")
    assert "4 dump files of world size 4, 3 ran out of memory, 1 skipped" in lines[1]
    table = lines[lines.index("Ranks") + 1 : lines.index("Ranks") + 6]
    assert table[0].split()[:3] == ["rank", "OOM", "verdict"]
    assert [row.split()[:3] for row in table[1:]] == [
        ["0", "+5.000", "s"],
        ["1", "+3.000", "s"],
        ["2", "first", "activation-spike"],
        ["3", "no", "OOM"],
    ]
    assert "skipped README.txt: not a snapshot" in out
    components = lines[
        lines.index("Live memory by component (at the OOM, or the peak for ranks that did not run out)") + 1 :
    ]
    assert components[0].split()[:2] == ["rank", "parameters"] and "activations" in components[0]
    assert components[3].split()[0] == "2" and components[5].split()[0] == "median"
    assert "Rank 2 (ran out first): oom-rank2-node1-4002-20260101T000000Z.pickle" in out
    assert "Verdict: activation-spike" in out


def test_report_json_schema(uneven, capsys):
    assert main(["report", str(uneven), "--format", "json"]) == 0
    data = orjson.loads(capsys.readouterr().out)
    assert data["schema_version"] == 1 and data["kind"] == "ranks"
    for key in (
        "directory",
        "headline",
        "file_count",
        "world_size",
        "ran_out_count",
        "order_known",
        "first",
        "ranks",
        "median",
        "differences",
        "verdicts",
        "verdicts_agree",
        "missing_ranks",
        "repeated_ranks",
        "notes",
        "skipped",
        "report",
    ):
        assert key in data, key
    assert data["file_count"] == 4 and data["first"]["rank"] == 2
    assert [row["rank"] for row in data["ranks"]] == [0, 1, 2, 3]
    row = data["ranks"][2]
    assert set(row["components"]) == set(COMPONENTS)
    assert isinstance(row["allocated_bytes"], int) and row["oom_time_us"] == BASE_TIME_US
    assert data["differences"][0] | {} == {**data["differences"][0], "rank": 2, "what": "activations"}
    assert data["skipped"] == [
        {"file": "README.txt", "reason": "not a snapshot (not a pickle, gzip, JSON or memory_viz HTML file)"}
    ]
    assert data["report"]["verdict"] == "activation-spike" and data["report"]["file"].startswith("oom-rank2-")
    assert data["report"]["environment"]["rank"] == 2


def test_report_markdown_and_redacted(uneven, capsys):
    assert main(["report", str(uneven), "--format", "md", "--redact"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("## oomdoctor: 4 ranks\n")
    assert "| rank | OOM | verdict | where |" in out
    assert "| 2 | first | `activation-spike` | step 2, forward |" in out
    assert "### Rank 2: the full report" in out
    assert "node1" not in out and "node0" not in out and "4002" not in out
    assert str(uneven.parent) not in out
    assert "oom-rank2-<host>-<pid>-20260101T000000Z.pickle" in out
    assert "| median | " in out
    from tests.test_markdown_report import _assert_tables_are_well_formed

    _assert_tables_are_well_formed(out)


def test_info_one_line_per_file(uneven, capsys):
    assert main(["info", str(uneven)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 5
    assert lines[0].startswith("oom-rank0-node0-4000-20260101T000000Z.pickle  rank 0  pickle-protocol-4 dict")
    assert "1 OOM (request 32.0 MiB)" in lines[0]
    assert lines[3].endswith("no OOM")
    assert lines[4].startswith("README.txt  skipped: not a snapshot")
    assert main(["info", str(uneven), "--format", "json"]) == 0
    data = orjson.loads(capsys.readouterr().out)
    assert data["kind"] == "folder-info" and [f["rank"] for f in data["files"]] == [0, 1, 2, 3]
    assert data["files"][2]["oom_events"][0]["request_bytes"] == 16 * 1024 * 1024


@pytest.mark.parametrize("verb", ["report", "info"])
def test_folders_without_snapshots_exit_2_with_one_line(tmp_path, capsys, verb):
    assert main([verb, str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err == f"oomdoctor: {tmp_path}: no snapshot files in this folder\n"
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "bad.pickle").write_bytes(b"\x80\x04garbage")
    assert main([verb, str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no readable snapshot in this folder" in err and "Traceback" not in err


def test_report_folder_refuses_device_and_open_stays_single_file(uneven, capsys):
    assert main(["report", str(uneven), "--device", "0"]) == 2
    assert "--device applies to one file" in capsys.readouterr().err
    assert main(["open", str(uneven)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"oomdoctor report {uneven}" in err


@pytest.mark.parametrize(
    "module", ["oomdoctor.pipeline", "oomdoctor.analysis.ranks", "oomdoctor.load.folder", "oomdoctor.views.ranks"]
)
def test_folder_modules_stay_light(module):
    from tests.test_layering import _heavy_modules_after_import

    assert _heavy_modules_after_import(module) == []


def test_the_folder_views_need_nothing_from_the_loader():
    """views/ranks.py renders analysis results (SkippedFile included): importing it reads no loader module."""
    import subprocess
    import sys

    code = "import sys, oomdoctor.views.ranks\nprint(sorted(m for m in sys.modules if m.startswith('oomdoctor.load')))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_max_bytes_reaches_every_file(uneven, capsys):
    assert main(["report", str(uneven), "--max-bytes", "1KiB"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "larger than" in err


@pytest.mark.slow
def test_a_folder_of_real_snapshots(corpus_dir):
    """The corpus is no rank folder, but every file in it must be read or skipped with a reason."""
    folder = read_folder(corpus_dir / "snapshots")
    assert len(folder.dumps) + len(folder.skipped) == len(list((corpus_dir / "snapshots").iterdir()))
    comparison = compare_ranks(folder.dumps)
    assert comparison.ran_out_count == 2 and comparison.first is not None
    assert comparison.first.oom_time_us == min(r.oom_time_us for r in comparison.rows if r.ran_out)
    other = read_folder(corpus_dir / "other_formats")
    assert [d.file for d in other.dumps] == ["memory_viz_html_export__silmont2000__bf16.html"]
    assert [s.name for s in other.skipped] == ["profiler_memory_timeline_raw__tonghuikang__modal_gpu_adam.raw.json.gz"]


def test_a_rank_holding_extra_memory_is_named_even_when_it_was_not_first(tmp_path, capsys):
    write_rank(tmp_path, 0, BIG, 2.0)
    for rank in (1, 2, 3):
        write_rank(tmp_path, rank, SMALL, 0.5 * rank)
    comparison = compare_ranks(read_folder(tmp_path).dumps)
    assert comparison.first.rank == 1
    top = comparison.differences[0]
    assert top.rank == 0 and top.difference_bytes > 0
    assert ranks_view.headline(comparison).startswith(
        "rank 1 ran out first (step 0, forward); 3 other ranks ran out later (2 with the same verdict, 1 activation-spike)"
    )
    activations = {row.rank: dict(row.components)["activations"] for row in comparison.rows}
    assert activations[1] == activations[2] == activations[3]  # the median rank is any of them
    excess = human_size(activations[0] - activations[1], decimals=1)
    # rank 0 ran out in step 2, the others in step 0, which is all their traces hold: each is compared
    # at its peak over its trace (its OOM here), and the headline says the moments differ
    assert ranks_view.headline(comparison).endswith(
        f"; rank 0 holds {excess} more activations than the median rank at their peaks over their traces"
        " (the ranks stopped at different moments)"
    )
    assert main(["report", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "they ran out at different moments: step 0, forward on 3; step 2, forward on 1" in out


def test_redacted_folder_report_redacts_skipped_names_too(tmp_path, capsys):
    write_rank(tmp_path, 0, SMALL, host="secret-node")
    (tmp_path / ".oom-rank1-secret-node-4001-20260101T000000Z.pickle.4001.tmp").write_bytes(b"\x80\x04")
    assert main(["report", str(tmp_path), "--format", "json", "--redact"]) == 0
    out = capsys.readouterr().out
    assert "secret-node" not in out and "4001" not in out
    data = orjson.loads(out)
    assert data["directory"] == tmp_path.name
    assert data["skipped"][0]["file"] == ".oom-rank1-<host>-<pid>-20260101T000000Z.pickle.<pid>.tmp"


def test_one_file_is_read_in_this_process(tmp_path, monkeypatch, capsys):
    import oomdoctor.load.folder as folder_module

    def no_pool(*args, **kwargs):
        raise AssertionError("a process pool for one file")

    monkeypatch.setattr(folder_module, "ProcessPoolExecutor", no_pool)
    write_rank(tmp_path, 6, BIG)
    comparison = compare_ranks(read_folder(tmp_path).dumps)
    assert ranks_view.headline(comparison) == "rank 6 ran out (step 2, forward); it is the only file"
    assert comparison.differences == () and comparison.missing_ranks == (0, 1, 2, 3)
    assert main(["report", str(tmp_path), "--format", "md"]) == 0
    assert "### Rank 6: the full report" in capsys.readouterr().out


def test_a_pool_that_cannot_start_falls_back_to_one_process(tmp_path, monkeypatch):
    import oomdoctor.load.folder as folder_module

    def no_processes(*args, **kwargs):
        raise OSError("no semaphores here")

    monkeypatch.setattr(folder_module, "ProcessPoolExecutor", no_processes)
    write_rank(tmp_path, 0, SMALL, 1.0)
    write_rank(tmp_path, 1, SMALL, 0.0)
    assert compare_ranks(read_folder(tmp_path).dumps).first.rank == 1


def test_worker_count_is_bounded_by_files_cpus_and_memory():
    from oomdoctor.load.folder import MEMORY_PER_FILE_BYTE, worker_count

    assert worker_count(64, cpus=16) == 16
    assert worker_count(3, cpus=16) == 3
    assert worker_count(0, cpus=16) == 1
    GiB = 1024**3
    per_file = MEMORY_PER_FILE_BYTE * 2 * GiB  # 2 GiB dumps
    assert worker_count(64, cpus=16, largest_file_bytes=2 * GiB, available_bytes=5 * per_file + 1) == 5
    assert worker_count(64, cpus=16, largest_file_bytes=2 * GiB, available_bytes=GiB) == 1
    assert worker_count(64, cpus=16, largest_file_bytes=2 * GiB, available_bytes=None) == 16


def test_worker_count_reads_in_this_process_when_other_work_keeps_the_cpus_busy():
    from oomdoctor.load.folder import worker_count

    assert worker_count(16, cpus=2, idle=2.0) == 2
    assert worker_count(16, cpus=2, idle=1.6) == 2
    assert worker_count(16, cpus=2, idle=1.2) == 1  # one core left: workers would only share it
    assert worker_count(16, cpus=2, idle=-3.0) == 1
    assert worker_count(16, cpus=8, idle=4.0) == 4
