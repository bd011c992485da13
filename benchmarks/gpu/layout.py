"""What driver.py writes and import_results.py reads: names, variants, and the ground-truth arithmetic.

Pure Python (no torch), shared by the driver, the importer and tests/test_gpu_fixtures.py.
"""

from __future__ import annotations

import json
import pickle
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from oomdoctor.model import ACTIVE_ALLOCATED, Snapshot

REPOSITORY_ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(REPOSITORY_ROOT / "fixtures"))  # strip.py: rewrite_dump, shared with fixtures/generate.py
from strip import rewrite_dump  # noqa: E402

FIXTURE_MANIFEST = REPOSITORY_ROOT / "fixtures" / "manifest.json"
SUMMARY_VERSION = 1

# Environment of each way a real scenario runs. The simulator does not model cuBLAS's workspace (a
# caching-allocator block that cuBLAS keeps from the first matrix product on a stream), so
# `no-cublas-workspace` turns it off: what differs then is the allocator model itself.
VARIANTS: dict[str, dict[str, str]] = {
    "default": {},
    "no-cublas-workspace": {"CUBLAS_WORKSPACE_CONFIG": ":0:0", "CUBLASLT_WORKSPACE_SIZE": "0"},
}

# Components found by identity, in the order in which they claim a block (fixtures/ground_truth.py).
STATE_COMPONENTS = ("parameters", "gradients", "optimizer_state", "buffers")

# Frames of the machinery that ran a scenario, which a user's own `python script.py` run has not.
MACHINERY_FILES = ("benchmarks/gpu/scenario_child.py", "fixtures/ground_truth.py", "<frozen runpy>")

_TRIED = re.compile(r"Tried to allocate (\d+(?:\.\d+)?) (bytes|B|KiB|MiB|GiB|TiB)")
_UNIT_BYTES = {"bytes": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}


def run_name(scenario: str, variant: str) -> str:
    """A real run's name: the fixture's name, with the variant after it unless it is `default`."""
    return scenario if variant == "default" else f"{scenario}.{variant}"


def read_fixture_manifest() -> list[dict[str, Any]]:
    return json.loads(FIXTURE_MANIFEST.read_text())["fixtures"]


def parse_tried_to_allocate(message: str | None) -> dict[str, Any] | None:
    """torch's "Tried to allocate 20.00 MiB" as text and bytes (rounded as torch printed it)."""
    match = _TRIED.search(message or "")
    if match is None:
        return None
    return {
        "text": f"{match.group(1)} {match.group(2)}",
        "bytes": round(float(match.group(1)) * _UNIT_BYTES[match.group(2)]),
    }


def truth_components(snapshot: Snapshot, moment: Mapping[str, Any]) -> dict[str, Any]:
    """Bytes of each state component at the moment the scenario child recorded, from the dump's blocks.

    The child recorded, independently of oomdoctor's analysis, the storage address of every
    parameter, gradient, optimizer state tensor and buffer alive; each allocated block of the dump
    whose address is one of them counts for the first component that claims it. `rest` is every
    other allocated byte (activations, temporaries, inputs, other: the child cannot tell them apart).
    """
    blocks = {
        block.address: block.size
        for segment in snapshot.segments
        for block in segment.blocks
        if block.state == ACTIVE_ALLOCATED
    }
    claimed: dict[int, str] = {}
    addresses = moment.get("state_addresses") or {}
    missing = 0
    for component in STATE_COMPONENTS:
        for address in addresses.get(component, ()):
            if address in blocks:
                claimed.setdefault(address, component)
            else:
                missing += 1
    components = dict.fromkeys(STATE_COMPONENTS, 0)
    for address, component in claimed.items():
        components[component] += blocks[address]
    allocated = sum(blocks.values())
    components["rest"] = allocated - sum(components[name] for name in STATE_COMPONENTS)
    return {
        "phase": moment.get("phase"),
        "step": moment.get("step"),
        "reason": moment.get("reason"),
        "components": components,
        "allocated_bytes": allocated,
        "addresses_not_at_a_block_start": missing,
    }


class _NoGlobals(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refused global {module}.{name}")


def read_dump_dict(data: bytes) -> dict[str, Any]:
    """A dump as plain builtins; refuses every global (a dump is a pickle)."""
    import io

    return _NoGlobals(io.BytesIO(data)).load()


def clean_dump(snapshot: dict[str, Any], root: str) -> dict[str, Any]:
    """The dump as `python fixtures/scenarios/NAME.py` from the repository root would have left it.

    Paths under `root` (the repository on the machine that ran it) become relative, and the frames
    of the machinery that ran the scenario (MACHINERY_FILES, runpy) leave every stack and the
    exception's formatted traceback. Nothing else
    changes. Frame dicts stay shared, so the file stays as small as capture wrote it.
    """
    prefix = root.rstrip("/") + "/"

    def is_machinery(frame: Any) -> bool:
        if not isinstance(frame, dict):
            return False
        filename = str(frame.get("filename", ""))
        return filename in MACHINERY_FILES or filename.endswith("/runpy.py")

    def relative(text: str) -> str:
        if text.startswith("Traceback (most recent call last):"):
            return _drop_machinery_entries(text.replace(prefix, ""))
        return text.replace(prefix, "")

    return rewrite_dump(snapshot, relative, is_machinery)


_TRACEBACK_ENTRY = re.compile(r'^  File "(?P<filename>[^"]*)", line \d+')


def _drop_machinery_entries(text: str) -> str:
    """A formatted traceback without the entries (File line and the source lines under it) of
    MACHINERY_FILES and runpy."""
    kept, dropping = [], False
    for line in text.splitlines(keepends=True):
        entry = _TRACEBACK_ENTRY.match(line)
        if entry is not None:
            filename = entry.group("filename")
            dropping = filename in MACHINERY_FILES or filename.endswith("/runpy.py")
        elif not line.startswith("    "):
            dropping = False
        if not dropping:
            kept.append(line)
    return "".join(kept)
