"""What `oomdoctor diff A B` says about two files, checked against the files themselves: whether
the two are like for like is read here from each dump's own metadata, independently of the analysis."""

from __future__ import annotations

import pickle

import orjson

from oomdoctor.load import load_raw
from oomdoctor.pipeline import diff_files, render_diff
from oomdoctor.units import human_size
from tests.conftest import FIXTURES
from tests.test_ranks_truth import dump_bytes, trace_peak

DUMPS = FIXTURES / "dumps"
GPT_256MIB = DUMPS / "no-oom-gpt-adamw.pickle"  # a simulated 256 MiB device
GPT_512MIB = DUMPS / "no-oom-gpt-adamw-batch-32.pickle"  # the same GPT, a bigger batch, a 512 MiB device
MLP_ADAM = DUMPS / "optimizer-state-buildup-mlp-adam.pickle"
MLP_ADAMW = DUMPS / "model-states-too-large-mlp-adamw.pickle"  # the same MLP and script, AdamW, 160 MiB
MLP_FORGOT_ZERO_GRAD = DUMPS / "gradients-kept-mlp-sgd-momentum.pickle"  # the same MLP, another script


def _meta(path):
    return load_raw(path)["oomdoctor"]


def _parameters(path) -> dict[str, tuple[int, ...]]:
    return {t["name"]: tuple(t["shape"]) for t in _meta(path)["tensors"] if t["component"] == "parameter"}


def _text(a, b) -> str:
    return render_diff(diff_files(str(a), str(b)), "text").decode()


def test_two_devices_of_different_memory_are_said_to_be_unlike():
    """A batch that fits on one device and a batch on a device twice its size: the peak's change is
    not the batch's alone, and the diff says the devices differ, with each one's memory."""
    totals = [_meta(path)["device"]["total_memory_bytes"] for path in (GPT_256MIB, GPT_512MIB)]
    assert totals == [256 * 2**20, 512 * 2**20]
    assert _parameters(GPT_256MIB) == _parameters(GPT_512MIB)  # the same model: nothing said of it
    text = _text(GPT_256MIB, GPT_512MIB)
    assert "Not like for like: A ran on a 256.00 MiB device, B on a 512.00 MiB one." in text.splitlines()[1]
    assert "models differ" not in text


def test_two_models_are_said_to_be_unlike_and_the_count_is_the_registries():
    a, b = _parameters(MLP_ADAM), _parameters(GPT_256MIB)
    names = a.keys() | b.keys()
    differing = sum(1 for n in names if n not in a or n not in b or a[n] != b[n])
    assert differing > 0
    diff = diff_files(str(MLP_ADAM), str(GPT_256MIB))
    (model,) = [item for item in diff.unlike if item.what == "model"]
    assert (model.count, model.of) == (differing, len(names))
    summary = render_diff(diff, "text").decode().splitlines()[1]
    assert f"the models differ: {differing} of the {len(names)} parameters" in summary
    data = orjson.loads(render_diff(diff, "json"))
    assert [(item["count"], item["of"]) for item in data["unlike"] if item["what"] == "model"] == [
        (differing, len(names))
    ]


def test_the_same_model_and_script_on_another_device_size_says_only_the_device():
    assert _parameters(MLP_ADAM) == _parameters(MLP_ADAMW)
    diff = diff_files(str(MLP_ADAM), str(MLP_ADAMW))
    assert [item.what for item in diff.unlike] == ["device_memory"]


def test_another_script_is_said():
    programs = [_meta(path)["argv"][0].rsplit("/", 1)[-1] for path in (MLP_ADAM, MLP_FORGOT_ZERO_GRAD)]
    assert programs == ["train.py", "forgot_zero_grad.py"]
    diff = diff_files(str(MLP_ADAM), str(MLP_FORGOT_ZERO_GRAD))
    assert [(item.what, item.a, item.b) for item in diff.unlike if item.what == "program"] == [
        ("program", "train.py", "forgot_zero_grad.py")
    ]
    assert "A ran 'train.py', B 'forgot_zero_grad.py'" in _text(MLP_ADAM, MLP_FORGOT_ZERO_GRAD)


def test_like_for_like_files_say_nothing_of_it(tmp_path):
    copy = tmp_path / "copy.pickle"
    copy.write_bytes(pickle.dumps(load_raw(GPT_256MIB), protocol=4))
    diff = diff_files(str(GPT_256MIB), str(copy))
    assert diff.unlike == ()
    assert "Not like for like" not in _text(GPT_256MIB, copy)


def test_another_torch_is_said(tmp_path):
    raw = load_raw(GPT_256MIB)
    raw["oomdoctor"]["versions"]["torch"] = "2.5.1+cu124"
    other = tmp_path / "other.pickle"
    other.write_bytes(pickle.dumps(raw, protocol=4))
    assert "A was recorded by torch '2.13.0+cpu', B by torch '2.5.1+cu124'" in _text(GPT_256MIB, other)


def test_a_side_without_a_trace_has_no_known_peak(tmp_path):
    """B's trace is empty (a snapshot taken without history, or torch 2.0's): what it held at its
    peak is unknown, only what its dump holds, a lower bound. The diff compares A's peak with B's
    dump and says so, instead of 'B peaks ... higher'."""
    raw = load_raw(GPT_512MIB)
    raw["device_traces"] = [[] for _ in raw["device_traces"]]
    untraced = tmp_path / "untraced.pickle"
    untraced.write_bytes(pickle.dumps(raw, protocol=4))
    a_peak, b_dump = trace_peak(GPT_256MIB), dump_bytes(untraced)

    diff = diff_files(str(GPT_256MIB), str(untraced))
    assert (diff.at_peak.a.kind, diff.at_peak.b.kind) == ("peak", "dump")
    assert (diff.headline.peak.a_bytes, diff.headline.peak.b_bytes) == (a_peak, b_dump)
    summary = render_diff(diff, "text").decode().splitlines()[1]
    more = "more" if b_dump > a_peak else "less"
    assert summary.startswith(
        f"{untraced} holds {human_size(abs(b_dump - a_peak))} {more} than {GPT_256MIB} "
        f"({human_size(a_peak)} at its peak → {human_size(b_dump)} at its dump"
    )
    assert f"{untraced} records no allocation in a trace, so its peak is unknown" in summary
    assert " peaks " not in summary
    assert "B at the dump" in render_diff(diff, "text").decode()


def test_a_small_difference_is_not_called_unchanged():
    """Below 4 KiB a difference is not counted as a change (no component or site is listed for it),
    but the row prints both figures: '1016 bytes  1.98 KiB  unchanged' contradicted itself."""
    from oomdoctor.analysis.diff import Figure
    from oomdoctor.views.diff_phrasing import change

    assert change(Figure("rounding", 1016, 2032)) == "+1016 bytes (under 4.00 KiB: not a change)"
    assert change(Figure("rounding", 2032, 1016)) == "-1016 bytes (under 4.00 KiB: not a change)"
    assert change(Figure("rounding", 1016, 1016)) == "unchanged"
    assert change(Figure("allocated", 1024, 1024 + 4096)) == "+4.00 KiB (5.00×)"


def test_another_world_size_is_said(tmp_path):
    """The same model at world size 4 and 8: what each rank holds of a sharded model differs, and
    the dumps record it."""
    paths = []
    for world_size in (4, 8):
        raw = load_raw(GPT_256MIB)
        raw["oomdoctor"].update(rank=0, world_size=world_size)
        path = tmp_path / f"world{world_size}.pickle"
        path.write_bytes(pickle.dumps(raw, protocol=4))
        paths.append(path)
    assert [_meta(path)["world_size"] for path in paths] == [4, 8]
    diff = diff_files(str(paths[0]), str(paths[1]))
    assert [(item.what, item.a, item.b) for item in diff.unlike] == [("world_size", "4", "8")]
    assert "A ran at world size 4, B at 8" in _text(*paths)


def test_two_ranks_files_of_one_sharded_model_are_not_said_to_be_different_models(tmp_path):
    """Two files of one run, ranks 0 and 2 of an FSDP model with an uneven last shard: the
    registries name the same parameters, rank 2's shards are smaller. That is one model."""
    paths = []
    for rank in (0, 2):
        raw = load_raw(GPT_256MIB)
        raw["oomdoctor"].update(rank=rank, world_size=3)
        if rank == 2:
            for tensor in raw["oomdoctor"]["tensors"]:
                if tensor["component"] == "parameter" and tensor["shape"]:
                    tensor["shape"] = [tensor["shape"][0] - 1, *tensor["shape"][1:]]
        path = tmp_path / f"rank{rank}.pickle"
        path.write_bytes(pickle.dumps(raw, protocol=4))
        paths.append(path)
    a, b = (_parameters(path) for path in paths)
    assert a.keys() == b.keys() and a != b
    assert diff_files(str(paths[0]), str(paths[1])).unlike == ()
    # one rank's two files (two runs) whose shapes differ are two models
    raw = load_raw(paths[1])
    raw["oomdoctor"]["rank"] = 0
    other = tmp_path / "rank0-other-run.pickle"
    other.write_bytes(pickle.dumps(raw, protocol=4))
    assert [item.what for item in diff_files(str(paths[0]), str(other)).unlike] == ["model"]


def test_the_devices_judged_are_named_when_they_differ(tmp_path):
    """A snapshot of two devices whose OOM is on device 1, against a one-device dump: the diff
    compares device 1 of A with device 0 of B, and says so."""
    a = load_raw(DUMPS / "no-oom-gpt-adamw.pickle")
    b = load_raw(DUMPS / "activation-spike-gpt-longer-sequence.pickle")
    for segment in b["segments"]:
        segment["device"] = 1
    merged = {key: value for key, value in a.items() if key != "oomdoctor"}
    merged["segments"] = a["segments"] + b["segments"]
    merged["device_traces"] = [a["device_traces"][0], b["device_traces"][0]]
    two = tmp_path / "two-devices.pickle"
    two.write_bytes(pickle.dumps(merged, protocol=4))
    oom_devices = [i for i, trace in enumerate(merged["device_traces"]) if any(e["action"] == "oom" for e in trace)]
    assert oom_devices == [1]
    diff = diff_files(str(two), str(GPT_256MIB))
    assert [(item.what, item.a, item.b) for item in diff.unlike] == [("device_index", "1", "0")]
    assert "A's figures are device 1's, B's device 0's" in render_diff(diff, "text").decode()


def test_a_redacted_diff_says_the_device_names_as_the_redacted_report_does(tmp_path):
    """--redact: the device names the summary compares come from the redacted environment, as every
    other string of a redacted report does."""
    from oomdoctor.analysis.environment import environment_of
    from oomdoctor.pipeline import load_snapshot
    from oomdoctor.redact import Redactor, redact_environment

    paths = []
    for name in ("GPU of /home/alice/box-a", "GPU of /home/alice/box-b"):
        raw = load_raw(GPT_256MIB)
        raw["oomdoctor"]["device"]["name"] = name
        path = tmp_path / f"{name[-5:]}.pickle"
        path.write_bytes(pickle.dumps(raw, protocol=4))
        paths.append(path)
    expected = []
    for path in paths:
        snapshot = load_snapshot(str(path))
        expected.append(redact_environment(environment_of(snapshot), Redactor.from_snapshot(snapshot)).device_name)
    assert "alice" not in "".join(expected)
    diff = diff_files(str(paths[0]), str(paths[1]), redact=True)
    (names,) = [item for item in diff.unlike if item.what == "device_name"]
    assert [names.a, names.b] == expected
    assert "alice" not in render_diff(diff, "json").decode()
