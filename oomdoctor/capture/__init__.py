"""Capture: what `oomdoctor.install()` does inside a training process.

Public surface (also reachable as `oomdoctor.install` / `uninstall` / `dump`):

* `install(**options)`: start recording the caching allocator's history (Python stacks,
  `context="all"`, a ring of 100 000 events), bracket forward / backward / optimizer step / zero_grad
  with markers, remember the models and optimizers used (weakly), and leave a dump at the moment of
  a CUDA OOM. Idempotent. Options, each also an environment variable: `dump_dir` (alias `dir`;
  `OOMDOCTOR_DIR`, default `./oom-dumps`), `max_entries` (`OOMDOCTOR_MAX_ENTRIES`), `stacks`
  (`OOMDOCTOR_STACKS`: `python` or `all`, which adds C++ frames and can make a dump take minutes),
  `context` (`OOMDOCTOR_CONTEXT`), `max_dumps` (`OOMDOCTOR_MAX_DUMPS`, default 5).
  `OOMDOCTOR_DISABLE=1` turns install() into a no-op.
* `uninstall()`: stop recording (if install() started it) and restore every hook it replaced.
* `dump(path=None)`: write a dump now, e.g. at the peak of a run that fits; returns its path.
* `current_markers()`: the markers recorded so far, as they would appear in a dump.

Without CUDA, with `PYTORCH_NO_CUDA_MEMORY_CACHING`, or with the `cudaMallocAsync` backend,
`install()` says once why it cannot record and does nothing else. Nothing here raises into the
training loop: failures are reported on stderr and swallowed.
"""

from __future__ import annotations

import threading
import weakref
from pathlib import Path
from typing import Any

from oomdoctor.capture.backend import active_backend
from oomdoctor.capture.options import disabled_by_environment, resolve_options
from oomdoctor.capture.processes import in_child_process, in_dataloader_worker
from oomdoctor.capture.writer import say

__all__ = ["install", "uninstall", "dump", "current_markers", "is_installed"]

_session: Any = None
_install_lock = threading.Lock()
_unavailable_reported = False
_backends_observed: weakref.WeakSet[Any] = weakref.WeakSet()


def _observer(device: int, alloc_bytes: int, device_total_bytes: int, device_free_bytes: int) -> None:
    """The one observer attached to each backend (torch keeps observers forever); it serves the
    session installed now, if any."""
    session = _session
    if session is not None and session.active:
        try:
            session.observer(device, alloc_bytes, device_total_bytes, device_free_bytes)
        except Exception:  # the observer must never replace torch's OutOfMemoryError
            pass


def _attach_observer(backend: Any) -> None:
    try:
        if backend in _backends_observed:
            return
    except TypeError:
        pass
    backend.attach_oom_observer(_observer)
    try:
        _backends_observed.add(backend)
    except TypeError:
        pass


def install(**options: Any) -> None:
    global _session, _unavailable_reported
    try:
        with _install_lock:
            if _session is not None:
                if options and resolve_options(options) != _session.options:
                    say("already installed; the options of this install() call are ignored")
                return
            if disabled_by_environment() or in_dataloader_worker():
                return
            backend = active_backend()
            reason = backend.unavailable_reason()
            if reason is not None:
                if not _unavailable_reported and not in_child_process():  # the parent said it
                    _unavailable_reported = True
                    say(f"not recording CUDA memory: {reason}")
                return
            from oomdoctor.capture.session import CaptureSession

            session = CaptureSession(resolve_options(options, warn=say), backend)
            try:
                session.start(_attach_observer)
            except BaseException:
                session.stop()
                raise
            _session = session
    except Exception as error:
        say(f"install() failed and changed nothing ({type(error).__name__}: {error})")


def uninstall() -> None:
    global _session
    try:
        with _install_lock:
            session, _session = _session, None
            if session is not None:
                session.stop()
    except Exception as error:
        say(f"uninstall() failed ({type(error).__name__}: {error})")


def is_installed() -> bool:
    """Whether capture is installed and on (a DataLoader worker turns the inherited one off)."""
    return _session is not None and _session.active


def dump(path: Any = None) -> Path | None:
    """Write a dump now; without install() it holds torch's snapshot but no markers or registry."""
    try:
        session = _session
        if session is None:
            backend = active_backend()
            reason = backend.unavailable_reason()
            if reason is not None:
                say(f"cannot dump: {reason}")
                return None
            from oomdoctor.capture.session import CaptureSession

            session = CaptureSession(resolve_options({}, warn=say), backend)
        return session.write_manual(None if path is None else Path(path))
    except Exception as error:
        say(f"dump() failed ({type(error).__name__}: {error})")
        return None


def current_markers() -> list[dict[str, Any]]:
    """Markers so far ({"phase", "edge", "step", "time_us"}), for tools that compute ground truth."""
    session = _session
    return session.recorder.marker_dicts() if session is not None else []
