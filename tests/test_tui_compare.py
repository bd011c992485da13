"""`oomdoctor open A --compare B` (issue 15): both timelines to one scale, the diff's sites and its
summary, both files loaded in the worker; bad input in either is one line and exit 2."""

from __future__ import annotations

import pytest

pytest.importorskip("textual")

from textual.widgets import DataTable, Static  # noqa: E402

from oomdoctor import pipeline  # noqa: E402
from oomdoctor.cli import main  # noqa: E402
from oomdoctor.commands.open import compare_loader_for  # noqa: E402
from oomdoctor.tui.compare import CompareChart, make_compare_app, site_cells  # noqa: E402
from oomdoctor.tui.content import label_width  # noqa: E402
from oomdoctor.tui.timeline import AXIS_WIDTH  # noqa: E402
from oomdoctor.views import diff_phrasing  # noqa: E402
from tests.test_tui import DUMPS, run_app, settle, text_of  # noqa: E402

A = DUMPS / "no-oom-gpt-adamw.pickle"
B = DUMPS / "no-oom-gpt-adamw-batch-32.pickle"  # the same run at twice the batch: a higher peak


def compare_app(path_a, path_b):
    loader = compare_loader_for(str(path_a), str(path_b), device=None, max_bytes=None)
    return make_compare_app(loader, source_a=str(path_a), source_b=str(path_b))


def _tallest(lines: list[str]) -> int:
    """Rows of the chart (its two bands left out) holding a column's cell."""
    return sum("█" in line[AXIS_WIDTH:] for line in lines[:-2])


def test_compare_shows_both_timelines_to_one_scale_and_the_diffs_sites():
    async def scenario(app, pilot):
        await settle(app, pilot)
        charts = [app.query_one(f"#compare-chart-{key}", CompareChart) for key in "ab"]
        table = app.query_one("#compare-sites", DataTable)
        return (
            [chart.render().plain.split("\n") for chart in charts],
            [chart.timeline.max_bytes for chart in charts],
            [chart.region.height for chart in charts],
            [str(cell) for cell in table.get_row_at(0)],
            table.row_count,
            text_of(app.query_one("#compare-summary", Static)),
            app.return_code,
        )

    lines, scales, heights, first_row, rows, summary, code = run_app(compare_app(A, B), scenario, size=(100, 32))
    diff = pipeline.diff_files(str(A), str(B))  # what `oomdoctor diff A B` prints
    assert code is None  # still running: nothing failed
    assert scales[0] == scales[1] == diff.b.at_peak.allocated_bytes > diff.a.at_peak.allocated_bytes
    assert heights[0] == heights[1] and len(lines[0]) == len(lines[1]) == heights[0]
    assert lines[0][0].startswith(lines[1][0][:AXIS_WIDTH])  # one axis: the same top label
    assert _tallest(lines[1]) > _tallest(lines[0]) > 0
    assert _tallest(lines[1]) == heights[1] - 2  # B's peak is the scale's top
    largest = max(diff.at_peak.sites, key=lambda site: abs(site.delta_bytes))
    assert diff.at_peak.sites[0] == largest
    assert first_row == list(site_cells(largest, label_width(100)))
    assert rows == len(diff.at_peak.sites)
    assert summary == diff_phrasing.summary(diff)


def test_a_bad_second_file_ends_the_compare_app_with_one_line_and_exit_2(tmp_path):
    bad = tmp_path / "not-a-snapshot.pickle"
    bad.write_bytes(b"this is not a pickle at all")
    app = compare_app(A, bad)

    async def scenario(app, pilot):
        await settle(app, pilot)
        return app.return_code

    assert run_app(app, scenario) == 2
    assert app.error is not None and app.error.exit_code == 2
    message = str(app.error)
    assert message.startswith(str(bad)) and "\n" not in message


@pytest.mark.parametrize(
    "other, words",
    [("empty", "empty"), ("missing", "no such file")],
)
def test_open_compare_refuses_a_bad_second_file_before_the_app_starts(other, words, tmp_path, capsys):
    path = tmp_path / "b.pickle"
    if other == "empty":
        path.write_bytes(b"")
    assert main(["open", str(A), "--compare", str(path)]) == 2
    err = capsys.readouterr().err
    assert words in err and str(path) in err and err.count("\n") == 1 and "Traceback" not in err


def test_a_sites_text_from_the_dump_reaches_the_table_escaped():
    from oomdoctor.analysis.diff import GREW, SITE_SOURCE_LINE, SiteChange

    hostile = SiteChange(
        SITE_SOURCE_LINE, "evil.py:1 in \x1b]52;c;cm0gLXJm\x07[bold]x", "activations", 1, 9000, 1, 2, GREW
    )
    cells = site_cells(hostile, 80)
    assert not any(ch in cell for cell in cells for ch in "\x1b\x07")
    assert "evil.py:1" in cells[2]
