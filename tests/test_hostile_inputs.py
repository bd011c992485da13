"""Every hostile input found by fuzzing the whole pipeline, built here, through the real command.

Each file goes through `oomdoctor report` (text, md, json), `info` and `redact` as a user runs them
(`python -m oomdoctor`, a separate process under a 3 GiB address-space limit and a time limit): the
outcome is a report (exit 0) or one line on stderr starting "oomdoctor:" and exit 2, never a
traceback, a hang, a crash or a blowup, and no raw control character reaches the terminal. Where
the hostile string is printed it is shown escaped.
"""

from __future__ import annotations

import os
import pickle
import re
import resource
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest

from tests.builders import BASE, one_block_snapshot

pytestmark = pytest.mark.slow

MEMORY_LIMIT_BYTES = 3 * 1024**3
TIME_LIMIT_S = 60
# Raw C0 (but newline), DEL, C1: what must never reach a terminal from a file.
RAW_CONTROL = re.compile(rb"[\x00-\x09\x0b-\x1f\x7f]|\xc2[\x80-\x9f]")
EVIL = "\x1b]0;pwned\x07\x1b]52;c;cHduZWQ=\x07\x1b[2J"


def laughs(levels):
    value = "ab"
    for _ in range(levels):
        value = [value, value]
    return value


def _short_unicode(text):
    raw = text.encode()
    return b"\x8c" + bytes([len(raw)]) + raw


def _tuple_bomb():
    out = bytearray(b"\x80\x04}" + b"\x8c\x02ab\x94" + b"0")
    for i in range(40):
        get = b"j" + struct.pack("<I", i)
        out += get + get + b"\x86\x94" + (b"0" if i < 39 else b"")
    return bytes(out) + b"K\x01s."


def _framed_stack(data, stack):
    data["segments"][0]["blocks"][0]["frames"] = stack
    data["device_traces"][0][0]["frames"] = stack
    return data


def _forward_frames_deep():
    data = one_block_snapshot()
    data["device_traces"][0][0].update(
        user_metadata="", compile_context="", pool_id=(0, 0), forward_frames=["PLACEHOLDER"], k1=1, k2=2
    )
    blob = pickle.dumps(data, protocol=2)
    return blob.replace(b"X\x0b\x00\x00\x00PLACEHOLDER", b"]" * 100000 + b"a" * 99999)


def _negative_device():
    data = one_block_snapshot()
    data["segments"][0]["device"] = -5
    data["device_traces"] = [[], []]
    return data


def _history_not_list():
    data = one_block_snapshot()
    block = data["segments"][0]["blocks"][0]
    del block["frames"]
    block["history"] = 7
    return data


def _sum_overflow():
    data = one_block_snapshot()
    block = data["segments"][0]["blocks"][0]
    data["segments"][0]["blocks"] = [
        dict(block, address=block["address"] + i, size=2**63 - 1, requested_size=2**63 - 1) for i in range(3)
    ]
    return data


def _json_gzip_bomb():
    compressor = zlib.compressobj(9, zlib.DEFLATED, 31)
    parts = [compressor.compress(b"[")]
    chunk = b"0," * (1 << 23)
    parts += [compressor.compress(chunk) for _ in range(32)]
    parts += [compressor.compress(b"0]"), compressor.flush()]
    return b"".join(parts)


def _frame_amplification():
    big = "/src/" + "a" * (3 << 19) + ".py"
    stack = [{"filename": big, "line": 1, "name": "f"}] * 8
    blocks = [
        {"address": BASE + i * 512, "size": 512, "requested_size": 512, "state": "active_allocated", "frames": stack}
        for i in range(300)
    ]
    segment = {
        "device": 0,
        "address": BASE,
        "total_size": 512 * 300,
        "stream": 0,
        "segment_type": "small",
        "blocks": blocks,
    }
    events = [
        {"action": "alloc", "addr": BASE + i * 512, "size": 512, "stream": 0, "frames": stack} for i in range(300)
    ]
    return {"segments": [segment], "device_traces": [events]}


# A list the pickle shares: written once, read at every reference. torch shares frame dicts only;
# a file of a megabyte sharing a list of SHARED items under SHARED places asks for 4e8 readings.
SHARED = 20_000


def _shared_events(**extra):
    return [
        {"action": "alloc", "addr": BASE + i * 512, "size": 512, "stream": 0, "time_us": i, "frames": [], **extra}
        for i in range(SHARED)
    ]


def _shared_blocks(frames=()):
    return [
        {"address": BASE + i * 512, "size": 512, "requested_size": 512, "state": "active_allocated",
         "frames": frames or []}
        for i in range(SHARED)
    ]  # fmt: skip


def _shared_segment(blocks, address=BASE):
    return {"device": 0, "address": address, "total_size": 512 * SHARED, "stream": 0, "segment_type": "large",
            "blocks": blocks}  # fmt: skip


def _shared_traces():
    return {"segments": [], "device_traces": [_shared_events()] * SHARED}


def _shared_block_lists():
    blocks = _shared_blocks()
    return {"segments": [_shared_segment(blocks, BASE + i * (1 << 30)) for i in range(SHARED)], "device_traces": [[]]}


def _shared_deep_stack():
    stack = [{"filename": f"/home/alice/m{i}.py", "line": i, "name": f"f{i}"} for i in range(2 * SHARED)]
    events = _shared_events()
    for event in events:
        event["frames"] = stack
    return {"segments": [_shared_segment(_shared_blocks(stack))], "device_traces": [events]}


def _shared_forward_frames():
    lines = [f'  File "/home/alice/m.py", line {i}, in f' for i in range(SHARED)]
    return {"segments": [], "device_traces": [_shared_events(user_metadata="", forward_frames=lines)]}


def _markdown_breakout():
    data = one_block_snapshot(
        oomdoctor={
            "argv": ['x`` </details><img src="https://evil.example/p.png"> @someone [click](https://evil.example) ``']
        }
    )
    stack = [{"filename": "/src/a.py\n```\n</details>\n\n# injected heading\n@someone\n", "line": 1, "name": "f"}]
    return _framed_stack(data, stack)


def _evidence_image():
    data = one_block_snapshot(oomdoctor={
        "tensors": [{"address": BASE, "device": 0, "component": "optimizer_state",
                     "name": "w.exp_avg ![x](https://evil.example/pixel.png) @someone", "size_bytes": 2 << 20}],
        "oom": {"device": 0, "alloc_bytes": 1 << 30},
    })  # fmt: skip
    data["device_traces"][0].append(
        {"action": "oom", "addr": 0, "size": 1 << 30, "stream": 0, "time_us": 2, "frames": [], "device_free": 0}
    )
    return data


def _segment_type(value):
    data = one_block_snapshot()
    data["segments"][0]["segment_type"] = value
    return data


# name -> (the file's bytes or data, the file's suffix)
REPRODUCERS = {
    "r01_json_bigint": (one_block_snapshot(oomdoctor={"rank": 2**64}), ".pickle"),
    "r01b_json_sum_overflow": (_sum_overflow(), ".pickle"),
    "r02_alloc_conf_digit": (
        one_block_snapshot(allocator_settings={"PYTORCH_CUDA_ALLOC_CONF": "large_segment_size_mb:\u00b2"}),
        ".pickle",
    ),
    "r03_divisions_digit": (
        one_block_snapshot(allocator_settings={"roundup_power2_divisions": {"\u00b2": 4}}),
        ".pickle",
    ),
    "r04_negative_device": (_negative_device(), ".pickle"),
    "r05_history_not_list": (_history_not_list(), ".pickle"),
    "r06_hugeint_human": (one_block_snapshot(oomdoctor={"device": {"total_memory_bytes": 2**1100}}), ".pickle"),
    "r07_deep_tuple_segv": (b"\x80\x04}" + b")" + b"\x85" * 10**6 + b"K\x01s.", ".pickle"),
    "r08_tuple_bomb_hash": (_tuple_bomb(), ".pickle"),
    "r09_recording_bomb": (one_block_snapshot(oomdoctor={"recording": {"max_entries": laughs(28)}}), ".pickle"),
    "r10_forward_frames_deep": (_forward_frames_deep(), ".pickle"),
    "r11_key_repr": (b"\x80\x04}" + b")" + b"\x85" * 100000 + b"K\x01s.", ".pickle"),
    "r12_tui_markup": (_segment_type("[/bold]"), ".pickle"),
    "r13_tensor_name_bomb": (
        one_block_snapshot(
            oomdoctor={
                "tensors": [{"address": BASE, "component": "parameter", "name": laughs(27), "size_bytes": 2 << 20}]
            }
        ),
        ".pickle",
    ),
    "r14_json_gzip_bomb": (_json_gzip_bomb(), ".json.gz"),
    "r15_refused_global_ansi": (
        b"\x80\x04" + _short_unicode("\x1b]0;pwned\x07\x1b[2Jos") + _short_unicode("system") + b"\x93.",
        ".pickle",
    ),
    "r16_text_report_ansi": (
        one_block_snapshot(filename=f"/src/{EVIL}train.py"),
        ".pickle",
    ),
    "r17_markdown_breakout": (_markdown_breakout(), ".pickle"),
    "r18_redact_regex_dos": (
        one_block_snapshot(filename="/src/" + "a-rank0-" * 16000 + ".py"),
        ".pickle",
    ),
    "r19_markdown_evidence_image": (_evidence_image(), ".pickle"),
    "r20_json_frame_amplification": (_frame_amplification(), ".pickle"),
    "r21_tui_click_overwrite": (
        _segment_type("[@click=app.screenshot('victim.txt','.')]click to see blocks[/]"),
        ".pickle",
    ),
    "r22_redact_leaks": (
        one_block_snapshot(oomdoctor={"host": "node7", "pid": 4242, "argv": ["/home/alice/proj/train.py"]}),
        ".pickle",
    ),
    "r23_shared_trace": (_shared_traces(), ".pickle"),
    "r24_shared_blocks": (_shared_block_lists(), ".pickle"),
    "r25_shared_deep_stack": (_shared_deep_stack(), ".pickle"),
    "r26_shared_forward_frames": (_shared_forward_frames(), ".pickle"),
}

# What a reproducer must give, beyond check_outcome's rules (which would let an internal error's
# one line pass): a report (exit 0), or the refusal that names the fault.
OUTCOMES = {
    "r23_shared_trace": "wrong structure: device 1's trace is the same list as device 0's (the pickle shares it)",
    "r24_shared_blocks": "wrong structure: segment 1's blocks are the same list as segment 0's (the pickle shares it)",
    "r25_shared_deep_stack": "report",
    "r26_shared_forward_frames": "report",
}

VERBS = {
    "text": ["report", "{file}"],
    "md": ["report", "{file}", "--format", "md"],
    "json": ["report", "{file}", "--format", "json"],
    "info": ["info", "{file}"],
    "redact": ["redact", "{file}", "{out}"],
}


def _limit_memory():
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT_BYTES, MEMORY_LIMIT_BYTES))


def run_command(arguments, cwd, env_extra=None, code=None):
    """`python -m oomdoctor ARGUMENTS`, or `python -c CODE ARGUMENTS`, as a user runs it."""
    env = dict(os.environ, OOMDOCTOR_READ_SECONDS="3", **(env_extra or {}))
    env.pop("OOMDOCTOR_IN_PROCESS", None)
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, *(["-c", code] if code else ["-m", "oomdoctor"]), *arguments],
        cwd=cwd, env=env, capture_output=True, timeout=TIME_LIMIT_S, preexec_fn=_limit_memory,
    )  # fmt: skip
    return result, time.monotonic() - started


def write_reproducer(name, directory):
    content, suffix = REPRODUCERS[name]
    path = Path(directory) / f"{name}{suffix}"
    path.write_bytes(content if isinstance(content, bytes) else pickle.dumps(content, protocol=4))
    return path


def check_outcome(result, seconds):
    assert seconds < TIME_LIMIT_S
    assert result.returncode in (0, 2), (result.returncode, result.stderr[-2000:])
    assert b"Traceback" not in result.stderr, result.stderr[-2000:]
    if result.returncode == 2:
        lines = result.stderr.decode("utf-8", "replace").splitlines()
        assert len(lines) == 1 and lines[0].startswith("oomdoctor: "), lines[:3]
        assert len(lines[0]) <= 1200
    assert not RAW_CONTROL.search(result.stderr)


@pytest.mark.parametrize("verb", sorted(VERBS))
@pytest.mark.parametrize("name", sorted(REPRODUCERS))
def test_reproducer_gets_a_report_or_one_line(name, verb, tmp_path):
    path = write_reproducer(name, tmp_path)
    out = tmp_path / "redacted.pickle"
    arguments = [a.format(file=path, out=out) for a in VERBS[verb]]
    result, seconds = run_command(arguments, tmp_path)
    check_outcome(result, seconds)
    expected = OUTCOMES.get(name)
    if expected == "report":
        assert result.returncode == 0, result.stderr[-2000:]
    elif expected is not None:
        assert result.returncode == 2 and expected.encode() in result.stderr, result.stderr[-2000:]
    if verb in ("text", "md", "info"):
        assert not RAW_CONTROL.search(result.stdout), RAW_CONTROL.search(result.stdout)
    if verb == "redact" and result.returncode == 0:  # the copy it wrote reads as a snapshot
        again, _ = run_command(["info", str(out)], tmp_path)
        assert again.returncode == 0, again.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) in ([path.name], sorted([path.name, out.name]))


def test_escapes_in_frames_are_shown_escaped(tmp_path):
    path = write_reproducer("r16_text_report_ansi", tmp_path)
    result, _ = run_command(["report", str(path)], tmp_path)
    assert result.returncode == 0
    assert b"\x1b" not in result.stdout
    assert b"/src/\\x1b]0;pwned\\x07\\x1b]52;c;cHduZWQ=\\x07\\x1b[2Jtrain.py" in result.stdout


def test_refused_global_name_is_escaped(tmp_path):
    path = write_reproducer("r15_refused_global_ansi", tmp_path)
    result, _ = run_command(["report", str(path)], tmp_path)
    assert result.returncode == 2
    assert b"\\x1b]0;pwned\\x07\\x1b[2Jos.system" in result.stderr


@pytest.mark.parametrize("name", ["r07_deep_tuple_segv", "r08_tuple_bomb_hash"])
def test_unpickler_bombs_refused_in_one_line(name, tmp_path):
    path = write_reproducer(name, tmp_path)
    result, seconds = run_command(["report", str(path)], tmp_path)
    check_outcome(result, seconds)
    assert result.returncode == 2
    assert b"refused" in result.stderr and str(path).encode() in result.stderr
    assert seconds < 15


# The command as `python -m oomdoctor` runs it, on a host whose CPUs other work keeps busy (the
# folder reader then asks for no parallel workers)
BUSY_HOST = (
    "import sys, oomdoctor.load.folder as f; f.idle_cpus = lambda cpus=None: 0.0; "
    "from oomdoctor.cli import entry; sys.argv[0] = 'oomdoctor'; entry()"
)


@pytest.mark.parametrize("host", ["idle", "busy"])
def test_hash_bomb_in_a_folder_is_one_skipped_file(tmp_path, host):
    """The per-file time limit of a folder report: the bomb is skipped, the other rank is read,
    also where a busy host reads the files one after the other."""
    folder = tmp_path / "ranks"
    folder.mkdir()
    (folder / "oom-rank0-h-1-20250101T000000Z.pickle").write_bytes(pickle.dumps(_evidence_image(), protocol=4))
    (folder / "oom-rank1-h-1-20250101T000000Z.pickle").write_bytes(_tuple_bomb())
    if host == "busy":
        result, seconds = run_command(["report", str(folder)], tmp_path, code=BUSY_HOST)
    else:
        result, seconds = run_command(["report", str(folder)], tmp_path)
    assert result.returncode == 0, result.stderr
    assert seconds < 30
    text = result.stdout.decode()
    assert "skipped oom-rank1-h-1-20250101T000000Z.pickle: the process reading it died" in text
    assert "rank 0" in text


def test_metadata_dropped_with_a_note(tmp_path):
    from oomdoctor.load import load

    path = write_reproducer("r01_json_bigint", tmp_path)
    loaded = load(path)
    assert loaded.oomdoctor is None
    assert loaded.notes and "ignored" in loaded.notes[0]
    bomb = load(write_reproducer("r09_recording_bomb", tmp_path))
    assert bomb.oomdoctor is None and bomb.notes


def test_pipes_and_devices_are_sniffed_before_they_are_read(tmp_path):
    if not os.path.exists("/dev/zero"):
        pytest.skip("no /dev/zero here")
    result, seconds = run_command(["info", "/dev/zero"], tmp_path)
    check_outcome(result, seconds)
    assert result.returncode == 2 and b"not a snapshot" in result.stderr
    assert seconds < 10


def test_internal_errors_are_one_line(monkeypatch, capsys, tmp_path):
    """An exception oomdoctor did not foresee still ends in one line and exit 2."""
    from oomdoctor import cli, pipeline

    path = write_reproducer("r16_text_report_ansi", tmp_path)

    def broken(*_args, **_kwargs):
        raise ZeroDivisionError("made up for the test")

    monkeypatch.setattr(pipeline, "render_report", broken)
    assert cli.main(["report", str(path)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "internal error (ZeroDivisionError: made up for the test" in err[0]
    assert str(path) in err[0]


def test_output_is_written_whole(monkeypatch):
    """A write() that takes less than it was given (Linux stops at about 2 GiB) is continued."""
    import io

    from oomdoctor.commands import write_output

    class Short(io.RawIOBase):
        def __init__(self):
            self.data = bytearray()

        def writable(self):
            return True

        def write(self, chunk):
            taken = bytes(chunk[:7])
            self.data += taken
            return len(taken)

    raw = Short()

    class Stdout:
        buffer = raw

        def flush(self):
            pass

    monkeypatch.setattr(sys, "stdout", Stdout())
    write_output(b"x" * 1000 + b"end")
    assert bytes(raw.data) == b"x" * 1000 + b"end"


def test_a_huge_frame_name_is_shortened_once_at_load_keeping_its_ends():
    """Every rule reads a frame wherever it recurs: a megabyte name shared by thousands of frames
    (r20) must cost its length once, not times theirs."""
    from oomdoctor.load import load
    from oomdoctor.load.stacks import FRAME_TEXT_LIMIT

    data = _frame_amplification()
    snapshot = load(pickle.dumps(data, protocol=4))
    frames = {frame for segment in snapshot.segments for block in segment.blocks for frame in block.frames}
    assert len(frames) == 1  # one shared Frame, as the file shares one dict
    (frame,) = frames
    original = data["segments"][0]["blocks"][0]["frames"][0]["filename"]
    assert len(frame.filename) < FRAME_TEXT_LIMIT + 100 < len(original)
    assert frame.filename.startswith("/src/aaa") and frame.filename.endswith("aaa.py")
    left_out = len(original) - 2 * (FRAME_TEXT_LIMIT // 2)
    assert f"({left_out:,} characters left out)" in frame.filename
    assert frame.name == "f"  # a short name is left as it is


def test_a_frame_name_at_the_limit_is_kept_whole():
    from oomdoctor.load import load
    from oomdoctor.load.stacks import FRAME_TEXT_LIMIT

    name = "/src/" + "b" * (FRAME_TEXT_LIMIT - 8) + ".py"
    assert len(name) == FRAME_TEXT_LIMIT
    data = one_block_snapshot(filename=name)
    snapshot = load(pickle.dumps(data, protocol=4))
    assert {f.filename for s in snapshot.segments for b in s.blocks for f in b.frames} == {name}


def test_frame_rules_read_each_distinct_frame_once(monkeypatch):
    """The phase and checkpoint rules are asked once per distinct frame, not per block holding it."""
    from oomdoctor.analysis import analyse, checkpointing, phases
    from oomdoctor.load import load

    phases._frame_kind.cache_clear()
    checkpointing._saves.cache_clear()
    analyse(load(pickle.dumps(_frame_amplification(), protocol=4)))
    assert phases._frame_kind.cache_info().misses == 1
    assert checkpointing._saves.cache_info().misses == 1
