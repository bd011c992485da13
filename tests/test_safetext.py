"""printable, clip and describe_value: file strings made inert and bounded."""

from __future__ import annotations

import time

from oomdoctor.safetext import clip, describe_value, is_printable, printable


def test_controls_escaped():
    evil = "/src/\x1b]0;pwned\x07\x1b]52;c;cHduZWQ=\x07\x1b[2J\x9b\x7f\u202etrain.py\nx\ty"
    out = printable(evil)
    assert not any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in out)
    assert "\u202e" not in out
    assert "\\x1b]0;pwned\\x07" in out and "\\u202e" in out and "\\x0a" in out


def test_plain_text_unchanged():
    for text in ("train.py", "/home/ü/naïve 数据.py", "a\\b", "", "[bold]x[/]"):
        assert printable(text) == text
        assert is_printable(text)


def test_clip_says_what_was_left_out():
    assert clip("abc", 5) == "abc"
    assert clip("a" * 10, 4) == "aaaa… (6 more characters)"
    assert len(printable("x" * 10**6)) < 5000


def test_describe_value_never_expands():
    laughs: list = ["lol"]
    for _ in range(60):
        laughs = [laughs, laughs]
    start = time.perf_counter()
    assert describe_value(laughs) == "a list of 2 items"
    assert describe_value(2**1100) == "an integer of 1101 bits"
    assert describe_value(5) == "5"
    assert describe_value("x" * 1000).endswith("more characters)'")
    assert printable(laughs) == "a list of 2 items"
    assert time.perf_counter() - start < 1


def test_lone_surrogates_escaped():
    out = printable("/src/\ud800lone.py")
    assert out == "/src/\\ud800lone.py"
    out.encode("utf-8")  # writable to any terminal or file
