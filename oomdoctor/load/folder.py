"""Folders of per-rank dumps: which files to read, and reading them in parallel worker processes.

    listing = find_dump_files("oom-dumps")      # oomdoctor's dump names first, then snapshots by content
    tree = find_dump_tree("outputs")            # --recursive: one FolderGroup per folder holding snapshots
    outcomes = map_files(listing.paths, work)   # work(path) in worker processes, in listing order

oomdoctor names its dumps `{kind}-rank{R}-{host}-{pid}-{UTC time}.pickle` (kind: oom, manual,
peak); those come first, in rank order. Any other file is kept when its first bytes look like a
container the loader reads (pickle, gzip, JSON, memory_viz HTML) and skipped with a note otherwise,
as are sub-folders and dumps still being written (capture's `.NAME.PID.tmp`): each such entry is a
FileOutcome with its reason as the error, like a file `map_files` could not read. Hidden files are
left out silently. A file's rank comes from its name when it is oomdoctor's, torchtitan's
(`{rank:06d}_step_{N}.pickle`, `rank{R}_memory_snapshot.pickle`) or says `rank3`, `rank_3`.

`find_dump_tree` lists a folder and its sub-folders, every level down to MAX_DEPTH, for `--recursive`:
links to folders are not followed, nor links to files outside the folder (each skipped with why),
and past MAX_FOLDERS folders or MAX_FILES snapshot files the rest is skipped, saying so. Its groups
come in the order a report reads them (`group_order`): folders named for an OOM (oomdoctor's `oom-`
dumps, torchtitan's `..._exit` folders), then the latest step a name states, then the newest files.

`map_files` runs `work` (a picklable top-level function) on each path in a process pool of
min(files, usable CPUs) workers, fewer when the host's available memory would not hold that many
loaded files at once or when other work keeps its CPUs busy (the load average), or in this
process for one file or when only one worker would run. An exception from one file becomes that
file's note; the others are still read. Nothing here knows what `work` returns.

Two large files compared (`diff`, `open --compare`) are read at once under the same rule:
`read_at_once` reads each in a worker of its own; `read_beside` starts one file's work in a new
interpreter (never a fork: the terminal app loads in a thread) while the caller reads the other.
Either leaves a file whose work failed to the caller, to read again and raise its own error.

Given a `progress`, `map_files` and `read_at_once` say how far the whole work has got (each file
weighted by its size): `work` is then called as `work(path, progress=...)` and tells how far its
own file has got; a worker process writes that to memory it shares with this one, which reads it
every POLL_SECONDS while it waits. Without one, nothing of this runs.
"""

from __future__ import annotations

import os
import pickle
import re
import subprocess
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from functools import partial
from typing import Any

from oomdoctor.errors import OomdoctorError
from oomdoctor.load import guard
from oomdoctor.load.access import access_error
from oomdoctor.records import pickled_by_fields

DUMP_NAME = re.compile(r"^(?:oom|manual|peak)-rank(\d+)-.*\.pickle$")
# "rank3", "rank_3", "rank-3", "RANK3" where no other letter runs into "rank" and no digit follows
# (also torchtitan's older `rank{R}_memory_snapshot.pickle`)
_RANK_IN_NAME = re.compile(r"(?<![A-Za-z])rank[_-]?(\d+)(?!\d)", re.IGNORECASE)
# torchtitan's memory snapshots, `{rank:06d}_step_{N}.pickle`: a number is a rank only in exactly
# this shape (six digits, the whole name, a snapshot container's extension; not a date's eight)
TORCHTITAN_NAME = re.compile(r"^(\d{6})_step_(\d+)\.(?:pickle|pkl|pt|json)(?:\.gz)?$", re.IGNORECASE)
# a step or iteration in a file or folder name: torchtitan's `iteration_10`, `step_000000000010_exit`,
# `000003_step_10.pickle`
_STEP_IN_NAME = re.compile(r"(?<![A-Za-z])(?:step|iteration|iter)[_-]?(\d+)(?!\d)", re.IGNORECASE)
# a folder written at an OOM: torchtitan's `iteration_10_exit` / `step_..._exit`
_EXIT_FOLDER = re.compile(r"(?:^|[_-])exit$", re.IGNORECASE)
_TEMPORARY = re.compile(r"^\..+\.\d+\.tmp$")
_SNIFF_BYTES = 64
_WHITESPACE = b" \t\r\n\xef\xbb\xbf"


def rank_from_name(name: str) -> int | None:
    """The rank an (oomdoctor or other) file name states, or None."""
    base = os.path.basename(name)
    match = DUMP_NAME.match(base) or TORCHTITAN_NAME.match(base) or _RANK_IN_NAME.search(base)
    return int(match.group(1)) if match else None


def step_from_name(name: str) -> int | None:
    """The step or iteration a file or folder name states (`iteration_10`, `step_000000000010_exit`,
    `000003_step_10.pickle`), or None."""
    match = _STEP_IN_NAME.search(os.path.basename(name))
    return int(match.group(1)) if match else None


@dataclass(frozen=True, slots=True)
class FileOutcome:
    path: str
    value: Any  # what `work` returned; None when it failed
    error: str | None  # one line saying why the file could not be read (or was not read)


@dataclass(frozen=True, slots=True)
class FolderListing:
    directory: str
    paths: tuple[str, ...]  # files to read: oomdoctor's dumps by rank, then the rest by name
    skipped: tuple[FileOutcome, ...]  # entries not read, each with why (value None)


def _content_note(path: str) -> str | None:
    """None when the file's first bytes look like a snapshot container, else why it is skipped."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(_SNIFF_BYTES)
    except OSError as error:
        return f"cannot read ({error.strerror or error})"
    if not head:
        return "empty file"
    if head[:1] == b"\x80" or head[:2] == b"\x1f\x8b" or head.lstrip(_WHITESPACE)[:1] in (b"{", b"[", b"<"):
        return None
    if head[:1] in b"(}]":  # pickle protocol 0-1
        return None
    return "not a snapshot (not a pickle, gzip, JSON or memory_viz HTML file)"


def _classify(
    path: str, name: str, dumps: list[tuple[int, str]], others: list[str], skipped: list[FileOutcome]
) -> None:
    """Put the file `path` (named `name`) among oomdoctor's dumps, other snapshots or skipped entries."""
    match = DUMP_NAME.match(name)
    if match:
        dumps.append((int(match.group(1)), path))
        return
    note = _content_note(path)
    if note is None:
        others.append(path)
    else:
        skipped.append(FileOutcome(path, None, note))


def find_dump_files(directory: str | os.PathLike[str]) -> FolderListing:
    """The snapshot files directly inside `directory`, and the entries skipped with why."""
    shown = os.fsdecode(directory)
    try:
        names = sorted(os.listdir(directory))
    except OSError as error:
        raise access_error(shown, error, folder=True) from None
    dumps: list[tuple[int, str]] = []
    others: list[str] = []
    skipped: list[FileOutcome] = []
    for name in names:
        path = os.path.join(shown, name)
        if _TEMPORARY.match(name):
            skipped.append(FileOutcome(path, None, "a dump still being written (temporary file)"))
            continue
        if name.startswith("."):
            continue
        if os.path.isdir(path):
            skipped.append(
                FileOutcome(path, None, "a folder (only files directly inside are read; --recursive reads sub-folders)")
            )
            continue
        _classify(path, name, dumps, others, skipped)
    paths = tuple(path for _, path in sorted(dumps)) + tuple(others)
    return FolderListing(shown, paths, tuple(skipped))


# -- a folder and its sub-folders (--recursive) ---------------------------------------------------

MAX_DEPTH = 8  # sub-folder levels below the folder given
MAX_FOLDERS = 4096  # folders listed at most
MAX_FILES = 4096  # snapshot files listed at most


@dataclass(frozen=True, slots=True)
class FolderGroup:
    """The snapshot files of one folder of a tree: oomdoctor's dumps by rank, then the rest by name."""

    folder: str  # relative to the tree's root ("" for the root itself), "/"-separated
    paths: tuple[str, ...]
    skipped: tuple[FileOutcome, ...]  # its entries not read, each with why
    step: int | None  # the step its name states (its files' names when the folder's does not)
    oom_named: bool  # its name or its files' names say they were written at an OOM
    newest_mtime: float  # of its files, for ordering folders that say nothing else


@dataclass(frozen=True, slots=True)
class TreeListing:
    directory: str
    groups: tuple[FolderGroup, ...]  # folders holding snapshot files, most likely to hold the OOM first
    skipped: tuple[FileOutcome, ...]  # entries of the tree not listed in any group: links, depth, limits


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _mtime(path: str) -> float:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return 0.0


def _group_of(
    relative: str, dumps: list[tuple[int, str]], others: list[str], skipped: list[FileOutcome]
) -> FolderGroup:
    paths = tuple(path for _, path in sorted(dumps)) + tuple(others)
    name = relative.rsplit("/", 1)[-1]
    step = step_from_name(name) if name else None
    if step is None:
        steps = [s for s in (step_from_name(p) for p in paths) if s is not None]
        step = max(steps) if steps else None
    oom_named = bool(name and _EXIT_FOLDER.search(name)) or any(
        os.path.basename(p).startswith("oom-") for _, p in dumps
    )
    return FolderGroup(relative, paths, tuple(skipped), step, oom_named, max((_mtime(p) for p in paths), default=0.0))


def group_order(group: FolderGroup) -> tuple[bool, bool, int, float, str]:
    """The order folders are read in: those named for an OOM, then the latest step, the newest files."""
    return (not group.oom_named, group.step is None, -(group.step or 0), -group.newest_mtime, group.folder)


def find_dump_tree(directory: str | os.PathLike[str]) -> TreeListing:
    """The snapshot files in `directory` and every sub-folder down to MAX_DEPTH levels, one group per
    folder holding any, ordered by `group_order`. Links to folders are not followed, nor links to files
    outside `directory`; hidden entries are left out; past MAX_FOLDERS folders or MAX_FILES files the
    rest is skipped, saying so."""
    shown = os.fsdecode(directory)
    try:
        os.listdir(directory)
    except OSError as error:
        raise access_error(shown, error, folder=True) from None
    root_real = os.path.realpath(shown)
    groups: list[FolderGroup] = []
    tree_skipped: list[FileOutcome] = []
    pending: list[tuple[str, str, int]] = [(shown, "", 0)]  # (path, relative, depth), breadth first
    folders = files = 0
    while pending:
        folder_path, relative, depth = pending.pop(0)
        folders += 1
        try:
            names = sorted(os.listdir(folder_path))
        except OSError as error:
            tree_skipped.append(FileOutcome(folder_path, None, f"cannot list ({error.strerror or error})"))
            continue
        dumps: list[tuple[int, str]] = []
        others: list[str] = []
        skipped: list[FileOutcome] = []
        for name in names:
            path = os.path.join(folder_path, name)
            if _TEMPORARY.match(name):
                skipped.append(FileOutcome(path, None, "a dump still being written (temporary file)"))
                continue
            if name.startswith("."):
                continue
            if os.path.islink(path):
                target = os.path.realpath(path)
                if os.path.isdir(target):
                    tree_skipped.append(FileOutcome(path, None, "a link to a folder (not followed)"))
                    continue
                if not _inside(target, root_real):
                    tree_skipped.append(FileOutcome(path, None, "a link to a file outside the folder (not followed)"))
                    continue
            if os.path.isdir(path):
                if depth + 1 > MAX_DEPTH:
                    tree_skipped.append(FileOutcome(path, None, f"a folder more than {MAX_DEPTH} levels deep"))
                elif folders + len(pending) >= MAX_FOLDERS:
                    tree_skipped.append(FileOutcome(path, None, f"a folder past the first {MAX_FOLDERS} listed"))
                else:
                    pending.append((path, f"{relative}/{name}" if relative else name, depth + 1))
                continue
            if files >= MAX_FILES:
                tree_skipped.append(FileOutcome(path, None, f"a file past the first {MAX_FILES} snapshot files listed"))
                continue
            before = len(dumps) + len(others)
            _classify(path, name, dumps, others, skipped)
            files += len(dumps) + len(others) - before
        if dumps or others:
            groups.append(_group_of(relative, dumps, others, skipped))
    return TreeListing(shown, tuple(sorted(groups, key=group_order)), tuple(tree_skipped))


def file_size(path: str) -> int:
    """The size of the file at `path` in bytes; 0 when it cannot be read."""
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _guarded(work: Callable[[str], Any], path: str) -> FileOutcome:
    """Run `work` on one file; every error becomes the file's note (runs inside the worker)."""
    try:
        return FileOutcome(path, work(path), None)
    except OomdoctorError as error:
        return FileOutcome(path, None, _without_path(str(error), path))
    except MemoryError:
        return FileOutcome(path, None, "out of host memory while reading it")
    except Exception as error:  # a file that trips a bug must not hide the other ranks
        return FileOutcome(path, None, f"could not be analysed ({type(error).__name__}: {error})")


def _without_path(message: str, path: str) -> str:
    """Load errors begin with the path; a note is already shown beside the file's name."""
    return message[len(path) + 2 :] if message.startswith(path + ": ") else message


def usable_cpus() -> int:
    """The CPUs this process may run on (a container's or taskset's limit), else os.cpu_count()."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


# A loaded and analysed snapshot holds about this many times its pickle's size in Python objects.
MEMORY_PER_FILE_BYTE = 8


def available_memory_bytes() -> int | None:
    """MemAvailable from /proc/meminfo (Linux), else None: unknown."""
    try:
        with open("/proc/meminfo", "rb") as handle:
            for line in handle:
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def idle_cpus(cpus: int | None = None) -> float | None:
    """About how many CPUs other work leaves this process: the usable CPUs less the runnable
    processes of the last minute (the load average), this one counted as its own; None: unknown."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return None
    usable = cpus if cpus is not None else usable_cpus()
    return min(float(usable), usable - max(0.0, load - 1.0))


def worker_count(
    file_count: int,
    *,
    largest_file_bytes: int = 0,
    cpus: int | None = None,
    available_bytes: int | None = None,
    idle: float | None = None,
) -> int:
    """Workers for `file_count` files: one per usable CPU, no more than files, no more than the
    host's available memory holds at once (each worker holds one loaded file), and no more than
    the CPUs other work leaves idle (`idle`, from `idle_cpus`): on a host whose CPUs are all busy,
    worker processes only share them with each other, and reading in this process is faster."""
    workers = max(1, min(file_count, cpus if cpus is not None else usable_cpus()))
    if idle is not None:
        workers = min(workers, max(1, int(idle + 0.5)))
    if largest_file_bytes > 0 and available_bytes is not None:
        workers = min(workers, max(1, available_bytes // (MEMORY_PER_FILE_BYTE * largest_file_bytes)))
    return workers


def map_files(
    paths: Sequence[str],
    work: Callable[..., Any],
    *,
    max_workers: int | None = None,
    parallel: bool = True,
    progress: Callable[[float], None] | None = None,
) -> tuple[FileOutcome, ...]:
    """`work(path)` for every path, in parallel processes unless there is one file (or `parallel` is
    False, or the host has no idle CPU: then in this process, or in one worker process where this
    one may be killed by the unpickling time limit), returned in the order of `paths`. Worker
    processes take the largest files first. `progress` hears the fraction of the whole done (see
    the module's docstring)."""
    sizes = [file_size(path) for path in paths]
    # (shared even where parallel is False: one worker process may read them, as below)
    shares = None if progress is None else Shares(sizes, progress, shared=len(paths) > 1)
    if max_workers is None:
        workers = _workers_for(sizes)
    else:
        workers = max(1, min(max_workers, len(paths)))
    if not parallel or workers <= 1 or len(paths) <= 1:
        if len(paths) <= 1 or not guard.enabled():
            return _each_here(paths, work, shares)
        # This process ends when a hostile file outlasts the unpickling time limit (the command's
        # watched child): one worker it can afford to lose reads them in turn, so that such a
        # file costs only its own row, however busy the host (a busy one asks for no parallelism).
        workers = 1
    outcomes: dict[int, FileOutcome] = {}
    # the largest files first: the workers take them in this order, so that no large file is left
    # to run alone at the end while the other workers wait
    pending = sorted(range(len(paths)), key=lambda index: -sizes[index])
    try:
        broken = _pool_pass(paths, pending, work, workers, outcomes, shares)
    except (OSError, NotImplementedError, ImportError):  # no process support here: read them one by one
        return _each_here(paths, work, shares)
    # A worker that died (out of memory, or killed by the unpickling time limit on a hostile file)
    # breaks its pool, and every file not yet done with it: each of those is read again alone, so
    # that only the file that kills its reader is noted for it.
    for index in broken:
        if _pool_pass(paths, [index], work, 1, outcomes, shares):
            outcomes[index] = FileOutcome(paths[index], None, WORKER_DIED)
            if shares is not None:  # given up: done
                shares.done((index,))
    return tuple(outcomes[index] for index in range(len(paths)))


def _each_here(paths: Sequence[str], work: Callable[..., Any], shares: Shares | None) -> tuple[FileOutcome, ...]:
    """`_guarded` work on each path in turn, in this process; each file, read or given up (its error
    its note), counted done."""
    outcomes = []
    for index, path in enumerate(paths):
        outcome = _guarded(_told(work, shares, index), path)
        if shares is not None and outcome.error is not None:
            shares.done((index,))
        outcomes.append(outcome)
    return tuple(outcomes)


def _workers_for(sizes: Sequence[int]) -> int:
    """`worker_count` for files of `sizes` bytes, on this host as it is now."""
    return worker_count(
        len(sizes), largest_file_bytes=max(sizes, default=0), available_bytes=available_memory_bytes(), idle=idle_cpus()
    )


def _all_at_once(sizes: Sequence[int], min_bytes: int) -> bool:
    """Whether files of `sizes` bytes are worth reading all at once, each by a process of its own:
    every file at least `min_bytes`, and the host able to give each a CPU and hold them all
    (`worker_count`)."""
    return min(sizes, default=0) >= min_bytes and _workers_for(sizes) >= len(sizes)


def read_at_once(
    paths: Sequence[str],
    work: Callable[..., Any],
    *,
    min_bytes: int = 0,
    progress: Callable[[float], None] | None = None,
) -> dict[int, Any]:
    """`work(path)` for each of a few paths at once, one worker process each: index -> what it
    returned. Nothing is read when a file is under `min_bytes` or the host cannot give each file a
    worker (`worker_count`). A path whose work raised, or whose worker died (which ends them all),
    is left out: the caller reads it in its own process, where its error is raised (or the
    unpickling time limit ends the command) as it would be without workers. `progress` hears the
    fraction of the whole done (see the module's docstring): each file done here counts as done."""
    done: dict[int, Any] = {}
    sizes = [file_size(path) for path in paths]
    if not _all_at_once(sizes, min_bytes):
        return done
    shares = None if progress is None else Shares(sizes, progress, shared=True)
    try:
        with _pool(len(paths), shares) as executor:
            futures = [executor.submit(_told(work, shares, index, True), path) for index, path in enumerate(paths)]
            _watch(futures, range(len(paths)), shares)
            for index, future in enumerate(futures):
                try:
                    done[index] = future.result()
                except BrokenProcessPool:
                    break
                except Exception:  # noqa: BLE001 - raised again where the caller reads it
                    continue
    except (OSError, NotImplementedError, ImportError):  # no process support here
        pass
    return done


class Beside:
    """`work(path)` under way in a worker process while the caller reads other files (`read_beside`)."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self._process = process

    def result(self) -> tuple[bool, Any]:
        """(True, what `work` returned), once it is done; (False, None) when it raised or its worker
        died: the caller then reads the file itself, so that its error is what it would be."""
        try:
            assert self._process.stdout is not None
            return pickle.loads(self._process.stdout.read())  # noqa: S301 - from the worker this started
        except Exception:  # noqa: BLE001 - nothing, or cut short: the worker died (at the time limit, say)
            return False, None
        finally:
            self.close()

    def close(self) -> None:
        """End the worker (killed if it is still at work) and let its pipes go."""
        if self._process.poll() is None:
            self._process.kill()
        self._process.wait()
        for stream in (self._process.stdin, self._process.stdout):
            if stream is not None:
                stream.close()


# The worker of `read_beside`: a new interpreter (never a fork, which would copy the locks the
# caller's other threads hold: the terminal app loads in a thread), with the caller's import path.
_BESIDE_CHILD = (
    "import pickle, sys; given = sys.stdin.buffer; sys.path[:] = pickle.load(given); "
    "from oomdoctor.load.folder import _work_beside; _work_beside(given)"
)


def read_beside(paths: Sequence[str], index: int, work: Callable[[str], Any], *, min_bytes: int = 0) -> Beside | None:
    """Start `work(paths[index])` in a worker process, for the caller to read the other `paths`
    meanwhile and take the result from `Beside.result`; `work` must pickle (a module's function,
    or a partial of one). None when every file is not at least `min_bytes`, or the host cannot give
    each file a CPU and hold them all at once (`worker_count`), or no process can be started: the
    caller reads them all itself."""
    if not _all_at_once([file_size(path) for path in paths], min_bytes):
        return None
    if not sys.executable or getattr(sys, "frozen", False):  # no interpreter to start (a frozen app's is itself)
        return None
    try:
        process = subprocess.Popen(
            [sys.executable, "-c", _BESIDE_CHILD],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,  # nothing on the terminal the caller may be drawing on
        )
    except (OSError, ValueError):  # no process can be started here
        return None
    beside = Beside(process)
    try:
        assert process.stdin is not None
        pickle.dump(list(sys.path), process.stdin)  # first: what the work's own unpickling imports
        pickle.dump((work, paths[index]), process.stdin, protocol=pickle.HIGHEST_PROTOCOL)
        process.stdin.close()
    except Exception:  # noqa: BLE001 - the worker is gone, or work does not pickle
        beside.close()
        return None
    return beside


def _work_beside(given: Any) -> None:
    """In the worker of `read_beside`: `work(path)` as the caller sent them, and (True, what it
    returned) or (False, None) written back. Output the work prints goes nowhere: standard output
    carries the answer alone."""
    answer = os.fdopen(os.dup(1), "wb")
    with open(os.devnull, "wb") as nowhere:
        os.dup2(nowhere.fileno(), 1)
    guard.enable()
    try:
        work, path = pickle.load(given)  # noqa: S301 - from the process that started this one
        outcome: tuple[bool, Any] = (True, work(path))
    except BaseException:  # noqa: BLE001 - raised again where the caller reads it
        outcome = (False, None)
    try:
        data = pickle.dumps(outcome, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # noqa: BLE001 - what work returned does not pickle: the caller reads it
        data = pickle.dumps((False, None))
    with answer:
        answer.write(data)


WORKER_DIED = (
    "the process reading it died: out of host memory, or a file built to make the unpickler work without "
    "bound or crash (killed after the unpickling time limit)"
)


def _pool_pass(
    paths: Sequence[str],
    indices: list[int],
    work: Callable[..., Any],
    workers: int,
    outcomes: dict[int, FileOutcome],
    shares: Shares | None = None,
) -> list[int]:
    """Read `indices` of `paths` in a pool of `workers`; the indices whose worker died."""
    broken = []
    with _pool(workers, shares) as executor:
        futures = [
            (index, executor.submit(_guarded, _told(work, shares, index, True), paths[index])) for index in indices
        ]
        _watch([future for _, future in futures], indices, shares)
        for index, future in futures:
            try:
                outcomes[index] = future.result()
            except BrokenProcessPool:
                broken.append(index)
    return broken


# How often a parent waiting on its workers reads how far they have got (given a progress)
POLL_SECONDS = 0.1


class Shares:
    """How far the work on each of several files has got (0 to 1), each file weighted by its size:
    `progress` hears the fraction of the whole after each change. Across processes (`shared`) the
    fractions are kept in memory shared with the workers (each worker writes its file's, and the
    parent's `_watch` tells `progress` every POLL_SECONDS); else in a list, each change told at once."""

    def __init__(self, sizes: Sequence[int], progress: Callable[[float], None], *, shared: bool) -> None:
        self._weights = [max(size, 1) for size in sizes]
        self._total = sum(self._weights)
        self._progress = progress
        self.fractions: Any = [0.0] * len(sizes)
        if shared:
            try:
                from multiprocessing import RawArray

                self.fractions = RawArray("d", len(sizes))
            except (OSError, ImportError):  # no shared memory here: the workers' progress goes unheard
                pass

    def set(self, index: int, fraction: float) -> None:
        """File `index` has got to `fraction` (in this process), and the whole's fraction is told."""
        self.fractions[index] = fraction
        self.tell()

    def done(self, indices: Any) -> None:
        """The files `indices` are done (or given up), and the whole's fraction is told."""
        for index in indices:
            self.fractions[index] = 1.0
        self.tell()

    def work(self, work: Callable[..., Any], index: int, path: str) -> Any:
        """`work(path)` in this process, telling how far file `index` has got; then, unless it
        raised, it is done."""
        result = work(path, progress=partial(self.set, index))
        self.done((index,))
        return result

    def tell(self) -> None:
        """`progress` hears the fraction of the whole: each file's fraction (0 to 1) by its size. (A
        file read again after its worker died starts over: the whole may go back.)"""
        fractions = [min(max(fraction, 0.0), 1.0) for fraction in self.fractions]
        self._progress(sum(map(float.__mul__, fractions, map(float, self._weights))) / self._total)


# In a worker process of a `Shares`'d pool: the fractions it writes to (`_start_worker`)
_worker_fractions: Any = None


def _start_worker(fractions: Any) -> None:
    global _worker_fractions
    _worker_fractions = fractions
    guard.enable()


def _pool(workers: int, shares: Shares | None) -> ProcessPoolExecutor:
    """A pool of `workers` processes, each under the unpickling guard, writing to `shares` when given."""
    if shares is None or isinstance(shares.fractions, list):
        return ProcessPoolExecutor(max_workers=workers, initializer=guard.enable)
    return ProcessPoolExecutor(max_workers=workers, initializer=_start_worker, initargs=(shares.fractions,))


def _told(work: Callable[..., Any], shares: Shares | None, index: int, in_worker: bool = False) -> Callable[[str], Any]:
    """`work`, told to report how far file `index` has got when there are `shares` to report to (in
    a worker process when `in_worker`, through the memory it shares with the parent)."""
    if shares is None:
        return work
    if in_worker:
        return partial(_work_in_worker, work, index)
    return partial(shares.work, work, index)


def _work_in_worker(work: Callable[..., Any], index: int, path: str) -> Any:
    fractions = _worker_fractions
    if fractions is None:  # no shared memory: the parent hears of this file when it is done
        return work(path, progress=None)
    return work(path, progress=partial(fractions.__setitem__, index))


def _watch(futures: Sequence[Future[Any]], indices: Any, shares: Shares | None) -> None:
    """Until `futures` (the work on files `indices`) are all done, tell `shares` how far they have
    got, every POLL_SECONDS; nothing without shares. A file whose work raised (or whose worker
    died) is not counted done: it is read again, by a worker of its own or by the caller."""
    if shares is None:
        return
    waiting = dict(zip(futures, indices))
    while waiting:
        finished, _ = wait(waiting, timeout=POLL_SECONDS)
        ended = []
        for future in finished:
            index = waiting.pop(future)
            if not future.cancelled() and future.exception() is None:
                ended.append(index)
        shares.done(ended)


pickled_by_fields(globals())  # sent from a folder's worker processes to their parent: each class pickles fast
