"""The committed fixtures: manifest schema, every dump readable by oomdoctor and by torch's memory_viz,
ground truth consistent with the dump, and one scenario regenerated to the same ground truth."""

from __future__ import annotations

import json
import pickle

import pytest

from oomdoctor.metadata import METADATA_KEY, PHASES, TRUTH_COMPONENTS, VERDICTS
from tests.conftest import FIXTURES, fixture_module

MANIFEST = FIXTURES / "manifest.json"
MAX_DUMP_BYTES = 1_000_000
MANIFEST_COMPONENTS = list(TRUTH_COMPONENTS)
ENTRY_KEYS = {
    "name", "file", "scenario", "args", "verdict", "oom", "phase", "step", "components",
    "allocated_bytes", "reserved_bytes", "request_bytes", "message_bytes", "pool_cached_free_bytes",
    "device_memory_bytes", "alloc_conf",
    "outside_bytes", "description",
}  # fmt: skip
# The cheapest scenario to run again in a test.
REGENERATED = "oversized-request-contrastive"


strip = fixture_module("strip")
ENTRIES = json.loads(MANIFEST.read_text())["fixtures"]


def entry_params():
    return [pytest.param(entry, id=entry["name"]) for entry in ENTRIES]


def allocated_blocks_bytes(snapshot: dict) -> int:
    return sum(
        block["size"]
        for segment in snapshot["segments"]
        for block in segment["blocks"]
        if block["state"] == "active_allocated"
    )


def test_manifest_covers_every_verdict_twice():
    """Twice among the fixtures, or (for a verdict the realism variants brought: eval-outputs-kept,
    checkpoint-gather) there, where a run without an OOM counts for the finding its dump shows."""
    counts = {verdict: 0 for verdict in VERDICTS if verdict != "unknown"}
    for entry in ENTRIES:
        counts[entry["verdict"]] += 1
    for entry in json.loads(MANIFEST.read_text()).get("realism", []):
        expected = entry["finding"] or entry["verdict"]
        if expected in counts and not any(e["verdict"] == expected for e in ENTRIES):
            counts[expected] += 1
    assert {verdict: count for verdict, count in counts.items() if count < 2} == {}


def test_manifest_names_and_files_are_unique():
    assert len({entry["name"] for entry in ENTRIES}) == len(ENTRIES)
    assert len({entry["file"] for entry in ENTRIES}) == len(ENTRIES)


def test_every_dump_is_in_the_manifest():
    listed = {(FIXTURES / entry["file"]).resolve() for entry in ENTRIES}
    assert {path.resolve() for path in (FIXTURES / "dumps").glob("*.pickle")} == listed


@pytest.mark.parametrize("entry", entry_params())
def test_manifest_entry_schema(entry):
    assert set(entry) == ENTRY_KEYS
    assert entry["verdict"] in VERDICTS and entry["verdict"] != "unknown"
    assert entry["oom"] is (entry["verdict"] != "no-oom")
    assert entry["phase"] in (*PHASES, "between_steps")
    assert isinstance(entry["step"], int) and entry["step"] >= 0
    assert list(entry["components"]) == MANIFEST_COMPONENTS
    assert all(isinstance(value, int) and value >= 0 for value in entry["components"].values())
    assert entry["allocated_bytes"] == sum(entry["components"].values())
    assert (FIXTURES / "scenarios" / entry["scenario"]).is_file()
    assert entry["description"] and "\n" not in entry["description"]
    assert entry["allocated_bytes"] <= entry["reserved_bytes"] <= entry["device_memory_bytes"] - entry["outside_bytes"]
    if entry["oom"]:
        assert entry["request_bytes"] > 0 and entry["message_bytes"] >= entry["request_bytes"]
        # fragmentation means free cached memory enough for the request, just not in one piece
        fragmented = entry["pool_cached_free_bytes"] >= entry["request_bytes"]
        assert fragmented is (entry["verdict"] == "fragmentation")
    else:
        assert entry["request_bytes"] is None and entry["message_bytes"] is None


def test_expandable_segments_twins_rerun_a_fragmentation_fixture():
    """A no-oom run with expandable segments is one fragmentation fixture's run (its arguments, perhaps
    plus a dump flag) on the same device: the twin shows that the memory was there, only in pieces."""
    fragmentation = [entry for entry in ENTRIES if entry["verdict"] == "fragmentation"]
    twins = [entry for entry in ENTRIES if "expandable_segments:True" in entry["alloc_conf"]]
    assert len(twins) >= 2
    for twin in twins:
        originals = [
            entry
            for entry in fragmentation
            if entry["scenario"] == twin["scenario"]
            and twin["args"][: len(entry["args"])] == entry["args"]
            and entry["device_memory_bytes"] == twin["device_memory_bytes"]
            and entry["outside_bytes"] == twin["outside_bytes"]
        ]
        assert len(originals) == 1, twin["name"]
        assert twin["oom"] is False and originals[0]["alloc_conf"] == ""
        raw = strip.read_snapshot(FIXTURES / twin["file"])
        assert raw["segments"] and all(segment["is_expandable"] for segment in raw["segments"])


@pytest.mark.parametrize("entry", entry_params())
def test_dump_is_small_and_loads_with_oomdoctor(entry):
    from oomdoctor.load import load

    path = FIXTURES / entry["file"]
    assert path.stat().st_size < MAX_DUMP_BYTES
    snapshot = load(path)
    assert snapshot.segments
    assert snapshot.oomdoctor is not None


@pytest.mark.parametrize("entry", entry_params())
def test_dump_matches_its_ground_truth(entry):
    raw = strip.read_snapshot(FIXTURES / entry["file"])
    metadata = raw[METADATA_KEY]
    assert metadata["reason"] == ("oom" if entry["oom"] else "manual")
    assert metadata["rehearsal"]["device_memory_bytes"] == entry["device_memory_bytes"]
    assert metadata["rehearsal"]["alloc_conf"] == entry["alloc_conf"]
    assert raw["allocator_settings"]["PYTORCH_CUDA_ALLOC_CONF"] == entry["alloc_conf"]
    # The dump is written at the OOM (or the on-demand dump): its allocated blocks are exactly the
    # ones the ground truth divided into components.
    assert allocated_blocks_bytes(raw) == entry["allocated_bytes"]
    if entry["oom"]:
        oom_events = [event for event in raw["device_traces"][0] if event["action"] == "oom"]
        assert oom_events[-1]["size"] == entry["request_bytes"]
        assert metadata["oom"]["alloc_bytes"] == entry["message_bytes"]


def _strings(value, seen):
    if isinstance(value, str):
        yield value
    elif isinstance(value, (dict, list, tuple)) and id(value) not in seen:
        seen.add(id(value))
        for item in value.values() if isinstance(value, dict) else value:
            yield from _strings(item, seen)


@pytest.mark.parametrize("entry", entry_params())
def test_dump_shows_no_trace_of_where_it_was_generated(entry):
    raw = strip.read_snapshot(FIXTURES / entry["file"])
    root = str(FIXTURES.parent.resolve())
    assert not [text for text in _strings(raw, set()) if root in text]
    filenames = {frame["filename"] for event in raw["device_traces"][0] for frame in event.get("frames", ())}
    assert f"fixtures/scenarios/{entry['scenario']}" in filenames
    assert not filenames & {"fixtures/generate.py", "fixtures/ground_truth.py"}


@pytest.mark.parametrize("entry", entry_params())
def test_dump_opens_in_torch_memory_viz(entry):
    memory_viz = pytest.importorskip("torch.cuda._memory_viz")
    raw = strip.read_snapshot(FIXTURES / entry["file"])
    assert "total_allocated" in memory_viz.segsum(raw)
    assert memory_viz.trace(raw)


def test_strip_drops_only_the_metadata(tmp_path):
    entry = ENTRIES[0]
    source = FIXTURES / entry["file"]
    target = tmp_path / "plain.pickle"
    assert strip.main([str(source), str(target)]) == 0
    plain = strip.read_snapshot(target)
    original = strip.read_snapshot(source)
    assert METADATA_KEY not in plain
    assert plain == {key: value for key, value in original.items() if key != METADATA_KEY}
    assert pickle.loads(target.read_bytes()) == plain  # builtins only: plain pickle agrees


def test_strip_refuses_a_pickle_with_globals(tmp_path, capsys):
    hostile = tmp_path / "hostile.pickle"
    hostile.write_bytes(pickle.dumps(pickle.UnpicklingError("x")))
    assert strip.main([str(hostile), str(tmp_path / "out.pickle")]) == 2
    assert "refusing to load the global" in capsys.readouterr().err
    assert not (tmp_path / "out.pickle").exists()


@pytest.mark.slow
def test_generator_reproduces_one_fixture(tmp_path):
    pytest.importorskip("torch")
    generate = fixture_module("generate")
    recorded = next(entry for entry in ENTRIES if entry["name"] == REGENERATED)
    entry, dump_path = generate.generate(generate.BY_NAME[REGENERATED], tmp_path)
    assert (entry["verdict"], entry["phase"], entry["step"]) == (
        recorded["verdict"], recorded["phase"], recorded["step"],
    )  # fmt: skip
    assert entry["request_bytes"] == recorded["request_bytes"]
    for component, recorded_bytes in recorded["components"].items():
        assert entry["components"][component] == pytest.approx(recorded_bytes, rel=0.01, abs=65536), component
    assert allocated_blocks_bytes(strip.read_snapshot(dump_path)) == entry["allocated_bytes"]
