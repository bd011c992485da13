"""oomdoctor: a post-mortem debugger for PyTorch CUDA out-of-memory failures.

`import oomdoctor` stays light (no torch, rich or textual): capture is imported only when
`install()`, `uninstall()` or `dump()` is called.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["install", "uninstall", "dump", "load", "__version__"]


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


def load(source: Any, **options: Any) -> Any:
    """Read a snapshot file (path or bytes) of any supported format into an `oomdoctor.model.Snapshot`."""
    from oomdoctor.load import load as _load

    return _load(source, **options)
