"""The pytest plugin: `@pytest.mark.cuda_memory(limit=..., fake=...)` rehearses a test body on a
simulated device and fails the test where it would run out, with oomdoctor's verdict.

Each inner test file runs in a pytest subprocess (an in-process run drops the modules it imported
when it ends, and torch cannot be imported twice in one process), the plugin loaded with `-p`, as it
is before `pip install -e` installs its entry point; a few seconds each (torch's import).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def run_inner(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch):
    # this checkout's oomdoctor, whatever the environment's editable install points at
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH")))))
    monkeypatch.delenv("OOMDOCTOR_DIR", raising=False)
    monkeypatch.delenv("OOMDOCTOR_REHEARSAL", raising=False)

    def run(source: str) -> pytest.RunResult:
        pytester.makepyfile(test_inner=textwrap.dedent(source))
        return pytester.runpytest_subprocess("-p", "oomdoctor.pytest_plugin", "-p", "no:cacheprovider", "-q")

    return run


@pytest.mark.slow
def test_a_marked_test_that_fits_passes_and_others_are_left_alone(run_inner):
    result = run_inner(
        """
        import os
        import pytest
        import torch

        @pytest.mark.cuda_memory(limit="64MiB")
        def test_fits(record_property):
            assert os.environ["OOMDOCTOR_REHEARSAL"] == "1" and not torch.cuda.is_available()
            model = torch.nn.Linear(256, 256)
            model(torch.randn(8, 256)).sum().backward()
            assert torch.cuda.max_memory_allocated() > 256 * 256 * 4

        @pytest.mark.cuda_memory("64MiB", fake=True)
        def test_fits_without_data():
            assert torch.randn(1024, 1024).shape == (1024, 1024)

        def test_unmarked():
            assert "OOMDOCTOR_REHEARSAL" not in os.environ
            torch.empty(1024 * 1024 * 1024, dtype=torch.uint8)  # 1 GiB: nothing simulated here
        """,
    )
    result.assert_outcomes(passed=3)


@pytest.mark.slow
def test_a_marked_test_that_would_run_out_fails_with_the_verdict_and_the_line(run_inner):
    result = run_inner(
        """
        import pytest
        import torch

        @pytest.mark.cuda_memory(limit="64MiB", fake=True)
        def test_too_big():
            held = [torch.empty(4 * 1024 * 1024) for _ in range(8)]  # 8 x 16 MiB
        """,
    )
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    line = next(line for line in out.splitlines() if "would run out of GPU memory" in line)
    assert (
        "would run out of GPU memory on a 64.00 MiB device (oomdoctor rehearsal without data, experimental): " in line
    )
    assert " — " in line  # the verdict, then its summary
    assert "the failing request at test_inner.py:6 in <listcomp>: 16.00 MiB for aten.empty" in line
    assert "torch: CUDA out of memory. Tried to allocate 16.00 MiB" in out
    assert "oomdoctor report " in out
    assert "Traceback" not in out and "oomdoctor/rehearse" not in out


@pytest.mark.slow
def test_a_marked_test_that_needs_data_under_fake_says_so(run_inner):
    result = run_inner(
        """
        import pytest
        import torch

        @pytest.mark.cuda_memory(limit="64MiB", fake=True)
        def test_unique():
            torch.unique(torch.randn(8))
        """,
    )
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "cannot rehearse without data (cuda_memory fake=True): test_inner.py:6 runs aten._unique2.default" in out
    assert "Traceback" not in out and "oomdoctor/rehearse" not in out


@pytest.mark.slow
def test_the_tests_own_failures_and_bad_markers_read_as_such(run_inner):
    result = run_inner(
        """
        import pytest
        import torch

        @pytest.mark.cuda_memory(limit="64MiB")
        def test_wrong():
            assert torch.ones(2).sum().item() == 3

        @pytest.mark.cuda_memory(fake=True)
        def test_no_limit():
            pass

        @pytest.mark.cuda_memory(limit="lots")
        def test_bad_limit():
            pass
        """,
    )
    result.assert_outcomes(failed=3)
    out = result.stdout.str()
    assert "assert 2.0 == 3" in out
    assert 'cuda_memory needs a limit, for example @pytest.mark.cuda_memory(limit="24GiB")' in out
    assert "cuda_memory: not a size: 'lots'" in out


def test_the_plugin_is_an_entry_point_and_imports_no_torch():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11
    entry_points = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["pytest11"]
    assert entry_points == {"oomdoctor.pytest_plugin": "oomdoctor.pytest_plugin"}
    code = "import sys, oomdoctor.pytest_plugin; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_the_rehearsal_of_a_with_block_takes_its_oom_and_lets_other_errors_through(tmp_path):
    from oomdoctor.rehearse.session import RehearsalConfig, rehearsal

    config = RehearsalConfig(device_memory_bytes=64 * 2**20, fake=True)
    with rehearsal(config, dump_dir=tmp_path) as result:
        kept = torch.empty(8 * 2**20)  # 32 MiB
        torch.empty(16 * 2**20)  # 64 MiB more: runs out
    assert kept.shape == (8 * 2**20,)
    assert result.exit_code == 1 and result.oom.request_bytes == 64 * 2**20
    assert result.peak_allocated_bytes == 32 * 2**20 and len(result.dump_paths) == 1
    with pytest.raises(ZeroDivisionError):
        with rehearsal(config, dump_dir=tmp_path):
            raise ZeroDivisionError("the test's own error")
    assert "OOMDOCTOR_REHEARSAL" not in os.environ
