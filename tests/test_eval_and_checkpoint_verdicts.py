"""The two verdicts the field asks for most (issue 11): outputs kept across evaluation batches, and a
full state dict gathered on one device at checkpoint save; each with its negative."""

from __future__ import annotations

from oomdoctor.analysis import analyse
from oomdoctor.analysis.checkpointing import save_frame
from oomdoctor.analysis.results import Change, SummaryKind
from oomdoctor.model import Frame
from oomdoctor.views import phrasing
from tests.builders import FORWARD_STACK, SETUP_STACK, MiB, Sim

TORCH = "/usr/lib/python3/site-packages/torch"
BATCH_STACK = (Frame("eval.py", 30, "evaluate"),)
CAT_STACK = (Frame(f"{TORCH}/functional.py", 10, "cat"), Frame("eval.py", 36, "evaluate"))
SAVE_STACK = (
    Frame(f"{TORCH}/distributed/fsdp/_state_dict_utils.py", 700, "_full_post_state_dict_hook"),
    Frame(f"{TORCH}/nn/modules/module.py", 2200, "state_dict"),
    Frame("train.py", 90, "save_checkpoint"),
    Frame("train.py", 120, "main"),
)
BACKWARD_STACK = (Frame("", 0, "torch::autograd::Engine::evaluate_function(...)"),)
LOAD_STACK = (
    Frame(f"{TORCH}/nn/modules/module.py", 2500, "load_state_dict"),
    Frame("train.py", 80, "resume"),
)


def _verdicts(result) -> set[str]:
    return {result.verdict, *(f.verdict for f in result.secondary)}


def _eval_loop(sim: Sim, batches: int, *, keep: str) -> None:
    """`batches` evaluation passes of four 16 MiB intermediates and a 4 MiB output: under no_grad each
    intermediate is freed once used; `keep` is "outputs" (appended to a list on the device), "graph"
    (grad mode on: everything kept) or "none" (outputs moved to the CPU)."""
    for _ in range(batches):
        sim.alloc(4096, BATCH_STACK)  # the next batch
        previous = None
        for _ in range(4):
            address = sim.alloc(16 * MiB, FORWARD_STACK)
            if keep != "graph" and previous is not None:
                sim.free(previous)
            previous = address
        output = sim.alloc(4 * MiB, FORWARD_STACK)
        if keep != "graph" and previous is not None:
            sim.free(previous)
        if keep == "none":
            sim.free(output)


def _eval_sim(keep: str, total: int = 144 * MiB) -> Sim:
    sim = Sim(total_bytes=total)
    sim.alloc(32 * MiB, SETUP_STACK)  # the model
    _eval_loop(sim, 8, keep=keep)
    return sim


def test_outputs_kept_across_evaluation_batches_run_out_at_the_final_cat():
    sim = _eval_sim("outputs")
    sim.oom(32 * MiB, CAT_STACK)  # torch.cat of the eight kept outputs
    result = analyse(sim.snapshot(metadata=False))
    assert result.verdict == "eval-outputs-kept", [f.verdict for f in result.secondary]
    kept = next(e for e in result.evidence if e.kind == "kept-outputs")
    assert kept.bytes == 7 * (4 * MiB + 4096)  # the earlier passes' outputs and batches (the last is the target's)
    assert "pile up" in phrasing.summary(result.summary)
    recommendations = {r.id: r for r in result.recommendations}
    assert recommendations[Change.OUTPUTS_TO_CPU].estimated_saved_bytes == kept.bytes
    assert Change.SMALLER_BATCH not in recommendations  # a smaller batch keeps the same outputs


def test_an_evaluation_that_moves_its_outputs_to_the_cpu_is_not_accused():
    sim = _eval_sim("none", total=64 * MiB)
    sim.oom(48 * MiB, FORWARD_STACK)
    assert "eval-outputs-kept" not in _verdicts(analyse(sim.snapshot(metadata=False)))


def test_passes_that_keep_their_graphs_are_inference_with_grad_not_kept_outputs():
    sim = _eval_sim("graph", total=288 * MiB)
    sim.oom(64 * MiB, FORWARD_STACK)
    verdicts = _verdicts(analyse(sim.snapshot(metadata=False)))
    assert "inference-with-grad" in verdicts and "eval-outputs-kept" not in verdicts


def test_kept_outputs_without_an_oom_are_a_risk():
    sim = _eval_sim("outputs", total=1024 * MiB)
    result = analyse(sim.snapshot(metadata=False))
    assert result.verdict == "no-oom"
    finding = next(f for f in result.secondary if f.verdict == "eval-outputs-kept")
    assert finding.summary.kind == SummaryKind.EVAL_OUTPUTS_KEPT and finding.summary.facts.get("at")
    assert phrasing.summary(finding.summary).startswith("At the ")


def _sharded_run(sim: Sim) -> None:
    """This rank's shards (8 MiB of each 32 MiB parameter), then a training step's forward and backward."""
    for _ in range(4):
        sim.alloc(8 * MiB, SETUP_STACK)
    sim.free(sim.alloc(16 * MiB, FORWARD_STACK))
    sim.free(sim.alloc(16 * MiB, BACKWARD_STACK))


def test_a_full_state_dict_gathered_at_save_is_checkpoint_gather():
    sim = Sim(total_bytes=144 * MiB)
    _sharded_run(sim)
    for _ in range(3):
        sim.alloc(32 * MiB, SAVE_STACK)  # full parameters cloned into the state dict
    sim.oom(32 * MiB, SAVE_STACK)
    result = analyse(sim.snapshot(metadata=False))
    assert result.verdict == "checkpoint-gather", [f.verdict for f in result.secondary]
    facts = result.summary.facts
    assert facts.get("function") == "save_checkpoint" and facts.get("parameters") == 32 * MiB
    assert facts.get("ratio") == 4.0  # 96 MiB held + 32 MiB asked for, against 32 MiB of shards
    assert "gathered on one GPU" in phrasing.summary(result.summary)
    saving = {r.id: r for r in result.recommendations}[Change.STATE_DICT_TO_CPU]
    assert saving.estimated_saved_bytes == 96 * MiB and saving.would_fit_alone


def test_a_save_that_gathers_to_the_cpu_is_not_accused():
    """With offload_to_cpu only one unit is unsharded on the device at a time: an OOM in the next
    forward is no checkpoint's."""
    sim = Sim(total_bytes=96 * MiB)
    _sharded_run(sim)
    for _ in range(4):
        sim.free(sim.alloc(32 * MiB, SAVE_STACK))  # unsharded, copied to the CPU, resharded
    for _ in range(2):
        sim.alloc(24 * MiB, FORWARD_STACK)
    sim.oom(48 * MiB, FORWARD_STACK)
    assert "checkpoint-gather" not in _verdicts(analyse(sim.snapshot(metadata=False)))


def test_a_state_dict_held_at_the_peak_without_an_oom_is_a_risk():
    sim = Sim()
    _sharded_run(sim)
    for _ in range(4):
        sim.alloc(32 * MiB, SAVE_STACK)
    result = analyse(sim.snapshot(metadata=False))
    finding = next(f for f in result.secondary if f.verdict == "checkpoint-gather")
    assert finding.summary.facts.get("at") and finding.confidence < 0.6


def test_save_frames():
    assert save_frame(SAVE_STACK).name == "save_checkpoint"  # the outermost saving frame
    assert save_frame(LOAD_STACK) is None  # loading a checkpoint is no save
    assert save_frame((*SAVE_STACK[:2], *LOAD_STACK)) is None
    assert save_frame((Frame(f"{TORCH}/distributed/checkpoint/state_dict_saver.py", 1, "_save_state_dict"),))
    assert save_frame((Frame("deepspeed/runtime/engine.py", 1, "_zero3_consolidated_16bit_state_dict"),))
    assert save_frame((Frame("transformers/trainer.py", 1, "save_pretrained"),))
    assert save_frame((Frame("transformers/modeling_utils.py", 1, "from_pretrained"),)) is None
    assert save_frame((Frame("model.py", 1, "save_for_backward"),)) is None
    assert save_frame((Frame(f"{TORCH}/utils/checkpoint.py", 1, "checkpoint"),)) is None  # activation checkpointing
    assert save_frame((Frame("lightning/pytorch/trainer/connectors/checkpoint_connector.py", 1, "dump_checkpoint"),))
    assert save_frame(FORWARD_STACK) is None


def test_a_hook_that_saves_outputs_is_no_checkpoint_save():
    """'save' alone is as often a forward hook's (`save_output`, `save_activation`, pytorch-grad-cam's
    `save_gradient`) as a checkpoint's: a save counts when it names what a checkpoint holds."""
    for hook in ("save_output", "save_activation", "save_features", "save_gradient", "save_image"):
        assert save_frame((Frame("extract.py", 12, hook), *FORWARD_STACK)) is None, hook
    for saver in ("save_model", "save_state", "save_weights", "_save_checkpoint", "save_ckpt"):
        assert save_frame((Frame("train.py", 12, saver),)) is not None, saver


def _eval_loop_with_wide_outputs(tensors_kept: int) -> object:
    """Evaluation passes (plain snapshot, frames only) whose kept share is above a quarter: a narrow
    model with a large vocabulary frees 21 MiB of intermediates a pass and keeps 8 MiB, in
    `tensors_kept` tensors (1: the logits, under no_grad; many: a graph, saved at every layer). The
    sixth pass's concatenation runs out."""
    layer = (
        Frame("/usr/lib/python3/site-packages/torch/nn/functional.py", 100, "linear"),
        Frame("model.py", 30, "forward"),
        Frame("/usr/lib/python3/site-packages/torch/nn/modules/module.py", 1751, "_call_impl"),
        Frame("train.py", 60, "evaluate"),
    )
    loop = (Frame("train.py", 58, "evaluate"),)
    sim = Sim(total_bytes=128 * MiB)
    sim.alloc(10 * MiB, SETUP_STACK)
    for _batch in range(6):
        sim.alloc(64 * 1024, loop)  # the batch
        for _ in range(7):
            sim.free(sim.alloc(3 * MiB, layer))  # intermediates freed once used
        for _ in range(tensors_kept):
            sim.alloc(8 * MiB // tensors_kept, layer)
    sim.oom(48 * MiB, (Frame("train.py", 64, "evaluate"),))  # torch.cat of the kept logits
    return sim.snapshot(metadata=False)


def test_outputs_above_a_quarter_of_each_pass_are_outputs_when_few_tensors_hold_them():
    result = analyse(_eval_loop_with_wide_outputs(1))
    assert result.verdict == "eval-outputs-kept", result.summary
    assert "inference-with-grad" not in {f.verdict for f in result.secondary}
    assert all(r.id != "no-grad" for r in result.recommendations)


def test_the_same_bytes_in_a_tensor_per_layer_are_graphs():
    result = analyse(_eval_loop_with_wide_outputs(8))
    assert result.verdict == "inference-with-grad", result.summary
