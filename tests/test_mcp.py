"""`oomdoctor mcp`: the MCP server's tools called through the SDK's client (the `mcp` extra).

The server runs in this process and the client talks to it over the SDK's in-memory transport
(JSON-RPC framing, `mode="legacy"`: the initialize handshake a stdio client does); each tool call
runs the oomdoctor command in a child process, as it does under `oomdoctor mcp`. The tests that
need the SDK skip without it; the verb's help and its line without the extra are tested either way.
"""

from __future__ import annotations

import gzip
import json
import os
import pickle
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from oomdoctor import pipeline
from oomdoctor.examples import EXAMPLE_DUMP
from tests.builders import one_block_snapshot
from tests.conftest import FIXTURES

REPOSITORY = Path(__file__).resolve().parent.parent
OPTIMIZER = FIXTURES / "dumps" / "optimizer-state-buildup-gpt-adamw.pickle"
SPIKE = FIXTURES / "dumps" / "activation-spike-gpt-longer-sequence.pickle"
TOOLS = {"info", "report", "diff", "diff_steps", "diff_ranks", "explain"}
# Raw C0 (but newline), DEL, C1: what must never come from a file into an answer.
RAW_CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f]")
EVIL = "\x1b]0;pwned\x07\x1b[2J"
MESSAGE = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity "
    "of 79.15 GiB of which 6.75 MiB is free. Including non-PyTorch memory, this process has 79.14 GiB memory "
    "in use. Of the allocated memory 78.50 GiB is allocated by PyTorch, and 120.00 MiB is reserved by "
    "PyTorch but unallocated."
)
MiB = 1 << 20
GiB = 1 << 30


def _environment():
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPOSITORY), os.environ.get("PYTHONPATH", "")]))
    environment.pop("OOMDOCTOR_IN_PROCESS", None)
    return environment


# --- without the SDK ----------------------------------------------------------------------------


def test_help_fits_in_80_columns():
    done = subprocess.run(
        [sys.executable, "-m", "oomdoctor", "mcp", "--help"],
        capture_output=True, text=True, env=dict(_environment(), COLUMNS="80"), check=True,
    )  # fmt: skip
    lines = done.stdout.splitlines()
    assert lines[0].startswith("usage: oomdoctor mcp")
    assert max(len(line) for line in lines) <= 80, max(lines, key=len)
    assert "pip install 'oomdoctor[mcp]'" in done.stdout


def test_without_the_extra_one_line_says_how_to_install_it():
    code = "import sys\nsys.modules['mcp'] = None\nfrom oomdoctor.cli import main\nsys.exit(main(['mcp']))\n"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_environment())
    assert done.returncode == 2
    assert done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert line.startswith("oomdoctor: mcp: ") and line.endswith("pip install 'oomdoctor[mcp]'")


def test_the_package_and_the_cli_do_not_import_the_sdk():
    code = "import sys, oomdoctor, oomdoctor.cli\nprint(sorted(m for m in sys.modules if m.split('.')[0] == 'mcp'))\n"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_environment(), check=True)
    assert done.stdout.strip() == "[]"


# --- through the SDK's client -------------------------------------------------------------------


@pytest.fixture
def sdk():
    return pytest.importorskip("mcp")


def _with_client(sdk, body, **server_options):
    """`body(client)` against a fresh server, in this process, over the in-memory transport."""
    import anyio

    from oomdoctor.mcp_server import build_server

    async def main():
        async with sdk.Client(build_server(**server_options), mode="legacy") as client:
            return await body(client)

    return anyio.run(main)


def _calls(sdk, calls, **server_options):
    """The results of `calls` ((tool, arguments), ...), made in order in one session."""

    async def body(client):
        return [await client.call_tool(name, arguments) for name, arguments in calls]

    return _with_client(sdk, body, **server_options)


def _text(result) -> str:
    (block,) = result.content
    assert block.type == "text"
    return block.text


def _answer(result) -> str:
    assert not result.is_error, _text(result)
    return _text(result)


def _error(result) -> str:
    assert result.is_error
    text = _text(result)
    assert "\n" not in text and text.startswith("oomdoctor: ") and len(text) <= 1200, text
    assert "Traceback" not in text and not RAW_CONTROL.search(text), text
    return text


def test_lists_its_tools_all_read_only(sdk):
    async def body(client):
        return (await client.list_tools()).tools, client.server_info

    tools, info = _with_client(sdk, body)
    assert info.name == "oomdoctor"
    assert {tool.name for tool in tools} == TOOLS
    for tool in tools:
        assert tool.description and tool.annotations.read_only_hint and not tool.annotations.destructive_hint
    schemas = {tool.name: tool.input_schema for tool in tools}
    assert schemas["report"]["required"] == ["path"]
    assert schemas["report"]["properties"]["format"]["enum"] == ["text", "md", "json"]
    assert schemas["diff"]["required"] == ["a", "b"]
    assert schemas["diff_ranks"]["required"] == ["folder", "rank_a", "rank_b"]
    assert schemas["explain"]["required"] == ["message"]


def test_report_json_is_what_the_command_gives(sdk):
    paths = [EXAMPLE_DUMP, OPTIMIZER, SPIKE]
    results = _calls(sdk, [("report", {"path": str(path), "format": "json"}) for path in paths])
    for path, result in zip(paths, results):
        expected = json.loads(pipeline.report_file(str(path), "json"))
        got = json.loads(_answer(result))
        assert got["verdict"] == expected["verdict"] and got["confidence"] == expected["confidence"]
        assert got == expected
    assert json.loads(_text(results[0]))["verdict"] == "optimizer-state-buildup"


def test_report_text_and_markdown_and_info(sdk):
    text, markdown, info, info_json = _calls(
        sdk,
        [
            ("report", {"path": str(OPTIMIZER)}),
            ("report", {"path": str(OPTIMIZER), "format": "md"}),
            ("info", {"path": str(EXAMPLE_DUMP)}),
            ("info", {"path": str(EXAMPLE_DUMP), "format": "json"}),
        ],
    )
    assert _answer(text) == pipeline.report_file(str(OPTIMIZER), "text").decode()
    assert _answer(text).startswith("Verdict: optimizer-state-buildup")
    assert "optimizer-state-buildup" in _answer(markdown) and _answer(markdown) != _answer(text)
    assert "segments" in _answer(info)
    data = json.loads(_answer(info_json))
    assert data["file"] == str(EXAMPLE_DUMP) and data["reserved_bytes"] > data["allocated_bytes"] > 0


def test_diff_names_both_sides_and_its_other_forms(sdk, tmp_path):
    folder = tmp_path / "ranks"
    folder.mkdir()
    shutil.copy(SPIKE, folder / "oom-rank0-node-1-20260101T000000Z.pickle")
    shutil.copy(OPTIMIZER, folder / "oom-rank1-node-2-20260101T000000Z.pickle")
    files, steps, ranks, text = _calls(
        sdk,
        [
            ("diff", {"a": str(SPIKE), "b": str(OPTIMIZER), "format": "json"}),
            ("diff_steps", {"path": str(OPTIMIZER), "step_a": 0, "step_b": 1, "format": "json"}),
            ("diff_ranks", {"folder": str(folder), "rank_a": 0, "rank_b": 1, "format": "json"}),
            ("diff", {"a": str(SPIKE), "b": str(OPTIMIZER)}),
        ],
    )
    data = json.loads(_answer(files))
    assert (data["a"]["label"], data["b"]["label"]) == (str(SPIKE), str(OPTIMIZER))
    assert (data["a"]["verdict"], data["b"]["verdict"]) == ("activation-spike", "optimizer-state-buildup")
    assert data["verdict_changed"] is True
    data = json.loads(_answer(steps))
    assert data["kind"] == "steps" and data["b"]["verdict"] == "optimizer-state-buildup"
    data = json.loads(_answer(ranks))
    assert data["kind"] == "ranks" and (data["a"]["label"], data["b"]["label"]) == ("rank 0", "rank 1")
    assert "'--optimizer' went from 'sgd' to 'adamw'" in _answer(text)


def test_explain_reads_the_figures_of_a_message(sdk):
    data, text, nothing = _calls(
        sdk,
        [
            ("explain", {"message": MESSAGE, "format": "json"}),
            ("explain", {"message": MESSAGE}),
            ("explain", {"message": "RuntimeError: shape mismatch"}),
        ],
    )
    (message,) = json.loads(_answer(data))["messages"]
    figures = {figure["name"]: figure["bytes"] for figure in message["figures"]}
    assert figures["requested_bytes"] == 20 * MiB
    assert abs(figures["capacity_bytes"] - 79.15 * GiB) < 1
    assert figures["reserved_unallocated_bytes"] == 120 * MiB
    assert message["message"]["device_index"] == 0
    assert "Tried to allocate" in _answer(text)
    assert "no PyTorch out-of-memory message found" in _error(nothing)


def _hostile_files(directory: Path) -> dict[str, Path]:
    """A few of tests/test_hostile_inputs.py's kinds of file, and what the answer must say."""
    compressed = gzip.compress(pickle.dumps(one_block_snapshot(), protocol=4))
    contents = {
        # a pickle that imports os.system (its module name carrying terminal escapes) and calls it
        "calls-os-system.pickle": b"\x80\x04\x8c\x08\x1b]0;x\x07os\x8c\x06system\x93\x8c\x02id\x85R.",
        "truncated.pickle.gz": compressed[: len(compressed) // 2],
        # protocol 5 BYTEARRAY8 declaring 2**62 bytes
        "huge-declared-size.pickle": b"\x80\x05\x96" + (2**62).to_bytes(8, "little") + b"abc.",
        # a million nested tuples: the C unpickler overflows its stack (the supervised child dies)
        "deep-tuples.pickle": b"\x80\x04}" + b")" + b"\x85" * 10**6 + b"K\x01s.",
        "not-a-snapshot.txt": b"just text\n",
    }
    paths = {}
    for name, content in contents.items():
        paths[name] = directory / name
        paths[name].write_bytes(content)
    return paths


@pytest.mark.slow
def test_hostile_files_are_one_line_each_and_the_server_keeps_serving(sdk, tmp_path):
    files = _hostile_files(tmp_path)
    (tmp_path / "pipe").exists() or os.mkfifo(tmp_path / "pipe")
    healthy = ("info", {"path": str(EXAMPLE_DUMP), "format": "json"})
    calls = []
    for path in files.values():
        calls += [("report", {"path": str(path), "format": "json"}), healthy]
    calls += [
        ("report", {"path": str(tmp_path / "*.pickle")}),  # no globbing: the name as it is
        ("report", {"path": str(tmp_path)}),
        ("report", {"path": str(tmp_path / "pipe")}),
        ("diff_ranks", {"folder": str(EXAMPLE_DUMP), "rank_a": 0, "rank_b": 1}),
        ("diff", {"a": str(EXAMPLE_DUMP), "b": str(files["calls-os-system.pickle"])}),
        ("report", {"path": str(EXAMPLE_DUMP), "format": "xml"}),  # outside the schema: the SDK's error
        ("explain", {"message": "x" * 200_000}),
        ("explain", {"message": "CUDA out of memory\x00"}),
        healthy,
    ]
    started = time.monotonic()
    results = _calls(sdk, calls)
    assert time.monotonic() - started < 60
    answers = iter(results)
    said = {}
    for name in files:
        said[name] = _error(next(answers))
        assert json.loads(_answer(next(answers)))["file"] == str(EXAMPLE_DUMP)  # the server still answers
    assert "os.system" in said["calls-os-system.pickle"] and "refused" in said["calls-os-system.pickle"]
    assert "\\x1b]0;x\\x07os" in said["calls-os-system.pickle"]  # escaped, not sent raw
    assert "truncated" in said["truncated.pickle.gz"] or "corrupt" in said["truncated.pickle.gz"]
    assert "ran out of memory" in said["huge-declared-size.pickle"]
    assert "the unpickler crashed" in said["deep-tuples.pickle"]
    assert "not a snapshot" in said["not-a-snapshot.txt"]
    for name, path in files.items():
        assert str(path) in said[name]
    pattern, folder, pipe, not_a_folder, diff, schema, long_message, nul, last = (next(answers) for _ in range(9))
    assert "No such file" in _error(pattern)
    assert "a folder" in _error(folder)
    assert "not a regular file" in _error(pipe)
    assert "not a folder" in _error(not_a_folder)
    assert "os.system" in _error(diff)
    assert "format" in _error(schema) and "'text', 'md' or 'json'" in _error(schema)
    assert "longer than 100,000 bytes" in _error(long_message)
    assert "NUL" in _error(nul)
    assert json.loads(_answer(last))["file"] == str(EXAMPLE_DUMP)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*files, "pipe"])  # nothing written


def _tuple_bomb() -> bytes:
    """tests/test_hostile_inputs.py's r08: hashing it costs 2**40 steps inside the C unpickler."""
    import struct

    out = bytearray(b"\x80\x04}" + b"\x8c\x02ab\x94" + b"0")
    for i in range(40):
        get = b"j" + struct.pack("<I", i)
        out += get + get + b"\x86\x94" + (b"0" if i < 39 else b"")
    return bytes(out) + b"K\x01s."


def _processes_reading(path: Path) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and str(path).encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            pass
    return found


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the processes are found in /proc")
def test_a_file_that_hangs_the_unpickler_ends_its_call_only_and_the_server_keeps_serving(sdk, tmp_path, monkeypatch):
    bomb = tmp_path / "tuple-bomb.pickle"
    bomb.write_bytes(_tuple_bomb())
    # the command's own unpickling limit ends it ...
    monkeypatch.setenv("OOMDOCTOR_READ_SECONDS", "1")
    started = time.monotonic()
    limited, after = _calls(sdk, [("report", {"path": str(bomb)}), ("info", {"path": str(EXAMPLE_DUMP)})])
    assert "refused: unpickling it did not finish" in _error(limited) and str(bomb) in _error(limited)
    assert "segments" in _answer(after)
    # ... and where that limit is longer, the server's --timeout ends the call and all its processes
    monkeypatch.setenv("OOMDOCTOR_READ_SECONDS", "120")
    timed_out, after = _calls(
        sdk, [("report", {"path": str(bomb)}), ("info", {"path": str(EXAMPLE_DUMP)})], timeout=1.5
    )
    assert "not finished within 1.5 s" in _error(timed_out) and str(bomb) in _error(timed_out)
    assert "segments" in _answer(after)
    assert _processes_reading(bomb) == []
    # ... and a call the client gives up on ends too
    import anyio

    async def cancelled(client):
        with anyio.move_on_after(1.0):
            await client.call_tool("report", {"path": str(bomb)})
        for _ in range(100):  # the cancellation reaches the server as a notification
            if not _processes_reading(bomb):
                break
            await anyio.sleep(0.05)
        return _processes_reading(bomb), await client.call_tool("info", {"path": str(EXAMPLE_DUMP)})

    left, after = _with_client(sdk, cancelled)
    assert left == [] and "segments" in _answer(after)
    assert time.monotonic() - started < 30


def test_strings_from_the_dump_come_escaped(sdk, tmp_path):
    path = tmp_path / "escapes.pickle"
    path.write_bytes(pickle.dumps(one_block_snapshot(filename=f"/src/{EVIL}train.py"), protocol=4))
    text, markdown, data = _calls(sdk, [("report", {"path": str(path), "format": f}) for f in ("text", "md", "json")])
    for result in (text, markdown):
        assert not RAW_CONTROL.search(_answer(result))
        assert "/src/\\x1b]0;pwned\\x07\\x1b[2Jtrain.py" in _answer(result)
    assert "\\u001b" in _answer(data) or "\\x1b" in _answer(data)


def test_an_output_past_the_limit_is_refused(sdk, monkeypatch):
    import oomdoctor.mcp_server

    monkeypatch.setattr(oomdoctor.mcp_server, "MAX_OUTPUT_BYTES", 1000)
    (result,) = _calls(sdk, [("report", {"path": str(EXAMPLE_DUMP), "format": "json"})])
    assert "larger than 1,000 bytes" in _error(result)


def test_the_servers_max_bytes_applies_to_every_call(sdk):
    results = _calls(
        sdk,
        [("info", {"path": str(EXAMPLE_DUMP)}), ("report", {"path": str(EXAMPLE_DUMP)})],
        max_bytes=1000,
    )
    for result in results:
        assert "larger than" in _error(result) or "limit" in _error(result)


@pytest.mark.slow
def test_over_stdio_as_a_client_starts_it(sdk):
    """`oomdoctor mcp` as an MCP client runs it: a process speaking the protocol on stdin/stdout."""
    import anyio

    parameters = sdk.StdioServerParameters(
        command=sys.executable, args=["-m", "oomdoctor", "mcp"], env={"PYTHONPATH": _environment()["PYTHONPATH"]}
    )

    async def main():
        async with sdk.Client(parameters, mode="legacy") as client:
            tools = {tool.name for tool in (await client.list_tools()).tools}
            report = await client.call_tool("report", {"path": str(EXAMPLE_DUMP), "format": "json"})
            refused = await client.call_tool("report", {"path": "/nonexistent/dump.pickle"})
            return tools, report, refused

    tools, report, refused = anyio.run(main)
    assert tools == TOOLS
    assert json.loads(_answer(report)) == json.loads(pipeline.report_file(str(EXAMPLE_DUMP), "json"))
    assert "cannot read" in _error(refused)
