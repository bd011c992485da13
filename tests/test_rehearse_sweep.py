"""`oomdoctor rehearse --sweep NAME`: the largest value of one script argument that fits.

The search itself (doubling, bisection, what contradicts monotonicity) is checked without processes;
the command end to end on a script that holds `batch` tensors of `--mib` MiB each, on a 64 MiB
device, with few probes (each probe is a fresh process: about 3 s).
"""

from __future__ import annotations

import json
import textwrap

import pytest

from oomdoctor.analysis.sweep import FAILED, FITS, OUT_OF_MEMORY, Probe, contradictions, sweep
from oomdoctor.cli import main
from oomdoctor.commands.rehearse import sweep_option, with_value
from oomdoctor.errors import OomdoctorError

MiB = 1024 * 1024

SCRIPT = textwrap.dedent(
    """
    import argparse, torch
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--mib", type=int, default=1)
    parser.add_argument("--crash-at", type=int, default=0)
    parser.add_argument("--unique-at", type=int, default=0)
    args = parser.parse_args()
    if args.crash_at and args.batch >= args.crash_at:
        raise ValueError(f"batch {args.batch} is too large for this script")
    if args.unique_at and args.batch >= args.unique_at:
        torch.unique(torch.randn(8))
    held = [torch.empty(args.mib * 256 * 1024) for _ in range(args.batch)]  # batch x mib MiB
    """
)


def budget(limit: int, per_unit: int = 1):
    """A probe function for `sweep`: value * per_unit MiB fits in `limit` MiB; the calls are kept."""
    calls: list[int] = []

    def probe(value: int) -> Probe:
        calls.append(value)
        needed = value * per_unit * MiB
        fits = needed <= limit * MiB
        peak = needed if fits else limit * MiB
        return Probe(value, FITS if fits else OUT_OF_MEMORY, peak, peak)

    return probe, calls


def test_doubling_then_bisection_finds_the_largest_value_and_its_neighbour():
    probe, calls = budget(48)
    result = sweep(probe, lo=1, hi=1000)
    assert result.largest_fit.value == 48 and result.smallest_failure.value == 49
    assert calls == [1, 2, 4, 8, 16, 32, 64, 48, 56, 52, 50, 49]
    assert not result.contradictions and result.stopped is None and not result.reached_hi


def test_the_range_is_respected():
    probe, calls = budget(48)
    result = sweep(probe, lo=5, hi=30)
    assert calls == [5, 10, 20, 30] and result.reached_hi and result.smallest_failure is None
    probe, calls = budget(48)
    result = sweep(probe, lo=50, hi=100)
    assert calls == [50] and result.largest_fit is None and result.smallest_failure.value == 50
    with pytest.raises(ValueError):
        sweep(probe, lo=4, hi=2)


def test_a_probe_that_fails_stops_the_search():
    def probe(value: int) -> Probe:
        if value == 4:
            return Probe(value, FAILED, 0, 0, reason="ValueError: no")
        return Probe(value, FITS, value, value)

    result = sweep(probe, lo=1, hi=100)
    assert result.stopped.value == 4 and [p.value for p in result.probes] == [1, 2, 4]


def test_what_contradicts_memory_growing_with_the_value():
    fits = [Probe(2, FITS, 10, 40), Probe(4, FITS, 20, 30)]  # 4 reserved less than 2
    kinds = [(item.kind, item.smaller.value, item.larger.value) for item in contradictions(fits)]
    assert kinds == [("peak_fell", 2, 4)]
    above = [Probe(3, OUT_OF_MEMORY, 0, 0), Probe(5, FITS, 1, 1)]
    assert [(item.kind, item.smaller.value) for item in contradictions(above)] == [("fits_above_failure", 3)]


def test_the_value_is_replaced_where_the_arguments_give_it_or_appended():
    assert with_value(["--lr", "3"], "--batch", 8) == ["--lr", "3", "--batch", "8"]
    assert with_value(["--batch", "2", "--lr", "3"], "--batch", 8) == ["--batch", "8", "--lr", "3"]
    assert with_value(["--batch=2"], "--batch", 8) == ["--batch=8"]
    assert with_value(["--batch-size", "2"], "--batch", 8) == ["--batch-size", "2", "--batch", "8"]
    assert sweep_option("batch-size") == sweep_option("--batch-size") == "--batch-size"
    assert sweep_option("-b") == "-b"
    for bad in ("", "--", "batch size", "--batch=3", "-"):
        with pytest.raises(OomdoctorError):
            sweep_option(bad)


# -- end to end: each probe is `oomdoctor rehearse` in a fresh process -----------------------------


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("OOMDOCTOR_DIR", raising=False)
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    (tmp_path / "script.py").write_text(SCRIPT)
    return tmp_path


def oomdoctor(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.slow
def test_the_largest_value_fits_and_the_next_does_not(workdir, capsys):
    # 20 MiB a unit: 3 fit in 64 MiB, 4 do not; probes 1, 2, 4, 3
    code, out, err = oomdoctor(
        capsys, "rehearse", "--fake", "script.py", "--device-memory", "64MiB", "--sweep", "--batch", "--", "--mib", "20"
    )
    assert code == 0, out + err
    lines = out.splitlines()
    assert lines[0].startswith("Largest --batch that fits in 64.00 MiB: 3 (4 runs out: the request of 20.00 MiB")
    assert "at script.py:13 in <listcomp>" in lines[0] and "rehearsal without data" in lines[0]
    assert "peak at 3: 60.00 MiB allocated, 60.00 MiB reserved by PyTorch; 4.00 MiB to spare" in out
    rows = [line.split() for line in lines if line.startswith("    ") and line.split()[0].isdigit()]
    assert [(row[0], row[1]) for row in rows] == [("1", "fits"), ("2", "fits"), ("4", "runs"), ("3", "fits")]
    assert "assumes memory grows with --batch" in out and "the probes agree" in out
    dump = next(line for line in lines if line.strip().startswith("dump of 4:"))
    assert (workdir / dump.split()[3]).is_file()
    # each checked by a single rehearsal
    for batch, expected in (("3", 0), ("4", 1)):
        code, out, _ = oomdoctor(
            capsys, "rehearse", "--fake", "script.py", "--device-memory", "64MiB", "--", "--mib", "20", "--batch", batch
        )
        assert code == expected, out


@pytest.mark.slow
def test_hi_bounds_the_search_and_json_says_so(workdir, capsys):
    code, out, err = oomdoctor(
        capsys, "rehearse", "script.py", "--device-memory", "64MiB", "--sweep", "batch", "--hi", "2",
        "--format", "json", "--", "--mib", "20",
    )  # fmt: skip
    assert code == 0, out + err
    answer = json.loads(out)
    assert answer["largest_fit"] == 2 and answer["smallest_failure"] is None and answer["reached_hi"]
    assert [probe["value"] for probe in answer["probes"]] == [1, 2]
    assert answer["peak_reserved_bytes"] == 40 * MiB and answer["assumes_monotone"] and not answer["contradictions"]
    assert answer["headline"].startswith("Largest --batch that fits in 64.00 MiB: 2, the top of the range (--hi 2")


@pytest.mark.slow
def test_a_crash_stops_the_sweep_with_one_line(workdir, capsys):
    code, out, _ = oomdoctor(
        capsys, "rehearse", "script.py", "--device-memory", "64MiB", "--sweep", "batch", "--", "--crash-at", "2"
    )
    assert code == 1
    assert out.strip().splitlines() == [
        "Sweep stopped at --batch 2: script.py failed before running out of memory: "
        "ValueError: batch 2 is too large for this script"
    ]


@pytest.mark.slow
def test_nothing_fits_and_needs_data_have_their_exit_status(workdir, capsys):
    code, out, _ = oomdoctor(
        capsys, "rehearse", "--fake", "script.py", "--device-memory", "64MiB", "--sweep", "batch", "--lo", "4",
        "--", "--mib", "20",
    )  # fmt: skip
    assert code == 1 and out.startswith("Nothing fits: --batch 4 (--lo, the smallest tried) runs out in 64.00 MiB")
    code, out, _ = oomdoctor(
        capsys, "rehearse", "--fake", "script.py", "--device-memory", "64MiB", "--sweep", "batch", "--",
        "--unique-at", "1",
    )  # fmt: skip
    assert code == 3
    assert out.strip().startswith("Sweep stopped at --batch 1: cannot rehearse without data: script.py:12 runs")
    assert len(out.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--sweep", "batch size"], "--sweep needs the name of one of the script's options"),
        (["--sweep", "batch", "--lo", "0"], "--lo must be 1 or more"),
        (["--sweep", "batch", "--lo", "many"], "--lo must be a whole number"),
        (["--sweep", "batch", "--lo", "8", "--hi", "4"], "--hi 4 is below --lo 8"),
        (["--hi", "4"], "--lo and --hi go with --sweep NAME"),
    ],
)
def test_bad_sweep_input_is_one_line_and_exit_2(workdir, capsys, argv, message):
    code, out, err = oomdoctor(capsys, "rehearse", "script.py", "--device-memory", "64MiB", *argv)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1 and not out


@pytest.mark.slow
def test_an_option_the_script_does_not_take_is_bad_input(workdir, capsys):
    code, out, err = oomdoctor(capsys, "rehearse", "script.py", "--device-memory", "64MiB", "--sweep", "batch-size")
    assert code == 2 and not out
    assert "script.py does not take --batch-size: script.py: error: unrecognized arguments: --batch-size 1" in err
    assert len(err.strip().splitlines()) == 1
