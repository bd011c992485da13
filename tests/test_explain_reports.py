"""`oomdoctor explain` on what users paste instead of a dump (issue 14): torch.cuda.memory_summary()
tables, DeepSpeed's see_memory_usage lines, vLLM's memory profiling lines, and a PyTorch OOM known
only by its exception type (its message cut away).
"""

from __future__ import annotations

import json

import pytest

from oomdoctor.cli import main
from oomdoctor.messages import explain, find_messages
from oomdoctor.units import GIB, KIB, MIB

# torch.cuda.memory_summary() as torch 2.x prints it (device 0, after two OOMs), pasted into an issue
SUMMARY = """\
RuntimeError: CUDA error: out of memory
|===========================================================================|
|                  PyTorch CUDA memory summary, device ID 0                 |
|---------------------------------------------------------------------------|
|            CUDA OOMs: 2            |        cudaMalloc retries: 7         |
|===========================================================================|
|        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  |
|---------------------------------------------------------------------------|
| Allocated memory      |  14562 MiB |  19870 MiB |   3418 GiB |   3404 GiB |
|       from large pool |  14501 MiB |  19790 MiB |   3391 GiB |   3377 GiB |
|       from small pool |     61 MiB |     80 MiB |     27 GiB |     27 GiB |
|---------------------------------------------------------------------------|
| Active memory         |  14562 MiB |  19870 MiB |   3418 GiB |   3404 GiB |
|---------------------------------------------------------------------------|
| Requested memory      |  14520 MiB |  19822 MiB |   3410 GiB |   3396 GiB |
|---------------------------------------------------------------------------|
| GPU reserved memory   |  22886 MiB |  22886 MiB |  31044 MiB |   8158 MiB |
|       from large pool |  22790 MiB |  22790 MiB |  30940 MiB |   8150 MiB |
|       from small pool |     96 MiB |     96 MiB |    104 MiB |      8 MiB |
|---------------------------------------------------------------------------|
| Non-releasable memory |   8323 MiB |   9012 MiB |   2980 GiB |   2972 GiB |
|---------------------------------------------------------------------------|
| Allocations           |    1893    |    2210    |   12044 K  |   12042 K  |
|---------------------------------------------------------------------------|
| GPU reserved segments |     102    |     102    |     134    |      32    |
|---------------------------------------------------------------------------|
| Oversize allocations  |       0    |       0    |       0    |       0    |
|---------------------------------------------------------------------------|
| Oversize GPU segments |       0    |       0    |       0    |       0    |
|===========================================================================|
"""

DEEPSPEED = """\
[2025-03-02 11:04:12,118] [INFO] [utils.py:781:see_memory_usage] After forward
[2025-03-02 11:04:12,119] [INFO] [utils.py:782:see_memory_usage] MA 18.42 GB         Max_MA 21.07 GB         CA 28.5 GB         Max_CA 29 GB
[2025-03-02 11:04:12,119] [INFO] [utils.py:789:see_memory_usage] CPU Virtual Memory:  used = 61.3 GB, percent = 12.2%
"""

VLLM_07 = """\
INFO 01-15 10:22:40 [worker.py:267] Memory profiling takes 5.23 seconds
INFO 01-15 10:22:40 [worker.py:267] the current vLLM instance can use total_gpu_memory (79.14GiB) x gpu_memory_utilization (0.90) = 71.22GiB
INFO 01-15 10:22:40 [worker.py:267] model weights take 14.99GiB; non_torch_memory takes 0.29GiB; PyTorch activation peak memory takes 4.40GiB; the rest of the memory reserved for KV Cache is 51.54GiB.
"""

VLLM_06_NO_CACHE = """\
INFO 11-20 08:01:02 worker.py:232] Memory profiling results: duration=4.21 seconds, total_gpu_memory=23.64GiB, initial_memory_usage=15.10GiB, peak_torch_memory=21.80GiB, memory_usage_post_profile=15.30GiB, non_torch_memory=0.48GiB, kv_cache_size=-0.97GiB, gpu_memory_utilization=0.90.
ERROR 11-20 08:01:02 engine.py:366] No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing the engine.
"""


def test_a_memory_summary_table_is_read_and_explained():
    (message,) = [m for m in find_messages(SUMMARY) if m.kind == "memory-summary"]
    figures = dict(message.report_figures)
    assert figures["allocated"] == 14562 * MIB and figures["peak_allocated"] == 19870 * MIB
    assert figures["reserved"] == 22886 * MIB and figures["non_releasable"] == 8323 * MIB
    assert dict(message.report_counts)["alloc_retries"] == 7 and dict(message.report_counts)["ooms"] == 2
    assert message.device_index == 0 and not message.truncated
    explained = explain(message)
    assert explained.verdict == "fragmentation"
    assert any("7 cudaMalloc retries" in finding for finding in explained.findings)
    assert any("expandable_segments:True" in rec for rec in explained.recommendations)


def test_explain_cli_on_a_pasted_table(tmp_path, capsys):
    log = tmp_path / "issue.txt"
    log.write_text(SUMMARY)
    assert main(["explain", str(log), "--format", "json"]) == 0
    document = json.loads(capsys.readouterr().out)
    kinds = [entry["message"]["kind"] for entry in document["messages"]]
    assert "memory-summary" in kinds and "cuda-error" in kinds
    assert main(["explain", str(log)]) == 0
    assert "memory_summary() table, GPU 0" in capsys.readouterr().out


def test_deepspeed_see_memory_usage():
    (message,) = find_messages(DEEPSPEED)
    assert message.kind == "deepspeed-memory"
    figures = dict(message.report_figures)
    assert figures["ma"] == round(18.42 * GIB) and figures["max_ca"] == 29 * GIB
    explained = explain(message)
    assert explained.verdict == "fragmentation"  # 7.9 GiB reserved beyond the tensors' peak
    assert explained.derived[0].bytes == 29 * GIB - round(21.07 * GIB)


def test_vllm_memory_profiling_lines():
    (message,) = find_messages(VLLM_07)
    assert message.kind == "vllm-memory"
    figures = dict(message.report_figures)
    for name, gib in (("total", 79.14), ("kv_cache", 51.54), ("weights", 14.99), ("budget", 71.22)):
        assert abs(figures[name] - gib * GIB) <= 1
    assert dict(message.report_counts)["gpu_memory_utilization_percent"] == 90
    assert "72%" in explain(message).findings[0]


def test_vllm_with_no_memory_left_for_the_kv_cache():
    (message,) = find_messages(VLLM_06_NO_CACHE)
    figures = dict(message.report_figures)
    assert figures["kv_cache"] < 0 and abs(figures["activation_peak"] - 21.80 * GIB) <= 1
    explained = explain(message)
    assert any("nothing is left for the KV cache" in finding for finding in explained.findings)
    assert any("gpu_memory_utilization" in rec for rec in explained.recommendations)


@pytest.mark.parametrize(
    "text",
    [
        "torch.OutOfMemoryError",
        "torch.OutOfMemoryError: ",
        'Traceback (most recent call last):\n  File "/app/main.py", line 3, in <module>\n    run()\ntorch.cuda.OutOfMemoryError:',
        "!!! Exception during processing !!!\n2024-09-15 22:48:26,085 - root - ERROR - Got an OOM\ntorch.OutOfMemoryError",
    ],
)
def test_a_pytorch_oom_known_only_by_its_exception_type(text, capsys):
    (message,) = find_messages(text)
    assert message.kind == "exception-only" and message.truncated
    assert explain(message).summary.startswith("PyTorch ran out of GPU memory")
    assert main(["explain", "--message", text]) == 0
    capsys.readouterr()


@pytest.mark.parametrize(
    "text",
    [
        "    except torch.OutOfMemoryError:\n        batch_size //= 2",  # code, not an exception line
        "if isinstance(error, torch.cuda.OutOfMemoryError):",
    ],
)
def test_the_exception_type_in_code_is_no_message(text):
    assert find_messages(text) == []


def test_a_full_message_is_not_counted_twice():
    text = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of "
        "23.64 GiB of which 3.81 MiB is free. Of the allocated memory 22.9 GiB is allocated by PyTorch, and "
        "100.00 MiB is reserved by PyTorch but unallocated."
    )
    (message,) = find_messages(text)
    assert message.kind == "caching-allocator" and message.requested_bytes == 20 * MIB
    assert KIB  # (units imported for the figures above)
