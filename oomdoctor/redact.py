"""Take personal details out of a dump or a report before it is shared: host and user names, home
directories and other absolute path prefixes, paths in argv and messages, process ids.

A path keeps what makes it useful to whoever reads the report:

    /home/alice/venv/lib/python3.11/site-packages/torch/nn/modules/module.py
                                        -> <env>/site-packages/torch/nn/modules/module.py
    /usr/lib/python3.11/threading.py    -> <env>/lib/python3.11/threading.py
    /home/alice/llm/src/train.py        -> <project>/src/train.py   (the project's root: below)
    /scratch/alice/data/shard-3.bin     -> <path>/shard-3.bin
    oom-rank0-gpu-node-7-4242-20250101T000000Z.pickle -> oom-rank0-<host>-<pid>-20250101T000000Z.pickle

The project's root is the deepest directory holding every file of the program's own frames (those
outside site-packages and the standard library), unless that is a home directory or shallower; then
it is the directory of each script that began a stack. User names (from home-directory paths
anywhere in the dump) and the host name are replaced wherever they appear as a whole word,
case-sensitively, and so is the dump's own pid when it has four digits or more; any number that
text calls a process id ("Process 4242 has 79.10 GiB memory in use", "pid=4242") becomes "<pid>".

`Redactor.from_snapshot` learns those names from the model; `redact_analysis` and
`redact_environment` rewrite results for the reports; `redact_snapshot_data` rewrites the plain
data of a dump in place. It knows every key torch and oomdoctor write (`_TOP` and the schemas under
it): file names are redacted as paths; free text (function names, messages, tracebacks, argv,
`user_metadata`, `compile_context`, annotation names, `forward_frames`, tensor names) as text; fixed
vocabulary (`action`, `state`, `segment_type`, `stage`, phases, ...) and numbers are kept, so the
copy loads and gives the same verdict. A string under any other key is replaced by "<redacted>":
what is not known is not kept.

Each step is linear in the length of its text: no pattern here can backtrack over what it has read,
and the learned names are found in one pass over the text's words, however many there are. Pure
Python; nothing here opens files.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import operator
import posixpath
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from itertools import repeat
from typing import Any

from oomdoctor.analysis.environment import Environment
from oomdoctor.analysis.results import ComponentShare, Facts
from oomdoctor.metadata import METADATA_KEY
from oomdoctor.model import Frame, Snapshot, slashed

ENV = "<env>"
PROJECT = "<project>"
OTHER_PATH = "<path>"
HOST = "<host>"
USER = "<user>"
PID = "<pid>"
REDACTED = "<redacted>"

# walk's memo: redacted paths, redacted texts, and id -> (an object met, what it became)
_WalkMemo = tuple[dict[str, str], dict[str, str], dict[int, tuple[Any, Any]]]

_PACKAGES = re.compile(r"/(?:site|dist)-packages/")
_STDLIB = re.compile(r"/lib/python\d+(?:\.\d+)?t?/", re.IGNORECASE)
_HOME = re.compile(r"^(?:/home/|/Users/|/usr/home/|/export/home/|[A-Za-z]:/(?:Users|Documents and Settings)/)([^/]+)")
_ABSOLUTE = re.compile(r"^(?:/|~/|[A-Za-z]:/|//)")
# An absolute path inside free text (a traceback line, an argv value, a message): it starts at "/",
# "~/" or "C:\" that no word character, ":" or "/" precedes, so URLs and "and/or" are left alone.
_PATH_IN_TEXT = re.compile(r"(?<![\w:/.~\\<>-])(?:~?/|[A-Za-z]:[\\/])[^\s'\"`()\[\]{},;|<>]+")
# oomdoctor's dump names, {kind}-rank{R}-{host}-{pid}-{UTC time}[-N].pickle, are found from their
# fixed end (_DUMP_TAIL: pid and time) and then the leftmost "{kind}-rank{R}-" (_DUMP_HEAD) before it
# in the same token of file-name characters; what lies between is the host. Possessive quantifiers,
# and each stretch of a token searched for a head once, keep this linear (one pattern with a lazy
# host group was cubic: 99 s for 128 KB).
_DUMP_TOKEN = re.compile(r"[A-Za-z0-9._-]+")
_DUMP_TAIL = re.compile(r"-\d++-(\d{8}T\d{6}Z(?:-\d++)?\.pickle)")
_DUMP_HEAD = re.compile(r"\b[A-Za-z]++-rank\d++-")
# Numbers that text calls a process id: torch's "Process 4242 has 79.10 GiB memory in use" (one per
# process on the device, other users' included), "pid 4242", "pid=4242", "'pid': 4242".
_PID_IN_TEXT = re.compile(r"\b(?:([Pp]rocess )\d++(?= has\b)|((?:pid|PID|Pid)\b[\"']?+[ \t]*+[=:#]?+[ \t]*+)\d++)")
# A word: the unit host and user names are matched on (letters and digits; "_", "-", "." separate).
_WORD = re.compile(r"[^\W_]+")
# Words that name no one even when they are a user name, and this module's own placeholders.
_NOT_PERSONAL = {"root", "env", "project", "path", "host", "user", "pid", "unknown", "localhost", "redacted"}
_WIDE_DIRECTORIES = {"", "/", "~", ".", "/root", "/home", "/Users", "/usr", "/usr/home", "/export/home"}
_FRAME_SAMPLE_EVENTS = 20000  # trace events, from the newest, whose stacks teach the project's root
_NAME_MAX = 255  # longer is no file-name component (NAME_MAX) and no host name (253): not learned
_ROOT_MAX = 4096  # PATH_MAX: a longer directory is no project root
_ROOTS_MAX = 32  # more script directories than this: no project root, every own file is <path>/name
_PID_MIN = 1000  # smaller pids are replaced only where text says "pid" or "Process"
_PID_LIMIT = 1 << 32  # above any operating system's process ids
_PREFILTER_NAMES = 16  # up to this many names, a text that holds none of them is passed over at C speed
_NAMES_PER_PATTERN = 256  # names in one trie pattern; each step of the engine tries at most this many ways on
_DEPTH_MAX = 40  # nesting kept under keys nobody knows; anything deeper becomes "<redacted>"
# Fields of result objects that hold fixed vocabulary (verdicts, phases, methods), never a path or name.
_VOCABULARY_FIELDS = frozenset(
    {"verdict", "kind", "case", "phase", "target_phase", "phase_source", "source", "component", "method", "metric", "pool",
     "target_kind", "id", "source_format"}
)  # fmt: skip


def _is_library(path: str) -> bool:
    return bool(_PACKAGES.search(path) or _STDLIB.search(path))


def _too_shallow(directory: str) -> bool:
    """True for "/", "/home", a home directory itself, "C:/Users/alice": too wide to call a project."""
    home = _HOME.match(directory + "/")
    if home and len(directory) <= home.end():
        return True
    return directory.rstrip("/") in _WIDE_DIRECTORIES or bool(re.fullmatch(r"[A-Za-z]:(?:/Users)?/?", directory))


def _core(name: str) -> str:
    """`name` from its first letter or digit to its last: what is matched of it ("" when it has none)."""
    words = list(_WORD.finditer(name))
    return name[words[0].start() : words[-1].end()] if words else ""


def _is_name(name: str) -> bool:
    """Whether a learned host or user name is worth replacing: short enough to be one, and a word in it
    that is not one of ours ("<host>" from a redacted dump is no host name)."""
    if len(name) > _NAME_MAX:
        return False
    core = _core(name)
    return bool(core) and core.lower() not in _NOT_PERSONAL and name.lower() not in _NOT_PERSONAL


class _Names:
    """Names to replace in text, each where it stands as a whole word, found by one pattern per 256 names.

    Only a name's core counts, from its first letter or digit to its last ("_svc" is matched as
    "svc"). The pattern is a trie of the cores, so that at each place in the text the regex engine
    follows one path of it: linear in the text whatever the names, with no Python step per word.
    """

    def __init__(self, names: Iterable[tuple[str, str]]) -> None:
        self.placeholders: dict[str, str] = {}
        for name, placeholder in names:
            if core := _core(name):
                self.placeholders.setdefault(core, placeholder)
        cores = sorted(self.placeholders, key=len, reverse=True)  # a longer name is replaced first
        self.patterns = [
            re.compile(rf"(?<![^\W_]){_trie(cores[i : i + _NAMES_PER_PATTERN])}(?![^\W_])")
            for i in range(0, len(cores), _NAMES_PER_PATTERN)
        ]
        self.prefilter = cores if len(cores) <= _PREFILTER_NAMES else None

    def replace(self, text: str) -> str:
        if not self.patterns or not text:
            return text
        if self.prefilter is not None and not any(core in text for core in self.prefilter):
            return text
        for pattern in self.patterns:
            text = pattern.sub(self._placeholder, text)
        return text

    def _placeholder(self, match: re.Match[str]) -> str:
        if _inside_number(match.string, match.start(), match.end()):
            return match.group()
        return self.placeholders[match.group()]


def _trie(words: list[str]) -> str:
    """A pattern matching exactly `words` as a trie, (?:ab(?:c|d)?|x), that tries the longer of two
    words one of which begins the other first."""
    root: dict[str, Any] = {}
    for word in words:
        node = root
        for char in word:
            node = node.setdefault(char, {})
        node[""] = {}  # a word ends here
    return _trie_branches(root, optional=False)


def _trie_branches(node: dict[str, Any], optional: bool) -> str:
    branches = []
    for char, child in node.items():
        if not char:
            continue
        run = char
        while len(child) == 1 and "" not in child:  # one way on: no branch, no end
            ((char, child),) = child.items()
            run += char
        branches.append(re.escape(run) + _trie_branches(child, optional="" in child))
    if not branches:
        return ""
    return f"(?:{'|'.join(branches)}){'?' if optional else ''}"


def _inside_number(text: str, start: int, stop: int) -> bool:
    """Whether the digits text[start:stop] are part of a decimal number such as 1.4242 or 4242.5."""
    if not text[start:stop].isdigit():
        return False
    before = start >= 2 and text[start - 1] == "." and text[start - 2].isdigit()
    return before or (stop + 1 < len(text) and text[stop] == "." and text[stop + 1].isdigit())


def _pid_placeholder(match: re.Match[str]) -> str:
    return f"{match.group(1) or match.group(2)}{PID}"


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
        if isinstance(host, str) and _is_name(host):
            hosts.append(host)
            short = host.split(".")[0]
            if short != host and len(short) > 1 and _is_name(short):
                hosts.append(short)
        filenames = {slashed(f) for f in filenames if isinstance(f, str)}
        scripts = {slashed(f) for f in script_filenames if isinstance(f, str)}
        paths = set(filenames) | scripts
        for text in texts:
            if isinstance(text, str):
                paths.update(slashed(m.group(0)) for m in _PATH_IN_TEXT.finditer(text))
        users = sorted({m.group(1) for p in paths if (m := _HOME.match(p)) and _is_name(m.group(1))})
        own = [f for f in filenames | scripts if _ABSOLUTE.match(f) and not _is_library(f)]
        roots: set[str] = set()
        if own:
            common = (
                posixpath.commonpath([posixpath.dirname(f) for f in own]) if len({f[:1] for f in own}) == 1 else "/"
            )
            if not _too_shallow(common):
                roots.add(common)
            else:
                roots.update(
                    d
                    for f in scripts
                    if _ABSOLUTE.match(f) and not _is_library(f) and not _too_shallow(d := posixpath.dirname(f))
                )
        roots = {r for r in roots if len(r) <= _ROOT_MAX}
        if len(roots) > _ROOTS_MAX:
            roots = set()
        return cls(
            hosts=tuple(sorted(hosts, key=len, reverse=True)),
            users=tuple(sorted(users, key=len, reverse=True)),
            # a process id is a small positive int (a hostile one can have 16,000 bits)
            pids=(pid,) if isinstance(pid, int) and not isinstance(pid, bool) and 0 < pid < _PID_LIMIT else (),
            project_roots=tuple(sorted(roots, key=len, reverse=True)),
        )

    @classmethod
    def from_snapshot(cls, snapshot: Snapshot) -> Redactor:
        filenames: set[str] = set()
        scripts: set[str] = set()
        texts: set[str] = set()

        seen_stacks: set[int] = set()  # each stack once, however many blocks or events share it

        def stack(frames: tuple[Frame, ...]) -> None:
            if frames and id(frames) not in seen_stacks:
                seen_stacks.add(id(frames))
                filenames.update(f.filename for f in frames)
                scripts.add(frames[-1].filename)

        for frames in snapshot.segment_stacks():
            stack(frames)
        for trace in snapshot.traces:
            for index in range(max(0, len(trace) - _FRAME_SAMPLE_EVENTS), len(trace)):
                if trace.has_frames_at(index):
                    stack(trace.frames_at(index))
            for column in (trace.user_metadata, trace.compile_contexts):
                texts.update(v for v in set(column or ()) if isinstance(v, str))
            for lines in _by_id(trace.forward_frames.values()).values():  # the loader shares them as the file does
                texts.update(lines)
        texts.update(a.name for a in snapshot.annotations)
        # every string of the key as written (unknown keys included), host and pid as parsed
        texts.update(_strings_in(snapshot.oomdoctor_raw or {}))
        metadata = snapshot.oomdoctor
        return cls.learn(
            host=metadata.host if metadata is not None else None,
            pid=metadata.pid if metadata is not None else None,
            texts=texts,
            filenames=filenames,
            script_filenames=scripts,
        )

    # -- strings ---------------------------------------------------------------------------------

    @functools.cached_property
    def _names(self) -> _Names:
        pids = [str(p) for p in self.pids if p >= _PID_MIN]
        return _Names([(h, HOST) for h in self.hosts] + [(u, USER) for u in self.users] + [(p, PID) for p in pids])

    def names(self, text: str) -> str:
        """`text` with the host and user names (and the pid from 1000 up) replaced where they stand as whole words."""
        return self._names.replace(text)

    def path(self, filename: str) -> str:
        """A file name with its personal prefix replaced (see the module docstring)."""
        if not filename:
            return filename
        path = slashed(filename)
        packages = list(_PACKAGES.finditer(path))
        if packages:
            return f"{ENV}{packages[-1].group(0)}{self._kept(path[packages[-1].end() :])}"
        stdlib = _STDLIB.search(path)
        if stdlib and _ABSOLUTE.match(path):
            return f"{ENV}{stdlib.group(0)}{self._kept(path[stdlib.end() :])}"
        for root in self.project_roots:
            if path.startswith(root + "/"):
                return f"{PROJECT}/{self._kept(path[len(root) + 1 :])}"
        if _ABSOLUTE.match(path):
            return f"{OTHER_PATH}/{self._kept(posixpath.basename(path))}"
        return self._kept(filename)

    def _kept(self, part: str) -> str:
        return self.names(self.dump_name(part))

    def dump_name(self, text: str) -> str:
        """oomdoctor dump names with the host and pid replaced."""
        if ".pickle" not in text:
            return text
        pieces: list[str] = []
        done = 0
        for token in _DUMP_TOKEN.finditer(text):
            low, high = token.span()
            if text.find(".pickle", low, high) < 0:
                continue
            position = low  # where the next head may start: each stretch of the token is searched once
            for tail in _DUMP_TAIL.finditer(text, low, high):
                head = _DUMP_HEAD.search(text, position, tail.start() - 1) if tail.start() - 1 > position else None
                if head is None:
                    position = tail.start()
                    continue
                pieces += (text[done : head.end()], f"{HOST}-{PID}-")
                done = position = tail.start(1)
        if not pieces:
            return text
        pieces.append(text[done:])
        return "".join(pieces)

    def text(self, text: str) -> str:
        """Free text (a message, a traceback, an argv value) with every path, name and pid in it redacted."""
        text = _PATH_IN_TEXT.sub(lambda m: self.path(m.group(0)), text)
        text = _PID_IN_TEXT.sub(_pid_placeholder, text)
        return self.names(self.dump_name(text))

    def source(self, source: str) -> str:
        """The name of the file a report was made from."""
        return self.path(source)

    # -- results ---------------------------------------------------------------------------------

    def walk(self, value: Any, _memo: _WalkMemo | None = None) -> Any:
        """`value` (a result object, tuple, dict or string) rebuilt with every path and name redacted.
        An object met again (results share stacks and frames, as blocks and events do) is rebuilt
        once."""
        memo = ({}, {}, {}) if _memo is None else _memo
        texts = memo[1]
        if isinstance(value, str):
            text = texts.get(value)
            if text is None:
                text = texts[value] = self.text(value)
            return text
        if type(value) in _SCALARS:
            return value
        done = memo[2]
        known = done.get(id(value))
        if known is not None:
            return known[1]
        new = self._rebuild(value, memo)
        done[id(value)] = (value, new)  # the original kept, so that its id stays its own
        return new

    def _rebuild(self, value: Any, memo: _WalkMemo) -> Any:
        paths = memo[0]
        if isinstance(value, Frame):
            filename = paths.get(value.filename)
            if filename is None:
                filename = paths[value.filename] = self.path(value.filename)
            name = self.walk(value.name, memo) if isinstance(value.name, str) else value.name
            return value if filename == value.filename and name == value.name else Frame(filename, value.line, name)
        if isinstance(value, Facts):  # the names are the analysis's own; the values may come from the file
            items = tuple((name, self.walk(fact, memo)) for name, fact in value.items)
            return value if all(a[1] is b[1] for a, b in zip(items, value.items)) else Facts(items)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            changes = {}
            for field in dataclasses.fields(value):
                old = getattr(value, field.name)
                if isinstance(old, str) and (
                    field.name in _VOCABULARY_FIELDS or (field.name == "name" and isinstance(value, ComponentShare))
                ):
                    continue
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


def _strings_in(value: Any) -> Iterator[str]:
    """Every string in plain data (keys too), each container visited once and at most _DEPTH_MAX deep."""
    seen: set[int] = set()
    pending = [(value, 0)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, str):
            yield item
        elif isinstance(item, (dict, list, tuple, set, frozenset)) and depth < _DEPTH_MAX and id(item) not in seen:
            seen.add(id(item))
            children = [x for pair in item.items() for x in pair] if isinstance(item, dict) else item
            pending.extend((child, depth + 1) for child in children)


def redact_analysis(analysis: Any, redactor: Redactor) -> Any:
    """The analysis (or any result object) with paths and names redacted; numbers and verdicts unchanged."""
    return redactor.walk(analysis)


_ENVIRONMENT_VOCABULARY = frozenset({"host", "container", "source_format"})


def redact_environment(environment: Environment, redactor: Redactor) -> Environment:
    """The environment without host and pid, and every string in it (argv, versions, device name, the
    environment variables' values) redacted."""
    texts: dict[str, Any] = {
        field.name: redactor.text(value)
        for field in dataclasses.fields(environment)
        if field.name not in _ENVIRONMENT_VOCABULARY and isinstance(value := getattr(environment, field.name), str)
    }
    return dataclasses.replace(
        environment,
        **texts,
        host=HOST if environment.host else None,
        pid=None,
        argv=tuple(redactor.text(a) for a in environment.argv),
        environment_variables=tuple((name, redactor.text(value)) for name, value in environment.environment_variables),
    )


# -- dumps ---------------------------------------------------------------------------------------
#
# What every key torch and oomdoctor write holds. A rule is VOCABULARY (a string from a fixed set, or
# a number: kept as written), NUMBER (a number: kept; a string there is unknown), PATH (a file name),
# TEXT (free text), HOST or PID (oomdoctor's own: replaced outright), a dict of rules for the keys of a
# dict, ("each", rule) for the items of a list, ("entries", rule) for the values of a dict whose keys
# are vocabulary, or TRACES. Anything else, including a value of the wrong type for its rule (a list
# where a number belongs), is redacted as unknown (see _DumpRewriter.unknown).

VOCABULARY, NUMBER, PATH, TEXT, HOST_RULE, PID_RULE = "vocabulary", "number", "path", "text", "host", "pid"
TRACES = ("traces",)  # a list of per-device lists of events (or, for host_traces, of events)


def _each(rule: Any) -> tuple[str, Any]:
    return ("each", rule)


def _entries(rule: Any) -> tuple[str, Any]:
    return ("entries", rule)


def _vocabulary(*keys: str) -> dict[str, str]:
    return dict.fromkeys(keys, VOCABULARY)


def _numbers(*keys: str) -> dict[str, str]:
    return dict.fromkeys(keys, NUMBER)


_FRAME = {
    "filename": PATH, "name": TEXT, "fx_node_name": TEXT, "fx_node_target": TEXT, "fx_original_trace": TEXT,
    "line": NUMBER, "fx_node_op": VOCABULARY,
}  # fmt: skip
_FRAMES = _each(_FRAME)
_LINES = _each(TEXT)
_BLOCK = {
    "frames": _FRAMES, "forward_frames": _LINES, "state": VOCABULARY,
    "history": _each({"frames": _FRAMES, "cpp_frames": _FRAMES, **_numbers("addr", "real_size")}),  # torch 2.0
    **_numbers("address", "size", "requested_size"),
}  # fmt: skip
_SEGMENT = {
    "blocks": _each(_BLOCK), "frames": _FRAMES, "forward_frames": _LINES, "segment_type": VOCABULARY,
    "segment_pool_id": _each(NUMBER),
    **_numbers("device", "address", "total_size", "allocated_size", "active_size", "requested_size", "stream", "is_expandable"),
}  # fmt: skip
_EVENT = {
    "frames": _FRAMES, "forward_frames": _LINES, "compile_context": TEXT, "user_metadata": TEXT, "action": VOCABULARY,
    "pool_id": _each(NUMBER), **_numbers("addr", "size", "stream", "time_us", "device_free"),
}  # fmt: skip
_SETTINGS = {
    "PYTORCH_CUDA_ALLOC_CONF": TEXT, "roundup_power2_divisions": _entries(NUMBER),
    **_numbers("max_split_size", "garbage_collection_threshold", "expandable_segments", "pinned_num_register_threads",
               "release_lock_on_cudamalloc", "pinned_use_cuda_host_register", "graph_capture_record_stream_reuse",
               "max_round_threshold", "max_cached_size"),
}  # fmt: skip
_ANNOTATION = {"name": TEXT, "stage": VOCABULARY, **_numbers("device", "time_us")}
_OOM = _numbers("device", "alloc_bytes", "device_total_bytes", "device_free_bytes", "time_us", "surfaced")
_METADATA = {  # oomdoctor/metadata.py
    "host": HOST_RULE, "pid": PID_RULE, "argv": _LINES, "versions": _entries(TEXT), "alloc_conf": _entries(TEXT),
    "device": {"name": TEXT, "capability": _each(NUMBER), **_numbers("index", "total_memory_bytes")},
    "mem_get_info": _entries(NUMBER), "memory_stats": _entries(NUMBER), "oom": _OOM, "ooms_observed": _each(_OOM),
    "exception": {"type": TEXT, "message": TEXT, "traceback": TEXT},
    "markers": _each({**_vocabulary("phase", "edge"), **_numbers("step", "time_us")}),
    "tensors": _each({"name": TEXT, "shape": _each(NUMBER), **_vocabulary("component", "dtype"), **_numbers("address", "device", "size_bytes", "requires_grad")}),
    "recording": {"max_entries": NUMBER, **_vocabulary("stacks", "context", "started_by"),
                  "rearmed": _each({"caller": PATH, **_vocabulary("action", "enabled", "stacks", "context"),
                                    **_numbers("time_us", "max_entries")})},
    "rehearsal": {"alloc_conf": TEXT, **_numbers("device_memory_bytes", "outside_bytes")},
    "environment": _entries(TEXT), "packages": _entries(TEXT),
    "elastic": {"run_id": TEXT, "role_name": TEXT, **_numbers("restart_count", "max_restarts", "group_rank",
                "group_world_size", "role_rank", "role_world_size", "local_world_size")},
    "framework": {"name": TEXT, "version": TEXT, "stage": VOCABULARY, **_numbers("global_step", "epoch")},
    "reason": VOCABULARY, **_numbers("schema_version", "rank", "local_rank", "world_size", "optimizers"),
}  # fmt: skip
_TOP = {
    "segments": _each(_SEGMENT), "device_traces": TRACES, "traces": TRACES,  # the loader's alias
    "host_segments": _each(_SEGMENT), "host_traces": TRACES,  # torch 2.14, pinned host memory
    "allocator_settings": _SETTINGS, "external_annotations": _each(_ANNOTATION), METADATA_KEY: _METADATA,
}  # fmt: skip
_SCALARS = (int, float, complex, bool, type(None))
_VOCABULARY_KINDS = frozenset({str, *_SCALARS})
_NUMBER_KINDS = frozenset(_SCALARS)
_TEXT_KINDS = frozenset({str, type(None)})
_LIST_KINDS = frozenset({list, type(None)})
_SEQUENCE_KINDS = frozenset({list, tuple, type(None)})
_DICT_KINDS = frozenset({dict})


class _DumpRewriter:
    """Applies the rules above to a dump's plain data, in place where it can (dicts and lists).

    Each container is rewritten once however often the pickle shares it (torch shares frame dicts;
    a hostile pickle can share one list under a million dicts), and each distinct string redacted
    once. Dicts and lists stay the objects they were, so their ids (in `visited`) stay theirs; tuples
    and sets are rebuilt, and `rebuilt` keeps each original alive next to what replaced it.
    """

    def __init__(self, redactor: Redactor, columns: _ListColumns | None = None) -> None:
        self.redactor = redactor
        self.columns = _ListColumns() if columns is None else columns
        self.paths: dict[str, str] = {}
        self.texts: dict[str, str] = {}
        self.visited: set[int] = set()
        self.rebuilt: dict[int, tuple[Any, Any]] = {}
        self.rebuilt_keys: dict[int, tuple[Any, Any]] = {}  # a tuple can be a key here and a value there

    def path(self, value: str) -> str:
        done = self.paths.get(value)
        if done is None:
            done = self.paths[value] = self.redactor.path(value)
        return done

    def text(self, value: str) -> str:
        done = self.texts.get(value)
        if done is None:
            done = self.texts[value] = self.redactor.text(value)
        return done

    def apply(self, rule: Any, value: Any, depth: int) -> Any:
        if rule is HOST_RULE:
            return HOST
        if rule is PID_RULE:
            return None
        kind = type(value)
        if kind in _SCALARS:
            return value
        if kind is str:
            if rule is VOCABULARY:
                return value
            if rule is PATH:
                return self.path(value)
            if rule is TEXT:
                return self.text(value)
        elif kind is dict and type(rule) is dict:
            return self.fields(value, rule, depth)
        elif type(rule) is tuple:
            if kind is dict and rule[0] == "entries":
                return self.fields(value, _NO_RULES, depth, other=rule[1])
            if kind in (list, tuple) and rule[0] == "each":
                return self.each(value, rule[1], depth)
            if kind is list and rule is TRACES:
                return self.traces(value, depth)
        return self.unknown(value, depth)

    def fields(self, value: dict[Any, Any], rules: dict[str, Any], depth: int, other: Any = None) -> dict[Any, Any]:
        """A dict whose keys in `rules` hold what their rule says; its other string keys hold `other`
        (keys kept) or, when `other` is None, are unknown (keys redacted as text, values as unknown)."""
        if id(value) in self.visited:
            return value
        self.visited.add(id(value))
        renamed = False
        for key, item in value.items():  # values are replaced in place: the dict keeps its size
            rule = rules.get(key, other) if type(key) is str else None
            if rule is None:
                new = self.unknown(item, depth + 1)
                renamed = renamed or self.key(key, depth) != key
            elif type(item) is str:
                if rule is VOCABULARY:
                    continue
                new = (
                    self.text(item)
                    if rule is TEXT
                    else self.path(item)
                    if rule is PATH
                    else self.apply(rule, item, depth + 1)
                )
            elif type(item) in _SCALARS and rule is not HOST_RULE and rule is not PID_RULE:
                continue
            else:
                new = self.apply(rule, item, depth + 1)
            if new is not item:
                value[key] = new
        if renamed:
            items = [
                (k if type(k) is str and rules.get(k, other) is not None else self.key(k, depth), v)
                for k, v in value.items()
            ]
            value.clear()
            value.update(items)  # in their order; two keys redacted alike become one
        return value

    def each(self, value: list[Any] | tuple[Any, ...], rule: Any, depth: int) -> Any:
        if isinstance(value, tuple):
            return self._rebuilt(value, lambda: tuple(self.apply(rule, v, depth + 1) for v in value))
        if id(value) in self.visited:
            return value
        self.visited.add(id(value))
        if type(rule) is dict and set(map(type, value)) <= _DICT_KINDS:
            self._dicts(value, rule, depth + 1)
            return value
        for index, item in enumerate(value):
            new = self.apply(rule, item, depth + 1)
            if new is not item:
                value[index] = new
        return value

    def _dicts(self, items: list[dict[Any, Any]], rules: dict[str, Any], depth: int) -> None:
        """Many dicts under one rule (a trace's events, every stack's frames) a column at a time, as
        the loader reads them: each dict met once, each column checked and rewritten with C-level
        passes, each distinct string redacted once. Dicts with a key or a value of a kind this way
        does not cover are rewritten one by one (`fields`)."""
        fresh = self._unvisited(items)
        if not fresh:
            return
        columns = {key: tuple(map(dict.get, fresh, repeat(key))) for key in set().union(*fresh)}  # None: no such key
        plan = []
        slow_keys = set()
        for key, column in columns.items():
            rule = rules.get(key) if type(key) is str else None
            kinds = set(map(type, column)) if rule is not None else set()
            if (rule is NUMBER and kinds <= _NUMBER_KINDS) or (rule is VOCABULARY and kinds <= _VOCABULARY_KINDS):
                continue
            if type(rule) is tuple and rule[1] is NUMBER and kinds <= _SEQUENCE_KINDS:  # pool ids, shapes: all numbers?
                if set(map(type, itertools.chain.from_iterable(filter(None, column)))) <= _NUMBER_KINDS:
                    continue
            if ((rule is TEXT or rule is PATH) and kinds <= _TEXT_KINDS) or (
                type(rule) is tuple and rule[0] == "each" and kinds <= _LIST_KINDS
            ):
                plan.append((key, rule, column))
            else:
                slow_keys.add(key)
        if slow_keys:  # one by one the dicts that have such a key; the others again, the fast way
            self.visited.difference_update(map(id, fresh))
            rest = [d for d in fresh if slow_keys.isdisjoint(d)]
            for item in fresh:
                if not slow_keys.isdisjoint(item):
                    self.fields(item, rules, depth)
            if rest:
                self._dicts(rest, rules, depth)
            return
        for key, rule, column in plan:
            if rule is TEXT or rule is PATH:
                redact = self.text if rule is TEXT else self.path
                changed = {}
                for value in set(column):
                    if value is not None and (new := redact(value)) != value:
                        changed[value] = new
                if changed:
                    for item, value in zip(fresh, column):
                        if value in changed:
                            item[key] = changed[value]
                continue
            lists, inner = self.columns.read(column, self.visited)  # the non-empty lists not yet met, their items
            if type(rule[1]) is dict and set(map(type, inner)) <= _DICT_KINDS:
                self.visited.update(map(id, lists))
                self._dicts(inner, rule[1], depth + 2)
            else:
                for value in lists:
                    self.each(value, rule[1], depth + 1)

    def _unvisited(self, items: list[Any]) -> list[Any]:
        """`items` met for the first time, each once, in their order (the order they lie in memory);
        they are marked visited."""
        by_id = dict(zip(map(id, items), items))
        if self.visited.isdisjoint(by_id):
            fresh = list(by_id.values())
        else:
            fresh = [item for key, item in by_id.items() if key not in self.visited]
        self.visited.update(by_id)
        return fresh

    def traces(self, value: list[Any], depth: int) -> list[Any]:
        """A list of per-device lists of events, or of events (torch 2.14's host_traces may be either)."""
        if id(value) not in self.visited:
            self.visited.add(id(value))
            self._dicts([item for item in value if type(item) is dict], _EVENT, depth + 1)
            for index, item in enumerate(value):
                if type(item) is not dict:
                    new = self.each(item, _EVENT, depth + 1) if type(item) is list else self.unknown(item, depth + 1)
                    if new is not item:
                        value[index] = new
        return value

    def _rebuilt(self, value: Any, build: Callable[[], Any], rebuilt: dict[int, tuple[Any, Any]] | None = None) -> Any:
        rebuilt = self.rebuilt if rebuilt is None else rebuilt
        done = rebuilt.get(id(value))
        if done is not None:
            return done[1]
        rebuilt[id(value)] = (value, REDACTED)  # a tuple that contains itself (through a list) ends here
        new = build()
        rebuilt[id(value)] = (value, new)
        return new

    def unknown(self, value: Any, depth: int) -> Any:
        """A value under a key nobody knows: numbers kept, strings "<redacted>", containers walked (keys
        redacted as text) down to _DEPTH_MAX levels, below which the whole value is "<redacted>"."""
        kind = type(value)
        if kind in _SCALARS:
            return value
        if kind is str:
            return REDACTED if value else value
        if kind in (bytes, bytearray):
            return kind(REDACTED.encode()) if value else value
        if depth >= _DEPTH_MAX:
            return REDACTED
        if kind is dict:
            return self.fields(value, _NO_RULES, depth)
        if kind is list:
            if id(value) not in self.visited:
                self.visited.add(id(value))
                for index, item in enumerate(value):
                    new = self.unknown(item, depth + 1)
                    if new is not item:
                        value[index] = new
            return value
        if kind is tuple:
            return self._rebuilt(value, lambda: tuple(self.unknown(v, depth + 1) for v in value))
        if kind in (set, frozenset):
            return self._rebuilt(value, lambda: kind(self.key(v, depth + 1) for v in value))
        return REDACTED

    def key(self, key: Any, depth: int) -> Any:
        """A dict key (or set member) nobody knows, redacted as text so that keys stay distinct."""
        kind = type(key)
        if kind is str:
            return self.text(key)
        if kind in (bytes, bytearray) and key:
            return REDACTED.encode()
        if kind in (tuple, frozenset):
            if depth >= _DEPTH_MAX:
                return REDACTED
            return self._rebuilt(key, lambda: kind(self.key(k, depth + 1) for k in key), self.rebuilt_keys)
        return key


_NO_RULES: dict[str, Any] = {}


def redact_data(data: Any) -> Any:
    """Redact a dump's plain data in place with what it teaches (`redactor_for_data`) and return it,
    as `redact_snapshot_data(data, redactor_for_data(data))` does, reading each column of stacks once
    for both."""
    columns = _ListColumns()
    return redact_snapshot_data(data, redactor_for_data(data, columns), columns)


def redact_snapshot_data(data: Any, redactor: Redactor, _columns: _ListColumns | None = None) -> Any:
    """Redact a dump's plain data (a snapshot dict or a bare segment list) in place and return it.

    Every string is redacted by what its key holds (see the rules above `_DumpRewriter`): file names
    as paths, free text as text, vocabulary kept; in oomdoctor's key the host becomes "<host>" and the
    pid None; strings under keys nobody knows become "<redacted>". Numbers and the shape stay.
    """
    rewriter = _DumpRewriter(redactor, _columns)
    if type(data) is list:
        return rewriter.each(data, _SEGMENT, 0)
    return rewriter.apply(_TOP, data, 0)


def redactor_for_data(data: Any, _columns: _ListColumns | None = None) -> Redactor:
    """A redactor that learns from a dump's plain data (as `Redactor.from_snapshot` does from the model).

    The project's root comes from the frames the loader reads; user names also from every other
    path in the dump: pinned-host frames, messages, metadata, user_metadata, annotation names.
    Lists of events, blocks and frames are read a column at a time, as `_DumpRewriter` does.
    """
    filenames: set[str] = set()
    scripts: set[str] = set()
    texts: set[str] = set()
    seen: set[int] = set()
    columns = _ListColumns() if _columns is None else _columns

    def stacks(column: list[Any], own: bool) -> None:
        lists, items = columns.read(column, seen, remember=True)
        seen.update(map(id, lists))
        frames = [f for f in items if type(f) is dict]
        names = _strings(list(map(dict.get, frames, repeat("filename"))))
        outermost = [f.get("filename") for f in _by_id(map(operator.itemgetter(-1), lists)).values() if type(f) is dict]
        if own:
            filenames.update(names)
            scripts.update(_strings(outermost))
        else:
            texts.update(names)

    def holders(items: Any, own: bool = True) -> list[dict[Any, Any]]:
        """Learn from a list of segments, blocks or events; return its dicts."""
        items = [item for item in items if type(item) is dict] if type(items) is list else []
        stacks(list(map(dict.get, items, repeat("frames"))), own)
        for key in ("user_metadata", "compile_context"):
            texts.update(_strings(list(map(dict.get, items, repeat(key)))))
        for lines in _by_id(filter(None, map(dict.get, items, repeat("forward_frames")))).values():
            if type(lines) is list:
                texts.update(_strings(lines))
        return items

    # each list once below, however often a pickle shares it (torch shares none of them)
    def nested(items: list[dict[Any, Any]], key: str) -> list[Any]:
        lists = _by_id(v for v in map(dict.get, items, repeat(key)) if type(v) is list)
        return list(itertools.chain.from_iterable(lists.values()))

    def segments(items: Any, own: bool = True) -> None:
        blocks = holders(nested(holders(items, own), "blocks"), own)
        history = [entry for entry in nested(blocks, "history") if type(entry) is dict]  # torch 2.0's per-block history
        stacks(list(map(dict.get, history, repeat("frames"))), own)

    def traces(items: Any, own: bool = True) -> None:
        for trace in _by_id(items).values() if type(items) is list else ():
            holders(trace if type(trace) is list else [trace], own)

    meta: Mapping[str, Any] = {}
    if isinstance(data, dict):
        segments(data.get("segments"))
        traces(
            data["device_traces"] if data.get("device_traces") is not None else data.get("traces")
        )  # as the loader reads them
        segments(data.get("host_segments"), own=False)
        traces(data.get("host_traces"), own=False)
        annotations = data.get("external_annotations")
        if type(annotations) is list:
            texts.update(_strings([a.get("name") for a in annotations if type(a) is dict]))
        if isinstance(data.get(METADATA_KEY), dict):
            meta = data[METADATA_KEY]
            texts.update(_strings_in(meta))
    else:
        segments(data)
    host = meta.get("host")
    pid = meta.get("pid")
    return Redactor.learn(
        host=host if isinstance(host, str) else None,
        pid=pid if isinstance(pid, int) else None,
        texts=texts,
        filenames=filenames,
        script_filenames=scripts,
    )


class _ListColumns:
    """The lists in a column of values (each event's frames, each segment's blocks) and the distinct
    items in them, worked out once for the two passes of redacting a dump (`redact_data`): learning
    names and rewriting read the same columns, and finding the few thousand distinct frames among a
    million stacks of thirty is the costly part.

    What a pass remembers is given to a later `read` of a column that holds the very same objects in
    the same order, checked object by object; the lists' items are not written between the passes
    (the rewriter changes a list's items only after marking it visited, and visited lists are skipped).
    """

    def __init__(self) -> None:
        self._known: list[tuple[Sequence[Any], list[list[Any]], list[Any]]] = []

    def read(self, column: Sequence[Any], skip: set[int], remember: bool = False) -> tuple[list[list[Any]], list[Any]]:
        """The lists in `column` whose ids are not in `skip`, each once, in order; and the items in
        them, each object once, in order. Anything else in `column` (None, empty lists, other values)
        is left out. A remembered reading is given once and then forgotten."""
        found = None
        for index, known in enumerate(self._known):
            if len(known[0]) == len(column) and all(map(operator.is_, known[0], column)):
                found = known if remember else self._known.pop(index)
                break
        if found is None:
            lists = list(_by_id(filter(None, column)).values())
            if not set(map(type, lists)) <= _LIST_KINDS:
                lists = [value for value in lists if type(value) is list]
            found = (column, lists, _distinct_items(lists))
            if remember:
                self._known.append(found)
        _, lists, items = found
        if skip.isdisjoint(map(id, lists)):
            return lists, items
        lists = [value for value in lists if id(value) not in skip]
        return lists, _distinct_items(lists)


def _by_id(items: Iterable[Any]) -> dict[int, Any]:
    """Each object of `items` once, in order, by its id."""
    items = list(items)
    return dict(zip(map(id, items), items))


def _distinct_items(lists: list[list[Any]]) -> list[Any]:
    """The items of all `lists`, each object once, in order, without a list of them all (a million
    stacks of thirty frames share a few thousand frame dicts)."""
    chain = itertools.chain.from_iterable
    return list(dict(zip(map(id, chain(lists)), chain(lists))).values())


def _strings(values: list[Any]) -> set[str]:
    """The distinct strings among `values` (a column that may hold anything)."""
    if set(map(type, values)) <= _TEXT_KINDS:
        strings = set(values)
        strings.discard(None)
        return strings
    return {v for v in values if type(v) is str}
