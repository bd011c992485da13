"""The terminal app on a stranger's dump: file strings are never markup, never terminal escapes,
and nothing in the data (or a bug in oomdoctor) ends the app with a traceback."""

from __future__ import annotations

import asyncio
import dataclasses
import re

import pytest

pytest.importorskip("textual")

from rich.text import Text  # noqa: E402
from textual.widgets import DataTable, Static, TabbedContent, Tree  # noqa: E402
from textual.widgets._data_table import default_cell_formatter  # noqa: E402

from oomdoctor.analysis import analyse  # noqa: E402
from oomdoctor.cli import main  # noqa: E402
from oomdoctor.commands import open as open_command  # noqa: E402
from oomdoctor.load import load  # noqa: E402
from oomdoctor.model import ACTIVE_ALLOCATED, Block, Frame, Segment  # noqa: E402
from oomdoctor.tui import content  # noqa: E402
from oomdoctor.tui.app import Browser, make_app, make_loading_app  # noqa: E402
from tests.builders import BASE, MiB, one_block_snapshot, write_pickle  # noqa: E402

ESCAPES = "\x1b]0;pwned\x07\x1b]52;c;cHduZWQ=\x07\x1b[2J"
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # what must never reach the screen (tab and newline aside)
SOURCE = "/src/train.py"


def with_segment_type(snapshot, segment_type):
    """The snapshot with its segments' type set to `segment_type` as it is: the app must be safe
    whatever the loader lets through."""
    segments = tuple(dataclasses.replace(segment, segment_type=segment_type) for segment in snapshot.segments)
    return dataclasses.replace(snapshot, segments=segments)


def run_app(app, scenario, size=(80, 24)):
    async def drive():
        async with app.run_test(size=size) as pilot:
            await settle(app, pilot)
            return await scenario(app, pilot)

    return asyncio.run(drive())


async def settle(app, pilot):
    await pilot.pause()
    await app.workers.wait_for_complete()
    await pilot.pause()


def plain(value) -> str:
    if isinstance(value, Text):
        return value.plain
    return str(value)


def shown_texts(app):
    """Every text the app's widgets hold: Static contents, DataTable cells, Tree labels, titles."""
    texts = [app.title, app.sub_title]
    for widget in app.query("*"):
        if isinstance(widget, Static):
            texts.append(plain(widget.content))
        elif isinstance(widget, DataTable):
            for row in range(widget.row_count):
                texts.extend(plain(cell) for cell in widget.get_row_at(row))
        elif isinstance(widget, Tree):
            stack = [widget.root]
            while stack:
                node = stack.pop()
                texts.append(plain(node.label))
                stack.extend(node.children)
    return texts


# --- markup: a segment's type shown in the Segments tab -----------------------------------------------


def test_a_click_on_a_segment_type_that_is_an_action_runs_nothing(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's file\n")
    hostile = f"[@click=app.screenshot('victim.txt','{tmp_path}')]click to see blocks[/]"
    dump = write_pickle(tmp_path / "click.pickle", one_block_snapshot(filename=SOURCE, segment_type=hostile))
    snapshot = with_segment_type(load(dump), hostile)
    analysis = analyse(snapshot)

    async def scenario(app, pilot):
        await pilot.press("3")
        await settle(app, pilot)
        table = app.query_one("#segment-table", DataTable)
        pool_column = [plain(column.label) for column in table.ordered_columns].index("pool")
        cell = table.get_row_at(0)[pool_column]
        x = 1 + sum(column.get_render_width(table) for column in table.ordered_columns[:pool_column])
        await pilot.click("#segment-table", offset=(x, 1))  # header on line 0, the segment on line 1
        await settle(app, pilot)
        await pilot.click("#segment-table", offset=(x + 3, 1))
        await settle(app, pilot)
        table.move_cursor(row=0)
        await pilot.press("enter")
        await settle(app, pilot)
        return cell, app.query_one(TabbedContent).active

    cell, active = run_app(make_app(analysis, snapshot, source=str(dump)), scenario, size=(240, 30))
    assert victim.read_text() == "the user's file\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["click.pickle", "victim.txt"]
    assert isinstance(cell, Text) and cell.plain == hostile
    shown = default_cell_formatter(cell)
    assert isinstance(shown, Text) and shown.plain == hostile
    assert not any(span.style for span in shown.spans)  # no @click meta, no style from the file
    assert active == "segments"


@pytest.mark.parametrize("hostile", ["[/bold]", "[bold red]red[/]", "[link=file:///etc/passwd]x[/link]", "[", "[/]"])
def test_segment_types_that_look_like_markup_show_as_written(tmp_path, hostile):
    dump = write_pickle(tmp_path / "markup.pickle", one_block_snapshot(filename=SOURCE, segment_type=hostile))
    snapshot = with_segment_type(load(dump), hostile)

    async def scenario(app, pilot):
        await pilot.press("3")
        await settle(app, pilot)
        table = app.query_one("#segment-table", DataTable)
        await pilot.press("down", "tab", "down")
        await settle(app, pilot)
        return app.is_running, [plain(cell) for cell in table.get_row_at(0)], app.query_one(TabbedContent).active

    app = make_app(analyse(snapshot), snapshot, source=str(dump))
    running, row, active = run_app(app, scenario)
    assert running and active == "segments"
    assert any(hostile in cell for cell in row)
    assert app.return_code in (None, 0) and app.error is None


@pytest.mark.slow
def test_every_cell_of_every_table_is_text_never_a_markup_string(tmp_path):
    dump = write_pickle(tmp_path / "plain.pickle", one_block_snapshot(filename=SOURCE, tensor_name="model.fc1.weight"))
    snapshot = load(dump)

    async def scenario(app, pilot):
        cells = []
        for key in "12345":
            await pilot.press(key)
            await settle(app, pilot)
            for table in app.query(DataTable):
                for row in range(table.row_count):
                    cells.extend(table.get_row_at(row))
        return cells

    cells = run_app(make_app(analyse(snapshot), snapshot, source=str(dump)), scenario)
    assert cells and all(isinstance(cell, Text) for cell in cells)


# --- terminal escapes: frame file and function names, tensor names, the file's own name ----------------


def test_content_builders_escape_control_characters():
    frame = Frame(f"/src/{ESCAPES}train.py", 1, f"main{ESCAPES}")
    lines = content.stack_lines((frame,))
    assert len(lines) == 1 and not RAW.search(lines[0])
    assert "\\x1b]0;pwned\\x07" in lines[0] and lines[0].endswith(
        "in main\\x1b]0;pwned\\x07\\x1b]52;c;cHduZWQ=\\x07\\x1b[2J"
    )
    assert "\n" not in content.stack_lines((Frame("/src/a.py\nsecond line", 2, "f\u202eg"),))[0]
    assert not RAW.search(content.describe_block(f"model.{ESCAPES}weight", (), 0))
    assert not RAW.search(content.describe_block(None, (frame,), 0))
    segment = Segment(
        0, BASE, 2 * MiB, 0, f"large{ESCAPES}", (Block(BASE, 2 * MiB, 2 * MiB, ACTIVE_ALLOCATED, (frame,)),)
    )
    assert content.segment_pool(segment).startswith("large\\x1b]0;pwned")
    assert not RAW.search(content.segment_pool(segment))
    assert content.module_of("model.fc1.weight.exp_avg") == "model.fc1"
    long = content.stack_lines((Frame("/src/" + "a" * 100_000 + ".py", 1, "f"),))[0]
    assert len(long) < 10_000  # bounded


def test_content_builders_escape_names_from_the_file(tmp_path):
    dump = write_pickle(
        tmp_path / "escapes.pickle",
        one_block_snapshot(
            filename=f"/src/{ESCAPES}train.py", name=f"main{ESCAPES}", tensor_name=f"model.{ESCAPES}.weight"
        ),
    )
    snapshot = load(dump)
    analysis = analyse(snapshot)
    texts = []
    for section in content.overview_sections(analysis, f"/tmp/{ESCAPES}dump.pickle"):
        texts.extend((section.title, *section.lines))
    texts.extend(row.label for row in content.allocation_rows(analysis))
    for node in content.component_nodes(analysis):
        texts.extend(group.key for group in node.groups)
    for segment in snapshot.segments:
        texts.append(content.segment_pool(segment))
        texts.extend(row.label for row in content.block_rows_of(segment, analysis, snapshot.traces[0]))
        for block in segment.blocks:
            texts.extend(content.stack_lines(block.frames))
    texts.extend(content.fragmentation_lines(analysis))
    assert texts and not [text for text in texts if RAW.search(text)]
    assert any("\\x1b]0;pwned" in text for text in texts)


@pytest.mark.slow
def test_no_tab_shows_a_raw_escape_from_frames_tensor_names_or_the_file_name(tmp_path):
    folder = tmp_path / f"dir{ESCAPES}"
    folder.mkdir()
    dump = write_pickle(
        folder / f"dump{ESCAPES}.pickle",
        one_block_snapshot(
            filename=f"/src/{ESCAPES}train.py", name=f"main{ESCAPES}", tensor_name=f"model.{ESCAPES}.weight"
        ),
    )
    snapshot = with_segment_type(load(dump), f"large{ESCAPES}")
    analysis = analyse(snapshot)

    async def scenario(app, pilot):
        seen = list(shown_texts(app))
        screenshots = [app.export_screenshot()]
        for key in "12345":
            await pilot.press(key)
            await settle(app, pilot)
            if key == "4":
                await pilot.press("down", "down", "down")  # down to a block: its stack is shown
                await settle(app, pilot)
            seen.extend(shown_texts(app))
            screenshots.append(app.export_screenshot())
        return seen, screenshots

    seen, screenshots = run_app(make_app(analysis, snapshot, source=str(dump)), scenario, size=(160, 40))
    assert not [text for text in seen if RAW.search(text)]
    assert any("\\x1b]0;pwned" in text for text in seen)  # the names are shown, escaped
    assert not [shot for shot in screenshots if RAW.search(shot)]


def test_the_loading_view_shows_the_file_name_escaped(tmp_path):
    folder = tmp_path / f"dir{ESCAPES}"
    folder.mkdir()
    dump = write_pickle(folder / f"dump{ESCAPES}.pickle", one_block_snapshot(filename=f"/src/{ESCAPES}train.py"))
    app = make_loading_app(open_command.loader_for(str(dump), device=None, max_bytes=None), source=str(dump))

    async def scenario(app, pilot):
        return shown_texts(app), app.query(Browser).first() is not None

    seen, browsing = run_app(app, scenario)
    assert browsing and not [text for text in seen if RAW.search(text)]


# --- nothing in the data ends the app with a traceback ---------------------------------------------


def test_an_unexpected_error_in_the_analysis_ends_the_app_with_one_line_and_a_nonzero_code(tmp_path, monkeypatch):
    import oomdoctor.analysis

    def broken(*args, **kwargs):
        raise RuntimeError("boom\x1b]0;pwned\x07\nsecond line")

    monkeypatch.setattr(oomdoctor.analysis, "analyse", broken)
    dump = write_pickle(tmp_path / "fine.pickle", one_block_snapshot(filename=SOURCE))
    app = make_loading_app(open_command.loader_for(str(dump), device=None, max_bytes=None), source=str(dump))

    async def scenario(app, pilot):
        await settle(app, pilot)
        return app.return_code

    assert run_app(app, scenario) not in (None, 0)  # no exception escaped run_test
    assert app.error is not None and app.error.exit_code != 0
    message = str(app.error)
    assert message.startswith(str(dump)) and "RuntimeError" in message and "boom" in message
    assert "\n" not in message and not RAW.search(message)


def test_a_tab_that_cannot_be_built_shows_one_line_and_the_others_still_work(tmp_path, monkeypatch):
    import oomdoctor.tui.segments

    def broken(segment):
        raise ValueError("no pool for you")

    monkeypatch.setattr(oomdoctor.tui.segments, "segment_pool", broken)
    dump = write_pickle(tmp_path / "fine.pickle", one_block_snapshot(filename=SOURCE))
    snapshot = load(dump)

    async def scenario(app, pilot):
        await pilot.press("3")
        await settle(app, pilot)
        segments_text = [plain(widget.content) for widget in app.query_one("#segments").query(Static)]
        await pilot.press("5")
        await settle(app, pilot)
        return app.is_running, segments_text, app.query_one("#allocation-table", DataTable).row_count

    app = make_app(analyse(snapshot), snapshot, source=str(dump))
    running, segments_text, allocation_rows = run_app(app, scenario)
    assert running and allocation_rows == 1
    assert any("ValueError" in text and "no pool for you" in text for text in segments_text)
    assert app.error is not None and "\n" not in str(app.error)  # reported once the app is closed


def test_an_error_in_a_handler_ends_the_app_cleanly(tmp_path, monkeypatch):
    from oomdoctor.tui.app import OomdoctorApp

    def broken(self, tab):
        raise KeyError("surprise")

    monkeypatch.setattr(OomdoctorApp, "action_show_tab", broken)
    dump = write_pickle(tmp_path / "fine.pickle", one_block_snapshot(filename=SOURCE))
    snapshot = load(dump)

    async def scenario(app, pilot):
        await pilot.press("2")
        await settle(app, pilot)
        return app.is_running

    app = make_app(analyse(snapshot), snapshot, source=str(dump))
    assert run_app(app, scenario) is False  # no exception escaped run_test
    assert app.return_code not in (None, 0)
    assert app.error is not None and "KeyError" in str(app.error) and "\n" not in str(app.error)


def test_open_turns_an_exception_out_of_the_app_into_one_line(tmp_path, monkeypatch, capsys):
    import oomdoctor.tui.app

    class Exploding:
        error = None
        return_code = None

        def run(self):
            raise RuntimeError("the terminal went away")

    dump = write_pickle(tmp_path / "fine.pickle", one_block_snapshot(filename=SOURCE))
    monkeypatch.setattr(oomdoctor.tui.app, "make_loading_app", lambda loader, source: Exploding())
    monkeypatch.setattr("sys.stdin.isatty", lambda: True, raising=False)
    monkeypatch.setattr("sys.stdout.isatty", lambda: True, raising=False)
    code = main(["open", str(dump)])
    err = capsys.readouterr().err
    assert code not in (0, None)
    assert "RuntimeError" in err and "the terminal went away" in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_the_line_open_prints_after_the_app_has_its_control_characters_escaped():
    from oomdoctor.errors import LoadError

    error = LoadError(f"/tmp/dump{ESCAPES}.pickle: not a pickle")
    shown = open_command._printable_error(error)
    assert not RAW.search(str(shown)) and "\\x1b]0;pwned" in str(shown)
    assert shown.exit_code == error.exit_code
    fine = LoadError("/tmp/dump.pickle: not a pickle")
    assert open_command._printable_error(fine) is fine


# --- the checkpointing figure's blocks line: a line from the file, shown as written ------------------


def test_the_overview_names_the_blocks_checkpointing_was_measured_from_as_written():
    """The text and Markdown reports say which line calls the blocks activation checkpointing's
    saving was measured from; the app's overview says it too. The caller's file name is the file's
    text: markup in it is shown as written, its control characters escaped."""
    from tests.test_checkpointing_regions import _regions_snapshot

    model = "[bold]x[/]\x1b[31m.py"
    snapshot = _regions_snapshot(model)
    said = "measured from the file: checkpointing each of the 3 blocks called at [bold]x[/]\\x1b[31m.py:30 in forward"
    lines = [line for section in content.overview_sections(analyse(snapshot), "dump.pickle") for line in section.lines]
    assert any(said in line for line in lines)

    async def scenario(app, pilot):
        shown = [w.content for w in app.query(Static) if said in plain(w.content)]
        return shown, shown_texts(app), app.export_screenshot()

    shown, seen, screenshot = run_app(
        make_app(analyse(snapshot), snapshot, source="dump.pickle"), scenario, size=(200, 60)
    )
    assert shown and all(isinstance(value, Text) for value in shown)  # text, never markup
    assert not [text for text in seen if RAW.search(text)] and not RAW.search(screenshot)
