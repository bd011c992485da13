"""What names and library frames may say about a block's kind, and what they may not.

- A name counts by its whole words: `hyperparam_sweep.py` names no parameter, `optimized_inference.py`
  no optimizer, `compute_embeddings` no weight.
- Weights read from a file straight to the GPU (safetensors, torch.load) are parameters, and so is
  FSDP's own parameter storage (flat, sharded or gathered), whatever phase they are made in.
- Blocks made before the first forward whose shapes repeat once per layer are a model's weights,
  not its inputs (which a smaller batch would shrink).
"""

from __future__ import annotations

import pytest

from oomdoctor.analysis import analyse
from oomdoctor.model import Frame
from tests.builders import ADAM_INIT_STACK, SETUP_STACK, GiB, MiB, Sim

TORCH = "/usr/lib/python3/site-packages/torch/"
FSDP = TORCH + "distributed/fsdp/"
BACKWARD_STACK = (
    Frame(TORCH + "autograd/graph.py", 825, "_engine_run_backward"),
    Frame(TORCH + "autograd/__init__.py", 347, "backward"),
    Frame("train.py", 42, "main"),
)


def _forward(script: str = "train.py"):
    return (
        Frame(TORCH + "nn/functional.py", 100, "linear"),
        Frame("model.py", 12, "forward"),
        Frame(TORCH + "nn/modules/module.py", 1751, "_wrapped_call_impl"),
        Frame(script, 40, "main"),
    )


def _components(analysis) -> dict[str, int]:
    return {c.name: c.bytes for c in analysis.components if c.bytes}


def _batch_between_steps(script: str, function: str = "main") -> dict[str, int]:
    """A step, then a 3 GiB block made by `function` of the script (its entry point: a batch moved
    to the GPU), and the next forward running out: the block is made between steps, where names
    are read."""
    sim = Sim(total_bytes=16 * GiB)
    setup = (SETUP_STACK[0], Frame(script, 20, "main"))
    for _ in range(8):
        sim.alloc(128 * MiB, setup)
    acts = [sim.alloc(512 * MiB, _forward(script)) for _ in range(8)]
    grads = [sim.alloc(128 * MiB, (*BACKWARD_STACK[:2], Frame(script, 42, "main"))) for _ in range(8)]
    for block in acts:
        sim.free(block)
    for block in grads:
        sim.free(block)
    entry = function in ("main", "<module>")
    sim.alloc(3 * GiB, (Frame(script, 38, function), *(() if entry else (Frame(script, 60, "main"),))))
    for _ in range(8):
        sim.alloc(512 * MiB, _forward(script))
    sim.oom(8 * GiB, _forward(script))
    return _components(analyse(sim.snapshot(metadata=False)))


@pytest.mark.parametrize("script", ["hyperparam_sweep.py", "train_embeddings.py", "optimized_inference.py"])
def test_a_word_inside_another_names_nothing(script):
    components = _batch_between_steps(script)
    plain = _batch_between_steps("train.py")
    assert components == plain
    assert components.get("parameters", 0) == 8 * 128 * MiB  # the weights alone
    assert "optimizer_state" not in components


def test_a_whole_word_still_counts():
    assert _batch_between_steps("sgd_runs.py", "refresh").get("optimizer_state", 0) >= 3 * GiB
    assert _batch_between_steps("NAdamWRuns.py", "refresh").get("optimizer_state", 0) >= 3 * GiB  # camelCase words


@pytest.mark.parametrize("script", ["train_adamw.py", "recsys_lion.py", "finetune_weights.py"])
def test_a_script_s_name_says_nothing_of_what_its_entry_point_allocates(script):
    """A script named for its optimizer or its weights runs the whole program from its entry point
    (`main`, the module's top level): the batch that entry point moves to the GPU is read as in any
    script, not as optimizer state or parameters by the file's name."""
    assert _batch_between_steps(script) == _batch_between_steps("train.py")
    assert _batch_between_steps(script, "<module>") == _batch_between_steps("train.py", "<module>")


def _loaded_then_forward(load_stack, *, layers: int = 0) -> dict[str, int]:
    """Weights put on the GPU before the first forward by `load_stack` (40 blocks of 256 MiB, or
    with `layers` a model of that many identical layers of three shapes), then an OOM in it."""
    sim = Sim(total_bytes=24 * GiB)
    if layers:
        for _ in range(layers):
            for size in (96 * MiB, 48 * MiB, 2 * MiB):
                sim.alloc(size, load_stack)
        sim.alloc(8 * MiB, load_stack)  # the batch: hidden states, a multiple of the model's width
    else:
        for _ in range(40):
            sim.alloc(256 * MiB, load_stack)
    for _ in range(12):
        sim.alloc(1 * GiB, _forward("serve.py"))
    sim.oom(8 * GiB, _forward("serve.py"))
    return _components(analyse(sim.snapshot(metadata=False)))


def test_weights_read_from_a_file_are_parameters():
    for reader in ("/usr/lib/python3/site-packages/safetensors/torch.py", TORCH + "serialization.py"):
        components = _loaded_then_forward((Frame(reader, 315, "load_file"), Frame("serve.py", 15, "main")))
        assert components.get("parameters") == 40 * 256 * MiB, reader
        assert "inputs" not in components


def test_a_layer_stack_made_before_the_first_forward_is_weights_not_inputs():
    components = _loaded_then_forward((Frame("serve.py", 15, "main"),), layers=24)
    assert components.get("parameters") == 24 * (96 + 48 + 2) * MiB
    assert components.get("inputs") == 8 * MiB  # the batch's one tensor is still an input


def test_fsdp_parameters_are_parameters_in_any_phase():
    flat = (
        Frame(FSDP + "_flat_param.py", 780, "flatten_tensors"),
        Frame(FSDP + "fully_sharded_data_parallel.py", 480, "__init__"),
        Frame("train.py", 30, "main"),
    )
    unshard = (
        Frame(FSDP + "_flat_param.py", 1400, "_alloc_padded_unsharded_flat_param"),
        Frame(FSDP + "_runtime_utils.py", 400, "_pre_forward"),
        Frame(FSDP + "fully_sharded_data_parallel.py", 850, "forward"),
        Frame(TORCH + "nn/modules/module.py", 1751, "_wrapped_call_impl"),
        Frame("train.py", 50, "main"),
    )
    gathered = (
        Frame(FSDP + "_fully_shard/_fsdp_collectives.py", 200, "foreach_all_gather"),
        Frame(FSDP + "_fully_shard/_fsdp_param_group.py", 300, "unshard"),
        Frame("model.py", 12, "forward"),
        Frame(TORCH + "nn/modules/module.py", 1751, "_wrapped_call_impl"),
        Frame("train.py", 50, "main"),
    )
    reduced = (Frame(FSDP + "_fully_shard/_fsdp_collectives.py", 400, "foreach_reduce"), *BACKWARD_STACK)
    sim = Sim(total_bytes=16 * GiB)
    for _ in range(4):
        sim.alloc(512 * MiB, flat)
    sim.alloc(1 * GiB, unshard)
    sim.alloc(1 * GiB, gathered)
    for _ in range(4):
        sim.alloc(1 * GiB, _forward())
    sim.alloc(256 * MiB, reduced)
    sim.alloc(256 * MiB, ADAM_INIT_STACK)
    sim.oom(8 * GiB, _forward())
    components = _components(analyse(sim.snapshot(metadata=False)))
    assert components.get("parameters") == 4 * 512 * MiB + 2 * GiB
    assert components.get("activations", 0) >= 4 * GiB


def test_a_kind_read_from_names_says_so():
    """A component placed by the words of the user's own names reports the method 'names' (a
    user's choice of words), not 'frames' (what torch's or a library's code shows)."""
    sim = Sim(total_bytes=16 * GiB)
    for _ in range(8):
        sim.alloc(128 * MiB, (Frame("my_optimizer.py", 20, "__init__"), Frame("train.py", 12, "main")))
    sim.alloc(1 * GiB, (Frame("/usr/lib/python3/site-packages/safetensors/torch.py", 315, "load_file"),))
    for _ in range(8):
        sim.alloc(1 * GiB, _forward())
    sim.oom(8 * GiB, _forward())
    analysis = analyse(sim.snapshot(metadata=False))
    methods = {c.name: c.method for c in analysis.components if c.bytes}
    assert methods["optimizer_state"] == "names"
    assert methods["parameters"] == "frames"


def test_torch_s_averaged_model_is_a_copy_of_the_weights_not_optimizer_state():
    """torch.optim.swa_utils.AveragedModel (an EMA of the model) deep-copies the parameters: it
    lives under torch/optim/ but holds no optimizer's state."""
    copy = (
        Frame(TORCH + "nn/parameter.py", 68, "__deepcopy__"),
        Frame("/usr/lib/python3.11/copy.py", 153, "deepcopy"),
        Frame(TORCH + "optim/swa_utils.py", 220, "__init__"),
        Frame("train.py", 25, "main"),
    )
    sim = Sim(total_bytes=16 * GiB)
    for _ in range(8):
        sim.alloc(256 * MiB, SETUP_STACK)
    for _ in range(8):
        sim.alloc(256 * MiB, copy)
    for _ in range(8):
        sim.alloc(1 * GiB, _forward())
    sim.oom(8 * GiB, _forward())
    components = _components(analyse(sim.snapshot(metadata=False)))
    assert "optimizer_state" not in components
    assert components.get("parameters") == 16 * 256 * MiB


def test_tensors_a_data_loader_reads_from_files_are_no_weights():
    """Cached latents read with torch.load inside a DataLoader's worker are a batch, not weights."""
    cached = (
        Frame(TORCH + "serialization.py", 1025, "load"),
        Frame("dataset.py", 30, "__getitem__"),
        Frame(TORCH + "utils/data/_utils/fetch.py", 52, "fetch"),
        Frame(TORCH + "utils/data/dataloader.py", 700, "__next__"),
        Frame("train.py", 36, "main"),
    )
    components = _loaded_then_forward(cached)
    assert "parameters" not in components


def _offloaded_forward(move_stack) -> dict[str, int]:
    """Inference with its layers offloaded to the CPU: 1 GiB of resident weights, then a forward
    whose hook moves one layer's 512 MiB of weights in (`move_stack`) beside 1.25 GiB of activations,
    the earlier layers' copies moved in and freed, and the OOM."""
    sim = Sim(total_bytes=16 * GiB)
    for _ in range(8):
        sim.alloc(128 * MiB, SETUP_STACK)
    for _ in range(3):  # earlier layers: their weights come in for their forward and go again
        sim.free(sim.alloc(512 * MiB, move_stack))
        sim.alloc(256 * MiB, _forward("serve.py"))
    sim.alloc(512 * MiB, move_stack)
    for _ in range(5):
        sim.alloc(256 * MiB, _forward("serve.py"))
    sim.oom(8 * GiB, _forward("serve.py"))
    return _components(analyse(sim.snapshot(metadata=False)))


HOOK_CALL = (
    Frame(TORCH + "nn/modules/module.py", 1790, "_call_impl"),
    Frame(TORCH + "nn/modules/module.py", 1751, "_wrapped_call_impl"),
    Frame("model.py", 30, "forward"),
    Frame(TORCH + "nn/modules/module.py", 1751, "_wrapped_call_impl"),
    Frame("serve.py", 40, "main"),
)


@pytest.mark.parametrize(
    "move",
    [
        (  # diffusers' enable_model_cpu_offload, accelerate's cpu_offload_with_hook: module.to(device)
            Frame(TORCH + "nn/modules/module.py", 1340, "convert"),
            Frame(TORCH + "nn/modules/module.py", 900, "_apply"),
            Frame(TORCH + "nn/modules/module.py", 1355, "to"),
            Frame("/usr/lib/python3/site-packages/accelerate/hooks.py", 700, "pre_forward"),
        ),
        (  # accelerate's AlignDevicesHook (device_map offloading)
            Frame("/usr/lib/python3/site-packages/accelerate/utils/modeling.py", 330, "set_module_tensor_to_device"),
            Frame("/usr/lib/python3/site-packages/accelerate/hooks.py", 360, "pre_forward"),
            Frame("/usr/lib/python3/site-packages/accelerate/hooks.py", 170, "new_forward"),
        ),
    ],
    ids=["module-to", "set-module-tensor"],
)
def test_weights_an_offload_hook_moves_in_for_a_forward_are_parameters(move):
    """The layer's weights an offload hook moved onto the device for its forward are its
    parameters while it runs, not activations (the phase, a forward, said activations: a third of
    a fifth of the live memory here, and a batch-sized 'activation spike' that a smaller batch would not shrink)."""
    components = _offloaded_forward((*move, *HOOK_CALL))
    assert components.get("parameters") == 1 * GiB + 512 * MiB
    assert components.get("activations") == 2 * GiB


def test_a_tensor_moved_inside_a_forward_by_user_code_stays_an_activation():
    """A tensor's own `.to()` inside a forward (a mask or a position table moved to the input's
    device) moves no module's tensors: an activation, as the phase says."""
    moved = (Frame(TORCH + "_tensor.py", 40, "to"), Frame("model.py", 20, "forward"), *HOOK_CALL[1:])
    components = _offloaded_forward(moved)
    assert components.get("parameters") == 1 * GiB
    assert components.get("activations") == 2 * GiB + 512 * MiB
