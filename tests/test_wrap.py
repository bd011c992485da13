"""Text output wrapped to the terminal (oomdoctor.views.wrap, --width, COLUMNS): no line wider than
the width, no word, path or number and its unit broken, the same words in the same order, tables
still aligned; whole lines when not on a terminal, and Markdown and JSON never wrapped."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from oomdoctor.analysis import analyse
from oomdoctor.cli import main
from oomdoctor.examples import EXAMPLE_DUMP
from oomdoctor.load import load
from oomdoctor.views import text_report
from oomdoctor.views.wrap import fill, reflow, wrap_lines, wrap_text

ROOT = Path(__file__).resolve().parent.parent
DUMPS = Path("fixtures") / "dumps"
# reports with long prose, evidence, aligned rows, a what-if note and several steps
EXAMPLE = Path(os.path.relpath(EXAMPLE_DUMP, ROOT))
LONG_REPORTS = [
    EXAMPLE,
    DUMPS / "fragmentation-retrieval-class-scores.pickle",
    DUMPS / "creeping-leak-mlp-sgd.pickle",
]
SIZE = re.compile(r"-?\d[\d.,]* (?:bytes?|KiB|MiB|GiB|TiB)\b")
UNIT_FIRST = re.compile(r"^\s*(?:bytes?|KiB|MiB|GiB|TiB)\b")


@pytest.fixture(autouse=True)
def _in_the_repository(monkeypatch):
    """Paths relative to the repository: a report names its file (conftest unsets COLUMNS)."""
    monkeypatch.chdir(ROOT)


def _report(path: Path, *extra: str, capsys) -> str:
    assert main(["report", str(path), *extra]) == 0
    return capsys.readouterr().out


def _assert_wrapped(whole: str, wrapped: str, width: int) -> None:
    lines = wrapped.splitlines()
    tokens = whole.split()
    longest = max(map(len, tokens))
    assert longest <= width, "a token longer than the width stands alone: choose a wider width"
    assert max(map(len, lines)) <= width
    # the same words in the same order: nothing broken inside a word, a path or a number
    assert wrapped.split() == tokens
    # every size keeps its unit on its line
    assert SIZE.findall(wrapped) == SIZE.findall(whole)
    for line, after in zip(lines, lines[1:]):
        assert not (re.search(r"\d$", line) and UNIT_FIRST.match(after)), (line, after)


@pytest.mark.parametrize("path", LONG_REPORTS, ids=lambda p: p.stem)
@pytest.mark.parametrize("width", [80, 60])
def test_a_long_report_fits_the_width_without_breaking_a_token(path, width, capsys):
    whole = _report(path, capsys=capsys)
    assert max(map(len, whole.splitlines())) > 100  # there is something to wrap
    wrapped = _report(path, "--width", str(width), capsys=capsys)
    _assert_wrapped(whole, wrapped, width)


def test_not_a_terminal_keeps_whole_lines_and_columns_or_width_wraps(monkeypatch, capsys):
    whole = _report(EXAMPLE, capsys=capsys)
    analysis = analyse(load(EXAMPLE))
    assert whole == text_report.render(analysis, source=str(EXAMPLE))  # what the goldens hold
    monkeypatch.setenv("COLUMNS", "80")
    by_columns = _report(EXAMPLE, capsys=capsys)
    _assert_wrapped(whole, by_columns, 80)
    assert _report(EXAMPLE, "--width", "0", capsys=capsys) == whole
    assert _report(EXAMPLE, "--width", "100", capsys=capsys) == wrap_text(whole, 100)


def test_markdown_and_json_never_wrap(monkeypatch, capsys):
    for output_format in ("md", "json"):
        whole = _report(EXAMPLE, "--format", output_format, capsys=capsys)
        monkeypatch.setenv("COLUMNS", "40")
        assert _report(EXAMPLE, "--format", output_format, "--width", "40", capsys=capsys) == whole
        monkeypatch.delenv("COLUMNS")


def test_a_bad_width_is_one_line_and_exit_2(capsys):
    assert main(["report", str(EXAMPLE), "--width", "wide"]) == 2
    assert capsys.readouterr().err.startswith("oomdoctor: --width")


@pytest.mark.parametrize(
    "argv",
    [
        ["info", str(DUMPS / "creeping-leak-mlp-sgd.pickle")],
        ["diff", str(DUMPS / "creeping-leak-mlp-sgd.pickle"), "--steps", "0", "1"],
    ],
    ids=["info", "diff"],
)
def test_other_verbs_wrap_their_text_too(argv, capsys):
    assert main(argv) == 0
    whole = capsys.readouterr().out
    assert max(map(len, whole.splitlines())) > 80
    assert main([*argv, "--width", "80"]) == 0
    _assert_wrapped(whole, capsys.readouterr().out, 80)


def test_explain_wraps_to_the_width_it_is_given(capsys):
    message = (
        "CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 23.65 GiB of which "
        "11.06 MiB is free. Of the allocated memory 22.90 GiB is allocated by PyTorch, and 295.23 MiB is "
        "reserved by PyTorch but unallocated."
    )
    assert main(["explain", "--message", message, "--width", "200"]) == 0
    whole = capsys.readouterr().out
    assert main(["explain", "--message", message, "--width", "72"]) == 0
    wrapped = capsys.readouterr().out
    assert max(map(len, wrapped.splitlines())) <= 72
    words = [word for word in whole.split() if word != "|"]  # the quoted message's margin
    assert [word for word in wrapped.split() if word != "|"] == words
    assert "22.90 GiB" in wrapped  # the quoted message keeps its sizes whole


def test_rank_folder_tables_stay_aligned(tmp_path, capsys):
    for rank, name in enumerate(["creeping-leak-mlp-sgd", "gradients-kept-mlp-plain-sgd", "no-oom-mlp-adam"]):
        (tmp_path / f"snapshot_rank{rank}.pickle").write_bytes((DUMPS / f"{name}.pickle").read_bytes())
    whole = _report(tmp_path, capsys=capsys)
    wrapped = _report(tmp_path, "--width", "80", capsys=capsys)
    _assert_wrapped(whole, wrapped, 80)
    table = whole.split("\nRanks\n", 1)[1].split("\n\n", 1)[0].splitlines()
    shown = wrapped.split("\nRanks\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert len(shown) == 2 * len(table)  # each row, then its rest
    _assert_one_break(table, shown[0::2], shown[1::2])


def _assert_one_break(rows: list[str], heads: list[str], rests: list[str]) -> None:
    """Every row broke at the same column, and the rests keep their columns where they were."""
    cut = next(
        (c for c in range(len(max(rows, key=len)), 0, -1) if all(r[:c].rstrip() == h for r, h in zip(rows, heads))),
        None,
    )
    assert cut is not None
    assert all(rest.strip() == row[cut:].strip() for row, rest in zip(rows, rests))
    assert len({len(row.rstrip()) - len(rest.rstrip()) for row, rest in zip(rows, rests)}) == 1


# --- the wrapper itself ----------------------------------------------------------------------------


def test_a_list_item_continues_under_its_text():
    line = "  - " + " ".join(f"word{i}" for i in range(40))
    lines = wrap_lines([line], 50)
    assert len(lines) > 1 and all(len(x) <= 50 for x in lines)
    assert all(x.startswith("    word") for x in lines[1:])


def test_an_aligned_row_wraps_its_last_cell_under_it():
    row = "  failed request           16.00 MiB  (the message said " + "very " * 12 + "long)"
    lines = wrap_lines([row], 80)
    column = row.index("(the")
    assert lines[0].startswith(row[:column]) and len(lines) > 1
    assert all(x[:column].strip() == "" and x[column] != " " for x in lines[1:])


def test_a_table_too_wide_breaks_every_row_at_one_column_between_cells():
    rows = [
        "  rank  value one    value two    value three  value four   value five   value six",
        "  0      1.00 MiB     2.00 MiB     3.00 MiB     4.00 MiB     5.00 MiB     6.00 MiB",
        "  12    10.00 GiB   200.00 MiB   300.00 KiB   400.00 MiB   500.00 MiB   600.00 MiB",
    ]
    lines = wrap_lines(rows, 60)
    assert len(lines) == 6 and all(len(x) <= 60 for x in lines)
    _assert_one_break(rows, lines[0::2], lines[1::2])


def test_a_label_stays_with_its_figure():
    row = "  step 0    peak   234.48 MiB   at its end   234.48 MiB   activations peak     1.00 MiB"
    lines = wrap_lines([row], 80)
    assert len(lines) == 2 and lines[1].strip() == "activations peak     1.00 MiB"


def test_fill_never_breaks_a_number_from_its_unit_and_leaves_a_long_token_whole():
    text = "x" * 10 + " 123.45 MiB " + "/very/long/path/" * 8 + " end"
    for width in range(12, 40):
        lines = fill(text, width)
        assert "123.45 MiB" in "\n".join(lines)
        assert any("/very/long/path/" * 8 == x for x in lines)


def test_short_lines_and_blank_lines_are_left_alone():
    text = "a  b\n\n   indented  row\n"
    assert wrap_text(text, 80) == text
    assert wrap_text(text, None) == text


def test_reflow_rejoins_paragraphs_and_keeps_examples():
    text = "One paragraph that goes\non over lines.\n\n    oomdoctor report dump.pickle\n"
    assert reflow(text, 80) == "One paragraph that goes on over lines.\n\n    oomdoctor report dump.pickle\n"
