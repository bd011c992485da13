"""The light layers stay light: importing them loads none of torch, textual or rich (DESIGN §3)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

HEAVY = ("torch", "textual", "rich")
LIGHT_MODULES = ["oomdoctor", "oomdoctor.load", "oomdoctor.model", "oomdoctor.analysis"]


def _heavy_modules_after_import(module: str) -> list[str]:
    code = (
        "import importlib, json, sys\n"
        f"importlib.import_module({module!r})\n"
        f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r})))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, f"importing {module} failed:\n{done.stderr}"
    return json.loads(done.stdout)


@pytest.mark.parametrize("module", LIGHT_MODULES)
def test_import_loads_no_heavy_module(module: str) -> None:
    # a module that is gone fails here (it is not skipped): the guard must not quietly stop guarding
    assert importlib.util.find_spec(module) is not None, f"{module} is missing: move this check to its new home"
    assert _heavy_modules_after_import(module) == []


def test_loading_a_snapshot_loads_no_heavy_module(tmp_path) -> None:
    path = tmp_path / "snapshot.pickle"
    code = (
        "import json, pickle, sys\n"
        f"path = {str(path)!r}\n"
        "pickle.dump({'segments': [], 'device_traces': [[]]}, open(path, 'wb'), protocol=4)\n"
        "import oomdoctor\n"
        "from oomdoctor.analysis.contents import describe\n"
        "from oomdoctor.views.info import to_text\n"
        "to_text(describe(oomdoctor.load(path), path))\n"
        f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r})))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(done.stdout) == []
