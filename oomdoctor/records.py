"""Frozen dataclasses that pickle by their fields' values, without a lookup of their fields each time.

A frozen dataclass with slots pickles through the `__getstate__` and `__setstate__` that
`dataclasses` gives it, and both call `dataclasses.fields()` on every object: that call is most of
the cost of sending an analysis (about 2,700 objects: phase spans, series points, live blocks) from
a folder's worker process back to the parent. `pickled_by_fields(namespace)` gives each such class
of a module the same state (its fields' values, in order) read and written from the field names
found once. Pure Python, no imports from the package.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Mapping
from typing import Any


def pickled_by_fields(namespace: Mapping[str, Any]) -> None:
    """Every frozen dataclass with slots defined in the module whose globals are `namespace`
    pickles its fields' values (what `dataclasses` makes its state) with its field names found now."""
    module = namespace.get("__name__")
    for value in list(namespace.values()):
        if (
            isinstance(value, type)
            and value.__module__ == module
            and dataclasses.is_dataclass(value)
            and value.__dataclass_params__.frozen  # type: ignore[attr-defined]
            and "__slots__" in value.__dict__
        ):
            _by_fields(value)


def _by_fields(cls: type) -> None:
    names = tuple(field.name for field in dataclasses.fields(cls))
    if not names:
        return
    read = operator.attrgetter(*names)
    setter = object.__setattr__

    def state(self: Any) -> Any:
        return (read(self),) if len(names) == 1 else read(self)

    def set_state(self: Any, values: Any) -> None:
        for name, value in zip(names, values):
            setter(self, name, value)

    cls.__getstate__ = state  # type: ignore[method-assign,attr-defined]
    cls.__setstate__ = set_state  # type: ignore[attr-defined]


__all__ = ["pickled_by_fields"]
