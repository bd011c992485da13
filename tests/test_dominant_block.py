"""A single live block that holds a large share of memory at the OOM is named in the evidence.

A tensor held the whole run (a buffer made before training, an extra copy on one rank) can be the
largest part of memory at the OOM without being what the verdict is about; the report named it only
in the table of components. Now the evidence says it, with its share of allocated, whatever the
verdict, unless the block is a model state or the verdict's evidence already points at it.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from oomdoctor.analysis.results import EvidenceKind  # noqa: E402
from oomdoctor.pipeline import read_rank  # noqa: E402
from oomdoctor.rehearse.session import RehearsalConfig, rehearse_script  # noqa: E402
from oomdoctor.views.phrasing import evidence as evidence_words  # noqa: E402

MiB = 1 << 20
SCRIPT = textwrap.dedent(
    """
    import sys
    import oomdoctor
    oomdoctor.install()
    import torch
    import torch.nn as nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1024, 1024), nn.GELU(), nn.Linear(1024, 1024), nn.GELU(), nn.Linear(1024, 1024))
    optimizer = torch.optim.AdamW(model.parameters(), foreach=True)
    extra = torch.empty(int(sys.argv[1]) << 18)  # held the whole run
    for step in range(3):
        model(torch.randn(64, 1024)).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    """
)


def _oom(tmp_path: Path, extra_mib: int, device_mib: int):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    out = tmp_path / f"out-{extra_mib}-{device_mib}"
    rehearse_script(script, [str(extra_mib)], RehearsalConfig(device_memory_bytes=device_mib * MiB), dump_dir=out)
    (path,) = sorted(out.glob("oom-*.pickle"))
    return read_rank(str(path)).analysis


def test_a_tensor_held_the_whole_run_is_named_when_it_dominates_memory_at_the_oom(tmp_path):
    analysis = _oom(tmp_path, 40, 64)
    blocks = [b for b in analysis.live_blocks if b.size_bytes == 40 * MiB]
    assert len(blocks) == 1 and blocks[0].component == "other"  # the case is what it says
    allocated = analysis.replay.target_allocated_bytes
    assert 40 * MiB * 4 >= allocated
    named = [item for item in analysis.evidence if item.kind == EvidenceKind.DOMINANT_BLOCK]
    assert len(named) == 1
    (item,) = named
    assert (item.bytes, item.address, item.event_index) == (40 * MiB, blocks[0].address, blocks[0].alloc_index)
    assert item.facts.number("share") == pytest.approx(40 * MiB / allocated)
    assert (
        evidence_words(item)
        == f"a single live block of other memory, {40 * MiB / allocated:.0%} of allocated at the OOM"
    )


def test_without_such_a_block_nothing_is_added(tmp_path):
    analysis = _oom(tmp_path, 0, 36)
    assert analysis.replay.target_kind == "oom"
    assert (
        max(
            b.size_bytes
            for b in analysis.live_blocks
            if b.component not in ("parameters", "gradients", "optimizer_state")
        )
        * 4
        < analysis.replay.target_allocated_bytes
    )
    assert not [item for item in analysis.evidence if item.kind == EvidenceKind.DOMINANT_BLOCK]
