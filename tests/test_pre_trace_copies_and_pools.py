"""Memory made before recording began that is no parameter, rehearsed: runs shaped like the plain
snapshots people attach (recording started once the model, its cache or its copies existed), analysed
stripped of oomdoctor's metadata and judged against the registry the same dump holds.

* An inference loop whose KV cache was allocated up front, one very large block a layer (as vLLM's
  cache engine does): the cache is no parameter.
* The same cache beside a model being trained (verl-style colocated actor and inference engine),
  recording begun after the first AdamW step: no parameter nor optimizer state either.
* Training with an EMA of the model and gradients kept across steps (`zero_grad(set_to_none=False)`),
  recording begun after the first AdamW step: five frame-less copies of every shape, of which one
  is the EMA's, a copy of the parameters, not more optimizer state or gradients.
* Training with an 8-bit Adam (bitsandbytes-style: each moment one byte an element), recording begun
  after its first step: the moments, two blocks of a quarter of each fp32 weight's bytes, are
  optimizer state, not parameters.
"""

from __future__ import annotations

import textwrap
from collections import Counter
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from oomdoctor.analysis import analyse  # noqa: E402
from oomdoctor.load import load  # noqa: E402
from oomdoctor.rehearse.session import RehearsalConfig, rehearse_script  # noqa: E402
from tests.conftest import fixture_module  # noqa: E402

MiB = 1 << 20
strip = fixture_module("strip")

# Recording stops before setup (around capture's watch of _record_memory_history, which would start
# it again at once) and starts again once the setup is done: what setup made has no stack.
_STOP_RECORDING = """
    record = torch.cuda.memory._record_memory_history
    getattr(record, "__wrapped__", record)(enabled=None)
"""
_START_RECORDING = """
    torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks="python", max_entries=100000)
"""

KV_CACHE_SCRIPT = textwrap.dedent(
    """
    import oomdoctor
    oomdoctor.install()
    import torch
    import torch.nn as nn
    """
    + _STOP_RECORDING
    + """
    torch.manual_seed(0)
    width, layers, vocab, batch, max_len = 256, 4, 512, 8, 4096

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
            self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
            self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

        def forward(self, x, cache, start):
            q, k, v = self.qkv(self.norm1(x)).split(width, dim=-1)
            end = start + x.shape[1]
            cache[0, :, start:end] = k
            cache[1, :, start:end] = v
            att = torch.softmax(q @ cache[0, :, :end].transpose(1, 2) / width**0.5, dim=-1)
            x = x + self.proj(att @ cache[1, :, :end])
            return x + self.down(torch.relu(self.up(self.norm2(x))))

    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(vocab, width)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.norm = nn.LayerNorm(width)
            self.head = nn.Linear(width, vocab, bias=False)

        def forward(self, tokens, caches, start):
            x = self.embed(tokens)
            for block, cache in zip(self.blocks, caches):
                x = block(x, cache, start)
            return self.head(self.norm(x))

    model = LM().eval()
    caches = [torch.zeros(2, batch, max_len, width) for _ in range(layers)]
    """
    + _START_RECORDING
    + """
    with torch.no_grad():
        logits = model(torch.randint(vocab, (batch, 32)), caches, 0)
        for position in range(32, 40):
            logits = model(logits[:, -1:].argmax(-1), caches, position)
    oomdoctor.dump()
    """
)

EMA_SCRIPT = textwrap.dedent(
    """
    import copy
    import oomdoctor
    oomdoctor.install()
    import torch
    import torch.nn as nn
    """
    + _STOP_RECORDING
    + """
    torch.manual_seed(0)
    layers = [nn.Linear(128, 512), nn.GELU()]
    for _ in range(4):
        layers += [nn.Linear(512, 512), nn.LayerNorm(512), nn.GELU()]
    model = nn.Sequential(*layers, nn.Linear(512, 10))
    ema = copy.deepcopy(model).requires_grad_(False)
    optimizer = torch.optim.AdamW(model.parameters(), foreach=True)
    for step in range(3):
        if step == 1:
            torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks="python", max_entries=100000)
        loss = nn.functional.cross_entropy(model(torch.randn(64, 128)), torch.randint(10, (64,)))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)
        with torch.no_grad():
            for e, p in zip(ema.parameters(), model.parameters()):
                e.lerp_(p, 0.01)
    oomdoctor.dump()
    """
)


EIGHT_BIT_SCRIPT = textwrap.dedent(
    """
    import oomdoctor
    oomdoctor.install()
    import torch
    import torch.nn as nn
    """
    + _STOP_RECORDING
    + """
    BLOCK = 256

    class Adam8bit(torch.optim.Optimizer):
        # bitsandbytes-style: each moment one byte an element, with a scale per block of 256
        def __init__(self, params, lr=1e-3):
            super().__init__(params, dict(lr=lr))

        @torch.no_grad()
        def step(self):
            for group in self.param_groups:
                for p in group["params"]:
                    state = self.state[p]
                    if not state:
                        n = p.numel()
                        state["state1"] = torch.zeros(n, dtype=torch.uint8)
                        state["state2"] = torch.zeros(n, dtype=torch.uint8)
                        state["absmax1"] = torch.zeros((n + BLOCK - 1) // BLOCK)
                        state["absmax2"] = torch.zeros((n + BLOCK - 1) // BLOCK)
                    m = state["state1"].float().mul_(0.9).add_(p.grad.flatten(), alpha=0.1)
                    state["state1"].copy_(m.clamp(0, 255).to(torch.uint8))
                    p.add_(m.view_as(p), alpha=-group["lr"])

    torch.manual_seed(0)
    layers = [nn.Linear(128, 512), nn.GELU()]
    for _ in range(4):
        layers += [nn.Linear(512, 512), nn.LayerNorm(512), nn.GELU()]
    model = nn.Sequential(*layers, nn.Linear(512, 10))
    optimizer = Adam8bit(model.parameters())
    for step in range(3):
        if step == 1:
            torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks="python", max_entries=100000)
        loss = nn.functional.cross_entropy(model(torch.randn(64, 128)), torch.randint(10, (64,)))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    oomdoctor.dump()
    """
)


COLOCATED_SCRIPT = textwrap.dedent(
    """
    import oomdoctor
    oomdoctor.install()
    import torch
    import torch.nn as nn
    """
    + _STOP_RECORDING
    + """
    torch.manual_seed(0)
    layers = [nn.Linear(128, 512), nn.GELU()]
    for _ in range(4):
        layers += [nn.Linear(512, 512), nn.LayerNorm(512), nn.GELU()]
    model = nn.Sequential(*layers, nn.Linear(512, 10))
    optimizer = torch.optim.AdamW(model.parameters(), foreach=True)
    cache = [torch.zeros(2, 8, 1024, 512) for _ in range(3)]  # an inference engine's KV cache beside the actor
    for step in range(3):
        if step == 1:
            torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks="python", max_entries=100000)
        loss = nn.functional.cross_entropy(model(torch.randn(64, 128)), torch.randint(10, (64,)))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    oomdoctor.dump()
    """
)


def _rehearse(tmp_path: Path, script: str):
    """(analysis of the stripped dump, the registry's component of each address, each address's
    bytes among the dump's allocated blocks)."""
    path = tmp_path / "run.py"
    path.write_text(script)
    out = tmp_path / "out"
    result = rehearse_script(path, [], RehearsalConfig(device_memory_bytes=2048 * MiB), dump_dir=out)
    assert result.exit_code == 0, result.error_text
    (dump,) = sorted(out.glob("*.pickle"))
    raw = strip.read_snapshot(dump)
    registry = {tensor["address"]: tensor["component"] for tensor in raw["oomdoctor"]["tensors"]}
    return analyse(load(strip.stripped_bytes(dump))), registry


def _before_trace(analysis, registry) -> Counter[tuple[str, str | None]]:
    """Bytes of the blocks made before the trace, by (component read, the registry's component)."""
    found: Counter[tuple[str, str | None]] = Counter()
    for block in analysis.live_blocks:
        if block.alloc_index is None:
            found[block.component, registry.get(block.address)] += block.size_bytes
    return found


def test_a_kv_cache_allocated_before_the_trace_is_no_parameter(tmp_path):
    analysis, registry = _rehearse(tmp_path, KV_CACHE_SCRIPT)
    found = _before_trace(analysis, registry)
    cache = sum(size for (_, truth), size in found.items() if truth != "parameter")
    assert cache >= 4 * 64 * MiB  # the case is what it says: four 64 MiB blocks beside the weights
    assert found["parameters", "parameter"] == sum(size for (_, truth), size in found.items() if truth == "parameter")
    wrong = {key: size for key, size in found.items() if key[0] == "parameters" and key[1] != "parameter"}
    assert not wrong, wrong


def test_an_ema_copy_beside_kept_gradients_and_adam_state_is_a_copy_of_the_parameters(tmp_path):
    analysis, registry = _rehearse(tmp_path, EMA_SCRIPT)
    found = _before_trace(analysis, registry)
    by_truth: Counter[str | None] = Counter()
    by_reading: Counter[str] = Counter()
    for (component, truth), size in found.items():
        by_truth[truth] += size
        by_reading[component] += size
    assert by_truth[None] == by_truth["parameter"] > 0  # the EMA: no registry entry, one copy of the weights
    # which copy of a shape is the model nothing says: the bytes of each kind are what can be judged
    assert by_reading["parameters"] == by_truth["parameter"] + by_truth[None]
    assert by_reading["gradients"] == by_truth["gradient"]
    assert by_reading["optimizer_state"] == by_truth["optimizer_state"]


def test_moments_of_an_8_bit_optimizer_from_before_the_trace_are_optimizer_state(tmp_path):
    analysis, registry = _rehearse(tmp_path, EIGHT_BIT_SCRIPT)
    found = _before_trace(analysis, registry)
    by_truth: Counter[str | None] = Counter()
    by_reading: Counter[str] = Counter()
    for (component, truth), size in found.items():
        by_truth[truth] += size
        by_reading[component] += size
    assert by_truth["optimizer_state"] > 0  # the case is what it says
    # a block of a moment and one of a weight may have the same bytes (a 512 x 512 moment and the
    # 128 x 512 fp32 input layer), so the bytes of each kind are judged, within the per-block scales
    for kind, truth in (("parameters", "parameter"), ("optimizer_state", "optimizer_state")):
        assert abs(by_reading[kind] - by_truth[truth]) <= 0.05 * by_truth[truth], (kind, by_reading, by_truth)


def test_a_kv_cache_beside_a_model_being_trained_is_no_model_state(tmp_path):
    analysis, registry = _rehearse(tmp_path, COLOCATED_SCRIPT)
    found = _before_trace(analysis, registry)
    assert sum(size for (_, truth), size in found.items() if truth is None) >= 3 * 32 * MiB
    wrong = {
        key: size
        for key, size in found.items()
        if key[0] in ("parameters", "gradients", "optimizer_state") and key[1] is None
    }
    assert not wrong, wrong
    for component, truth in (("parameters", "parameter"), ("optimizer_state", "optimizer_state")):
        assert found[component, truth] == sum(size for (_, t), size in found.items() if t == truth)
