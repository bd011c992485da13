"""The phase recorder's hot paths: nested module calls pass through in torch's own way (no extra
frame), and modules and optimizers seen before are found again by id without keeping them alive."""

from __future__ import annotations

import gc
import traceback
import weakref

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from oomdoctor.capture import markers as markers_module  # noqa: E402
from oomdoctor.capture.markers import PhaseRecorder  # noqa: E402


@pytest.fixture
def recorder():
    installed = PhaseRecorder()
    installed.install()
    yield installed
    installed.uninstall()


class Inner(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stacks: list[list[str]] = []

    def forward(self, x):
        self.stacks.append([frame.name for frame in traceback.extract_stack()])
        return x + 1


class Outer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = Inner()

    def forward(self, x):
        return self.inner(x) * 2


def test_torch_call_impl_is_recognized_and_a_lookalike_is_not():
    assert markers_module._is_torch_call_impl(nn.Module.__dict__["__call__"])

    def _wrapped_call_impl(self, *args, **kwargs):
        return self._call_impl(*args, **kwargs)

    assert not markers_module._is_torch_call_impl(_wrapped_call_impl)
    assert not markers_module._is_torch_call_impl(print)


def test_nested_module_calls_take_no_extra_frame(recorder):
    model = Outer()
    assert torch.equal(model(torch.zeros(2)), torch.full((2,), 2.0))
    (stack,) = model.inner.stacks
    # outermost: the wrapper, then torch's own pair; nested: the wrapper in place of
    # _wrapped_call_impl, then _call_impl as without oomdoctor
    assert stack.count("module_call") == 2
    assert stack.count("_wrapped_call_impl") == 1 and stack.count("_call_impl") == 2
    phases = [(phase, edge) for phase, edge, _, _ in recorder.markers]
    assert phases == [("forward", "start"), ("forward", "end")]
    recorder.uninstall()
    assert nn.Module.__dict__["__call__"] is nn.Module._wrapped_call_impl
    model(torch.zeros(2))
    assert model.inner.stacks[-1].count("module_call") == 0


def test_a_nested_module_with_a_compiled_call_uses_it(recorder):
    model = Outer()
    calls = []

    def compiled_call(*args, **kwargs):
        calls.append((args, kwargs))
        return torch.ones(2)

    model.inner._compiled_call_impl = compiled_call  # what Module.compile() sets
    assert torch.equal(model(torch.zeros(2)), torch.full((2,), 2.0))
    assert len(calls) == 1 and model.inner.stacks == []


def test_someone_elses_call_wrapper_is_still_called_for_nested_modules():
    torch_call = nn.Module.__dict__["__call__"]
    seen = []

    def theirs(module, *args, **kwargs):
        seen.append(type(module).__name__)
        return torch_call(module, *args, **kwargs)

    nn.Module.__call__ = theirs
    recorder = PhaseRecorder()
    try:
        recorder.install()
        Outer()(torch.zeros(2))
        recorder.uninstall()
        assert nn.Module.__dict__["__call__"] is theirs
    finally:
        recorder.uninstall()
        nn.Module.__call__ = torch_call
    assert seen == ["Outer", "Inner"]
    assert [edge for _, edge, _, _ in recorder.markers] == ["start", "end"]


def test_root_modules_are_found_again_and_forgotten_when_they_die(recorder):
    model = Outer()
    first = torch.zeros(2)
    model(first)
    model(torch.ones(2))  # the latest call replaces the inputs; the module is registered once
    assert list(recorder.root_modules) == [model]
    ((module, records),) = recorder.input_records()
    assert module is model and [place for place, _ in records] == [("arg", 0, None)]
    assert records[0][1]() is None  # the latest call's tensor, which is gone; not `first`
    alive = weakref.ref(model)
    del model, module, records
    gc.collect()
    assert alive() is None
    assert recorder._roots_by_id == {} and recorder.input_records() == []
    replacement = Outer()  # may even reuse the id
    replacement(first)
    ((module, records),) = recorder.input_records()
    assert module is replacement and records[0][1]() is first


def test_optimizer_steps_are_counted_per_optimizer_and_forgotten_when_it_dies(recorder):
    weights = [nn.Parameter(torch.zeros(1))]
    first = torch.optim.SGD(weights, lr=0.1)
    second = torch.optim.SGD(weights, lr=0.1)
    for _ in range(3):
        first.step()
    second.step()
    assert recorder.step == 3  # the largest count of a single optimizer, not the sum
    assert set(recorder.optimizers) == {first, second}
    alive = weakref.ref(first)
    del first
    gc.collect()
    assert alive() is None and len(recorder._optimizers_by_id) == 1
    second.step()
    assert recorder.step == 3
    phases = [phase for phase, _, _, _ in recorder.markers]
    assert phases == ["optimizer_step"] * 10


def _phases(recorder):
    return [(phase, edge, step) for phase, edge, step, _ in recorder.markers]


def _closure_step(model, optimizer, by_position=False):
    def closure():
        optimizer.zero_grad()
        loss = model(torch.ones(2, 4)).sum()
        loss.backward()
        return loss

    return optimizer.step(closure) if by_position else optimizer.step(closure=closure)


@pytest.mark.parametrize("by_position", [False, True], ids=["keyword", "positional"])
def test_a_closure_step_records_forward_and_backward_before_the_optimizer_step(recorder, by_position):
    """PyTorch Lightning's automatic optimisation: forward, zero_grad and backward run inside
    optimizer.step(closure); only the update after the closure is the optimizer step."""
    model = nn.Linear(4, 3)
    optimizer = torch.optim.Adam(model.parameters())
    for _ in range(2):
        loss = _closure_step(model, optimizer, by_position)
    assert isinstance(loss, torch.Tensor) and loss.requires_grad  # the closure's value reaches step()
    expected = []
    for step in range(2):
        expected += [
            ("zero_grad", "start", step),
            ("zero_grad", "end", step),
            ("forward", "start", step),
            ("forward", "end", step),
            ("backward", "start", step),
            ("backward", "end", step),
            ("optimizer_step", "start", step),
            ("optimizer_step", "end", step),
        ]
    assert _phases(recorder) == expected
    assert recorder.step == 2 and recorder.stepping == [] and not recorder.optimizer_open


def test_lbfgs_calling_its_closure_again_leaves_the_update_each_time(recorder):
    model = nn.Linear(4, 3)
    optimizer = torch.optim.LBFGS(model.parameters(), max_iter=3)
    _closure_step(model, optimizer)
    phases = _phases(recorder)
    forwards = [p for p in phases if p[:2] == ("forward", "start")]
    assert len(forwards) >= 2  # LBFGS evaluated the closure more than once
    depth = 0
    for phase, edge, _ in phases:  # no forward or backward inside an open optimizer phase
        if phase == "optimizer_step":
            depth += 1 if edge == "start" else -1
            assert depth in (0, 1)
        elif edge == "start":
            assert depth == 0, phases
    assert depth == 0 and phases[-1][:2] == ("optimizer_step", "end") and recorder.step == 1


def test_a_step_without_closure_is_bracketed_as_before(recorder):
    model = nn.Linear(4, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.ones(2, 4)).sum().backward()
    optimizer.step()
    assert _phases(recorder)[-2:] == [("optimizer_step", "start", 0), ("optimizer_step", "end", 0)]
