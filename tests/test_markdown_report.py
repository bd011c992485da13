"""`oomdoctor report --format md`: Markdown that survives being pasted into an issue."""

from __future__ import annotations

import pickle
import re

import pytest

from oomdoctor.analysis import analyse
from oomdoctor.analysis.environment import environment_of
from oomdoctor.cli import main
from oomdoctor.load import load
from oomdoctor.views import markdown_report
from tests.builders import plain_oom_snapshot
from tests.conftest import FIXTURES
from tests.golden.update import HERE


def _markdown(snapshot_dict: dict, source: str | None = None) -> str:
    snapshot = load(pickle.dumps(snapshot_dict, protocol=4))
    return markdown_report.render(analyse(snapshot), source=source, environment=environment_of(snapshot))


def _tables(text: str) -> list[list[str]]:
    tables, current = [], []
    for line in text.splitlines():
        if line.startswith("|"):
            current.append(line)
        elif current:
            tables.append(current)
            current = []
    return tables + ([current] if current else [])


def _columns(row: str) -> int:
    return len(re.split(r"(?<!\\)\|", row.strip())) - 2


def _assert_tables_are_well_formed(text: str) -> None:
    tables = _tables(text)
    assert tables
    for table in tables:
        assert re.fullmatch(r"\|(?:-+:?|:-+:?|-+\|?)+.*", table[1]), table[1]
        widths = {_columns(row) for row in table}
        assert len(widths) == 1, table


@pytest.mark.parametrize("path", sorted(HERE.glob("*.md")), ids=lambda p: p.name)
def test_golden_markdown_tables_are_well_formed(path):
    text = path.read_text()
    _assert_tables_are_well_formed(text)
    details = 0 if path.name.startswith("diff-") else 1  # a report folds its stacks; a diff has none
    assert text.count("<details>") == text.count("</details>") == details
    assert text.count("```") % 2 == 0


def test_cells_escape_pipes_and_angle_brackets():
    text = _markdown(plain_oom_snapshot(filename="a|b<c>.py"))
    _assert_tables_are_well_formed(text)
    assert "`a\\|b<c>.py:3 in main`" in text  # inside code: pipes escaped for the table, brackets kept
    tables = [line for line in text.split("<details>")[0].splitlines() if line.startswith("|")]
    assert not [line for line in tables if "a|b<c>" in line]
    # outside tables (the evidence list) the name is kept whole, inside code
    assert all("`a|b<c>.py:3 in main`" in line for line in text.split("<details>")[0].splitlines() if "a|b<c>" in line)


def test_plain_torch_snapshot_reports_what_it_can():
    text = _markdown(plain_oom_snapshot(), source="snapshot.pickle")
    assert text.startswith("## oomdoctor: `")
    assert "File: `snapshot.pickle`." in text
    assert "| **failed request** | **600.00 MiB** | 629,145,600 |" in text
    environment = text.split("### Environment", 1)[1].split("<details>", 1)[0]
    assert "| torch | `>= 2.3" in environment or "| torch | `2." in environment
    assert "| host |" not in environment and "| pid |" not in environment
    details = text.split("<details>", 1)[1]
    assert "`0x1000` (300.00 MiB, allocated at event 1):" in details
    assert "train.py:3 in main" in details


def test_environment_from_the_metadata():
    snapshot = load(FIXTURES / "dumps" / "outside-pytorch-cnn.pickle")
    text = markdown_report.render(analyse(snapshot), environment=environment_of(snapshot))
    environment = text.split("### Environment", 1)[1].split("<details>", 1)[0]
    meta = snapshot.oomdoctor
    assert f"| torch | `{meta.versions.torch}` |" in environment
    assert f"| host | `{meta.host}` |" in environment and f"| pid | `{meta.pid}` |" in environment
    assert "| GPU | `Simulated GPU" in environment


def test_recommendations_table_says_whether_each_change_fits_alone():
    snapshot = load(FIXTURES / "dumps" / "optimizer-state-buildup-mlp-adam.pickle")
    analysis = analyse(snapshot)
    text = markdown_report.render(analysis)
    rows = text.split("### What to change", 1)[1].split("\n\n")[1].splitlines()[2:]
    assert len(rows) == len(analysis.recommendations) > 0
    for position, (row, rec) in enumerate(zip(rows, analysis.recommendations), 1):
        cells = [c.strip() for c in row.strip("|").split(" | ")]
        assert cells[0] == str(position)
        assert cells[3] == {True: "yes", False: "no", None: "-"}[rec.would_fit_alone]


def test_cli_prints_markdown(tmp_path, capsys):
    path = tmp_path / "snap.pickle"
    path.write_bytes(pickle.dumps(plain_oom_snapshot(), protocol=4))
    assert main(["report", str(path), "--format", "md"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("## oomdoctor: `") and "### Live memory by component" in out
