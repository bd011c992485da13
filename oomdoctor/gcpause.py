"""The cyclic garbage collector paused over work that makes millions of objects and no cycles.

Loading a snapshot (1M trace events: millions of dicts and lists) and analysing it (per-event keys,
tuples and sets) make no garbage cycles worth a pass, and the collector's repeated passes over what
they make cost a tenth (analysis) to twice (unpickling) the work itself. Shared by `load` and
`analysis`; pure Python, no imports from the package.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def cyclic_gc_paused() -> Iterator[None]:
    """The collector off for the block, and back on after it if it was on. What the block made
    counts as old once it ends (moved there without a pass over it): else the first collection
    after resuming would walk every object it kept as young."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.unfreeze()
        if was_enabled:
            gc.enable()
