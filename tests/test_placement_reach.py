"""A placement failure (the free bytes added up to the request, no free block or free device memory
could take it) limits the scaled request to today's free blocks only at the OOM's own layout. A
smaller batch holds fewer bytes at that moment, and where they would be free the file does not show:
between the scale today's blocks place (`placement_limit`) and the largest at which a place could
exist at all (`placement_reach`), whether a scale fits is unknown, not no. (A held-out CNN ran out
with 8 MiB of 4 MiB pieces; halving its batch, which fits on that device, read "not enough on its
own" because 0.503x of the request exceeds the 4 MiB piece.)"""

from __future__ import annotations

from oomdoctor.analysis import analyse
from oomdoctor.analysis.results import WhatIfCase, WhatIfUnknown
from oomdoctor.analysis.whatif import placement_limit, placement_reach, what_if
from tests.builders import MiB
from tests.test_fragmentation_within_a_spike import _spike_in_pieces


def test_the_reach_counts_the_bytes_a_smaller_pass_does_not_hold():
    # 8 MiB asked, a 4 MiB piece the largest, 4 MiB free on the device, 13.5 MiB of pieces, 177 MiB
    # of the pass's own: half of those bytes not held makes room far above today's limit
    assert placement_limit(8 * MiB, 4 * MiB, 4 * MiB) == 0.5
    assert placement_reach(8 * MiB, 4 * MiB, 4 * MiB, 27 * MiB // 2, 177 * MiB) == 0.98
    # another process holds the device (18 MiB free): a request over 1 MiB needs a 20 MiB segment,
    # which the pass's 0.75 MiB and the cache's 1 MiB cannot make, at any scale that keeps it over 1 MiB
    assert placement_reach(4 * MiB, 0, 18 * MiB, MiB, 3 * MiB // 4) == placement_limit(4 * MiB, 0, 18 * MiB) == 0.25


def _what_if(reach: float):
    return what_if(
        {"activations": 177 * MiB, "parameters": 2 * MiB},
        scalable_bytes=177 * MiB,
        request_bytes=8 * MiB,
        target_phase="forward",
        capacity_bytes=200 * MiB,
        shortfall_bytes=4 * MiB,
        placement_limit=0.5,
        placement_reach=reach,
    )


def test_a_scale_past_todays_blocks_but_within_reach_is_not_known_to_fail():
    assert _what_if(reach=0.98).fits_at(0.5) is True
    assert _what_if(reach=0.98).fits_at(0.52) is None
    assert _what_if(reach=0.5).fits_at(0.52) is False  # no layout of the bytes makes a place
    assert _what_if(reach=0.98).fits_at(1.5) is False  # the bytes alone do not fit


def test_halving_the_batch_past_todays_blocks_is_not_said_to_fail():
    result = analyse(_spike_in_pieces(layers_at_oom=3).snapshot())
    # today's 8 MiB pieces were left by step 0's activations, which shrink with the batch as the
    # request does: at no scale do they take it. The pass's three 32 MiB segments, each cut for one
    # activation, are cut smaller at a smaller batch, and free device memory gains what they lose:
    # at 0.75x, 4 MiB + 3 x 8 MiB free for a 24 MiB request
    assert result.what_if.placement_limit_scale == 0.75 and result.what_if.placement_reach_scale == 0.99
    halving = next(r for r in result.recommendations if r.id == "smaller-micro-batch")
    assert halving.would_fit_alone is not False


def test_a_placement_limit_is_no_upper_bound():
    """Where no scale is said to fit (what the run keeps grows pass after pass), the moment's largest
    scale is given as an upper bound, "a larger scale does not fit". After a placement failure that
    is where no place could exist at all (the reach), not where today's layout shows one: past the
    latter a scale is unknown, not no. (`inference-with-grad-gpt` read "fits up to 0.65x at most, a
    larger scale does not fit"; rehearsed, its batch at 0.69x and 0.75x ran to completion.)"""
    result = what_if(
        {"activations": 177 * MiB, "parameters": 2 * MiB},
        scalable_bytes=177 * MiB,
        request_bytes=8 * MiB,
        target_phase="forward",
        capacity_bytes=200 * MiB,
        shortfall_bytes=4 * MiB,
        placement_limit=0.5,
        placement_reach=0.98,
        beyond_the_moment=WhatIfUnknown.KEEPS_GROWING,
    )
    assert result.case == WhatIfCase.BEYOND_THE_MOMENT and result.largest_fitting_scale is None
    assert result.upper_bound_scale == 0.98
    assert result.fits_at(0.75) is None and result.fits_at(0.99) is False
