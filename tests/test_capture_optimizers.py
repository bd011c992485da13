"""Each optimizer's kind as capture records it (`optimizer_kinds`), checked against torch itself: the
moments recorded before the first step are the parameter-sized state tensors the step then makes."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from oomdoctor.capture.optimizers import optimizer_kind, optimizer_kinds  # noqa: E402

SHAPE = (4, 6)

# (class name in torch.optim, settings): every class the table knows, with the settings that change it
KNOWN = [
    ("SGD", {}),
    ("SGD", {"momentum": 0.9}),
    ("SGD", {"momentum": 0.9, "nesterov": True}),
    ("Adam", {}),
    ("Adam", {"amsgrad": True}),
    ("AdamW", {}),
    ("AdamW", {"amsgrad": True}),
    ("RMSprop", {}),
    ("RMSprop", {"momentum": 0.9}),
    ("RMSprop", {"centered": True}),
    ("RMSprop", {"momentum": 0.9, "centered": True}),
    ("Adamax", {}),
    ("NAdam", {}),
    ("RAdam", {}),
    ("Adadelta", {}),
    ("Rprop", {}),
    ("Adagrad", {}),
    ("ASGD", {}),
    ("Muon", {}),
]


def _made_state(optimizer, parameter) -> int:
    """The parameter-sized tensors the optimizer holds for `parameter` after its first step."""
    parameter.grad = torch.ones_like(parameter)
    optimizer.step()
    state = optimizer.state.get(parameter, {})
    return sum(1 for value in state.values() if torch.is_tensor(value) and value.shape == parameter.shape)


@pytest.mark.parametrize(("name", "settings"), KNOWN, ids=[f"{n}-{'-'.join(s) or 'default'}" for n, s in KNOWN])
def test_the_recorded_moments_are_the_state_torch_makes_at_the_first_step(name, settings):
    cls = getattr(torch.optim, name, None)
    if cls is None:
        pytest.skip(f"torch.optim.{name} is not in this torch")
    parameter = torch.nn.Parameter(torch.randn(SHAPE))
    optimizer = cls([parameter], lr=0.01, **settings)
    kind = optimizer_kind(optimizer)
    assert kind["class"] == f"{cls.__module__}.{cls.__qualname__}"
    # nothing yet, what a first forward's OOM sees (but Adagrad makes its sum when it is made)
    assert not optimizer.state or name == "Adagrad"
    assert kind["moments"] == _made_state(optimizer, parameter), kind
    for setting, value in settings.items():
        if setting in kind["options"]:
            assert kind["options"][setting] == value


def test_sgd_without_momentum_records_no_state():
    parameter = torch.nn.Parameter(torch.randn(SHAPE))
    kind = optimizer_kind(torch.optim.SGD([parameter], lr=0.1))
    assert kind == {"class": "torch.optim.sgd.SGD", "moments": 0, "options": {"momentum": 0}}


def test_a_class_that_is_not_torchs_own_is_recorded_by_name_alone():
    class Custom(torch.optim.Adam):  # a subclass may keep other state: its name is all that is known
        pass

    parameter = torch.nn.Parameter(torch.randn(SHAPE))
    kind = optimizer_kind(Custom([parameter], lr=0.1))
    assert kind == {"class": f"{__name__}.{Custom.__qualname__}", "moments": None, "options": {}}
    # Adafactor's factored state and LBFGS's history are no whole number of the parameters
    lbfgs = optimizer_kind(torch.optim.LBFGS([parameter]))
    assert lbfgs["moments"] is None and lbfgs["class"].endswith("LBFGS")
    if hasattr(torch.optim, "Adafactor"):
        assert optimizer_kind(torch.optim.Adafactor([parameter]))["moments"] is None


def test_param_groups_whose_settings_differ_give_no_count():
    first, second = (torch.nn.Parameter(torch.randn(SHAPE)) for _ in range(2))
    optimizer = torch.optim.SGD([{"params": [first]}, {"params": [second], "momentum": 0.9}], lr=0.1)
    assert optimizer_kind(optimizer) == {"class": "torch.optim.sgd.SGD", "moments": None, "options": {"momentum": None}}
    same = torch.optim.SGD([{"params": [first], "momentum": 0.5}, {"params": [second]}], lr=0.1, momentum=0.5)
    assert optimizer_kind(same)["moments"] == 1


def test_an_optimizer_that_cannot_be_read_is_recorded_by_name():
    class Unreadable:
        def __iter__(self):
            raise RuntimeError("not now")

    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.randn(SHAPE))], lr=0.1)
    optimizer.param_groups = Unreadable()
    assert optimizer_kinds([optimizer]) == [{"class": "torch.optim.sgd.SGD", "moments": None, "options": {}}]
