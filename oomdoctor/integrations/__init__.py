"""Framework callbacks that install capture and say where the framework's loop is.

* `oomdoctor.integrations.lightning.OomdoctorCallback`: a Lightning `Callback` (for
  `lightning.pytorch` and `pytorch_lightning`), `Trainer(callbacks=[OomdoctorCallback()])`.
* `oomdoctor.integrations.transformers.OomdoctorCallback`: a Hugging Face `TrainerCallback`,
  `Trainer(..., callbacks=[OomdoctorCallback()])`.

Each module imports its framework only when it is imported itself; `import oomdoctor` imports
neither. Capture's own markers already bracket the training step's phases (forward, backward,
optimizer step, zero_grad, including Lightning's `optimizer.step(closure)`); what the callbacks add
is what the framework knows and the markers cannot: the loop that ran (training, validation, the
sanity check, test, predict, the HF Trainer's evaluation), its global step and epoch, recorded in
the dump's `framework` entry.
"""
