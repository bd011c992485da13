"""A history recorded with context="state" (the legacy `_record_memory_history(True, ...)`'s default)
keeps no stack on its trace entries, while the dump's blocks keep the stack they were made with.
An allocation the trace shows and that is still that block at the dump is placed by the block's
stack; with no phases at all, activations that fill memory are still said to, at a low confidence."""

from __future__ import annotations

from dataclasses import replace

from oomdoctor.analysis import analyse
from oomdoctor.model import NO_STACK
from oomdoctor.views import phrasing
from tests.builders import FORWARD_STACK, SETUP_STACK, GiB, MiB, Sim


def _forward_oom(*, stacks_on_trace: bool):
    sim = Sim(total_bytes=4 * GiB)
    for _ in range(4):
        sim.alloc(64 * MiB, SETUP_STACK)
    for _ in range(12):
        sim.alloc(256 * MiB, FORWARD_STACK)
    sim.oom(1 * GiB, FORWARD_STACK)
    if not stacks_on_trace:
        sim.events = [replace(e, frames=NO_STACK) for e in sim.events]
    return analyse(sim.snapshot(metadata=False))


def test_blocks_keep_the_stack_the_trace_did_not_record():
    analysis = _forward_oom(stacks_on_trace=False)
    assert analysis.target_phase == "unknown"
    components = {c.name: c.bytes for c in analysis.components if c.bytes}
    assert components.get("activations") == 12 * 256 * MiB
    assert components.get("parameters") == 4 * 64 * MiB
    assert analysis.verdict == "activation-spike"
    assert analysis.confidence == 0.4
    assert "placed by their blocks' own stacks" in phrasing.summary(analysis.summary)


def test_with_stacks_on_the_trace_the_phase_decides_as_before():
    analysis = _forward_oom(stacks_on_trace=True)
    assert analysis.target_phase == "forward"
    assert analysis.verdict == "activation-spike" and analysis.confidence == 0.6
