"""A count meets its noun in the right number ("1 block", "2 blocks") in what the reports say, and
a trace without phases says so ("phases not determined", not "phases from none")."""

from __future__ import annotations

import re
from pathlib import Path

from oomdoctor.cli import main
from oomdoctor.units import human_size, plural
from oomdoctor.views import phrasing
from tests.builders import one_block_snapshot, write_pickle

ROOT = Path(__file__).resolve().parent.parent


def test_plural():
    assert plural(1, "block") == "1 block"
    assert plural(0, "block") == "0 blocks"
    assert plural(2, "entry", "entries") == "2 entries"
    assert human_size(1) == "1 byte" and human_size(2) == "2 bytes" and human_size(-1) == "-1 byte"


ONE_NOUNS = re.compile(r"\b1 (?:blocks|events|segments|steps|frames|files|ranks|devices|entries|allocations|bytes)\b")


def test_a_one_block_report_says_1_block(tmp_path, capsys):
    path = write_pickle(tmp_path / "one.pickle", one_block_snapshot(filename="train.py"))
    for output in (["report", str(path)], ["info", str(path)]):
        assert main(output) == 0
        text = capsys.readouterr().out
        assert not ONE_NOUNS.search(text), ONE_NOUNS.search(text)
    assert main(["report", str(path)]) == 0
    report = capsys.readouterr().out
    assert "(1 block," in report
    assert "phases from none" not in report and "phases not determined" in report


def test_unknowns_word_a_count_of_one_in_the_singular():
    from oomdoctor.analysis.results import Unknown

    for kind in phrasing.UNKNOWNS:
        sentence = phrasing.unknown(Unknown(kind, 1))
        assert not ONE_NOUNS.search(sentence), sentence


def test_no_golden_report_says_1_with_a_plural():
    for path in (ROOT / "tests" / "golden").glob("*.*"):
        if path.suffix in (".txt", ".md"):
            assert not ONE_NOUNS.search(path.read_text()), path.name
