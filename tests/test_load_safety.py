"""Opening a stranger's file runs nothing from it, and every bad input is one line and exit 2."""

from __future__ import annotations

import gzip
import os
import pickle
import random
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oomdoctor.analysis.contents import describe
from oomdoctor.cli import main
from oomdoctor.errors import LoadError
from oomdoctor.load import load
from oomdoctor.views.info import to_json, to_text
from tests.builders import make_snapshot
from tests.conftest import CORPUS


class _RunsCommand:
    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


def _hostile_pickles(marker: Path) -> dict[str, bytes]:
    touch = f"touch {marker}"
    quoted = touch.encode()
    snapshot = make_snapshot()
    snapshot["device_traces"][0][0]["frames"] = [_RunsCommand(touch)]
    return {
        # GLOBAL + REDUCE, the classic: os.system('touch marker')
        "global-reduce": b"cos\nsystem\n(S'" + quoted + b"'\ntR.",
        # STACK_GLOBAL + REDUCE, what pickle.dumps writes for protocol 4
        "stack-global-reduce": pickle.dumps(_RunsCommand(touch), protocol=4),
        # INST: module and name inline, called with the marked arguments
        "inst": b"(S'" + quoted + b"'\nios\nsystem\n.",
        # OBJ: class from GLOBAL after the mark
        "obj": b"(cos\nsystem\nS'" + quoted + b"'\no.",
        # NEWOBJ on a class found by GLOBAL
        "newobj": b"\x80\x02cos\nsystem\n)\x81.",
        # BUILD: __setstate__ of an object made from a global
        "build": b"\x80\x02cos\nsystem\n)\x81}b.",
        # the hostile object buried inside an otherwise valid snapshot
        "nested-in-snapshot": pickle.dumps(snapshot, protocol=4),
        # the copyreg extension registry (EXT1) resolves through find_class too
        "ext1": b"\x80\x02\x82\x01.",
        # persistent ids
        "persid": b"Pos.system\n.",
    }


@pytest.mark.parametrize("kind", sorted(_hostile_pickles(Path("x"))))
def test_hostile_pickles_are_refused_and_nothing_runs(tmp_path, kind: str) -> None:
    marker = tmp_path / "ran"
    path = tmp_path / "hostile.pickle"
    path.write_bytes(_hostile_pickles(marker)[kind])
    with pytest.raises(LoadError) as refused:
        load(path)
    assert not marker.exists()
    message = str(refused.value)
    assert "\n" not in message
    if kind not in ("ext1", "persid", "build"):
        assert "refused" in message and "system" in message  # names the global it would have called


def test_refusal_names_the_global(tmp_path) -> None:
    path = tmp_path / "hostile.pickle"
    path.write_bytes(b"cos\nsystem\n(S'true'\ntR.")
    with pytest.raises(LoadError, match=r"the global 'os\.system'.*nothing from the file was run"):
        load(path)


def test_build_without_a_global_is_refused() -> None:
    # BUILD applied to a plain dict: there is no object whose state it could set
    with pytest.raises(LoadError):
        load(b"\x80\x04}}\x8c\x01a\x94K\x01sb.")


def _corpus_or_synthetic_pickle() -> bytes:
    if CORPUS is not None:
        return (CORPUS / "snapshots" / "tiny_5_events__octree_nca__cuda_single_step.pickle").read_bytes()
    return pickle.dumps(make_snapshot(), protocol=4)


@pytest.mark.parametrize("fraction", [0.0005, 0.01, 0.1, 0.5, 0.9, 0.999])
def test_truncated_files_say_truncated(tmp_path, fraction: float) -> None:
    data = _corpus_or_synthetic_pickle()
    path = tmp_path / "truncated.pickle"
    path.write_bytes(data[: max(1, int(len(data) * fraction))])
    with pytest.raises(LoadError, match="truncated"):
        load(path)


def test_truncated_gzip_and_json(tmp_path) -> None:
    compressed = gzip.compress(pickle.dumps(make_snapshot(), protocol=4))
    with pytest.raises(LoadError, match="truncated|corrupt"):
        load(compressed[: len(compressed) // 2])
    text = orjson.dumps(make_snapshot())
    with pytest.raises(LoadError, match="truncated"):
        load(text[: len(text) // 2])


@pytest.mark.parametrize("seed", range(8))
def test_random_bytes_are_refused(seed: int) -> None:
    rng = random.Random(seed)
    data = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 4096)))
    if seed % 2:
        data = b"\x80\x04" + data  # looks like a pickle at first
    with pytest.raises(LoadError) as refused:
        load(data)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "empty file"),
        (pickle.dumps(42, protocol=4), "holds a int"),
        (pickle.dumps({"traceEvents": []}, protocol=4), "without 'segments'"),
        (pickle.dumps({"segments": {}}, protocol=4), "'segments' is a dict"),
        (pickle.dumps({"segments": [1]}, protocol=4), "segment 0 is a int"),
        (pickle.dumps({"segments": [], "device_traces": [[{"size": 1}]]}, protocol=4), "'action' is missing"),
        (
            pickle.dumps({"segments": [], "device_traces": [[{"action": "alloc", "size": "1"}]]}, protocol=4),
            "'size' is a str",
        ),
        (
            pickle.dumps({"segments": [], "device_traces": [[{"action": "alloc", "size": 2**70}]]}, protocol=4),
            "64 bits",
        ),
        (b"GIF89a not a snapshot", "not a snapshot"),
        (b'{"segments": 3', "truncated"),
    ],
)
def test_wrong_inputs_get_one_clear_line(tmp_path, capsys, content: bytes, message: str) -> None:
    path = tmp_path / "input.pickle"
    path.write_bytes(content)
    assert main(["info", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and captured.err.startswith("oomdoctor: ")
    assert message in captured.err


def test_unreadable_paths(tmp_path, capsys) -> None:
    assert main(["info", str(tmp_path / "missing.pickle")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["info", str(tmp_path)]) == 2
    assert "no snapshot files in this folder" in capsys.readouterr().err  # info DIR reads a folder of rank dumps
    if os.geteuid() != 0:  # root reads anything
        locked = tmp_path / "locked.pickle"
        locked.write_bytes(pickle.dumps(make_snapshot()))
        locked.chmod(0)
        assert main(["info", str(locked)]) == 2
        assert "permission denied" in capsys.readouterr().err


@pytest.mark.slow
def test_cli_process_prints_no_traceback_and_runs_nothing(tmp_path) -> None:
    marker = tmp_path / "ran"
    cases = {
        "hostile.pickle": _hostile_pickles(marker)["stack-global-reduce"],
        "truncated.pickle": _corpus_or_synthetic_pickle()[:500],
        "random.bin": bytes(random.Random(1).randrange(256) for _ in range(1000)),
        "empty.pickle": b"",
    }
    for name, content in cases.items():
        path = tmp_path / name
        path.write_bytes(content)
        done = subprocess.run([sys.executable, "-m", "oomdoctor", "info", str(path)], capture_output=True, text=True)
        assert done.returncode == 2, name
        assert done.stdout == "" and "Traceback" not in done.stderr
        assert done.stderr.count("\n") == 1, done.stderr
    assert not marker.exists()


# Fuzzing: mutated real snapshots in every container; whatever happens, no exception other than
# LoadError escapes, and whatever loads can be summarised and iterated.


def _fuzz_seeds() -> list[bytes]:
    synthetic = make_snapshot()
    seeds = [
        pickle.dumps(synthetic, protocol=4),
        pickle.dumps(synthetic, protocol=2),
        gzip.compress(pickle.dumps(synthetic, protocol=4)),
        orjson.dumps(synthetic),
        pickle.dumps(synthetic["segments"], protocol=4),
    ]
    if CORPUS is not None:
        for name in (
            "tiny_5_events__octree_nca__cuda_single_step.pickle",
            "tiny__how_diffusion_models_work__my_snapshot.pickle",
            "device1_only_empty_traces__select_n__snapshot.pickle",
            "empty__hitsbe__my_snapshot.pickle",
        ):
            seeds.append((CORPUS / "snapshots" / name).read_bytes())
    return seeds


SEEDS = _fuzz_seeds()

_mutation = st.tuples(
    st.sampled_from(["flip", "set", "delete", "insert", "duplicate", "truncate"]),
    st.floats(min_value=0.0, max_value=1.0),
    st.integers(min_value=0, max_value=255),
    st.integers(min_value=1, max_value=64),
)


def _mutate(data: bytes, mutations) -> bytes:
    buffer = bytearray(data)
    for kind, where, value, length in mutations:
        if not buffer:
            break
        at = min(int(where * len(buffer)), len(buffer) - 1)
        if kind == "flip":
            buffer[at] ^= 1 << (value % 8)
        elif kind == "set":
            buffer[at] = value
        elif kind == "delete":
            del buffer[at : at + length]
        elif kind == "insert":
            buffer[at:at] = bytes([value]) * length
        elif kind == "duplicate":
            buffer[at:at] = buffer[at : at + length]
        else:
            del buffer[at:]
    return bytes(buffer)


def _exercise(snapshot) -> None:
    contents = describe(snapshot, "fuzzed")
    to_json(contents)
    to_text(contents)
    for trace in snapshot.traces:
        for index, event in enumerate(trace):
            assert event.frames == trace.frames_at(index)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.sampled_from(range(len(SEEDS))), mutations=st.lists(_mutation, min_size=1, max_size=4))
def test_fuzzed_inputs_load_or_fail_with_one_line(seed: int, mutations) -> None:
    data = _mutate(SEEDS[seed], mutations)
    try:
        snapshot = load(data, max_bytes=64 * 1024**2)
    except LoadError as error:
        assert "\n" not in str(error)
        return
    _exercise(snapshot)


def test_absurd_bytearray_is_refused_quietly(capsys) -> None:
    # protocol 5 BYTEARRAY8 claiming 2**62 bytes: malloc fails inside the C unpickler
    for _ in range(20):
        with pytest.raises(LoadError, match="ran out of memory"):
            load(b"\x80\x05\x96" + (2**62).to_bytes(8, "little") + b"abc.")
    assert capsys.readouterr().err == ""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the memory cap uses RLIMIT_AS on Linux")
def test_memo_index_bomb_is_refused_without_taking_the_memory() -> None:
    # LONG_BINPUT 2**31-1: CPython would fill a 32 GiB memo table for this 9-byte file
    code = (
        "import resource\n"
        "from oomdoctor.load import load\n"
        "from oomdoctor.errors import LoadError\n"
        "try:\n"
        "    load(b'\\x80\\x02]r\\xff\\xff\\xff\\x7f.')\n"
        "except LoadError as error:\n"
        "    print(error)\n"
        "print(next(int(l.split()[1]) // 1024 for l in open('/proc/self/status') if l.startswith('VmHWM')))\n"
        "print(resource.getrlimit(resource.RLIMIT_AS)[0] == resource.RLIM_INFINITY)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    # VmHWM, not ru_maxrss: the latter can carry this (parent) process's peak across exec
    message, peak_mib, limit_restored = done.stdout.splitlines()
    assert "ran out of memory" in message
    assert int(peak_mib) < 1024
    assert limit_restored == "True"


def test_a_trace_stream_beyond_64_bits_is_refused_in_one_line():
    """Every int the loader passes on fits in 64 bits (a 16,000-bit stream reached the JSON report)."""
    import pickle

    from oomdoctor.errors import LoadError
    from oomdoctor.load import load

    events = [{"action": "alloc", "addr": 1 << 40, "size": 512, "stream": 1 << 16000}]
    data = {"segments": [], "device_traces": [events]}
    with pytest.raises(LoadError, match="does not fit in 64 bits"):
        load(pickle.dumps(data, protocol=4))
