"""Serve oomdoctor to an AI assistant: a read-only MCP server over stdio.

    oomdoctor mcp                      # what an MCP client runs (README.md)
    oomdoctor mcp --max-bytes 8GiB --timeout 300

An optional extra: pip install 'oomdoctor[mcp]'. An MCP client starts this
command and speaks the Model Context Protocol on its stdin and stdout.

Tools: info, report, diff, diff_steps and diff_ranks read a path the client
gives (diff_ranks: a folder of rank files); explain reads a message's text.
Each call runs the oomdoctor command itself in a child process, with the
same limits and the same one-line errors (as error results): a file that
hangs or crashes the reader ends that call only. Nothing is written; a path
is resolved and must be a regular file, never a pattern.

--max-bytes applies to every call (default 4GiB, or OOMDOCTOR_MAX_BYTES);
--timeout ends a call that runs longer (default 600 s).

Exit status: 0 when the client closes the connection, 2 without the extra.
"""

from __future__ import annotations

import argparse
import sys

from oomdoctor.commands import add_max_bytes_argument
from oomdoctor.errors import OomdoctorError

INSTALL_HINT = "pip install 'oomdoctor[mcp]'"


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 < value < 1e7:
        raise argparse.ArgumentTypeError(f"seconds must be positive: {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_max_bytes_argument(parser, "refuse larger files in every call (default 4GiB)", parse_early=True)
    parser.add_argument(
        "--timeout", type=_seconds, default=600.0, metavar="SECONDS", help="end a call after this long (default 600)"
    )


def run(args: argparse.Namespace) -> int:
    try:
        from oomdoctor import mcp_server
    except ImportError as error:
        missing = getattr(error, "name", None)
        also = f" ({missing} could not be imported)" if missing not in (None, "mcp") else ""
        raise OomdoctorError(
            f"mcp: the MCP server needs the optional mcp extra (the MCP SDK){also}: {INSTALL_HINT}"
        ) from None
    if sys.stdin is not None and sys.stdin.isatty():
        print(
            "oomdoctor mcp: serving the Model Context Protocol on stdin/stdout for an MCP client "
            "(see README.md); Ctrl-D ends it",
            file=sys.stderr,
        )
    mcp_server.serve(max_bytes=args.max_bytes, timeout=args.timeout)
    return 0
