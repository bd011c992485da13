from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"


def fixture_module(name: str) -> ModuleType:
    """fixtures/NAME.py (strip, ground_truth, generate...) as a module, loaded once per session."""
    key = f"fixtures_{name}"
    module = sys.modules.get(key)
    if module is None:
        spec = importlib.util.spec_from_file_location(key, FIXTURES / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module
        spec.loader.exec_module(module)
    return module


def _corpus_dir() -> Path | None:
    env = os.environ.get("OOMDOCTOR_CORPUS")
    candidate = Path(env) if env else ROOT.parent / "shared" / "corpus"
    return candidate if candidate.is_dir() else None


CORPUS = _corpus_dir()
CORPUS_SNAPSHOTS = sorted((CORPUS / "snapshots").iterdir()) if CORPUS else []


@pytest.fixture
def corpus_dir() -> Path:
    if CORPUS is None:
        pytest.skip("real-snapshot corpus not found (../shared/corpus or OOMDOCTOR_CORPUS)")
    return CORPUS


def corpus_params():
    """pytest.mark.parametrize values over every corpus snapshot, or one skipped case without it."""
    if not CORPUS_SNAPSHOTS:
        return [pytest.param(None, marks=pytest.mark.skip(reason="corpus not found"))]
    return [pytest.param(p, id=p.name) for p in CORPUS_SNAPSHOTS]


@pytest.fixture(autouse=True)
def _no_columns_from_the_environment(monkeypatch):
    """Text output wraps to COLUMNS when it is set (oomdoctor.commands.text_width): the reports the
    tests read are whole lines, whatever terminal or CI ran pytest."""
    monkeypatch.delenv("COLUMNS", raising=False)
