"""The realism variants (fixtures/manifest.json "realism", dumps in fixtures/dumps/realism/): runs shaped
like the plain snapshots people attach to issues (recording started after setup, Lightning's closure,
gradient accumulation, evaluation that keeps its outputs, a forward-only benchmark with autograd on, a
slow leak), analysed as plain torch snapshots (oomdoctor's metadata stripped) against the ground truth
the generator recorded before stripping.

Per variant, three checks: the verdict (for a run without an OOM, the finding its dump shows, as the
headline or a secondary finding), and for an OOM the components (every component holding at least 5%
of the allocated bytes within 10% of the truth, or 1 MiB) and the judged moment (phase and step). A
run without an OOM is judged at its peak, which is not the moment its dump (and so its truth) was
taken, so only its finding is checked. What analysis gets wrong today is the table KNOWN_MISSES, applied as strict xfails: a fix flips
a test to XPASS, which fails, so the table is kept true. A verdict the vocabulary does not have yet
(generate.PENDING_VERDICTS) is a strict xfail of its own until analysis gives it.

The consistency checks (schema, sizes, the dump's blocks against the truth, the registry against the
truth, memory from before the trace in the late-recording dumps) are not expected to fail.
"""

from __future__ import annotations

import functools
import json

import pytest

from oomdoctor.analysis import analyse
from oomdoctor.load import load
from oomdoctor.metadata import METADATA_KEY, PHASES
from oomdoctor.views.phrasing import summary
from oomdoctor.views.report_rows import target_context
from oomdoctor.vocabulary import Verdict
from tests.conftest import FIXTURES, fixture_module

MANIFEST = FIXTURES / "manifest.json"
REALISM_DIR = FIXTURES / "dumps" / "realism"
MiB = 1 << 20
MAX_DUMP_BYTES = 1_000_000
MAX_TOTAL_BYTES = 10_000_000
SHARE = 0.05  # components smaller than this share of the allocated bytes are not judged
TOLERANCE = 0.10
ENTRY_KEYS = {
    "name", "file", "scenario", "args", "verdict", "oom", "phase", "step", "components",
    "allocated_bytes", "reserved_bytes", "request_bytes", "message_bytes", "pool_cached_free_bytes",
    "device_memory_bytes", "alloc_conf", "outside_bytes", "description",
    "variant", "based_on", "finding", "steps_before_trace",
}  # fmt: skip
# Registry components (the dump's metadata) and the manifest components they are exact for.
REGISTRY_COMPONENTS = {
    "parameter": "parameters",
    "gradient": "gradients",
    "optimizer_state": "optimizer_state",
    "buffer": "buffers",
}
LATE_RECORDING = "recording started after setup"


strip = fixture_module("strip")
FIXTURE_ENTRIES = json.loads(MANIFEST.read_text())["fixtures"]
ENTRIES = json.loads(MANIFEST.read_text()).get("realism", [])
MANIFEST_COMPONENTS = list(FIXTURE_ENTRIES[0]["components"])  # the fixtures' components, in their order
VOCABULARY = {verdict.value for verdict in Verdict}

# What analysis of the stripped dumps says today instead of the truth, per variant and check: each row
# is a strict xfail, deleted when a fix makes its test XPASS. Empty since c208bc8 (the last rows were
# the late-recording moments, counted against the truth's step from the program's start, the
# checkpoint's copies, which the truth named inputs, and the inline evaluation loop's moment).
KNOWN_MISSES: dict[str, dict[str, str]] = {}


def _params(check: str, *, oom_only: bool = False):
    if not ENTRIES:
        return [pytest.param(None, marks=pytest.mark.skip(reason="no realism variants yet"))]
    params = []
    for entry in ENTRIES:
        if oom_only and not entry["oom"]:
            continue
        marks = []
        reason = KNOWN_MISSES.get(entry["name"], {}).get(check)
        expected = entry["finding"] or entry["verdict"]
        if check == "verdict" and expected not in VOCABULARY:
            reason = f"pending: {expected!r} is not a verdict yet (issue 11)" + (f"; {reason}" if reason else "")
        if reason:
            marks.append(pytest.mark.xfail(strict=True, reason=reason))
        params.append(pytest.param(entry, id=entry["name"], marks=marks))
    return params


@functools.cache
def _analysis(name: str):
    entry = next(entry for entry in ENTRIES if entry["name"] == name)
    return analyse(load(strip.stripped_bytes(FIXTURES / entry["file"])))


def _raw(entry: dict) -> dict:
    return strip.read_snapshot(FIXTURES / entry["file"])


def _allocated_blocks(raw: dict) -> dict[int, int]:
    return {
        block["address"]: block["size"]
        for segment in raw["segments"]
        for block in segment["blocks"]
        if block["state"] == "active_allocated"
    }


# --------------------------------------------------------------------------- analysis (as captured)


@functools.cache
def _captured(name: str):
    entry = next(entry for entry in ENTRIES if entry["name"] == name)
    return analyse(load(FIXTURES / entry["file"]))


# What analysis gets wrong on the dumps as captured (strict xfails, as KNOWN_MISSES).
CAPTURED_MISSES: dict[str, str] = {}


def _captured_params():
    return [
        pytest.param(
            entry,
            id=entry["name"],
            marks=[pytest.mark.xfail(strict=True, reason=CAPTURED_MISSES[entry["name"]])]
            if entry["name"] in CAPTURED_MISSES
            else [],
        )
        for entry in ENTRIES
    ]


@pytest.mark.parametrize("entry", _captured_params())
def test_variant_with_its_metadata_gets_its_verdict_and_moment(entry):
    """The dump as capture wrote it (markers, registry): the verdict, or for a run without an OOM its
    finding, and the phase and step of the judged moment, exactly — the closure's phases come from
    capture's markers (the optimizer step only after the closure returns), an evaluation loop's OOM
    in the concatenation after it is judged by the outputs its passes kept."""
    result = _captured(entry["name"])
    if entry["oom"]:
        assert result.verdict == entry["verdict"], [finding.verdict for finding in result.secondary]
        assert (result.target_phase, result.target_step) == (entry["phase"], entry["step"])
    else:
        assert entry["finding"] in {result.verdict, *(finding.verdict for finding in result.secondary)}


@pytest.mark.parametrize("entry", [entry for entry in _captured_params() if entry.values[0]["oom"]])
def test_variant_with_its_metadata_gets_its_components(entry):
    """As captured, every component within 5% (or 1 MiB) of the truth, as the fixtures' are: a
    checkpoint's copies are other by the saving code's frames, not inputs by the phase they were made
    in."""
    got = _captured(entry["name"]).component_bytes()
    wrong = {
        name: f"{got.get(name, 0) / MiB:.1f} MiB, truth {expected / MiB:.1f} MiB"
        for name, expected in entry["components"].items()
        if abs(got.get(name, 0) - expected) > max(0.05 * expected, MiB)
    }
    assert not wrong, wrong


# --------------------------------------------------------------------------- analysis (stripped)


@pytest.mark.parametrize("entry", _params("verdict"))
def test_stripped_variant_gets_its_verdict(entry):
    result = _analysis(entry["name"])
    if entry["oom"]:
        assert result.verdict == entry["verdict"], [finding.verdict for finding in result.secondary]
    else:
        found = {result.verdict, *(finding.verdict for finding in result.secondary)}
        assert entry["finding"] in found, found


@pytest.mark.parametrize("entry", _params("components", oom_only=True))
def test_stripped_variant_gets_its_components(entry):
    got = _analysis(entry["name"]).component_bytes()
    judged = {name: value for name, value in entry["components"].items() if value >= SHARE * entry["allocated_bytes"]}
    wrong = {
        name: f"{got.get(name, 0) / MiB:.1f} MiB, truth {expected / MiB:.1f} MiB"
        for name, expected in judged.items()
        if abs(got.get(name, 0) - expected) > max(TOLERANCE * expected, MiB)
    }
    assert not wrong, f"{wrong}; all: { {name: round(value / MiB, 1) for name, value in got.items() if value} }"


@pytest.mark.parametrize("entry", _params("moment", oom_only=True))
def test_stripped_variant_gets_its_moment(entry):
    """The phase and step of the judged moment. A plain snapshot counts the steps its trace shows
    (the report says so where optimizer state shows that steps ran before it, and the corpus labels
    count steps the same way): where recording began after steps had run, the truth's step is counted
    from there."""
    result = _analysis(entry["name"])
    step = entry["step"] - entry["steps_before_trace"]
    assert (result.target_phase, result.target_step) == (entry["phase"], step)


@pytest.mark.parametrize(
    "entry", [e for e in ENTRIES if e["name"].startswith("late-recording-")], ids=lambda entry: entry["name"]
)
def test_a_step_counted_from_a_late_trace_says_so(entry):
    """Where optimizer state predates the trace, the stripped report's step is the trace's: its
    header says so; the dump as captured (markers count every step) does not."""
    stripped, captured = _analysis(entry["name"]), _captured(entry["name"])
    counted_late = "of the trace, " in target_context(stripped)
    assert counted_late is (entry["steps_before_trace"] > 0), target_context(stripped)
    assert "of the trace" not in target_context(captured)


@pytest.mark.parametrize(
    "entry",
    [e for e in ENTRIES if e["name"].startswith("late-recording-") and e["verdict"] == "gradients-kept"],
    ids=lambda entry: entry["name"],
)
def test_gradients_kept_from_before_a_late_trace_say_so(entry):
    """The stale gradients of a trace started after the first step were made before it: the
    summary says so, stripped and as captured, instead of 'from earlier steps' of a step 0."""
    for analysis in (_analysis(entry["name"]), _captured(entry["name"])):
        assert analysis.verdict == "gradients-kept"
        facts = analysis.summary.facts
        assert facts.size("before_trace") == facts.size("old") > 0
        assert "made before the trace began" in summary(analysis.summary)


@pytest.mark.parametrize(
    "entry",
    [e for e in ENTRIES if e["variant"] == "gradient accumulation" and e["step"] == e["steps_before_trace"]],
    ids=lambda entry: entry["name"],
)
def test_micro_batches_before_any_optimizer_step_say_the_step_is_a_lower_bound(entry):
    """Stripped, an accumulation run that ran out before its first optimizer step shows no optimizer
    step, and its first micro-batch's gradients stay alive into the second: the file cannot tell the
    second micro-batch from a step. It is counted in step 0, said to be the least the trace shows,
    and the gradients are kept only as the hedge they are, after the verdict; as captured, the
    markers count the steps and nothing is hedged."""
    stripped, captured = _analysis(entry["name"]), _captured(entry["name"])
    assert "or later, " in target_context(stripped)
    kept = [f for f in stripped.secondary if f.verdict == "gradients-kept"]
    assert [f.confidence for f in kept] == [0.5]
    assert "the file cannot tell" in summary(kept[0].summary)
    assert "or later" not in target_context(captured)


# --------------------------------------------------------------------------- the variants themselves


def test_realism_variants_are_listed_apart_from_the_fixtures():
    fixture_names = {entry["name"] for entry in FIXTURE_ENTRIES}
    assert ENTRIES, "no realism variants in the manifest"
    assert not fixture_names & {entry["name"] for entry in ENTRIES}
    assert len({entry["name"] for entry in ENTRIES}) == len(ENTRIES)
    assert {path.name for path in REALISM_DIR.glob("*.pickle")} == {f"{entry['name']}.pickle" for entry in ENTRIES}
    assert sum((FIXTURES / entry["file"]).stat().st_size for entry in ENTRIES) < MAX_TOTAL_BYTES


@pytest.mark.parametrize("entry", _params("schema"))
def test_realism_entry_schema(entry):
    assert set(entry) == ENTRY_KEYS
    assert entry["file"] == f"dumps/realism/{entry['name']}.pickle"
    assert entry["variant"] and "\n" not in entry["description"]
    assert (FIXTURES / "scenarios" / entry["scenario"]).is_file()
    assert entry["oom"] is (entry["verdict"] != "no-oom")
    expected = entry["finding"] if not entry["oom"] else entry["verdict"]
    assert expected and expected not in ("unknown", "no-oom")
    assert entry["phase"] in (*PHASES, "between_steps")
    assert list(entry["components"]) == MANIFEST_COMPONENTS
    assert entry["allocated_bytes"] == sum(entry["components"].values())
    assert entry["allocated_bytes"] <= entry["reserved_bytes"] <= entry["device_memory_bytes"] - entry["outside_bytes"]
    if entry["based_on"]:
        based_on = {e["name"]: e for e in FIXTURE_ENTRIES}[entry["based_on"]]
        assert based_on["verdict"] == entry["verdict"]
    if entry["oom"]:
        fragmented = entry["pool_cached_free_bytes"] >= entry["request_bytes"]
        assert fragmented is (entry["verdict"] == "fragmentation")
    else:
        assert entry["request_bytes"] is None


@pytest.mark.parametrize("entry", _params("dump"))
def test_realism_dump_matches_its_ground_truth(entry):
    path = FIXTURES / entry["file"]
    assert path.stat().st_size < MAX_DUMP_BYTES
    raw = _raw(entry)
    assert raw[METADATA_KEY]["reason"] == ("oom" if entry["oom"] else "manual")
    blocks = _allocated_blocks(raw)
    assert sum(blocks.values()) == entry["allocated_bytes"]
    if entry["oom"]:
        oom_events = [event for event in raw["device_traces"][0] if event["action"] == "oom"]
        assert oom_events[-1]["size"] == entry["request_bytes"]
    filenames = {frame["filename"] for event in raw["device_traces"][0] for frame in event.get("frames", ())}
    assert f"fixtures/scenarios/{entry['scenario']}" in filenames
    assert not filenames & {"fixtures/generate.py", "fixtures/ground_truth.py"}


@pytest.mark.parametrize("entry", _params("registry"))
def test_realism_registry_agrees_with_the_ground_truth(entry):
    """The registry in the dump (before stripping) names exactly the parameter, gradient, optimizer state
    and buffer bytes the ground truth found by identity."""
    raw = _raw(entry)
    blocks = _allocated_blocks(raw)
    addresses: dict[str, set[int]] = {name: set() for name in REGISTRY_COMPONENTS.values()}
    for tensor in raw[METADATA_KEY]["tensors"]:
        if tensor["component"] in REGISTRY_COMPONENTS:
            addresses[REGISTRY_COMPONENTS[tensor["component"]]].add(tensor["address"])
    for component, found in addresses.items():
        assert sum(blocks.get(address, 0) for address in found) == entry["components"][component], component


@pytest.mark.parametrize(
    "entry", [p for p in _params("pre-trace") if p.values[0] and p.values[0]["variant"] == LATE_RECORDING]
)
def test_late_recording_dumps_hold_memory_from_before_the_trace(entry):
    """Every parameter (and, after a first step, every optimizer state and stale gradient) block is in
    the segments but has no alloc event and no frames: the trace began after it was allocated."""
    raw = _raw(entry)
    blocks = _allocated_blocks(raw)
    traced = {event["addr"] for event in raw["device_traces"][0] if event["action"] == "alloc"}
    frameless = {
        block["address"]
        for segment in raw["segments"]
        for block in segment["blocks"]
        if block["state"] == "active_allocated" and not block.get("frames")
    }
    pre_trace = {address for address in blocks if address not in traced} & frameless
    step = int(entry["args"][entry["args"].index("--record-after-setup") + 1])
    registry = {tensor["address"]: tensor["component"] for tensor in raw[METADATA_KEY]["tensors"]}
    kinds = {"parameter"} | ({"optimizer_state"} if step > 0 else set())
    if step > 0 and "--no-zero-grad" in entry["args"]:
        kinds.add("gradient")
    expected = {address for address, component in registry.items() if component in kinds and address in blocks}
    assert expected and expected <= pre_trace
    assert sum(blocks[address] for address in pre_trace) >= entry["components"]["parameters"]
