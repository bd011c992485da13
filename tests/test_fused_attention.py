"""An attention that materialises its score matrices (a softmax inside a function named for
attention, as hand-written and transformers' eager attention do) is advised fused attention,
saving the scores it keeps: the softmax's outputs and the same-sized scores before it."""

from __future__ import annotations

from oomdoctor.analysis import analyse
from oomdoctor.analysis.recommendations import attention_score_bytes
from oomdoctor.model import Frame
from tests.builders import FORWARD_STACK, MiB, Sim

ATTENTION = Frame("model.py", 40, "scaled_dot_product_attention")
SOFTMAX_STACK = (Frame("nn_utils.py", 7, "softmax"), ATTENTION, *FORWARD_STACK)
SCORES_STACK = (Frame("/usr/lib/python3/site-packages/torch/functional.py", 402, "einsum"), ATTENTION, *FORWARD_STACK)
VALUES_STACK = (Frame("model.py", 44, "scaled_dot_product_attention"), *FORWARD_STACK)
MLP_SOFTMAX = (Frame("nn_utils.py", 7, "softmax"), Frame("model.py", 90, "router"), *FORWARD_STACK)


def _forward_oom(layers: int, stacks=(SCORES_STACK, SOFTMAX_STACK)):
    sim = Sim(total_bytes=1024 * MiB)
    sim.alloc(64 * MiB, component="parameter", name="weights")
    sim.marker("forward", "start")
    for _ in range(layers):
        for stack in stacks:
            sim.alloc(48 * MiB, stack)
        sim.alloc(12 * MiB, VALUES_STACK)  # the attention's output: not a score matrix
    sim.oom(512 * MiB, SOFTMAX_STACK)
    return analyse(sim.snapshot(registry=False))


def test_an_unfused_attention_is_advised_fused_attention():
    analysis = _forward_oom(layers=4)
    assert attention_score_bytes(analysis.live_blocks) == 4 * 2 * 48 * MiB
    saved = {r.id: r.estimated_saved_bytes for r in analysis.recommendations}
    assert saved["fused-attention"] == 4 * 2 * 48 * MiB


def test_a_softmax_outside_an_attention_is_not_a_score_matrix():
    analysis = _forward_oom(layers=4, stacks=(MLP_SOFTMAX,))
    assert attention_score_bytes(analysis.live_blocks) == 0
    assert "fused-attention" not in {r.id for r in analysis.recommendations}


def test_an_attention_name_far_out_in_the_stack_is_not_an_attention():
    """A model's top-level function named for attention does not make its classifier's softmax an
    attention score: both must be among the innermost Python frames."""
    outer = (
        Frame("nn_utils.py", 7, "softmax"),
        Frame("model.py", 90, "classify"),
        Frame("model.py", 120, "head"),
        Frame("model.py", 130, "forward"),
        Frame("train.py", 10, "train_attention_model"),
    )
    analysis = _forward_oom(layers=4, stacks=(outer,))
    assert attention_score_bytes(analysis.live_blocks) == 0


def _forward_backward(layers: int, *, oom: bool, stacks=(SCORES_STACK, SOFTMAX_STACK), engine_bytes=48 * MiB):
    """Forward through `layers` attentions, then a backward whose autograd engine (no Python frames)
    makes two blocks of `engine_bytes` per layer and one 20 MiB block that is no score's size."""
    sim = Sim(total_bytes=2048 * MiB)
    sim.alloc(64 * MiB, component="parameter", name="weights")
    sim.marker("forward", "start")
    for _ in range(layers):
        for stack in stacks:
            sim.alloc(48 * MiB, stack)
        sim.alloc(12 * MiB, VALUES_STACK)
    sim.marker("forward", "end")
    sim.marker("backward", "start")
    for _ in range(layers):
        sim.alloc(engine_bytes)
        sim.alloc(engine_bytes)
    sim.alloc(20 * MiB)
    if oom:
        sim.oom(1024 * MiB)
    return analyse(sim.snapshot(registry=False))


def test_the_backward_gradients_of_the_scores_are_score_matrices_too():
    """The autograd engine's blocks of a score matrix's size (the gradients of the scores and of the
    softmax: no Python frames) are what fused attention's backward does not materialise either."""
    analysis = _forward_backward(layers=3, oom=True)
    assert attention_score_bytes(analysis.live_blocks) == 3 * 2 * 48 * MiB + 3 * 2 * 48 * MiB
    # blocks of other sizes, and the engine's blocks where no attention made a score matrix, are not
    other = _forward_backward(layers=3, oom=True, engine_bytes=40 * MiB)
    assert attention_score_bytes(other.live_blocks) == 3 * 2 * 48 * MiB
    mlp = _forward_backward(layers=3, oom=True, stacks=(MLP_SOFTMAX,))
    assert attention_score_bytes(mlp.live_blocks) == 0


def test_without_an_oom_or_a_risk_only_fused_attention_is_advised():
    """A run that did not run out and shows no risk gets no trade-off (checkpointing, a smaller
    batch), but an unfused attention is waste at no benefit: it is advised, sized at the peak."""
    analysis = _forward_backward(layers=3, oom=False)
    assert analysis.verdict == "no-oom"
    assert not analysis.secondary
    assert [(r.id, r.estimated_saved_bytes) for r in analysis.recommendations] == [
        ("fused-attention", 3 * 2 * 48 * MiB + 3 * 2 * 48 * MiB)
    ]
    plain = _forward_backward(layers=3, oom=False, stacks=(MLP_SOFTMAX,))
    assert plain.verdict == "no-oom" and not plain.secondary
    assert plain.recommendations == ()


def test_an_output_as_large_as_the_scores_is_not_counted_with_them():
    """Where the sequence is as long as a head is wide, the attention's output (scores @ v) has the
    scores' size: made after the softmax, it is no score matrix."""
    sim = Sim(total_bytes=1024 * MiB)
    sim.alloc(64 * MiB, component="parameter", name="weights")
    sim.marker("forward", "start")
    for _ in range(4):
        sim.alloc(48 * MiB, SCORES_STACK)
        sim.alloc(48 * MiB, SOFTMAX_STACK)
        sim.alloc(48 * MiB, VALUES_STACK)  # the output, of the same size
    sim.oom(512 * MiB, SOFTMAX_STACK)
    analysis = analyse(sim.snapshot(registry=False))
    assert attention_score_bytes(analysis.live_blocks) == 4 * 2 * 48 * MiB
