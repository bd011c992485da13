"""Rehearsal sessions: run real PyTorch code on CPU against a simulated CUDA caching allocator.

    with RehearsalSession(RehearsalConfig(device_memory_bytes=24 * 2**30)) as session:
        train()                      # may raise torch.OutOfMemoryError, as on a 24 GiB card
        session.live_allocations()   # what the simulated device holds now

While a session runs, every CPU tensor storage created on the starting thread is a simulated device
allocation, capture's backend seam answers from the simulator, torch.cuda's memory functions do too,
and OOMDOCTOR_REHEARSAL=1 is set. `rehearse_script()` runs a script file inside a session the way
`python script.py ARGS` would and says whether and where it ran out; `rehearsal()` does the same
for the code in a `with` block (the pytest plugin's marked test bodies).
"""

from __future__ import annotations

import contextlib
import os
import pickle
import platform
import runpy
import socket
import sys
import threading
import time
import traceback
import types
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from oomdoctor import __version__
from oomdoctor.metadata import METADATA_KEY, SCHEMA_VERSION

REHEARSAL_ENV = "OOMDOCTOR_REHEARSAL"
DUMP_DIR_ENV = "OOMDOCTOR_DIR"  # capture's dump folder variable
DUMP_SUFFIXES = (".pickle", ".pkl")

FAKE_FAILURE_EXIT = 3  # rehearse --fake: the script did something that needs data

_current: RehearsalSession | None = None


def current_session() -> RehearsalSession | None:
    """The running rehearsal session, or None outside one."""
    return _current


@dataclass(frozen=True)
class RehearsalConfig:
    """The simulated device: its memory, allocator settings and memory held outside PyTorch."""

    device_memory_bytes: int
    alloc_conf: str = ""
    outside_bytes: int = 0  # held by other processes
    cuda_context_bytes: int = 0  # this process's CUDA context, also outside PyTorch
    device: int = 0
    # tensors carry no data (torch's FakeTensorMode; oomdoctor.rehearse.fake)
    fake: bool = False
    # one rank of a distributed run (oomdoctor.rehearse.distributed): None runs the script alone
    world_size: int | None = None
    rank: int = 0
    # the simulator's time_us source (epoch microseconds); a fixed clock makes dumps reproducible
    clock_us: Callable[[], int] | None = field(default=None, compare=False, repr=False)

    def metadata(self) -> dict[str, Any]:
        """The dump's `rehearsal` metadata entry."""
        return {
            "device_memory_bytes": self.device_memory_bytes,
            "outside_bytes": self.outside_bytes + self.cuda_context_bytes,
            "alloc_conf": self.alloc_conf,
        }


class RehearsalSession:
    """Simulator, storage recorder and backend seam, installed between start() and stop()."""

    def __init__(self, config: RehearsalConfig) -> None:
        self.config = config
        self.simulator: Any = None
        self.recorder: Any = None
        self.backend: Any = None
        self.fake: Any = None  # the FakeRehearsal under config.fake
        self.world: Any = None  # the SimulatedWorld under config.world_size
        self._undo: list[Callable[[], None]] = []

    def start(self) -> RehearsalSession:
        global _current
        if _current is not None:
            raise RuntimeError("a rehearsal session is already running")
        from oomdoctor.capture.backend import set_backend
        from oomdoctor.rehearse.allocator import CachingAllocatorSimulator
        from oomdoctor.rehearse.backend import SimulatedBackend, patch_optimizer_defaults
        from oomdoctor.rehearse.recorder import StorageRecorder

        config = self.config
        self.simulator = CachingAllocatorSimulator(
            config.device_memory_bytes,
            alloc_conf=config.alloc_conf,
            context_bytes=config.cuda_context_bytes,
            other_process_bytes=config.outside_bytes,
            device=config.device,
            clock_us=config.clock_us,
        )
        self.recorder = StorageRecorder(self.simulator)
        self.backend = SimulatedBackend(self.simulator, self.recorder, rehearsal=config.metadata())
        try:
            self._set_env(REHEARSAL_ENV, "1")
            self._set_env("PYTORCH_CUDA_ALLOC_CONF", config.alloc_conf or None)
            self._set_env("PYTORCH_ALLOC_CONF", None)
            if config.world_size is not None:
                from oomdoctor.rehearse.distributed import torchrun_environment

                for name, value in torchrun_environment(config.world_size, config.rank).items():
                    self._set_env(name, value)
            set_backend(self.backend)
            self._undo.append(lambda: set_backend(None))
            self._undo.append(self.backend.patch_torch_cuda())
            self._undo.append(patch_optimizer_defaults())
            if config.fake:
                from oomdoctor.rehearse.fake import FakeRehearsal

                self.fake = FakeRehearsal()
                self._undo.append(self.fake.stop)
                self.fake.enter_fake_mode()
            self.recorder.start()
            self._undo.append(self.recorder.stop)
            if self.fake is not None:
                self.fake.enter_top_mode()
            if config.world_size is not None:
                from oomdoctor.rehearse.distributed import SimulatedWorld

                self.world = SimulatedWorld(config.world_size, config.rank, self.recorder, fake=config.fake)
                self._undo.append(self.world.stop)
                self.world.start()
        except BaseException:
            self.stop()
            raise
        _current = self
        return self

    def stop(self) -> None:
        global _current
        if _current is self:
            _current = None
        while self._undo:
            self._undo.pop()()

    def __enter__(self) -> RehearsalSession:
        return self.start()

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()

    def live_allocations(self) -> list[Any]:
        """Every simulated allocation alive now: address, block_bytes, requested_bytes, storage (weakref)."""
        return self.recorder.live_allocations()

    @property
    def ooms(self) -> list[Any]:
        """Every time the simulator ran out, as OomRecords, including OOMs the script caught."""
        return list(self.recorder.ooms)

    def _set_env(self, name: str, value: str | None) -> None:
        previous = os.environ.get(name)
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value

        def restore() -> None:
            if previous is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = previous

        self._undo.append(restore)


@dataclass
class RehearsalResult:
    """How a rehearsed script ended."""

    exit_code: int  # 0 it fit (or ended normally), 1 it ran out or failed, else its own exit code
    oom: Any = None  # the OomRecord of the OOM that ended the script, if one did
    ooms_seen: list[Any] = field(default_factory=list)  # including OOMs the script caught
    error_text: str | None = None  # traceback of an exception other than an OOM (also on stderr)
    peak_allocated_bytes: int = 0
    peak_reserved_bytes: int = 0
    peak_requested_bytes: int = 0  # the peak of the sizes asked for, before the allocator's rounding
    dump_paths: list[Path] = field(default_factory=list)
    dump_writer: str = ""  # "capture" or "rehearsal" (capture was not available)
    oom_in_cell: bool = False  # the OOM was raised in a notebook cell, which IPython showed and went on
    fake_notes: Any = None  # oomdoctor.rehearse.fake.FakeNotes under --fake
    end_dump: Path | None = None  # the dump written when the script ran to completion (dump_at_end)
    fake_failure: str | None = None  # the one line for what could not run without data (exit 3)


def rehearse_script(
    script: Path,
    script_args: Sequence[str],
    config: RehearsalConfig,
    *,
    dump_dir: Path,
    dump_at_end: bool = False,
) -> RehearsalResult:
    """Run `script` as __main__ inside a rehearsal session; a dump is written at an OOM.

    With `dump_at_end`, a script that ran to completion leaves a dump too (its whole trace: what
    the memory plan analyses); `result.end_dump` is its path.
    """
    from oomdoctor.rehearse.recorder import OUT_OF_MEMORY_ERROR

    script = Path(script)
    dump_dir = Path(dump_dir)
    before = _dump_files(dump_dir)
    saved_argv, saved_path0 = sys.argv[:], sys.path[0] if sys.path else None
    saved_hooks = _process_hooks()
    sys.argv = [str(script), *script_args]
    script_dir = str(script.resolve().parent)
    if sys.path:
        sys.path[0] = script_dir
    else:
        sys.path.insert(0, script_dir)
    result = RehearsalResult(exit_code=0)
    session = RehearsalSession(config)
    try:
        with session:
            result.dump_writer = _install_dump_writer(session, dump_dir)
            try:
                runpy.run_path(str(script), run_name="__main__")
                if dump_at_end:
                    result.end_dump = _dump_now(session, result.dump_writer, dump_dir)
            except SystemExit as exit_:
                result.exit_code = _exit_code(exit_.code)
            except Exception as error:
                result.exit_code = 1
                fake_line = _fake_failure(session, error, str(script))
                if fake_line is not None:
                    result.exit_code = FAKE_FAILURE_EXIT
                    result.fake_failure = fake_line
                elif isinstance(error, OUT_OF_MEMORY_ERROR) and session.ooms:
                    result.oom = session.ooms[-1]
                else:
                    result.error_text = "".join(traceback.format_exception(error))
                if fake_line is None:
                    # As if uncaught: the traceback on stderr, and capture's hook adds it to the dump.
                    error.with_traceback(_script_traceback(error.__traceback__, str(script)))
                    sys.excepthook(type(error), error, error.__traceback__)
            except BaseException as error:
                fake_line = _fake_failure(session, error, str(script))
                if fake_line is None:
                    raise
                result.exit_code = FAKE_FAILURE_EXIT
                result.fake_failure = fake_line
            else:
                _oom_in_a_cell(session, result)
            finally:
                _uninstall_capture(result.dump_writer)
            _take_session(session, config, result)
    finally:
        sys.argv = saved_argv
        if saved_path0 is not None and sys.path:
            sys.path[0] = saved_path0
        _restore_process_hooks(saved_hooks)
    result.dump_paths = sorted(_dump_files(dump_dir) - before)
    return result


def _take_session(session: RehearsalSession, config: RehearsalConfig, result: RehearsalResult) -> None:
    """What the session saw, into the result: the simulator's peaks, the OOMs, the fake notes."""
    stats = session.backend.memory_stats(config.device)
    result.peak_allocated_bytes = int(stats.get("allocated_bytes.all.peak", 0))
    result.peak_reserved_bytes = int(stats.get("reserved_bytes.all.peak", 0))
    result.peak_requested_bytes = int(stats.get("requested_bytes.all.peak", 0))
    result.ooms_seen = session.ooms
    if session.fake is not None:
        result.fake_notes = session.fake.notes


def _process_hooks() -> tuple[Any, Any]:
    return sys.excepthook, threading.excepthook


def _restore_process_hooks(saved: tuple[Any, Any]) -> None:
    """The script ran in this process: the exception hooks it left go when it ends (torch's
    init_process_group wraps sys.excepthook to prefix "[rankN]: " to every line, and
    destroy_process_group does not unwrap it; a later error in this process, or in a process
    forked from it, would read so)."""
    sys.excepthook, threading.excepthook = saved


@contextlib.contextmanager
def rehearsal(config: RehearsalConfig, *, dump_dir: Path, filename: str = "") -> Iterator[RehearsalResult]:
    """Run the `with` block inside a rehearsal session with a dump writer, as `rehearse_script` runs a
    script: the RehearsalResult it yields is filled in when the block ends.

    An OOM that ends the block (result.oom, exit_code 1) and, under config.fake, what cannot run
    without data (result.fake_failure, exit_code 3; `filename` is the file to name when no user
    line is found) are taken into the result; any other exception propagates after the session stops.
    """
    from oomdoctor.rehearse.recorder import OUT_OF_MEMORY_ERROR

    dump_dir = Path(dump_dir)
    before = _dump_files(dump_dir)
    result = RehearsalResult(exit_code=0)
    saved_hooks = _process_hooks()
    with RehearsalSession(config) as session:
        result.dump_writer = _install_dump_writer(session, dump_dir)
        try:
            yield result
        except BaseException as error:
            fake_line = _fake_failure(session, error, filename)
            if fake_line is not None:
                result.exit_code, result.fake_failure = FAKE_FAILURE_EXIT, fake_line
            elif isinstance(error, OUT_OF_MEMORY_ERROR) and session.ooms:
                result.exit_code, result.oom = 1, session.ooms[-1]
            else:
                raise
        finally:
            _uninstall_capture(result.dump_writer)
            _restore_process_hooks(saved_hooks)
            _take_session(session, config, result)
    result.dump_paths = sorted(_dump_files(dump_dir) - before)


def _dump_now(session: RehearsalSession, dump_writer: str, dump_dir: Path) -> Path | None:
    """A dump of the simulated device now, written by capture when it is installed."""
    now_us = int(time.time() * 1_000_000)
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now_us / 1e6)) + f"{now_us % 1_000_000:06d}Z"
    rank = session.config.rank
    target = dump_dir / f"rehearsal-end-rank{rank}-{socket.gethostname()}-{os.getpid()}-{stamp}.pickle"
    dump_dir.mkdir(parents=True, exist_ok=True)
    if dump_writer == "capture":
        from oomdoctor.capture import dump

        written = dump(target)
        return Path(written) if written is not None else None
    _SnapshotWriter(session, dump_dir).write(target, reason="manual")
    return target


def _fake_failure(session: RehearsalSession, error: BaseException, script_filename: str) -> str | None:
    if session.fake is None:
        return None
    from oomdoctor.rehearse.fake import explain_failure

    return explain_failure(error, script_filename)


def _oom_in_a_cell(session: RehearsalSession, result: RehearsalResult) -> None:
    """A script that ran notebook cells (IPython's run_cell) ends normally though a cell ran out:
    IPython showed the OOM and kept it as sys.last_value. That OOM ends the rehearsal's story."""
    from oomdoctor.rehearse.recorder import OUT_OF_MEMORY_ERROR

    last = getattr(sys, "last_value", None)
    if not isinstance(last, OUT_OF_MEMORY_ERROR):
        return
    message = str(last)
    for oom in reversed(session.ooms):
        if oom.message == message:  # raised in this rehearsal, not left over from before it
            result.oom, result.oom_in_cell, result.exit_code = oom, True, 1
            return


def _script_traceback(trace: Any, script_filename: str) -> Any:
    """The traceback a plain run would show: from the script's frame in, rehearsal machinery cut off."""
    from oomdoctor.rehearse.recorder import is_machinery_file

    entries = []
    while trace is not None:
        entries.append(trace)
        trace = trace.tb_next
    filenames = [entry.tb_frame.f_code.co_filename for entry in entries]
    start = filenames.index(script_filename) if script_filename in filenames else 0
    end = len(entries)
    while end > start + 1 and is_machinery_file(filenames[end - 1]):
        end -= 1
    rebuilt = None
    for entry in reversed(entries[start:end]):
        rebuilt = types.TracebackType(rebuilt, entry.tb_frame, entry.tb_lasti, entry.tb_lineno)
    return rebuilt


def _exit_code(code: Any) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _dump_files(folder: Path) -> set[Path]:
    if not folder.is_dir():
        return set()
    return {path for path in folder.iterdir() if path.suffix in DUMP_SUFFIXES and path.is_file()}


def _install_dump_writer(session: RehearsalSession, dump_dir: Path) -> str:
    """Install capture so the OOM leaves a dump; without capture, write the simulator's snapshot."""
    capture = _capture()
    if capture is not None:
        # Through the environment, so that the script's own install() call writes there too.
        session._set_env(DUMP_DIR_ENV, str(dump_dir))
        capture.install()
        if capture.is_installed():
            return "capture"
    session.backend.record_history(max_entries=100_000, stacks="python", context="all")
    session.backend.attach_oom_observer(_SnapshotWriter(session, dump_dir))
    return "rehearsal"


def _capture() -> Any:
    """oomdoctor.capture when it provides install/is_installed/uninstall, else None."""
    try:
        import oomdoctor.capture as capture
    except ImportError:
        return None
    needed = ("install", "is_installed", "uninstall")
    return capture if all(hasattr(capture, name) for name in needed) else None


def _uninstall_capture(dump_writer: str) -> None:
    if dump_writer != "capture":
        return
    from oomdoctor.capture import uninstall

    uninstall()


class _SnapshotWriter:
    """OOM observer used when capture is unavailable: the simulator's snapshot plus minimal metadata."""

    def __init__(self, session: RehearsalSession, dump_dir: Path) -> None:
        self.session = session
        self.dump_dir = dump_dir

    def __call__(self, device: int, alloc_bytes: int, device_total_bytes: int, device_free_bytes: int) -> None:
        now_us = int(time.time() * 1_000_000)
        oom = {
            "device": device,
            "alloc_bytes": alloc_bytes,
            "device_total_bytes": device_total_bytes,
            "device_free_bytes": device_free_bytes,
            "time_us": now_us,
        }
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now_us / 1e6)) + f"{now_us % 1_000_000:06d}Z"
        name = f"oom-rank{self.session.config.rank}-{socket.gethostname()}-{os.getpid()}-{stamp}.pickle"
        self.write(self.dump_dir / name, reason="oom", oom=oom)

    def write(self, target: Path, *, reason: str, oom: dict[str, Any] | None = None) -> None:
        device = self.session.config.device
        snapshot = self.session.backend.snapshot()
        snapshot[METADATA_KEY] = {
            "schema_version": SCHEMA_VERSION,
            "versions": {
                "oomdoctor": __version__,
                "torch": _torch_version(),
                "cuda": None,
                "python": platform.python_version(),
            },
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "argv": list(sys.argv),
            "device": {"index": device, **self.session.backend.device_properties(device)},
            "reason": reason,
            "rehearsal": self.session.config.metadata(),
        }
        if oom is not None:
            snapshot[METADATA_KEY]["oom"] = oom
        target.parent.mkdir(parents=True, exist_ok=True)
        temporary = target.with_suffix(".tmp")
        with open(temporary, "wb") as file:
            pickle.dump(snapshot, file, protocol=4)
        os.replace(temporary, target)


def _torch_version() -> str | None:
    torch = sys.modules.get("torch")
    return getattr(torch, "__version__", None) if torch is not None else None
