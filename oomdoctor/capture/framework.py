"""Where a training framework's loop is, as its callback tells capture (`oomdoctor.integrations`).

A dump's `framework` entry: the framework's name and version (set once by its callback) and the
stage its loop was in (training, validating, ...), with its global step and epoch, at the moment the
dump was written. Capture's own markers say which phase of a step ran; this says which loop of the
framework ran it (a validation batch's forward is a forward, at the step training had reached).
Plain assignments: a callback calls these from the training thread, the dump reads them.
"""

from __future__ import annotations

from typing import Any

from oomdoctor.metadata import FRAMEWORK_STAGES

_framework: dict[str, Any] | None = None


def set_framework(name: str, version: str | None) -> None:
    """Name the framework whose callback installed capture (its stage starts unknown)."""
    global _framework
    if _framework is None or _framework.get("name") != name:
        _framework = {"name": str(name), "version": version, "stage": None, "global_step": None, "epoch": None}


def set_stage(stage: str | None, global_step: Any = None, epoch: Any = None) -> None:
    """The framework's loop entered `stage` (one of metadata.FRAMEWORK_STAGES; None: between loops)."""
    framework = _framework
    if framework is None:
        return
    framework["stage"] = stage if stage in FRAMEWORK_STAGES else None
    framework["global_step"] = _count(global_step)
    framework["epoch"] = _count(epoch)


def facts() -> dict[str, Any] | None:
    """The dump's `framework` entry, or None when no framework callback is in use."""
    return dict(_framework) if _framework is not None else None


def reset() -> None:
    global _framework
    _framework = None


def _count(value: Any) -> int | None:
    try:
        number = int(value)
    except (TypeError, ValueError):
        return None
    return number if number >= 0 else None
