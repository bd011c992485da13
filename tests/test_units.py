"""Sizes to and from text: one parser and the formatters every layer shares."""

from __future__ import annotations

import pytest

from oomdoctor import units
from oomdoctor.units import format_size, human_size, parse_size

KiB = 1024  # the test's own figures, checked against units' below
MiB = 1024 * KiB
GiB = 1024 * MiB
TiB = 1024 * GiB


def test_the_byte_units_are_binary():
    assert (units.KIB, units.MIB, units.GIB) == (1 << 10, 1 << 20, 1 << 30) == (KiB, MiB, GiB)


@pytest.mark.parametrize(
    "text, size_bytes",
    [
        ("24GiB", 24 * GiB),
        ("512MiB", 512 * MiB),
        ("1.5GB", 1_500_000_000),
        ("500MB", 500_000_000),
        ("2g", 2 * GiB),
        ("4096", 4096),
        ("7B", 7),
        (" 3 kb ", 3000),
        ("1.25t", int(1.25 * TiB)),
        (".5gib", GiB // 2),
        ("1.", 1),
        ("0", 0),
    ],
)
def test_parse_size(text, size_bytes):
    assert parse_size(text) == size_bytes


@pytest.mark.parametrize("text", ["lots", "12 parsecs", "", "-1", "1e3", "1.5.5", "GiB", None])
def test_parse_size_refuses_what_is_not_a_size(text):
    with pytest.raises(ValueError, match="not a size"):
        parse_size(text)


def test_format_size_is_torch_oom_message_style():
    assert [format_size(n) for n in (0, 1024, 1025, MiB, MiB + 1, GiB, GiB + 1, 3 * TiB)] == [
        "0 bytes",
        "1024 bytes",
        "1.00 KiB",
        "1024.00 KiB",
        "1.00 MiB",
        "1024.00 MiB",
        "1.00 GiB",
        "3072.00 GiB",
    ]


def test_human_size():
    assert human_size(None) == "unknown"
    assert human_size(0) == "0 bytes"
    assert human_size(1023) == "1023 bytes"
    assert human_size(-5) == "-5 bytes"
    assert human_size(1536) == "1.50 KiB"
    assert human_size(-1536) == "-1.50 KiB"
    assert human_size(3 * GiB) == "3.00 GiB"
    assert human_size(5 * TiB) == "5.00 TiB"
    assert human_size(2048 * TiB) == "2048.00 TiB"
    assert human_size(1536, decimals=1) == "1.5 KiB"
    assert human_size(1023, decimals=1) == "1023 bytes"
