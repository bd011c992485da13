"""Every `--help` (the top level's and each verb's) fits 80 columns, at COLUMNS=80 and on a wide
terminal, and keeps every word of the verb's docstring."""

from __future__ import annotations

import contextlib
import io

import pytest

from oomdoctor.cli import VERBS, build_parser

HELP_ARGVS = [[], *[[name] for name, _ in VERBS]]


def _help(argv: list[str]) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        build_parser().parse_args([*argv, "--help"])
    return out.getvalue()


@pytest.mark.parametrize("columns", ["80", "250"])
@pytest.mark.parametrize("argv", HELP_ARGVS, ids=["oomdoctor", *[name for name, _ in VERBS]])
def test_every_help_fits_80_columns(argv, columns, monkeypatch):
    monkeypatch.setenv("COLUMNS", columns)
    text = _help(argv)
    assert "usage:" in text
    too_wide = [line for line in text.splitlines() if len(line) > 80]
    assert not too_wide, too_wide


def test_help_keeps_every_word_of_the_docstring(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    for name, module in VERBS:
        words = (module.__doc__ or "").split()
        shown = _help([name]).split()
        start = shown.index(words[0])
        assert shown[start : start + len(words)] == words, name
