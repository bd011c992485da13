"""Cases a review built against this round's rules (each failed on the rule's first form)."""

from __future__ import annotations

from pathlib import Path

from oomdoctor.analysis import analyse
from oomdoctor.load import load
from oomdoctor.model import Frame
from tests.builders import FORWARD_STACK, SETUP_STACK, GiB, MiB, Sim

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "dumps"
TORCH = "/usr/lib/python3/site-packages/torch/"


def test_a_spike_whose_failed_request_is_the_growth_is_still_a_spike():
    """Steps 0 and 1 fit with 500 MiB of activations; step 2 has made 480 MiB when its next 200 MiB
    activation fails: counting the request, the pass needs more than the earlier steps did."""
    sim = Sim(total_bytes=1 * GiB)
    for i in range(7):
        sim.alloc(50 * MiB, SETUP_STACK, "parameter", f"w{i}")
    for _ in range(2):
        sim.marker("forward", "start")
        acts = [sim.alloc(50 * MiB, FORWARD_STACK) for _ in range(10)]
        sim.marker("forward", "end")
        sim.marker("backward", "start")
        for block in acts:
            sim.free(block)
        sim.marker("backward", "end")
        sim.marker("optimizer_step", "start")
        sim.marker("optimizer_step", "end")
    sim.marker("forward", "start")
    for _ in range(8):
        sim.alloc(60 * MiB, FORWARD_STACK)
    sim.oom(200 * MiB, FORWARD_STACK)
    assert analyse(sim.snapshot()).verdict == "activation-spike"


def test_a_first_training_step_may_call_its_model_any_number_of_times():
    """Six crops inside Lightning's training_step before its one backward (DINO-style): the frames
    show a training step, so their graphs await its backward, not 'inference with grad'."""
    step = (
        Frame(TORCH + "nn/functional.py", 100, "linear"),
        Frame("model.py", 12, "forward"),
        Frame(TORCH + "nn/modules/module.py", 1751, "_wrapped_call_impl"),
        Frame("dino_module.py", 40, "training_step"),
    )
    sim = Sim(total_bytes=1 * GiB)
    for i in range(4):
        sim.alloc(25 * MiB, SETUP_STACK, "parameter", f"w{i}")
    for crop in range(6):
        sim.marker("forward", "start")
        for _ in range(3):
            sim.alloc(50 * MiB, step)
        if crop < 5:
            sim.marker("forward", "end")
    sim.oom(100 * MiB, step)
    analysis = analyse(sim.snapshot())
    assert "inference-with-grad" not in {analysis.verdict, *(f.verdict for f in analysis.secondary)}
    assert "no-grad" not in {r.id for r in analysis.recommendations}


def test_no_grad_fits_where_freeing_the_kept_graphs_leaves_a_place():
    for name in ("inference-with-grad-gpt.pickle", "inference-with-grad-cnn.pickle"):
        analysis = analyse(load(FIXTURES / name))
        assert {r.id: r.would_fit_alone for r in analysis.recommendations}["no-grad"] is True, name


def test_a_tied_embedding_loaded_with_the_layers_is_a_weight_not_an_input():
    """GPT-2-small's weights put on the GPU by code that names nothing, the token embedding first:
    a single tensor of the model's width made among the layers' weights is a weight; the batch's
    token ids, made after them, stay the input."""
    load_stack = (Frame("run.py", 10, "main"),)
    width = 768
    sim = Sim(total_bytes=2 * GiB)
    wte = sim.alloc(4 * 50257 * width, load_stack)
    for _ in range(12):
        for n in (width, width, width * 3 * width, 3 * width, width * width, width, width, width * 4 * width):
            sim.alloc(4 * n, load_stack)
    batch = sim.alloc(4 * 8 * 1024, load_stack)
    sim.marker("forward", "start")
    for _ in range(20):
        sim.alloc(48 * MiB, FORWARD_STACK)
    sim.oom(600 * MiB, FORWARD_STACK)
    analysis = analyse(sim.snapshot(registry=False))
    component = {b.address: b.component for b in analysis.live_blocks}
    assert component[wte] == "parameters"
    assert component[batch] == "inputs"
