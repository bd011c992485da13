"""Redaction: paths keep their useful part, names and pids go, and a redacted dump still gives the
same verdict; `oomdoctor redact` refuses to overwrite and fails in one line."""

from __future__ import annotations

import copy
import pickle
import subprocess
import sys

import orjson
import pytest

from oomdoctor.analysis import analyse
from oomdoctor.cli import main
from oomdoctor.load import load, load_raw
from oomdoctor.redact import Redactor, redact_snapshot_data, redactor_for_data
from tests.conftest import FIXTURES

FIXTURE = FIXTURES / "dumps" / "optimizer-state-buildup-mlp-adam.pickle"
HOME = "/home/alice/work/"
PERSONAL = ("alice", "gpu-node-7", "/home/", "4242")


def _personal_data() -> dict:
    """The fixture as if captured in alice's home directory on host gpu-node-7 as pid 4242."""
    data = load_raw(FIXTURE)
    seen: set[int] = set()

    def stacks(item):
        for frame in item.get("frames") or ():
            if id(frame) not in seen:
                seen.add(id(frame))
                frame["filename"] = HOME + frame["filename"]

    for segment in data["segments"]:
        stacks(segment)
        for block in segment["blocks"]:
            stacks(block)
    for trace in data["device_traces"]:
        for event in trace:
            stacks(event)
    meta = data["oomdoctor"]
    meta["host"], meta["pid"] = "gpu-node-7", 4242
    meta["argv"] = [HOME + meta["argv"][0], *meta["argv"][1:], "--data", "/home/alice/data/shard.bin"]
    exception = meta["exception"]
    exception["traceback"] = exception["traceback"].replace('File "', f'File "{HOME}')
    return data


@pytest.fixture
def personal_dump(tmp_path):
    path = tmp_path / "oom-rank0-gpu-node-7-4242-20250101T000000Z.pickle"
    path.write_bytes(pickle.dumps(_personal_data(), protocol=4))
    return path


@pytest.fixture
def redactor() -> Redactor:
    return Redactor.learn(
        host="gpu-node-7.cluster.example.com",
        pid=4242,
        texts=["--data=/home/alice/datasets/x.bin"],
        filenames=["/home/alice/llm/src/train.py", "/home/alice/llm/lib/model.py", "/usr/lib/python3.11/threading.py"],
        script_filenames=["/home/alice/llm/src/train.py"],
    )


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        (
            "/home/alice/venv/lib/python3.11/site-packages/torch/nn/modules/module.py",
            "<env>/site-packages/torch/nn/modules/module.py",
        ),
        ("/opt/conda/lib/python3.10/dist-packages/apex/fused.py", "<env>/dist-packages/apex/fused.py"),
        ("/usr/lib/python3.11/threading.py", "<env>/lib/python3.11/threading.py"),
        ("/home/alice/llm/src/train.py", "<project>/src/train.py"),
        ("/home/alice/llm/lib/model.py", "<project>/lib/model.py"),
        ("/scratch/alice/data/shard.bin", "<path>/shard.bin"),
        ("C:\\Users\\alice\\llm\\x.py", "<path>/x.py"),
        ("fixtures/scenarios/train.py", "fixtures/scenarios/train.py"),
        ("<frozen runpy>", "<frozen runpy>"),
        ("??", "??"),
        (
            "oom-dumps/oom-rank3-gpu-node-7-4242-20250101T000000Z.pickle",
            "oom-dumps/oom-rank3-<host>-<pid>-20250101T000000Z.pickle",
        ),
    ],
)
def test_a_path_keeps_its_useful_part(redactor, path, expected):
    assert redactor.path(path) == expected
    assert redactor.path(expected) == expected  # redacting twice changes nothing


def test_text_loses_paths_and_names_but_keeps_urls_and_fractions(redactor):
    text = (
        'File "/home/alice/llm/src/train.py", line 3, on gpu-node-7 as alice --out=/home/alice/o.txt; '
        "see https://docs.pytorch.org/docs/stable/notes/cuda.html and/or 1/2 of it"
    )
    assert redactor.text(text) == (
        'File "<project>/src/train.py", line 3, on <host> as <user> --out=<path>/o.txt; '
        "see https://docs.pytorch.org/docs/stable/notes/cuda.html and/or 1/2 of it"
    )


def test_names_are_replaced_only_as_whole_words():
    redactor = Redactor.learn(host="vm", filenames=["/home/al/x.py"])
    assert redactor.users == ("al",)
    assert redactor.text("vm vmap al alpha") == "<host> vmap <user> alpha"


def test_a_home_directory_is_never_the_project_root():
    redactor = Redactor.learn(
        filenames=["/home/alice/a.py", "/home/alice/b/c.py"], script_filenames=["/home/alice/a.py"]
    )
    assert redactor.project_roots == ()
    assert redactor.path("/home/alice/b/c.py") == "<path>/c.py"


def test_redacted_dump_keeps_everything_else(personal_dump, tmp_path):
    out = tmp_path / "shared.pickle"
    assert main(["redact", str(personal_dump), str(out)]) == 0
    written = out.read_bytes()
    assert written[:2] == b"\x80\x04"  # pickle protocol 4, as memory_viz expects
    for word in PERSONAL:
        assert word.encode() not in written, word
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]

    original, redacted = _personal_data(), load_raw(out)
    meta = redacted["oomdoctor"]
    assert meta["host"] == "<host>" and meta["pid"] is None
    assert meta["argv"] == ["<project>/train.py", *original["oomdoctor"]["argv"][1:-1], "<path>/shard.bin"]
    assert 'File "<env>/site-packages/torch/optim/adam.py"' in meta["exception"]["traceback"]
    assert (
        redacted["segments"][0]["blocks"][0]["frames"][0]["filename"]
        == "<env>/site-packages/torch/nn/modules/linear.py"
    )
    # Blank what redaction may change: the rest is exactly what torch (and the capture) wrote.
    for data in (original, redacted):
        for item in _frame_holders(data):
            for frame in item.get("frames") or ():
                frame["filename"] = ""
        for key in ("host", "pid", "argv", "exception"):
            data["oomdoctor"][key] = None
    assert redacted == original


def _frame_holders(data):
    for segment in data["segments"]:
        yield segment
        yield from segment["blocks"]
    for trace in data["device_traces"]:
        yield from trace


def test_redacted_dump_gives_the_same_analysis(personal_dump, tmp_path):
    out = tmp_path / "shared.pickle"
    assert main(["redact", str(personal_dump), str(out)]) == 0
    before, after = analyse(load(personal_dump)), analyse(load(out))
    assert after.verdict == before.verdict == "optimizer-state-buildup"
    assert after.confidence == before.confidence
    assert after.component_bytes() == before.component_bytes()
    assert after.accounting == before.accounting
    assert [r.id for r in after.recommendations] == [r.id for r in before.recommendations]


def test_redacting_twice_changes_nothing_more(personal_dump, tmp_path):
    once, twice = tmp_path / "once.pickle", tmp_path / "twice.pickle"
    assert main(["redact", str(personal_dump), str(once)]) == 0
    assert main(["redact", str(once), str(twice)]) == 0
    assert load_raw(once) == load_raw(twice)


@pytest.mark.parametrize("output_format", ["text", "md", "json"])
def test_report_redact_in_every_format(personal_dump, capsys, output_format):
    assert main(["report", str(personal_dump), "--format", output_format]) == 0
    plain = capsys.readouterr().out
    assert "/home/alice" in plain  # the dump is personal: the test below could fail
    assert main(["report", str(personal_dump), "--format", output_format, "--redact"]) == 0
    redacted = capsys.readouterr().out
    for word in ("alice", "gpu-node-7", "/home/"):
        assert word not in redacted, word
    assert "oom-rank0-<host>-<pid>-20250101T000000Z.pickle" in redacted or output_format == "json"
    if output_format == "json":
        data, before = orjson.loads(redacted), orjson.loads(plain)
        assert data["environment"]["host"] == "<host>" and data["environment"]["pid"] is None
        assert before["environment"]["host"] == "gpu-node-7" and before["environment"]["pid"] == 4242
        assert {k: data[k] for k in ("verdict", "confidence", "components", "accounting")} == {
            k: before[k] for k in ("verdict", "confidence", "components", "accounting")
        }
    if output_format == "md":
        assert "| host | `gpu-node-7` |" in plain and "| pid | `4242` |" in plain
        assert "| host | `<host>` |" in redacted and "| pid |" not in redacted
        assert "<project>/train.py:36 in main" in redacted


def test_redact_refuses_to_overwrite(personal_dump, tmp_path, capsys):
    out = tmp_path / "shared.pickle"
    out.write_bytes(b"keep me")
    assert main(["redact", str(personal_dump), str(out)]) == 2
    assert out.read_bytes() == b"keep me"
    assert "already exists (--force replaces it)" in capsys.readouterr().err
    assert main(["redact", str(personal_dump), str(out), "--force"]) == 0
    assert load(out).oomdoctor.host == "<host>"
    before = personal_dump.read_bytes()
    assert main(["redact", str(personal_dump), str(personal_dump), "--force"]) == 2
    assert personal_dump.read_bytes() == before


@pytest.mark.parametrize(
    ("make_input", "output_name", "message"),
    [
        (lambda d: d / "missing.pickle", "out.pickle", "missing.pickle"),
        (lambda d: _write(d / "notes.txt", b"hello"), "out.pickle", "not a snapshot"),
        (lambda d: _write(d / "int.pickle", pickle.dumps(7, protocol=4)), "out.pickle", "not a memory snapshot"),
        (lambda d: _write(d / "cut.pickle", FIXTURE.read_bytes()[:500]), "out.pickle", "cut.pickle"),
        (lambda d: FIXTURE, "no-such-dir/out.pickle", "no such directory"),
        (lambda d: FIXTURE, ".", "is a directory"),
    ],
)
def test_redact_bad_input_is_one_line(tmp_path, capsys, make_input, output_name, message):
    source = make_input(tmp_path)
    assert main(["redact", str(source), str(tmp_path / output_name)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("oomdoctor: ") and message in err
    assert "Traceback" not in err
    assert not (tmp_path / "out.pickle").exists()
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def _write(path, content: bytes):
    path.write_bytes(content)
    return path


def test_redact_reads_a_bare_segment_list(tmp_path):
    segments = copy.deepcopy(load_raw(FIXTURE)["segments"])
    for segment in segments:
        for block in segment["blocks"]:
            for frame in block["frames"]:
                if not frame["filename"].startswith("/"):
                    frame["filename"] = HOME + frame["filename"]
    source, out = tmp_path / "segments.pickle", tmp_path / "out.pickle"
    source.write_bytes(pickle.dumps(segments, protocol=4))
    assert main(["redact", str(source), str(out)]) == 0
    assert b"alice" not in out.read_bytes()
    assert load(out).source_format == "segment-list"


def test_redaction_of_data_and_of_the_model_agree():
    data = _personal_data()
    from_data = redactor_for_data(data)
    from_model = Redactor.from_snapshot(load(pickle.dumps(data, protocol=4)))
    assert from_data == from_model
    assert from_data.project_roots == ("/home/alice/work/fixtures/scenarios",)
    redact_snapshot_data(data, from_data)
    assert b"alice" not in pickle.dumps(data)


def test_redaction_imports_nothing_heavy():
    code = (
        "import sys, oomdoctor.redact, oomdoctor.views.markdown_report, oomdoctor.commands.redact\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'textual', 'rich')))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
