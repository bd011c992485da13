"""A Hugging Face `TrainerCallback`: capture in every process of the Trainer, and its loop.

    from oomdoctor.integrations.transformers import OomdoctorCallback
    trainer = Trainer(model=model, args=args, callbacks=[OomdoctorCallback()])

Capture is installed when the Trainer is built (`on_init_end`, in every process a launcher
started) and again, idempotently, at `on_train_begin`; `install()` options go to the constructor.
The dump's `framework` entry says whether the Trainer was training or evaluating (its evaluation and
prediction loops, from the first `on_prediction_step` until `on_evaluate` / `on_predict`; the
TrainerCallback API has no event before an evaluation's first batch) or had just saved a
checkpoint, with `state.global_step` and the epoch. Capture's own markers bracket the steps' phases.
"""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback

from oomdoctor.capture import framework


def _version() -> str | None:
    try:
        import transformers

        return str(transformers.__version__)
    except Exception:
        return None


def _set(state: Any, stage: str | None) -> None:
    epoch = getattr(state, "epoch", None)
    framework.set_stage(stage, getattr(state, "global_step", None), int(epoch) if epoch is not None else None)


class OomdoctorCallback(TrainerCallback):  # type: ignore[misc]
    def __init__(self, **install_options: Any) -> None:
        self.install_options = install_options

    def _install(self) -> None:
        from oomdoctor.capture import install

        install(**self.install_options)
        framework.set_framework("transformers", _version())

    def on_init_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._install()

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._install()
        _set(state, "training")

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        _set(state, "training")

    def on_prediction_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        _set(state, "evaluating")

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        _set(state, "training" if getattr(state, "is_training", False) else None)

    def on_predict(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        _set(state, None)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        _set(state, "saving_checkpoint")

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        _set(state, None)


__all__ = ["OomdoctorCallback"]
