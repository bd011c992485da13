"""A bounded run of the whole-pipeline fuzzer (benchmarks/fuzz_pipeline.py): no mutated dump may end
in a traceback, a hang, a crash, a memory blowup, a rejection of more than one line, or raw control
characters in what oomdoctor prints or the TUI shows.

    pytest tests/test_fuzz_pipeline.py -m slow -s          # prints the summary table

OOMDOCTOR_FUZZ_CASES sets the number of cases (default 2000, about 60-120 s on 2 cores). Corpus
seeds are used when the corpus is there (OOMDOCTOR_CORPUS or ../shared/corpus), else fixtures only.
Each failure signature in the table names its first case; `python benchmarks/fuzz_pipeline.py
--case N` re-runs it in-process with the traceback.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CASES = int(os.environ.get("OOMDOCTOR_FUZZ_CASES", "2000"))


def _harness():
    name = "fuzz_pipeline"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / "fuzz_pipeline.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def test_cases_are_deterministic_and_cover_every_strategy() -> None:
    fuzz = _harness()
    seeds = fuzz.load_seeds(use_corpus=False)
    again = fuzz.load_seeds(use_corpus=False)
    strategies = set()
    for case in range(40):
        first, second = fuzz.make_case(seeds, 0, case), fuzz.make_case(again, 0, case)
        assert (first.strategy, first.data, first.description) == (second.strategy, second.data, second.description)
        strategies.add(first.strategy)
    assert strategies == set(fuzz.STRATEGIES)


def test_checks_catch_what_they_are_for(tmp_path: Path) -> None:
    fuzz = _harness()
    kinds = lambda failures: [f.kind for f in failures]  # noqa: E731
    assert kinds(fuzz.check_run("report-text", "text", 0, b"verdict\n\tok\n", "", None)) == []
    assert kinds(fuzz.check_run("report-text", "text", 0, b"\x1b]0;title\x07", "", None)) == ["control-bytes"]
    assert kinds(fuzz.check_run("report-md", "text", 0, "\u009b2J".encode(), "", None)) == ["control-bytes"]
    assert kinds(fuzz.check_run("info-text", "text", 2, b"", "oomdoctor: x: not a snapshot\n", None)) == []
    assert kinds(fuzz.check_run("info-text", "text", 2, b"", "Traceback (most recent call last):\n  ...\n", None)) == [
        "rejection"
    ]
    assert kinds(fuzz.check_run("report-json", "json", 0, b'{"verdict": "unk', "", None)) == ["invalid-json"]
    assert kinds(fuzz.check_run("report-text", "text", 3, b"", "", None)) == ["exit-code"]
    assert kinds(fuzz.check_run("redact", "redact", 0, b"", "wrote x\n", tmp_path / "missing.pickle")) == ["no-output"]
    try:
        int("\u00b2")
    except ValueError as error:
        failure = fuzz.exception_failure("report-text", error)
    assert failure.signature.startswith("ValueError at ")


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_fuzz_pipeline_has_no_failures(capsys) -> None:
    fuzz = _harness()
    settings = fuzz.Settings(seed=0, time_limit_s=10.0, address_space_bytes=4 << 30, rss_cap_bytes=3 << 30)
    summary = fuzz.run_campaign(CASES, workers=2, settings=settings)
    table = summary.table()
    with capsys.disabled():
        print(f"\n{table}\n")
    assert summary.cases == CASES
    assert summary.failure_count == 0, (
        f"{summary.failure_count} failing cases (re-run one: python benchmarks/fuzz_pipeline.py --case N)\n{table}"
    )
