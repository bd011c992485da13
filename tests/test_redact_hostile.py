"""Redaction of strangers' dumps: nothing identifying survives in any field of `oomdoctor redact`'s copy
or of `report --redact`, the copy keeps its verdict, every step is linear in the size of the text,
and OUT is never replaced behind a link without --force."""

from __future__ import annotations

import copy
import os
import pickle
import time

import orjson
import pytest

from oomdoctor.cli import main
from oomdoctor.load import load, load_raw
from oomdoctor.redact import REDACTED, Redactor, redact_snapshot_data, redactor_for_data
from tests.conftest import FIXTURES

FIXTURE = FIXTURES / "dumps" / "optimizer-state-buildup-mlp-adam.pickle"
HOME = "/home/alice/proj/"
IDENTIFYING = (b"alice", b"node7", b"4242", b"31337", b"/home/")
DUMP_NAME = "oom-rank0-node7-4242-20250101T000000Z.pickle"
OOM_MESSAGE = (
    "CUDA out of memory. Tried to allocate 16.00 MiB. GPU 0 has a total capacity of 240.00 MiB of which "
    "2.00 MiB is free. Process 4242 has 79.10 GiB memory in use. Process 31337 has 1.00 GiB memory in use."
)
TRACEBACK = f'Traceback (most recent call last):\n  File "{HOME}train.py", line 36, in main\n    optimizer.step()\n'


def _stack() -> list[dict]:
    return [
        {"filename": f"{HOME}model.py", "line": 5, "name": "alice_forward", "fx_node_op": "call_function",
         "fx_node_name": "alice_linear", "fx_node_target": "alice.mod",
         "fx_original_trace": f'File "{HOME}model.py", line 5, in forward on node7'},
        {"filename": f"{HOME}train.py", "line": "alice", "name": "main"},  # a string where a number belongs
    ]  # fmt: skip


def _hostile_data(traces_key: str = "device_traces") -> dict:
    """The fixture as alice ran it on node7 as pid 4242, with her name in every field torch and
    oomdoctor write, in keys neither writes, and in torch 2.14's pinned-host keys."""
    data = load_raw(FIXTURE)
    seen: set[int] = set()

    def frames(item: dict) -> None:
        stack = item.get("frames") or ()
        for frame in stack:
            if id(frame) not in seen:
                seen.add(id(frame))
                if not frame["filename"].startswith("/"):
                    frame["filename"] = HOME + frame["filename"]
        if stack:
            stack[-1]["name"] = "main_for_alice"  # the outermost frame: the script's

    for segment in data["segments"]:
        frames(segment)
        for block in segment["blocks"]:
            frames(block)
    trace = data["device_traces"][0]
    for event in trace:
        frames(event)
        event["user_metadata"] = f"{HOME}cfg.yaml"
        event["compile_context"] = "alice@node7"
    trace[0]["forward_frames"] = [f'File "{HOME}model.py", line 5, in forward', "alice was here"]
    trace[0]["frames"] = trace[0].get("frames", []) + _stack()
    data["segments"][0]["forward_frames"] = [f'File "{HOME}model.py", line 9, in forward']
    data["segments"][1]["active_size"] = "alice's"  # (torch writes a number; nothing reads it)
    data["segments"][0]["blocks"][0]["forward_frames"] = ["node7: alice's block"]
    data["external_annotations"].append(
        {"name": f"{HOME}train.py:alice_scope", "stage": "END", "device": 0, "time_us": 1, "owner": "alice"}
    )
    data["allocator_settings"]["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:False"
    data["allocator_settings"]["launched_by"] = "alice@node7"
    data["host_segments"] = [
        {
            "address": 1,
            "total_size": 4096,
            "blocks": [{"address": 1, "size": 4096, "state": "active_allocated", "frames": _stack()}],
            "frames": _stack(),
        }
    ]
    data["host_traces"] = [
        [
            {
                "action": "alloc",
                "addr": 1,
                "size": 4096,
                "stream": 0,
                "time_us": 1,
                "frames": _stack(),
                "user_metadata": "alice",
            }
        ]
    ]
    meta = data["oomdoctor"]
    meta["host"], meta["pid"] = "node7", 4242
    meta["argv"] = [f"{HOME}train.py", "--out", "/scratch/alice/out", "--tag=alice@node7"]
    meta["exception"]["message"] = OOM_MESSAGE
    meta["exception"]["traceback"] = TRACEBACK
    meta["tensors"][0]["name"] = "alice_lora.weight"
    meta["device"]["name"] = "node7's GPU"
    meta["versions"]["torch"] = "2.13.0+alice"
    meta["alloc_conf"] = {"PYTORCH_CUDA_ALLOC_CONF": f"expandable_segments:False,dir={HOME}"}
    meta["cluster"] = {"user": "alice", "nodes": ["node7", "node8"], "cmd": "kill -9 4242", "pair": ("alice", 1)}
    meta["recording"]["operator"] = "alice"
    # (values the loader's metadata would refuse whole: bytes, sets, keys that are not strings)
    data["notes"] = {
        "by": "alice on node7",
        "pids": "4242 31337",
        "alice": [1, 2.5, None, True],
        "raw": b"alice",
        "set": frozenset({"alice"}),
        ("alice", 1): "x",
    }
    if traces_key != "device_traces":
        data[traces_key] = data.pop("device_traces")
    return data


def _write(path, data) -> str:
    path.write_bytes(pickle.dumps(data, protocol=4))
    return str(path)


def _json_report(path, capsys, *extra: str) -> dict:
    assert main(["report", str(path), "--format", "json", *extra]) == 0
    return orjson.loads(capsys.readouterr().out)


def _verdict(report: dict) -> dict:
    return {k: report[k] for k in ("verdict", "confidence", "components", "accounting")}


def _shape(value):
    """The data with every string blanked: what redaction must not change."""
    if isinstance(value, (str, bytes)):
        return "s"
    if isinstance(value, dict):
        return {_shape(k) if isinstance(k, (str, tuple)) else k: _shape(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_shape(v) for v in value)
    if isinstance(value, frozenset):
        return frozenset(_shape(v) for v in value)
    return value


@pytest.mark.parametrize("traces_key", ["device_traces", "traces"])
def test_redacted_copy_keeps_nothing_identifying_and_the_same_verdict(tmp_path, capsys, traces_key):
    source = _write(tmp_path / DUMP_NAME, _hostile_data(traces_key))
    out = tmp_path / "shared.pickle"
    before = _json_report(source, capsys)
    assert before["verdict"] == "optimizer-state-buildup"
    assert main(["redact", source, str(out)]) == 0
    written = out.read_bytes()
    for word in IDENTIFYING:
        assert word not in written, word
    assert _verdict(_json_report(out, capsys)) == _verdict(before)
    load(out)

    original, redacted = _hostile_data(traces_key), load_raw(out)
    assert _shape(redacted) == _shape(original)
    # torch's and oomdoctor's fixed vocabulary is kept as written
    events = lambda d: d[traces_key][0]  # noqa: E731
    assert [e["action"] for e in events(redacted)] == [e["action"] for e in events(original)]
    assert [(s["segment_type"], [b["state"] for b in s["blocks"]]) for s in redacted["segments"]] == [
        (s["segment_type"], [b["state"] for b in s["blocks"]]) for s in original["segments"]
    ]
    assert [a["stage"] for a in redacted["external_annotations"]] == [
        a["stage"] for a in original["external_annotations"]
    ]
    assert redacted["external_annotations"][0]["name"] == "Optimizer.step#Adam.step"
    meta = redacted["oomdoctor"]
    assert meta["markers"] == original["oomdoctor"]["markers"]
    assert [(t["component"], t["dtype"]) for t in meta["tensors"]] == [
        (t["component"], t["dtype"]) for t in original["oomdoctor"]["tensors"]
    ]
    assert meta["recording"]["stacks"] == "python" and meta["recording"]["operator"] == REDACTED
    # what each kind of field became
    assert meta["host"] == "<host>" and meta["pid"] is None
    assert meta["argv"] == ["<project>/train.py", "--out", "<path>/out", "--tag=<user>@<host>"]
    assert "Process <pid> has 79.10 GiB memory in use. Process <pid> has 1.00 GiB" in meta["exception"]["message"]
    assert 'File "<project>/train.py", line 36, in main' in meta["exception"]["traceback"]
    assert meta["tensors"][0]["name"] == "<user>_lora.weight"
    first = events(redacted)[0]
    assert first["user_metadata"] == "<project>/cfg.yaml" and first["compile_context"] == "<user>@<host>"
    assert first["forward_frames"] == ['File "<project>/model.py", line 5, in forward', "<user> was here"]
    fx = first["frames"][-2]
    assert (fx["name"], fx["fx_node_op"], fx["fx_node_name"], fx["fx_node_target"]) == (
        "<user>_forward",
        "call_function",
        "<user>_linear",
        "<user>.mod",
    )
    assert fx["fx_original_trace"] == 'File "<project>/model.py", line 5, in forward on <host>'
    assert {e["frames"][-1]["name"] for e in events(redacted)[1:] if e.get("frames")} == {"main_for_<user>"}
    host_frame = redacted["host_traces"][0][0]["frames"][0]
    assert host_frame["filename"] == "<project>/model.py" and redacted["host_traces"][0][0]["action"] == "alloc"
    assert redacted["host_segments"][0]["blocks"][0]["state"] == "active_allocated"
    assert redacted["segments"][1]["active_size"] == REDACTED and first["frames"][-1]["line"] == REDACTED
    # strings under keys nobody writes are dropped, numbers kept
    assert redacted["notes"] == {
        "by": REDACTED,
        "pids": REDACTED,
        "<user>": [1, 2.5, None, True],
        "raw": REDACTED.encode(),
        "set": frozenset({"<user>"}),
        ("<user>", 1): REDACTED,
    }
    assert meta["cluster"] == {"user": REDACTED, "nodes": [REDACTED, REDACTED], "cmd": REDACTED, "pair": (REDACTED, 1)}
    assert redacted["allocator_settings"]["launched_by"] == REDACTED
    assert (
        redacted["allocator_settings"]["roundup_power2_divisions"]
        == original["allocator_settings"]["roundup_power2_divisions"]
    )


def test_redacting_twice_changes_nothing_more(tmp_path):
    source = _write(tmp_path / DUMP_NAME, _hostile_data())
    once, twice = tmp_path / "once.pickle", tmp_path / "twice.pickle"
    assert main(["redact", source, str(once)]) == 0
    assert main(["redact", str(once), str(twice)]) == 0
    assert load_raw(once) == load_raw(twice)


@pytest.mark.parametrize("output_format", ["text", "md", "json"])
def test_report_redact_keeps_nothing_identifying(tmp_path, capsys, output_format):
    source = _write(tmp_path / DUMP_NAME, _hostile_data())
    assert main(["report", source, "--format", output_format]) == 0
    plain = capsys.readouterr().out.encode()
    assert b"alice" in plain  # the report shows the personal data: the test below could fail
    assert main(["report", source, "--format", output_format, "--redact"]) == 0
    redacted = capsys.readouterr().out.encode()
    for word in IDENTIFYING:
        assert word not in redacted, word
    if output_format == "json":
        assert _verdict(orjson.loads(redacted)) == _verdict(orjson.loads(plain))
    else:
        assert b"oom-rank0-<host>-<pid>-20250101T000000Z.pickle" in redacted


def test_the_model_and_the_data_learn_the_same_names():
    data = _hostile_data()
    from_data = redactor_for_data(data)
    from_model = Redactor.from_snapshot(load(pickle.dumps(data, protocol=4)))
    assert from_data.users == from_model.users == ("alice",)
    assert from_data.hosts == from_model.hosts == ("node7",)
    assert from_data.project_roots == from_model.project_roots == ("/home/alice/proj",)
    assert from_data.pids == from_model.pids == (4242,)


def test_names_learned_only_from_text_are_redacted_too():
    data = {
        "segments": [],
        "device_traces": [
            [
                {
                    "action": "alloc",
                    "addr": 1,
                    "size": 1,
                    "stream": 0,
                    "user_metadata": "/Users/bob/x.cfg",
                    "compile_context": "bob's",
                }
            ]
        ],
    }
    redactor = redactor_for_data(data)
    assert redactor.users == ("bob",)
    redact_snapshot_data(data, redactor)
    assert b"bob" not in pickle.dumps(data)


# -- the text rules ------------------------------------------------------------------------------


@pytest.fixture
def redactor() -> Redactor:
    return Redactor.learn(
        host="gpu-node-7.cluster.example.com",
        pid=4242,
        filenames=["/home/alice/x.py", "/home/al/y.py", "/home/josé/z.py"],
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("oom-rank0-gpu-node-7-4242-20250101T000000Z.pickle", "oom-rank0-<host>-<pid>-20250101T000000Z.pickle"),
        (
            "peak-rank12-h.x-y-1-20250101T000000Z-3.pickle.99.tmp",
            "peak-rank12-<host>-<pid>-20250101T000000Z-3.pickle.99.tmp",
        ),
        (
            "a/oom-rank0-h-1-20250101T000000Z.pickle b/dump-rank1-k-2-20250101T000000Z.pickle",
            "a/oom-rank0-<host>-<pid>-20250101T000000Z.pickle b/dump-rank1-<host>-<pid>-20250101T000000Z.pickle",
        ),
        ("oom-rank0--1-20250101T000000Z.pickle", "oom-rank0--1-20250101T000000Z.pickle"),  # no host
        ("x_oom-rank0-h-1-20250101T000000Z.pickle", "x_oom-rank0-h-1-20250101T000000Z.pickle"),  # no word boundary
        ("a-rank0-" * 3 + "-1-20250101T000000Z.pickle", "a-rank0-<host>-<pid>-20250101T000000Z.pickle"),
    ],
)
def test_dump_names(text, expected):
    assert Redactor().dump_name(text) == expected
    assert Redactor().dump_name(expected) == expected


def test_process_ids_in_text(redactor):
    assert redactor.text(OOM_MESSAGE).endswith(
        "Process <pid> has 79.10 GiB memory in use. Process <pid> has 1.00 GiB memory in use."
    )
    assert redactor.text("pid=12 'pid': 13, PID 14 pid:15") == "pid=<pid> 'pid': <pid>, PID <pid> pid:<pid>"
    # the dump's own pid wherever it stands alone; not inside other numbers or words
    assert (
        redactor.text("run 4242 ok, 4242.5 GiB, 1.4242, x4242, 42420")
        == "run <pid> ok, 4242.5 GiB, 1.4242, x4242, 42420"
    )
    # a small pid only where text says it is one: "1" is everywhere
    assert Redactor.learn(pid=1).text("GPU 1 has 1.00 GiB; pid 1") == "GPU 1 has 1.00 GiB; pid <pid>"


def test_names_as_whole_words_longest_first(redactor):
    assert redactor.names(
        "gpu-node-7.cluster.example.com gpu-node-7 gpu-node-77 alice alicia al al-ice _al josé joséa"
    ) == ("<host> <host> gpu-node-77 <user> alicia <user> <user>-ice _<user> <user> joséa")


def test_names_that_cannot_be_names_are_not_learned():
    long_name = "a" * 300
    redactor = Redactor.learn(host="x" * 300, filenames=[f"/home/{long_name}/a.py", "/home/--/b.py", "/home/root/c.py"])
    assert redactor.users == () and redactor.hosts == ()


def test_many_script_folders_make_no_project_root():
    scripts = [f"/srv{i}/job/run.py" for i in range(100)]
    assert len(Redactor.learn(filenames=scripts[:3], script_filenames=scripts[:3]).project_roots) == 3
    redactor = Redactor.learn(filenames=scripts, script_filenames=scripts)
    assert redactor.project_roots == ()
    assert redactor.path("/srv1/job/run.py") == "<path>/run.py"


def test_unknown_values_of_every_kind(redactor):
    shared = ["alice"]
    cycle: list = ["alice"]
    cycle.append(cycle)
    deep: list = []
    node = deep
    for _ in range(10_000):
        node.append([])
        node = node[0]
    wide = ["alice"]
    for _ in range(60):  # 2**60 paths through one list: each container is visited once
        wide = [wide, wide]
    data = {
        "segments": [],
        "x": {
            "shared": shared,
            "again": shared,
            "cycle": cycle,
            "deep": deep,
            "wide": wide,
            "set": {"alice", 3},
            "bytes": bytearray(b"alice"),
            "empty": "",
            (1, "alice"): 2,
        },
    }
    started = time.perf_counter()
    redact_snapshot_data(data, redactor)
    assert time.perf_counter() - started < 2
    x = data["x"]
    assert x["shared"] == [REDACTED] and x["again"] is x["shared"]
    assert x["cycle"][0] == REDACTED and x["cycle"][1] is x["cycle"]
    assert x["set"] == {"<user>", 3} and x["bytes"] == bytearray(REDACTED.encode()) and x["empty"] == ""
    assert x[(1, "<user>")] == 2
    depth, node = 0, x["deep"]
    while isinstance(node, list):
        node, depth = node[0], depth + 1
    assert node == REDACTED and depth < 50
    pickle.dumps(data, protocol=4)  # nothing too deep to write back


# -- linear time ---------------------------------------------------------------------------------

ADVERSARIAL = {
    "dump names": "/src/" + "a-rank0-" * 125_000 + ".py",
    "dump tails": "x-rank0-" + "-1-20250101T000000Z.pickle" * 40_000,
    "digits": "-" + "1" * 1_000_000 + "-20250101T000000Z.pickle",
    "slashes": "/" * 1_000_000,
    "drives": "C:/" * 333_333,
    "process": "Process " * 125_000 + "pid" + " " * 100_000,
    "names": "al-" * 333_333,
    "words": "alice " * 166_666,
    "stdlib": "/lib/python" + "3" * 1_000_000,
    "homes": "/home/alice" * 90_000,
}


def _seconds(function, *args) -> float:
    started = time.perf_counter()
    function(*args)
    return time.perf_counter() - started


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(ADVERSARIAL))
def test_one_megabyte_of_adversarial_text_is_fast(redactor, name):
    text = ADVERSARIAL[name]
    assert len(text) >= 900_000
    for step in (redactor.text, redactor.path, redactor.dump_name, redactor.names):
        assert _seconds(step, text) < 2, step.__name__
    assert _seconds(lambda: Redactor.learn(filenames=[text], script_filenames=[text], texts=[text])) < 2


@pytest.mark.slow
def test_time_grows_with_the_text_not_faster():
    many = Redactor.learn(
        host="a-b-c",
        filenames=[f"/home/{'a-' * k}a/x.py" for k in range(100)] + [f"/home/u{i}/x.py" for i in range(300)],
    )
    assert len(many.users) == 400

    def worst(size: int) -> float:
        texts = ["a-rank0-" * (size // 8), "a-" * (size // 2), "a " * (size // 2), "u1 " * (size // 3)]
        return max(min(_seconds(many.text, t) for _ in range(3)) for t in texts)

    small, large = worst(250_000), worst(1_000_000)  # about 0.1 s and 0.5 s
    assert large < 5
    assert large < 10 * small + 0.3  # four times the text: about four times the time, never sixteen


def _megabyte_everywhere(size: int) -> dict:
    """A dump with a different adversarial string of `size` characters in every string field."""
    made = iter(range(1000))

    def text() -> str:
        kind = next(made)
        body = ("a-rank0-", "Process ", "al-", "/a", "pid ", "alice ", "C:/")[kind % 7]
        return (f"/home/alice/{kind}/" + body * (size // len(body)))[:size]

    def frames() -> list:
        return [{"filename": text(), "line": 1, "name": text(), "fx_original_trace": text()}]

    return {
        "segments": [{"address": 0, "total_size": 512, "stream": 0, "segment_type": "large", "frames": frames(), "forward_frames": [text()],
                      "blocks": [{"address": 0, "size": 512, "requested_size": 512, "state": "active_allocated", "frames": frames()}]}],
        "device_traces": [[{"action": "alloc", "addr": 0, "size": 512, "stream": 0, "time_us": 1, "frames": frames(),
                            "user_metadata": text(), "compile_context": text(), "forward_frames": [text()]}]],
        "external_annotations": [{"name": text(), "stage": "START", "device": 0, "time_us": 1}],
        "oomdoctor": {"host": "node7", "pid": 4242, "argv": [text()], "exception": {"type": text(), "message": text(), "traceback": text()}, text(): text()},
        text(): text(),
    }  # fmt: skip


@pytest.mark.slow
def test_a_dump_with_a_megabyte_in_every_string_redacts_in_linear_time(tmp_path):
    def seconds(size: int) -> float:
        data = _megabyte_everywhere(size)
        started = time.perf_counter()
        redact_snapshot_data(data, redactor_for_data(data))
        return time.perf_counter() - started

    small, large = seconds(250_000), seconds(1_000_000)  # 22 strings: about 1 s for the megabytes (was: hours)
    assert large < 10
    assert large < 10 * small + 0.5  # four times the text: about four times the time, never sixteen
    source = _write(tmp_path / "big.pickle", _megabyte_everywhere(1_000_000))
    started = time.perf_counter()
    assert main(["redact", source, str(tmp_path / "out.pickle")]) == 0
    assert time.perf_counter() - started < 20
    written = (tmp_path / "out.pickle").read_bytes()
    assert b"alice" not in written and b"node7" not in written and b"4242" not in written


def test_the_redos_dump_of_the_findings(tmp_path, capsys):
    data = load_raw(FIXTURE)
    stack = [{"filename": "/src/" + "a-rank0-" * 16000 + ".py", "line": 1, "name": "main"}]  # 128 KB: 99 s before
    data["segments"][0]["blocks"][0]["frames"] = stack
    data["device_traces"][0][0]["frames"] = stack
    source = _write(tmp_path / "r18.pickle", data)
    started = time.perf_counter()
    assert main(["redact", source, str(tmp_path / "out.pickle")]) == 0
    assert main(["report", source, "--format", "md", "--redact"]) == 0
    assert time.perf_counter() - started < 10
    assert (
        load_raw(tmp_path / "out.pickle")["segments"][0]["blocks"][0]["frames"][0]["filename"]
        == "<project>/" + "a-rank0-" * 16000 + ".py"
    )


# -- the command ---------------------------------------------------------------------------------


def test_a_dangling_link_at_out_is_kept_without_force(tmp_path, capsys):
    source = _write(tmp_path / "in.pickle", _hostile_data())
    out = tmp_path / "out.pickle"
    os.symlink(tmp_path / "nowhere.pickle", out)
    assert main(["redact", source, str(out)]) == 2
    assert "already exists (--force replaces it)" in capsys.readouterr().err
    assert os.readlink(out) == str(tmp_path / "nowhere.pickle") and not (tmp_path / "nowhere.pickle").exists()
    assert main(["redact", source, str(out), "--force"]) == 0
    assert not out.is_symlink() and not (tmp_path / "nowhere.pickle").exists()
    assert load(out).oomdoctor.host == "<host>"


def test_a_link_to_a_file_is_replaced_with_force_and_the_file_kept(tmp_path):
    source = _write(tmp_path / "in.pickle", _hostile_data())
    kept, out = tmp_path / "kept.txt", tmp_path / "out.pickle"
    kept.write_bytes(b"keep me")
    os.symlink(kept, out)
    assert main(["redact", source, str(out)]) == 2
    assert main(["redact", source, str(out), "--force"]) == 0
    assert kept.read_bytes() == b"keep me" and not out.is_symlink()


@pytest.mark.parametrize(
    ("content", "found"),
    [
        ([[1, 2], [3]], "a list holding a list"),
        ([{"address": 0}, "x"], "a list holding a str"),
        ({"segments": 3}, "a dict without"),
        (7, "an int"),
    ],
)
def test_what_is_not_a_snapshot_is_called_so(tmp_path, capsys, content, found):
    source = _write(tmp_path / "rows.pickle", content)
    assert main(["redact", source, str(tmp_path / "out.pickle")]) == 2
    err = capsys.readouterr().err
    assert "not a memory snapshot" in err and found in err and "would not load" not in err
    assert err.count("\n") == 1 and not (tmp_path / "out.pickle").exists()
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_the_copy_of_a_bare_segment_list_still_loads(tmp_path):
    segments = copy.deepcopy(_hostile_data()["segments"])
    source, out = _write(tmp_path / "segments.pickle", segments), tmp_path / "out.pickle"
    assert main(["redact", source, str(out)]) == 0
    assert b"alice" not in out.read_bytes() and load(out).source_format == "segment-list"


def test_a_pid_beyond_any_process_id_is_not_formatted(tmp_path):
    """A hostile pid of 16,000 bits (more digits than int->str allows) is no pid: redact still works."""
    import pickle

    from oomdoctor.cli import main

    data = {
        "segments": [{"device": 0, "address": 1 << 40, "total_size": 2 << 20, "stream": 0, "segment_type": "large",
                      "blocks": [{"address": 1 << 40, "size": 2 << 20, "requested_size": 2 << 20,
                                  "state": "active_allocated", "frames": []}]}],
        "device_traces": [[]],
        "oomdoctor": {"pid": 1 << 16000, "host": "node7"},
    }  # fmt: skip
    source = tmp_path / "in.pickle"
    source.write_bytes(pickle.dumps(data, protocol=4))
    assert main(["redact", str(source), str(tmp_path / "out.pickle")]) == 0
