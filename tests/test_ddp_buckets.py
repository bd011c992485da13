"""DDP's gradient buckets in a plain snapshot: gradients the reducer keeps for the whole run.

DDP (without gradient_as_bucket_view) makes its buckets in the constructor (`_ddp_init_helper`)
and again at the rebuild in the second iteration's forward (`_pre_forward`); nothing frees them
later, and zero_grad does not reach them. A DDP MLP rehearsed over two ranks whose third step's
batch was 64 times larger read, on its plain dump, 'gradients-kept: 13.06 MiB of gradients from
earlier steps were still alive during step 2's forward' with 'Call zero_grad(set_to_none=True)
... saves about 13.06 MiB' (the loop called it), and the rebuilt buckets, made in step 1's forward,
counted as that step's activations in the steps' series: 'reached 80.00 MiB, 5.3x the peak of
earlier steps' (15.06 MiB) where the earlier steps' activations peaked at 2.01 MiB (39.8x).
"""

from oomdoctor.analysis import analyse
from oomdoctor.model import Frame
from tests.builders import ADAM_INIT_STACK, BACKWARD_STACK, FOREACH_STACK, FORWARD_STACK, SETUP_STACK, GiB, MiB, Sim

DDP = "/usr/lib/python3/site-packages/torch/nn/parallel/distributed.py"
DDP_INIT = (Frame(DDP, 1437, "_ddp_init_helper"), Frame(DDP, 1079, "__init__"), Frame("train.py", 23, "main"))
DDP_REBUILD = (
    Frame(DDP, 1775, "_pre_forward"),
    Frame(DDP, 1886, "forward"),
    Frame("/usr/lib/python3/site-packages/torch/nn/modules/module.py", 1751, "_wrapped_call_impl"),
    Frame("train.py", 40, "train_step"),
)


def _ddp_run(activation_blocks: int) -> Sim:
    sim = Sim(total_bytes=4 * GiB)
    for _ in range(4):
        sim.alloc(64 * MiB, SETUP_STACK)
    bucket = sim.alloc(256 * MiB, DDP_INIT)
    for step in range(2):
        if step == 1:  # the bucket rebuild at the second iteration's forward
            sim.free(bucket)
            bucket = sim.alloc(256 * MiB, DDP_REBUILD)
        activations = [sim.alloc(16 * MiB, FORWARD_STACK) for _ in range(2)]
        gradients = [sim.alloc(64 * MiB, BACKWARD_STACK) for _ in range(4)]
        for block in activations:
            sim.free(block)
        if step == 0:
            for _ in range(8):
                sim.alloc(64 * MiB, ADAM_INIT_STACK)
        sim.free(sim.alloc(64 * MiB, FOREACH_STACK))
        for block in gradients:  # zero_grad(set_to_none=True)
            sim.free(block)
    for _ in range(activation_blocks):  # step 2's forward, on a batch far larger
        sim.alloc(64 * MiB, FORWARD_STACK)
    sim.oom(64 * MiB, FORWARD_STACK)
    return sim


def test_ddp_buckets_are_no_gradients_kept_from_earlier_steps():
    analysis = analyse(_ddp_run(20).snapshot(metadata=False))
    assert analysis.component_bytes().get("gradients") == 256 * MiB  # the buckets
    assert "gradients-kept" not in {analysis.verdict, *(f.verdict for f in analysis.secondary)}
    assert "zero-grad-set-to-none" not in {r.id for r in analysis.recommendations}


def test_ddp_buckets_rebuilt_in_a_forward_are_no_activations_of_its_step():
    analysis = analyse(_ddp_run(20).snapshot(metadata=False))
    by_step = {s.step: s.peak_activation_bytes for s in analysis.steps}
    assert by_step[0] == by_step[1] == 32 * MiB
    assert by_step[2] == 20 * 64 * MiB
