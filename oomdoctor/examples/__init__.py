"""Example dumps shipped inside the package, so `oomdoctor demo` works on a machine with nothing else.

`optimizer-state-buildup.pickle` is the fixture `optimizer-state-buildup-mlp-adam` (see
fixtures/manifest.json): an MLP trained with Adam on a simulated 240 MiB GPU, which runs out of memory
inside the first `optimizer.step()` while Adam creates its state.
"""

from __future__ import annotations

from pathlib import Path

EXAMPLE_DUMP = Path(__file__).with_name("optimizer-state-buildup.pickle")
