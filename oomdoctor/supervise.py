"""The `oomdoctor` command runs in a child process that its parent watches.

A hostile file can make CPython's unpickler work without bound or overflow the C stack (see
`oomdoctor.load.guard`), where no exception reaches Python. The command therefore runs in a forked
child with the unpickling time limit armed; the parent only waits. When the child dies of a signal
the parent restores the terminal (the app may have left it in the alternate screen, mouse tracking
on and the cursor hidden) and prints one line, naming the file the child was reading, and exits 2.
Ctrl-C reaches both: a child in Python code ends itself (exit 130); one stuck inside C code is
ended by the parent after a short grace.

Where `os.fork` does not exist (Windows) the command runs in this process, without that limit.
"""

from __future__ import annotations

import mmap
import os
import signal
import sys
from collections.abc import Callable, Sequence

from oomdoctor.errors import EXIT_BAD_INPUT
from oomdoctor.load import guard
from oomdoctor.safetext import printable

IN_PROCESS_ENV = "OOMDOCTOR_IN_PROCESS"  # "1": run the command in this process (debugging)
INTERRUPT_GRACE_SECONDS = 2.0
# How the parent's line for a file that hung or crashed the unpickler begins (after the file's name).
REFUSED_AFTER_LIMIT = "refused: unpickling it did not finish"
REFUSED_AFTER_CRASH = "refused: the unpickler crashed"
# Back to the start of the line, erased to its end.
CLEAR_LINE = "\r\x1b[K"
# What puts a terminal back after a full-screen app died: leave the alternate screen, show the
# cursor, stop mouse reporting (all modes), bracketed paste and focus events.
TERMINAL_RESET = (
    "\x1b[?1049l\x1b[?25h\x1b[?1000l\x1b[?1002l\x1b[?1003l\x1b[?1006l\x1b[?1015l\x1b[?2004l\x1b[?1004l\x1b[0m"
)


def run(main: Callable[[Sequence[str] | None], int], argv: Sequence[str] | None = None) -> int:
    """`main(argv)` in a watched child process; its exit code, or 2 with one line if it was killed."""
    if not hasattr(os, "fork") or os.environ.get(IN_PROCESS_ENV) == "1":
        return main(argv)
    status = mmap.mmap(-1, guard.STATUS_BYTES)
    terminal = _terminal_state()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    pid = os.fork()
    if pid == 0:  # the child: the command itself
        code = EXIT_BAD_INPUT
        try:
            _no_core_files()
            _quiet_fatal_errors()
            guard.enable(status)
            code = main(argv)
        except SystemExit as exit_request:
            code = exit_request.code if isinstance(exit_request.code, int) else (0 if exit_request.code is None else 1)
        except KeyboardInterrupt:
            code = 130
        except BaseException:  # noqa: BLE001 - main() reports its own errors; this is a last resort
            code = EXIT_BAD_INPUT
        finally:
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except BaseException:  # noqa: BLE001 - a closed pipe: nothing more to say
                    pass
        os._exit(code if 0 <= code < 256 else EXIT_BAD_INPUT)
    return _watch(pid, status, terminal, argv)


def _watch(pid: int, status: mmap.mmap, terminal: object, argv: Sequence[str] | None) -> int:
    forwarded = []
    for number in ("SIGTERM", "SIGHUP"):
        signum = getattr(signal, number, None)
        if signum is not None:
            previous = signal.signal(signum, lambda s, _f: os.kill(pid, s))
            forwarded.append((signum, previous))
    try:
        try:
            _, wait_status = os.waitpid(pid, 0)
        except KeyboardInterrupt:
            wait_status = _after_interrupt(pid)
            if wait_status is None:
                _restore_terminal(terminal)
                print("oomdoctor: interrupted", file=sys.stderr)
                return 130
    finally:
        for signum, previous in forwarded:
            signal.signal(signum, previous)
    if os.WIFEXITED(wait_status):
        return os.WEXITSTATUS(wait_status)
    signum = os.WTERMSIG(wait_status)
    _restore_terminal(terminal)
    print(f"oomdoctor: {printable(_death_line(signum, guard.read_status(status), argv), 1000)}", file=sys.stderr)
    return EXIT_BAD_INPUT


def _after_interrupt(pid: int) -> int | None:
    """The child's wait status if it ends within the grace after Ctrl-C; else it is killed (None)."""
    import time

    deadline = time.monotonic() + INTERRUPT_GRACE_SECONDS
    while time.monotonic() < deadline:
        try:
            done, wait_status = os.waitpid(pid, os.WNOHANG)
        except KeyboardInterrupt:
            break
        if done:
            return wait_status if os.WIFEXITED(wait_status) else None
        time.sleep(0.02)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return None


def _death_line(signum: int, reading: tuple[float, str] | None, argv: Sequence[str] | None) -> str:
    name = _signal_name(signum)
    if reading is not None:
        limit, source = reading
        if signum == getattr(signal, "SIGALRM", None):
            return (
                f"{source}: {REFUSED_AFTER_LIMIT} within {limit:.0f} s, far longer than a "
                "snapshot of its size needs (a structure built to make the unpickler work without bound, "
                f"such as nested shared tuples; nothing from the file was run; {guard.READ_SECONDS_ENV} "
                "sets the limit)"
            )
        return (
            f"{source}: {REFUSED_AFTER_CRASH} on this file ({name}), as a damaged file or one "
            "built to crash readers makes it do (for example tuples nested a million deep); nothing "
            "from the file was run"
        )
    verb = next((a for a in (argv if argv is not None else sys.argv[1:]) if not a.startswith("-")), "oomdoctor")
    return f"{verb}: crashed ({name}); please report this, with the file if you can share it"


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _no_core_files() -> None:
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_CORE)
        resource.setrlimit(resource.RLIMIT_CORE, (0, hard))
    except (ImportError, ValueError, OSError):
        pass


def _quiet_fatal_errors() -> None:
    """No multi-line fatal-error dump (PYTHONFAULTHANDLER) from the child: the parent says it in one line."""
    import faulthandler

    if faulthandler.is_enabled():
        faulthandler.disable()


def _terminal_state() -> object:
    try:
        import termios

        if sys.stdin is not None and sys.stdin.isatty():
            return termios.tcgetattr(sys.stdin.fileno())
    except (ImportError, OSError, ValueError, AttributeError):
        pass
    return None


def _restore_terminal(terminal: object) -> None:
    try:
        if sys.stdout is not None and sys.stdout.isatty():
            sys.stdout.write(TERMINAL_RESET)
            sys.stdout.flush()
    except (OSError, ValueError):
        pass
    try:
        if sys.stderr is not None and sys.stderr.isatty():
            sys.stderr.write(CLEAR_LINE)  # a read's progress line the child left (commands.ReadProgress)
            sys.stderr.flush()
    except (OSError, ValueError):
        pass
    if terminal is None:
        return
    try:
        import termios

        termios.tcsetattr(sys.stdin.fileno(), termios.TCSADRAIN, terminal)  # type: ignore[arg-type]
    except (ImportError, OSError, ValueError, AttributeError, termios.error):
        pass


__all__ = ["IN_PROCESS_ENV", "run"]
