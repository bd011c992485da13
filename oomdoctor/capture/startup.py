"""The opt-in start-up hook: capture in processes one cannot edit or launch (`vllm serve`, SGLang's
workers, Ray actors, someone else's trainer), as coverage.py measures subprocesses.

    OOMDOCTOR_INSTALL=1 vllm serve ...        # every Python process that imports torch installs capture

pip puts `oomdoctor-startup.pth` in site-packages; Python runs its one line at every start. Without
the variable set that line reads one environment variable and does nothing else: oomdoctor is not
imported. With it, `activate()` installs capture once torch is imported (at once if it is already):
a process that never uses torch pays nothing more, and install() never imports torch early.
vLLM loads `vllm_plugin` (entry point group `vllm.general_plugins`) in each of its processes; it
does the same, behind the same variable.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from typing import Any

VARIABLE = "OOMDOCTOR_INSTALL"
PTH_LINE = "import os; os.environ.get('OOMDOCTOR_INSTALL', '') not in ('', '0') and __import__('oomdoctor.capture.startup').capture.startup.activate()"

_activated = False


def requested(environ: Any = None) -> bool:
    value = (os.environ if environ is None else environ).get(VARIABLE, "")
    return value.strip().lower() not in ("", "0", "false", "no")


def _install() -> None:
    try:
        from oomdoctor.capture import install

        install()
    except Exception as error:  # a start-up hook never stops the process
        try:
            print(f"oomdoctor: the start-up hook could not install capture ({error})", file=sys.stderr)
        except Exception:
            pass


class _AfterTorchImport(importlib.abc.MetaPathFinder):
    """Installs capture right after `import torch` has run (a post-import hook)."""

    def __init__(self) -> None:
        self.busy = False

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "torch" or self.busy:
            return None
        self.busy = True
        try:
            spec = importlib.machinery.PathFinder.find_spec(name, path)
        finally:
            self.busy = False
        loader = getattr(spec, "loader", None)
        exec_module = getattr(loader, "exec_module", None)
        if spec is None or exec_module is None:
            return None
        finder = self

        def exec_then_install(module: Any) -> None:
            exec_module(module)
            finder.remove()
            _install()

        loader.exec_module = exec_then_install  # type: ignore[union-attr]  # this spec's own loader
        return spec

    def remove(self) -> None:
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass


def activate() -> None:
    """Install capture now if torch is imported, else right after it is; once per process."""
    global _activated
    if _activated or not requested():
        return
    _activated = True
    if "torch" in sys.modules:
        _install()
    else:
        sys.meta_path.insert(0, _AfterTorchImport())


def vllm_plugin() -> None:
    """vLLM's `vllm.general_plugins` entry point: the start-up hook, behind the same variable."""
    activate()
