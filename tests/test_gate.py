"""--fail-if: the hand-written parser, the figures of a report and a diff, and the exit codes."""

from __future__ import annotations

import math

import pytest

from oomdoctor.analysis.gate import (
    BYTES,
    DIFF_FIGURE_NAMES,
    PERCENT,
    REPORT_FIGURE_NAMES,
    Both,
    Comparison,
    Either,
    GateError,
    Value,
    evaluate,
    parse,
)
from oomdoctor.cli import main
from tests.conftest import FIXTURES

GiB = 1 << 30
OPTIMIZER = str(FIXTURES / "dumps" / "optimizer-state-buildup-gpt-adamw.pickle")
SPIKE = str(FIXTURES / "dumps" / "activation-spike-gpt-longer-sequence.pickle")


def test_parse_precedence_and_units():
    condition = parse("peak > 20GiB or (reserved >= 1.5GB and activations_growth > 10%)", DIFF_FIGURE_NAMES)
    assert isinstance(condition, Either)
    first, second = condition.terms
    assert first == Comparison("peak", ">", float(20 * GiB), BYTES, "peak > 20GiB")
    assert isinstance(second, Both)
    assert second.terms[0].bound == 1.5e9 and second.terms[1].unit == PERCENT
    assert parse("peak_change < -1GiB", DIFF_FIGURE_NAMES).bound == -float(GiB)
    assert parse("peak > 1000", REPORT_FIGURE_NAMES).unit is None


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "empty"),
        ("peak >", "ends too soon"),
        ("peak 20GiB", "expected one of"),
        ("bogus > 1GiB", "no figure 'bogus'"),
        ("peak > 10%", "compare it with a size"),
        ("peak_growth > 1GiB", "compare it with a percentage"),
        ("peak > 20GiB extra", "unexpected"),
        ("(peak > 1GiB", "not closed"),
        ("peak > 20 parsecs", "not a size"),
        ("__import__('os') > 1", "cannot read"),
        ("(" * 40 + "peak > 1" + ")" * 40, "nested"),
        ("peak > 1 or " * 200 + "peak > 1", "longer than"),
    ],
)
def test_bad_expressions_are_refused(text, message):
    with pytest.raises(GateError, match=message):
        parse(text, DIFF_FIGURE_NAMES)


def test_evaluate_names_the_comparisons_that_held():
    figures = {"peak": Value(30.0 * GiB, BYTES), "reserved": Value(10.0 * GiB, BYTES)}
    both = parse("peak > 20GiB and reserved > 20GiB", REPORT_FIGURE_NAMES)
    assert evaluate(both, figures) == ()
    either = parse("peak > 20GiB or reserved > 20GiB", REPORT_FIGURE_NAMES)
    [crossed] = evaluate(either, figures)
    assert crossed.comparison.figure == "peak" and crossed.value.value == 30.0 * GiB


def test_report_exit_codes(capsys):
    assert main(["report", OPTIMIZER, "--fail-if", "peak > 1GiB"]) == 0
    assert capsys.readouterr().err == ""
    assert main(["report", OPTIMIZER, "--fail-if", "peak > 100MiB", "--format", "json"]) == 1
    captured = capsys.readouterr()
    assert captured.out.startswith("{")  # the report is still printed
    assert "peak is 179.73 MiB" in captured.err and "peak > 100MiB" in captured.err
    assert main(["report", OPTIMIZER, "--fail-if", "peak >> 1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("oomdoctor: --fail-if") and err.count("\n") == 1


def test_diff_exit_codes(capsys):
    gate = "optimizer_state_change > 10MiB"
    assert main(["diff", OPTIMIZER, "--steps", "0", "1", "--fail-if", gate]) == 1
    assert "optimizer_state_change is 21.05 MiB" in capsys.readouterr().err
    assert main(["diff", OPTIMIZER, "--steps", "0", "1", "--fail-if", "peak_growth > 50%"]) == 0
    assert main(["diff", SPIKE, OPTIMIZER, "--fail-if", "peak_growth > 40%"]) == 1
    assert "peak_growth is +43.6%" in capsys.readouterr().err
    assert main(["diff", OPTIMIZER, OPTIMIZER, "--fail-if", "peak = 1"]) == 2


def test_growth_from_nothing_is_infinite():
    from oomdoctor.analysis.gate import _growth

    assert _growth(0, 5) == math.inf and _growth(0, 0) == 0.0 and _growth(4, 5) == 25.0
