"""oomdoctor: a post-mortem debugger for PyTorch CUDA out-of-memory failures.

`import oomdoctor` stays light (no torch, rich or textual): capture is imported only when
`install()`, `uninstall()` or `dump()` is called.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["install", "uninstall", "dump", "release", "load", "__version__"]


def install(**options: Any) -> None:
    """Record the caching allocator's history and leave a dump at the moment of a CUDA OOM."""
    from oomdoctor.capture import install as _install

    _install(**options)


def uninstall() -> None:
    """Undo install(): stop recording and restore every hook install() replaced."""
    from oomdoctor.capture import uninstall as _uninstall

    _uninstall()


def dump(path: Any = None) -> Any:
    """Write a dump now (for example at the peak of a run that fits); returns its path or None."""
    from oomdoctor.capture import dump as _dump

    return _dump(path)


def release() -> Any:
    """After an OOM in a notebook: let go of the memory the last traceback's frames hold, collect
    garbage and empty torch's cache; returns the bytes freed (or None when unknown)."""
    from oomdoctor.capture.notebook import release as _release

    return _release()


def load_ipython_extension(ipython: Any) -> None:
    """`%load_ext oomdoctor`: install capture in the kernel, with the %oomdoctor magic."""
    from oomdoctor.capture.notebook import load_ipython_extension as _load_extension

    _load_extension(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    from oomdoctor.capture.notebook import unload_ipython_extension as _unload_extension

    _unload_extension(ipython)


def load(source: Any, **options: Any) -> Any:
    """Read a snapshot file (path or bytes) of any supported format into an `oomdoctor.model.Snapshot`."""
    from oomdoctor.load import load as _load

    return _load(source, **options)
