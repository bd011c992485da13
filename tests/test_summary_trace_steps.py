"""A verdict's story names the trace's steps as the trace's where steps may have run before it.

The DDP MLP of this audit recorded from its second step on (stop_memory_history at setup,
start_memory_history in step 1) ran out in the run's step 2: the header said 'step 1 of the
trace', the headline 'Activations of step 1's forward reached 80.00 MiB', a step of the run that
fit. The story now adds that its steps are counted from the trace's start.
"""

from oomdoctor.analysis import analyse
from oomdoctor.analysis.results import Facts, Summary, SummaryKind
from oomdoctor.views import phrasing
from tests.builders import BACKWARD_STACK, FOREACH_STACK, FORWARD_STACK, SETUP_STACK, GiB, MiB, Sim

QUALIFIER = "Steps are counted from the trace's start"


def _late_spike() -> Sim:
    sim = Sim(total_bytes=4 * GiB)
    for _ in range(4):
        sim.alloc(64 * MiB, SETUP_STACK)
    sim.start_recording()  # the model exists; recording begins in a later step
    for _ in range(2):
        activations = [sim.alloc(8 * MiB, FORWARD_STACK) for _ in range(2)]
        gradients = [sim.alloc(64 * MiB, BACKWARD_STACK) for _ in range(4)]
        for block in activations:
            sim.free(block)
        sim.free(sim.alloc(64 * MiB, FOREACH_STACK))
        for block in gradients:
            sim.free(block)
    for _ in range(40):
        sim.alloc(64 * MiB, FORWARD_STACK)
    sim.oom(64 * MiB, FORWARD_STACK)
    return sim


def test_a_story_naming_a_step_of_a_late_trace_says_whose_step_it_is():
    analysis = analyse(_late_spike().snapshot(metadata=False))
    assert analysis.verdict == "activation-spike"
    assert QUALIFIER in phrasing.summary(analysis.summary)


def test_a_story_without_a_step_or_of_a_whole_trace_is_as_before():
    spike = Facts.of(step=2, phase="forward", activations=GiB, ratio=3.0, earlier_step=1)
    assert QUALIFIER not in phrasing.summary(Summary(SummaryKind.ACTIVATION_SPIKE, spike))
    frag = Facts.of(usable=9 * MiB, request=4 * MiB, largest=2 * MiB, trace_steps=1)
    assert QUALIFIER not in phrasing.summary(Summary(SummaryKind.FRAGMENTATION, frag))
