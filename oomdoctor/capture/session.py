"""One installed capture: the OOM observer, the exception hooks, and the dumps they write.

The life of an OOM:

1. torch's allocator gives up and calls the observer, before the exception unwinds anything. The
   observer takes the snapshot at once (the state at the OOM) and writes a dump.
2. torch raises `OutOfMemoryError`. Creating the exception is the sign that the OOM *surfaced*: the
   class's `__init__` is wrapped to notice it (a cheap, exact signal; an OOM that cuDNN's workspace
   search catches and retries inside C++ never creates one).
3. Either nobody catches it, and `sys.excepthook` / `threading.excepthook` add type, message and
   traceback to the dump (one atomic rewrite); or the script catches it and carries on, and the next
   phase that starts (or interpreter exit) adds type and message.

An observer call whose OOM never surfaced was retried by torch internally: the next OOM on the same
thread overwrites that dump in place instead of adding a file, and every observer call is listed in
`ooms_observed` with `surfaced` true, false or null (not known yet). So internal retries never spam
dumps.

The dump budget. OOMs a script catches and retries (a batch-size finder's probes) come from one
place, again and again; the OOM that ends the process may come from the same place or another. So
files are kept per distinct *site* (the Python stack of the failing allocation): the first OOM at a
site gets a file, and the latest one another, which each later OOM at that site overwrites.
`max_dumps` caps the sites that get files; past it, OOMs at new sites share one more file, which
always holds the latest of them. So the OOM that ends the process always has its dump, and one
process writes at most 2 x max_dumps + 1 files. A dump whose exception the script caught records
`caught: true`.

Nothing here may raise into the training loop: every entry point reports a failure on stderr and
swallows it.
"""

from __future__ import annotations

import atexit
import json
import os
import pickle
import sys
import threading
import traceback
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from time import time_ns
from typing import Any

from oomdoctor.capture import environment, framework, writer
from oomdoctor.capture.markers import PhaseRecorder
from oomdoctor.capture.optimizers import optimizer_kinds
from oomdoctor.capture.options import CaptureOptions
from oomdoctor.capture.registry import collect_tensors
from oomdoctor.metadata import (
    HISTORY_REARMED,
    HISTORY_RESTORED,
    HISTORY_STOPPED,
    MAX_HISTORY_CALLS,
    METADATA_KEY,
    SCHEMA_VERSION,
)

LOCK_TIMEOUT_S = 120.0
MAX_OBSERVED = 1000
MAX_CHAIN = 16
MAX_SITE_FRAMES = 48  # innermost frames that tell one OOM site from another
MAX_SITES = 10_000  # distinct sites counted (a bound on memory, never reached in practice)
FILES_PER_SITE = 2  # the first OOM at a site and the latest
ELASTIC_ERROR_FILE_VARIABLE = "TORCHELASTIC_ERROR_FILE"  # torchrun's per-rank error file (@record)

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # .../oomdoctor/
_STDLIB_DIR = os.path.dirname(os.__file__)


@dataclass(eq=False)
class OomRecord:
    observed: dict[str, Any]  # one `ooms_observed` entry
    thread_id: int
    path: Path | None = None
    payload: dict[str, Any] | None = None  # kept until the exception is added, then released
    exception: dict[str, Any] | None = None
    exception_ref: Any = None  # weakref to the exception object, or None
    rewrite_pending: bool = False
    observed_at_dump: list[dict[str, Any]] = field(default_factory=list)
    fresh: bool = True  # no phase has started since the observer call
    site: Any = None  # the key of the Python stack the OOM came from


def _is_library(filename: str) -> bool:
    """An installed package's file (torch, a framework, a model library), the standard library's, or
    one with no file: what is the same whichever layer of a model ran out."""
    return (
        filename.startswith("<frozen")
        or f"{os.sep}site-packages{os.sep}" in filename
        or f"{os.sep}dist-packages{os.sep}" in filename
        or filename.startswith(_STDLIB_DIR)
    )


def oom_site(skip_package: str = _PACKAGE_DIR) -> tuple[tuple[Any, ...], str | None]:
    """The site of an OOM being observed: (key, "file:line in function" of its innermost frame).

    The key is the stack of the script's own frames (outside oomdoctor, installed packages and the
    standard library), so that probes of one batch-size finder share a site whichever layer of the
    model ran out; without such frames, the library frames outside torch. Called from the observer,
    on the thread that allocated; a backward's OOM is observed on an autograd thread, which has no
    Python frames: the main thread's stack (blocked in `loss.backward()`, as a rule) stands in.
    """
    try:
        frame: Any = sys._getframe(1)
    except ValueError:
        frame = None
    frames = []
    while frame is not None and len(frames) < 4 * MAX_SITE_FRAMES:
        if not frame.f_code.co_filename.startswith(skip_package):
            frames.append(frame)
        frame = frame.f_back
    if not frames and threading.current_thread() is not threading.main_thread():
        frame = sys._current_frames().get(threading.main_thread().ident or -1)
        while frame is not None and len(frames) < 4 * MAX_SITE_FRAMES:
            if not frame.f_code.co_filename.startswith(skip_package):
                frames.append(frame)
            frame = frame.f_back
    own = [frame for frame in frames if not _is_library(frame.f_code.co_filename)]
    if not own:
        own = [frame for frame in frames if f"{os.sep}torch{os.sep}" not in frame.f_code.co_filename]
    own = own[:MAX_SITE_FRAMES]
    key = tuple((frame.f_code.co_filename, frame.f_lineno) for frame in own)
    where = f"{own[0].f_code.co_filename}:{own[0].f_lineno} in {own[0].f_code.co_name}" if own else None
    return key, where


def _exception_name(error: BaseException) -> str:
    kind = type(error)
    module = kind.__module__
    return kind.__qualname__ if module in ("builtins", "__main__") else f"{module}.{kind.__qualname__}"


def _chain(error: BaseException | None) -> list[BaseException]:
    found: list[BaseException] = []
    while error is not None and len(found) < MAX_CHAIN and error not in found:
        found.append(error)
        error = error.__cause__ or error.__context__
    return found


# torch's `_record_memory_history(enabled, context, stacks, max_entries, ...)`, positionally; torch
# 2.0's legacy form is (enabled: bool, trace_alloc_max_entries=..., trace_alloc_record_context=...)
_HISTORY_PARAMETERS = ("enabled", "context", "stacks", "max_entries")
_HISTORY_DEFAULTS = {"enabled": "all", "context": "all", "stacks": "all", "max_entries": None}


def _word(value: Any) -> str | None:
    """A setting as a dump holds it: a str as it is (cut), anything else but None as its type's name."""
    if value is None or isinstance(value, str):
        return value[:64] if isinstance(value, str) else None
    return type(value).__name__


def history_call_settings(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """{"enabled", "context", "stacks", "max_entries"} of a call to `_record_memory_history`, with
    torch's defaults for what it left out; enabled None when the call stopped recording."""
    given = dict(zip(_HISTORY_PARAMETERS, args))
    given.update({key: value for key, value in kwargs.items() if key in _HISTORY_PARAMETERS})
    if "max_entries" not in given and "trace_alloc_max_entries" in kwargs:  # torch 2.0
        given["max_entries"] = kwargs["trace_alloc_max_entries"]
    settings = {**_HISTORY_DEFAULTS, **given}
    enabled = settings["enabled"]
    if enabled is None or enabled is False:
        enabled = None
    elif enabled is True:
        enabled = "all"
    entries = settings["max_entries"]
    return {
        "enabled": _word(enabled),
        "context": _word(settings["context"]),
        "stacks": _word(settings["stacks"]),
        "max_entries": entries if type(entries) is int and 0 < entries < 2**63 - 1 else None,
    }


def _caller() -> str | None:
    """ "file:line in function" of the innermost frame outside oomdoctor (who called the wrapper)."""
    try:
        frame: Any = sys._getframe(2)
    except ValueError:
        return None
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        frame = frame.f_back
    if frame is None:
        return None
    return f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}"


class CaptureSession:
    def __init__(self, options: CaptureOptions, backend: Any) -> None:
        self.options = options
        self.backend = backend
        self.recorder = PhaseRecorder(max_markers=max(options.max_entries, 10_000))
        self.process = environment.process_facts()
        self.observed: deque[dict[str, Any]] = deque(maxlen=MAX_OBSERVED)
        self.records: list[OomRecord] = []
        self.unconfirmed: dict[int, OomRecord] = {}  # observer thread -> its latest unsurfaced OOM
        self.dumps_written = 0
        self.cap_reported = False
        self.site_counts: dict[Any, int] = {}  # site -> OOMs observed there
        self.site_files: dict[Any, list[OomRecord]] = {}  # site -> records holding its files (first, latest)
        self.overflow: OomRecord | None = None  # the record holding the file shared past max_dumps
        self.history_started_by: str | None = None
        # calls to torch's _record_memory_history by others since install() (recording.rearmed), and
        # the settings recording runs with now
        self.history_calls: deque[dict[str, Any]] = deque(maxlen=MAX_HISTORY_CALLS)
        self.history_settings: dict[str, Any] = {
            "max_entries": options.max_entries,
            "stacks": options.stacks,
            "context": options.context,
        }
        self.history_said = False
        self.history_stop_pending = False  # recording restored after the script's own: stop it at uninstall
        self.active = False
        self.lock = threading.RLock()
        self.local = threading.local()
        self.oom_types: tuple[type, ...] = ()
        self.notebook_undo: Callable[[], None] | None = None
        self._undo: list[Callable[[], None]] = []

    # -- install / uninstall --------------------------------------------------------------------

    def start(self, attach_observer: Callable[[Any], None]) -> None:
        """Hooks now; history and the OOM observer once CUDA is initialized (backend.when_ready)."""
        self.active = True
        self.recorder.on_exception = self._guarded(self.exception_seen)
        self.recorder.install()
        self._undo.append(self.recorder.uninstall)
        self._wrap_oom_exception_init()
        self._install_excepthooks()
        self.attach_notebook()
        self._watch_child_processes()
        atexit.register(self.at_exit)
        self._undo.append(lambda: atexit.unregister(self.at_exit))

        def start_recording() -> None:
            if self.active:
                try:
                    attach_observer(self.backend)
                    self._start_history()
                except Exception as error:
                    writer.say(f"could not start recording ({type(error).__name__}: {error})")

        when_ready = getattr(self.backend, "when_ready", None)
        if callable(when_ready):
            when_ready(start_recording)
        else:
            start_recording()

    def _start_history(self) -> None:
        already = getattr(self.backend, "history_enabled", None)
        if callable(already) and already():
            self.history_started_by = "user"
        else:
            options = self.options
            self._own_history_call(
                lambda: self.backend.record_history(
                    max_entries=options.max_entries, stacks=options.stacks, context=options.context
                )
            )
            self.history_started_by = "oomdoctor"
            self._undo.append(lambda: self._own_history_call(self.backend.stop_history))
        self._watch_history_calls()

    # -- someone else re-arming torch's history (torchtitan's MemoryProfiler) ------------------------

    def _own_history_call(self, call: Callable[[], Any]) -> Any:
        """Run one of capture's own calls to torch's history recording, unseen by the watch."""
        self.local.own_history_call = True
        try:
            return call()
        finally:
            self.local.own_history_call = False

    def _watch_history_calls(self) -> None:
        """Wrap `torch.cuda.memory._record_memory_history` while installed, so that a later call by
        someone else (torchtitan's MemoryProfiler calls it with max_entries=100000 and torch's default
        stacks="all") is recorded in the dumps, and a call that stops recording is answered by
        starting it again with capture's settings. A reference taken before install()
        (`from torch.cuda.memory import _record_memory_history`) goes around the wrapper."""
        try:
            import torch.cuda.memory as cuda_memory
        except Exception:
            return
        original = getattr(cuda_memory, "_record_memory_history", None)
        if not callable(original):
            return
        session = self

        def _record_memory_history(*args: Any, **kwargs: Any) -> Any:
            if not session.active or getattr(session.local, "own_history_call", False):
                return original(*args, **kwargs)
            result = original(*args, **kwargs)  # the caller's call does what it asked, errors and all
            session._guarded(session.history_called)(args, kwargs, _caller())
            return result

        _record_memory_history.__wrapped__ = original  # type: ignore[attr-defined]
        _record_memory_history.__doc__ = getattr(original, "__doc__", None)
        cuda_memory._record_memory_history = _record_memory_history

        def restore() -> None:
            if getattr(cuda_memory, "_record_memory_history", None) is _record_memory_history:
                cuda_memory._record_memory_history = original

        self._undo.append(restore)

    def history_called(self, args: tuple[Any, ...], kwargs: dict[str, Any], caller: str | None) -> None:
        """Someone else called torch's `_record_memory_history`: note it, and restart recording with
        capture's settings when the call stopped it."""
        settings = history_call_settings(args, kwargs)
        stopped = settings["enabled"] is None
        with self._locked() as held:
            if not held:
                return
            self.history_calls.append(
                {
                    "action": HISTORY_STOPPED if stopped else HISTORY_REARMED,
                    "time_us": time_ns() // 1000,
                    "caller": caller,
                    **settings,
                }  # fmt: skip
            )
            if not stopped:
                self.history_settings = {key: settings[key] for key in ("max_entries", "stacks", "context")}
                self._say_history_once(caller, settings)
                return
            options = self.options
            try:
                self._own_history_call(
                    lambda: self.backend.record_history(
                        max_entries=options.max_entries, stacks=options.stacks, context=options.context
                    )
                )
            except Exception as error:
                writer.say(
                    f"{caller or 'something'} stopped torch's memory history and it could not be started again "
                    f"({type(error).__name__}: {error}); dumps hold no history from then on"
                )
                return
            self.history_settings = {
                "max_entries": options.max_entries,
                "stacks": options.stacks,
                "context": options.context,
            }
            self.history_calls.append(
                {
                    "action": HISTORY_RESTORED,
                    "time_us": time_ns() // 1000,
                    "caller": "oomdoctor",
                    "enabled": "all",
                    **self.history_settings,
                }  # fmt: skip
            )
            if self.history_started_by == "user" and not self.history_stop_pending:
                self.history_stop_pending = True
                self._undo.append(lambda: self._own_history_call(self.backend.stop_history))
            writer.say(
                f"{caller or 'something'} stopped torch's memory history while oomdoctor is installed; recording "
                "it again with oomdoctor's settings (the history before is lost; oomdoctor.uninstall() stops it)"
            )

    def _say_history_once(self, caller: str | None, settings: dict[str, Any]) -> None:
        if self.history_said:
            return
        self.history_said = True
        shown = ", ".join(f"{key} {settings[key]}" for key in ("max_entries", "stacks", "context"))
        slow = (
            "; with stacks all, writing a dump symbolizes C++ frames and can take minutes"
            if settings["stacks"] == "all"
            else ""
        )
        writer.say(
            f"{caller or 'something'} re-armed torch's memory history after oomdoctor.install() ({shown}); "
            f"oomdoctor's dumps record that and use these settings from now on{slow}"
        )

    def stop(self) -> None:
        self.active = False
        with self._locked() as held:
            if held:
                self._flush_pending()
        while self._undo:
            undo = self._undo.pop()
            try:
                undo()
            except Exception as error:
                writer.say(f"uninstall could not undo a change cleanly: {error!r}")

    def _wrap_oom_exception_init(self) -> None:
        import torch

        kinds = []
        for holder, name in ((torch.cuda, "OutOfMemoryError"), (torch, "OutOfMemoryError")):
            kind = getattr(holder, name, None)
            if isinstance(kind, type) and kind not in kinds:
                kinds.append(kind)
        self.oom_types = tuple(kinds)
        session = self
        for kind in kinds:
            had_own = "__init__" in kind.__dict__
            own_init = kind.__dict__.get("__init__")
            previous_init = kind.__init__

            def __init__(error: Any, *args: Any, _previous: Any = previous_init, **kwargs: Any) -> None:
                _previous(error, *args, **kwargs)
                if session.active:
                    session._guarded(session.exception_created)(error)

            kind.__init__ = __init__  # type: ignore[misc]

            def restore(
                kind: Any = kind, wrapper: Any = __init__, had_own: bool = had_own, own: Any = own_init
            ) -> None:
                if kind.__dict__.get("__init__") is not wrapper:
                    return
                if had_own:
                    kind.__init__ = own
                else:
                    del kind.__init__

            self._undo.append(restore)

    def _install_excepthooks(self) -> None:
        session = self
        previous_sys_hook = sys.excepthook

        def oomdoctor_excepthook(kind: Any, value: Any, trace: Any) -> None:
            record = session._guarded(session.uncaught)(value) if session.active else None
            previous_sys_hook(kind, value, trace)
            if record is not None:
                session._say_dump_of_exception(record)

        sys.excepthook = oomdoctor_excepthook

        previous_thread_hook = threading.excepthook

        def oomdoctor_thread_excepthook(args: Any) -> None:
            record = session._guarded(session.uncaught)(args.exc_value) if session.active else None
            previous_thread_hook(args)
            if record is not None:
                session._say_dump_of_exception(record)

        threading.excepthook = oomdoctor_thread_excepthook

        def restore() -> None:
            if sys.excepthook is oomdoctor_excepthook:
                sys.excepthook = previous_sys_hook
            if threading.excepthook is oomdoctor_thread_excepthook:
                threading.excepthook = previous_thread_hook

        self._undo.append(restore)

    def _watch_child_processes(self) -> None:
        """Spawned children keep their traceback; DataLoader workers turn capture off (processes.py)."""
        from oomdoctor.capture import processes

        for patch in (
            processes.patch_spawn_wrap,
            lambda: processes.patch_worker_loop(self.enter_worker),
            lambda: processes.at_child_exit(self.at_exit),
        ):
            try:
                undo = patch()
            except Exception as error:
                writer.say(f"could not watch child processes ({type(error).__name__}: {error})")
                continue
            if undo is not None:
                self._undo.append(undo)

    def enter_worker(self) -> None:
        """This process became a DataLoader worker: it writes no dump and says nothing."""
        self.active = False
        self.recorder.on_phase_start = None

    def attach_notebook(self, shell: Any = None) -> None:
        """Under IPython, which never calls sys.excepthook: its custom exception handler (notebook.py)."""
        from oomdoctor.capture import notebook

        try:
            undo = notebook.attach(self, shell)
        except Exception as error:
            writer.say(f"could not hook IPython's exception handler ({type(error).__name__}: {error})")
            return
        if undo is not None:
            self.notebook_undo = undo
            self._undo.append(undo)

    # -- guards ---------------------------------------------------------------------------------

    def _guarded(self, function: Callable[..., Any]) -> Callable[..., Any]:
        """Run `function` at most once per thread at a time, reporting and swallowing any failure."""

        def guarded(*args: Any) -> Any:
            if getattr(self.local, "busy", False):
                return None
            self.local.busy = True
            try:
                return function(*args)
            except Exception as error:
                writer.say(f"capture failed and was skipped ({type(error).__name__}: {error})")
                return None
            finally:
                self.local.busy = False

        return guarded

    class _Held:
        def __init__(self, lock: Any) -> None:
            self.lock = lock
            self.held = False

        def __enter__(self) -> bool:
            self.held = self.lock.acquire(timeout=LOCK_TIMEOUT_S)
            return self.held

        def __exit__(self, *exc: Any) -> None:
            if self.held:
                self.lock.release()

    def _locked(self) -> CaptureSession._Held:
        return CaptureSession._Held(self.lock)

    # -- the OOM observer -----------------------------------------------------------------------

    def observer(self, device: int, alloc_bytes: int, device_total_bytes: int, device_free_bytes: int) -> None:
        if self.active:
            self._guarded(self.observe)(device, alloc_bytes, device_total_bytes, device_free_bytes)

    def observe(self, device: int, alloc_bytes: int, device_total_bytes: int, device_free_bytes: int) -> None:
        observed = {
            "device": int(device),
            "alloc_bytes": int(alloc_bytes),
            "device_total_bytes": int(device_total_bytes),
            "device_free_bytes": int(device_free_bytes),
            "time_us": time_ns() // 1000,
            "surfaced": None,
        }
        site, where = oom_site()
        if site in self.site_counts or len(self.site_counts) < MAX_SITES:
            self.site_counts[site] = self.site_counts.get(site, 0) + 1
        observed["site"] = where
        observed["occurrence"] = self.site_counts.get(site, 1)  # the how-manieth OOM at its site
        self.observed.append(observed)
        thread_id = threading.get_ident()
        record = OomRecord(observed=observed, thread_id=thread_id, site=site)
        with self._locked() as held:
            if not held:
                writer.say("another dump is still being written; this OOM is recorded without its own dump")
                return
            self._flush_pending()
            previous = self.unconfirmed.pop(thread_id, None)
            replaced = False
            if previous is not None and previous.path is not None:
                # its exception never came: torch caught that OOM and retried; reuse its file
                previous.observed["surfaced"] = False
                previous.payload = None
                self._take_file(previous, record)
            else:
                self._choose_file(record)
                replaced = record.path is not None
            self.unconfirmed[thread_id] = record
            self.records.append(record)
            payload = self.build_payload(reason="oom", oom=observed, device=int(device))
            record.observed_at_dump = list(self.observed)
            if record.path is not None:
                size_bytes = writer.write_atomically(payload, record.path)
                if replaced:
                    writer.say(
                        f"rewrote {writer.display_path(record.path)} with the latest OOM at the same place "
                        f"({observed['occurrence']} there so far; the first has its own file)"
                        if record.site in self.site_files
                        else f"rewrote {writer.display_path(record.path)} with this OOM"
                    )
            else:
                name = self._file_name("oom")
                record.path, size_bytes = writer.write_new_dump(
                    payload, self.options.dump_dir, name, writer.say, self._run_folder()
                )
                self.dumps_written += 1
                writer.say(writer.dump_note(record.path, size_bytes))
            record.payload = payload
            self.recorder.on_phase_start = self._guarded(self.phase_started)

    def _take_file(self, holder: OomRecord, record: OomRecord) -> None:
        """`record` overwrites the file `holder` wrote, and takes its place in the budget."""
        record.path, holder.path = holder.path, None
        holder.payload = None
        holder.rewrite_pending = False
        for files in self.site_files.values():
            for index, candidate in enumerate(files):
                if candidate is holder:
                    files[index] = record
        if self.overflow is holder:
            self.overflow = record

    def _choose_file(self, record: OomRecord) -> None:
        """The dump budget: a new file for the first and the second OOM at a site, the site's latest
        file for later ones; past max_dumps sites, the one file shared by OOMs at new sites."""
        files = self.site_files.get(record.site)
        if files is not None:
            if len(files) >= FILES_PER_SITE:
                self._take_file(files[-1], record)
            else:
                files.append(record)
            return
        if len(self.site_files) < self.options.max_dumps:
            self.site_files[record.site] = [record]
            return
        if not self.cap_reported:
            self.cap_reported = True
            writer.say(
                f"OOMs at {len(self.site_files)} places have dumps, the most this process keeps apart "
                "(max_dumps / OOMDOCTOR_MAX_DUMPS); OOMs at other places share one more file, which "
                "always holds the latest of them"
            )
        if self.overflow is not None and self.overflow.path is not None:
            self._take_file(self.overflow, record)
        self.overflow = record

    # -- exceptions -----------------------------------------------------------------------------

    def _record_for_new_exception(self) -> OomRecord | None:
        """The OOM a new exception belongs to: this thread's, else (backward OOMs are observed on an
        autograd thread and raised on the caller's) the latest; only OOMs since the last phase start."""
        fresh = {thread_id: record for thread_id, record in self.unconfirmed.items() if record.fresh}
        if not fresh:
            return None
        thread_id = threading.get_ident()
        if thread_id not in fresh:
            thread_id = max(fresh.values(), key=lambda candidate: candidate.observed["time_us"]).thread_id
        return self.unconfirmed.pop(thread_id)

    def exception_created(self, error: BaseException) -> None:
        """An OutOfMemoryError was just created: the latest unsurfaced OOM has surfaced."""
        with self._locked() as held:
            if not held:
                return
            record = self._record_for_new_exception()
            if record is None:
                self._oom_without_observer(error)
                return
            self._link(record, error)

    def exception_seen(self, error: BaseException) -> None:
        """An exception left a forward or backward: if it is an OOM nobody linked yet, link it."""
        if not self.unconfirmed or not self._is_oom(error) or self._find_record(error) is not None:
            return
        with self._locked() as held:
            if held:
                record = self._record_for_new_exception()
                if record is not None:
                    self._link(record, error)

    def _link(self, record: OomRecord, error: BaseException) -> None:
        record.observed["surfaced"] = True
        record.exception = {"type": _exception_name(error), "message": str(error), "traceback": None}
        try:
            record.exception_ref = weakref.ref(error)
        except TypeError:
            record.exception_ref = None
        if record.path is not None:
            record.rewrite_pending = True
            self.recorder.on_phase_start = self._guarded(self.phase_started)

    def _oom_without_observer(self, error: BaseException) -> None:
        """torch 2.12+ rejects some requests before the allocator's OOM path, with no observer call."""
        handled = sys.exc_info()[1]
        message = str(error)
        if (
            not message.startswith("CUDA out of memory")
            or "preemptively rejected" not in message
            or (handled is not None and self._is_oom(handled))
        ):
            # any other OutOfMemoryError without an observer call is made after the fact: by the
            # script, by torch's ExceptionWrapper (DataParallel replicas, DataLoader workers), or
            # unpickled from another process
            return
        if self.dumps_written >= self.options.max_dumps:
            return
        record = OomRecord(observed={}, thread_id=threading.get_ident())
        device = environment.attempt(self.backend.current_device, 0) or 0
        payload = self.build_payload(reason="oom", oom=None, device=device)
        record.path, size_bytes = writer.write_new_dump(
            payload, self.options.dump_dir, self._file_name("oom"), writer.say, self._run_folder()
        )
        self.dumps_written += 1
        self.records.append(record)
        record.payload = payload
        self._link(record, error)
        writer.say(writer.dump_note(record.path, size_bytes))

    def _is_oom(self, error: BaseException) -> bool:
        return isinstance(error, self.oom_types) or (
            isinstance(error, RuntimeError) and "out of memory" in str(error).lower()
        )

    def _find_record(self, error: BaseException) -> OomRecord | None:
        for link in _chain(error):
            for record in reversed(self.records):
                if record.exception_ref is not None and record.exception_ref() is link:
                    return record
        return None

    def uncaught(self, error: BaseException) -> OomRecord | None:
        """An exception reached sys.excepthook or threading.excepthook: complete its OOM's dump."""
        with self._locked() as held:
            if not held:
                return None
            record = self._find_record(error)
            oom = next((link for link in _chain(error) if self._is_oom(link)), None)
            if record is None and oom is not None:
                # its creation went unnoticed: it belongs to the latest OOM still waiting for one
                record = next(
                    (
                        candidate
                        for candidate in reversed(self.records)
                        if candidate.path is not None
                        and (candidate.exception is None or candidate.exception.get("traceback") is None)
                    ),
                    None,
                )
                if record is not None:
                    for thread_id, candidate in list(self.unconfirmed.items()):
                        if candidate is record:
                            del self.unconfirmed[thread_id]
                    self._link(record, oom)
            if record is None or record.path is None:
                return None
            described = oom if oom is not None else error
            record.observed["surfaced"] = True
            record.exception = {
                "type": _exception_name(described),
                "message": str(described),
                "traceback": "".join(traceback.format_exception(type(error), error, error.__traceback__)),
                "caught": False,
            }
            self._rewrite(record)
            self._note_in_elastic_error_file(record)
            return record

    def _note_in_elastic_error_file(self, record: OomRecord) -> None:
        """Under torchrun with @record, the error file torchelastic wrote names the dump, so that the
        launcher's "Root Cause" summary (which shows its py_callstack) says where it is."""
        error_file = os.environ.get(ELASTIC_ERROR_FILE_VARIABLE)
        if not error_file or record.path is None or not os.path.isfile(error_file):
            return
        try:
            with open(error_file, encoding="utf-8") as file:
                data = json.load(file)
            extra = data["message"]["extraInfo"]
            if not isinstance(extra, dict):
                return
        except (OSError, ValueError, KeyError, TypeError):
            return  # not the structure torchelastic writes: left alone
        shown = str(record.path)
        extra["oomdoctor_dump"] = shown
        stack = extra.get("py_callstack")
        if isinstance(stack, str) and shown not in stack:
            extra["py_callstack"] = (
                stack.rstrip("\n") + f"\noomdoctor: the dump of this OOM is {shown} — explain it with: "
                f"oomdoctor report {shown}\n"
            )
        temporary = f"{error_file}.{os.getpid()}.oomdoctor.tmp"
        try:
            with open(temporary, "w", encoding="utf-8") as file:
                json.dump(data, file)
            os.replace(temporary, error_file)
        except OSError:
            return

    def _say_dump_of_exception(self, record: OomRecord) -> None:
        if record.path is not None:
            shown = writer.display_path(record.path)
            writer.say(
                f"the dump of this OOM is {shown} — explain it with: oomdoctor report {shown}"
                f"  (or browse it with: oomdoctor open {shown})"
            )

    # -- completing dumps -----------------------------------------------------------------------

    def phase_started(self) -> None:
        """The training loop went on after an OOM. If its exception was created, the script caught
        it: record that now. If not, torch retried it internally: stop holding its snapshot."""
        self.recorder.on_phase_start = None
        with self._locked() as held:
            if held:
                self._flush_pending()
                for record in self.unconfirmed.values():
                    if record.fresh:
                        record.fresh = False
                        record.payload = None
                        record.observed["surfaced"] = False

    def _flush_pending(self) -> None:
        """Write what is known of exceptions that went on without reaching an excepthook: the
        script (or a framework) caught them."""
        for record in self.records:
            if record.rewrite_pending:
                if record.exception is not None and record.exception.get("traceback") is None:
                    record.exception["caught"] = True
                self._rewrite(record)

    def _rewrite(self, record: OomRecord) -> None:
        record.rewrite_pending = False
        if record.path is None:
            return
        payload = record.payload
        if payload is None:
            with open(record.path, "rb") as file:  # our own file, written by this process
                payload = pickle.load(file)
        metadata = payload[METADATA_KEY]
        metadata["exception"] = record.exception
        if metadata.get("oom") is not None:
            metadata["oom"]["surfaced"] = record.observed.get("surfaced")
        if record.observed_at_dump:
            metadata["ooms_observed"] = [dict(entry) for entry in record.observed_at_dump]
        writer.write_atomically(payload, record.path)
        record.payload = None

    def at_exit(self) -> None:
        if not self.active:
            return
        with self._locked() as held:
            if not held:
                return
            try:
                # an uncaught exception whose excepthook was replaced without chaining to ours
                last = getattr(sys, "last_value", None)
                if last is not None:
                    record = self._find_record(last)
                    has_traceback = record is not None and (record.exception or {}).get("traceback")
                    if (record is None and self._is_oom(last)) or (record is not None and not has_traceback):
                        self.local.busy = True
                        self.uncaught(last)
                self._flush_pending()
                for record in self.unconfirmed.values():
                    if record.path is not None:
                        writer.say(
                            f"{writer.display_path(record.path)} holds an OOM that torch handled internally "
                            "(no exception reached the script, e.g. cuDNN's workspace search)"
                        )
            except Exception as error:
                writer.say(f"capture failed at exit ({type(error).__name__}: {error})")
            finally:
                self.local.busy = False

    # -- dumps ----------------------------------------------------------------------------------

    def _file_name(self, kind: str) -> str:
        return writer.dump_file_name(kind, self.process["rank"], self.process["host"], self.process["pid"])

    def _run_folder(self) -> str | None:
        """`run-{TORCHELASTIC_RUN_ID}` under torchrun: the ranks of one launch share a folder."""
        elastic = self.process.get("elastic") or {}
        return writer.run_folder_name(elastic.get("run_id"))

    def build_payload(self, *, reason: str, oom: dict[str, Any] | None, device: int) -> dict[str, Any]:
        snapshot = self.backend.snapshot()  # first: the state at the OOM
        return {**snapshot, METADATA_KEY: self.build_metadata(reason=reason, oom=oom, device=device, snapshot=snapshot)}

    def build_metadata(
        self, *, reason: str, oom: dict[str, Any] | None, device: int, snapshot: dict[str, Any]
    ) -> dict[str, Any]:
        existing = snapshot.get(METADATA_KEY)
        metadata: dict[str, Any] = dict(existing) if isinstance(existing, dict) else {}
        optimizers = environment.attempt(lambda: list(self.recorder.optimizers), None)  # held once: each
        # field below reads the same optimizers, though one may be collected while the dump is written
        metadata.update(
            {
                "schema_version": SCHEMA_VERSION,
                "versions": environment.versions(self.backend),
                "host": self.process["host"],
                "pid": self.process["pid"],
                "argv": self.process["argv"],
                "rank": self.process["rank"],
                "local_rank": self.process["local_rank"],
                "world_size": self.process["world_size"],
                "elastic": self.process["elastic"],
                **environment.device_facts(self.backend, device),
                "alloc_conf": self.process["alloc_conf"],
                "environment": environment.attempt(environment.environment_variables, {}),
                "packages": environment.attempt(environment.imported_packages, {}),
                "framework": framework.facts(),
                "oom": dict(oom) if oom is not None else None,
                "ooms_observed": [dict(entry) for entry in self.observed],
                "exception": None,
                "markers": self.recorder.marker_dicts(),
                "optimizers": len(optimizers) if optimizers is not None else None,
                "optimizer_kinds": environment.attempt(lambda: optimizer_kinds(optimizers or ()), []),
                "tensors": environment.attempt(
                    lambda: collect_tensors(
                        list(self.recorder.root_modules),
                        optimizers or (),
                        self.backend.storage_address,
                        device,
                        self.recorder.input_records(),
                    ),
                    [],
                ),
                "reason": reason,
                "recording": {
                    **self._recording_settings(),
                    "started_by": self.history_started_by,
                    "rearmed": [dict(call) for call in self.history_calls],
                },
            }
        )
        rehearsal = getattr(self.backend, "rehearsal", None)
        if isinstance(rehearsal, dict) and rehearsal:
            metadata["rehearsal"] = dict(rehearsal)
        return metadata

    def _recording_settings(self) -> dict[str, Any]:
        """The settings recording ran with at the dump: capture's, or the latest other caller's."""
        return dict(self.history_settings)

    def write_manual(self, path: Path | None) -> Path | None:
        """`oomdoctor.dump()`: the state now, with the markers and registry so far."""
        with self._locked() as held:
            if not held:
                writer.say("another dump is still being written; dump() skipped")
                return None
            self.local.busy = True
            try:
                device = environment.attempt(self.backend.current_device, 0) or 0
                payload = self.build_payload(reason="manual", oom=None, device=device)
                if path is not None:
                    path = Path(path)
                    size_bytes = writer.write_atomically(payload, path)
                else:
                    path, size_bytes = writer.write_new_dump(
                        payload, self.options.dump_dir, self._file_name("manual"), writer.say, self._run_folder()
                    )
                writer.say(writer.dump_note(path, size_bytes))
                return path
            finally:
                self.local.busy = False
