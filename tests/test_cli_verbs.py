"""The CLI's verbs are registered explicitly (oomdoctor.cli.VERBS): every one imports and has the
verb interface, and every verb module in oomdoctor/commands is registered."""

from __future__ import annotations

import argparse
import importlib
import pkgutil

import pytest

import oomdoctor.commands
from oomdoctor.cli import VERBS, build_parser


@pytest.mark.parametrize("name, module", VERBS, ids=[name for name, _ in VERBS])
def test_every_registered_verb_imports_and_has_add_arguments_and_run(name, module):
    assert importlib.import_module(f"oomdoctor.commands.{name}") is module
    assert callable(module.add_arguments) and callable(module.run)
    assert (module.__doc__ or "").strip(), f"{name}: its docstring is its --help"


def test_every_verb_module_is_registered_once():
    names = [name for name, _ in VERBS]
    assert len(names) == len(set(names))
    modules = sorted(info.name for info in pkgutil.iter_modules(oomdoctor.commands.__path__))
    assert sorted(names) == modules


def test_the_parser_offers_exactly_the_registered_verbs():
    parser = build_parser()
    (subparsers,) = [action for action in parser._actions if isinstance(action, argparse._SubParsersAction)]
    assert list(subparsers.choices) == [name for name, _ in VERBS]
    assert "diff" in subparsers.choices


def test_a_missing_verb_module_fails_loudly():
    """A verb module that cannot be imported is an error, not a verb quietly left out of --help."""
    import subprocess
    import sys

    code = "import sys\nsys.modules['oomdoctor.commands.rehearse'] = None\nimport oomdoctor.cli\n"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode != 0 and last.startswith("ModuleNotFoundError") and "oomdoctor.commands.rehearse" in last
