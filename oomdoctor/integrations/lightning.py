"""A Lightning callback: capture in every process the Trainer runs, and the loop it was in.

    from oomdoctor.integrations.lightning import OomdoctorCallback
    trainer = Trainer(callbacks=[OomdoctorCallback()])

`setup()` runs in every process of the run (each DDP rank, and each `ddp_spawn` child, which
re-imports nothing of the parent's capture), so that is where capture is installed (`install()`
options go to the constructor). The Trainer accepts only instances of its own package's `Callback`:
the class derives from `lightning.pytorch.Callback` and/or `pytorch_lightning.Callback`, whichever
the process has imported (both when both are), else the one that is installed. Import this module
after Lightning to get the package your Trainer comes from when both are installed.

Capture's markers already bracket Lightning's training step correctly (its closure's forward,
zero_grad and backward are outside the optimizer phase). A validation, sanity-check, test or predict
batch's forward is recorded as a forward at the step training had reached; the callback records
which loop it was (the dump's `framework.stage`), with the global step and epoch.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from typing import Any

from oomdoctor.capture import framework

_PACKAGES = ("lightning.pytorch", "pytorch_lightning")


def _callback_bases() -> tuple[type, ...]:
    imported = [name for name in _PACKAGES if name in sys.modules]
    if not imported:
        for name in _PACKAGES:
            try:
                if importlib.util.find_spec(name) is not None:
                    imported = [name]
                    break
            except (ImportError, ValueError):  # `lightning` absent: find_spec of its child raises
                continue
    if not imported:
        raise ImportError(
            "oomdoctor.integrations.lightning needs Lightning (pip install lightning, or pytorch-lightning)"
        )
    return tuple(importlib.import_module(name).Callback for name in imported)


def _version() -> str | None:
    for name in ("lightning", "pytorch_lightning"):
        module = sys.modules.get(name)
        version = getattr(module, "__version__", None)
        if isinstance(version, str):
            return version
    return None


def _where(trainer: Any) -> tuple[Any, Any]:
    return getattr(trainer, "global_step", None), getattr(trainer, "current_epoch", None)


class _Hooks:
    """The hooks; mixed into the framework's Callback class below."""

    def __init__(self, **install_options: Any) -> None:
        super().__init__()
        self.install_options = install_options

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        from oomdoctor.capture import install

        install(**self.install_options)
        framework.set_framework("lightning", _version())

    def _stage(self, trainer: Any, stage: str | None) -> None:
        framework.set_stage(stage, *_where(trainer))

    def _after_evaluation(self, trainer: Any) -> None:
        self._stage(trainer, "training" if getattr(trainer, "training", False) else None)

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._stage(trainer, "training")

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self._stage(trainer, "training")

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._stage(trainer, None)

    def on_sanity_check_start(self, trainer: Any, pl_module: Any) -> None:
        self._stage(trainer, "sanity_checking")

    def on_sanity_check_end(self, trainer: Any, pl_module: Any) -> None:
        self._after_evaluation(trainer)

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        self._stage(trainer, "sanity_checking" if getattr(trainer, "sanity_checking", False) else "validating")

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if not getattr(trainer, "sanity_checking", False):
            self._after_evaluation(trainer)

    def on_test_start(self, trainer: Any, pl_module: Any) -> None:
        self._stage(trainer, "testing")

    def on_test_end(self, trainer: Any, pl_module: Any) -> None:
        self._stage(trainer, None)

    def on_predict_start(self, trainer: Any, pl_module: Any) -> None:
        self._stage(trainer, "predicting")

    def on_predict_end(self, trainer: Any, pl_module: Any) -> None:
        self._stage(trainer, None)


OomdoctorCallback: type = type("OomdoctorCallback", (_Hooks, *_callback_bases()), {"__module__": __name__})
OomdoctorCallback.__doc__ = __doc__

__all__ = ["OomdoctorCallback"]
