"""Run a script (or a module) with capture installed first: no change to its code.

    oomdoctor run [--dir DIR] [--max-dumps N] SCRIPT [ARGS ...]
    oomdoctor run [--dir DIR] [--max-dumps N] -m MODULE [ARGS ...]
    torchrun --nproc-per-node 8 -m oomdoctor run train.py --lr 3e-4

The script runs in this process as `python SCRIPT ARGS` (or `python -m MODULE ARGS`) would run
it: as `__main__`, with `sys.argv` set to the script and its arguments and the script's folder (the
working directory for -m) first on `sys.path`; its output, exit status and traceback are its own.
Before it starts, `oomdoctor.install()` records the caching allocator's history, so an OOM leaves a
dump in ./oom-dumps (or --dir, or $OOMDOCTOR_DIR), named per rank under torchrun. Options of `run`
come before SCRIPT or -m; everything after belongs to the script. The other install() settings are
read from their environment variables (OOMDOCTOR_MAX_ENTRIES, OOMDOCTOR_STACKS, ...; docs/capture.md).

Child processes the script starts inherit OOMDOCTOR_INSTALL=1: where oomdoctor's start-up hook is
installed (the `oomdoctor-startup.pth` file pip puts in site-packages), each Python child that
imports torch installs capture too (DataLoader workers turn it off again).

Exit status: the script's own (1 for an uncaught exception, as python's), 2 when there is nothing to
run.
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
import types
from pathlib import Path
from typing import Any

from oomdoctor.errors import OomdoctorError

STARTUP_VARIABLE = "OOMDOCTOR_INSTALL"  # read by the start-up hook (oomdoctor/capture/startup.py)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dir", metavar="DIR", help="folder for dumps (default: $OOMDOCTOR_DIR or ./oom-dumps)")
    parser.add_argument(
        "--max-dumps", type=int, metavar="N", help="sites whose OOMs get files of their own (default 5)"
    )
    parser.add_argument(
        "-m",
        dest="module",
        nargs=argparse.REMAINDER,
        metavar="MODULE [ARGS]",
        help="run a module, as python -m does (everything after it is the module's)",
    )
    parser.add_argument(
        "command", nargs=argparse.REMAINDER, metavar="SCRIPT [ARGS]", help="the script (or the module's arguments)"
    )


def run(args: argparse.Namespace) -> int:
    command = list(args.command or [])
    if command and command[0] == "--":
        command = command[1:]
    module = None
    if args.module is not None:
        if not args.module:
            raise OomdoctorError("-m needs a module: oomdoctor run -m MODULE [ARGS]")
        module, command = args.module[0], [*args.module[1:], *command]
        _set_path0("")
        if not _module_exists(module):
            raise OomdoctorError(f"no module named {module}")
    else:
        if not command:
            raise OomdoctorError("run needs a script: oomdoctor run SCRIPT [ARGS] or oomdoctor run -m MODULE [ARGS]")
        script = Path(command[0])
        if not script.is_file():
            raise OomdoctorError(f"no such script: {script}")
    options: dict[str, Any] = {}
    if args.dir is not None:
        options["dump_dir"] = args.dir
    if args.max_dumps is not None:
        options["max_dumps"] = args.max_dumps
    os.environ[STARTUP_VARIABLE] = "1"
    if args.dir is not None:
        os.environ.setdefault("OOMDOCTOR_DIR", os.path.abspath(args.dir))  # the same folder for children

    import oomdoctor

    oomdoctor.install(**options)
    sys.stdout.flush()
    if module is not None:
        return _run(lambda: runpy.run_module(module, run_name="__main__", alter_sys=True), [module, *command], "")
    return _run(
        lambda: runpy.run_path(str(script), run_name="__main__"), [str(script), *command[1:]], str(script.parent)
    )


def _run(target: Any, argv: list[str], path0: str) -> int:
    """Run `target` as python runs __main__: the exit status, and an uncaught exception's traceback
    through sys.excepthook (where capture completes the dump)."""
    sys.argv = argv
    _set_path0(path0)
    try:
        target()
    except SystemExit as exit_:
        return _exit_code(exit_.code)
    except BaseException as error:  # noqa: BLE001 - the script's own, shown as python would
        error.with_traceback(_without_runner(error.__traceback__))
        sys.excepthook(type(error), error, error.__traceback__)
        return 130 if isinstance(error, KeyboardInterrupt) else 1
    finally:
        sys.stdout.flush()
    return 0


def _set_path0(path0: str) -> None:
    """sys.path[0] as python sets it: the script's folder, or the working directory for -m."""
    first = os.path.abspath(path0) if path0 else os.getcwd()
    if sys.path:
        sys.path[0] = first
    else:
        sys.path.insert(0, first)


def _without_runner(trace: types.TracebackType | None) -> types.TracebackType | None:
    """The traceback from the script's first frame on (this module's and runpy's frames left out)."""
    skip = {os.path.abspath(__file__), os.path.abspath(runpy.__file__), "<frozen runpy>"}
    while trace is not None and trace.tb_next is not None:
        filename = trace.tb_frame.f_code.co_filename
        if filename not in skip and os.path.abspath(filename) not in skip:
            break
        trace = trace.tb_next
    return trace


def _module_exists(name: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _exit_code(code: Any) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1
