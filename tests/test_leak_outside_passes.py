"""A creeping leak of tensors made between the steps is said to be made there, not in the passes.

docs/definitions.md counts a block allocated outside forward, backward, optimizer step and zero_grad
as an input, and so does the ground truth: a list that keeps a tensor made after each optimizer step
piles up inputs. The leak's sentence named every kept byte "allocated in earlier steps' forward or
backward", which these never were.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from oomdoctor.analysis.results import Facts  # noqa: E402
from oomdoctor.pipeline import read_rank  # noqa: E402
from oomdoctor.rehearse.session import RehearsalConfig, rehearse_script  # noqa: E402
from oomdoctor.units import human_size  # noqa: E402
from oomdoctor.views.phrasing import summary as summary_text  # noqa: E402
from oomdoctor.vocabulary import Verdict  # noqa: E402

MiB = 1 << 20
SCRIPT = textwrap.dedent(
    """
    import sys
    import oomdoctor
    oomdoctor.install()
    import torch
    import torch.nn as nn

    keep_outputs = sys.argv[1] == "outputs"
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 256))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    kept = []
    for step in range(400):
        out = model(torch.randn(256, 256))
        out.square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        kept.append(torch.ones(256, 1024))  # 1 MiB made between the steps, kept
        if keep_outputs:
            kept.append(out.detach())  # 256 KiB made in the forward, kept
    """
)


def _oom(tmp_path: Path, keep: str):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    out = tmp_path / keep
    rehearse_script(script, [keep], RehearsalConfig(device_memory_bytes=48 * MiB), dump_dir=out)
    (path,) = sorted(out.glob("oom-*.pickle"))
    return read_rank(str(path)).analysis


def _kept(analysis, phases: tuple[str, ...]) -> int:
    """Live bytes allocated in an earlier step than the OOM's, in one of `phases`."""
    return sum(
        b.size_bytes
        for b in analysis.live_blocks
        if b.phase in phases and b.step is not None and b.step < analysis.target_step and b.alloc_index is not None
    )


def test_tensors_kept_from_between_the_steps_are_not_said_to_come_from_the_passes(tmp_path):
    analysis = _oom(tmp_path, "between")
    assert analysis.verdict == Verdict.CREEPING_LEAK
    facts: Facts = analysis.summary.facts
    old = facts.size("old")
    assert old is not None and old >= 8 * MiB and old % MiB == 0
    assert _kept(analysis, ("forward", "backward")) == 0  # the case is what it says
    assert facts.size("outside_passes") == old
    text = summary_text(analysis.summary)
    assert text.startswith(f"{human_size(old)} allocated in earlier steps outside their forward and backward "), text
    assert "forward or backward" not in text


def test_a_leak_from_both_says_how_much_came_from_each(tmp_path):
    analysis = _oom(tmp_path, "outputs")
    assert analysis.verdict == Verdict.CREEPING_LEAK
    facts = analysis.summary.facts
    old, outside = facts.size("old"), facts.size("outside_passes")
    assert old is not None and outside is not None and 0 < outside < old
    in_passes = old - outside
    assert in_passes == _kept(analysis, ("forward", "backward")) and in_passes % (256 * 1024) == 0
    assert outside % MiB == 0  # whole kept 1 MiB tensors made between the steps
    text = summary_text(analysis.summary)
    said = f"({human_size(in_passes)} in their forward or backward, {human_size(outside)} outside them)"
    assert said in text, text
