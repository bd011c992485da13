"""Sharing what capture wrote (issue 14): a redacted dump GitHub accepts (.gz), and Markdown reports
that fit GitHub's 65,536-character limit on an issue or comment body whatever the number of ranks.
"""

from __future__ import annotations

import gzip
import pickle
import zlib
from dataclasses import replace
from pathlib import Path

import pytest

from oomdoctor.analysis.ranks import compare_ranks
from oomdoctor.cli import main
from oomdoctor.pipeline import read_rank
from oomdoctor.views.ranks import MD_BUDGET_CHARS, render_markdown

DUMPS = Path(__file__).resolve().parent.parent / "fixtures" / "dumps"
FIXTURE = DUMPS / "oversized-request-gpt-logits.pickle"
BIG = DUMPS / "activation-spike-gpt-longer-sequence.pickle"
GITHUB_BODY_LIMIT = 65_536


@pytest.mark.parametrize("name", ["shared.pickle.gz", "shared.GZ"])
def test_redact_writes_gzip_when_out_ends_in_gz(tmp_path, capsys, name):
    target = tmp_path / name
    assert main(["redact", str(FIXTURE), str(target)]) == 0
    assert "gunzip it before opening it in pytorch.org/memory_viz" in capsys.readouterr().err
    assert target.read_bytes()[:2] == b"\x1f\x8b"
    with gzip.open(target) as file:
        data = pickle.load(file)
    assert data["oomdoctor"]["host"] == "<host>"
    assert main(["report", str(target), "--format", "json"]) == 0  # oomdoctor reads it as it is


def test_redact_compresses_at_gzips_default_level(tmp_path, capsys):
    """Level 6, as `gzip FILE` writes: GzipFile's own default, 9, takes seven times as long on a
    large dump for 2% fewer bytes. The deflate stream is the whole pickle's at level 6."""
    target = tmp_path / "shared.pickle.gz"
    assert main(["redact", str(BIG), str(target)]) == 0
    capsys.readouterr()
    written = target.read_bytes()
    assert written[8] == 0  # the header's XFL: 2 would say level 9 (the slowest), 4 level 1
    raw = gzip.decompress(written)

    def deflated(level: int) -> bytes:
        packer = zlib.compressobj(level, zlib.DEFLATED, -zlib.MAX_WBITS)
        return packer.compress(raw) + packer.flush()

    assert written[10:-8] == deflated(6)  # between the 10-byte header and the CRC and length
    assert written[10:-8] != deflated(9)


def test_redact_keeps_gzip_for_gzip_input_and_plain_for_plain(tmp_path, capsys):
    packed = tmp_path / "in.pickle.gz"
    packed.write_bytes(gzip.compress(FIXTURE.read_bytes()))
    assert main(["redact", str(packed), str(tmp_path / "out.pickle")]) == 0
    assert (tmp_path / "out.pickle").read_bytes()[:2] == b"\x1f\x8b"
    assert main(["redact", str(FIXTURE), str(tmp_path / "plain.pickle")]) == 0
    assert (tmp_path / "plain.pickle").read_bytes()[:2] == b"\x80\x04"  # a plain protocol-4 pickle
    capsys.readouterr()


def test_a_gunzipped_redacted_dump_opens_in_torchs_memory_viz(tmp_path, capsys):
    pytest.importorskip("torch")
    from torch.cuda import _memory_viz

    target = tmp_path / "shared.pickle.gz"
    assert main(["redact", str(FIXTURE), str(target)]) == 0
    data = pickle.loads(gzip.decompress(target.read_bytes()))
    assert "Summary of segments" in _memory_viz.segsum(data)
    assert _memory_viz.trace(data)
    capsys.readouterr()


def test_a_256_rank_markdown_report_fits_an_issue_comment():
    small, big = read_rank(str(FIXTURE)), read_rank(str(BIG))
    dumps = []
    for rank in range(256):
        base = big if rank == 77 else small  # one rank got the bigger batch and ran out first
        dumps.append(
            replace(
                base,
                file=f"oom-rank{rank}-node{rank // 8}-{4000 + rank}-20260101T000000Z.pickle",
                rank=rank,
                oom_time_us=1_800_000_000_000_000 + (0 if rank == 77 else 1_000_000 + rank),
            )
        )
    comparison = compare_ranks(dumps)
    text = render_markdown("oom-dumps", comparison, tuple(dumps), ())
    assert len(text) <= MD_BUDGET_CHARS < GITHUB_BODY_LIMIT
    assert "ranks left out to fit an issue comment" in text
    assert "| 77 |" in text and "| 0 |" in text and "| 255 |" in text  # the first to run out and the edges
    assert "### Rank 77: the full report" in text

    few = render_markdown("oom-dumps", compare_ranks(dumps[:16]), tuple(dumps[:16]), ())
    assert "left out" not in few and few.count("oom-rank") >= 16  # small folders keep every row


def test_the_markdown_report_says_how_to_attach_the_dump_and_the_command_it_names_works(tmp_path, capsys):
    import re

    from oomdoctor.pipeline import report_file

    markdown = report_file(str(FIXTURE), "md").decode()
    hint = re.search(r"`oomdoctor redact DUMP (DUMP\.redacted\.pickle\.gz)`", markdown)
    assert hint and "`.gz`" in markdown.rsplit("<sub>", 1)[1]
    target = tmp_path / hint.group(1).replace("DUMP", FIXTURE.stem)
    assert main(["redact", str(FIXTURE), str(target)]) == 0
    capsys.readouterr()
    assert target.read_bytes()[:2] == b"\x1f\x8b"  # gzip, as GitHub takes it
    assert main(["report", str(target), "--format", "json"]) == 0
