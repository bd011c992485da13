"""`frame_kinds.per_stack`: what a rule reads in a stack is worked out once per stack object (a dump's
blocks and events share their stack tuples), and never handed to another stack."""

from __future__ import annotations

from oomdoctor.analysis import frame_kinds
from oomdoctor.analysis.frame_kinds import per_stack
from oomdoctor.model import Frame

FORWARD = (Frame("model.py", 3, "forward"), Frame("train.py", 9, "main"))


def test_a_stack_is_read_once_and_an_equal_one_of_its_own_is_read_again():
    read = []

    @per_stack
    def lines(stack):
        read.append(stack)
        return tuple(frame.line for frame in stack)

    shared = tuple(FORWARD)
    assert [lines(shared) for _ in range(5)] == [(3, 9)] * 5
    assert len(read) == 1
    other = tuple(list(FORWARD))  # equal frames, another tuple: worked out for itself
    assert other is not shared and lines(other) == (3, 9)
    assert len(read) == 2
    assert lines(()) == () and lines(()) == ()
    assert len(read) == 3


def test_the_remembered_stacks_are_bounded(monkeypatch):
    monkeypatch.setattr(frame_kinds, "STACKS_KEPT", 3)
    read = []

    @per_stack
    def size(stack):
        read.append(stack)
        return len(stack)

    stacks = [tuple(FORWARD[:1]) * n for n in range(1, 8)]
    for stack in stacks:
        assert size(stack) == len(stack)
    assert size(stacks[-1]) == len(stacks[-1]) and len(read) == 7  # the latest is still remembered
    assert size(stacks[0]) == 1 and len(read) == 8  # the oldest was let go


def test_the_attribution_rules_read_each_shared_stack_once(monkeypatch):
    """Blocks that share a stack cost one reading of it: the user-frame names, read by several rules,
    are worked out once for the stack however many blocks have it."""
    from oomdoctor.analysis import attribution

    read = []
    inner = attribution._python_user_frames.__wrapped__

    def counted(stack):
        read.append(stack)
        return inner(stack)

    monkeypatch.setattr(attribution, "_python_user_frames", per_stack(counted))
    stack = (Frame("/home/u/loader.py", 7, "collate_batch"), Frame("/home/u/train.py", 9, "main"))
    assert all(attribution._loads_data.__wrapped__(stack) for _ in range(50))
    assert all(attribution._by_names.__wrapped__(stack) is None for _ in range(50))
    assert len(read) == 1


def test_further_arguments_are_part_of_what_is_remembered():
    read = []

    @per_stack
    def at_line(stack, line):
        read.append((stack, line))
        return any(frame.line == line for frame in stack)

    assert at_line(FORWARD, 3) and at_line(FORWARD, 3)
    assert not at_line(FORWARD, 4)
    assert read == [(FORWARD, 3), (FORWARD, 4)]
