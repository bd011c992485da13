"""Honest claims (issue 11, causes G and J): "would fit" is never judged from a pass the OOM
interrupted as if it had finished, and a ratio against earlier steps (and its cause) comes only from
comparable completed steps (docs/definitions.md, "A pass the OOM interrupted", "Comparable steps").
"""

from __future__ import annotations

from oomdoctor.analysis import analyse
from oomdoctor.analysis.results import RestUnknown, SummaryKind, WhatIfCase
from oomdoctor.model import Frame
from oomdoctor.units import MIB as MiB
from oomdoctor.views import phrasing
from tests.builders import SETUP_STACK, Sim

BATCH_CHANGES = ("smaller-batch", "smaller-micro-batch", "activation-checkpointing")
LAYERS = 6  # a repeated layer pattern


def _layer_stack(layer: int, op: int) -> tuple[Frame, ...]:
    return (
        Frame("/usr/lib/python3/site-packages/torch/nn/functional.py", 100 + op, "linear"),
        Frame("model.py", 30 + op, "forward"),
        Frame("model.py", 60, "forward"),  # the loop over layers: every layer calls the same lines
        Frame("train.py", 40, "train_step"),
    )


INPUT_STACK = (Frame("train.py", 36, "train_step"),)


def _step(
    sim: Sim, batch_mib: int, *, oom_at: int | None = None, input_mib: int | None = None, micro_batch: bool = False
) -> None:
    """One training step: the batch, a forward of LAYERS layers of two kept tensors each (sized by
    the batch), a backward that frees them and makes one gradient, the optimizer step, zero_grad.
    `oom_at`: the forward runs out at this allocation (its layer's tensors so far kept).
    `micro_batch`: a micro-batch of gradient accumulation instead, which the step's next pass
    follows: no optimizer step nor zero_grad, the gradient kept, the batch freed."""
    batch = sim.alloc((input_mib if input_mib is not None else batch_mib // 8 or 1) * MiB, INPUT_STACK)
    sim.marker("forward", "start")
    kept = []
    count = 0
    for layer in range(LAYERS):
        for op in range(2):
            if oom_at is not None and count == oom_at:
                sim.oom(batch_mib * MiB)
                return
            kept.append(sim.alloc(batch_mib * MiB, _layer_stack(layer, op)))
            count += 1
    sim.marker("forward", "end")
    sim.marker("backward", "start")
    for address in reversed(kept):
        sim.free(address)
    grad = sim.alloc(8 * MiB, (Frame("torch/autograd/graph.py", 800, "_engine_run_backward"),), "gradient", "w.grad")
    sim.marker("backward", "end")
    if micro_batch:
        sim.free(batch)
        return
    sim.marker("optimizer_step", "start")
    sim.marker("optimizer_step", "end")
    sim.marker("zero_grad", "start")
    sim.free(grad)
    sim.free(batch)
    sim.marker("zero_grad", "end")


def _model(sim: Sim) -> None:
    sim.alloc(8 * MiB, SETUP_STACK, "parameter", "w")


def _batch_claims(result) -> dict[str, bool | None]:
    return {r.id: r.would_fit_alone for r in result.recommendations if r.id in BATCH_CHANGES}


def test_oom_part_way_through_the_first_forward_claims_no_fit():
    sim = Sim(total_bytes=140 * MiB)
    _model(sim)
    _step(sim, 20, oom_at=6)  # half of the layers done: 120 MiB kept, 20 MiB more asked for
    result = analyse(sim.snapshot())
    assert result.target_phase == "forward" and result.target_step == 0
    what_if = result.what_if
    assert what_if.case == WhatIfCase.PASS_INTERRUPTED and what_if.largest_fitting_scale is None
    assert what_if.rest_of_pass is not None and what_if.rest_of_pass.reason == RestUnknown.NO_EARLIER_PASS
    # at the instant half the batch fits; the rest of the forward and the backward still come
    assert what_if.upper_bound_scale is not None and what_if.upper_bound_scale > 0.5
    assert what_if.fits_at(0.5) is None and what_if.fits_at(1.0) is False
    claims = _batch_claims(result)
    assert claims and all(fits is None for fits in claims.values()), claims
    assert not any(r.would_fit_alone for r in result.recommendations)
    note = phrasing.what_if_note(what_if)
    assert "unknown" in note and "upper bound" in note and "0.5" not in note.split("upper bound")[1][:3]


def test_an_earlier_complete_step_makes_the_extrapolation():
    sim = Sim(total_bytes=110 * MiB)
    _model(sim)
    _step(sim, 8)  # step 0: 6 layers x 2 x 8 MiB = 96 MiB at its peak
    _step(sim, 8)
    _step(sim, 16, oom_at=6)  # a batch twice as big runs out after three of the six layers (96 MiB)
    result = analyse(sim.snapshot())
    assert result.target_phase == "forward" and result.target_step == 2
    rest = result.what_if.rest_of_pass
    assert rest is not None and rest.extrapolated and rest.earlier_step == 1
    assert rest.size_ratio == 2.0
    # the earlier pass's own peak (96 MiB of activations) twice over
    assert rest.projected_pass_bytes >= 2 * 96 * MiB
    what_if = result.what_if
    assert what_if.case in (WhatIfCase.LINEAR, WhatIfCase.PLACEMENT)
    # the whole pass at half the batch needs 96 MiB + the model: by allocated bytes it just fits,
    # without room for a new segment of each pool (22 MiB): whether the cache fits is unknown
    scale = what_if.by_bytes_scale
    assert scale is not None and 0.5 <= scale < 0.6
    assert what_if.largest_fitting_scale is not None and what_if.largest_fitting_scale < 0.5
    assert what_if.predicted_peak_bytes(1.0) >= 2 * 96 * MiB
    assert what_if.fits_at(0.5) is None
    # halving the micro-batch and accumulating keeps the first micro-batch's 8 MiB gradient alive
    # through the second's forward (zero_grad frees it before each step): 8 MiB over
    assert _batch_claims(result)["smaller-micro-batch"] is False
    assert "extrapolated from step 1" in phrasing.what_if_note(what_if)


def test_the_extrapolation_says_no_where_half_the_whole_pass_does_not_fit():
    sim = Sim(total_bytes=110 * MiB)
    _model(sim)
    _step(sim, 8)
    _step(sim, 32, oom_at=3)  # four times the batch: 96 MiB so far, the full pass would need 384 MiB
    result = analyse(sim.snapshot())
    what_if = result.what_if
    assert what_if.rest_of_pass is not None and what_if.rest_of_pass.size_ratio == 4.0
    assert what_if.fits_at(0.5) is False
    claims = _batch_claims(result)
    assert all(fits is False for change, fits in claims.items() if change != "activation-checkpointing")
    # the stacks show no regions, so checkpointing's saving is a rule of thumb: no fit is claimed
    # from it either way (and where they do, no "not enough": tests/test_checkpointing_regions.py)
    assert claims.get("activation-checkpointing") is None
    # judged at the OOM instant as if the pass had finished, half of it would have "fit"
    instant = sum(result.component_bytes().values()) + result.accounting.request_bytes
    assert 8 * MiB + (instant - 8 * MiB) // 2 < what_if.capacity_bytes


def _spike(input_sizes: tuple[int, int, int]) -> object:
    sim = Sim(total_bytes=200 * MiB)
    _model(sim)
    for step, (batch, oom) in enumerate(((10, None), (10, None), (20, 10))):
        _step(sim, batch, oom_at=oom, input_mib=input_sizes[step])
    return analyse(sim.snapshot())


def test_a_spike_ratio_names_a_cause_when_the_inputs_grew():
    result = _spike((1, 1, 2))
    assert result.summary.kind == SummaryKind.ACTIVATION_SPIKE, result.summary
    assert result.summary.facts.get("inputs_changed") is True
    assert result.summary.facts.get("earlier_step") in (0, 1)
    text = phrasing.summary(result.summary)
    assert "x the peak of earlier steps (larger inputs: a bigger batch, a longer sequence or larger images)" in text


def test_a_spike_ratio_reads_the_inputs_of_the_pass_that_ran_out_not_its_steps_first():
    """Gradient accumulation: the step's first micro-batch has the earlier steps' inputs, the second
    (which runs out) twice their size. The cause is read from the pass that ran out."""
    sim = Sim(total_bytes=230 * MiB)
    _model(sim)
    _step(sim, 10, input_mib=1)
    _step(sim, 10, input_mib=1)
    _step(sim, 10, input_mib=1, micro_batch=True)
    _step(sim, 20, oom_at=10, input_mib=2)
    result = analyse(sim.snapshot())
    assert (result.target_step, result.target_phase) == (2, "forward")
    assert result.summary.kind == SummaryKind.ACTIVATION_SPIKE, result.summary
    assert result.summary.facts.get("inputs_changed") is True
    assert "(larger inputs: a bigger batch" in phrasing.summary(result.summary)


def test_a_spike_ratio_without_an_input_change_names_no_cause():
    # the same batch and the same first allocations, yet more activations: say the ratio, not a cause
    sim = Sim(total_bytes=195 * MiB)
    _model(sim)
    _step(sim, 10, input_mib=1)
    _step(sim, 10, input_mib=1)
    batch = sim.alloc(1 * MiB, INPUT_STACK)
    sim.marker("forward", "start")
    for op in range(2):
        sim.alloc(10 * MiB, _layer_stack(0, op))
    for _ in range(16):  # a data-dependent branch keeps far more
        sim.alloc(10 * MiB, (Frame("model.py", 90, "route"), Frame("train.py", 40, "train_step")))
    sim.oom(10 * MiB)
    del batch
    result = analyse(sim.snapshot())
    assert result.summary.kind == SummaryKind.ACTIVATION_SPIKE, result.summary
    assert result.summary.facts.get("ratio") is not None
    assert result.summary.facts.get("inputs_changed") is False
    text = phrasing.summary(result.summary)
    assert "longer sequence" not in text and "bigger batch" not in text
    assert "x the peak of earlier steps, with inputs of the same sizes." in text


def test_no_ratio_against_model_setup():
    sim = Sim(total_bytes=150 * MiB)
    for i in range(8):  # setup allocates and frees (a conversion) before the first step
        block = sim.alloc(4 * MiB, SETUP_STACK, "parameter", f"w{i}")
        if i % 2:
            sim.free(block)
    _step(sim, 20, oom_at=6)
    result = analyse(sim.snapshot())
    assert result.target_step == 0
    assert result.summary.kind != SummaryKind.ACTIVATION_SPIKE
    assert result.summary.facts.get("ratio") is None
    assert "earlier steps" not in phrasing.summary(result.summary)


def test_no_ratio_against_a_first_step_the_trace_began_inside():
    sim = Sim(total_bytes=200 * MiB)
    _model(sim)
    sim.marker("forward", "start")
    kept = [sim.alloc(10 * MiB, _layer_stack(layer, 0)) for layer in range(LAYERS)]
    sim.start_recording()  # the trace begins here, in step 0's forward: its activations are pre-trace
    sim.marker("forward", "end")
    sim.marker("backward", "start")
    for address in kept:
        sim.free(address)
    sim.marker("backward", "end")
    sim.marker("optimizer_step", "start")
    sim.marker("optimizer_step", "end")
    _step(sim, 20, oom_at=10)
    result = analyse(sim.snapshot())
    assert result.target_step == 1
    assert result.summary.facts.get("ratio") is None, result.summary
    rest = result.what_if.rest_of_pass
    assert rest is not None and not rest.extrapolated


def test_inputs_alignment_reads_the_earlier_pass_only_as_far_as_it_can_reach():
    """`inputs_changed` reads an earlier forward's first allocations only: the first
    _INPUT_ALIGN_FIRST, then _INPUT_ALIGN_REACH when the match may have looked past them. Both give
    what aligning against all of them gives."""
    import random

    from oomdoctor.analysis import passes

    rng = random.Random(12)
    for _ in range(20_000):
        kinds = rng.choice([2, 3, 30])
        head = [(i, rng.randrange(kinds), rng.randint(1, 4)) for i in range(rng.randint(1, passes.INPUT_ALLOCATIONS))]
        if rng.random() < 0.5:  # mostly the same structure
            sites = [head[i % len(head)][1] if rng.random() < 0.9 else rng.randrange(kinds) for i in range(100)]
        else:
            sites = [rng.randrange(kinds) for _ in range(100)]
        earlier = [(i, site, rng.randint(1, 4)) for i, site in enumerate(sites[: rng.randint(0, 100)])]
        whole = passes._align(head, earlier)
        assert passes._align(head, earlier[: passes._INPUT_ALIGN_REACH]) == whole
        first = passes._align(head, earlier[: passes._INPUT_ALIGN_FIRST])
        enough = len(earlier) < passes._INPUT_ALIGN_FIRST or (
            isinstance(first, passes._Alignment)
            and first.earlier_position + 1 + passes.LOOKAHEAD <= passes._INPUT_ALIGN_FIRST
        )
        if enough:
            assert first == whole


SAMPLE_STACK = (Frame("sample.py", 20, "main"),)  # the sampler's own code between passes: x = x - eps


def test_a_forward_only_loop_extrapolates_from_its_own_earlier_passes():
    """A sampler under no_grad (a diffusion model's denoising steps, plain snapshot): each pass keeps
    its skip tensors until its end, the sampler's code runs between passes. A pass at twice the size
    runs out half-way; the passes before it, one step's as every pass of a forward-only run is, are
    of the same structure and tell the rest of it."""
    sim = Sim(total_bytes=40 * MiB)
    _model(sim)
    x = sim.alloc(4 * MiB, SAMPLE_STACK)
    for size, oom_at in ((4, None), (4, None), (4, None), (8, 3)):
        kept = []
        for layer in range(LAYERS):
            if layer == oom_at:
                sim.oom(size * MiB, _layer_stack(layer, 0))
                break
            kept.append(sim.alloc(size * MiB, _layer_stack(layer, 0)))
        else:
            for address in kept:
                sim.free(address)
            previous, x = x, sim.alloc((4 if size == 4 else 8) * MiB, SAMPLE_STACK)
            sim.free(previous)
    result = analyse(sim.snapshot(metadata=False, registry=False))
    assert result.target_phase == "forward"
    rest = result.what_if.rest_of_pass
    assert rest is not None and rest.extrapolated, rest
    assert rest.size_ratio == 2.0


def test_an_unknown_rest_names_a_backward_only_where_the_trace_shows_training():
    """Where the trace holds only the interrupted forward (a first step, or an inference run under
    no_grad), nothing shows a backward will follow: the note said 'the rest of the forward and the
    backward still come' of a diffusion sampler that runs none. Where a backward ran, it does."""
    sim = Sim(total_bytes=140 * MiB)
    _model(sim)
    _step(sim, 20, oom_at=6)
    note = phrasing.what_if_note(analyse(sim.snapshot()).what_if)
    assert "the rest of the forward, and its backward if the run trains, still come" in note, note

    trained = Sim(total_bytes=140 * MiB)
    _model(trained)
    trained.marker("forward", "start")  # an earlier step of other code: it cannot tell this pass's rest
    kept = trained.alloc(MiB, (Frame("model.py", 99, "forward"), Frame("train.py", 40, "train_step")))
    trained.marker("forward", "end")
    trained.marker("backward", "start")
    trained.free(kept)
    trained.marker("backward", "end")
    trained.marker("optimizer_step", "start")
    trained.marker("optimizer_step", "end")
    _step(trained, 20, oom_at=6)
    what_if = analyse(trained.snapshot()).what_if
    assert what_if.rest_of_pass is not None and not what_if.rest_of_pass.extrapolated
    assert "the rest of the forward and the backward still come" in phrasing.what_if_note(what_if)
