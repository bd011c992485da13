"""`oomdoctor mcp`: a read-only Model Context Protocol server over stdio (the `mcp` extra).

The only module that imports the MCP SDK (`mcp`, with its `anyio` and `pydantic`); `oomdoctor mcp`
imports it when the verb runs, so `import oomdoctor` and every other verb never do.

Each tool runs the `oomdoctor` command itself (`python -m oomdoctor VERB ...`, the same pipeline,
views and limits) in a child process of its own session, so the CLI's safety rules hold unchanged:
the child reads the file in its own watched process (`oomdoctor.supervise`: the unpickling time
limit, the address-space cap, one line when the unpickler hangs or crashes), and this server only
waits for it. A call that runs past the server's time limit, writes more than MAX_OUTPUT_BYTES or
dies is ended (its whole process group) and answered with one line as an error result (isError);
the server keeps serving. Success is the command's output, text, Markdown or JSON, as the CLI
writes it (strings from the file already escaped by the views).

Read-only: the tools take a path (or, for explain, the message's text), never write anything, and
never glob; a path is resolved (`~`, links, relative to the server's working folder) and must be a
regular file (for diff_ranks, a folder). The server's `--max-bytes` applies to every call.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
from pathlib import Path
from typing import Annotated, Literal

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.types import CallToolResult, TextContent, ToolAnnotations
from pydantic import Field

from oomdoctor import __version__
from oomdoctor.safetext import printable

DEFAULT_TIMEOUT_SECONDS = 600.0
# What one call may write: a report of the largest dumps is a few MiB; more is refused, not held.
MAX_OUTPUT_BYTES = 64 * 1024**2
MAX_ERROR_BYTES = 64 * 1024
# explain's message goes to the command as one argument: Linux takes up to 128 KiB in one.
MAX_MESSAGE_BYTES = 100_000
# Calls that run at once (each is a process that may take the memory a large dump needs); more wait.
CONCURRENT_CALLS = 2
ERROR_LIMIT = 1000
# The child always runs supervised and never shows a traceback, whatever the server's environment.
DROPPED_ENVIRONMENT = ("OOMDOCTOR_IN_PROCESS", "OOMDOCTOR_DEBUG")
# Where `python -m oomdoctor` finds the same package this server runs from.
PACKAGE_ROOT = str(Path(__file__).resolve().parent.parent)

INSTRUCTIONS = (
    "oomdoctor explains PyTorch CUDA out-of-memory failures. Give report a dump or torch memory "
    "snapshot (pickle, gzip, JSON or memory_viz HTML) to get the verdict, its evidence and what to "
    "change; info says what a snapshot holds; diff, diff_steps and diff_ranks compare two dumps, two "
    "steps of one, or two ranks of a folder; explain reads an OOM message's text when there is no "
    "dump. Paths are read, never written; give absolute paths."
)
READ_ONLY = ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True, open_world_hint=False)

FilePath = Annotated[str, Field(description="the file's path (absolute, or relative to the server's working folder)")]
Device = Annotated[int | None, Field(description="judge this device instead of the one that ran out of memory")]
Redact = Annotated[bool, Field(description="leave out host and user names, path prefixes and process ids")]
Step = Annotated[int, Field(description="a step, numbered as reports number them (the first is 0)")]
Rank = Annotated[int, Field(description="a rank, as the dumps record it")]


class CallFailed(Exception):
    """A call's one-line answer as an error result."""


class Tools:
    """The tools, bound to the server's limits (`max_bytes`: the command's --max-bytes, None for its default)."""

    def __init__(self, *, max_bytes: int | None = None, timeout: float = DEFAULT_TIMEOUT_SECONDS) -> None:
        self.max_bytes = max_bytes
        self.timeout = timeout
        self._limiter = anyio.CapacityLimiter(CONCURRENT_CALLS)

    async def info(self, path: FilePath, format: Literal["text", "json"] = "text") -> CallToolResult:
        """What a snapshot file holds: its format, devices, segments, byte totals (reserved,
        allocated, requested, free), trace events, OOMs and allocator settings."""
        return await self._answer(lambda: ["info", regular_file(path), "--format", format, *self._limit()])

    async def report(
        self,
        path: FilePath,
        format: Literal["text", "md", "json"] = "text",
        device: Device = None,
        redact: Redact = False,
    ) -> CallToolResult:
        """Why an OOM dump ran out of memory: the verdict, the evidence that proves it, what to change
        (largest saving first), memory at the OOM by component, and what the file cannot tell. json
        holds the full result (docs/schema/report.schema.json); md is laid out for a GitHub issue."""
        return await self._answer(
            lambda: [
                "report",
                regular_file(path),
                "--format",
                format,
                *_device(device),
                *_redact(redact),
                *self._limit(),
            ]
        )

    async def diff(
        self,
        a: FilePath,
        b: FilePath,
        format: Literal["text", "md", "json"] = "text",
        device: Device = None,
        redact: Redact = False,
    ) -> CallToolResult:
        """Compare two dumps (run A against run B): how much higher B peaks, the components and
        allocation sites that changed, whether the verdict changed, and what the dumps record that
        may explain it. json follows docs/schema/diff.schema.json."""
        return await self._answer(
            lambda: [
                "diff",
                regular_file(a),
                regular_file(b),
                "--format",
                format,
                *_device(device),
                *_redact(redact),
                *self._limit(),
            ]
        )

    async def diff_steps(
        self,
        path: FilePath,
        step_a: Step,
        step_b: Step,
        format: Literal["text", "md", "json"] = "text",
        device: Device = None,
        redact: Redact = False,
    ) -> CallToolResult:
        """Compare two steps of one dump: what step_b added to step_a, at each step's peak and at its
        OOM or last event."""
        return await self._answer(
            lambda: [
                "diff",
                regular_file(path),
                "--steps",
                str(step_a),
                str(step_b),
                "--format",
                format,
                *_device(device),
                *_redact(redact),
                *self._limit(),
            ]
        )

    async def diff_ranks(
        self,
        folder: Annotated[str, Field(description="the folder of per-rank dump files (absolute path)")],
        rank_a: Rank,
        rank_b: Rank,
        format: Literal["text", "md", "json"] = "text",
        redact: Redact = False,
    ) -> CallToolResult:
        """Compare two ranks of a folder of per-rank dumps (one file per rank of a distributed job):
        why rank_b ran out and rank_a did not, or what differs between them."""
        return await self._answer(
            lambda: [
                "diff",
                folder_path(folder),
                "--ranks",
                str(rank_a),
                str(rank_b),
                "--format",
                format,
                *_redact(redact),
                *self._limit(),
            ]
        )

    async def explain(
        self,
        message: Annotated[
            str, Field(description="the OOM message, or the part of a log around it (up to 100,000 bytes)")
        ],
        format: Literal["text", "json"] = "text",
    ) -> CallToolResult:
        """Read PyTorch out-of-memory messages in a text (when there is no dump): what each figure
        means, what follows from them (memory outside PyTorch, other processes, reserved but
        unallocated), a likely verdict, what to do, and what a message cannot tell."""
        return await self._answer(lambda: ["explain", "--message", message_argument(message), "--format", format])

    def _limit(self) -> list[str]:
        return [] if self.max_bytes is None else ["--max-bytes", str(self.max_bytes)]

    async def _answer(self, arguments) -> CallToolResult:
        """The command's output as the result, or its one line as an error result."""
        try:
            output = await self.run_command(arguments())
        except CallFailed as failed:
            return CallToolResult(content=[TextContent(type="text", text=str(failed))], is_error=True)
        return CallToolResult(content=[TextContent(type="text", text=output)])

    async def run_command(self, arguments: list[str]) -> str:
        """`oomdoctor ARGUMENTS` in a child process: its standard output, or CallFailed with one line."""
        async with self._limiter:
            return await self._run(arguments)

    async def _run(self, arguments: list[str]) -> str:
        environment = {k: v for k, v in os.environ.items() if k not in DROPPED_ENVIRONMENT}
        try:
            process = await anyio.open_process(
                [sys.executable, "-m", "oomdoctor", *arguments],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=PACKAGE_ROOT,
                env=environment,
                start_new_session=True,
            )
        except (OSError, ValueError) as error:
            raise CallFailed(_line(f"{arguments[0]}: could not start the command ({error})")) from None
        out, err = bytearray(), bytearray()
        overflow: list[bool] = []
        code = None
        try:
            with anyio.move_on_after(self.timeout) as deadline:
                async with anyio.create_task_group() as readers:
                    readers.start_soon(_drain, process.stdout, out, MAX_OUTPUT_BYTES, overflow, readers.cancel_scope)
                    readers.start_soon(_drain, process.stderr, err, MAX_ERROR_BYTES, None, None)
                if not overflow:  # else it may be blocked writing: ended below
                    code = await process.wait()
        finally:
            _end_group(process)
            with anyio.CancelScope(shield=True):
                await process.wait()
                await process.aclose()
        if overflow:
            raise CallFailed(
                _line(f"{_subject(arguments)}: the output is larger than {MAX_OUTPUT_BYTES:,} bytes; stopped")
            )
        if deadline.cancelled_caught:
            raise CallFailed(
                _line(
                    f"{_subject(arguments)}: not finished within {self.timeout:g} s "
                    "(the server's --timeout); stopped, nothing from the file was run"
                )
            )
        if code == 0:
            return out.decode("utf-8", "replace")
        raise CallFailed(_failure_line(arguments, code if code is not None else -1, bytes(err)))


async def _drain(stream, into: bytearray, limit: int, overflow: list | None, scope) -> None:
    """Read `stream` to its end into `into`; past `limit`, stop (and, with `overflow`, say so and end the call)."""
    try:
        async for chunk in stream:
            if len(into) + len(chunk) > limit:
                if overflow is not None:
                    overflow.append(True)
                    scope.cancel()
                    return
                into[:] = into[-(limit // 2) :]  # keep the end of a long stderr: the command's line is last
            into += chunk
    except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
        pass


def _end_group(process) -> None:
    """Kill the command and anything it started (the supervised child, folder workers)."""
    try:
        if hasattr(os, "killpg"):
            os.killpg(process.pid, signal.SIGKILL)
        elif process.returncode is None:
            process.kill()
    except (ProcessLookupError, PermissionError, OSError):
        pass


def _failure_line(arguments: list[str], code: int, err: bytes) -> str:
    lines = [line for line in err.decode("utf-8", "replace").splitlines() if line.strip()]
    ours = [line for line in lines if line.startswith("oomdoctor: ")]
    if ours:
        return printable(ours[-1], ERROR_LIMIT)
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        hint = " (out of memory?)" if -code == getattr(signal, "SIGKILL", 9) else ""
        return _line(f"{_subject(arguments)}: the command was ended by {name}{hint}; nothing from the file was run")
    if lines:  # an argument the command refused (argparse's last line says which)
        return _line(lines[-1])
    return _line(f"{_subject(arguments)}: the command failed (exit {code}) without a message")


def _subject(arguments: list[str]) -> str:
    """What a call was about, for its error line: the verb and its file(s)."""
    files = [a for a in arguments[1:3] if a.startswith(os.sep) or (os.altsep and a.startswith(os.altsep))]
    return " ".join([arguments[0], *files])


def _line(text: str) -> str:
    return "oomdoctor: " + printable(text, ERROR_LIMIT)


def _device(device: int | None) -> list[str]:
    return [] if device is None else [f"--device={device}"]


def _redact(redact: bool) -> list[str]:
    return ["--redact"] if redact else []


def _resolved(path: str, what: str) -> tuple[str, os.stat_result]:
    if not path:
        raise CallFailed(_line(f"no {what} given"))
    if "\x00" in path:
        raise CallFailed(_line(f"{path}: a path cannot hold a NUL character"))
    try:
        resolved = os.path.realpath(os.path.expanduser(path), strict=True)
        return resolved, os.stat(resolved)
    except (OSError, ValueError, UnicodeError) as error:
        reason = getattr(error, "strerror", None) or str(error)
        raise CallFailed(_line(f"{path}: cannot read ({reason})")) from None


def regular_file(path: str) -> str:
    """`path` resolved; CallFailed unless it is a regular file (no folder, pipe, device or pattern)."""
    resolved, status = _resolved(path, "file")
    if stat.S_ISDIR(status.st_mode):
        raise CallFailed(_line(f"{path}: a folder; give one dump file (diff_ranks compares two ranks of a folder)"))
    if not stat.S_ISREG(status.st_mode):
        raise CallFailed(_line(f"{path}: not a regular file (a pipe, socket or device); give a dump file"))
    return resolved


def folder_path(path: str) -> str:
    """`path` resolved; CallFailed unless it is a folder."""
    resolved, status = _resolved(path, "folder")
    if not stat.S_ISDIR(status.st_mode):
        raise CallFailed(_line(f"{path}: not a folder; diff_ranks compares two rank files of one folder"))
    return resolved


def message_argument(message: str) -> str:
    """explain's text as one command-line argument; CallFailed when it cannot be one."""
    text = message.encode("utf-8", "replace").decode("utf-8")  # lone surrogates from JSON: '?'
    if "\x00" in text:
        raise CallFailed(_line("the message holds a NUL character: a binary file, not a text log"))
    if len(text.encode("utf-8")) > MAX_MESSAGE_BYTES:
        raise CallFailed(
            _line(f"the message is longer than {MAX_MESSAGE_BYTES:,} bytes; pass the part of the log around the error")
        )
    return text


async def one_line_errors(ctx, call_next):
    """Middleware: an error result is one line, also where the SDK wrote it (arguments that do not
    fit a tool's schema get pydantic's several lines)."""
    result = await call_next(ctx)
    if getattr(ctx, "method", None) != "tools/call":
        return result
    if isinstance(result, CallToolResult):
        result = result.model_dump(by_alias=True, mode="json", exclude_none=True)
    if isinstance(result, dict) and result.get("isError") and isinstance(result.get("content"), list):
        texts = [block.get("text") for block in result["content"] if isinstance(block, dict)]
        text = " ".join(t for t in texts if isinstance(t, str))
        if "\n" in text or not text.startswith("oomdoctor: "):
            result = dict(result, content=[{"type": "text", "text": error_line(text)}])
    return result


def error_line(text: str) -> str:
    """An error's text as one line starting 'oomdoctor: ' (pydantic's pointer to its docs left out)."""
    parts = [part.strip() for part in text.splitlines()]
    line = "; ".join(part for part in parts if part and not part.startswith("For further information visit"))
    return _line(line.removeprefix("oomdoctor: ") or "the call failed without a message")


def build_server(*, max_bytes: int | None = None, timeout: float = DEFAULT_TIMEOUT_SECONDS) -> MCPServer:
    """The MCP server with oomdoctor's tools (all read-only)."""
    tools = Tools(max_bytes=max_bytes, timeout=timeout)
    server = MCPServer(
        name="oomdoctor",
        version=__version__,
        instructions=INSTRUCTIONS,
        log_level="WARNING",
        subscriptions=False,
        middleware=[one_line_errors],
    )
    for tool in (tools.info, tools.report, tools.diff, tools.diff_steps, tools.diff_ranks, tools.explain):
        description = " ".join((tool.__doc__ or "").split())
        server.add_tool(tool, description=description, annotations=READ_ONLY, structured_output=False)
    return server


def serve(*, max_bytes: int | None = None, timeout: float = DEFAULT_TIMEOUT_SECONDS) -> None:
    """Serve over standard input and output until the client closes them."""
    build_server(max_bytes=max_bytes, timeout=timeout).run("stdio")


__all__ = ["DEFAULT_TIMEOUT_SECONDS", "Tools", "build_server", "serve"]
