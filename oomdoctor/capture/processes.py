"""Child processes: spawned training processes keep their traceback; DataLoader workers stay out.

* `torch.multiprocessing.spawn` (and what is built on it: Lightning's `ddp_spawn`, accelerate's
  `notebook_launcher`) runs the function in a child through `_wrap`, which catches the exception,
  sends its text to the parent and calls `sys.exit(1)`: no excepthook runs, and a multiprocessing
  child ends with `os._exit`, so no atexit handler either. `_wrap` is wrapped so that an exception
  leaving the function completes the dump with its traceback first, as the excepthook would.
* DataLoader workers run `torch.utils.data._utils.worker._worker_loop`. Under spawn or forkserver a
  worker re-imports the main module, so an `install()` at its top runs again in every worker; under
  fork a worker inherits the parent's capture. The worker loop is wrapped so that it turns capture
  off in the worker before it starts: a worker writes no dump and says nothing, and install() in it
  does nothing.

Both wrappers keep the wrapped function's module and qualified name, so that multiprocessing
pickles them by reference, as it pickles the originals: a child resolves the name to its own
(wrapped or not) function.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

_in_worker = False


def in_dataloader_worker() -> bool:
    """Whether this process is a DataLoader worker (its loop started, or torch says so)."""
    if _in_worker:
        return True
    data = sys.modules.get("torch.utils.data")
    get_worker_info = getattr(data, "get_worker_info", None)
    if get_worker_info is None:
        return False
    try:
        return get_worker_info() is not None
    except Exception:
        return False


def in_child_process() -> bool:
    """Started by multiprocessing (spawn, forkserver or fork)."""
    multiprocessing = sys.modules.get("multiprocessing")
    parent_process = getattr(multiprocessing, "parent_process", None)
    try:
        return parent_process is not None and parent_process() is not None
    except Exception:
        return False


def _replace(module: Any, name: str, make: Callable[[Any], Any]) -> Callable[[], None] | None:
    original = getattr(module, name, None) if module is not None else None
    if not callable(original) or getattr(original, "__oomdoctor_wrapper__", False):
        return None
    wrapper = functools.wraps(original)(make(original))
    wrapper.__oomdoctor_wrapper__ = True  # type: ignore[attr-defined]
    setattr(module, name, wrapper)

    def undo() -> None:
        if getattr(module, name, None) is wrapper:
            setattr(module, name, original)

    return undo


def _child_exception(error: BaseException) -> None:
    from oomdoctor import capture

    session = capture._session
    if session is None or not session.active:
        return
    record = session._guarded(session.uncaught)(error)
    if record is not None:
        session._say_dump_of_exception(record)


def patch_spawn_wrap() -> Callable[[], None] | None:
    """torch.multiprocessing.spawn._wrap: the child's exception reaches capture before `_wrap` eats it."""
    module = sys.modules.get("torch.multiprocessing.spawn")

    def make(original: Any) -> Any:
        def _wrap(fn: Any, *args: Any, **kwargs: Any) -> Any:
            def traced(*fn_args: Any, **fn_kwargs: Any) -> Any:
                try:
                    return fn(*fn_args, **fn_kwargs)
                except Exception as error:
                    _child_exception(error)
                    raise

            return original(traced, *args, **kwargs)

        return _wrap

    return _replace(module, "_wrap", make)


def patch_worker_loop(enter_worker: Callable[[], None]) -> Callable[[], None] | None:
    """torch.utils.data._utils.worker._worker_loop: capture is turned off before a worker starts."""
    module = sys.modules.get("torch.utils.data._utils.worker")
    if module is None:
        try:
            import torch.utils.data._utils.worker as module  # type: ignore[no-redef]
        except Exception:
            return None

    def make(original: Any) -> Any:
        def _worker_loop(*args: Any, **kwargs: Any) -> Any:
            global _in_worker
            _in_worker = True
            try:
                enter_worker()
            except Exception:
                pass
            return original(*args, **kwargs)

        return _worker_loop

    return _replace(module, "_worker_loop", make)


def at_child_exit(callback: Callable[[], None]) -> Callable[[], None] | None:
    """Run `callback` when a multiprocessing child exits (it ends with os._exit: atexit never runs)."""
    if not in_child_process():
        return None
    util = sys.modules.get("multiprocessing.util")
    finalize = getattr(util, "Finalize", None)
    if finalize is None:
        return None
    finalizer = finalize(None, callback, exitpriority=10)
    return finalizer.cancel
