"""Take personal details out of a dump or a report before it is shared: host and user names, home
directories and other absolute path prefixes, paths in argv, the process id.

A path keeps what makes it useful to whoever reads the report:

    /home/alice/venv/lib/python3.11/site-packages/torch/nn/modules/module.py
                                        -> <env>/site-packages/torch/nn/modules/module.py
    /usr/lib/python3.11/threading.py    -> <env>/lib/python3.11/threading.py
    /home/alice/llm/src/train.py        -> <project>/src/train.py   (the project's root: below)
    /scratch/alice/data/shard-3.bin     -> <path>/shard-3.bin
    oom-rank0-gpu-node-7-4242-20250101T000000Z.pickle -> oom-rank0-<host>-<pid>-20250101T000000Z.pickle

The project's root is the deepest directory holding every file of the program's own frames (those
outside site-packages and the standard library), unless that is a home directory or shallower; then
it is the directory of each script that began a stack. User names (from home-directory paths) and
the host name are replaced wherever they appear as a whole word, case-sensitively.

`Redactor.from_snapshot` learns those names from the model; `redact_analysis` and
`redact_environment` rewrite results for the reports; `redact_snapshot_data` rewrites the plain data
of a dump (frames' file names, oomdoctor's host, pid, argv and exception) in place, leaving torch's
keys otherwise as they were. Pure Python; nothing here opens files.
"""

from __future__ import annotations

import dataclasses
import posixpath
import re
from typing import Any, Iterable, Mapping

from oomdoctor.analysis.environment import Environment
from oomdoctor.metadata import METADATA_KEY
from oomdoctor.model import Frame, Snapshot

ENV = "<env>"
PROJECT = "<project>"
OTHER_PATH = "<path>"
HOST = "<host>"
USER = "<user>"
PID = "<pid>"

_PACKAGES = re.compile(r"/(?:site|dist)-packages/")
_STDLIB = re.compile(r"/lib/python\d+(?:\.\d+)?t?/", re.IGNORECASE)
_HOME = re.compile(r"^(?:/home/|/Users/|/usr/home/|/export/home/|[A-Za-z]:/(?:Users|Documents and Settings)/)([^/]+)")
_ABSOLUTE = re.compile(r"^(?:/|~/|[A-Za-z]:/|//)")
# An absolute path inside free text (a traceback line, an argv value, a message): it starts at "/",
# "~/" or "C:\" that no word character, ":" or "/" precedes, so URLs and "and/or" are left alone.
_PATH_IN_TEXT = re.compile(r"(?<![\w:/.~\\<>-])(?:~?/|[A-Za-z]:[\\/])[^\s'\"`()\[\]{},;|<>]+")
# oomdoctor's dump names: {kind}-rank{R}-{host}-{pid}-{UTC time}[-N].pickle
_DUMP_NAME = re.compile(r"(\b[A-Za-z]+-rank\d+-)([A-Za-z0-9._-]+?)-(\d+)(-\d{8}T\d{6}Z(?:-\d+)?\.pickle)")
# Words that name no one even when they are a user name, and this module's own placeholders.
_NOT_PERSONAL = {"root", "env", "project", "path", "host", "user", "pid", "unknown", "localhost"}
_WIDE_DIRECTORIES = {"", "/", "~", ".", "/root", "/home", "/Users", "/usr", "/usr/home", "/export/home"}
_FRAME_SAMPLE_EVENTS = 20000  # trace events, from the newest, whose stacks teach the project's root
# Fields of result objects that hold fixed vocabulary (verdicts, phases, methods), never a path or name.
_VOCABULARY_FIELDS = frozenset(
    {"verdict", "phase", "target_phase", "phase_source", "source", "component", "method", "metric", "pool",
     "target_kind", "id", "source_format", "name"}
)  # fmt: skip


def _slashed(path: str) -> str:
    return path.replace("\\", "/")


def _is_library(path: str) -> bool:
    return bool(_PACKAGES.search(path) or _STDLIB.search(path))


def _too_shallow(directory: str) -> bool:
    """True for "/", "/home", a home directory itself, "C:/Users/alice": too wide to call a project."""
    home = _HOME.match(directory + "/")
    if home and len(directory) <= home.end():
        return True
    return directory.rstrip("/") in _WIDE_DIRECTORIES or bool(re.fullmatch(r"[A-Za-z]:(?:/Users)?/?", directory))


@dataclasses.dataclass(frozen=True)
class Redactor:
    hosts: tuple[str, ...] = ()
    users: tuple[str, ...] = ()
    pids: tuple[int, ...] = ()
    project_roots: tuple[str, ...] = ()  # "/"-separated, longest first

    @classmethod
    def learn(
        cls,
        *,
        host: str | None = None,
        pid: int | None = None,
        texts: Iterable[str] = (),
        filenames: Iterable[str] = (),
        script_filenames: Iterable[str] = (),
    ) -> Redactor:
        """A redactor for one dump: `filenames` from its frames, `script_filenames` the outermost frame
        of each stack, `texts` anything else that may hold paths (argv, the exception's traceback)."""
        hosts = []
        if host and host.lower() not in _NOT_PERSONAL:
            hosts.append(host)
            short = host.split(".")[0]
            if short != host and len(short) > 1 and short.lower() not in _NOT_PERSONAL:
                hosts.append(short)
        filenames = {_slashed(f) for f in filenames if isinstance(f, str)}
        scripts = {_slashed(f) for f in script_filenames if isinstance(f, str)}
        paths = set(filenames) | scripts
        for text in texts:
            paths.update(_slashed(m.group(0)) for m in _PATH_IN_TEXT.finditer(text))
        users = sorted({m.group(1) for p in paths if (m := _HOME.match(p)) and m.group(1).lower() not in _NOT_PERSONAL})
        own = [f for f in filenames | scripts if _ABSOLUTE.match(f) and not _is_library(f)]
        roots: set[str] = set()
        if own:
            common = posixpath.commonpath([posixpath.dirname(f) for f in own]) if len({f[:1] for f in own}) == 1 else "/"
            if not _too_shallow(common):
                roots.add(common)
            else:
                roots.update(d for f in scripts if _ABSOLUTE.match(f) and not _is_library(f) and not _too_shallow(d := posixpath.dirname(f)))
        return cls(
            hosts=tuple(sorted(hosts, key=len, reverse=True)),
            users=tuple(sorted(users, key=len, reverse=True)),
            pids=(pid,) if isinstance(pid, int) and not isinstance(pid, bool) else (),
            project_roots=tuple(sorted(roots, key=len, reverse=True)),
        )

    @classmethod
    def from_snapshot(cls, snapshot: Snapshot) -> Redactor:
        filenames: set[str] = set()
        scripts: set[str] = set()

        def stack(frames: tuple[Frame, ...]) -> None:
            if frames:
                filenames.update(f.filename for f in frames)
                scripts.add(frames[-1].filename)

        for segment in snapshot.segments:
            stack(segment.frames)
            for block in segment.blocks:
                stack(block.frames)
        seen_stacks: set[int] = set()
        for trace in snapshot.traces:
            for index in range(max(0, len(trace) - _FRAME_SAMPLE_EVENTS), len(trace)):
                if trace.has_frames_at(index):
                    frames = trace.frames_at(index)
                    if id(frames) not in seen_stacks:
                        seen_stacks.add(id(frames))
                        stack(frames)
        meta = snapshot.oomdoctor if isinstance(snapshot.oomdoctor, Mapping) else {}
        return cls.learn(
            host=meta.get("host") if isinstance(meta.get("host"), str) else None,
            pid=meta.get("pid") if isinstance(meta.get("pid"), int) else None,
            texts=_metadata_texts(meta),
            filenames=filenames,
            script_filenames=scripts,
        )

    # -- strings ---------------------------------------------------------------------------------

    def names(self, text: str) -> str:
        """`text` with the host and user names replaced where they stand as whole words."""
        for name, placeholder in [(h, HOST) for h in self.hosts] + [(u, USER) for u in self.users]:
            if name in text:
                text = re.sub(rf"(?<![A-Za-z0-9]){re.escape(name)}(?![A-Za-z0-9])", placeholder, text)
        return text

    def path(self, filename: str) -> str:
        """A file name with its personal prefix replaced (see the module docstring)."""
        if not filename:
            return filename
        path = _slashed(filename)
        packages = list(_PACKAGES.finditer(path))
        if packages:
            return f"{ENV}{packages[-1].group(0)}{self._kept(path[packages[-1].end():])}"
        stdlib = _STDLIB.search(path)
        if stdlib and _ABSOLUTE.match(path):
            return f"{ENV}{stdlib.group(0)}{self._kept(path[stdlib.end():])}"
        for root in self.project_roots:
            if path.startswith(root + "/"):
                return f"{PROJECT}/{self._kept(path[len(root) + 1:])}"
        if _ABSOLUTE.match(path):
            return f"{OTHER_PATH}/{self._kept(posixpath.basename(path))}"
        return self._kept(filename)

    def _kept(self, part: str) -> str:
        return self.names(self.dump_name(part))

    def dump_name(self, text: str) -> str:
        """oomdoctor dump names with the host and pid replaced."""
        return _DUMP_NAME.sub(lambda m: f"{m.group(1)}{HOST}-{PID}{m.group(4)}", text)

    def text(self, text: str) -> str:
        """Free text (a message, a traceback, an argv value) with every path and name in it redacted."""
        text = _PATH_IN_TEXT.sub(lambda m: self.path(m.group(0)), text)
        return self.names(self.dump_name(text))

    def source(self, source: str) -> str:
        """The name of the file a report was made from."""
        return self.path(source)

    # -- results ---------------------------------------------------------------------------------

    def walk(self, value: Any, _memo: dict[str, str] | None = None) -> Any:
        """`value` (a result object, tuple, dict or string) rebuilt with every path and name redacted."""
        memo = {} if _memo is None else _memo
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, Frame):
            filename = memo.get(value.filename)
            if filename is None:
                filename = memo[value.filename] = self.path(value.filename)
            return value if filename == value.filename else Frame(filename, value.line, value.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            changes = {}
            for field in dataclasses.fields(value):
                if field.name in _VOCABULARY_FIELDS and isinstance(getattr(value, field.name), str):
                    continue
                old = getattr(value, field.name)
                new = self.walk(old, memo)
                if new is not old:
                    changes[field.name] = new
            return dataclasses.replace(value, **changes) if changes else value
        if isinstance(value, tuple):
            items = tuple(self.walk(v, memo) for v in value)
            return value if all(a is b for a, b in zip(items, value)) else items
        if isinstance(value, list):
            return [self.walk(v, memo) for v in value]
        if isinstance(value, Mapping):
            return {self.walk(k, memo) if isinstance(k, str) else k: self.walk(v, memo) for k, v in value.items()}
        return value


def _metadata_texts(meta: Mapping[str, Any]) -> list[str]:
    texts = []
    argv = meta.get("argv")
    if isinstance(argv, (list, tuple)):
        texts.extend(a for a in argv if isinstance(a, str))
    exception = meta.get("exception")
    if isinstance(exception, Mapping):
        texts.extend(exception.get(k) for k in ("message", "traceback") if isinstance(exception.get(k), str))
    return texts


def redact_analysis(analysis: Any, redactor: Redactor) -> Any:
    """The analysis (or any result object) with paths and names redacted; numbers and verdicts unchanged."""
    return redactor.walk(analysis)


def redact_environment(environment: Environment, redactor: Redactor) -> Environment:
    return dataclasses.replace(
        environment,
        host=HOST if environment.host else None,
        pid=None,
        argv=tuple(redactor.text(a) for a in environment.argv),
    )


def redact_snapshot_data(data: Any, redactor: Redactor) -> Any:
    """Redact a dump's plain data in place (a snapshot dict or a bare segment list) and return it.

    Frames' file names and the formatted `forward_frames` and `fx_original_trace` lines are rewritten;
    in oomdoctor's key the host becomes "<host>", the pid None, and argv values and the exception's
    message and traceback have their paths redacted. Everything else stays as torch wrote it.
    """
    done: set[int] = set()

    def frames(stack: Any) -> None:
        if not isinstance(stack, list):
            return
        for frame in stack:
            if not isinstance(frame, dict) or id(frame) in done:
                continue
            done.add(id(frame))
            if isinstance(frame.get("filename"), str):
                frame["filename"] = redactor.path(frame["filename"])
            if isinstance(frame.get("fx_original_trace"), str):
                frame["fx_original_trace"] = redactor.text(frame["fx_original_trace"])

    def holder(item: Any) -> None:
        if not isinstance(item, dict):
            return
        frames(item.get("frames"))
        lines = item.get("forward_frames")
        if isinstance(lines, list):
            item["forward_frames"] = [redactor.text(line) if isinstance(line, str) else line for line in lines]
        history = item.get("history")
        if isinstance(history, list):
            for entry in history:
                if isinstance(entry, dict):
                    frames(entry.get("frames"))

    segments = data.get("segments") if isinstance(data, dict) else data
    for segment in segments if isinstance(segments, list) else ():
        holder(segment)
        if isinstance(segment, dict) and isinstance(segment.get("blocks"), list):
            for block in segment["blocks"]:
                holder(block)
    if isinstance(data, dict):
        for trace in data.get("device_traces") or ():
            for event in trace if isinstance(trace, list) else ():
                holder(event)
        meta = data.get(METADATA_KEY)
        if isinstance(meta, dict):
            _redact_metadata(meta, redactor)
    return data


def _redact_metadata(meta: dict[str, Any], redactor: Redactor) -> None:
    if "host" in meta:
        meta["host"] = HOST
    if "pid" in meta:
        meta["pid"] = None
    if isinstance(meta.get("argv"), list):
        meta["argv"] = [redactor.text(a) if isinstance(a, str) else a for a in meta["argv"]]
    exception = meta.get("exception")
    if isinstance(exception, dict):
        for key in ("message", "traceback"):
            if isinstance(exception.get(key), str):
                exception[key] = redactor.text(exception[key])


def redactor_for_data(data: Any) -> Redactor:
    """A redactor that learns from a dump's plain data (as `Redactor.from_snapshot` does from the model)."""
    filenames: set[str] = set()
    scripts: set[str] = set()
    seen: set[int] = set()

    def stack(frames: Any) -> None:
        if not isinstance(frames, list) or not frames or id(frames) in seen:
            return
        seen.add(id(frames))
        names = [f.get("filename") for f in frames if isinstance(f, dict) and isinstance(f.get("filename"), str)]
        filenames.update(names)
        if names:
            scripts.add(names[-1])

    segments = data.get("segments") if isinstance(data, dict) else data
    for segment in segments if isinstance(segments, list) else ():
        if isinstance(segment, dict):
            stack(segment.get("frames"))
            for block in segment.get("blocks") or ():
                if isinstance(block, dict):
                    stack(block.get("frames"))
                    for entry in block.get("history") or ():  # torch 2.0's per-block history
                        if isinstance(entry, dict):
                            stack(entry.get("frames"))
    meta: Mapping[str, Any] = {}
    if isinstance(data, dict):
        for trace in data.get("device_traces") or ():
            for event in trace if isinstance(trace, list) else ():
                if isinstance(event, dict):
                    stack(event.get("frames"))
        if isinstance(data.get(METADATA_KEY), dict):
            meta = data[METADATA_KEY]
    host = meta.get("host")
    pid = meta.get("pid")
    return Redactor.learn(
        host=host if isinstance(host, str) else None,
        pid=pid if isinstance(pid, int) else None,
        texts=_metadata_texts(meta),
        filenames=filenames,
        script_filenames=scripts,
    )
