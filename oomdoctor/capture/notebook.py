"""Notebooks: IPython catches every exception a cell raises, so `sys.excepthook` never runs.

`install()` under IPython (and `%load_ext oomdoctor`) registers IPython's custom exception handler
for torch's OutOfMemoryError (`set_custom_exc`): the handler completes the dump with the traceback,
shows the traceback as IPython would, then says what the traceback still holds and how to let it
go. A traceback keeps every frame it passed through alive, with their local tensors: IPython keeps
the last one (`sys.last_traceback`, `%debug` reads it), so after an OOM in a cell the memory of the
failed step stays in use, and the next cell runs out sooner (pytorch/pytorch#27600,
ipython/ipython#11572). `release()` (`%oomdoctor release`) drops those references, clears the
frames, collects garbage and empties torch's cache, and says how much it freed.

IPython allows one custom handler: when another is registered already, oomdoctor leaves it alone
and reads the cell's error after it ran (`post_run_cell`) instead. Nothing here imports IPython: it
is used only when the process already runs it.
"""

from __future__ import annotations

import gc
import sys
import traceback
from collections.abc import Callable
from typing import Any

from oomdoctor.capture import writer
from oomdoctor.capture.environment import attempt
from oomdoctor.units import human_size

MAX_NAMED = 5  # variables named in the note
LAST_ATTRIBUTES = ("last_type", "last_value", "last_traceback", "last_exc")


def running_shell() -> Any:
    """The running IPython shell, or None (IPython is never imported here)."""
    if "IPython" not in sys.modules:
        return None
    get_ipython = getattr(sys.modules["IPython"], "get_ipython", None)
    shell = attempt(get_ipython) if callable(get_ipython) else None
    return shell if shell is not None and hasattr(shell, "set_custom_exc") else None


def attach(session: Any, shell: Any = None) -> Callable[[], None] | None:
    """Route the OOMs a cell raises to `session`; returns the undo, or None outside IPython."""
    shell = shell if shell is not None else running_shell()
    if shell is None or not session.oom_types:
        return None

    def handler(shell: Any, etype: Any, value: Any, tb: Any, tb_offset: Any = None) -> None:
        record = session._guarded(session.uncaught)(value) if session.active else None
        shell.showtraceback((etype, value, tb), tb_offset=tb_offset)
        if record is not None:
            session._say_dump_of_exception(record)
        say_what_holds_memory(session.backend, tb)
        return None

    if not tuple(getattr(shell, "custom_exceptions", ()) or ()):
        shell.set_custom_exc(tuple(session.oom_types), handler)

        def undo() -> None:
            if tuple(getattr(shell, "custom_exceptions", ())) == tuple(session.oom_types):
                shell.set_custom_exc((), None)

        return undo

    def post_run_cell(result: Any) -> None:  # another tool has the custom handler
        error = getattr(result, "error_in_exec", None)
        if error is not None and isinstance(error, session.oom_types):
            record = session._guarded(session.uncaught)(error) if session.active else None
            if record is not None:
                session._say_dump_of_exception(record)
            say_what_holds_memory(session.backend, error.__traceback__)

    shell.events.register("post_run_cell", post_run_cell)
    return lambda: shell.events.unregister("post_run_cell", post_run_cell)


def held_by_traceback(backend: Any, tb: Any) -> list[tuple[str, str, int]]:
    """(function, variable, bytes) of the device tensors the traceback's function frames hold, each
    storage once, largest first; module-level frames are left out (the namespace holds those)."""
    seen: set[int] = set()
    held: list[tuple[str, str, int]] = []
    for frame, _ in traceback.walk_tb(tb):
        if frame.f_locals is frame.f_globals:
            continue
        for name, value in list(frame.f_locals.items()):
            candidates = value if isinstance(value, (list, tuple)) else (value,)
            total = 0
            for candidate in candidates[:1000]:
                size = _device_bytes(backend, candidate, seen)
                total += size
            if total:
                held.append((frame.f_code.co_name, name, total))
    held.sort(key=lambda item: -item[2])
    return held


def _device_bytes(backend: Any, value: Any, seen: set[int]) -> int:
    storage = getattr(value, "untyped_storage", None)
    if storage is None or not callable(storage):
        return 0
    try:
        address = backend.storage_address(value)
        if address is None or address in seen:
            return 0
        seen.add(address)
        return int(storage().nbytes())
    except Exception:
        return 0


def say_what_holds_memory(backend: Any, tb: Any) -> None:
    try:
        held = held_by_traceback(backend, tb)
    except Exception:
        return
    if not held:
        return
    total = sum(size for _, _, size in held)
    named = ", ".join(
        f"{name} in {function}() {human_size(size, decimals=1)}" for function, name, size in held[:MAX_NAMED]
    )
    more = f", and {len(held) - MAX_NAMED} more" if len(held) > MAX_NAMED else ""
    writer.say(
        f"{human_size(total, decimals=1)} of device memory is still held by the frames of this traceback "
        f"({named}{more}): the notebook keeps the traceback (sys.last_traceback), so that memory stays in "
        "use. Release it with: oomdoctor.release()  (or %oomdoctor release)"
    )


def release(shell: Any = None, backend: Any = None) -> int | None:
    """Let go of the last exception's traceback and the tensors its frames hold, collect garbage and
    empty torch's cache; says and returns the bytes of allocated memory freed (None when unknown)."""
    try:
        if backend is None:
            from oomdoctor.capture.backend import active_backend

            backend = active_backend()
        before = _allocated(backend)
        shell = shell if shell is not None else running_shell()
        errors = [getattr(sys, name, None) for name in ("last_value", "last_exc")]
        tracebacks = [getattr(sys, "last_traceback", None)]
        for name in LAST_ATTRIBUTES:
            if hasattr(sys, name):
                try:
                    delattr(sys, name)
                except AttributeError:
                    pass
        for error in errors:
            if isinstance(error, BaseException):
                tracebacks.append(error.__traceback__)
                error.__traceback__ = None
        if shell is not None:
            formatter = getattr(shell, "InteractiveTB", None)
            if formatter is not None and getattr(formatter, "tb", None) is not None:
                tracebacks.append(formatter.tb)
                formatter.tb = None
        for tb in tracebacks:
            if tb is not None:
                frames = [frame for frame, _ in traceback.walk_tb(tb)]
                traceback.clear_frames(tb)
                for frame in frames:
                    # before Python 3.13 a frame keeps the dict f_locals made until it is read again
                    attempt(lambda frame=frame: frame.f_locals)
                del frames
        del errors, tracebacks
        gc.collect()
        _empty_cache()
        after = _allocated(backend)
        if before is None or after is None:
            writer.say("released the last exception's traceback and emptied the cache")
            return None
        freed = max(0, before - after)
        writer.say(f"released {human_size(freed, decimals=1)} (allocated now {human_size(after, decimals=1)})")
        return freed
    except Exception as error:
        writer.say(f"release() failed ({type(error).__name__}: {error})")
        return None


def _allocated(backend: Any) -> int | None:
    def read() -> int:
        return int(backend.memory_stats(backend.current_device())["allocated_bytes.all.current"])

    return attempt(read)


def _empty_cache() -> None:
    torch = sys.modules.get("torch")
    if torch is not None:
        attempt(torch.cuda.empty_cache)


def magic(line: str) -> None:
    """%oomdoctor [release | status]: release the memory the last OOM's traceback holds, or say
    whether capture is installed."""
    from oomdoctor import capture

    word = line.strip().lower()
    if word == "release":
        release()
    elif word in ("", "status"):
        writer.say("capture is installed" if capture.is_installed() else "capture is not installed")
    else:
        writer.say(f"unknown %oomdoctor command {line.strip()!r} (known: release, status)")


def load_ipython_extension(shell: Any) -> None:
    """`%load_ext oomdoctor`: install capture in this kernel and add the %oomdoctor magic."""
    from oomdoctor import capture

    capture.install()
    session = capture._session
    if session is not None and session.notebook_undo is None:
        session.attach_notebook(shell)
    try:
        shell.register_magic_function(magic, "line", "oomdoctor")
    except Exception as error:
        writer.say(f"could not add the %oomdoctor magic ({type(error).__name__}: {error})")


def unload_ipython_extension(shell: Any) -> None:
    from oomdoctor import capture

    capture.uninstall()
