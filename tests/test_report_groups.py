"""Under a component the report names its largest source lines; blocks with no Python frames are a
group of their own there, so a small block's line does not stand alone for a component that
frame-less blocks fill (a model from before the trace, the autograd engine's temporaries)."""

from __future__ import annotations

from oomdoctor.analysis.attribution import GROUP_LIMIT
from oomdoctor.analysis.results import ComponentShare, Group
from oomdoctor.views.report_rows import NO_FRAMES_GROUP, largest_groups

MiB = 1 << 20


def _share(total: int, count: int, lines: tuple[Group, ...] = (), modules: tuple[Group, ...] = ()) -> ComponentShare:
    return ComponentShare(
        name="parameters",
        bytes=total,
        block_count=count,
        method="size-match",
        confidence=0.4,
        by_module=modules,
        by_source_line=lines,
    )


def test_frameless_blocks_are_their_own_group_beside_a_small_line():
    line = Group("train.py:110 in run", 512, 1)
    groups = largest_groups(_share(100 * MiB + 512, 40, (line,)))
    assert groups == (Group(NO_FRAMES_GROUP, 100 * MiB, 39), line)


def test_no_group_without_any_line_or_when_lines_hold_everything():
    assert largest_groups(_share(100 * MiB, 40)) == ()
    line = Group("train.py:110 in run", 100 * MiB, 40)
    assert largest_groups(_share(100 * MiB, 40, (line,))) == (line,)


def test_a_full_list_of_lines_may_leave_lines_out_so_no_remainder_is_named():
    lines = tuple(Group(f"train.py:{n} in run", MiB, 1) for n in range(GROUP_LIMIT))
    assert NO_FRAMES_GROUP not in {g.key for g in largest_groups(_share(100 * MiB, 90, lines))}


def test_module_paths_are_shown_as_they_are():
    # the named blocks hold at least half of the component (below that, source lines are named:
    # tests/test_component_groups.py)
    module = Group("model.layers.0", 60 * MiB, 2)
    line = Group("train.py:110 in run", 512, 1)
    assert largest_groups(_share(100 * MiB, 40, (line,), (module,))) == (module,)
