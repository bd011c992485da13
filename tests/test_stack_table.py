"""`load.stacks.StackTable`: one Frame per distinct frame and one tuple per distinct stack, found by
the raw dicts' identities and, for dicts met for the first time, by value; and `Frame.path`, the
slashed file name every rule matches, made when the frame is."""

from __future__ import annotations

import dataclasses
import pickle

from oomdoctor.load.stacks import UNKNOWN_FRAME, StackTable
from oomdoctor.model import NO_STACK, Frame, slashed


def frame(filename: str, line: int, name: str = "f") -> dict:
    return {"filename": filename, "line": line, "name": name}


def test_shared_dicts_and_equal_values_make_one_frame_and_one_stack():
    table = StackTable()
    inner, outer = frame("a.py", 1), frame("b.py", 2)
    first = table.stack_of([inner, outer])
    assert first == (Frame("a.py", 1, "f"), Frame("b.py", 2, "f"))
    assert table.stack_of([inner, outer]) is first  # a new list of the same dicts
    assert table.stack_of([frame("a.py", 1), frame("b.py", 2)]) is first  # equal dicts met for the first time
    assert table.stack_of([outer, inner]) != first
    assert table.stack_of([outer, inner])[0] is first[1]  # the frames are shared between stacks


def test_a_stack_mixing_known_and_new_frames():
    table = StackTable()
    known = [frame("a.py", i) for i in range(4)]
    table.stack_of(known)
    mixed = [known[0], frame("new.py", 9), known[2], "not a frame", known[3]]
    stack = table.stack_of(mixed)
    assert [f.filename for f in stack] == ["a.py", "new.py", "a.py", "??", "a.py"]
    assert stack[0] is table.stack_of(known)[0] and stack[3] is UNKNOWN_FRAME
    assert table.stack_of(list(mixed)) is stack
    assert table.stack_of([]) is NO_STACK and table.stack_of(None) is NO_STACK and table.stack_of("x") is NO_STACK


def test_odd_values_convert_as_before():
    table = StackTable()
    stack = table.stack_of([{"filename": 3, "line": "x", "name": None}, {"line": 2**70}, 7])
    assert stack == (Frame("??", 0, "??"), Frame("??", 0, "??"), UNKNOWN_FRAME)


def test_the_path_is_the_slashed_file_name_and_no_part_of_the_frames_value():
    windows = Frame("C:\\work\\train.py", 3, "main")
    assert windows.path == slashed(windows.filename) == "C:/work/train.py"
    assert Frame("a/b.py", 1, "f").path == "a/b.py"
    assert windows == Frame("C:\\work\\train.py", 3, "main")
    assert hash(windows) == hash(Frame("C:\\work\\train.py", 3, "main"))
    assert "path" not in repr(windows)
    moved = dataclasses.replace(windows, filename="D:\\x.py")
    assert moved.path == "D:/x.py"
    back = pickle.loads(pickle.dumps(windows))
    assert back == windows and back.path == windows.path
