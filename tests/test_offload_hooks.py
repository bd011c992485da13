"""Inference with its blocks offloaded by a hook the user wrote (`p.data = host.to(device)` in a
forward pre-hook, `p.data = host` in the forward hook), read from a plain snapshot: no frame of
Module.to shows, but the block's weights were made by a module hook whose site a hook also frees,
so the running block's weights are parameters (attribution.hook_moved_weights), not activations a
graph keeps."""

from __future__ import annotations

from oomdoctor.analysis import analyse
from oomdoctor.model import Frame
from oomdoctor.units import KIB, MIB
from tests.builders import SETUP_STACK, Sim

TORCH = "/usr/lib/python3/site-packages/torch/"
LOOP = Frame("serve.py", 68, "main")  # `logits = model(x)` in the loop


def _call(line: int) -> tuple[Frame, ...]:
    """Module.__call__ with hooks: `inner` calls the pre-hooks (line 1821), the forward (1832) and
    the forward hooks (1845)."""
    return (
        Frame(TORCH + "nn/modules/module.py", line, "inner"),
        Frame(TORCH + "nn/modules/module.py", 1884, "_call_impl"),
        Frame(TORCH + "nn/modules/module.py", 1778, "_wrapped_call_impl"),
    )


OUTER = (Frame("model.py", 36, "forward"), *_call(1832), LOOP)  # the model's loop over its blocks
BRING_IN = (Frame("serve.py", 20, "bring_in"), *_call(1821), *OUTER)
SEND_BACK = (Frame("serve.py", 25, "send_back"), *_call(1845), *OUTER)
LAYER = (Frame(TORCH + "nn/modules/linear.py", 134, "forward"), Frame("model.py", 48, "forward"), *_call(1832), *OUTER)
INPUT = (Frame("serve.py", 66, "main"),)
PREDICTION = (Frame("serve.py", 69, "main"),)

WEIGHTS = (MIB, 2 * KIB, 2 * KIB, 2 * KIB) * 4  # four linears and their norms: 16 tensors


def _served(*, grad: bool, free_stacks: bool = True) -> Sim:
    """Three passes over four offloaded blocks and a resident head, dumped after the loop. Under
    no_grad each block's weights go when its forward hook sends them back; with grad mode on,
    autograd keeps every block's but the first's (saved for a backward) until the pass's logits go."""
    sim = Sim(total_bytes=1024 * MIB)

    def free(address: int, stack: tuple[Frame, ...]) -> None:
        sim.free(address, stack if free_stacks else None)

    sim.alloc(64 * KIB, SETUP_STACK)  # the head, resident
    logits = None
    for _ in range(3):
        x = sim.alloc(128 * KIB, INPUT)
        saved: list[int] = []
        for block in range(4):
            weights = [sim.alloc(size, BRING_IN) for size in WEIGHTS]
            for _ in range(4):
                saved.append(sim.alloc(MIB, LAYER))  # the block's activations
            if not grad:
                for address in saved:
                    free(address, LAYER)
                saved = []
            for address in weights:
                if grad and block > 0 and address is weights[0]:
                    saved.append(address)  # the graph saves the weight: the hook lets it go
                    continue
                free(address, SEND_BACK)
        if logits is not None:
            for address in logits:
                free(address, (LOOP,))
        logits = [*saved, sim.alloc(64 * KIB, LAYER)]
        free(x, (LOOP,))
        sim.alloc(512, PREDICTION)
    return sim


def _risks(result) -> list[str]:
    return [finding.verdict for finding in result.secondary]


def test_weights_a_users_hook_moves_in_are_parameters_and_keep_no_graph():
    """Under no_grad the pass keeps the running block's 16 weight tensors and a few activations:
    read as activations, a forward that kept 92% of what it allocated in 16 tensors or more, a
    false inference-with-grad risk."""
    result = analyse(_served(grad=False).snapshot(metadata=False))
    assert result.verdict == "no-oom"
    assert "inference-with-grad" not in _risks(result), _risks(result)
    moved = [b for b in result.live_blocks if b.frames and b.frames[0].name == "bring_in"]
    assert moved and all(b.component == "parameters" for b in moved)


def test_weights_autograd_kept_after_the_hook_let_them_go_stay_activations():
    """Counter-example: with grad mode on, the weights of the blocks already run outlived the hook
    that sent them back (autograd saved them): the graph keeps them, and the risk is true. Only the
    running block's are parameters."""
    result = analyse(_served(grad=True).snapshot(metadata=False))
    assert "inference-with-grad" in _risks(result), _risks(result)
    moved = [b for b in result.live_blocks if b.frames and b.frames[0].name == "bring_in"]
    moved.sort(key=lambda b: b.alloc_index or 0)
    running, kept = moved[-len(WEIGHTS) :], moved[: -len(WEIGHTS)]
    assert kept and all(b.component == "activations" for b in kept)
    assert all(b.component == "parameters" for b in running)


def test_without_free_stacks_nothing_shows_a_hook_moved_them():
    """A trace whose frees repeat the allocation's stack (context="alloc") cannot show that a hook
    freed them: the phase's reading stands."""
    result = analyse(_served(grad=False, free_stacks=False).snapshot(metadata=False))
    moved = [b for b in result.live_blocks if b.frames and b.frames[0].name == "bring_in"]
    assert moved and all(b.component == "activations" for b in moved)


KEEP_FEATURE = (Frame("serve.py", 30, "keep_feature"), *_call(1845), *OUTER)  # features[name] = out.clone()


def test_a_hook_that_keeps_each_layer_s_output_moves_no_weights():
    """Counter-example: a forward hook that keeps a clone of each block's output in a dict (a feature
    extractor) frees the clone only when it replaces it, in the next pass, after the site ran again
    for the other blocks: its clones stay activations, the latest one too (an OOM in the next pass)."""
    sim = Sim(total_bytes=1024 * MIB)
    sim.alloc(64 * KIB, SETUP_STACK)
    features: dict[int, int] = {}
    for _ in range(3):
        x = sim.alloc(128 * KIB, INPUT)
        for block in range(4):
            for _ in range(4):
                sim.free(sim.alloc(MIB, LAYER), LAYER)
            kept = sim.alloc(MIB, KEEP_FEATURE)
            if block in features:
                sim.free(features[block], KEEP_FEATURE)
            features[block] = kept
        sim.free(x, (LOOP,))
    sim.alloc(128 * KIB, INPUT)
    sim.oom(64 * MIB, LAYER)  # the next pass's first layer
    result = analyse(sim.snapshot(metadata=False))
    clones = [b for b in result.live_blocks if b.frames and b.frames[0].name == "keep_feature"]
    assert len(clones) == 4 and all(b.component == "activations" for b in clones), clones
