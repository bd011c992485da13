"""What a folder report says about its ranks, checked against the files themselves: each figure
computed here, independently of the analysis, from the dumps' own traces and segments."""

from __future__ import annotations

from pathlib import Path

from oomdoctor.analysis.ranks import compare_ranks
from oomdoctor.load import load_raw
from oomdoctor.pipeline import read_folder
from oomdoctor.views import ranks as ranks_view
from tests.test_ranks import BIG, CALM, SMALL, write_rank

# the same GPT and AdamW as CALM with four times the batch; both dumped by hand after their last
# step, when their activations are long gone: at the dump the two hold almost the same bytes
CALM_BIG_BATCH = "no-oom-gpt-adamw-batch-32"


def _rounded(size: int) -> int:
    return max(512, -(-size // 512) * 512)


def trace_peak(path: Path) -> int:
    """The most allocated after any event (docs/definitions.md, "The peak"): a block counts its
    rounded request, or its size in the dump when it is still live there."""
    raw = load_raw(path)
    (trace,) = [t for t in raw["device_traces"] if t]
    in_dump = {
        b["address"]: b["size"] for s in raw["segments"] for b in s["blocks"] if b["state"] == "active_allocated"
    }
    last_alloc: dict[int, int] = {}
    for index, event in enumerate(trace):
        if event["action"] == "alloc":
            last_alloc[event["addr"]] = index
        elif event["action"] == "free_requested":
            last_alloc.pop(event["addr"], None)
    survivors = set(last_alloc.values())
    live: dict[int, int] = {}
    allocated = peak = 0
    for index, event in enumerate(trace):
        if event["action"] == "alloc":
            size = in_dump[event["addr"]] if index in survivors else _rounded(event["size"])
            live[event["addr"]] = size
            allocated += size
        elif event["action"] == "free_requested":
            allocated -= live.pop(event["addr"], 0)
        peak = max(peak, allocated)
    return peak


def dump_bytes(path: Path) -> int:
    raw = load_raw(path)
    return sum(b["size"] for s in raw["segments"] for b in s["blocks"] if b["state"] == "active_allocated")


def test_ranks_that_did_not_run_out_are_compared_at_their_peak_not_at_their_dump(tmp_path):
    """Three ranks, none ran out, each dumped by hand after its last step; rank 2 trained on a batch
    four times the others'. At the dumps the three differ by a few MiB; at their peaks rank 2 holds
    far more. The report says the ranks are compared at their peaks: so they must be."""
    paths = [write_rank(tmp_path, 0, CALM), write_rank(tmp_path, 1, CALM), write_rank(tmp_path, 2, CALM_BIG_BATCH)]
    peaks = [trace_peak(path) for path in paths]
    assert peaks[2] - peaks[0] > 3 * (dump_bytes(paths[2]) - dump_bytes(paths[0]))  # the case is what it says

    comparison = compare_ranks(read_folder(tmp_path, parallel=False).dumps)
    assert [row.allocated_bytes for row in comparison.rows] == peaks
    assert [row.target_kind for row in comparison.rows] == ["peak"] * 3
    assert comparison.median_allocated_bytes == peaks[0]

    top = comparison.differences[0]
    assert top.rank == 2 and top.difference_bytes > 0
    headline = ranks_view.headline(comparison)
    assert headline.startswith("no rank ran out of memory in these 3 files (compared at their peaks); rank 2 holds ")
    total = next(d for d in comparison.differences if d.rank == 2 and d.what == "allocated")
    assert total.difference_bytes == peaks[2] - peaks[0]
    # the full report that follows is the largest rank's (by its peak), as `oomdoctor report FILE` writes it
    dumps = read_folder(tmp_path, parallel=False).dumps
    featured = ranks_view.featured(comparison, dumps)
    assert featured.rank == 2 and featured.analysis.replay.target_kind == "dump"


def test_a_rank_that_left_two_files_is_not_counted_as_two_ranks(tmp_path):
    """Rank 2 left two dumps (a restart, or a file of an earlier run left in the folder): two files
    ran out, one rank did. The headline and the verdict line count files then, and each difference
    names the file it is about."""
    write_rank(tmp_path, 0, CALM)
    write_rank(tmp_path, 1, CALM)
    write_rank(tmp_path, 2, BIG, 0.0, name="oom-rank2-node1-4002-20251231T000000Z.pickle")
    write_rank(tmp_path, 2, BIG, 60.0)
    write_rank(tmp_path, 3, CALM)
    comparison = compare_ranks(read_folder(tmp_path, parallel=False).dumps)
    ran_out = [row for row in comparison.rows if row.ran_out]
    assert len(ran_out) == 2 and {row.rank for row in ran_out} == {2}
    assert comparison.repeated_ranks == (2,)

    headline = ranks_view.headline(comparison)
    assert headline.startswith("rank 2 (oom-rank2-node1-4002-20251231T000000Z.pickle) ran out first")
    assert "1 other file ran out later with the same verdict" in headline
    assert "other rank" not in headline
    assert headline.endswith("3 files did not run out")
    text = ranks_view.render_text("dumps", comparison, read_folder(tmp_path, parallel=False).dumps, ())
    assert "verdicts agree: activation-spike on all 2 files that ran out" in text
    assert "2 ranks" not in text
    for row in ran_out:
        assert f"rank 2 ({row.file}): " in text


def _launched(path: Path, run_id: str, restart_count: int) -> None:
    """Give a dump written by write_rank torchelastic's facts: its launch and restart."""
    import pickle

    raw = load_raw(path)
    raw["oomdoctor"]["elastic"] = {"run_id": run_id, "restart_count": restart_count}
    path.write_bytes(pickle.dumps(raw, protocol=4))


def test_files_of_different_launches_are_not_said_to_have_run_out_first_side_by_side(tmp_path):
    """Rank 1's file is left over from an earlier launch of the job (another torchelastic run id),
    and it ran out a day before the others: 'rank 1 ran out first' would compare two separate runs."""
    _launched(write_rank(tmp_path, 0, SMALL, 86_400.0), "job-18", 0)
    _launched(write_rank(tmp_path, 1, BIG, 0.0), "job-17", 0)
    _launched(write_rank(tmp_path, 2, SMALL, 86_401.0), "job-18", 0)
    comparison = compare_ranks(read_folder(tmp_path, parallel=False).dumps)
    assert comparison.first.rank == 1
    assert comparison.launches == (("job-17", 0), ("job-18", 0))
    headline = ranks_view.headline(comparison)
    assert headline.startswith(
        "rank 1 ran out earliest (step 2, forward) of files from 2 launches or restarts of the job"
    )
    assert "ran out first" not in headline
    (note,) = [n for n in ranks_view.notes(comparison) if "launches" in n]
    assert "run job-17, restart 0, run job-18, restart 0" in note


def test_one_launch_reads_as_before(tmp_path):
    for rank, after in ((0, 1.0), (1, 0.0)):
        _launched(write_rank(tmp_path, rank, SMALL, after), "job-18", 2)
    comparison = compare_ranks(read_folder(tmp_path, parallel=False).dumps)
    assert comparison.launches == (("job-18", 2),)
    assert ranks_view.headline(comparison).startswith("rank 1 ran out first")
    assert not [n for n in ranks_view.notes(comparison) if "launches" in n]


def test_a_file_without_a_trace_is_not_said_to_be_compared_at_its_peak(tmp_path):
    """Rank 1's snapshot holds no allocation in a trace (history was off): its peak is unknown and
    it can only be compared at its dump. The report must not say every rank is compared at its peak."""
    import pickle

    write_rank(tmp_path, 0, CALM)
    untraced = write_rank(tmp_path, 1, CALM)
    raw = load_raw(untraced)
    raw["device_traces"] = [[] for _ in raw["device_traces"]]
    untraced.write_bytes(pickle.dumps(raw, protocol=4))
    comparison = compare_ranks(read_folder(tmp_path, parallel=False).dumps)
    assert [(row.rank, row.target_kind) for row in comparison.rows] == [(0, "peak"), (1, "dump")]
    assert [row.allocated_bytes for row in comparison.rows] == [
        trace_peak(tmp_path / comparison.rows[0].file),
        dump_bytes(untraced),
    ]
    assert ranks_view.headline(comparison).startswith(
        "no rank ran out of memory in these 2 files (compared at their peaks; 1 file without a trace at its dump"
        " (its peak is unknown))"
    )
    text = ranks_view.render_text("dumps", comparison, read_folder(tmp_path, parallel=False).dumps, ())
    assert (
        "Live memory by component (at each rank's peak; 1 file without a trace at its dump (its peak is unknown))"
        in text
    )


def test_without_oom_times_no_rank_is_called_first_anywhere(tmp_path):
    """No file records when it ran out: the headline says which rank was first is unknown, and so
    must the table's OOM column and the banner over the featured report (they said 'first')."""
    import dataclasses

    write_rank(tmp_path, 0, SMALL, 1.0)
    write_rank(tmp_path, 1, SMALL, 0.0)
    untimed = []
    for dump in read_folder(tmp_path, parallel=False).dumps:
        replay = dump.analysis.replay
        ooms = tuple(dataclasses.replace(oom, time_us=None) for oom in replay.ooms)
        analysis = dataclasses.replace(dump.analysis, replay=dataclasses.replace(replay, ooms=ooms))
        untimed.append(dataclasses.replace(dump, oom_time_us=None, analysis=analysis))
    comparison = compare_ranks(untimed)
    assert not comparison.order_known and all(row.oom_time_us is None for row in comparison.rows)
    text = ranks_view.render_text("dumps", comparison, tuple(untimed), ())
    table = text.split("\nLive memory by component")[0]
    assert " first " not in table.split("Ranks\n", 1)[1]
    assert [line.split()[1:3] for line in table.splitlines()[5:7]] == [["time", "unknown"], ["time", "unknown"]]
    assert "Rank 0 (ran out; which rank was first is unknown): " in text
    assert "(ran out first)" not in text


def test_files_of_several_launches_without_oom_times_are_not_ordered_at_all(tmp_path):
    import dataclasses

    _launched(write_rank(tmp_path, 0, SMALL, 1.0), "job-18", 0)
    _launched(write_rank(tmp_path, 1, SMALL, 0.0), "job-17", 0)
    untimed = []
    for dump in read_folder(tmp_path, parallel=False).dumps:
        replay = dump.analysis.replay
        ooms = tuple(dataclasses.replace(oom, time_us=None) for oom in replay.ooms)
        analysis = dataclasses.replace(dump.analysis, replay=dataclasses.replace(replay, ooms=ooms))
        untimed.append(dataclasses.replace(dump, oom_time_us=None, analysis=analysis))
    comparison = compare_ranks(untimed)
    assert len(comparison.launches) == 2
    headline = ranks_view.headline(comparison)
    assert "earliest" not in headline and "which rank was first is unknown" in headline
