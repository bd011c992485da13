"""`records.pickled_by_fields`: the frozen dataclasses a folder's workers send back pickle their
fields' values with names found once, and come back equal; a state in the form `dataclasses`
writes (a list of values) still loads; only the module's own frozen dataclasses with slots change."""

from __future__ import annotations

import copy
import dataclasses
import pickle
from pathlib import Path

import pytest

import oomdoctor.analysis.environment
import oomdoctor.analysis.ranks
import oomdoctor.analysis.results
import oomdoctor.load.folder
import oomdoctor.model
from oomdoctor.analysis.results import PhaseSpan
from oomdoctor.pipeline import read_rank
from oomdoctor.records import pickled_by_fields

DUMPS = Path(__file__).resolve().parent.parent / "fixtures" / "dumps"
MODULES = (
    oomdoctor.analysis.results,
    oomdoctor.model,
    oomdoctor.analysis.ranks,
    oomdoctor.analysis.environment,
    oomdoctor.load.folder,
)


def frozen_slotted(module):
    return [
        value
        for value in vars(module).values()
        if isinstance(value, type)
        and value.__module__ == module.__name__
        and dataclasses.is_dataclass(value)
        and value.__dataclass_params__.frozen
        and "__slots__" in value.__dict__
    ]


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
def test_every_frozen_dataclass_of_the_module_pickles_by_its_fields(module):
    classes = frozen_slotted(module)
    assert classes
    for cls in classes:
        if dataclasses.fields(cls):
            assert cls.__getstate__.__module__ == "oomdoctor.records", cls
            assert cls.__setstate__.__module__ == "oomdoctor.records", cls


@pytest.mark.parametrize("name", ["optimizer-state-buildup-gpt-adamw", "no-oom-gpt-adamw", "outside-pytorch-cnn"])
def test_a_rank_comes_back_from_a_worker_equal(name):
    dump = read_rank(str(DUMPS / f"{name}.pickle"))
    for protocol in (2, pickle.HIGHEST_PROTOCOL):
        back = pickle.loads(pickle.dumps(dump, protocol=protocol))
        assert back == dump
        assert type(back.analysis.phases[0]) is PhaseSpan
    assert copy.deepcopy(dump) == dump


def test_the_state_dataclasses_wrote_still_loads():
    span = PhaseSpan(3, 9, "forward", 1, "markers")
    written = [getattr(span, field.name) for field in dataclasses.fields(PhaseSpan)]  # dataclasses' own form
    back = PhaseSpan.__new__(PhaseSpan)
    back.__setstate__(written)
    assert back == span
    assert span.__getstate__() == tuple(written)


def test_only_the_modules_own_frozen_slotted_dataclasses_change():
    @dataclasses.dataclass(frozen=True, slots=True)
    class One:
        value: int

    @dataclasses.dataclass(frozen=True, slots=True)
    class Two:
        a: int
        b: str = "x"

    @dataclasses.dataclass(slots=True)
    class Mutable:
        a: int

    @dataclasses.dataclass(frozen=True)
    class NoSlots:
        a: int

    namespace = {"__name__": One.__module__, "One": One, "Two": Two, "Mutable": Mutable, "NoSlots": NoSlots}
    namespace["PhaseSpan"] = PhaseSpan  # imported from elsewhere: left to its own module
    before = (Mutable.__dict__.get("__getstate__"), NoSlots.__dict__.get("__getstate__"), PhaseSpan.__getstate__)
    pickled_by_fields(namespace)
    assert One.__getstate__.__module__ == Two.__getstate__.__module__ == "oomdoctor.records"
    assert (
        Mutable.__dict__.get("__getstate__"),
        NoSlots.__dict__.get("__getstate__"),
        PhaseSpan.__getstate__,
    ) == before
    assert One(5).__getstate__() == (5,) and Two(1, "y").__getstate__() == (1, "y")
    assert copy.deepcopy(One(5)) == One(5) and copy.deepcopy(Two(1, "y")) == Two(1, "y")
