"""Attribution of memory the trace does not explain: blocks from before recording began, library
workspaces, large pre-allocations and user code between steps (issue 11, causes B and I)."""

from __future__ import annotations

from oomdoctor.analysis import analyse
from oomdoctor.analysis.attribution import CUBLAS_DEFAULT_WORKSPACE_BYTES, layer_stack_weights, model_state_copies
from oomdoctor.model import Frame
from tests.builders import (
    ADAM_INIT_STACK,
    FOREACH_STACK,
    FORWARD_STACK,
    SETUP_STACK,
    USER_STACK,
    MiB,
    Sim,
)

ACCUMULATE_GRAD_STACK = (
    Frame("", 0, "torch::autograd::AccumulateGrad::apply(std::vector<at::Tensor>&&)"),
    Frame("", 0, "torch::autograd::Engine::thread_main(std::shared_ptr<torch::autograd::GraphTask> const&)"),
)
KV_CACHE_STACK = (
    Frame("/srv/engine/cache_engine.py", 88, "_allocate_kv_cache"),
    Frame("/srv/engine/worker.py", 30, "init_engine"),
)
WORKSPACE_CPP_STACK = (
    Frame("", 0, "at::cuda::(anonymous namespace)::getNewWorkspace()"),
    Frame("", 0, "at::cuda::getCurrentCUDABlasHandle()"),
)
BATCH_STACK = (Frame("train.py", 30, "get_batch"),)


def _components(sim: Sim, **kwargs) -> dict[str, int]:
    return analyse(sim.snapshot(metadata=False), **kwargs).component_bytes()


def _forward(sim: Sim, nbytes: int = 8 * MiB) -> None:
    sim.free(sim.alloc(nbytes, FORWARD_STACK))


def test_a_pre_trace_block_is_placed_by_its_own_frames():
    sim = Sim()
    sim.alloc(64 * MiB, SETUP_STACK)
    sim.alloc(32 * MiB, ADAM_INIT_STACK)
    sim.alloc(16 * MiB, ACCUMULATE_GRAD_STACK)
    sim.alloc(40 * MiB, KV_CACHE_STACK)
    sim.start_recording()
    _forward(sim)
    components = _components(sim)
    assert components["parameters"] == 64 * MiB
    assert components["optimizer_state"] == 32 * MiB
    assert components["gradients"] == 16 * MiB
    assert components["preallocated"] == 40 * MiB
    assert components["unknown"] == 0


def test_a_pre_trace_copy_made_to_save_a_checkpoint_is_no_model_state():
    """A block from before the trace whose own stack gathers a state dict (as FSDP's optimizer
    state dict does: a function named for parameters inside one named for the state dict) is a
    save's copy, as it is when the trace made it: not a parameter by its names."""
    gather = (
        Frame("train.py", 104, "_gather_orig_param_state"),
        Frame("train.py", 110, "optim_state_dict"),
        Frame("train.py", 150, "main"),
    )
    sim = Sim()
    sim.alloc(64 * MiB, SETUP_STACK)
    sim.alloc(48 * MiB, gather)
    sim.start_recording()
    _forward(sim)
    components = _components(sim)
    assert components["other"] == 48 * MiB
    assert components["parameters"] == 64 * MiB


def test_a_pre_trace_batch_is_an_input_by_its_own_frames():
    """With no trace to say when it was made (a snapshot recorded with context="state"), a block
    whose stack makes a batch is an input, as the trace's between-steps rule places one."""
    sim = Sim()
    sim.alloc(64 * MiB, SETUP_STACK)
    sim.alloc(3 * MiB, BATCH_STACK)
    sim.start_recording()
    components = _components(sim)
    assert components["inputs"] == 3 * MiB
    assert components["parameters"] == 64 * MiB


def test_user_code_that_does_not_say_what_it_made_joins_no_copies_of_the_model_states():
    """Frame-less blocks are read as copies of one set of shapes; a block whose stack is user
    code that says nothing of what it makes is not frame-less: its shape matching a parameter's
    says nothing either, so it is unknown, and the copies are read without it."""
    sim = Sim()
    for _ in range(4):
        for size in (4, 4, 2, 1):
            sim.alloc(size * MiB)
    sim.alloc(2 * MiB, (Frame("bench.py", 110, "run_benchmark"),))
    sim.start_recording()
    components = _components(sim)
    assert components["unknown"] == 2 * MiB
    assert components["parameters"] == 11 * MiB
    assert components["gradients"] == 11 * MiB
    assert components["optimizer_state"] == 22 * MiB


def test_what_an_optimizer_s_update_function_made_is_a_temporary_but_sgd_s_momentum():
    """torch.optim's update functions make no state, but SGD's (its momentum buffers, at the first
    step): a block from before the trace made by `_multi_tensor_adam` and alive at the dump is the
    update's temporary (the dump was written inside the step), one made by `_init_group` state."""
    sgd_update = (
        Frame("/usr/lib/python3/site-packages/torch/optim/sgd.py", 400, "_multi_tensor_sgd"),
        Frame("/usr/lib/python3/site-packages/torch/optim/sgd.py", 120, "step"),
        Frame("train.py", 44, "train_step"),
    )
    sim = Sim()
    sim.alloc(64 * MiB, SETUP_STACK)
    sim.alloc(32 * MiB, ADAM_INIT_STACK)
    sim.alloc(16 * MiB, FOREACH_STACK)
    sim.alloc(8 * MiB, sgd_update)
    sim.start_recording()
    components = _components(sim)
    assert components["temporaries"] == 16 * MiB
    assert components["optimizer_state"] == 40 * MiB


def test_frameless_pre_trace_blocks_under_a_traced_forward_are_the_parameters():
    sim = Sim()
    for size in (4, 4, 4, 2, 2, 1):
        sim.alloc(size * MiB)
    sim.start_recording()
    _forward(sim)
    components = _components(sim)
    assert components["parameters"] == 17 * MiB
    assert components["gradients"] == 0


def test_two_copies_of_the_shapes_with_a_backward_traced_are_parameters_and_gradients():
    sim = Sim()
    for _ in range(2):  # parameters, then their gradients: every shape twice
        for size in (4, 4, 2, 1):
            sim.alloc(size * MiB)
    sim.start_recording()
    activation = sim.alloc(8 * MiB, FORWARD_STACK)
    sim.free(activation)
    sim.free(sim.alloc(2 * MiB, ()))  # an autograd thread's allocation: the backward
    components = _components(sim)
    assert components["parameters"] == 11 * MiB
    assert components["gradients"] == 11 * MiB
    assert components["optimizer_state"] == 0


def test_copies_are_not_read_where_the_trace_shows_no_backward():
    sim = Sim()
    for _ in range(2):
        for size in (4, 4, 2):
            sim.alloc(size * MiB)
    sim.start_recording()
    _forward(sim)  # a forward-only benchmark: nothing makes gradients
    components = _components(sim)
    assert components["parameters"] == 20 * MiB
    assert components["gradients"] == 0


def test_without_a_trace_four_copies_are_the_model_states_and_a_lone_block_is_unknown():
    sim = Sim()
    for _ in range(4):
        for size in (4, 4, 2, 1):
            sim.alloc(size * MiB)
    sim.start_recording()
    components = _components(sim)
    assert components["parameters"] == 11 * MiB
    assert components["gradients"] == 11 * MiB
    assert components["optimizer_state"] == 22 * MiB

    lone = Sim()
    lone.alloc(22 * MiB)
    lone.start_recording()
    components = _components(lone)
    assert components["unknown"] == 22 * MiB
    assert components["parameters"] == 0


def test_a_shape_that_is_no_copy_of_the_set_is_unknown_not_a_parameter():
    """Four copies of a parameter set, and beside them two blocks of a shape that occurs twice (a
    kept output, a workspace): the two are no copies of the set, and nothing says what they are."""
    sim = Sim()
    for _ in range(4):
        for size in (64, 64, 32, 16):
            sim.alloc(size * MiB)
    for _ in range(2):
        sim.alloc(3 * MiB)
    sim.start_recording()
    components = _components(sim)
    assert components["parameters"] == 176 * MiB
    assert components["gradients"] == 176 * MiB
    assert components["optimizer_state"] == 352 * MiB
    assert components["unknown"] == 6 * MiB


def test_model_state_copies_reads_the_largest_consistent_count():
    four = [(size, size) for size in (400, 400, 200, 100) for _ in range(4)]
    assert model_state_copies(four, 4) == 4
    assert model_state_copies(four, 2) == 2  # no more copies than kinds the trace allows
    one_big_single = [*[(400, 400)] * 4, (1000, 1000)]
    assert model_state_copies(one_big_single, 4) == 1
    assert model_state_copies([], 4) == 1


def _layered_model(layers: int, width: int = 1024) -> list[int]:
    """Requested bytes of one copy of a transformer's weights in fp32: per layer a fused qkv matrix,
    an output projection, two MLP matrices, their biases and two norms; an embedding and a final norm."""
    per_layer = [width * 3 * width, width * width, width * 4 * width, 4 * width * width]
    per_layer += [3 * width, width, 4 * width, width, width, width, width, width]
    return [4 * n for n in per_layer] * layers + [4 * 50000 * width, 4 * width, 4 * width]


def test_one_regular_model_is_no_pair_of_copies():
    """A transformer's counts may all be even (qkv, projections, an untied embedding and head),
    but for its norms: two a layer and one at the end, 2L + 1. Copies repeat every shape, so one
    model is one copy, however small its norms' bytes are."""
    width = 1024
    per_layer = [width * 3 * width, width * width, width * 4 * width, 4 * width * width, width, width]
    one = [4 * n for n in per_layer] * 12 + [4 * 50000 * width] * 2 + [4 * width]  # + embedding, head, final norm
    assert model_state_copies([(r, r) for r in one], 4) == 1
    assert model_state_copies([(r, r) for r in one * 2], 4) == 2
    assert model_state_copies([(r, r) for r in one * 4], 4) == 4


def test_one_copy_of_a_layered_model_without_a_trace_is_its_weights_and_the_rest_unknown():
    sizes = _layered_model(12)
    scratch = 32 * MiB + 4  # a buffer of no width of the model's
    weights = layer_stack_weights([(r, r) for r in [*sizes, scratch]])
    assert weights is not None
    assert set(sizes) <= weights  # the embedding too: a multiple of the model's width
    assert scratch not in weights

    sim = Sim()
    for requested in sizes:
        sim.alloc(requested)
    sim.alloc(scratch)
    sim.start_recording()
    components = _components(sim)
    assert components["parameters"] >= sum(sizes)
    assert components["unknown"] >= scratch
    assert components["parameters"] + components["unknown"] == sum(_components(sim).values())


def test_shapes_without_a_layer_structure_are_not_read_as_weights():
    assert layer_stack_weights([(r, r) for r in (10 * MiB, 10 * MiB, 3 * MiB, 7 * MiB, 5 * MiB)]) is None
    # counts with no common layer count (a diffusion model's irregular blocks)
    irregular = [*[(4 * MiB, 4 * MiB)] * 7, *[(2 * MiB, 2 * MiB)] * 5, *[(MiB, MiB)] * 11, (64 * MiB, 64 * MiB)]
    assert layer_stack_weights(irregular) is None
    # two or three layers cannot be told from copies of a small model's states
    assert layer_stack_weights([(r, r) for r in _layered_model(3)]) is None
    assert layer_stack_weights([]) is None


def _kept_outputs_beside_a_small_model() -> list[tuple[int, int]]:
    """Three copies of a small model's shapes (parameters and Adam's two moments) and, beside them,
    60 outputs of one shape a loop kept (a list of predictions): a count every copy count divides."""
    model = [8 * MiB, 8 * MiB, 2 * MiB, 8192, 8192, 4096] * 3
    return [(r, r) for r in [*model, *[3 * MiB] * 60]]


def test_one_shape_stacked_alone_is_no_copies_of_a_model_nor_its_layers():
    """A model's layers stack their shapes together (matrices with their biases and norms); one
    shape that holds most of the bytes stacked many times more often than any other is a loop's
    kept outputs, not model states or a layer stack, whatever counts divide its count."""
    sizes = _kept_outputs_beside_a_small_model()
    assert model_state_copies(sizes, 4) == 1
    assert layer_stack_weights(sizes) is None

    sim = Sim()
    for requested, _ in sizes:
        sim.alloc(requested)
    sim.start_recording()
    components = _components(sim)
    assert components["parameters"] == components["gradients"] == components["optimizer_state"] == 0
    assert components["unknown"] == sum(r for r, _ in sizes)


def test_a_layer_s_shapes_stacked_together_are_still_copies():
    """Against the rule above: the largest shape stacked as often as a layer's others (a norm a
    layer) is a layered model, in copies or alone."""
    one = _layered_model(12)
    assert model_state_copies([(r, r) for r in one * 4], 4) == 4
    assert layer_stack_weights([(r, r) for r in one]) is not None


def test_reading_layers_takes_work_in_proportion_to_the_blocks():
    """200,000 frame-less blocks of one shape beside 20,000 shapes of one block each: every layer
    count is read from the divisors of the counts, not tried against every shape (that would be
    4e9 steps: the run would end on its timeout)."""
    sizes = [(MiB, MiB)] * 200_000 + [(4096 + 512 * n, 4096 + 512 * n) for n in range(20_000)]
    assert layer_stack_weights(sizes) is None  # one repeated shape is no layer
    layered = [(r, r) for r in _layered_model(96)] + sizes[200_000:]
    assert layer_stack_weights(layered) is None  # the layers hold too little of the bytes


def test_what_the_trace_does_to_a_frameless_pre_trace_block_decides_it():
    sim = Sim()
    grad = sim.alloc(16 * MiB)
    sim.alloc(32 * MiB, SETUP_STACK)
    sim.start_recording()
    sim.marker("forward", "start")
    activation = sim.alloc(64 * MiB, FORWARD_STACK)  # the peak: the gradient is still live
    sim.free(activation)
    sim.marker("forward", "end")
    sim.marker("zero_grad", "start")
    sim.free(grad)  # zero_grad frees it later: it was a gradient
    sim.marker("zero_grad", "end")
    sim.marker("forward", "start")
    sim.alloc(4 * MiB, FORWARD_STACK)
    sim.marker("forward", "end")
    result = analyse(sim.snapshot(metadata=True, registry=False))
    assert result.replay.target_kind == "peak"
    components = result.component_bytes()
    assert components["gradients"] == 16 * MiB
    assert components["parameters"] == 32 * MiB


def test_cublas_workspaces_are_their_own_kind():
    sim = Sim()
    sim.alloc(CUBLAS_DEFAULT_WORKSPACE_BYTES)
    sim.start_recording()
    sim.alloc(32 * MiB, FORWARD_STACK + WORKSPACE_CPP_STACK)
    _forward(sim)
    components = _components(sim)
    assert components["workspace"] == CUBLAS_DEFAULT_WORKSPACE_BYTES + 32 * MiB


def test_between_steps_user_code_is_inputs_only_when_it_makes_a_batch():
    sim = Sim()
    sim.marker("forward", "start")
    sim.free(sim.alloc(8 * MiB, FORWARD_STACK))
    sim.marker("forward", "end")
    sim.marker("optimizer_step", "start")
    sim.marker("optimizer_step", "end")
    sim.alloc(6 * MiB, BATCH_STACK)
    sim.alloc(3 * MiB, USER_STACK)
    result = analyse(sim.snapshot(metadata=True, registry=False))
    components = result.component_bytes()
    assert components["inputs"] == 6 * MiB
    assert components["other"] == 3 * MiB


def test_the_series_places_pre_trace_memory_as_the_blocks_are():
    sim = Sim()
    sim.alloc(32 * MiB, ADAM_INIT_STACK)
    sim.alloc(22 * MiB)  # frame-less, under a traced forward: the parameters
    sim.start_recording()
    sim.free(sim.alloc(8 * MiB, FORWARD_STACK))
    result = analyse(sim.snapshot(metadata=False))
    assert result.replay.target_kind == "peak"
    names = [share.name for share in result.components]
    at_peak = next(p for p in result.replay.series if p.event_index == result.replay.target_index)
    in_series = dict(zip(names, at_peak.components))
    components = result.component_bytes()
    for name in ("optimizer_state", "parameters", "unknown"):
        assert in_series[name] == components[name], name
    assert components["optimizer_state"] == 32 * MiB and components["parameters"] == 22 * MiB


def test_a_notebook_cell_gives_way_to_the_model_library_frame_inside_it():
    from oomdoctor.analysis.attribution import source_line

    library = "/opt/conda/lib/python3.11/site-packages/diffusers/models/unet.py"
    stack = (
        Frame("/opt/conda/lib/python3.11/site-packages/torch/nn/functional.py", 10, "conv2d"),
        Frame(library, 321, "forward"),
        Frame("/opt/conda/lib/python3.11/site-packages/torch/nn/modules/module.py", 1751, "_call_impl"),
        Frame("/tmp/ipykernel_4242/1234567.py", 3, "<module>"),
    )
    assert source_line(stack) == f"{library}:321 in forward"
    assert source_line(stack[2:]) == "/tmp/ipykernel_4242/1234567.py:3 in <module>"  # nothing inside it
    script = (*stack[:3], Frame("/home/me/train.py", 40, "main"))
    assert source_line(script) == "/home/me/train.py:40 in main"  # a script's own line stays first


BACKWARD_STACK = (
    Frame("/usr/lib/python3/site-packages/torch/autograd/__init__.py", 266, "backward"),
    Frame("/usr/lib/python3/site-packages/torch/_tensor.py", 581, "backward"),
    Frame("train.py", 42, "train_step"),
)


def _three_copies_then_a_backward(accumulate: bool) -> dict[str, int]:
    """Three frame-less copies of one parameter set from before the trace, then a traced forward
    and a backward the OOM interrupts: with `accumulate`, the backward computes parameter-shaped
    gradients and frees each (added into a .grad already there); else it keeps none of that shape."""
    sim = Sim(total_bytes=8 << 30)
    shapes = (4 * MiB, 4 * MiB, 2 * MiB)
    for _ in range(3):
        for size in shapes:
            sim.alloc(size)
    sim.start_recording()
    sim.alloc(8 * MiB, FORWARD_STACK)
    for size in shapes[:2]:
        made = sim.alloc(size, BACKWARD_STACK) if accumulate else sim.alloc(3 * MiB, BACKWARD_STACK)
        sim.free(made)
    sim.oom(64 << 30, BACKWARD_STACK)
    return _components(sim)


def test_gradients_found_already_there_by_an_interrupted_backward_are_one_of_three_copies():
    """SGD with momentum and no zero_grad (or zero_grad(set_to_none=False)): parameters, the stale
    gradients and one momentum buffer, where without that evidence three copies read as Adam's
    parameters and two moments."""
    there = _three_copies_then_a_backward(accumulate=True)
    assert (there["parameters"], there["gradients"], there["optimizer_state"]) == (10 * MiB, 10 * MiB, 10 * MiB)
    adam = _three_copies_then_a_backward(accumulate=False)
    assert (adam["parameters"], adam["gradients"], adam["optimizer_state"]) == (10 * MiB, 0, 20 * MiB)


def test_gradients_of_parameters_a_user_constructor_made_are_gradients_in_the_backward():
    """Parameters made by the user's own module class (torch.empty in its __init__, no nn.Module
    frames): blocks of their shapes the backward makes are the gradients while the backward runs."""
    constructor = (Frame("modules/linear.py", 19, "__init__"), Frame("train.py", 20, "main"))
    sim = Sim()
    for size in (4, 4, 2):
        sim.alloc(size * MiB, constructor)
    activation = sim.alloc(16 * MiB, FORWARD_STACK)
    gradients = [sim.alloc(size * MiB, ()) for size in (4, 4, 2)]  # the backward: no Python frames
    scratch = sim.alloc(6 * MiB, ())  # the peak: a temporary of the backward
    sim.free(scratch)
    sim.free(activation)
    del gradients
    components = analyse(sim.snapshot(metadata=False, registry=False)).component_bytes()
    assert components["parameters"] == 10 * MiB
    assert components["gradients"] == 10 * MiB
    assert components["temporaries"] == 6 * MiB


def test_parameters_an_optimizer_replaces_out_of_place_stay_parameters():
    """`p.data = p.data - lr * update` in an optimizer's step: the new block takes the place of the
    parameter the step frees, step after step; the moments it keeps are its state."""
    constructor = (Frame("modules/linear.py", 19, "__init__"), Frame("train.py", 20, "main"))
    sim = Sim()
    parameters = [sim.alloc(size * MiB, constructor) for size in (4, 2)]
    moments = [sim.alloc(size * MiB, ADAM_INIT_STACK) for size in (4, 4, 2, 2)]
    for _ in range(2):
        activation = sim.alloc(16 * MiB, FORWARD_STACK)
        gradients = [sim.alloc(size * MiB, ()) for size in (4, 2)]
        sim.free(activation)
        replaced = []
        for parameter, size in zip(parameters, (4, 2)):
            update = sim.alloc(size * MiB, FOREACH_STACK)  # a temporary of the step
            replaced.append(sim.alloc(size * MiB, FOREACH_STACK))
            sim.free(update)
            sim.free(parameter)
        parameters = replaced
        for gradient in gradients:
            sim.free(gradient)
    del moments
    snapshot = sim.snapshot(metadata=False, registry=False)
    at_end = analyse(snapshot, at_event=len(snapshot.trace_of(0)) - 1).component_bytes()
    assert at_end["parameters"] == 6 * MiB
    assert at_end["optimizer_state"] == 12 * MiB


def test_weights_and_moments_an_optimizer_replaces_after_a_trace_began_are_parameters_and_state():
    """A user-written Adam that makes its moments and its weights anew each step (`m = b1 * m + ...`,
    `p.data = p.data - lr * update`), in a trace begun after the model and its moments were made (a
    wrapped ring buffer): the step frees three pre-trace copies of each shape, a weight and two
    moments, and their replacements live on. One copy is the parameters, as in the whole trace;
    all three were optimizer state."""
    constructor = (Frame("layers.py", 19, "__init__"), Frame("train.py", 20, "main"))
    sizes = (4, 2)
    sim = Sim()
    weights = [sim.alloc(size * MiB, constructor) for size in sizes]
    firsts = [sim.alloc(size * MiB, constructor) for size in sizes]
    seconds = [sim.alloc(size * MiB, constructor) for size in sizes]
    sim.start_recording()
    for _ in range(2):
        sim.marker("forward", "start")
        sim.free(sim.alloc(16 * MiB, FORWARD_STACK))
        sim.marker("forward", "end")
        sim.marker("backward", "start")
        gradients = [sim.alloc(size * MiB, ()) for size in sizes]
        sim.marker("backward", "end")
        sim.marker("optimizer_step", "start")
        for copies, line in ((firsts, 51), (seconds, 56), (weights, 64)):
            for index, size in enumerate(sizes):
                made = sim.alloc(size * MiB, (Frame("train.py", line, "step"),))
                sim.free(copies[index])
                copies[index] = made
        sim.marker("optimizer_step", "end")
        sim.marker("zero_grad", "start")
        for gradient in gradients:
            sim.free(gradient)
        sim.marker("zero_grad", "end")
    snapshot = sim.snapshot(metadata=True, registry=False)
    first_step = analyse(snapshot, at_event=2).component_bytes()  # the first forward: all pre-trace
    assert first_step["parameters"] == 6 * MiB
    assert first_step["optimizer_state"] == 12 * MiB
    at_end = analyse(snapshot, at_event=len(snapshot.trace_of(0)) - 1).component_bytes()
    assert at_end["parameters"] == 6 * MiB
    assert at_end["optimizer_state"] == 12 * MiB


DDP_INIT_STACK = (
    Frame("/usr/lib/python3/site-packages/torch/nn/parallel/distributed.py", 1437, "_ddp_init_helper"),
    Frame("/usr/lib/python3/site-packages/torch/nn/parallel/distributed.py", 1011, "__init__"),
    Frame("train.py", 24, "main"),
)
DDP_REBUILD_STACK = (  # the buckets rebuilt in the second iteration's forward
    Frame("/usr/lib/python3/site-packages/torch/nn/parallel/distributed.py", 1775, "_pre_forward"),
    Frame("/usr/lib/python3/site-packages/torch/nn/parallel/distributed.py", 1880, "_pre_forward"),
    Frame("/usr/lib/python3/site-packages/torch/nn/parallel/distributed.py", 1890, "forward"),
    Frame("/usr/lib/python3/site-packages/torch/nn/modules/module.py", 1775, "_wrapped_call_impl"),
    Frame("train.py", 40, "train_step"),
)
DDP_INPUT_STACK = (  # DDP moving the inputs to the device in the same function: not a bucket
    Frame("/usr/lib/python3/site-packages/torch/distributed/utils.py", 140, "_recursive_to"),
    Frame("/usr/lib/python3/site-packages/torch/nn/parallel/distributed.py", 1789, "_pre_forward"),
    Frame("/usr/lib/python3/site-packages/torch/nn/parallel/distributed.py", 1890, "forward"),
    Frame("/usr/lib/python3/site-packages/torch/nn/modules/module.py", 1775, "_wrapped_call_impl"),
    Frame("train.py", 40, "train_step"),
)


def test_ddp_gradient_buckets_are_gradients_by_the_frames_of_ddp_s_reducer():
    # Without gradient_as_bucket_view the buckets are allocations of DDP's C++ reducer that no
    # registry reaches: its construction and the rebuild in a forward make them.
    sim = Sim()
    sim.alloc(64 * MiB, SETUP_STACK)
    sim.alloc(24 * MiB, DDP_INIT_STACK)  # from before the trace
    sim.start_recording()
    sim.marker("forward", "start")
    sim.alloc(40 * MiB, DDP_REBUILD_STACK)
    sim.alloc(8 * MiB, DDP_INPUT_STACK)
    sim.marker("forward", "end")
    blocks = {b.requested_bytes: b for b in analyse(sim.snapshot(registry=False)).live_blocks}
    assert (blocks[24 * MiB].component, blocks[24 * MiB].method) == ("gradients", "frames")
    assert (blocks[40 * MiB].component, blocks[40 * MiB].method) == ("gradients", "frames")
    assert blocks[8 * MiB].component == "activations"
    # and where a registry names the model's tensors (gradient_as_bucket_view off), the same
    sim.alloc(4 * MiB, SETUP_STACK, "parameter", "fc.weight")
    blocks = {b.requested_bytes: b for b in analyse(sim.snapshot()).live_blocks}
    assert blocks[4 * MiB].method == "registry"
    assert (blocks[24 * MiB].component, blocks[24 * MiB].method) == ("gradients", "frames")
    assert (blocks[40 * MiB].component, blocks[40 * MiB].method) == ("gradients", "frames")
    assert blocks[8 * MiB].component == "activations"


def test_a_flat_buffer_named_by_the_registry_is_one_group_of_its_component():
    sim = Sim()
    sim.marker("backward", "start")
    bucket = "DDP gradient bucket (12 gradients: model.fc1.weight.grad … model.fc3.bias.grad)"
    sim.alloc(48 * MiB, (), "gradient", bucket)
    sim.alloc(8 * MiB, (), "gradient", "model.fc4.weight.grad")
    sim.marker("backward", "end")
    analysis = analyse(sim.snapshot())
    gradients = next(share for share in analysis.components if share.name == "gradients")
    groups = {group.key: group.bytes for group in gradients.by_module}
    assert groups == {bucket: 48 * MiB, "model.fc4": 8 * MiB}


def test_a_second_copy_of_the_weights_is_no_optimizer_state_where_the_trace_makes_the_state():
    """Recording begun after setup: the parameters and an EMA copy of them (two copies of every
    shape) predate the trace; its first optimizer step makes Adam's two moments (`_init_group`),
    so no state was there before it: the second copy is not optimizer state (it was, adding 50%
    to the state the step made)."""
    sim = Sim()
    shapes = (4, 4, 2, 1)
    for _ in range(2):
        for size in shapes:
            sim.alloc(size * MiB)
    sim.start_recording()
    _forward(sim)
    for size in shapes:
        sim.alloc(size * MiB, BACKWARD_STACK)
    for size in shapes:
        for _ in range(2):
            sim.alloc(size * MiB, ADAM_INIT_STACK)
    sim.oom(4 * MiB, FOREACH_STACK)
    components = _components(sim)
    assert components["optimizer_state"] == 22 * MiB  # the two moments the step made
    assert components["gradients"] == 11 * MiB
    assert components["parameters"] + components["other"] + components["unknown"] == 22 * MiB


def test_a_forward_inside_a_training_step_reads_the_copies_though_the_trace_ends_before_its_backward():
    """Recording begun after an AdamW step (parameters and two moments, three copies of every
    shape, predate it) and the OOM in the next forward, which runs inside Lightning's
    training_step: the run trains, so the copies are parameters and moments, not three sets of
    parameters (the phases alone, a forward, showed no training)."""
    sim = Sim()
    for _ in range(3):
        for size in (4, 4, 2, 1):
            sim.alloc(size * MiB)
    sim.start_recording()
    lightning_forward = (*FORWARD_STACK[:-1], Frame("model.py", 50, "training_step"), FORWARD_STACK[-1])
    sim.alloc(8 * MiB, lightning_forward)
    sim.oom(8 * MiB, lightning_forward)
    components = _components(sim)
    assert components["parameters"] == 11 * MiB
    assert components["optimizer_state"] == 22 * MiB

    plain = Sim()  # the same without the training step's frame: nothing shows a training run
    for _ in range(3):
        for size in (4, 4, 2, 1):
            plain.alloc(size * MiB)
    plain.start_recording()
    plain.alloc(8 * MiB, FORWARD_STACK)
    plain.oom(8 * MiB, FORWARD_STACK)
    assert _components(plain)["parameters"] == 33 * MiB


def test_fused_adams_step_counts_break_no_copies():
    """A fused (or capturable) Adam keeps a one-element step count per parameter on the device:
    seven parameters, seven scalars. Seven is no multiple of three, but scalars are no layer's:
    the three copies of the weights are still read (the counts made them one copy before)."""
    one = [8 * MiB, 4 * MiB, 4 * MiB, 4 * MiB, 4 * MiB, 2 * MiB, MiB]
    sizes = [(r, r) for r in one * 3] + [(4, 512)] * len(one)
    assert model_state_copies(sizes, 4) == 3
    norms = [(r, r) for r in one * 3] + [(4096, 4096)] * 7  # a norm's weight, seven times: a layer's
    assert model_state_copies(norms, 4) == 1


def test_between_steps_user_code_that_lives_into_the_next_forward_is_its_batch():
    """A loop that makes its batch in a function not named for one (a GNN's `graph()`, images made in
    `main()`) just before the step's forward, which then runs out: the batch lives into the forward,
    as the first step's does (`_spans_next_forward`), so it is inputs, not other. The step's
    optimizer step may open before the forward (optimizer.step(closure)): it is passed over."""
    for closure in (False, True):
        sim = Sim()
        sim.marker("forward", "start")
        sim.free(sim.alloc(8 * MiB, FORWARD_STACK))
        sim.marker("forward", "end")
        sim.marker("optimizer_step", "start")
        sim.marker("optimizer_step", "end")
        sim.alloc(6 * MiB, USER_STACK)  # the next step's batch
        if closure:  # the step's opening before its closure's forward, a span of the same step
            sim.marker("optimizer_step", "start")
            sim.free(sim.alloc(512, USER_STACK))  # an event inside it, so the trace shows the phase
            sim.marker("optimizer_step", "end")
            sim.step -= 1  # as annotations show it: the step it opens has not ended
        sim.marker("forward", "start")
        sim.alloc(16 * MiB, FORWARD_STACK)
        sim.oom(64 * MiB, FORWARD_STACK)
        result = analyse(sim.snapshot(metadata=True, registry=False))
        components = result.component_bytes()
        assert components["inputs"] == 6 * MiB and components["other"] == 0, (closure, components)


def test_frameless_copies_of_weights_their_frames_found_are_not_parameters_again():
    """A ring buffer that wrapped inside the first optimizer step (a small max_entries): the
    parameters keep the frames that built them, the gradients none (the autograd engine's
    thread makes them without Python frames), Adam's moments their _init_group frames. The
    frame-less copy is the gradients; it was read as a second set of parameters, and the
    verdict projected gradients and state over twice the weights (model-states-too-large)."""
    sim = Sim()
    shapes = (4, 4, 2, 1)
    for size in shapes:
        sim.alloc(size * MiB, SETUP_STACK)
    for size in shapes:
        sim.alloc(size * MiB)  # gradients: no Python frames
    for size in shapes:
        for _ in range(2):
            sim.alloc(size * MiB, ADAM_INIT_STACK)
    sim.start_recording()
    sim.alloc(4 * MiB, FOREACH_STACK)
    sim.oom(4 * MiB, FOREACH_STACK)
    components = _components(sim)
    assert components["parameters"] == 11 * MiB
    assert components["gradients"] == 11 * MiB
    assert components["optimizer_state"] == 22 * MiB

    other = Sim()  # a frame-less block of no weight's shape beside them is not a gradient
    for size in shapes:
        other.alloc(size * MiB, SETUP_STACK)
    for size in shapes:
        other.alloc(size * MiB)
    other.alloc(7 * MiB)
    other.start_recording()
    other.alloc(4 * MiB, FOREACH_STACK)
    other.oom(4 * MiB, FOREACH_STACK)
    components = _components(other)
    assert components["parameters"] == 11 * MiB
    assert components["unknown"] >= 7 * MiB


def test_the_copies_of_the_parameters_that_train_are_read_apart_from_the_frozen_ones():
    """Recording begun after a fine-tune's first step: a frozen base (its layers' shapes once) and
    the trained last layers (their parameters and Adam's two moments, three copies) predate the
    trace. The whole set is no k copies of one set of shapes, so every block was read as a
    parameter (the moments among them, and steps before the trace went unnoticed). The traced
    backward made gradients of the trained shapes only: their blocks are three copies of their own."""
    sim = Sim()
    base, head = (16, 8, 4, 2), (3, 1)
    for size in base:
        sim.alloc(size * MiB)
    for _ in range(3):
        for size in head:
            sim.alloc(size * MiB)
    sim.start_recording()
    activation = sim.alloc(8 * MiB, FORWARD_STACK)
    sim.free(activation)
    gradients = [sim.alloc(size * MiB, BACKWARD_STACK) for size in head]
    sim.free(sim.alloc(3 * MiB, FOREACH_STACK))
    for block in gradients:
        sim.free(block)
    sim.alloc(8 * MiB, FORWARD_STACK)
    sim.oom(64 * MiB, FORWARD_STACK)
    components = _components(sim)
    assert components["parameters"] == 34 * MiB
    assert components["optimizer_state"] == 8 * MiB

    whole = Sim()  # every shape trains: the copies are read over the whole set, as before
    for _ in range(3):
        for size in (*base, *head):
            whole.alloc(size * MiB)
    whole.start_recording()
    whole.free(whole.alloc(8 * MiB, FORWARD_STACK))
    gradients = [whole.alloc(size * MiB, BACKWARD_STACK) for size in (*base, *head)]
    whole.free(whole.alloc(16 * MiB, FOREACH_STACK))
    for block in gradients:
        whole.free(block)
    whole.alloc(8 * MiB, FORWARD_STACK)
    whole.oom(64 * MiB, FORWARD_STACK)
    components = _components(whole)
    assert components["parameters"] == 34 * MiB
    assert components["optimizer_state"] == 68 * MiB


def test_without_a_trace_a_foreach_update_s_blocks_beside_init_made_state_are_temporaries():
    """A snapshot without history (enabled="state") taken inside Adam's first step: the moments
    carry _init_group's frames, the foreach update's temporaries _multi_tensor_adam's. Both were
    optimizer state by their optimizer frames (state 134 MiB for 100 MiB in the MLP run); the
    update's blocks beside the state its init made are the step's temporaries. An optimizer
    whose update makes its state (SGD's momentum, no init-made state beside it) keeps it."""
    sgd_update = (
        Frame("/usr/lib/python3/site-packages/torch/optim/sgd.py", 454, "_multi_tensor_sgd"),
        Frame("/usr/lib/python3/site-packages/torch/optim/sgd.py", 130, "step"),
        Frame("train.py", 44, "train_step"),
    )
    sim = Sim()
    for size in (4, 4, 2):
        sim.alloc(size * MiB, SETUP_STACK)
        sim.alloc(size * MiB, ADAM_INIT_STACK)
        sim.alloc(size * MiB, ADAM_INIT_STACK)
    sim.alloc(4 * MiB, FOREACH_STACK)
    sim.alloc(2 * MiB, FOREACH_STACK)
    sim.start_recording()
    components = _components(sim)
    assert components["optimizer_state"] == 20 * MiB
    assert components["temporaries"] == 6 * MiB

    sgd = Sim()
    for size in (4, 4, 2):
        sgd.alloc(size * MiB, SETUP_STACK)
        sgd.alloc(size * MiB, sgd_update)
    sgd.start_recording()
    assert _components(sgd)["optimizer_state"] == 10 * MiB


def test_part_of_the_gradients_before_a_wrapped_trace_is_counted_against_the_weights_own_shapes():
    """A ring buffer that wrapped inside the backward of an MLP with three hidden layers of one
    shape: two of their gradients predate the trace, frame-less, the third and the rest are in
    it. Two frame-less blocks of one shape read as two copies of the set (a gradient and a
    momentum buffer: 16 MiB of 'optimizer state' in a first SGD step that made none); against the
    parameters' own count of that shape (three) they are part of one copy, the gradients."""
    sim = Sim()
    for size in (16, 16, 16, 2):
        sim.alloc(size * MiB, SETUP_STACK)
    for _ in range(2):
        sim.alloc(16 * MiB)  # the engine's gradients, before the trace
    sim.start_recording()
    sim.alloc(16 * MiB)
    sim.alloc(2 * MiB)
    sim.alloc(16 * MiB, FOREACH_STACK)
    sim.oom(16 * MiB, FOREACH_STACK)
    components = _components(sim)
    assert components["parameters"] == 50 * MiB
    assert components["gradients"] == 50 * MiB
    assert components["optimizer_state"] == 0


def test_a_loss_s_gradient_seed_finds_no_gradients_of_the_weights():
    """No trace (a dump inside the second backward of plain SGD without zero_grad): the weights
    carry their frames, their gradients none, and the loss's 4-byte gradient seed carries
    backward's _make_grads frames, a gradient by them. That seed counted as the gradients found,
    so the frame-less copy of the weights was read as optimizer state (50 MiB of it for an
    optimizer without state); a kind is found for the shapes its blocks have."""
    seed = (
        Frame("/usr/lib/python3/site-packages/torch/autograd/__init__.py", 233, "_make_grads"),
        *BACKWARD_STACK[1:],
    )
    sim = Sim()
    for size in (16, 16, 2):
        sim.alloc(size * MiB, SETUP_STACK)
    for size in (16, 16, 2):
        sim.alloc(size * MiB)
    sim.alloc(4, seed)
    sim.start_recording()
    components = _components(sim)
    assert components["gradients"] == 34 * MiB + 512
    assert components["optimizer_state"] == 0


def _adam_states_with_strays(strays: bool) -> dict[str, int]:
    """An MLP's parameters and Adam's two moments from before the trace (three frame-less copies of
    its shapes), with, when `strays`, a validation step's leftovers beside them (two 512 KiB
    batches, two 4 KiB blocks of a bias's size); then a traced forward and backward whose gradients
    (one of each weight) outlive it, and the next forward's OOM."""
    sim = Sim(total_bytes=8 << 30)
    shapes = (4 * MiB, 4 * MiB, MiB, 40960, 4096, 4096, 4096, 40)
    for _ in range(3):
        for size in shapes:
            sim.alloc(size)
    if strays:
        for size in (512 * 1024, 512 * 1024, 4096, 4096):
            sim.alloc(size)
    sim.start_recording()
    _forward(sim)
    for size in shapes:
        sim.alloc(size, BACKWARD_STACK)
    _forward(sim)
    sim.oom(64 << 30, FORWARD_STACK)
    return _components(sim)


def test_stray_blocks_beside_the_model_states_break_no_copies_the_gradients_count():
    """Recording begun after a Lightning run's first step and validation: a few stray frame-less
    blocks (1 MiB of batches, 8 KiB of a bias's size) broke the shapes' 3-copy pattern (beyond its
    1% tolerance, and the bias shape's 11 blocks read as one model's layers), so Adam's 18.1 MiB of
    moments were parameters. The traced backward's gradients count one copy of each shape: each
    shape with 3 times as many frame-less blocks is the parameters and two moments; the blocks past
    the copies (and shapes without gradients) are unknown."""
    weights = 2 * 4 * MiB + MiB + 40960 + 3 * 4096 + 512
    clean = _adam_states_with_strays(strays=False)
    assert clean["parameters"] == weights and clean["optimizer_state"] == 2 * weights
    components = _adam_states_with_strays(strays=True)
    assert components["parameters"] == weights, components
    assert components["optimizer_state"] == 2 * weights, components
    assert components["unknown"] == MiB + 2 * 4096, components


def test_a_half_precision_model_beside_its_masters_and_their_moments_is_read_shape_by_shape():
    """Mixed precision by hand recorded from its second step: a bf16 model (1, 2, 2, 2 MiB and
    small biases), its fp32 masters (2, 4, 4, 4 MiB ...) and AdamW's two moments of the masters,
    all frame-less before the trace; the traced backward makes a gradient of every bf16 and every
    master weight. No k copies of one set (the bf16 weights have no state; a 2 MiB shape is both a
    bf16 weight and a master), so all 49 MiB read as parameters. Counted against the gradients,
    each shape holds its weights once and, for b of them, two moments more: parameters 21 MiB,
    state 28 MiB, the truth."""
    sim = Sim(total_bytes=8 << 30)
    bf16 = (MiB, 2048, 2 * MiB, 2048, 2 * MiB, 2048, 2 * MiB, 2048, 20480, 20)
    masters = tuple(2 * size for size in bf16)
    for size in bf16 + masters + masters + masters:
        sim.alloc(size)
    sim.start_recording()
    _forward(sim)
    for size in bf16 + masters:
        sim.alloc(size, BACKWARD_STACK)
    _forward(sim)
    sim.oom(64 << 30, FORWARD_STACK)
    components = _components(sim)
    rounded = sum(max(512, -(-size // 512) * 512) for size in bf16 + masters)
    state = sum(max(512, -(-size // 512) * 512) for size in masters) * 2
    assert components["parameters"] == rounded, components
    assert components["optimizer_state"] == state, components


def test_a_copy_of_the_weights_beyond_the_model_states_the_optimizer_keeps_is_parameters():
    """Recording begun after setup, gradients kept across steps (`zero_grad(set_to_none=False)`)
    and an EMA of the weights: five copies of every shape predate the trace (the parameters, their
    gradients, AdamW's two moments, the EMA). The trace's optimizer step runs in torch/optim/adam.py,
    so two moments a parameter: the fifth copy is the parameters' (an EMA or masters), not more
    state; it was all read as parameters (five copies are more than the four model states)."""
    sim = Sim()
    shapes = (4, 4, 2, 1)
    for _ in range(5):
        for size in shapes:
            sim.alloc(size * MiB)
    sim.start_recording()
    _forward(sim)
    for size in shapes:  # added into the gradients that are there: made and freed inside the backward
        sim.free(sim.alloc(size * MiB, BACKWARD_STACK))
    sim.free(sim.alloc(4 * MiB, FOREACH_STACK))
    _forward(sim)
    components = _components(sim)
    assert components["parameters"] == 22 * MiB  # the model's and its copy: which is which, nothing says
    assert components["gradients"] == 11 * MiB
    assert components["optimizer_state"] == 22 * MiB


def test_without_the_optimizer_s_kind_no_copy_beyond_the_model_states_is_read():
    """The same five copies with no optimizer step in the trace: its moments are not known, so
    five copies are not read as the model states and a copy (Adam's two moments are only assumed)."""
    sim = Sim()
    shapes = (4, 4, 2, 1)
    for _ in range(5):
        for size in shapes:
            sim.alloc(size * MiB)
    sim.start_recording()
    _forward(sim)
    components = _components(sim)
    assert components["gradients"] == components["optimizer_state"] == 0


def test_very_large_blocks_beside_a_model_in_a_run_that_does_not_train_are_no_parameters():
    """An inference engine that allocated its KV cache up front, one very large block a layer,
    before recording began (as vLLM's cache engine does): the trace runs forwards only, so the
    frame-less blocks hold one copy of the weights at most; each cache block outweighs all the other
    frame-less blocks together, which no frame says is a weight. It was read as parameters (every
    frame-less byte of a run that only runs forwards was); now it is unknown (a pool, or the
    model's own huge weight: nothing says which), and the model's shapes are still its weights."""
    sim = Sim()
    model = (4, 4, 2, 1) * 4
    for size in model:
        sim.alloc(size * MiB)
    for _ in range(4):
        sim.alloc(64 * MiB)
    sim.start_recording()
    _forward(sim)
    _forward(sim)
    components = _components(sim)
    assert components["parameters"] == 44 * MiB
    assert components["unknown"] == 256 * MiB


def test_very_large_blocks_are_read_as_before_where_no_traced_backward_made_gradients():
    """The same blocks where the trace trains but its backward made no gradient of the weights'
    shapes (it added into gradients that were there): nothing says the large blocks do not train,
    so the copies are read as they were."""
    sim = Sim()
    model = (4, 4, 2, 1) * 4
    for size in model:
        sim.alloc(size * MiB)
    for _ in range(4):
        sim.alloc(64 * MiB)
    sim.start_recording()
    _forward(sim)
    sim.free(sim.alloc(4 * MiB, BACKWARD_STACK))
    components = _components(sim)
    assert components["unknown"] < 256 * MiB


def test_moments_quantised_to_a_byte_beside_the_parameters_are_optimizer_state():
    """Recording begun after an 8-bit Adam's first step (bitsandbytes keeps each moment in one byte
    an element): beside each fp32 parameter two blocks of a quarter its bytes predate the trace, no
    copy of any shape. They were read as parameters with the weights (every frame-less byte, where
    no copies are found); the shapes say what they are: optimizer state."""
    sim = Sim()
    shapes = (4 * MiB, 4 * MiB, 2 * MiB, MiB)
    for size in shapes:
        sim.alloc(size)
        for _ in range(2):
            sim.alloc(size // 4)
    sim.start_recording()
    _forward(sim)
    for size in shapes:  # the gradients, made by the backward (set to None before it)
        sim.alloc(size, BACKWARD_STACK)
    sim.free(sim.alloc(4 * MiB, EIGHT_BIT_STEP_STACK))
    components = _components(sim)
    assert components["optimizer_state"] == 11 * MiB // 2
    assert components["parameters"] == 11 * MiB


# an optimizer step of no torch optimizer's own (bitsandbytes' 8-bit Adam, run through torch's wrapper)
EIGHT_BIT_STEP_STACK = (
    Frame("/usr/lib/python3/site-packages/bitsandbytes/functional.py", 1210, "optimizer_update_8bit_blockwise"),
    Frame("/usr/lib/python3/site-packages/bitsandbytes/optim/optimizer.py", 310, "step"),
    Frame("/usr/lib/python3/site-packages/torch/optim/optimizer.py", 485, "wrapper"),
    Frame("train.py", 44, "train_step"),
)


def test_blocks_of_a_quarter_of_the_weights_bytes_beside_torch_s_own_optimizer_are_no_moments():
    """The run of the test above stepped by torch's own Adam: its moments keep their parameters'
    dtype, so blocks of a quarter of a weight's bytes are no moments of it (a ViT's or BERT's q, k,
    v and output projections stand so beside its 4x MLP matrices): not optimizer state."""
    sim = Sim()
    shapes = (4 * MiB, 4 * MiB, 2 * MiB, MiB)
    for size in shapes:
        sim.alloc(size)
        for _ in range(2):
            sim.alloc(size // 4)
    sim.start_recording()
    _forward(sim)
    for size in shapes:
        sim.alloc(size, BACKWARD_STACK)
    sim.free(sim.alloc(4 * MiB, FOREACH_STACK))
    components = _components(sim)
    assert components["optimizer_state"] == 0


def test_one_copy_of_a_transformer_s_weights_is_no_quantised_moments():
    """Against the rule above: a transformer's shapes hold blocks of a quarter of others' bytes (its
    output projection beside its MLP matrices), not two a parameter of them."""
    sim = Sim()
    for requested in _layered_model(12):
        sim.alloc(requested)
    sim.start_recording()
    _forward(sim)
    sim.free(sim.alloc(4 * MiB, BACKWARD_STACK))
    sim.free(sim.alloc(4 * MiB, FOREACH_STACK))
    components = _components(sim)
    assert components["optimizer_state"] == 0


def test_very_large_blocks_a_completed_backward_made_no_gradients_of_are_no_model_states():
    """Colocated training and inference (verl-style: an actor trained beside an inference engine's
    KV cache), recording begun after the first AdamW step: the weights and their two moments (three
    copies of every shape) and four 64 MiB cache blocks predate the trace. The traced backward made
    the weights' gradients, none of the cache's shape, so no weight of that shape trains (no
    gradient, no state): with each block outweighing all the other frame-less blocks, it is unknown
    (a pool, or a frozen huge weight), not read as parameters (four blocks were; three were split
    into parameters and two moments)."""
    for blocks in (4, 3):
        sim = Sim(total_bytes=4 << 30)
        shapes = (4, 4, 2, 1)
        for _ in range(3):
            for size in shapes:
                sim.alloc(size * MiB)
        for _ in range(blocks):
            sim.alloc(64 * MiB)
        sim.start_recording()
        _forward(sim)
        gradients = [sim.alloc(size * MiB, BACKWARD_STACK) for size in shapes]
        sim.free(sim.alloc(4 * MiB, FOREACH_STACK))
        for gradient in gradients:  # zero_grad(set_to_none=True)
            sim.free(gradient)
        _forward(sim)
        components = _components(sim)
        assert components["unknown"] == blocks * 64 * MiB, blocks
        assert components["parameters"] == 11 * MiB, blocks
        assert components["optimizer_state"] == 22 * MiB, blocks
