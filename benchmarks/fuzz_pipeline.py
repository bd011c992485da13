"""Fuzz the whole pipeline: every mutated dump must give a report or one line on stderr, never worse.

    python benchmarks/fuzz_pipeline.py --cases 100000 --workers 2 --seed 0 [--out DIR]
    python benchmarks/fuzz_pipeline.py --case 1234 [--seed 0] [--save FILE]   # one case, in-process
    python benchmarks/fuzz_pipeline.py --input FILE                           # a saved input, in-process

Each case builds one input from a seed dump, deterministically from (--seed, case number), with
one of five strategies (those of shared/reference/hostile-inputs/FINDINGS.md):

  byte       bit flips, truncation, inserted/deleted/duplicated chunks, interesting ints
  opcode     on pickletools.genops: int/str/memo arguments, deleted/duplicated/swapped ops, a
             scalar replaced by deep nesting, a DUP "laughs" or hash bomb, or a refused opcode
  value      the seed as data (oomdoctor.load.load_raw), one to three snapshot-aware mutations
             (sizes, huge ints, NaN, wrong types, missing keys, Unicode digits, control/markup/
             Markdown payloads, metadata, allocator settings, deep nesting, shared-list laughs,
             one long trace, blocks, frames or forward_frames list shared by thousands of places),
             written back as pickle protocol 0-5, gzip, JSON or memory_viz HTML
  splice     two seeds: bytes cut at opcode boundaries, or a subtree of one grafted into the other
  container  gzip (nested, truncated, trailing garbage), HTML (bad base64, nested), BOM, UTF-16

and runs it through what the CLI does, via `oomdoctor.cli.main` with stdout and stderr captured:
`report` as text, md and json, each plain and --redact; `info` as text and json; `redact IN OUT`;
then the terminal app's content builders (oomdoctor/tui/content.py, no running App).

Each verb's run is "clean" (exit 0/1 with output), "rejected" (exit 2 and exactly one stderr line
starting with "oomdoctor:"), or a failure: an uncaught exception, another exit code, a rejection
of more or longer lines, a raw control character (C0 but \\t and \\n, DEL, C1) in text, Markdown,
info or stderr output or in a TUI string, JSON output that does not parse, a worker over the
memory cap (RLIMIT_AS, and peak RSS), a hang (one verb over --time-limit) or a crash (a signal).
Hangs and crashes are located with faulthandler. Seeds are the fixture dumps and, when present, the corpus
(OOMDOCTOR_CORPUS or ../shared/corpus), reduced to a few segments and events so cases stay fast.
"""

from __future__ import annotations

import argparse
import base64
import codecs
import contextlib
import faulthandler
import gzip
import io
import json
import marshal
import multiprocessing
import multiprocessing.connection
import os
import pickle
import pickletools
import random
import re
import reprlib
import resource
import shutil
import signal
import struct
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import orjson  # noqa: E402

from oomdoctor.supervise import REFUSED_AFTER_CRASH, REFUSED_AFTER_LIMIT  # noqa: E402

PACKAGE_DIR = ROOT / "oomdoctor"
STRATEGIES = ("byte", "opcode", "value", "splice", "container")
STRATEGY_WEIGHTS = (25, 25, 35, 7, 8)
OUTCOMES = ("clean", "rejected", "failure", "memory", "hang", "crash", "generator-error")
# C0 controls except tab and newline, DEL and C1: what must never reach a terminal raw.
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
MAX_ERROR_LINE_CHARS = 10_000


# --- seeds --------------------------------------------------------------------------------------


def corpus_dir() -> Path | None:
    env = os.environ.get("OOMDOCTOR_CORPUS")
    candidate = Path(env) if env else ROOT.parent / "shared" / "corpus"
    return candidate if candidate.is_dir() else None


def copy_data(data: Any) -> Any:
    return marshal.loads(marshal.dumps(data))


@dataclass
class Seed:
    name: str
    data: Any
    _encoded: dict[str, bytes] = field(default_factory=dict, repr=False)

    _spans: dict[str, list] = field(default_factory=dict, repr=False)

    def encoded(self, kind: str) -> bytes:
        if kind not in self._encoded:
            self._encoded[kind] = _encode_seed(self.data, kind)
        return self._encoded[kind]

    def spans(self, kind: str) -> list[tuple[Any, Any, int, int]]:
        """The ops of the pickle `encoded(kind)`, as `_op_spans` gives them."""
        if kind not in self._spans:
            self._spans[kind] = _op_spans(self.encoded(kind))
        return self._spans[kind]

    def ops_named(self, kind: str, names: frozenset) -> list[int]:
        key = f"{kind}:{sorted(names)}"
        if key not in self._spans:
            self._spans[key] = [i for i, (op, *_) in enumerate(self.spans(kind)) if op.name in names]
        return self._spans[key]


def _encode_seed(data: Any, kind: str) -> bytes:
    if kind.startswith("p"):
        raw = pickle.dumps(data, protocol=int(kind[1]))
        return strip_frames(raw) if kind.endswith("nf") or kind == "p4nf" else raw
    if kind == "json":
        return orjson.dumps(data, option=orjson.OPT_NON_STR_KEYS)
    if kind == "gzip":
        return gzip.compress(pickle.dumps(data, protocol=4), mtime=0)
    raise ValueError(kind)


def strip_frames(raw: bytes) -> bytes:
    """The pickle without FRAME opcodes (framing is optional), so ops can be edited freely."""
    parts, previous = [], 0
    for opcode, _arg, position in pickletools.genops(raw):
        if opcode.name == "FRAME":
            parts.append(raw[previous:position])
            previous = position + 9
    parts.append(raw[previous:])
    return b"".join(parts)


def _frames(stack: Any, limit: int = 6) -> Any:
    return stack[:limit] if isinstance(stack, list) else stack


def reduce_snapshot(data: Any, max_segments: int = 8, max_blocks: int = 48, max_events: int = 120) -> Any:
    """A small copy of a snapshot: a few segments, their blocks, the newest events touching them."""
    if isinstance(data, list):
        return (
            [reduce_segment(s) for s in data[:max_segments]]
            if all(isinstance(s, dict) for s in data[:max_segments])
            else data[:50]
        )
    if not isinstance(data, dict) or not isinstance(data.get("segments"), list):
        return data
    reduced = {key: value for key, value in data.items() if key not in ("segments", "device_traces")}
    segments, block_count = [], 0
    for segment in data["segments"]:
        blocks = segment.get("blocks") if isinstance(segment, dict) else None
        count = len(blocks) if isinstance(blocks, list) else 1
        if len(segments) >= max_segments or (segments and block_count + count > max_blocks):
            continue
        segments.append(reduce_segment(segment))
        block_count += count
    reduced["segments"] = segments
    ranges = [
        (s["address"], s["address"] + s["total_size"])
        for s in segments
        if isinstance(s.get("address"), int) and isinstance(s.get("total_size"), int)
    ]
    traces = data.get("device_traces")
    if isinstance(traces, list):
        kept_traces = []
        for trace in traces:
            events = [
                e
                for e in trace
                if isinstance(e, dict)
                and (e.get("action") == "oom" or any(low <= e.get("addr", -1) < high for low, high in ranges))
            ]
            kept_traces.append([reduce_event(e) for e in events[-max_events:]])
        reduced["device_traces"] = kept_traces
    if isinstance(reduced.get("external_annotations"), list):
        reduced["external_annotations"] = reduced["external_annotations"][:8]
    meta = reduced.get("oomdoctor")
    if isinstance(meta, dict):
        meta = dict(meta)
        tensors = meta.get("tensors")
        if isinstance(tensors, list):
            meta["tensors"] = [
                t
                for t in tensors
                if isinstance(t, dict) and any(low <= t.get("address", -1) < high for low, high in ranges)
            ][:40]
        if isinstance(meta.get("ooms_observed"), list):
            meta["ooms_observed"] = meta["ooms_observed"][:3]
        if isinstance(meta.get("markers"), list):
            meta["markers"] = meta["markers"][-16:]
        reduced["oomdoctor"] = meta
    return reduced


def reduce_segment(segment: Any) -> Any:
    if not isinstance(segment, dict):
        return segment
    segment = dict(segment)
    if isinstance(segment.get("frames"), list):
        segment["frames"] = _frames(segment["frames"])
    if isinstance(segment.get("blocks"), list):
        blocks = []
        for block in segment["blocks"]:
            if isinstance(block, dict):
                block = dict(block)
                block["frames"] = _frames(block.get("frames", []))
                if isinstance(block.get("history"), list):
                    block["history"] = [reduce_event(h) for h in block["history"][-3:]]
            blocks.append(block)
        segment["blocks"] = blocks
    return segment


def reduce_event(event: Any) -> Any:
    if not isinstance(event, dict):
        return event
    event = dict(event)
    if "frames" in event:
        event["frames"] = _frames(event["frames"])
    if isinstance(event.get("forward_frames"), list):
        event["forward_frames"] = event["forward_frames"][:4]
    return event


def minimal_snapshot() -> dict:
    """One 2 MiB segment holding one allocated block, one alloc event (as hostile-inputs/common.py)."""
    address = 0x7F0000000000
    frames = [{"filename": "/home/alice/proj/train.py", "line": 12, "name": "main"}]
    segment = {"device": 0, "address": address, "total_size": 2 << 20, "stream": 0, "segment_type": "large",
               "blocks": [{"address": address, "size": 2 << 20, "requested_size": 2 << 20, "state": "active_allocated", "frames": frames}]}  # fmt: skip
    event = {"action": "alloc", "addr": address, "size": 2 << 20, "stream": 0, "time_us": 1, "frames": frames}
    oom = {"action": "oom", "addr": 0, "size": 8 << 20, "stream": 0, "time_us": 2, "device_free": 0, "frames": frames}
    return {"segments": [segment], "device_traces": [[event, oom]]}


def load_seeds(use_corpus: bool = True) -> list[Seed]:
    """The seeds, always in the same order: the minimal snapshot, the fixtures, then the corpus."""
    from oomdoctor.load import load_raw

    seeds = [Seed("minimal", minimal_snapshot())]
    paths = sorted((ROOT / "fixtures" / "dumps").glob("*.pickle"))
    corpus = corpus_dir() if use_corpus else None
    if corpus is not None:
        paths += sorted(p for p in (corpus / "snapshots").iterdir() if p.is_file())
        paths += sorted(p for p in (corpus / "other_formats").iterdir() if p.is_file())
    for path in paths:
        try:
            data = load_raw(path)
        except Exception:  # a seed the loader refuses is simply not a seed
            continue
        seeds.append(Seed(path.name, reduce_snapshot(data)))
    return seeds


# --- values the mutators use ---------------------------------------------------------------------

INTERESTING_INTS = (
    0, 1, -1, 2, 7, 255, 256, 512, 4096, 65535, 65536, 2**20, 2**31 - 1, 2**31, -(2**31), 2**32, 2**53 + 1,
    2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 2**64, 2**64 + 1, 2**100, 2**1100, -(2**1100),
)  # fmt: skip
HUGE_DIGIT_INT = 2**16000  # over 4300 decimal digits: str() of it raises ValueError
INTERESTING_FLOATS = (float("nan"), float("inf"), float("-inf"), 1e308, -0.0, 0.5, 1e-300)
PAYLOADS = (
    "\x1b]0;pwned\x07\x1b]52;c;cHduZWQ=\x07\x1b[2Jtrain.py",
    "\x1b[31mred\x1b[0m",
    "\x9b2J\x9d0;title\x9c",
    "bell\x07",
    "a\rb\x08c",
    "nul\x00byte",
    "del\x7f",
    "tab\tand\nnewline",
    "[bold red]styled[/]",
    "[/bold]",
    "[@click=app.screenshot('victim.txt','.')]click me[/]",
    "[link=file:///etc/passwd]link[/link]",
    'x`` </details><img src="https://evil.example/p.png"> @someone [click](https://evil.example) ``',
    "/src/a.py\n```\n</details>\n\n# injected heading\n@someone\n",
    "![x](https://evil.example/x.png) <b>bold</b> *em* _u_ #1",
    "\u00b2",
    "\u0661\u0662",
    "\u216b",
    "\u202egnp.exe",
    "line\u2028sep",
    "\ufeffbom",
    "\ud800lone surrogate",
    "",
    " ",
    "%s%n{0}{}",
    "/home/alice/secret-project/train.py",
    "C:\\Users\\alice\\train.py",
    "oom-rank0-gpu-node-7-4242-20250101T000000Z.pickle",
    "None",
    "-1",
    "18446744073709551616",
)
ALLOC_CONFS = (
    "expandable_segments:True",
    "expandable_segments:False,max_split_size_mb:128",
    "max_split_size_mb:\u00b2",
    "large_segment_size_mb:\u00b2",
    "large_segment_size_mb:0",
    "large_segment_size_mb:-3",
    "roundup_power2_divisions:[256:\u00b2,>:4]",
    "roundup_power2_divisions:4",
    "garbage_collection_threshold:nan",
    "max_split_size_mb:99999999999999999999999999999",
    "backend:cudaMallocAsync",
    ":,,:",
    "expandable_segments:\x1b[2J",
)
ACTIONS = (
    "alloc",
    "free_requested",
    "free_completed",
    "segment_alloc",
    "segment_free",
    "segment_map",
    "segment_unmap",
    "oom",
    "snapshot",
    "bogus",
)
STATES = ("active_allocated", "active_pending_free", "inactive", "bogus")
METADATA_FIELDS = (
    ("rank",), ("local_rank",), ("world_size",), ("pid",), ("host",), ("argv",), ("schema_version",), ("reason",),
    ("versions", "torch"), ("versions", "cuda"), ("versions", "python"), ("versions",),
    ("device", "index"), ("device", "name"), ("device", "capability"), ("device", "total_memory_bytes"), ("device",),
    ("mem_get_info", "free_bytes"), ("mem_get_info", "total_bytes"),
    ("memory_stats", "num_ooms"), ("memory_stats", "allocated_bytes"), ("memory_stats",),
    ("alloc_conf", "PYTORCH_CUDA_ALLOC_CONF"), ("alloc_conf",),
    ("oom", "device"), ("oom", "alloc_bytes"), ("oom", "device_total_bytes"), ("oom", "device_free_bytes"), ("oom", "time_us"), ("oom", "surfaced"), ("oom",),
    ("ooms_observed",), ("exception", "type"), ("exception", "message"), ("exception", "traceback"), ("exception",),
    ("markers",), ("tensors",), ("recording", "max_entries"), ("recording", "stacks"), ("recording",),
    ("rehearsal", "device_memory_bytes"), ("rehearsal", "alloc_conf"),
)  # fmt: skip
INTERESTING_KEYS = (
    "size", "total_size", "requested_size", "allocated_size", "active_size", "address", "addr", "state", "action",
    "device", "stream", "segment_type", "time_us", "frames", "filename", "line", "name", "pool_id", "segment_pool_id",
    "is_expandable", "device_free", "history", "real_size", "blocks", "segments", "device_traces", "oomdoctor",
    "allocator_settings", "forward_frames", "user_metadata", "compile_context", "external_annotations",
)  # fmt: skip


def interesting_int(rng: random.Random, value: int | None = None) -> int:
    roll = rng.random()
    if value is not None and roll < 0.35:
        return rng.choice(
            (
                value + 1,
                value - 1,
                value * 2,
                -value,
                value // 2,
                value + rng.randint(-4096, 4096),
                value ^ (1 << rng.randint(0, 63)),
            )
        )
    if roll < 0.4:
        return HUGE_DIGIT_INT
    return rng.choice(INTERESTING_INTS)


def payload(rng: random.Random) -> str:
    roll = rng.random()
    if roll < 0.08:
        return rng.choice("xa/") * rng.choice((5_000, 100_000, 1_000_000))
    if roll < 0.12:
        return "/src/" + "a-rank0-" * rng.choice((100, 1000, 4000)) + ".py"  # the redaction regex's worst case
    if roll < 0.18:
        return "".join(chr(rng.randint(0, 0x3000)) for _ in range(rng.randint(1, 24)))
    return rng.choice(PAYLOADS)


def wrong_type(rng: random.Random, value: Any) -> Any:
    return rng.choice(
        (
            None,
            True,
            False,
            0,
            -1,
            2**64,
            float("nan"),
            "",
            _short(value),
            "\u00b2",
            [],
            {},
            [value],
            {"x": value},
            (value,),
            b"bytes",
            ["a", 1],
        )
    )


def laughs(depth: int, leaf: Any = "lol") -> list:
    """A list whose expansion has 2**depth leaves, written as depth shared lists."""
    node: Any = [leaf]
    for _ in range(depth):
        node = [node, node]
    return node


# --- pickle fragments: each pushes exactly one value -----------------------------------------------


def value_op(value: Any) -> bytes:
    """The opcodes that push `value` (protocol 2 encodings, valid in any protocol's stream)."""
    return pickletools.optimize(pickle.dumps(value, protocol=2))[2:-1]


def deep_fragment(kind: str, depth: int) -> bytes:
    if kind == "list":
        return b"]" * (depth + 1) + b"a" * depth
    if kind == "tuple":
        return b")" + b"\x85" * depth
    key = value_op("k")
    return (b"(" + key) * depth + b"N" + b"d" * depth  # {"k": {"k": ... None}}


def bomb_fragment(kind: str, depth: int) -> bytes:
    leaf = value_op("ab")
    if kind == "tuple-laughs":
        return leaf + b"2\x86" * depth  # DUP, TUPLE2
    if kind == "list-laughs":
        return b"(" * depth + leaf + b"2l" * depth  # MARK ... DUP, LIST
    return b"}" + leaf + b"2\x86" * depth + b"K\x01s"  # a dict keyed by a tuple bomb (hash bomb)


def hostile_fragment(rng: random.Random) -> bytes:
    evil = "\x1b]0;pwned\x07\x1b[2Jos"
    return rng.choice((
        b"cos\nsystem\n",
        value_op("os") + value_op("system") + b"\x93",
        value_op(evil) + value_op("system") + b"\x93",
        b"c" + evil.encode() + b"\nsystem\n",
        b"cbuiltins\neval\n(V1\ntR",
        b"\x82\x01",
        b"P0\n",
        b"N\x97" if rng.random() < 0.5 else b"\x97",
        b"\x96" + struct.pack("<Q", 2**62),
        b"\x8d" + struct.pack("<Q", 2**62),
        b"N\x95" + struct.pack("<Q", 2**62),
        b"Nr" + struct.pack("<I", 2**31 - 1),
        b"\x8b" + struct.pack("<i", 100_000) + b"\x01" * 100_000,
        b"(i__main__\nX\n",
    ))  # fmt: skip


# --- strategies ---------------------------------------------------------------------------------


@dataclass
class Generated:
    strategy: str
    data: bytes
    suffix: str
    description: str


def _op_spans(raw: bytes) -> list[tuple[Any, Any, int, int]]:
    """(opcode, argument, start, end) for every op of the pickle."""
    ops = list(pickletools.genops(raw))
    spans = []
    for index, (opcode, arg, position) in enumerate(ops):
        end = ops[index + 1][2] if index + 1 < len(ops) else len(raw)
        spans.append((opcode, arg, position, end))
    return spans


def mutate_bytes(rng: random.Random, raw: bytes, notes: list[str]) -> bytes:
    data = bytearray(raw)
    for _ in range(1 + min(int(rng.expovariate(0.6)), 7)):
        if not data:
            data = bytearray(rng.randbytes(rng.randint(1, 8)))
        position = rng.randrange(len(data))
        kind = rng.choice(("flip", "byte", "truncate", "insert", "delete", "duplicate", "int", "int"))
        if kind == "flip":
            data[position] ^= 1 << rng.randrange(8)
        elif kind == "byte":
            data[position] = rng.choice((0, 1, 0x7F, 0x80, 0xFF, rng.randrange(256)))
        elif kind == "truncate":
            data = data[:position]
        elif kind == "insert":
            data[position:position] = rng.randbytes(rng.randint(1, 16))
        elif kind == "delete":
            del data[position : position + rng.randint(1, 64)]
        elif kind == "duplicate":
            start = rng.randrange(len(data))
            data[position:position] = data[start : start + rng.randint(1, 256)]
        else:
            width = rng.choice((1, 2, 4, 8))
            value = rng.choice(INTERESTING_INTS) % (1 << (8 * width))
            data[position : position + width] = value.to_bytes(width, "little")
        notes.append(f"{kind}@{position}")
    return bytes(data)


def byte_strategy(rng: random.Random, seeds: list[Seed], notes: list[str]) -> tuple[bytes, str]:
    seed = rng.choice(seeds)
    kind = rng.choices(("p4", "p2", "p0", "json", "gzip"), (60, 15, 5, 10, 10))[0]
    notes.append(f"{seed.name} as {kind}")
    return mutate_bytes(rng, seed.encoded(kind), notes), ".json" if kind == "json" else ".pickle"


def opcode_strategy(rng: random.Random, seeds: list[Seed], notes: list[str]) -> tuple[bytes, str]:
    seed = rng.choice(seeds)
    kind = rng.choices(("p4nf", "p2", "p0"), (50, 35, 15))[0]
    raw = seed.encoded(kind)
    spans = seed.spans(kind)
    pieces = [raw[start:end] for _, _, start, end in spans]
    notes.append(f"{seed.name} as {kind}")
    for _ in range(1 + min(int(rng.expovariate(1.0)), 4)):
        index = rng.randrange(len(spans) - 1) if len(spans) > 1 else 0
        opcode, arg, _start, _end = spans[index]
        choice = rng.choices(
            ("int", "str", "memo", "delete", "duplicate", "swap", "deep", "bomb", "hostile"),
            (18, 18, 12, 8, 8, 8, 12, 8, 8),
        )[0]
        scalars = seed.ops_named(kind, _SCALAR_OPS)
        if choice == "int":
            candidates = seed.ops_named(kind, _INT_OPS)
            if candidates:
                index = rng.choice(candidates)
                value = interesting_int(rng, spans[index][1] if isinstance(spans[index][1], int) else None)
                pieces[index] = value_op(value)
                notes.append(f"int op {index} -> {_short(value)}")
        elif choice == "str":
            candidates = seed.ops_named(kind, _STR_OPS)
            if candidates:
                index = rng.choice(candidates)
                text = payload(rng)
                pieces[index] = value_op(text)
                notes.append(f"str op {index} -> {_short(text)}")
        elif choice == "memo":
            candidates = seed.ops_named(kind, _MEMO_OPS)
            if candidates:
                index = rng.choice(candidates)
                name = spans[index][0].name
                target = rng.choice((0, 1, rng.randrange(1 + len(spans) // 2), len(spans), 2**31 - 1))
                if name.endswith("GET"):
                    pieces[index] = b"j" + struct.pack("<I", min(target, 2**32 - 1))
                elif name == "MEMOIZE" and rng.random() < 0.5:
                    pieces[index] = b""
                else:
                    pieces[index] = b"r" + struct.pack("<I", min(target, 2**32 - 1))
                notes.append(f"memo op {index} {name} -> {target}")
        elif choice == "delete":
            pieces[index] = b""
            notes.append(f"delete op {index} {opcode.name}")
        elif choice == "duplicate":
            pieces[index] = pieces[index] * 2
            notes.append(f"duplicate op {index} {opcode.name}")
        elif choice == "swap":
            other = rng.randrange(len(spans) - 1) if len(spans) > 1 else 0
            pieces[index], pieces[other] = pieces[other], pieces[index]
            notes.append(f"swap ops {index},{other}")
        elif scalars:
            index = rng.choice(scalars)
            if choice == "deep":
                shape, depth = rng.choice(("list", "tuple", "dict")), rng.choice((50, 1000, 20_000, 200_000))
                pieces[index] = deep_fragment(shape, depth)
                notes.append(f"op {index} -> deep {shape} {depth}")
            elif choice == "bomb":
                shape = rng.choice(("tuple-laughs", "list-laughs", "hash-bomb"))
                depth = rng.choice((8, 16, 24, 28) if shape == "list-laughs" else (8, 16, 24, 40))
                pieces[index] = bomb_fragment(shape, depth)
                notes.append(f"op {index} -> {shape} {depth}")
            else:
                pieces[index] = hostile_fragment(rng)
                notes.append(f"op {index} -> hostile {_short(pieces[index])}")
    return b"".join(pieces), ".pickle"


_INT_OPS = frozenset({"BININT", "BININT1", "BININT2", "LONG1", "LONG4", "INT", "LONG"})
_STR_OPS = frozenset(
    {"SHORT_BINUNICODE", "BINUNICODE", "UNICODE", "BINUNICODE8", "SHORT_BINSTRING", "BINSTRING", "STRING"}
)
_MEMO_OPS = frozenset({"BINGET", "LONG_BINGET", "GET", "BINPUT", "LONG_BINPUT", "PUT", "MEMOIZE"})
_SCALAR_OPS = _INT_OPS | _STR_OPS | {"NONE", "NEWTRUE", "NEWFALSE", "BINFLOAT", "FLOAT"}


class _BoundedRepr(reprlib.Repr):
    """A repr of mutated values that stays short: laughs are not expanded, huge ints not printed."""

    def repr_int(self, x: int, level: int) -> str:
        return repr(x) if x.bit_length() < 80 else f"<int of {x.bit_length()} bits>"


_REPR = _BoundedRepr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother, _REPR.maxlist, _REPR.maxdict = 3, 40, 40, 4, 4


def _short(value: Any, limit: int = 60) -> str:
    text = _REPR.repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _nodes(data: Any, limit: int = 50_000) -> list[tuple[Any, Any, str]]:
    """(container, key, the container's path) of every value under `data`, breadth first, up to `limit`."""
    found: list[tuple[Any, Any, str]] = []
    queue: list[tuple[Any, str]] = [(data, "")]
    seen = {id(data)}  # a shared list (laughs) is walked once
    position = 0
    while position < len(queue) and len(found) < limit:
        container, path = queue[position]
        position += 1
        items = container.items() if isinstance(container, dict) else enumerate(container)
        for key, value in items:
            found.append((container, key, path))
            if isinstance(value, (dict, list)) and value and id(value) not in seen:
                seen.add(id(value))
                queue.append((value, node_path(path, key)))
    return found


def node_path(parent: str, key: Any) -> str:
    if isinstance(key, str):
        return f"{parent}.{key}" if len(key) <= 40 else f"{parent}.{key[:40]}..."
    return f"{parent}[{_short(key, 40)}]"


class Mutation:
    """What the value strategy changes, and what the writer must know (placeholders, sharing)."""

    def __init__(self, rng: random.Random, case: int):
        self.rng = rng
        self.case = case
        self.placeholders: dict[str, tuple[bytes, str]] = {}
        self.needs_pickle = False

    def placeholder(self, fragment: bytes, json_text: str) -> str:
        name = f"__fuzz_{self.case}_{len(self.placeholders)}__"
        self.placeholders[name] = (fragment, json_text)
        return name


def _new_value(m: Mutation, value: Any) -> tuple[Any, str]:
    rng = m.rng
    roll = rng.random()
    if isinstance(value, bool) or roll < 0.1:
        new = wrong_type(rng, value)
        m.needs_pickle |= isinstance(new, (bytes, tuple))
        return new, "wrong type"
    if isinstance(value, int):
        return (interesting_int(rng, value) if roll < 0.8 else rng.choice(INTERESTING_FLOATS)), "int"
    if isinstance(value, float):
        return rng.choice(INTERESTING_FLOATS + (2**64, 2**1100)), "float"
    if isinstance(value, str):
        if roll < 0.3 and value:
            return value + payload(rng), "str+payload"
        return payload(rng), "payload"
    if isinstance(value, list):
        kind = rng.choice(("empty", "duplicate", "shuffle", "truncate", "append", "reverse"))
        value = list(value)
        if kind == "empty":
            value = []
        elif kind == "duplicate" and value:
            value = value + value[: rng.randint(1, len(value))]
        elif kind == "shuffle":
            rng.shuffle(value)
        elif kind == "truncate" and value:
            value = value[: rng.randrange(len(value))]
        elif kind == "append":
            value.append(wrong_type(rng, None))
        else:
            value.reverse()
        return value, f"list {kind}"
    if isinstance(value, dict):
        value = dict(value)
        if value and rng.random() < 0.5:
            del value[rng.choice(list(value))]
            return value, "dict lost a key"
        value[rng.choice(INTERESTING_KEYS)] = wrong_type(rng, None)
        return value, "dict gained a key"
    return wrong_type(rng, value), "replaced"


def _frame_lists(data: Any) -> list[list]:
    return [
        container[key] for container, key, _ in _nodes(data) if key == "frames" and isinstance(container[key], list)
    ]


def _metadata(m: Mutation, data: dict) -> str:
    rng = m.rng
    meta = data.get("oomdoctor")
    if not isinstance(meta, dict):
        meta = data["oomdoctor"] = {"schema_version": 1}
    path = rng.choice(METADATA_FIELDS)
    roll = rng.random()
    if roll < 0.3:
        value: Any = interesting_int(rng)
    elif roll < 0.55:
        value = payload(rng)
    elif roll < 0.65:
        value = laughs(rng.choice((8, 16, 22, 27)))
        m.needs_pickle = True
    elif roll < 0.7:
        value = rng.choice(INTERESTING_FLOATS)
    elif roll < 0.8:
        value = [
            payload(rng),
            interesting_int(rng),
            {
                "name": payload(rng),
                "address": interesting_int(rng),
                "component": payload(rng),
                "size_bytes": interesting_int(rng),
            },
        ]
    elif roll < 0.9:
        value = rng.choice(ALLOC_CONFS)
    else:
        value = wrong_type(rng, None)
        m.needs_pickle |= isinstance(value, (bytes, tuple))
    target = meta
    for key in path[:-1]:
        if not isinstance(target.get(key), dict):
            target[key] = {}
        target = target[key]
    target[path[-1]] = value
    return f"metadata {'.'.join(path)} = {_short(value)}"


def _allocator_settings(m: Mutation, data: dict) -> str:
    rng = m.rng
    settings = data.get("allocator_settings")
    if not isinstance(settings, dict):
        settings = data["allocator_settings"] = {}
    kind = rng.choice(("conf", "divisions", "number", "type"))
    if kind == "conf":
        settings[rng.choice(("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"))] = value = rng.choice(ALLOC_CONFS)
    elif kind == "divisions":
        settings["roundup_power2_divisions"] = value = rng.choice(
            ({"\u00b2": 4}, {"256": "\u00b2"}, {"-1": 4}, {"1": 2**64}, [1, 2], "4", {"1": None}, {str(2**70): 4})
        )
    elif kind == "number":
        key = rng.choice(
            (
                "max_split_size",
                "garbage_collection_threshold",
                "max_round_threshold",
                "max_cached_size",
                "expandable_segments",
            )
        )
        settings[key] = value = rng.choice((interesting_int(rng),) + INTERESTING_FLOATS + ("True", None))
    else:
        data["allocator_settings"] = value = wrong_type(rng, settings)
    return f"allocator_settings {kind} = {_short(value)}"


def _frames_mutation(m: Mutation, data: Any) -> str:
    rng = m.rng
    lists = _frame_lists(data)
    frame = {"filename": payload(rng), "line": rng.choice((1, interesting_int(rng), "7", None)), "name": payload(rng)}
    if rng.random() < 0.2:
        frame = wrong_type(rng, frame)
        m.needs_pickle |= isinstance(frame, (bytes, tuple))
    if not lists:
        return "frames: none to change"
    shared = rng.random() < 0.5
    m.needs_pickle |= shared  # JSON would write the shared frame once per stack
    targets = lists if shared else [rng.choice(lists)]
    for stack in targets:
        stack.insert(rng.randint(0, len(stack)), frame)
    return f"frame {_short(frame)} into {'every' if shared else 'one'} stack"


def _segments_and_events(m: Mutation, data: Any) -> str:
    rng = m.rng
    segments = data.get("segments") if isinstance(data, dict) else data
    traces = data.get("device_traces") if isinstance(data, dict) else None
    kind = rng.choice(
        (
            "device",
            "overlap",
            "state",
            "action",
            "event-size",
            "unknown-addr",
            "history",
            "forward_frames",
            "annotations",
            "aliases",
            "pool",
            "shared",
        )
    )
    events = (
        [e for t in traces if isinstance(t, list) for e in t if isinstance(e, dict)] if isinstance(traces, list) else []
    )
    blocks = (
        [
            b
            for s in segments
            if isinstance(s, dict) and isinstance(s.get("blocks"), list)
            for b in s["blocks"]
            if isinstance(b, dict)
        ]
        if isinstance(segments, list)
        else []
    )
    if kind == "device" and isinstance(segments, list) and segments and isinstance(segments[0], dict):
        rng.choice(segments)["device"] = value = rng.choice((-5, -1, 1, 3, 2**31, 2**64, "0", None))
        if isinstance(data, dict) and rng.random() < 0.5:
            data["device_traces"] = (traces if isinstance(traces, list) else []) + [[]] * rng.randint(1, 3)
        return f"segment device = {value}"
    if kind == "overlap" and len(blocks) > 1:
        first, second = rng.sample(blocks, 2)
        second["address"] = first.get("address")
        return "two blocks at one address"
    if kind == "state" and blocks:
        rng.choice(blocks)["state"] = value = rng.choice(STATES + (payload(rng),))
        return f"block state = {_short(value)}"
    if kind == "action" and events:
        rng.choice(events)["action"] = value = rng.choice(ACTIONS + (payload(rng),))
        return f"event action = {_short(value)}"
    if kind == "event-size" and events:
        rng.choice(events)[rng.choice(("size", "addr", "time_us", "stream", "device_free"))] = value = interesting_int(
            rng
        )
        return f"event number = {_short(value)}"
    if kind == "unknown-addr" and events:
        event = dict(rng.choice(events))
        event["addr"] = rng.randrange(2**48)
        event["action"] = rng.choice(ACTIONS)
        rng.choice(traces).append(event)
        return "event at an unknown address"
    if kind == "history" and blocks:
        block = rng.choice(blocks)
        block.pop("frames", None)
        block["history"] = value = rng.choice(
            (7, {"x": 1}, [], [7], [{"addr": 1}], "h", [{"real_size": 2**64, "frames": []}])
        )
        return f"block history = {value!r}"
    if kind == "forward_frames" and events:
        depth = rng.choice((10, 1000, 100_000))
        value = (
            m.placeholder(deep_fragment("list", depth), "[" * depth + "]" * depth)
            if rng.random() < 0.4
            else laughs(rng.choice((8, 20, 26)))
        )
        m.needs_pickle |= isinstance(value, list)
        rng.choice(events)["forward_frames"] = [value, payload(rng)]
        return "forward_frames deep or laughs"
    if kind == "annotations" and isinstance(data, dict):
        key = rng.choice(("external_annotations", "user_metadata", "compile_context"))
        target = data if key == "external_annotations" or not events else rng.choice(events)
        target[key] = value = rng.choice(
            (
                [{"name": payload(rng), "stage": "START", "time_us": interesting_int(rng)}],
                payload(rng),
                interesting_int(rng),
                {"k": payload(rng)},
            )
        )
        return f"{key} = {_short(value)}"
    if kind == "aliases" and isinstance(data, dict) and "device_traces" in data:
        key = rng.choice(("traces", "host_segments", "host_traces"))
        data[key] = (
            data.pop("device_traces")
            if key == "traces"
            else copy_data(data["device_traces"] if key == "host_traces" else data["segments"])
        )
        return f"{key} key"
    if kind == "pool" and (events or blocks):
        target = (
            rng.choice(events)
            if events and rng.random() < 0.5
            else rng.choice(isinstance(segments, list) and [s for s in segments if isinstance(s, dict)] or [{}])
        )
        target["pool_id" if "action" in target else "segment_pool_id"] = value = rng.choice(
            ((1, 2), [1, 2], (2**64, 0), "p", laughs(12), (payload(rng), 1))
        )
        m.needs_pickle = True
        return f"pool id = {_short(value)}"
    if kind == "shared" and isinstance(data, dict) and (events or blocks):
        return _shared_list(m, data, events, blocks)
    return "no snapshot-aware change applied"


SHARED_LENGTH = 12_000  # items in a list shared SHARED_LENGTH times: 144M readings unless each list is read once


def _shared_list(m: Mutation, data: dict, events: list[dict], blocks: list[dict]) -> str:
    """One long list under thousands of places, as a pickle can share it and torch never does: a
    device's trace under many devices, a segment's blocks under many segments, one deep stack or
    one forward_frames list under every event and block."""
    rng, n = m.rng, SHARED_LENGTH
    m.needs_pickle = True  # JSON cannot share: it would write the list out at every place
    where = rng.choice(("traces", "blocks", "frames", "forward_frames"))
    if where == "traces" and events:
        trace = [dict(rng.choice(events), addr=0x7F0000000000 + i * 512) for i in range(n)]
        data["device_traces"] = [trace] * n
    elif where == "blocks" and blocks:
        shared = [dict(rng.choice(blocks), address=0x7F0000000000 + i * 512) for i in range(n)]
        data["segments"] = [
            {"device": 0, "address": 0x7F0000000000 + i * n * 512, "total_size": n * 512, "stream": 0,
             "segment_type": "large", "blocks": shared}
            for i in range(n)
        ]  # fmt: skip
    elif where == "frames":
        name = payload(rng)  # one string, however long, under every frame
        stack = [{"filename": f"/home/fuzz/m{i}.py", "line": i, "name": name} for i in range(n)]
        holders = [dict(rng.choice(events or blocks)) for _ in range(n)]
        for holder in holders + events + blocks:
            holder["frames"] = stack
        _list_holding(data, events[0] if events else blocks[0]).extend(holders)
    elif events:
        name = payload(rng)[:200]
        lines = [f'  File "/home/fuzz/m.py", line {i}, in {name}' for i in range(n)]
        holders = [dict(rng.choice(events)) for _ in range(n)]
        for event in holders + events:
            event.update(user_metadata="", forward_frames=lines)
        _list_holding(data, events[0]).extend(holders)
    else:
        return "no list to share"
    return f"one list of {n} shared by {n} {where}"


def _list_holding(data: dict, item: dict) -> list:
    """The trace or blocks list of `data` that holds `item`."""
    traces = data.get("device_traces") if isinstance(data.get("device_traces"), list) else []
    segments = data.get("segments") if isinstance(data.get("segments"), list) else []
    lists = [t for t in traces if isinstance(t, list)]
    lists += [s["blocks"] for s in segments if isinstance(s, dict) and isinstance(s.get("blocks"), list)]
    return next(found for found in lists if any(x is item for x in found))


def _key_mutation(m: Mutation, data: Any) -> str:
    rng = m.rng
    dicts = [
        container[key] for container, key, _ in _nodes(data) if isinstance(container[key], dict) and container[key]
    ]
    if isinstance(data, dict):
        dicts.append(data)
    if not dicts:
        return "no dict"
    target = rng.choice(dicts)
    old = rng.choice(list(target))
    new = rng.choice((payload(rng), 7, (1, 2), None, old.upper() if isinstance(old, str) else "x", "x" * 100_000))
    m.needs_pickle |= not isinstance(new, str)
    target[new] = target.pop(old)
    return f"key {_short(old)} -> {_short(new)}"


def mutate_value(m: Mutation, data: Any) -> tuple[Any, list[str]]:
    """One to three mutations of `data` (changed in place where possible), and what they were."""
    rng = m.rng
    notes = []
    for _ in range(rng.choice((1, 1, 1, 2, 3))):
        kind = rng.choices(
            ("node", "delete", "metadata", "settings", "frames", "snapshot", "key", "deep", "laughs"),
            (30, 8, 14, 7, 10, 16, 5, 5, 5),
        )[0]
        if kind in ("metadata", "settings") and not isinstance(data, dict):
            kind = "node"
        if kind == "metadata":
            notes.append(_metadata(m, data))
            continue
        if kind == "settings":
            notes.append(_allocator_settings(m, data))
            continue
        if kind == "frames":
            notes.append(_frames_mutation(m, data))
            continue
        if kind == "snapshot":
            notes.append(_segments_and_events(m, data))
            continue
        if kind == "key":
            notes.append(_key_mutation(m, data))
            continue
        nodes = _nodes(data) if isinstance(data, (dict, list)) else []
        if not nodes:
            data = _new_value(m, data)[0]
            notes.append("top-level value replaced")
            continue
        favoured = [n for n in nodes if n[1] in INTERESTING_KEYS]
        container, key, parent = rng.choice(favoured if favoured and rng.random() < 0.5 else nodes)
        path = node_path(parent, key)
        if kind == "delete":
            del container[key]
            notes.append(f"delete {path}")
        elif kind == "deep":
            shape, depth = rng.choice(("list", "tuple", "dict")), rng.choice((100, 1000, 50_000))
            json_text = "[" * depth + "]" * depth if shape != "dict" else '{"k":' * depth + "null" + "}" * depth
            container[key] = m.placeholder(deep_fragment(shape, depth), json_text)
            notes.append(f"{path} = deep {shape} {depth}")
        elif kind == "laughs":
            container[key] = laughs(rng.choice((8, 16, 22, 27)))
            m.needs_pickle = True
            notes.append(f"{path} = laughs")
        else:
            container[key], how = _new_value(m, container[key])
            notes.append(f"{path} {how} -> {_short(container[key])}")
    return data, notes


HTML_TEMPLATE = """<!DOCTYPE html>
<html>
<head>
</head>
<body>
<script type="module">
import {{add_local_files}} from "https://cdn.jsdelivr.net/gh/pytorch/pytorch@main/torch/utils/viz/MemoryViz.js"
const local_files = [{{"name": "snapshot.pickle", "base64": "{payload}"}}]
add_local_files(local_files, "Active Memory Timeline")
</script>
</body>
"""


def to_html(raw: bytes, wrap: int | None = None) -> bytes:
    encoded = base64.b64encode(raw).decode()
    if wrap:
        encoded = "\\n".join(encoded[i : i + wrap] for i in range(0, len(encoded), wrap))
    return HTML_TEMPLATE.format(payload=encoded).encode()


def _splice_placeholders(raw: bytes, m: Mutation, json_output: bool) -> bytes:
    for name, (fragment, json_text) in m.placeholders.items():
        encoded = name.encode()
        if json_output:
            raw = raw.replace(b'"' + encoded + b'"', json_text.encode(), 1)
            continue
        for op in (
            b"\x8c" + bytes([len(encoded)]) + encoded,
            b"X" + struct.pack("<I", len(encoded)) + encoded,
            b"V" + encoded + b"\n",
        ):
            if op in raw:
                raw = raw.replace(op, fragment, 1)
                break
    return raw


JSON_MAX_BYTES = 8 << 20  # JSON repeats what a pickle shares; larger ones are written as pickles


def write_value(m: Mutation, data: Any, notes: list[str]) -> tuple[bytes, str]:
    """`data` as a file: pickle protocol 0-5, gzip, JSON or HTML (pickle where JSON cannot say it)."""
    rng = m.rng
    kind = rng.choices(("pickle", "gzip", "json", "html"), (55, 15, 18, 12))[0]
    protocol = rng.randint(0, 5)
    if kind == "json" and not m.needs_pickle:
        try:
            raw = orjson.dumps(data) if rng.random() < 0.6 else json.dumps(data, allow_nan=True).encode()
            if len(raw) < JSON_MAX_BYTES:
                notes.append("written as JSON")
                return _splice_placeholders(raw, m, json_output=True), ".json"
        except (TypeError, ValueError, orjson.JSONEncodeError, RecursionError):
            pass  # big ints, NaN keys, tuple keys, surrogates: a pickle says them
        try:
            raw = json.dumps(data, allow_nan=True, default=_short).encode("utf-8", "surrogatepass")
            if len(raw) < JSON_MAX_BYTES:
                notes.append("written as JSON (stdlib)")
                return _splice_placeholders(raw, m, json_output=True), ".json"
        except (TypeError, ValueError, RecursionError):
            pass
        kind = "pickle"
    if kind == "json":
        kind = "pickle"
    if kind in ("gzip", "html"):
        protocol = max(protocol, 2)
    try:
        pickled = pickle.dumps(data, protocol=protocol)
    except ValueError:  # protocols 0-1 write ints in decimal, which Python refuses past 4300 digits
        protocol = 2
        pickled = pickle.dumps(data, protocol=protocol)
    raw = _splice_placeholders(pickled, m, json_output=False)
    notes.append(f"written as {kind} (pickle protocol {protocol})")
    if kind == "gzip":
        return gzip.compress(raw, mtime=0), ".pickle.gz"
    if kind == "html":
        return to_html(raw, wrap=rng.choice((None, None, 76))), ".html"
    return raw, ".pickle"


def value_strategy(rng: random.Random, seeds: list[Seed], notes: list[str], case: int) -> tuple[bytes, str]:
    seed = rng.choice(seeds)
    notes.append(seed.name)
    m = Mutation(rng, case)
    data, changes = mutate_value(m, copy_data(seed.data))
    notes.extend(changes)
    return write_value(m, data, notes)


def splice_strategy(rng: random.Random, seeds: list[Seed], notes: list[str], case: int) -> tuple[bytes, str]:
    first, second = rng.choice(seeds), rng.choice(seeds)
    notes.append(f"{first.name} + {second.name}")
    if rng.random() < 0.5:
        a, b = first.encoded("p4nf"), second.encoded("p4nf")
        if rng.random() < 0.7:
            cut_a = rng.choice(first.spans("p4nf"))[2]
            cut_b = rng.choice(second.spans("p4nf"))[2]
        else:
            cut_a, cut_b = rng.randrange(len(a)), rng.randrange(len(b))
        notes.append(f"bytes [:{cut_a}] + [{cut_b}:]")
        return a[:cut_a] + b[cut_b:], ".pickle"
    data, donor = copy_data(first.data), copy_data(second.data)
    m = Mutation(rng, case)
    nodes, donor_nodes = (
        _nodes(data) if isinstance(data, (dict, list)) else [],
        _nodes(donor) if isinstance(donor, (dict, list)) else [],
    )
    if nodes and donor_nodes:
        container, key, parent = rng.choice(nodes)
        same_key = [n for n in donor_nodes if n[1] == key]
        donor_container, donor_key, donor_parent = rng.choice(
            same_key if same_key and rng.random() < 0.7 else donor_nodes
        )
        container[key] = donor_container[donor_key]
        notes.append(f"{node_path(parent, key)} <- {node_path(donor_parent, donor_key)}")
    m.needs_pickle = True
    return write_value(m, data, notes)


_BOMB_UNIT_BYTES = 16 << 20
_BOMB_UNITS: dict[bytes, bytes] = {}


def gzip_bomb(size_bytes: int, what: str) -> bytes:
    """A small gzip file that decompresses to about `size_bytes`: a JSON list of zeros, one pickled
    string, or a pickled list of Nones. Written as gzip members (which readers concatenate), so one
    compressed 16 MiB member serves every size."""
    if what == "json-zeros":
        head, unit, tail = b"[", b"0,", b"0]"
    elif what == "pickle-string":
        head, unit, tail = (
            b"\x80\x04\x8d" + struct.pack("<Q", size_bytes // _BOMB_UNIT_BYTES * _BOMB_UNIT_BYTES),
            b"a",
            b".",
        )
    else:
        head, unit, tail = b"\x80\x04](", b"N", b"e."
    if unit not in _BOMB_UNITS:
        _BOMB_UNITS[unit] = gzip.compress(unit * (_BOMB_UNIT_BYTES // len(unit)), compresslevel=9, mtime=0)
    members = [
        gzip.compress(head, mtime=0),
        *[_BOMB_UNITS[unit]] * max(1, size_bytes // _BOMB_UNIT_BYTES),
        gzip.compress(tail, mtime=0),
    ]
    return b"".join(members)


def container_strategy(rng: random.Random, seeds: list[Seed], notes: list[str]) -> tuple[bytes, str]:
    seed = rng.choice(seeds)
    inner = seed.encoded(rng.choice(("p4", "p2", "json")))
    kinds = ("gzip", "gzip2", "gzip3", "gzip-truncated", "gzip-trailer", "gzip-members", "gzip-bomb", "html", "html-gzip", "html-bad-base64", "html-in-html", "html-empty", "bom", "utf16", "whitespace", "json-trailer", "json-bignum", "json-nan", "empty", "padding")  # fmt: skip
    kind = rng.choices(kinds, [1 if k == "gzip-bomb" else 4 for k in kinds])[0]  # a bomb costs seconds per verb
    notes.append(f"{seed.name}, {kind}")
    if kind == "gzip-bomb":
        size, what = rng.choice((16 << 20, 320 << 20)), rng.choice(("json-zeros", "pickle-string", "pickle-list"))
        notes.append(f"{size >> 20} MiB of {what}")
        return gzip_bomb(size, what), ".gz"
    if kind.startswith("gzip"):
        levels = {"gzip2": 2, "gzip3": 3}.get(kind, 1)
        data = inner
        for _ in range(levels):
            data = gzip.compress(data, mtime=0)
        if kind == "gzip-truncated":
            data = data[: rng.randrange(10, len(data))]
        elif kind == "gzip-trailer":
            data += rng.randbytes(rng.randint(1, 64))
        elif kind == "gzip-members":
            data += gzip.compress(inner, mtime=0)
        return data, ".gz"
    if kind == "html":
        return to_html(inner, wrap=rng.choice((None, 60))), ".html"
    if kind == "html-gzip":
        return to_html(gzip.compress(inner, mtime=0)), ".html"
    if kind == "html-bad-base64":
        text = to_html(inner)
        position = text.index(b'"base64": "') + 11 + rng.randrange(max(1, min(len(inner), 400)))
        return text[:position] + rng.choice((b"!", b"=", b"\xff", b"====")) + text[position:], ".html"
    if kind == "html-in-html":
        return to_html(to_html(inner)), ".html"
    if kind == "html-empty":
        return HTML_TEMPLATE.format(payload=rng.choice(("", "AAAA", "=="))).encode(), ".html"
    as_json = seed.encoded("json")
    if kind == "bom":
        return codecs.BOM_UTF8 + as_json, ".json"
    if kind == "utf16":
        return as_json.decode().encode("utf-16"), ".json"
    if kind == "whitespace":
        return b" \n\t" * rng.randint(1, 1000) + (as_json if rng.random() < 0.5 else inner), ".json"
    if kind == "json-trailer":
        return as_json + rng.choice((b"x", b"}", b"\x00", b" []")), ".json"
    if kind == "json-bignum":
        return b'{"segments": [], "device_traces": [], "n": ' + b"9" * rng.choice((20, 400, 5000)) + b"}", ".json"
    if kind == "json-nan":
        return (
            b'{"segments": [{"device": 0, "address": NaN, "total_size": Infinity, "blocks": []}], "device_traces": [[]]}',
            ".json",
        )
    if kind == "empty":
        return rng.choice((b"", b"\n", b"\x00" * 16, b"\x80", b"\x80\x04", b"{", b"<")), ".pickle"
    return b"\x00" * rng.randint(1, 64) + inner, ".pickle"


def make_case(seeds: list[Seed], seed: int, case: int, strategy: str | None = None) -> Generated:
    """The input of case `case`: the same bytes for the same (seed, case) and seeds."""
    rng = random.Random(f"oomdoctor-fuzz:{seed}:{case}")
    chosen = rng.choices(STRATEGIES, STRATEGY_WEIGHTS)[0]
    strategy = strategy or chosen
    notes: list[str] = []
    if strategy == "byte":
        data, suffix = byte_strategy(rng, seeds, notes)
    elif strategy == "opcode":
        data, suffix = opcode_strategy(rng, seeds, notes)
    elif strategy == "value":
        data, suffix = value_strategy(rng, seeds, notes, case)
    elif strategy == "splice":
        data, suffix = splice_strategy(rng, seeds, notes, case)
    else:
        data, suffix = container_strategy(rng, seeds, notes)
    description = "; ".join(notes)
    return Generated(strategy, data, suffix, description if len(description) < 400 else description[:400] + "...")


def case_strategy(seed: int, case: int) -> str:
    return random.Random(f"oomdoctor-fuzz:{seed}:{case}").choices(STRATEGIES, STRATEGY_WEIGHTS)[0]


# --- the pipeline -------------------------------------------------------------------------------

VERB_RUNS = (
    ("report-text", ("report", "{input}"), "text"),
    ("report-md", ("report", "{input}", "--format", "md"), "text"),
    ("report-json", ("report", "{input}", "--format", "json"), "json"),
    ("report-text-redact", ("report", "{input}", "--redact"), "text"),
    ("report-md-redact", ("report", "{input}", "--format", "md", "--redact"), "text"),
    ("report-json-redact", ("report", "{input}", "--format", "json", "--redact"), "json"),
    ("info-text", ("info", "{input}"), "text"),
    ("info-json", ("info", "{input}", "--format", "json"), "json"),
    ("redact", ("redact", "{input}", "{output}", "--force"), "redact"),
    # against a good dump: what the case holds shows as sites that appeared, went or grew
    ("diff-text", ("diff", "{input}", "{good}"), "text"),
    ("diff-md", ("diff", "{good}", "{input}", "--format", "md"), "text"),
    ("diff-json", ("diff", "{input}", "{good}", "--format", "json"), "json"),
)
# the other side of the diff verbs
GOOD_DUMP = ROOT / "fixtures" / "dumps" / "activation-spike-gpt-longer-sequence.pickle"


@dataclass
class Failure:
    stage: str
    kind: str  # exception, exit-code, rejection, control-bytes, invalid-json, no-output, memory, hang, crash
    signature: str
    detail: str
    trace: str = ""


def innermost_site(frames: list[tuple[str, int]]) -> str:
    """`path:line` of the innermost frame inside oomdoctor (frames innermost last), else the innermost."""
    for filename, line in reversed(frames):
        try:
            relative = Path(filename).resolve().relative_to(PACKAGE_DIR)
        except ValueError:
            continue
        return f"{relative.as_posix()}:{line}"
    if frames:
        return f"{Path(frames[-1][0]).name}:{frames[-1][1]}"
    return "?"


def exception_failure(stage: str, error: BaseException) -> Failure:
    frames = [(f.filename, f.lineno or 0) for f in traceback.extract_tb(error.__traceback__)]
    site = innermost_site(frames)
    message = " ".join(str(error).split())[:200]
    text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    return Failure(
        stage, "exception", f"{type(error).__name__} at {site}", f"{type(error).__name__}: {message}", text[-6000:]
    )


def _control_failure(stage: str, what: str, text: str) -> Failure | None:
    match = CONTROL.search(text)
    if match is None:
        return None
    start = max(match.start() - 30, 0)
    return Failure(
        stage,
        "control-bytes",
        f"raw control character in {what}",
        f"{match.group()!r} in ...{text[start : match.end() + 30]!r}...",
    )


_PARSER_CACHED = False


def _cache_cli_parser() -> None:
    """Build the CLI's argparse parser once per process: rebuilding it (gettext lookups for every
    argument) costs a quarter of a small case, and parsing never changes it."""
    global _PARSER_CACHED
    from oomdoctor import cli

    if not _PARSER_CACHED:
        parser = cli.build_parser()
        cli.build_parser = lambda: parser
        _PARSER_CACHED = True


# The watcher's lines for a file that hung or crashed the unpickler (oomdoctor/supervise.py).
WATCHER_REFUSALS = (REFUSED_AFTER_LIMIT, REFUSED_AFTER_CRASH)
IN_PROCESS = False  # --case: run main() in this process, so that an exception shows its traceback


def run_verb(argv: list[str], supervised_run: bool = True) -> tuple[int | None, bytes, str, BaseException | None]:
    """The verb as the `oomdoctor` command runs it: `oomdoctor.supervise.run(main, argv)`, a watched
    child process with the unpickling time limit, its stdout and stderr captured through real file
    descriptors (stdout strict UTF-8, like a terminal's). With IN_PROCESS, `main(argv)` here."""
    from oomdoctor.cli import main
    from oomdoctor.supervise import run as supervised

    _cache_cli_parser()
    code: int | None = None
    caught: BaseException | None = None
    with tempfile.TemporaryFile() as out_file, tempfile.TemporaryFile() as err_file:
        old_streams = sys.stdout, sys.stderr
        for stream in old_streams:
            with contextlib.suppress(Exception):
                stream.flush()
        saved = os.dup(1), os.dup(2)
        os.dup2(out_file.fileno(), 1)
        os.dup2(err_file.fileno(), 2)
        sys.stdout = io.TextIOWrapper(
            io.FileIO(1, "w", closefd=False), encoding="utf-8", errors="strict", newline="\n", write_through=True
        )
        sys.stderr = io.TextIOWrapper(
            io.FileIO(2, "w", closefd=False), encoding="utf-8", errors="backslashreplace", write_through=True
        )
        try:
            code = main(argv) if IN_PROCESS or not supervised_run else supervised(main, argv)
        except SystemExit as exit_:
            code = 0 if exit_.code is None else exit_.code if isinstance(exit_.code, int) else 2
        except BaseException as error:  # noqa: BLE001 -- every escape is a finding
            caught = error
        finally:
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()
                with contextlib.suppress(Exception):
                    stream.detach()
            sys.stdout, sys.stderr = old_streams
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
        out_file.seek(0)
        err_file.seek(0)
        output = out_file.read()
        stderr = err_file.read().decode("utf-8", "replace")
    return code, output, stderr, caught


def check_run(
    stage: str, output_kind: str, code: int | None, output: bytes, stderr: str, output_path: Path | None
) -> list[Failure]:
    failures = []
    if code not in (0, 1, 2):
        failures.append(Failure(stage, "exit-code", f"exit code {code}", f"exit {code}; stderr {stderr[:200]!r}"))
    problem = _control_failure(stage, f"stderr ({stage.split('-')[0]})", stderr)
    if problem:
        failures.append(problem)
    if code == 2 and ": internal error (" in stderr:  # a bug, reported in one line: still a finding
        where = re.search(r"internal error \((\w+)[^)]*? at ([\w/.]+:\d+)\)", stderr)
        signature = f"{where.group(1)} at oomdoctor/{where.group(2)}" if where else "internal error"
        failures.append(Failure(stage, "internal-error", signature, stderr.strip()[:300]))
        return failures
    if code == 2:
        lines = stderr.splitlines()
        if len(lines) != 1 or not stderr.endswith("\n") or not stderr.startswith("oomdoctor:"):
            failures.append(
                Failure(
                    stage,
                    "rejection",
                    "rejection not one 'oomdoctor:' line on stderr",
                    f"{len(lines)} lines: {stderr[:300]!r}",
                )
            )
        elif len(stderr) > MAX_ERROR_LINE_CHARS:
            failures.append(
                Failure(stage, "rejection", "rejection line too long", f"{len(stderr)} characters: {stderr[:200]!r}...")
            )
        return failures
    if code not in (0, 1):
        return failures
    if output_kind == "redact":
        if output_path is None or not output_path.is_file():
            failures.append(Failure(stage, "no-output", "redact exit 0 without its output file", stderr[:200]))
        return failures
    if not output:
        failures.append(Failure(stage, "no-output", f"exit {code} without output", f"stage {stage}"))
        return failures
    try:
        text = output.decode("utf-8")
    except UnicodeDecodeError as error:
        return failures + [Failure(stage, "control-bytes", f"output not UTF-8 ({stage})", str(error)[:200])]
    if output_kind == "json":
        try:
            json.loads(text)
        except ValueError as error:
            failures.append(
                Failure(
                    stage,
                    "invalid-json",
                    f"JSON output does not parse ({stage})",
                    f"{error}; {len(text)} chars, ends {text[-60:]!r}",
                )
            )
    else:
        problem = _control_failure(stage, f"{stage.removesuffix('-redact')} output", text)
        if problem:
            failures.append(problem)
    return failures


def tui_strings(path: Path) -> list[str]:
    """Every string the TUI's content builders give the app for this file ([] when it is refused)."""
    from oomdoctor.analysis import analyse, replayer
    from oomdoctor.errors import OomdoctorError
    from oomdoctor.load import load
    from oomdoctor.tui import content

    try:
        snapshot = load(path)
        analysis = analyse(snapshot)
    except OomdoctorError:
        return []
    strings: list[str] = []
    for section in content.overview_sections(analysis, str(path)):
        strings += [section.title, *section.lines]
    timeline = content.Timeline(analysis)
    columns = timeline.columns(80)
    for column in columns[:: max(1, len(columns) // 8)]:
        content.stacked_cells(column.peak, timeline.max_bytes, 12)
        strings.append(content.phase_words(column.phase))
    start = timeline.start_index()
    timeline.next_point(start, -10)
    timeline.next_point(start, 10)
    if columns:
        timeline.cursor_column(columns, start)
    replay = replayer(snapshot, analysis.device)
    target = analysis.replay.target_index
    indices = [target if target is not None else len(replay.trace) - 1]
    if len(replay.trace) > 2:
        indices.append(len(replay.trace) // 2)
    for index in indices:
        state = replay.state_at(index)
        for row in content.live_rows_at(state, replay.trace, replay.segments, analysis, limit=20):
            strings += [row.label, *content.stack_lines(row.frames)]
    state = replay.state_at(indices[0])
    strings += content.fragmentation_lines(analysis)
    for segment in state.segments[:64]:
        strings += [content.segment_bar(segment, 32), content.segment_pool(segment)]
        content.largest_free_block_bytes(segment)
        for row in content.block_rows_of(segment, analysis, replay.trace)[:64]:
            strings += [row.label, *content.stack_lines(row.frames)]
    for node in content.component_nodes(analysis):
        for group in node.groups:
            strings.append(group.key)
            for block in group.blocks[:8]:
                strings.append(content.describe_block(block.name, block.frames, block.alloc_index))
    rows = content.allocation_rows(analysis)
    content.filter_rows(rows, "a 0x")
    for row in rows[:200]:
        strings += [row.label, *content.stack_lines(row.block.frames)]
    return strings


@dataclass
class CaseResult:
    case: int
    strategy: str
    outcome: str
    failures: list[Failure] = field(default_factory=list)
    description: str = ""
    size_bytes: int = 0
    seconds: float = 0.0
    rss_bytes: int = 0
    recycle: bool = False


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def run_pipeline(
    path: Path,
    workdir: Path,
    *,
    rss_cap_bytes: int | None = None,
    on_stage: Callable[[str], None] | None = None,
    verbose: bool = False,
) -> tuple[str, list[Failure], bool]:
    """Run every verb and the TUI builders on `path`: (outcome, failures, worker must be replaced)."""
    failures: list[Failure] = []
    clean = rejected = 0
    recycle = False
    output_path = workdir / "redacted.pickle"
    rss_before = peak_rss_bytes()
    report_refused = False
    supervise_all = True

    def memory_check(stage: str) -> None:
        nonlocal recycle
        peak = peak_rss_bytes()
        if rss_cap_bytes is not None and not recycle and peak > rss_cap_bytes and peak > rss_before:
            failures.append(
                Failure(
                    stage,
                    "memory",
                    f"peak RSS over {rss_cap_bytes >> 20} MiB ({stage.split('-')[0]})",
                    f"{peak >> 20} MiB after {stage}",
                )
            )
            recycle = True

    for stage, template, output_kind in VERB_RUNS:
        if on_stage:
            on_stage(stage)
        with contextlib.suppress(FileNotFoundError):
            output_path.unlink()
        argv = [part.format(input=path, output=output_path, good=GOOD_DUMP) for part in template]
        # The first verb runs as the command does, in a watched child (a fork per verb costs more
        # than a small case): a file it reads without the unpickler hanging or crashing reads the
        # same way in every verb (they share the reader), so the others run in this worker unless
        # the first was refused by the watcher.
        code, output, stderr, caught = run_verb(argv, supervised_run=supervise_all or stage == VERB_RUNS[0][0])
        if stage == VERB_RUNS[0][0]:
            supervise_all = code == 2 and any(words in stderr for words in WATCHER_REFUSALS)
        if caught is not None:
            failure = exception_failure(stage, caught)
            failures.append(failure)
            recycle |= isinstance(caught, (MemoryError, RecursionError))
            if verbose:
                print(f"--- {stage}: {failure.signature}\n{failure.trace}", file=sys.stderr)
        else:
            found = check_run(stage, output_kind, code, output, stderr, output_path)
            failures += found
            clean += code in (0, 1)
            rejected += code == 2
            if verbose:
                status = "clean" if code in (0, 1) else "rejected" if code == 2 else f"exit {code}"
                print(
                    f"--- {stage}: {status}, {len(output)} bytes out; stderr: {stderr.strip()[:300]}", file=sys.stderr
                )
                for failure in found:
                    print(f"    FAILURE {failure.signature}: {failure.detail}", file=sys.stderr)
        memory_check(stage)
        if stage == "report-text":
            report_refused = code == 2
    if on_stage:
        on_stage("tui")
    try:
        # `open` runs in the same supervised child as `report` and reads the file the same way: a
        # file `report` refused is refused by the app with that line (its tests show it); the
        # builders run here, in this process, only on files that load.
        for text in [] if report_refused else tui_strings(path):
            problem = _control_failure("tui", "TUI content", text)
            if problem:
                failures.append(problem)
                break
    except BaseException as error:  # noqa: BLE001
        failure = exception_failure("tui", error)
        failures.append(failure)
        recycle |= isinstance(error, (MemoryError, RecursionError))
        if verbose:
            print(f"--- tui: {failure.signature}\n{failure.trace}", file=sys.stderr)
    memory_check("tui")
    with contextlib.suppress(FileNotFoundError):
        output_path.unlink()
    if failures:
        outcome = (
            "memory"
            if any(f.kind == "memory" for f in failures) and all(f.kind == "memory" for f in failures)
            else "failure"
        )
    else:
        outcome = "clean" if clean else "rejected"
    return outcome, failures, recycle


# --- workers ------------------------------------------------------------------------------------


@dataclass
class Settings:
    seed: int = 0
    time_limit_s: float = 30.0
    address_space_bytes: int = 4 << 30
    rss_cap_bytes: int = 3 << 30  # above the 2 GiB the loader itself allows an unpickling
    cases_per_worker: int = 2000
    strategy: str | None = None


def _faulthandler_site(log_path: Path) -> tuple[str, str]:
    """(innermost oomdoctor file:line, the dump) from a faulthandler log, most recent call first."""
    try:
        text = log_path.read_text(errors="replace")
    except OSError:
        return "?", ""
    frames = [(name, int(line)) for name, line in re.findall(r'File "([^"]+)", line (\d+)', text)]
    return innermost_site(list(reversed(frames))), text[-4000:]


def worker_main(connection, seeds: list[Seed], settings: Settings, workdir: str, stage_cell, stage_started) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ.pop("OOMDOCTOR_MAX_BYTES", None)
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = settings.address_space_bytes if hard == resource.RLIM_INFINITY else min(settings.address_space_bytes, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    folder = Path(workdir)
    log = open(folder / "faulthandler.log", "w+b", buffering=0)
    faulthandler.enable(file=log, all_threads=True)
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 1000))

    def on_stage(stage: str) -> None:
        # the time limit is per stage (one verb, or the TUI step), so a slow but bounded verb is
        # no hang however many verbs a case runs; faulthandler shows where a stuck stage is
        faulthandler.cancel_dump_traceback_later()
        stage_cell.value = stage.encode()[:31]
        stage_started.value = time.monotonic()
        faulthandler.dump_traceback_later(settings.time_limit_s, repeat=False, file=log)

    while True:
        case = connection.recv()
        if case is None:
            break
        log.seek(0)
        log.truncate()
        result = execute_case(seeds, settings, case, folder, on_stage)
        faulthandler.cancel_dump_traceback_later()
        connection.send(result)
        if result.recycle:
            break


def execute_case(
    seeds: list[Seed], settings: Settings, case: int, folder: Path, on_stage: Callable[[str], None] | None = None
) -> CaseResult:
    started = time.perf_counter()
    strategy = settings.strategy or case_strategy(settings.seed, case)
    if on_stage:
        on_stage("generate")
    try:
        generated = make_case(seeds, settings.seed, case, settings.strategy)
    except Exception as error:  # noqa: BLE001 -- the generator's own bug, not oomdoctor's
        return CaseResult(
            case,
            strategy,
            "generator-error",
            [exception_failure("generate", error)],
            seconds=time.perf_counter() - started,
        )
    path = folder / f"input{generated.suffix}"
    path.write_bytes(generated.data)
    outcome, failures, recycle = run_pipeline(path, folder, rss_cap_bytes=settings.rss_cap_bytes, on_stage=on_stage)
    path.unlink()
    return CaseResult(
        case,
        generated.strategy,
        outcome,
        failures,
        generated.description,
        len(generated.data),
        time.perf_counter() - started,
        peak_rss_bytes(),
        recycle,
    )


class _Worker:
    def __init__(self, context, seeds: list[Seed], settings: Settings, root: Path, number: int):
        self.workdir = Path(tempfile.mkdtemp(prefix=f"w{number}-", dir=root))
        self.stage = context.Array("c", 32, lock=False)
        self.stage_started = context.Value(
            "d", time.monotonic(), lock=False
        )  # CLOCK_MONOTONIC: one clock for all processes
        parent_end, child_end = context.Pipe()
        self.connection = parent_end
        self.process = context.Process(
            target=worker_main,
            args=(child_end, seeds, settings, str(self.workdir), self.stage, self.stage_started),
            daemon=True,
        )
        self.process.start()
        child_end.close()
        self.case: int | None = None
        self.started = 0.0
        self.done = 0

    def send(self, case: int) -> None:
        self.case, self.started = case, time.monotonic()
        self.stage.value = b"start"
        self.stage_started.value = self.started
        self.connection.send(case)
        self.done += 1

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError, AttributeError):
            os.kill(self.process.pid, signal.SIGKILL)
        self.process.join(5)
        self.connection.close()

    def stop(self) -> None:
        with contextlib.suppress(OSError, BrokenPipeError):
            self.connection.send(None)
        self.process.join(5)
        if self.process.is_alive():
            self.kill()
        shutil.rmtree(self.workdir, ignore_errors=True)


# --- campaign and summary -----------------------------------------------------------------------


@dataclass
class Summary:
    cases: int = 0
    seconds: float = 0.0
    workers: int = 0
    seeds: int = 0
    by_strategy: dict[str, Counter] = field(default_factory=dict)
    signatures: dict[str, list] = field(default_factory=dict)  # signature -> [count, first case, kind, stages, detail]
    failing_cases: list[int] = field(default_factory=list)
    peak_rss_bytes: int = 0
    slowest: tuple[float, int] = (0.0, -1)

    def add(self, result: CaseResult) -> None:
        self.cases += 1
        self.by_strategy.setdefault(result.strategy, Counter())[result.outcome] += 1
        self.peak_rss_bytes = max(self.peak_rss_bytes, result.rss_bytes)
        self.slowest = max(self.slowest, (result.seconds, result.case))
        if result.outcome in ("failure", "memory", "hang", "crash"):
            self.failing_cases.append(result.case)
        for signature in dict.fromkeys(f.signature for f in result.failures):
            first = next(f for f in result.failures if f.signature == signature)
            entry = self.signatures.setdefault(signature, [0, result.case, first.kind, set(), first.detail])
            entry[0] += 1
            entry[3].update(f.stage for f in result.failures if f.signature == signature)

    @property
    def failure_count(self) -> int:
        return len(self.failing_cases)

    def table(self) -> str:
        rate = self.cases / self.seconds if self.seconds else 0.0
        lines = [
            f"{self.cases} cases in {self.seconds:.1f} s on {self.workers} workers: {rate:.1f} cases/s; {self.seeds} seeds; peak worker RSS {self.peak_rss_bytes / 2**20:.0f} MiB; slowest case {self.slowest[1]} ({self.slowest[0]:.1f} s)",
            "",
        ]
        header = f"{'strategy':<10}" + "".join(f"{o:>10}" for o in OUTCOMES[:6]) + f"{'gen-err':>9}{'total':>8}"
        lines += [header, "-" * len(header)]
        totals: Counter = Counter()
        for strategy in STRATEGIES:
            counts = self.by_strategy.get(strategy, Counter())
            totals.update(counts)
            lines.append(
                f"{strategy:<10}"
                + "".join(f"{counts[o]:>10}" for o in OUTCOMES[:6])
                + f"{counts['generator-error']:>9}{sum(counts.values()):>8}"
            )
        lines.append(
            f"{'total':<10}"
            + "".join(f"{totals[o]:>10}" for o in OUTCOMES[:6])
            + f"{totals['generator-error']:>9}{sum(totals.values()):>8}"
        )
        lines += ["", f"{len(self.signatures)} failure signatures ({self.failure_count} failing cases):"]
        for signature, (count, first, kind, stages, detail) in sorted(
            self.signatures.items(), key=lambda item: (-item[1][0], item[0])
        ):
            lines.append(f"  {count:>6}  {signature}  [{kind}; {', '.join(sorted(stages))}]  first: --case {first}")
            lines.append(f"          {detail[:160]}")
        return "\n".join(lines)


def reproduce_command(settings: Settings, case: int) -> str:
    strategy = f" --strategy {settings.strategy}" if settings.strategy else ""
    return f"python benchmarks/fuzz_pipeline.py --seed {settings.seed}{strategy} --case {case}"


def _save_failure(out: Path, seeds: list[Seed], settings: Settings, result: CaseResult, saved: Counter) -> None:
    if all(saved[f.signature] >= 20 for f in result.failures):
        return
    for failure in result.failures:
        saved[failure.signature] += 1
    generated = make_case(seeds, settings.seed, result.case, settings.strategy)
    stem = out / f"case-{result.case:07d}"
    Path(f"{stem}{generated.suffix}").write_bytes(generated.data)
    report = [f"case {result.case} (--seed {settings.seed}), strategy {result.strategy}, outcome {result.outcome}, {len(generated.data)} bytes",
              f"input: {generated.description}", f"reproduce: {reproduce_command(settings, result.case)}", ""]  # fmt: skip
    for failure in result.failures:
        report += [f"[{failure.stage}] {failure.signature}", f"  {failure.detail}", failure.trace, ""]
    Path(f"{stem}.txt").write_text("\n".join(report), errors="backslashreplace")


def run_campaign(
    cases: int,
    *,
    workers: int = 2,
    first: int = 0,
    settings: Settings | None = None,
    seeds: list[Seed] | None = None,
    out: Path | None = None,
    progress: Callable[[str], None] | None = None,
    progress_every_s: float = 10.0,
) -> Summary:
    """Run cases first .. first+cases-1 in a pool of worker processes, replacing any that hang or die."""
    # A file built to hang the unpickler is refused after the command's read limit; a short base
    # keeps such cases from holding a worker for the default 10 s in each of the twelve verbs.
    os.environ.setdefault("OOMDOCTOR_READ_SECONDS", "1")
    settings = settings or Settings()
    seeds = seeds if seeds is not None else load_seeds()
    for seed in seeds:  # encoded once here, inherited by every forked worker
        for kind in ("p4", "p4nf", "p2", "p0", "json", "gzip"):
            seed.encoded(kind)
        for kind in ("p4nf", "p2", "p0"):
            for names in (_SCALAR_OPS, _INT_OPS, _STR_OPS, _MEMO_OPS):
                seed.ops_named(kind, names)
    summary = Summary(workers=workers, seeds=len(seeds))
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    saved: Counter = Counter()
    context = multiprocessing.get_context("fork")
    root = Path(tempfile.mkdtemp(prefix="oomdoctor-fuzz-"))
    pending = iter(range(first, first + cases))
    pool: list[_Worker] = []
    started = time.monotonic()
    last_progress = started
    interrupted = False

    def on_interrupt(signum, frame) -> None:
        nonlocal interrupted
        interrupted = True  # stop feeding; the summary covers the cases done so far

    previous_handler = signal.signal(signal.SIGINT, on_interrupt) if threading_main() else None

    def record(result: CaseResult) -> None:
        summary.add(result)
        if out is not None and result.failures:
            with contextlib.suppress(Exception):
                _save_failure(out, seeds, settings, result, saved)

    def feed(worker: _Worker) -> bool:
        case = next(pending, None)
        if case is None:
            worker.case = None
            return False
        worker.send(case)
        return True

    def replace(worker: _Worker) -> _Worker:
        worker.kill()
        shutil.rmtree(worker.workdir, ignore_errors=True)
        fresh = _Worker(context, seeds, settings, root, len(pool) + summary.cases)
        pool[pool.index(worker)] = fresh
        return fresh

    def lost(worker: _Worker, outcome: str, why: str) -> None:
        site, dump = _faulthandler_site(worker.workdir / "faulthandler.log")
        stage = worker.stage.value.decode(errors="replace")
        signature = f"{why} at {site}"
        strategy = settings.strategy or case_strategy(settings.seed, worker.case)
        record(
            CaseResult(
                worker.case,
                strategy,
                outcome,
                [Failure(stage, outcome, signature, f"{why} in stage {stage}", dump)],
                seconds=time.monotonic() - worker.started,
            )
        )

    try:
        for number in range(workers):
            pool.append(_Worker(context, seeds, settings, root, number))
        for worker in pool:
            feed(worker)
        while any(w.case is not None for w in pool) and not interrupted:
            busy = {w.connection: w for w in pool if w.case is not None}
            ready = multiprocessing.connection.wait(list(busy), timeout=0.25)
            for connection in ready:
                worker = busy[connection]
                try:
                    result = connection.recv()
                except (EOFError, OSError):
                    result = None
                if result is None:  # outside the except: a worker forked there would inherit its context
                    worker.process.join(2)
                    code = worker.process.exitcode
                    why = (
                        f"crash ({signal.Signals(-code).name})"
                        if code is not None and code < 0
                        else f"worker died (exit {code})"
                    )
                    lost(worker, "crash", why)
                    feed(replace(worker))
                    continue
                record(result)
                if result.recycle or worker.done >= settings.cases_per_worker:
                    worker = replace(worker)
                feed(worker)
            now = time.monotonic()
            for worker in list(pool):
                if (
                    worker.case is not None
                    and now - max(worker.started, worker.stage_started.value) > settings.time_limit_s + 2.0
                ):
                    lost(worker, "hang", f"hang over {settings.time_limit_s:.0f} s")
                    feed(replace(worker))
            if progress and now - last_progress >= progress_every_s:
                last_progress = now
                elapsed = now - started
                progress(
                    f"[{elapsed:7.1f} s] {summary.cases}/{cases} cases, {summary.cases / elapsed:.1f}/s, {summary.failure_count} failing, {len(summary.signatures)} signatures"
                )
    finally:
        if previous_handler is not None:
            signal.signal(signal.SIGINT, previous_handler)
        for worker in pool:
            worker.stop() if not interrupted else worker.kill()
        shutil.rmtree(root, ignore_errors=True)
        summary.seconds = time.monotonic() - started
        children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
        summary.peak_rss_bytes = max(summary.peak_rss_bytes, children)
    return summary


def threading_main() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def run_one(path: Path, time_limit_s: float) -> int:
    """One input in this process, each stage's result and every traceback printed; a stage over
    the time limit prints where it is stuck and ends the process."""
    faulthandler.enable()

    def on_stage(stage: str) -> None:
        faulthandler.cancel_dump_traceback_later()
        faulthandler.dump_traceback_later(time_limit_s, exit=True)

    with tempfile.TemporaryDirectory(prefix="oomdoctor-fuzz-") as folder:
        started = time.perf_counter()
        outcome, failures, _ = run_pipeline(path, Path(folder), on_stage=on_stage, verbose=True)
    faulthandler.cancel_dump_traceback_later()
    print(f"outcome: {outcome} ({time.perf_counter() - started:.2f} s, peak RSS {peak_rss_bytes() >> 20} MiB)")
    for failure in failures:
        print(f"  [{failure.stage}] {failure.signature}: {failure.detail}")
    return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join(__doc__.splitlines()[1:]),
    )
    parser.add_argument("--cases", type=int, default=1000, help="how many cases to run (default 1000)")
    parser.add_argument("--first", type=int, default=0, help="number of the first case (default 0)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--seed", type=int, default=0, help="campaign seed; a case is (seed, number)")
    parser.add_argument("--strategy", choices=STRATEGIES, default=None, help="use only this strategy")
    parser.add_argument("--out", type=Path, default=None, help="write each failing input and its report here")
    parser.add_argument("--case", type=int, default=None, help="re-run one case in this process, with tracebacks")
    parser.add_argument("--save", type=Path, default=None, help="with --case: also write its input here")
    parser.add_argument("--input", type=Path, default=None, help="run one file through the pipeline in this process")
    parser.add_argument(
        "--time-limit",
        type=float,
        default=30.0,
        help="seconds one stage of a case (a verb, the TUI step) may take before it counts as a hang (default 30)",
    )
    parser.add_argument("--memory-mib", type=int, default=4096, help="address-space limit of a worker (default 4096)")
    parser.add_argument(
        "--rss-mib",
        type=int,
        default=3072,
        help="peak RSS of a worker above which a case is a memory failure (default 3072)",
    )
    parser.add_argument("--no-corpus", action="store_true", help="seed from the fixtures only")
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="with --case or --input: run each verb in this process (no supervising child) and show any exception's traceback",
    )
    args = parser.parse_args(argv)
    if args.in_process:
        global IN_PROCESS
        IN_PROCESS = True
        os.environ["OOMDOCTOR_DEBUG"] = "1"

    if args.input is not None:
        return run_one(args.input, args.time_limit)
    seeds = load_seeds(use_corpus=not args.no_corpus)
    if args.case is not None:
        generated = make_case(seeds, args.seed, args.case, args.strategy)
        print(
            f"case {args.case} (--seed {args.seed}): {generated.strategy}, {len(generated.data)} bytes; {generated.description}"
        )
        with tempfile.TemporaryDirectory(prefix="oomdoctor-case-") as folder:
            path = args.save or Path(folder) / f"case-{args.case}{generated.suffix}"
            path.write_bytes(generated.data)
            return run_one(path, args.time_limit)
    settings = Settings(
        seed=args.seed,
        time_limit_s=args.time_limit,
        address_space_bytes=args.memory_mib << 20,
        rss_cap_bytes=args.rss_mib << 20,
        strategy=args.strategy,
    )
    print(
        f"{len(seeds)} seeds; cases {args.first}..{args.first + args.cases - 1}, seed {args.seed}, {args.workers} workers",
        flush=True,
    )
    summary = run_campaign(
        args.cases,
        workers=args.workers,
        first=args.first,
        settings=settings,
        seeds=seeds,
        out=args.out,
        progress=lambda line: print(line, flush=True),
    )
    print(summary.table())
    if args.out is not None and summary.failure_count:
        print(f"failing inputs and their reports: {args.out}")
    return 1 if summary.failure_count else 0


if __name__ == "__main__":
    sys.exit(main())
