"""`oomdoctor explain`: OOM messages found in logs, their figures read in bytes, and explained."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oomdoctor.cli import main
from oomdoctor.messages import ForeignMessage, explain, find_messages
from oomdoctor.messages.explain import RECORD_A_DUMP, highlight
from oomdoctor.messages.figures import rounding_error_bytes
from oomdoctor.units import GIB, MIB, format_size
from tests.conftest import CORPUS

_CORPUS_FILE = CORPUS / "oom_messages.jsonl" if CORPUS else None
CORPUS_MESSAGES = [json.loads(line) for line in _CORPUS_FILE.read_text().splitlines()] if _CORPUS_FILE else []
FOREIGN_FORMATS = ("JAX", "TensorFlow")


def _is_foreign(entry: dict) -> bool:
    return entry["format"].startswith(FOREIGN_FORMATS)


def _corpus_params(foreign: bool, containing: str = ""):
    chosen = [e for e in CORPUS_MESSAGES if _is_foreign(e) == foreign and containing in e["text"]]
    if not chosen:
        return [pytest.param(None, marks=pytest.mark.skip(reason="corpus not found"))]
    return [pytest.param(e, id=e["source"]) for e in chosen]


def _by_source(source: str) -> dict:
    if not CORPUS_MESSAGES:
        pytest.skip("corpus not found")
    return next(e for e in CORPUS_MESSAGES if e["source"] == source)


def _one(text: str):
    (message,) = find_messages(text)
    return message


def new_message(
    requested: int,
    capacity: int,
    free: int,
    allocated: int,
    unallocated: int,
    *,
    processes: tuple[tuple[int | None, int], ...] = (),
    allowed: int | None = None,
    private: int | None = None,
    device: int = 0,
) -> str:
    """A message worded as torch 2.11-2.13 writes it, numbers formatted by torch's format_size."""
    nvml = "".join(
        f"Including non-PyTorch memory, this process has {format_size(used)} memory in use. " if pid is None
        else f"Process {pid} has {format_size(used)} memory in use. "
        for pid, used in processes
    )  # fmt: skip
    fraction = f"{format_size(allowed)} allowed; " if allowed is not None else ""
    pools = f"with {format_size(private)} allocated in private pools (e.g., CUDA Graphs), " if private else ""
    return (
        f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {format_size(requested)}. GPU {device} has a "
        f"total capacity of {format_size(capacity)} of which {format_size(free)} is free. {nvml}{fraction}Of the "
        f"allocated memory {format_size(allocated)} is allocated by PyTorch, {pools}and {format_size(unallocated)} is "
        "reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory "
        "Management  (https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)"
    )


def old_message(requested: int, capacity: int, allocated: int, free: int, reserved: int) -> str:
    """torch 1.10-2.0 wording."""
    return (
        f"RuntimeError: CUDA out of memory. Tried to allocate {format_size(requested)} (GPU 0; {format_size(capacity)} "
        f"total capacity; {format_size(allocated)} already allocated; {format_size(free)} free; "
        f"{format_size(reserved)} reserved in total by PyTorch) If reserved memory is >> allocated memory try setting "
        "max_split_size_mb to avoid fragmentation.  See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF"
    )


# -- the corpus ------------------------------------------------------------------------------------

_FIGURE_PATTERNS = {
    "requested_bytes": [r"Tried to allocate (\d[\d.]* \w+)"],
    "capacity_bytes": [r"total capaci?ty of (\d[\d.]* \w+)", r"; (\d[\d.]* \w+) total capacity"],
    "free_bytes": [r"of which (\d[\d.]* \w+) is free", r"; (\d[\d.]* \w+) free;"],
    "reserved_unallocated_bytes": [
        r"and (\d[\d.]* \w+) is reserved by PyTorch but unallocated",
        r"(\d[\d.]* \w+) cached\)",
    ],
    "allowed_bytes": [r"(\d[\d.]* \w+) allowed;"],
}


@pytest.mark.parametrize("entry", _corpus_params(foreign=False))
def test_every_pytorch_message_in_the_corpus_is_found_and_its_figures_match_the_text(entry) -> None:
    messages = find_messages(entry["text"])
    assert messages, entry["format"]
    flat_text = " ".join(entry["text"].split())
    for message in messages:
        assert message.text in flat_text or message.truncated
        if message.kind in ("mps",):
            continue
        for field, patterns in _FIGURE_PATTERNS.items():
            stated = next((m.group(1) for p in patterns if (m := re.search(p, message.text))), None)
            value = getattr(message, field)
            if stated is None and field == "reserved_unallocated_bytes" and message.reserved_bytes is not None:
                assert value == message.reserved_bytes - message.allocated_bytes  # 1.5-2.0 state the total
            elif stated is None:
                assert value is None, field
            else:
                assert value is not None and format_size(value) == stated, (field, value, stated)
        nvml_lines = re.findall(r"(?:this process|Process \d+) has \S+ \S+ memory in use", message.text)
        assert len(message.processes) == len(nvml_lines)
        explanation = explain(message)
        assert explanation.summary and explanation.recommendations and explanation.unknowns


@pytest.mark.parametrize("entry", _corpus_params(foreign=False, containing="has a total capac"))
def test_sentence_form_messages_carry_request_capacity_and_free(entry) -> None:
    message = find_messages(entry["text"])[0]
    assert message.requested_bytes and message.capacity_bytes
    if "is free" in entry["text"]:
        assert message.free_bytes is not None
    assert message.era and (message.era.startswith("2.") or message.era == "2.1")


@pytest.mark.parametrize("entry", _corpus_params(foreign=True))
def test_other_frameworks_messages_are_rejected(entry, capsys, tmp_path) -> None:
    with pytest.raises(ForeignMessage):
        find_messages(entry["text"])
    path = tmp_path / "log.txt"
    path.write_text(entry["text"])
    assert main(["explain", str(path)]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "not PyTorch's" in error


def test_tensorflow_is_rejected(capsys) -> None:
    text = ("tensorflow.python.framework.errors_impl.ResourceExhaustedError: OOM when allocating tensor with "
            "shape[8192,8192] and type float on /job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc")  # fmt: skip
    assert main(["explain", "--message", text]) == 2
    assert "TensorFlow" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("carolchenyx/MGFN.#35", {"verdict": "fragmentation", "era": "2.1", "hint": "max_split_size_mb"}),
        ("wxian3/NeuroLens#2", {"verdict": "oversized-request"}),
        ("Mukosame/AODA#9", {"verdict": "outside-pytorch", "era": "1.5-2.0"}),
        ("pytorch/pytorch#16417", {"era": "0.4-1.4", "wording": "0.4.1-1.4 cached"}),
        ("RistoranteRist/FastFlow#4", {"era": "1.10-2.0"}),
        (
            "kaito-project/kaito#976",
            {"era": "2.4-2.9", "private_pool_bytes": 46 * MIB, "exception_type": "torch.OutOfMemoryError"},
        ),
        ("JDAI-CV/centerX#51", {"device_index": 1}),
        ("pytorch/pytorch#175431", {"device_index": 7, "backend": "rocm"}),
        ("intel/intel-extension-for-pytorch#846", {"backend": "xpu", "free_bytes": None, "hint": "empty_cache"}),
        (
            "pinokiocomputer/pinokio#941",
            {"kind": "mps", "allocated_bytes": 16 * GIB, "requested_bytes": 256, "pool": "shared"},
        ),
        ("Comfy-Org/ComfyUI#4934", {"kind": "cuda-malloc-async", "truncated": True}),
        ("huggingface/accelerate#1934", {"kind": "batch-size-finder", "verdict": "unknown"}),
        ("layumi/Person_reID_baseline_pytorch#286", {"kind": "library-alloc"}),
        ("vllm-project/vllm#19186", {"kind": "cuda-error"}),
        ("Lightning-AI/pytorch-lightning#20231", {"truncated": True, "requested_bytes": int(13.85 * GIB)}),
        ("singhsourabh/Resume-NER#4", {"truncated": True, "reserved_bytes": int(1.51 * GIB)}),
        (
            "HarderThenHarder/transformers_tasks#48",
            {"capacity_bytes": 24 * GIB, "free_bytes": 0, "hint": "max_split_size_mb"},
        ),
    ],
)
def test_corpus_messages_read_as_expected(source: str, expected: dict) -> None:
    message = find_messages(_by_source(source)["text"])[0]
    explanation = explain(message)
    for field, value in expected.items():
        actual = explanation.verdict if field == "verdict" else getattr(message, field)
        assert actual == value, field


def test_memory_outside_pytorch_in_this_process_is_nvml_minus_reserved() -> None:
    message = find_messages(_by_source("kerrj/lerf#73")["text"])[0]
    outside = next(f for f in explain(message).derived if f.name == "own_outside_pytorch_bytes")
    assert abs(outside.bytes - 3.88 * GIB) < 0.01 * GIB  # 20.81 - (12.09 + 4.84) GiB


def test_a_process_line_that_is_this_process_inside_a_container_is_recognised() -> None:
    explanation = explain(find_messages(_by_source("FoundationVision/GenerateU#10")["text"])[0])
    assert any("20398 is most likely this process" in f for f in explanation.findings)
    assert not any("other processes on this GPU" in f for f in explanation.findings)


def test_a_wrapper_repeating_the_message_and_thcudacheck_lines_are_one_message_each() -> None:
    (repeated,) = find_messages(_by_source("huggingface/autotrain-advanced#737")["text"])
    assert repeated.occurrences == 2
    (thc,) = find_messages(_by_source("jiesutd/NCRFpp#121")["text"])
    assert (thc.kind, thc.location, thc.occurrences) == ("legacy-thc", "THCStorage.cu:58", 2)


# -- verdict rules on constructed messages ---------------------------------------------------------


def test_fragmentation_when_reserved_but_unallocated_covers_the_request() -> None:
    message = _one(new_message(1 * GIB, 24 * GIB, 100 * MIB, 20 * GIB, 3 * GIB))
    explanation = explain(message)
    assert explanation.verdict == "fragmentation"
    assert any("expandable_segments:True" in r for r in explanation.recommendations)
    assert message.era == "2.11 or later"


def test_fragmentation_before_2_1_recommends_max_split_size_not_expandable_segments() -> None:
    explanation = explain(_one(old_message(1 * GIB, 24 * GIB, 20 * GIB, 100 * MIB, 23 * GIB)))
    assert explanation.verdict == "fragmentation"
    assert not any(
        "expandable_segments:True (" in r or r.startswith("set PYTORCH") for r in explanation.recommendations
    )
    assert any("max_split_size_mb" in r for r in explanation.recommendations)


def test_a_2_mib_request_is_not_called_fragmentation() -> None:
    explanation = explain(_one(new_message(2 * MIB, 24 * GIB, 1 * MIB, 20 * GIB, 3 * GIB)))
    assert explanation.verdict != "fragmentation"
    assert any("small-pool" in f for f in explanation.findings)


def test_another_process_holding_the_gpu_is_outside_pytorch() -> None:
    text = new_message(1 * GIB, 24 * GIB, 200 * MIB, 9 * GIB, 100 * MIB,
                       processes=((None, 10 * GIB), (4242, 13 * GIB)))  # fmt: skip
    explanation = explain(_one(text))
    assert explanation.verdict == "outside-pytorch"
    assert any("4242" in r for r in explanation.recommendations)
    other = next(f for f in explanation.derived if f.name == "other_processes_bytes")
    assert other.bytes == 13 * GIB


def test_a_request_larger_than_the_gpu_or_half_of_it_is_oversized() -> None:
    assert explain(_one(new_message(30 * GIB, 24 * GIB, 20 * GIB, 1 * GIB, 0))).verdict == "oversized-request"
    half = explain(_one(new_message(14 * GIB, 24 * GIB, 4 * GIB, 6 * GIB, 0)))
    assert half.verdict == "oversized-request" and half.confidence < 0.9
    absurd = _one("RuntimeError: CUDA out of memory. Tried to allocate more than 1EB memory.")
    assert absurd.request_too_large and explain(absurd).verdict == "oversized-request"


def test_a_request_that_would_have_fitted_is_not_explained_away() -> None:
    explanation = explain(_one(new_message(20 * MIB, 24 * GIB, 2 * GIB, 10 * GIB, 0)))
    assert explanation.verdict == "unknown"
    assert any("do not explain" in f for f in explanation.findings)


def test_an_exhausted_memory_fraction_is_named() -> None:
    text = new_message(20 * MIB, 80 * GIB, 70 * GIB, 8 * GIB - 10 * MIB, 0, allowed=8 * GIB)
    explanation = explain(_one(text))
    assert "per-process memory limit" in explanation.summary
    assert any("memory fraction" in r for r in explanation.recommendations)


def test_a_full_gpu_of_own_tensors_is_unknown_and_asks_for_a_dump() -> None:
    explanation = explain(_one(new_message(512 * MIB, 24 * GIB, 100 * MIB, 23 * GIB, 50 * MIB)))
    assert explanation.verdict == "unknown"
    assert RECORD_A_DUMP in explanation.recommendations


def test_the_request_figure_is_explained_as_segment_sized() -> None:
    small = explain(_one(new_message(2 * MIB, 24 * GIB, 0, 23 * GIB, 0)))
    assert "at most 1 MiB" in small.figures[0].meaning
    medium = explain(_one(new_message(20 * MIB, 24 * GIB, 0, 23 * GIB, 0)))
    assert "1-10 MiB" in medium.figures[0].meaning


def test_private_pools_count_in_allocated_and_reserved_is_allocated_plus_unallocated() -> None:
    explanation = explain(_one(new_message(1 * GIB, 24 * GIB, 0, 20 * GIB, 1 * GIB, private=512 * MIB)))
    derived = {f.name: f.bytes for f in explanation.derived}
    assert derived["reserved_bytes"] == 21 * GIB
    assert derived["tensor_bytes"] == 20 * GIB - 512 * MIB


@settings(max_examples=40, deadline=None)
@given(
    st.integers(1, 80 * GIB), st.integers(0, 80 * GIB), st.integers(0, 80 * GIB), st.integers(0, 80 * GIB),
    st.integers(1, 80 * GIB), st.integers(0, 15),
)  # fmt: skip
def test_every_figure_survives_the_round_trip(requested, free, allocated, unallocated, capacity, device) -> None:
    message = _one(new_message(requested, capacity, free, allocated, unallocated, device=device))
    assert message.device_index == device
    for field, value in [("requested_bytes", requested), ("free_bytes", free), ("allocated_bytes", allocated),
                         ("reserved_unallocated_bytes", unallocated), ("capacity_bytes", capacity)]:  # fmt: skip
        assert abs(getattr(message, field) - value) <= rounding_error_bytes(value) + 1  # two decimals


# -- logs: several messages, wrapping, prefixes ----------------------------------------------------


def test_a_log_with_two_messages_gives_two_and_highlights_the_first() -> None:
    first = new_message(1 * GIB, 24 * GIB, 100 * MIB, 20 * GIB, 3 * GIB)
    second = new_message(4 * GIB, 24 * GIB, 100 * MIB, 20 * GIB, 3 * GIB, device=1)
    log = f"step 10 loss 1.2\n{first}\n\nDuring handling...\nstep 11\n{second}\n{first}\n"
    messages = find_messages(log)
    assert [m.requested_bytes for m in messages] == [1 * GIB, 4 * GIB]
    assert [m.line for m in messages] == [2, 6]
    assert messages[0].occurrences == 2
    assert highlight(messages)[0] == 0


def test_the_first_message_with_figures_is_highlighted_over_a_bare_one() -> None:
    log = "RuntimeError: CUDA error: out of memory\n" + new_message(1 * GIB, 24 * GIB, 0, 20 * GIB, 3 * GIB)
    messages = find_messages(log)
    index, reason = highlight(messages)
    assert [m.kind for m in messages] == ["cuda-error", "caching-allocator"] and index == 1
    assert "with figures" in reason


def _fields(message) -> tuple:
    return message.identity()


@pytest.mark.parametrize(
    "prefix",
    ["[rank3]: ", "[default0]:", "(VllmWorker rank=3 pid=1090) ERROR 06-05 06:18:13 [multiproc_executor.py:470] ",
     "2024-09-15 22:48:26,085 - root - ERROR - ", "ERROR    | 2024-08-21 22:56:04 | trainer:wrapper:121 - ", "> ",
     "[2024-09-15 22:48:26,085] [ERROR] [engine.py:1234:step] ", "ERROR:root:"],
)  # fmt: skip
def test_wrapped_and_prefixed_messages_read_the_same(prefix: str) -> None:
    text = new_message(
        3 * GIB, 23 * GIB, 1 * GIB, 12 * GIB, 4 * GIB, processes=((None, 20 * GIB), (77, 1 * GIB)), private=30 * MIB
    )
    wrapped = "\n".join(prefix + line for line in textwrap.wrap(text, 57))
    assert _fields(_one(wrapped)) == _fields(_one(text))
    assert not _one(wrapped).truncated


def test_a_line_starting_with_the_old_hints_double_angle_is_not_a_quote() -> None:
    text = old_message(1 * GIB, 24 * GIB, 20 * GIB, 100 * MIB, 23 * GIB)
    wrapped = text.replace("memory is >> allocated", "memory is\n>> allocated")
    assert _one(wrapped).hint == "max_split_size_mb" and not _one(wrapped).truncated


def test_progress_bars_ansi_colours_and_carriage_returns_do_not_break_a_message() -> None:
    text = new_message(3 * GIB, 23 * GIB, 1 * GIB, 12 * GIB, 4 * GIB)
    head, tail = text[:90], text[90:]
    noisy = f"\x1b[31m{head}\r\nEpoch 0:   0%|          | 0/13 [00:06<?, ?it/s]\r\n{tail}\x1b[0m\r\n"
    assert _fields(_one(noisy)) == _fields(_one(text))


def test_a_message_cut_short_keeps_what_it_has() -> None:
    text = new_message(3 * GIB, 23 * GIB, 1 * GIB, 12 * GIB, 4 * GIB)
    cut = _one(text[: text.index("Of the allocated")] + "\nEpoch 1: 10%|#         |")
    assert cut.truncated and cut.free_bytes == 1 * GIB and cut.allocated_bytes is None
    assert any("cut short" in u for u in explain(cut).unknowns)


def test_mps_sizes_in_gb_are_binary() -> None:
    message = _one("RuntimeError: MPS backend out of memory (MPS allocated: 8.00 GB, other allocations: 512.00 MB, "
                   "max allowed: 9.07 GB). Tried to allocate 1.00 GB on private pool. Use "
                   "PYTORCH_MPS_HIGH_WATERMARK_RATIO=0.0 to disable upper limit for memory allocations (may cause "
                   "system failure).")  # fmt: skip
    assert (message.allocated_bytes, message.other_allocations_bytes, message.requested_bytes) == (
        8 * GIB,
        512 * MIB,
        GIB,
    )


def test_cuda_malloc_async_reads_its_labelled_lines() -> None:
    message = _one("torch.OutOfMemoryError: Allocation on device 0 would exceed allowed memory. (out of memory)\n"
                   "Currently allocated     : 9.43 GiB\nRequested               : 640.00 MiB\n"
                   "Device limit            : 11.59 GiB\nFree (according to CUDA): 7.12 MiB\n"
                   "PyTorch limit (set by user-supplied memory fraction)\n                        : 17179869184.00 GiB")  # fmt: skip
    assert message.kind == "cuda-malloc-async" and message.requested_bytes == 640 * MIB
    assert message.allowed_bytes is None and message.free_bytes == int(7.12 * MIB) and not message.truncated
    assert any("cudaMallocAsync" in r for r in explain(message).recommendations)


_NEW_LINK = "https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf"
_OLD_LINK = "https://pytorch.org/docs/stable/notes/cuda.html#environment-variables"


@pytest.mark.parametrize(
    ("variable", "link", "era"),
    [("PYTORCH_ALLOC_CONF=", _OLD_LINK, "2.10"), ("PYTORCH_CUDA_ALLOC_CONF=", _OLD_LINK, "2.4-2.9"),
     ("PYTORCH_CUDA_ALLOC_CONF=", _NEW_LINK, "2.11 or later")],
)  # fmt: skip
def test_the_hint_narrows_the_torch_version(variable: str, link: str, era: str) -> None:
    text = new_message(1 * GIB, 24 * GIB, 0, 20 * GIB, 3 * GIB).replace("PYTORCH_CUDA_ALLOC_CONF=", variable)
    message = _one(text.replace(_NEW_LINK, link))
    assert message.era == era
    if era == "2.10":
        assert any("PYTORCH_ALLOC_CONF=expandable_segments:True" in r for r in explain(message).recommendations)


def test_a_preemptive_rejection_names_the_memory_fraction() -> None:
    message = _one("torch.OutOfMemoryError: CUDA out of memory. Allocation was preemptively rejected because it "
                   "would exceed per_process_memory_fraction limit. Requested size: 2.00 GiB")  # fmt: skip
    assert (message.kind, message.requested_bytes, message.era) == ("preemptive-rejection", 2 * GIB, "2.12 or later")
    assert "memory fraction" in explain(message).summary


# -- the command -----------------------------------------------------------------------------------


def test_cli_text_and_json(tmp_path, capsys) -> None:
    log = tmp_path / "train.log"
    log.write_text("loading...\n" + new_message(1 * GIB, 24 * GIB, 100 * MIB, 20 * GIB, 3 * GIB) + "\n")
    assert main(["explain", str(log)]) == 0
    out = capsys.readouterr().out
    assert "Verdict: fragmentation" in out and "line 2" in out and "expandable_segments:True" in out
    assert main(["explain", str(log), "--format", "json"]) == 0
    document = json.loads(capsys.readouterr().out)
    (entry,) = document["messages"]
    assert entry["verdict"] == "fragmentation" and entry["message"]["requested_bytes"] == GIB
    assert document["highlighted"] == 0 and document["schema_version"] == 1


def test_cli_reads_stdin_and_message_argument() -> None:
    text = new_message(1 * GIB, 24 * GIB, 100 * MIB, 20 * GIB, 3 * GIB)
    done = subprocess.run([sys.executable, "-m", "oomdoctor", "explain", "-", "--format", "json"], input=text,
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0 and json.loads(done.stdout)["source"] == "standard input"
    assert main(["explain", "--message", text]) == 0


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (b"", "empty"),
        (b"epoch 1 loss 0.3\nepoch 2 loss 0.2\n", "no PyTorch out-of-memory message"),
        (b"\x80\x04\x95 a pickle", "oomdoctor report"),
        (b"\x00\x01\x02binary", "binary"),
    ],
)
def test_cli_bad_input_is_one_line_and_exit_2(tmp_path, capsys, content: bytes, words: str) -> None:
    path = tmp_path / "input.txt"
    path.write_bytes(content)
    assert main(["explain", str(path)]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and words in error and "Traceback" not in error


def test_cli_reads_utf16_logs_from_windows(tmp_path, capsys) -> None:
    path = tmp_path / "train.log"
    path.write_bytes(("step 1\r\n" + new_message(1 * GIB, 24 * GIB, 0, 20 * GIB, 3 * GIB) + "\r\n").encode("utf-16"))
    assert main(["explain", str(path)]) == 0
    assert "Verdict: fragmentation" in capsys.readouterr().out


def test_cli_usage_errors_exit_2(tmp_path, capsys) -> None:
    assert main(["explain", str(tmp_path / "missing.log")]) == 2
    assert "cannot read" in capsys.readouterr().err
    assert main(["explain"]) == 2
    assert main(["explain", "x.log", "--message", "CUDA out of memory."]) == 2


def test_messages_import_no_heavy_module() -> None:
    code = "import sys, oomdoctor.messages, oomdoctor.views.explain; print([m for m in ('torch', 'rich', 'textual') if m in sys.modules])"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
