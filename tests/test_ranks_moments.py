"""What the folder headline says stands out in the first rank to run out compares like with like.

Four ranks of one run, rehearsed: rank 2's last step got sequences eight times longer and it ran out
in that step's forward; the others finished and are compared at their peak, in an earlier step's
backward. Its activations at the OOM against theirs at that peak are two different moments; the
fair comparison is every rank's activations in the step where rank 2 ran out.
"""

from __future__ import annotations

import pickle
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from oomdoctor.analysis.ranks import (  # noqa: E402
    ACTIVATIONS,
    MOMENT_DIFFERENT,
    MOMENT_STEP,
    MOMENT_TRACE_PEAK,
    compare_ranks,
)
from oomdoctor.load import load_raw  # noqa: E402
from oomdoctor.metadata import METADATA_KEY  # noqa: E402
from oomdoctor.pipeline import read_folder  # noqa: E402
from oomdoctor.rehearse.session import RehearsalConfig, rehearse_script  # noqa: E402
from oomdoctor.units import human_size  # noqa: E402
from oomdoctor.views import ranks as ranks_view  # noqa: E402

DEVICE_BYTES = 100 << 20
SCRIPT = textwrap.dedent(
    """
    import sys
    import oomdoctor
    oomdoctor.install()
    import torch
    import torch.nn as nn

    last_seq, steps, extra_mib = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    torch.manual_seed(0)
    extra = torch.empty(extra_mib << 18)  # held the whole run


    class Model(nn.Module):
        def __init__(self, width=256):
            super().__init__()
            self.emb = nn.Embedding(1024, width)
            self.blocks = nn.Sequential(
                *[nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)) for _ in range(4)]
            )
            self.head = nn.Linear(width, 1024)

        def forward(self, x):
            return nn.functional.cross_entropy(self.head(self.blocks(self.emb(x))).flatten(0, 1), x.flatten())


    model = Model()
    optimizer = torch.optim.AdamW(model.parameters(), foreach=True)
    for step in range(steps):
        seq = last_seq if step == steps - 1 else 64
        model(torch.randint(0, 1024, (8, seq))).backward()
        optimizer.step()
        optimizer.zero_grad()
    """
)


def _rehearse(folder: Path, last_seq: int, steps: int, extra_mib: int = 0) -> dict:
    """The dump of one run: at its OOM, else at its end."""
    script = folder / "train.py"
    script.write_text(SCRIPT)
    out = folder / f"dumps-{last_seq}-{steps}-{extra_mib}"
    args = [str(last_seq), str(steps), str(extra_mib)]
    rehearse_script(
        script,
        args,
        RehearsalConfig(device_memory_bytes=DEVICE_BYTES + (extra_mib << 20)),
        dump_dir=out,
        dump_at_end=True,
    )
    (path,) = sorted(out.glob("*.pickle"))
    return load_raw(path)


def _write(folder: Path, rank: int, raw: dict, prefix: str) -> None:
    raw = pickle.loads(pickle.dumps(raw))
    raw[METADATA_KEY].update(rank=rank, local_rank=rank, world_size=4, host="node0", pid=4000 + rank)
    (folder / f"{prefix}-rank{rank}-node0-{4000 + rank}-20260101T000000Z.pickle").write_bytes(pickle.dumps(raw))


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[dict, dict, dict]:
    work = tmp_path_factory.mktemp("runs")
    long_last = _rehearse(work, 512, 3)  # runs out in step 2's forward
    calm = _rehearse(work, 64, 3)  # finishes its three steps
    short = _rehearse(work, 64, 2)  # finishes two steps: it holds no step 2
    return long_last, calm, short


def _folder(tmp_path: Path, first: dict, others: list[dict]) -> Path:
    tmp_path.mkdir(exist_ok=True)
    _write(tmp_path, 2, first, "oom")
    for rank, raw in zip((0, 1, 3), others, strict=True):
        _write(tmp_path, rank, raw, "manual")
    return tmp_path


def _step_activations(comparison, step: int) -> list[int]:
    return [dict((s, a) for s, _, a in row.step_peaks)[step] for row in comparison.rows]


def test_the_first_ranks_activations_are_compared_with_the_others_in_the_same_step(tmp_path, runs):
    long_last, calm, _ = runs
    comparison = compare_ranks(read_folder(_folder(tmp_path, long_last, [calm, calm, calm]), parallel=False).dumps)
    first = comparison.first
    assert first is not None and first.rank == 2 and (first.step, first.phase) == (2, "forward")
    others = [row for row in comparison.rows if row is not first]
    # the case is what it says: the others are compared at their peak, in another step and phase
    assert all((row.target_kind, row.step) == ("peak", 1) for row in others)

    # every rank's own peak activations in step 2, computed from its steps
    at_step_2 = _step_activations(comparison, 2)
    mine = at_step_2[comparison.first_index]
    median = sorted(at_step_2)[1] // 2 + sorted(at_step_2)[2] // 2
    own = comparison.first_standout
    assert own is not None and (own.what, own.moment, own.step) == (ACTIVATIONS, MOMENT_STEP, 2)
    assert (own.bytes, own.median_bytes, own.difference_bytes) == (mine, median, mine - median)
    # at their rows' moments the figure would be another one (the others' activations at their peaks)
    plain = comparison.differences[0]
    assert (plain.rank, plain.what) == (2, ACTIVATIONS) and plain.difference_bytes != own.difference_bytes

    text = ranks_view.headline(comparison)
    said = f"{human_size(mine - median, decimals=1)} more activations than the median rank at their peaks in step 2"
    assert text.startswith(f"rank 2 ran out first (step 2, forward), {said}; "), text
    # the section of differences gives the same figure beside the rows' own
    folder = read_folder(tmp_path, parallel=False)
    report = ranks_view.render_text(str(tmp_path), comparison, folder.dumps, folder.skipped)
    line = (
        f"  - rank 2, each rank at its peak in step 2: {human_size(mine - median, decimals=1)} more activations than "
        f"the median ({human_size(mine, decimals=1)} against {human_size(median, decimals=1)})"
    )
    assert line in report.split("How the ranks differ", 1)[1].split("Notes", 1)[0].splitlines()


def test_without_the_step_on_every_rank_the_peaks_over_the_traces_are_compared(tmp_path, runs):
    long_last, calm, short = runs
    comparison = compare_ranks(read_folder(_folder(tmp_path, long_last, [calm, short, calm]), parallel=False).dumps)
    own = comparison.first_standout
    assert own is not None and (own.what, own.moment, own.step) == (ACTIVATIONS, MOMENT_TRACE_PEAK, None)
    peaks = [max(a for _, _, a in row.step_peaks) for row in comparison.rows]
    assert own.bytes == peaks[comparison.first_index]
    assert own.median_bytes == sorted(peaks)[1] // 2 + sorted(peaks)[2] // 2
    assert "at their peaks over their traces (the ranks stopped at different moments)" in ranks_view.headline(
        comparison
    )


def test_a_component_no_step_records_is_said_to_compare_different_moments(tmp_path, runs):
    """Rank 2 also held a 48 MiB tensor the whole run (on a device 48 MiB larger, so that it runs out
    where it did), which no step's figures measure: the headline compares it at the rows' own moments
    and says that those differ."""
    _, calm, _ = runs
    heavy = _rehearse(tmp_path, 512, 3, extra_mib=48)
    comparison = compare_ranks(
        read_folder(_folder(tmp_path / "ranks", heavy, [calm, calm, calm]), parallel=False).dumps
    )
    first = comparison.first
    assert first is not None and first.rank == 2 and first.step == 2
    own = comparison.first_standout
    assert own is not None and (own.what, own.moment) == ("other", MOMENT_DIFFERENT), own
    assert own.difference_bytes == 48 << 20
    said = f"{human_size(48 << 20, decimals=1)} more other than the median rank (compared at moments that differ)"
    assert said in ranks_view.headline(comparison)
