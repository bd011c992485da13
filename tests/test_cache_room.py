"""A fit judged by allocated bytes alone leaves out the cache: a request of 1-10 MiB that no cached
block takes is placed in a whole new 20 MiB segment, one of at most 1 MiB in a new 2 MiB one. The
what-if's largest fitting scale and every "would fit" that rests on it (a halved batch or
micro-batch) leave room for one new segment of each pool; between that scale and what allocated
bytes alone allow, whether the run fits is unknown."""

from __future__ import annotations

from oomdoctor.analysis import whatif
from oomdoctor.analysis.results import WhatIfCase
from tests.builders import MiB


def test_the_largest_fitting_scale_leaves_room_for_one_new_segment_of_each_pool():
    margin = whatif.cache_margin(20 * MiB)
    assert margin == 22 * MiB
    # 20 MiB fixed, 100 MiB that scales, on 100 MiB: 0.80x by allocated bytes, 0.58x with the room
    found = whatif.what_if(
        {"parameters": 20 * MiB, "activations": 100 * MiB},
        scalable_bytes=100 * MiB,
        request_bytes=0,
        target_phase="forward",
        capacity_bytes=100 * MiB,
        cache_margin_bytes=margin,
    )
    assert found.case == WhatIfCase.LINEAR
    assert found.largest_fitting_scale == 0.58 and found.by_bytes_scale == 0.8
    assert found.fits_at(0.5) is True
    assert found.fits_at(0.7) is None  # by allocated bytes it fits, the segments may not
    assert found.fits_at(0.9) is False
    # a larger segment size (large_segment_size_mb) leaves more room
    wider = whatif.what_if(
        {"parameters": 20 * MiB, "activations": 100 * MiB},
        scalable_bytes=100 * MiB,
        request_bytes=0,
        target_phase="forward",
        capacity_bytes=100 * MiB,
        cache_margin_bytes=whatif.cache_margin(40 * MiB),
    )
    assert wider.largest_fitting_scale == 0.38
    # no scale leaves the room: none is said to fit, and none is said not to below the bytes' limit
    tight = whatif.what_if(
        {"parameters": 90 * MiB, "activations": 100 * MiB},
        scalable_bytes=100 * MiB,
        request_bytes=0,
        target_phase="forward",
        capacity_bytes=100 * MiB,
        cache_margin_bytes=margin,
    )
    assert tight.largest_fitting_scale is None and tight.by_bytes_scale == 0.1
    assert tight.fits_at(0.05) is None and tight.fits_at(0.2) is False


def test_a_halved_micro_batch_of_a_leak_is_not_said_to_fit():
    """creeping-leak-mlp-sgd (a loss history keeping every step's graph, batch 1024 on 100 MiB). Rehearsed at batch 512 (a
    halved batch, which keeps less than two halved micro-batches do) the run still ran out in step 7's
    backward: 82.7 MiB allocated, 1.3 MiB cached, and a 5 MiB request that needed a new 20 MiB
    segment with 16 MiB free. By allocated bytes it fits with under 22 MiB to spare, and the leak
    keeps more with each step still to come: the report does not say it would fit."""
    from oomdoctor.analysis import analyse
    from oomdoctor.load import load
    from tests.conftest import FIXTURES

    analysis = analyse(load(FIXTURES / "dumps" / "creeping-leak-mlp-sgd.pickle"))
    halved = next(r for r in analysis.recommendations if r.id == "smaller-micro-batch")
    assert halved.would_fit_alone is None
    what = analysis.what_if
    assert what.capacity_bytes is not None and what.cache_margin_bytes == 22 * MiB
    assert what.fits_at(0.5) is None


def test_the_largest_scale_of_the_moment_is_no_fit_where_what_the_run_keeps_grows():
    """A leak (or grad-mode graphs kept pass after pass) keeps more with each step still to come,
    and how many come the file does not say: the moment's largest scale is an upper bound only, and
    no scale is said to fit. Rehearsed at the moment's scale, creeping-leak-mlp-sgd (0.96x: batch
    983; with room for the cache, 0.74x: batch 757) and slow-leak-mlp-kept-predictions (0.99x, 0.92x)
    still ran out, as inference-with-grad-cnn did at its 0.50x (batch 8)."""
    from oomdoctor.analysis import analyse
    from oomdoctor.analysis.results import WhatIfUnknown
    from oomdoctor.load import load
    from oomdoctor.views import phrasing
    from tests.conftest import FIXTURES

    for name in ("creeping-leak-mlp-sgd", "realism/slow-leak-mlp-kept-predictions", "inference-with-grad-cnn"):
        what = analyse(load(FIXTURES / "dumps" / f"{name}.pickle")).what_if
        assert what.case == WhatIfCase.BEYOND_THE_MOMENT, name
        assert what.beyond_the_moment == WhatIfUnknown.KEEPS_GROWING
        assert what.largest_fitting_scale is None and what.upper_bound_scale is not None
        assert what.fits_at(what.upper_bound_scale / 2) is None
        assert what.fits_at(1.0) is False
        assert "an upper bound only (a larger scale does not fit)" in phrasing.what_if_note(what)


def test_no_scale_is_said_to_fit_by_a_guessed_rest_of_the_pass():
    """activation-spike-gpt-longer-sequence: the OOM cut the longer sequence's forward short, and its
    rest is extrapolated with the sites it had not reached scaled by a guess (the halved
    micro-batch is not said to fit by it either). Rehearsed, batch 10 (0.63x, the moment's scale by
    allocated bytes) and batch 8 (0.50x, with room for the cache) both ran out in step 2's backward."""
    from oomdoctor.analysis import analyse
    from oomdoctor.analysis.results import WhatIfUnknown
    from oomdoctor.load import load
    from tests.conftest import FIXTURES

    what = analyse(load(FIXTURES / "dumps" / "activation-spike-gpt-longer-sequence.pickle")).what_if
    assert what.rest_of_pass is not None and what.rest_of_pass.by_site
    assert what.case == WhatIfCase.BEYOND_THE_MOMENT and what.beyond_the_moment == WhatIfUnknown.REST_GUESSED
    assert what.largest_fitting_scale is None and what.fits_at(0.5) is None


def test_a_recorded_steps_activations_alone_bound_a_larger_batch_from_above():
    """From a recorded step's peak (a dump without an OOM) the budget is the step's activations; its
    temporaries and inputs, which grow with the batch too, count as fixed, so a scale above 1.00x is
    overstated: an upper bound only. Rehearsed, no-oom-gpt-adamw (batch 16 on 256 MiB, 3.33x by its
    activations; 2.98x with room for the cache) ran out at batch 53 and at batch 47, in backward
    with 228.6 MiB allocated and a 24 MiB request where 230.8 MiB was predicted."""
    from oomdoctor.analysis import analyse
    from oomdoctor.analysis.results import WhatIfUnknown
    from oomdoctor.load import load
    from oomdoctor.views import phrasing
    from tests.conftest import FIXTURES

    what = analyse(load(FIXTURES / "dumps" / "no-oom-gpt-adamw.pickle")).what_if
    assert what.basis is not None
    assert what.case == WhatIfCase.BEYOND_THE_MOMENT and what.beyond_the_moment == WhatIfUnknown.ACTIVATIONS_ONLY
    assert what.largest_fitting_scale is None and what.upper_bound_scale is not None and what.upper_bound_scale > 1
    assert what.fits_at(2.0) is None and what.fits_at(what.upper_bound_scale + 0.1) is False
    assert what.fits_at(1.0) is True  # the batch it ran, with room for the cache's segments
    assert "no scale above 1.00x is said to fit" in phrasing.what_if_note(what)


def test_a_larger_batch_than_the_one_measured_is_an_upper_bound_only():
    """A larger batch makes larger requests than any the trace shows, which the cache lays out in
    ways the file cannot show. Rehearsed, no-oom-eval-outputs-kept-gpt (batch 16 on 256 MiB, 1.74x by
    allocated bytes, 1.57x with room for the cache) ran out at batch 27 and at batch 25: its final
    torch.cat of the kept logits asked for 100 MiB with 76 MiB free and 48 MiB cached in pieces."""
    from oomdoctor.analysis import analyse
    from oomdoctor.analysis.results import WhatIfUnknown
    from oomdoctor.load import load
    from oomdoctor.views import phrasing
    from tests.conftest import FIXTURES

    what = analyse(load(FIXTURES / "dumps" / "realism" / "no-oom-eval-outputs-kept-gpt.pickle")).what_if
    assert what.basis is None
    assert what.case == WhatIfCase.BEYOND_THE_MOMENT and what.beyond_the_moment == WhatIfUnknown.LARGER_BATCH
    assert what.upper_bound_scale is not None and what.upper_bound_scale > 1
    assert what.fits_at(1.5) is None and what.fits_at(what.upper_bound_scale + 0.1) is False
    assert what.fits_at(1.0) is True
    assert "no scale above 1.00x is said to fit" in phrasing.what_if_note(what)


def test_a_state_dict_gathered_for_a_save_does_not_shrink_with_the_batch():
    """checkpoint-gather-mlp-adam ran out gathering a 64 MiB state dict between steps; the what-if
    counted that request as growing with the batch and said 0.46x (0.12x with room for the cache)
    would fit. Rehearsed at batch 1 the run still ran out on the same 64 MiB gather: the request of
    checkpoint-saving code is fixed, and the fixed part alone does not fit."""
    from oomdoctor.analysis import analyse
    from oomdoctor.load import load
    from tests.conftest import FIXTURES

    analysis = analyse(load(FIXTURES / "dumps" / "realism" / "checkpoint-gather-mlp-adam.pickle"))
    assert analysis.verdict == "checkpoint-gather"
    what = analysis.what_if
    assert what.request_fixed and what.case == WhatIfCase.FIXED_TOO_LARGE
    assert what.fits_at(0.1) is False
