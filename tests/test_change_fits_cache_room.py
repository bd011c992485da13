"""The fit claims of the changes that are not a batch scale (an 8-bit optimizer, sharding, a chunked
operation), judged against the cache as the what-if's are. Each case was rehearsed on the fixture's
simulated device with the change made in a copy of its scenario:

* an 8-bit optimizer, modelled by moments kept at a quarter of the size (uint8 of the same number
  of elements) and updated in place, as bitsandbytes' kernels do: optimizer-state-buildup-gpt-adamw
  (and its late-recording variant) ran out in step 1's backward, a 16 MiB request with 12 MiB free on
  the device and the cache's free bytes in pieces, where "would fit on its own" was said with 7.8
  MiB to spare by allocated bytes; model-states-too-large-mlp-sgd fitted, 18 MiB spare, where "not
  enough on its own" was said (the step's foreach temporaries go too);
* sharding over two ranks, every Linear a unit whose parameters are gathered for its forward and
  backward: model-states-too-large-mlp-adamw ran out in step 1's backward where "would fit" was said
  with 60 MiB to spare;
* the checkpoint's gather computed in four pieces, all kept by the state dict: it still ran out.

The fits that held keep their claim: foreach=False (optimizer-state-buildup-mlp-adam fitted with 2
MiB spare: its 6 MiB beyond the need are few, but the layout at the OOM places the request once the
foreach temporaries are free), zero_grad, no_grad, outputs to the CPU, expandable segments.
"""

from __future__ import annotations

import pytest

from oomdoctor.analysis import analyse, whatif
from oomdoctor.analysis import recommendations as rec
from oomdoctor.load import load
from tests.builders import MiB
from tests.conftest import FIXTURES


def _advice(name: str) -> dict:
    return {r.id: r for r in analyse(load(FIXTURES / "dumps" / f"{name}.pickle")).recommendations}


def test_spare_bytes_is_what_a_saving_leaves_beyond_every_part_of_the_need():
    need = rec.Requirement(8 * MiB, projected_gap_bytes=20 * MiB, rest_gap_bytes=12 * MiB)
    assert need.spare_bytes(30 * MiB, 30 * MiB) == 10 * MiB  # the projected gap binds
    assert need.covered_by(30 * MiB, 30 * MiB) is True
    assert need.spare_bytes(30 * MiB, 30 * MiB) < whatif.cache_margin()
    assert rec.Requirement(None).spare_bytes(MiB, MiB) is None


@pytest.mark.parametrize(
    "name", ["optimizer-state-buildup-gpt-adamw", "realism/late-recording-optimizer-state-gpt-adamw"]
)
def test_a_change_that_leaves_less_than_the_cache_room_is_not_said_to_fit(name):
    advice = _advice(name)
    eight_bit = advice["eight-bit-optimizer"]
    assert eight_bit.estimated_saved_bytes < 8 * MiB + whatif.cache_margin()  # 15.8 MiB against 8 missing
    assert eight_bit.would_fit_alone is None
    # the changes sized by the what-if, with room for the cache there, keep their fit
    assert advice["smaller-micro-batch"].would_fit_alone is True


def test_a_thin_fit_holds_where_the_layout_places_the_request_once_the_freed_blocks_are_free():
    foreach = _advice("optimizer-state-buildup-mlp-adam")["foreach-false"]
    assert foreach.estimated_saved_bytes < 12 * MiB + whatif.cache_margin()
    assert foreach.would_fit_alone is True


def test_sharding_saves_at_most_half_the_states_and_no_fit_is_claimed_from_it():
    for name in ("model-states-too-large-mlp-adamw", "model-states-too-large-mlp-sgd"):
        shard = _advice(name)["shard-model-states"]
        assert shard.estimated_saved_bytes > 0 and shard.would_fit_alone is None, name


def test_an_eight_bit_optimizer_in_a_step_with_foreach_temporaries_is_not_said_to_be_not_enough():
    advice = _advice("model-states-too-large-mlp-sgd")
    assert advice["eight-bit-optimizer"].would_fit_alone is None
    # foreach=False alone is still not enough: the projected states exceed the device
    assert advice["foreach-false"].would_fit_alone is False


def test_a_checkpoint_gather_is_not_advised_to_be_computed_in_pieces():
    advice = _advice("realism/checkpoint-gather-mlp-adam")
    assert "chunk-large-op" not in advice
    assert advice["state-dict-to-cpu"].would_fit_alone is True  # rehearsed: fitted, 6 MiB free at its peak
