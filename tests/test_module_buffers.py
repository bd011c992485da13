"""Buffers that Module._apply moved (`.cuda()`, `.to()`, `.half()`) are buffers, not parameters.

Module._apply converts a module's parameters, then their gradients, then its buffers, each loop at
its own line of torch/nn/modules/module.py, the buffers' last; the line numbers differ between torch
versions, the order does not. Without oomdoctor's registry every block a `.cuda()` call made was
read as a parameter: BatchNorm's running statistics and step counts, a quantised model's int8
weights and their scales held as buffers (GPTQ-style `register_buffer`), rotary tables. The lines a
dump's blocks were converted at say which loop made each (`attribution.apply_buffer_line`).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from oomdoctor.analysis import analyse
from oomdoctor.analysis.attribution import apply_buffer_line
from oomdoctor.model import Frame
from tests.builders import FORWARD_STACK, MiB, Sim

MODULE = "/usr/lib/python3/site-packages/torch/nn/modules/module.py"


def _moved(line: int, depth: int = 1, caller: str = "main") -> tuple[Frame, ...]:
    """The stack of a tensor `.cuda()` converted at `line` of Module._apply, `depth` modules down."""
    return (
        Frame(MODULE, 1340, "<lambda>"),
        Frame(MODULE, line, "_apply"),
        *[Frame(MODULE, 900, "_apply")] * depth,
        Frame(MODULE, 1090, "cuda"),
        Frame("serve.py", 20, caller),
    )


def _components(sim: Sim) -> dict[str, int]:
    return analyse(sim.snapshot(metadata=False)).component_bytes()


def test_what_apply_converts_in_its_buffers_loop_is_buffers():
    """A model of int8 weights held as buffers beside their float biases, moved by `.cuda()` with
    recording on: the weights were read as parameters (the whole call is module setup)."""
    sim = Sim()
    sim.start_recording()
    for _ in range(4):
        sim.alloc(4096, _moved(925))  # the biases: parameters
        sim.alloc(4 * MiB, _moved(960))  # the int8 weights: buffers
        sim.alloc(4096, _moved(960))  # their scales
    sim.free(sim.alloc(8 * MiB, FORWARD_STACK))
    components = _components(sim)
    assert components["buffers"] == 4 * (4 * MiB + 4096)
    assert components["parameters"] == 4 * 4096


def test_a_buffer_from_before_the_trace_is_read_by_its_own_frames_so_too():
    sim = Sim()
    for _ in range(4):
        sim.alloc(2 * MiB, _moved(925))
        sim.alloc(MiB, _moved(960, depth=2))
    sim.start_recording()
    sim.free(sim.alloc(8 * MiB, FORWARD_STACK))
    components = _components(sim)
    assert components["buffers"] == 4 * MiB
    assert components["parameters"] == 8 * MiB


def test_lines_the_blocks_do_not_tell_apart_are_left_as_they_were():
    # one line only: parameters, or buffers alone, nothing says
    assert apply_buffer_line([(_moved(925), 4096), (_moved(925), MiB)]) is None
    # two lines, the later of the earlier's sizes only: the parameters' gradients may be what it moved
    assert apply_buffer_line([(_moved(925), 4096), (_moved(925), MiB), (_moved(940), MiB)]) is None
    # two lines that no one conversion shares (a setup, then an offload hook's `.to()` elsewhere)
    assert apply_buffer_line([(_moved(925), MiB), (_moved(960, caller="pre_forward"), 4096)]) is None
    # three lines (parameters, gradients, buffers): the last
    made = [(_moved(925), MiB), (_moved(940), MiB), (_moved(960), MiB)]
    assert apply_buffer_line(made) == 960
    # two, the later with a size of its own
    assert apply_buffer_line([(_moved(925), MiB), (_moved(960), 8)]) == 960


QUANTISED_SCRIPT = textwrap.dedent(
    """
    import oomdoctor
    oomdoctor.install()
    import torch
    import torch.nn as nn

    class QuantLinear(nn.Module):  # GPTQ-style: int8 weights and their scales held as buffers
        def __init__(self, n_in, n_out):
            super().__init__()
            self.register_buffer("qweight", torch.randint(-128, 127, (n_out, n_in), dtype=torch.int8))
            self.register_buffer("scales", torch.rand(n_out))
            self.bias = nn.Parameter(torch.zeros(n_out))

        def forward(self, x):
            return x @ (self.qweight.float() * self.scales[:, None]).t() + self.bias

    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(256, 1024), nn.BatchNorm1d(1024), nn.ReLU(),
        QuantLinear(1024, 1024), nn.BatchNorm1d(1024), nn.ReLU(),
        QuantLinear(1024, 1024), nn.BatchNorm1d(1024), nn.ReLU(),
        nn.Linear(1024, 10),
    ).eval()
    model._apply(lambda t: t.clone())  # what .cuda() runs (on the CPU a rehearsal's device is, .cuda() cannot)
    with torch.no_grad():
        for _ in range(3):
            model(torch.randn(64, 256))
    oomdoctor.dump()
    """
)


def test_a_quantised_model_s_buffers_moved_by_cuda_are_buffers_rehearsed(tmp_path: Path):
    """Rehearsed with torch's own Module._apply, judged against the registry in the same dump."""
    pytest.importorskip("torch")
    from oomdoctor.load import load
    from oomdoctor.rehearse.session import RehearsalConfig, rehearse_script
    from tests.conftest import fixture_module

    strip = fixture_module("strip")
    script = tmp_path / "serve.py"
    script.write_text(QUANTISED_SCRIPT)
    out = tmp_path / "out"
    result = rehearse_script(script, [], RehearsalConfig(device_memory_bytes=512 * MiB), dump_dir=out)
    assert result.exit_code == 0, result.error_text
    (dump,) = sorted(out.glob("*.pickle"))
    registry = {t["address"]: t["component"] for t in strip.read_snapshot(dump)["oomdoctor"]["tensors"]}
    analysis = analyse(load(strip.stripped_bytes(dump)))
    read = {b.address: b.component for b in analysis.live_blocks}
    buffers = {address for address, component in registry.items() if component == "buffer"}
    parameters = {address for address, component in registry.items() if component == "parameter"}
    assert len(buffers) >= 4 * 3  # the case is what it says: int8 weights, scales, BatchNorm's statistics
    assert {read.get(address) for address in buffers} == {"buffers"}
    assert {read.get(address) for address in parameters} == {"parameters"}
