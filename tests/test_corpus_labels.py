"""oomdoctor against the expert readings of the real corpus (issue 11, "Must show"): for every file of
`../shared/corpus/labels/labels.json`, the verdict, the judged moment (device, step, phase) and the
components at that moment (every expert category of at least 5% of the total within 10%).

The rules are benchmarks/corpus_score.py's, imported from benchmarks/corpus_scoring.py (the pure
half of that script; docs/corpus-score.md explains them). Here each report is made in-process
(`oomdoctor.pipeline.report_file(path, "json")`, what `oomdoctor report FILE --format json` prints),
so the whole corpus takes seconds. Each (file, aspect) is its own case; the misses known today are
listed in KNOWN_MISSES below and expected to fail (strict): a fix that makes one pass fails the run
until the table loses that entry, and a regression in any other case fails it too.

`pytest -s tests/test_corpus_labels.py` prints the score table and the totals (as the script does),
with main 9f460ab's figures from docs/corpus-score.md next to them.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import re
import sys
from types import ModuleType
from typing import Any

import pytest

from tests.conftest import CORPUS, ROOT

ASPECTS = ("verdict", "moment", "categories")

# The misses known today: file -> {aspect: why}, the why copied from the score row. Each is a strict
# xfail: when the analysis gets one right, its case fails ("XPASS(strict)") until its entry is removed
# here; a case not listed that stops passing fails as any test does. "categories" passes only when
# every scored category is right, so its why lists the partial and wrong ones.
KNOWN_MISSES: dict[str, dict[str, str]] = {
    "compile_context__decomfl__memory.pickle": {
        "moment": "phase between_steps (expert optimizer_step)",
    },
    "cs336__bcrafton__memory_snapshot.pickle": {
        "categories": "1/2/0: parameters + gradients partial (1.42 GiB for 1.73 GiB, -18%), optimizer state partial (1.71 GiB for 1.42 GiB, +20%)",
    },
    "segments_only_26GB__verl__mem.pickle": {
        "categories": "1/1/0: vLLM weights + Megatron param/grad buffers partial (2.14 GiB for 1.85 GiB, +16%)",
    },
}


# ---- the scorer, the labels and the reports -------------------------------------------------------


def _scoring() -> ModuleType:
    """benchmarks/corpus_scoring.py, under the name benchmarks/corpus_score.py imports it by."""
    name = "corpus_scoring"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / "corpus_scoring.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


scoring = _scoring()
LABELS_PATH = CORPUS / "labels" / "labels.json" if CORPUS else None


def _labels() -> list[dict[str, Any]]:
    if LABELS_PATH is None or not LABELS_PATH.is_file():
        return []
    return [label for label in json.loads(LABELS_PATH.read_text(encoding="utf-8")) if isinstance(label, dict)]


LABELS = _labels()
LABEL_OF = {str(label.get("file")): label for label in LABELS}


def labelled_files() -> list[str]:
    return list(LABEL_OF)


def file_id(file: str) -> str:
    return scoring._short(file)


@functools.cache
def report_of(file: str) -> dict[str, Any]:
    """`oomdoctor report FILE --format json`, in-process (shared with tests/test_corpus_claims.py)."""
    from oomdoctor import pipeline

    assert CORPUS is not None
    return json.loads(pipeline.report_file(str(CORPUS / "snapshots" / file), "json"))


@functools.cache
def score_of(file: str) -> Any:
    """The scorer's FileScore for one labelled file; a report that raises is wrong on every count."""
    expected = scoring.expected_of(LABEL_OF[file])
    assert CORPUS is not None
    if not (CORPUS / "snapshots" / file).is_file():
        observed = scoring.Observed(error="file missing from the corpus's snapshots/")
    else:
        try:
            observed = scoring.observed_of(report_of(file))
        except Exception as exc:  # the row says why; tests/test_analysis_corpus.py owns crashes
            observed = scoring.Observed(error=f"{type(exc).__name__}: {exc}"[:300])
    return scoring.score(expected, observed)


def aspect_result(result: Any, aspect: str) -> tuple[bool, str]:
    """Whether one aspect of a FileScore is right, and why not (the score row's wording)."""
    if result.observed.error is not None:
        return False, f"no report: {result.observed.error}"
    if aspect == "verdict":
        return result.verdict_right, result.verdict_why
    if aspect == "moment":
        return result.moment_right, result.moment_why
    scored = [g for g in result.expected.groups if g.scored]
    grades = [g.grade for g in scored]
    counts = "/".join(str(grades.count(k)) for k in ("right", "partial", "wrong"))
    misses = [
        f"{' + '.join(g.names)} [{' + '.join(g.classes)}] {g.grade}: oomdoctor {scoring._size(g.oomdoctor_bytes)}"
        f" for the expert's {scoring._size(g.expert_bytes)}" + ("" if g.error is None else f" (off by {g.error:.0%})")
        for g in scored
        if g.grade != "right"
    ]
    return not misses, f"{counts} right/partial/wrong; " + "; ".join(misses) if misses else ""


def case_params() -> list[Any]:
    if CORPUS is None:
        return [pytest.param(None, None, marks=pytest.mark.skip(reason="corpus not found (../shared/corpus)"))]
    cases = []
    for file in labelled_files() or [None]:  # no labels under a present corpus: one case that fails
        for aspect in ASPECTS:
            why = KNOWN_MISSES.get(file or "", {}).get(aspect)
            marks = [pytest.mark.xfail(strict=True, reason=why)] if why else []
            cases.append(
                pytest.param(file, aspect, id=f"{file_id(file) if file else 'no-labels'}-{aspect}", marks=marks)
            )
    return cases


def baseline_note() -> str:
    """main 9f460ab's figures as docs/corpus-score.md's baseline table gives them (printed only)."""
    doc = (ROOT / "docs" / "corpus-score.md").read_text(encoding="utf-8")
    match = re.search(r"^\| main 9f460ab \| (\S+) \| (\S+) \| ([\d ]+)/([\d ]+)/([\d ]+) \|", doc, re.M)
    if not match:
        return "main 9f460ab: (no baseline row in docs/corpus-score.md)"
    verdicts, moments, right, partial, wrong = (g.strip() for g in match.groups())
    return (
        f"main 9f460ab (docs/corpus-score.md): verdicts {verdicts}, moments {moments}, "
        f"categories {right} right / {partial} partial / {wrong} wrong"
    )


# ---- the tests ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("file", "aspect"), case_params())
def test_corpus_file_agrees_with_the_expert(file, aspect):
    assert file is not None, f"no labelled files in {LABELS_PATH}"
    result = score_of(file)
    right, why = aspect_result(result, aspect)
    assert right, f"{file_id(file)} {aspect}: {why}"


def test_score_table(corpus_dir):
    """The scorer's table and totals for every labelled file (shown with -s or on a failure); every
    file gets a report in-process and every label can be read by the scorer."""
    assert LABELS, f"no labels in {LABELS_PATH}"
    scores = [score_of(file) for file in labelled_files()]
    print()
    print(scoring.text_report(scores, "(in-process, this checkout)"), end="")
    print(baseline_note())
    assert not [s.file for s in scores if s.observed.error], "files without a report"
    problems = {s.file: s.expected.problems for s in scores if s.expected.problems}
    assert not problems, f"labels the scorer cannot read: {problems}"


def test_every_snapshot_is_labelled_and_every_label_has_a_snapshot(corpus_dir):
    snapshots = {p.name for p in (corpus_dir / "snapshots").iterdir() if p.is_file()}
    assert snapshots and set(LABEL_OF) == snapshots


def test_known_misses_name_labelled_files_and_aspects(corpus_dir):
    """A typo in the table would silently turn an expected failure into nothing."""
    assert set(KNOWN_MISSES) <= set(LABEL_OF)
    assert all(set(aspects) <= set(ASPECTS) and all(aspects.values()) for aspects in KNOWN_MISSES.values())


def test_aspect_result_reads_the_score():
    """The per-aspect judgement on a made-up label and report: it can fail."""
    label = {
        "file": "made_up__x__y.pickle",
        "verdict": "activation spike",
        "oom_state": {"device": 0, "event_index": 10},
        "workload": {"kind": "training"},
        "steps": {"phases": [{"phase": "forward", "device": 0, "start_index": 0, "end_index": 20}]},
        "components": {"oom": {"activations (forward)": {"bytes": 900}, "parameters": {"bytes": 100}}},
    }
    report = {
        "verdict": "activation-spike",
        "device": 0,
        "target_step": 0,
        "target_phase": "forward",
        "components": {"activations": 1000, "parameters": 100},
        "replay": {},
    }
    result = scoring.score(scoring.expected_of(label), scoring.observed_of(report))
    assert aspect_result(result, "verdict") == (True, "")
    assert aspect_result(result, "moment") == (True, "")
    right, why = aspect_result(result, "categories")
    assert right is False and "partial" in why and "off by 11%" in why
    result = scoring.score(
        scoring.expected_of(label), scoring.observed_of({**report, "verdict": "no-oom", "target_step": 2})
    )
    assert aspect_result(result, "verdict")[0] is False
    assert aspect_result(result, "moment") == (False, "step 2 (expert 0)")
    result = scoring.score(scoring.expected_of(label), scoring.Observed(error="boom"))
    assert all(aspect_result(result, a) == (False, "no report: boom") for a in ASPECTS)
