"""Fragments do not outrank an activation spike whose interrupted pass needed more than all the free
memory, had it been one block: expandable segments would have found a place for this request and
the pass would have run out a few layers later. (A held-out CNN, a step of batch 32 after steps of
8 on a device the batch-8 steps fit: 13.5 MiB of 8 MiB requests' pieces free, the pass projected at
248 MiB of its own on a 200 MiB device, read fragmentation.)"""

from __future__ import annotations

from oomdoctor.analysis import analyse
from oomdoctor.model import Frame
from tests.builders import BACKWARD_STACK, SETUP_STACK, MiB, Sim

LAYERS = 6


class KeptCache(Sim):
    def release_cache(self) -> None:  # cache the flush cannot return (blocks of split segments)
        pass


def _layer_stack(layer: int) -> tuple[Frame, ...]:
    return (
        Frame("/usr/lib/python3/site-packages/torch/nn/functional.py", 100, "conv2d"),
        Frame("model.py", 20 + layer, "forward"),
        Frame("/usr/lib/python3/site-packages/torch/nn/modules/module.py", 1751, "_wrapped_call_impl"),
        Frame("train.py", 40, "train_step"),
    )


def _spike_in_pieces(layers_at_oom: int) -> Sim:
    """Step 0's forward makes one 8 MiB activation per layer, freed by its backward (cached, in
    pieces); step 1's batch is four times larger and its forward runs out at layer `layers_at_oom`
    with 48 MiB of pieces free, more than the 32 MiB request, none of them large enough."""
    sim = KeptCache(total_bytes=(52 + 32 * layers_at_oom + 2) * MiB)
    sim.alloc(2 * MiB, SETUP_STACK, "parameter", "model.weight")
    for step in range(2):
        sim.marker("forward", "start")
        size = (8 if step == 0 else 32) * MiB
        activations = []
        for layer in range(LAYERS):
            if step == 1 and layer == layers_at_oom:
                sim.oom(size, _layer_stack(layer))
                return sim
            activations.append(sim.alloc(size, _layer_stack(layer)))
        sim.marker("forward", "end")
        sim.marker("backward", "start")
        for address in activations:
            sim.free(address, BACKWARD_STACK)
        if step == 0:
            sim.alloc(2 * MiB, BACKWARD_STACK, "gradient", "model.weight.grad")
        sim.marker("backward", "end")
        sim.marker("optimizer_step", "start")
        sim.marker("optimizer_step", "end")
    return sim


def test_a_spike_whose_pass_needed_more_than_all_the_free_memory_outranks_its_fragments():
    result = analyse(_spike_in_pieces(layers_at_oom=3).snapshot())
    frag = result.fragmentation
    assert frag.would_fit_if_contiguous and frag.largest_usable_free_block_bytes < 32 * MiB
    assert (result.target_phase, result.target_step) == ("forward", 1)
    assert result.verdict == "activation-spike", (result.verdict, [f.verdict for f in result.secondary])
    assert "fragmentation" in [f.verdict for f in result.secondary]


def test_fragments_stay_first_where_the_rest_of_the_pass_fitted_in_them():
    """The same spike cut short at its last layer: the free pieces, as one block, held the request
    and all the pass still needed, so they are the cause."""
    result = analyse(_spike_in_pieces(layers_at_oom=LAYERS - 1).snapshot())
    assert result.verdict == "fragmentation", (result.verdict, [f.verdict for f in result.secondary])
    assert "activation-spike" in [f.verdict for f in result.secondary]


def _expandable_fits(layers_at_oom: int) -> bool | None:
    result = analyse(_spike_in_pieces(layers_at_oom=layers_at_oom).snapshot())
    return next(r.would_fit_alone for r in result.recommendations if r.id == "expandable-segments")


def test_expandable_segments_are_not_enough_where_the_pass_needed_more_than_all_the_free_memory():
    """Expandable segments make the 48 MiB of pieces one place: the rest of the pass (projected at
    192 MiB, 96 MiB at the OOM) lacked 46 MiB beyond every free byte, those pieces counted, so they
    are not enough on their own, however their 48 MiB compares with that 46."""
    assert _expandable_fits(layers_at_oom=3) is False
    assert _expandable_fits(layers_at_oom=LAYERS - 1) is True  # the pieces held the rest
