"""pytest plugin: fail a test where it would run out of GPU memory (experimental).

    @pytest.mark.cuda_memory(limit="24GiB", fake=True)
    def test_a_training_step_fits():
        train_step(model, batch_size=32, device="cpu")

The body of a marked test runs under oomdoctor's rehearsal (`oomdoctor.rehearse.session.rehearsal`):
every tensor storage it makes on the CPU is also allocated in the simulated caching allocator of a
device with `limit` bytes, as `oomdoctor rehearse` runs a script. When the simulated device cannot
satisfy a request, the test fails with oomdoctor's verdict on the dump written there and the line
that made the request. Arguments: `limit` (a size, as --device-memory takes it), `fake` (tensors
carry no data: far less CPU time and host RAM, the same allocations; values read from tensors are
placeholders, so assert on shapes, not values), `alloc_conf` (PYTORCH_CUDA_ALLOC_CONF for the
simulator), `outside_memory` (a size held outside PyTorch). Fixtures are set up outside the
rehearsal: only what the test body makes counts. The body must make its tensors on "cpu"
(torch.cuda.is_available() is False while it runs).

Registered as a pytest11 entry point (or load it with `-p oomdoctor.pytest_plugin`). torch and the
analysis are imported only when a marked test runs; an unmarked test goes through untouched.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import pytest

MARKER = "cuda_memory"
_MARKER_HELP = (
    "cuda_memory(limit, fake=False, alloc_conf=None, outside_memory=0): run the test body on a simulated "
    "CUDA device of `limit` bytes (oomdoctor's rehearsal, experimental) and fail where it would run out of memory"
)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", _MARKER_HELP)


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> Any:
    marker = pyfuncitem.get_closest_marker(MARKER)
    if marker is None:
        return (yield)
    config = _config(marker)
    from oomdoctor.rehearse.session import rehearsal

    filename = str(getattr(pyfuncitem, "path", "") or "")
    with rehearsal(config, dump_dir=_dump_dir(pyfuncitem), filename=filename) as result:
        outcome = yield
    pyfuncitem.user_properties.append(("cuda_memory_peak_reserved_bytes", result.peak_reserved_bytes))
    if result.fake_failure is not None:
        pytest.fail(f"cannot rehearse without data (cuda_memory fake=True): {result.fake_failure}", pytrace=False)
    if result.oom is not None:
        pytest.fail(_out_of_memory(config, result), pytrace=False)
    return outcome


def _config(marker: pytest.Mark) -> Any:
    from oomdoctor.units import parse_size

    known = {"limit", "fake", "alloc_conf", "outside_memory"}
    unknown = sorted(set(marker.kwargs) - known)
    if unknown:
        pytest.fail(
            f"cuda_memory: unknown argument(s) {', '.join(unknown)} (known: {', '.join(sorted(known))})", pytrace=False
        )
    if len(marker.args) > 1:
        pytest.fail("cuda_memory takes one positional argument, the limit", pytrace=False)
    limit = marker.args[0] if marker.args else marker.kwargs.get("limit")
    if limit is None:
        pytest.fail('cuda_memory needs a limit, for example @pytest.mark.cuda_memory(limit="24GiB")', pytrace=False)
    try:
        device_bytes = parse_size(str(limit))
        outside_bytes = parse_size(str(marker.kwargs.get("outside_memory", 0)))
    except ValueError as error:
        pytest.fail(f"cuda_memory: {error}", pytrace=False)
    if outside_bytes >= device_bytes:
        pytest.fail("cuda_memory: outside_memory leaves no device memory for PyTorch", pytrace=False)
    alloc_conf = marker.kwargs.get("alloc_conf")
    if alloc_conf is None:
        alloc_conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or os.environ.get("PYTORCH_ALLOC_CONF") or ""
    from oomdoctor.allocator_rules import AllocatorConfigError, parse_alloc_conf

    try:
        parse_alloc_conf(alloc_conf)
    except AllocatorConfigError as error:
        pytest.fail(f"cuda_memory: bad alloc_conf {alloc_conf!r}: {error}", pytrace=False)
    from oomdoctor.rehearse.session import RehearsalConfig

    return RehearsalConfig(
        device_memory_bytes=device_bytes,
        alloc_conf=alloc_conf,
        outside_bytes=outside_bytes,
        fake=bool(marker.kwargs.get("fake", False)),
    )


def _dump_dir(item: pytest.Function) -> Path:
    """$OOMDOCTOR_DIR, else a folder of the session's pytest temporary directory."""
    if os.environ.get("OOMDOCTOR_DIR"):
        return Path(os.environ["OOMDOCTOR_DIR"]).resolve()
    factory = getattr(item.config, "_tmp_path_factory", None)
    if factory is not None:
        return factory.mktemp("oom-dumps", numbered=True)
    return Path(tempfile.mkdtemp(prefix="oom-dumps-"))


def _out_of_memory(config: Any, result: Any) -> str:
    """'would run out of GPU memory on a 24.00 GiB device: <verdict> — <summary>; the failing request ...'"""
    from oomdoctor.rehearse.fake import short_path  # torch is imported: a marked test ran
    from oomdoctor.safetext import printable
    from oomdoctor.units import format_size

    oom = result.oom
    device = f"a {format_size(config.device_memory_bytes)} device"
    mode = "oomdoctor rehearsal without data" if config.fake else "oomdoctor rehearsal"
    dump = result.dump_paths[-1] if result.dump_paths else None
    judged = _verdict(dump)
    frame = oom.user_frame
    site = f"{short_path(frame['filename'])}:{frame['line']} in {frame['name']}" if frame else "an unknown line"
    phase = f" (phase: {oom.phase})" if oom.phase else ""
    lines = [
        f"would run out of GPU memory on {device} ({mode}, experimental): {judged}; the failing request at "
        f"{site}{phase}: {format_size(oom.request_bytes)} for {oom.op}",
        f"  peak before it: {format_size(result.peak_allocated_bytes)} allocated, "
        f"{format_size(result.peak_reserved_bytes)} reserved by PyTorch",
        f"  torch: {oom.message}",
    ]
    if dump is not None:
        lines.append(f"  dump: {dump}  (oomdoctor report {dump})")
    return "\n".join(printable(line, None) for line in lines)


def _verdict(dump: Path | None) -> str:
    """'<verdict> — <summary>' from the analysis of the dump written at the OOM."""
    if dump is None:
        return "no verdict (no dump was written)"
    from oomdoctor.errors import OomdoctorError
    from oomdoctor.pipeline import load_and_analyse
    from oomdoctor.views import phrasing

    try:
        _, analysis = load_and_analyse(str(dump))
    except OomdoctorError as error:
        return f"no verdict (the dump could not be read: {error})"
    return f"{analysis.verdict} — {phrasing.summary(analysis.summary).rstrip('.')}"
