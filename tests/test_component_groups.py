"""The groups named under a component stand for most of its bytes, not for a few named blocks.

Module paths name only the blocks the registry knows (a forward's arguments among the inputs); a
component holding many unnamed blocks besides (tensors kept in a list between the steps, counted as
inputs by docs/definitions.md) was listed under the named few: 64 MiB of inputs under '8.00 KiB
TinyGPT.forward arg 0'.
"""

from __future__ import annotations

from oomdoctor.analysis.results import ComponentShare, Group
from oomdoctor.pipeline import read_rank
from oomdoctor.views.report_rows import largest_groups
from tests.conftest import FIXTURES

MiB = 1 << 20


def _share(by_module: tuple[Group, ...], by_source_line: tuple[Group, ...], total: int, blocks: int) -> ComponentShare:
    return ComponentShare("inputs", total, blocks, "phase", 0.9, by_module, by_source_line)


def test_named_blocks_that_hold_little_of_the_component_do_not_stand_for_it():
    share = _share(
        (Group("Model.forward arg 0", 8192, 1),),
        (Group("train.py:47 in <module>", 63 * MiB, 63), Group("train.py:41 in <module>", 8192, 1)),
        63 * MiB + 8192,
        64,
    )
    assert [g.key for g in largest_groups(share)] == ["train.py:47 in <module>", "train.py:41 in <module>"]


def test_named_blocks_that_hold_most_of_it_are_still_named():
    share = _share(
        (Group("blocks.0", 6 * MiB, 2), Group("blocks.1", 2 * MiB, 2)),
        (Group("model.py:10 in __init__", 10 * MiB, 5),),
        10 * MiB,
        5,
    )
    assert [g.key for g in largest_groups(share)] == ["blocks.0", "blocks.1"]


def test_the_kept_outputs_of_an_evaluation_are_listed_under_their_own_line():
    analysis = read_rank(str(FIXTURES / "dumps" / "realism" / "no-oom-eval-outputs-kept-gpt.pickle")).analysis
    (inputs,) = [share for share in analysis.components if share.name == "inputs"]
    named = sum(g.bytes for g in inputs.by_module)
    assert named * 100 < inputs.bytes  # the case is what it says: the registry names a sliver
    top = largest_groups(inputs)[0]
    assert top.key.endswith("eval_keep_outputs.py:47 in main") and top.bytes * 2 > inputs.bytes
