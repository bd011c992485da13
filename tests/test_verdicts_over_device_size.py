"""Verdicts that must not change with the device's size for a reason their definitions do not
give: a run rehearsed on a somewhat smaller device runs out at the same moment, or a little earlier
in the same pass, for the same cause (docs/verdicts.md)."""

from __future__ import annotations

from oomdoctor.analysis import analyse
from tests.builders import FORWARD_STACK, SETUP_STACK, MiB, Sim
from tests.test_passes_rest_projection import _step

LAYER = 12 * MiB + 512 * 1024  # four layers: 50 MiB of parameters


def _stale_gradients_sim(total_mib: int, *, grown: bool = False) -> Sim:
    """A loop that never calls zero_grad: step 0 makes four gradients, which the optimizer step
    uses and leaves alive; step 1's backward, accumulating into them, runs out on a new gradient
    of a layer's size beside them. The model states (parameters and gradients, 100 MiB) were all
    alive at the end of step 0, which fit. With `grown`, step 1's forward adds a fifth layer (its
    parameter made after step 0): the states judged were never alive together before."""
    sim = Sim(total_bytes=total_mib * MiB)
    for i in range(4):
        sim.alloc(LAYER, (), "parameter", f"body.{i}.weight")
    for step in range(2):
        sim.marker("forward", "start")
        if step == 1 and grown:
            sim.alloc(LAYER, (), "parameter", "body.4.weight")
        activations = [sim.alloc(MiB) for _ in range(2)]
        sim.marker("forward", "end")
        sim.marker("backward", "start")
        sim.free(activations[0])
        if step == 1:
            sim.oom(LAYER)
            break
        sim.free(activations[1])
        for i in range(4):
            sim.alloc(LAYER, (), "gradient", f"body.{i}.weight.grad")
        sim.marker("backward", "end")
        sim.marker("optimizer_step", "start")
        sim.marker("optimizer_step", "end")
    return sim


def test_stale_gradients_outrank_model_states_that_fit_in_an_earlier_step():
    """100 MiB of model states on a 104 MiB device are at least 95% of it, but they were all alive
    at the end of step 0 and the run went on: what the backward of step 1 cannot fit beside them is
    the gradients step 0 left alive (rehearsed, `gradients-kept-mlp-plain-sgd` on 102 to 104 MiB
    read model-states-too-large; with zero_grad(set_to_none=True) it ran on 102 MiB)."""
    result = analyse(_stale_gradients_sim(104).snapshot())
    assert result.verdict == "gradients-kept", (result.verdict, result.summary)
    assert "model-states-too-large" in {f.verdict for f in result.secondary}


def test_model_states_that_were_never_alive_together_before_stay_the_verdict():
    """The same run with a parameter added after step 0: 112.5 MiB of states on 104 MiB, never
    seen fitting: they are too large, stale gradients or not."""
    result = analyse(_stale_gradients_sim(104, grown=True).snapshot())
    assert result.verdict == "model-states-too-large", (result.verdict, result.summary)
    assert "gradients-kept" in {f.verdict for f in result.secondary}


def test_what_the_step_before_left_alive_does_not_explain_a_pass_whose_rest_lacks_more():
    """Batch 16, 16, then 32, whose second layer fails on a 120 MiB device with 16 MiB missing:
    step 1's logits (64 MiB, held by the loop's variable) cover that, but the rest of the pass,
    extrapolated from step 1's, needs 224 MiB more: freeing them only moves the OOM further into
    the pass. On a larger device, where the shortfall is more than they hold, it read as the larger
    pass's activations; so it must here (rehearsed, `activation-spike-gpt-longer-sequence` on 120
    and 125 MiB read unknown, and ran out on every device up to 162 MiB)."""
    sim = Sim(total_bytes=120 * MiB)
    sim.alloc(8 * MiB, SETUP_STACK)
    logits = _step(sim, 16, None)
    logits = _step(sim, 16, logits)
    _step(sim, 32, logits, oom=True)
    result = analyse(sim.snapshot(metadata=False))
    rest = result.what_if.rest_of_pass
    assert rest is not None and rest.extrapolated
    assert result.accounting.missing_bytes <= 64 * MiB
    assert result.verdict == "activation-spike", (result.verdict, result.summary)


class _KeptCache(Sim):
    def release_cache(self) -> None:  # cache the flush cannot return (blocks of split segments)
        pass


def _graphs_kept_in_pieces(piece_mib: float, oom_at: int) -> Sim:
    """A forward-only loop in grad mode (`total += loss`) over a 16 MiB model: each pass keeps its
    eight 4 MiB tensors (its graph) and frees a `piece_mib` temporary after its second, which stays
    cached, a piece; the fifth pass runs out on its tensor `oom_at` with 2 MiB free on the device
    and five pieces free, together more than the 4 MiB request, none large enough."""
    total = 16 + 4 * (32 + piece_mib) + 4 * oom_at + 2
    sim = _KeptCache(total_bytes=int(total * MiB))
    sim.alloc(16 * MiB, SETUP_STACK, component="parameter", name="w")
    for index in range(5):
        sim.marker("forward", "start")
        for op in range(8):
            if index == 4 and op == oom_at:
                sim.oom(4 * MiB, FORWARD_STACK)
                return sim
            sim.alloc(4 * MiB, FORWARD_STACK, component="activation")
            if op == 1:
                sim.free(sim.alloc(int(piece_mib * MiB), FORWARD_STACK))
        sim.marker("forward", "end")
    raise AssertionError("no OOM")


def _verdicts(sim: Sim) -> list[str]:
    result = analyse(sim.snapshot())
    assert result.fragmentation.would_fit_if_contiguous
    return [result.verdict, *(f.verdict for f in result.secondary)]


def test_graphs_kept_outrank_fragments_where_the_rest_of_the_pass_lacked_more_than_all_free_memory():
    """Cut short after four tensors, the pass still needed 16 MiB (the request among them), 2 MiB
    more than all the free memory (the headroom, pieces counted) had it been one block, with 15 MiB
    in pieces, material: a place for this request only moves the OOM on, and the
    graphs kept pass after pass are what filled the device (rehearsed, `inference-with-grad-cnn` on
    94 and 101 MiB read fragmentation, its expandable segments said not enough; with them it ran
    out again, under no_grad it ran to the end)."""
    assert _verdicts(_graphs_kept_in_pieces(3, oom_at=4))[:2] == ["inference-with-grad", "fragmentation"]


def test_graphs_kept_outrank_fragments_that_are_a_small_share_of_the_device():
    """Cut short at its last tensor, whose rest the pieces would hold: 6.25 MiB of pieces on a
    179 MiB device, under a twentieth of it, do not outrank the 128 MiB of graphs kept, as they do
    not outrank a leak."""
    assert _verdicts(_graphs_kept_in_pieces(1.25, oom_at=7))[:2] == ["inference-with-grad", "fragmentation"]


def test_fragments_that_held_the_rest_and_are_material_stay_first():
    assert _verdicts(_graphs_kept_in_pieces(3, oom_at=7))[:2] == ["fragmentation", "inference-with-grad"]


def _leak_in_pieces(kept_mib: int) -> Sim:
    """Each step's forward keeps a `kept_mib` tensor for good (a loss kept with its graph) and
    makes a 6 MiB activation its backward frees, which stays cached, a piece; step 4's forward runs
    out on a 10 MiB request with four pieces free (24 MiB, material), none large enough."""
    sim = _KeptCache(total_bytes=(8 + 5 * kept_mib + 24 + 2) * MiB)
    sim.alloc(8 * MiB, SETUP_STACK, "parameter", "model.weight")
    for step in range(5):
        sim.marker("forward", "start")
        sim.alloc(kept_mib * MiB, FORWARD_STACK)
        if step == 4:
            sim.oom(10 * MiB, FORWARD_STACK)
            return sim
        activation = sim.alloc(6 * MiB, FORWARD_STACK)
        sim.marker("forward", "end")
        sim.marker("backward", "start")
        sim.free(activation)
        sim.marker("backward", "end")
        sim.marker("optimizer_step", "start")
        sim.marker("optimizer_step", "end")
    raise AssertionError("no OOM")


def test_a_leak_that_keeps_more_each_step_than_all_the_pieces_outranks_them():
    """24 MiB kept per step, as much as all the free pieces: had they been one block, the next
    step's kept tensors would fill it, so a place for this request only moves the OOM to a later
    step, and expandable segments are not said to fit (rehearsed, `creeping-leak-gpt-adamw` on
    322 MiB, 20 MiB of pieces beside 42 MiB kept per step, read fragmentation and said expandable
    segments would fit; with them it ran out in the same step's forward)."""
    result = analyse(_leak_in_pieces(24).snapshot())
    assert result.fragmentation.would_fit_if_contiguous
    assert [result.verdict, *(f.verdict for f in result.secondary)][:2] == ["creeping-leak", "fragmentation"]
    assert next(r.would_fit_alone for r in result.recommendations if r.id == "expandable-segments") is None


def test_material_pieces_stay_first_beside_a_leak_that_keeps_less_each_step():
    result = analyse(_leak_in_pieces(4).snapshot())
    assert [result.verdict, *(f.verdict for f in result.secondary)][:2] == ["fragmentation", "creeping-leak"]


def test_gradients_kept_only_if_an_earlier_pass_was_a_step_are_not_promoted_over_what_holds(monkeypatch):
    # gradients an earlier pass of this step made (`from_passes`: micro-batches accumulate into
    # them, or that pass was a step of its own; the file cannot tell) are no excess that outranks
    # model states too large, even where the states fit in an earlier step
    from oomdoctor.analysis import verdicts
    from oomdoctor.analysis.results import Facts, Finding, Summary, SummaryKind
    from oomdoctor.vocabulary import Verdict

    monkeypatch.setattr(verdicts, "states_fit_earlier", lambda ctx: True)
    states = Finding(Verdict.MODEL_STATES_TOO_LARGE, 0.8, Summary(SummaryKind.MODEL_STATES_TOO_LARGE), ())
    hedged = Finding(
        Verdict.GRADIENTS_KEPT, 0.5, Summary(SummaryKind.GRADIENTS_KEPT, Facts.of(from_passes=8 * MiB)), ()
    )
    kept = Finding(Verdict.GRADIENTS_KEPT, 0.8, Summary(SummaryKind.GRADIENTS_KEPT, Facts.of(old=8 * MiB)), ())
    assert verdicts._excess_over_states([states, hedged], None) == [states, hedged]  # type: ignore[arg-type]
    assert verdicts._excess_over_states([states, kept], None) == [kept, states]  # type: ignore[arg-type]
