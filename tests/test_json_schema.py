"""Every JSON output validates against the schema written in docs/schema/ (report, diff and folder report).

A small validator of the JSON Schema keywords the schemas use (type, const, enum, required,
properties, additionalProperties, items, oneOf, minimum, maximum, $ref into $defs): no dependency.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from oomdoctor import pipeline
from oomdoctor.load import load
from tests.conftest import FIXTURES, ROOT, corpus_params

SCHEMAS = ROOT / "docs" / "schema"
FIXTURE_DUMPS = sorted((FIXTURES / "dumps").rglob("*.pickle"))
_TYPES = {
    "object": dict,
    "array": list,
    "string": str,
    "integer": int,
    "number": (int, float),
    "boolean": bool,
    "null": type(None),
}


def _is(value: Any, name: str) -> bool:
    if name in ("integer", "number") and isinstance(value, bool):
        return False
    return isinstance(value, _TYPES[name])


def validate(value: Any, schema: dict, root: dict, path: str = "$") -> list[str]:
    """The ways `value` breaks `schema`, as 'path: problem' lines."""
    if "$ref" in schema:
        name = schema["$ref"].removeprefix("#/$defs/")
        return validate(value, root["$defs"][name], root, path)
    problems: list[str] = []
    types = schema.get("type")
    if types is not None:
        names = [types] if isinstance(types, str) else types
        if not any(_is(value, name) for name in names):
            return [f"{path}: {type(value).__name__} is not {types}"]
    if "const" in schema and value != schema["const"]:
        problems.append(f"{path}: {value!r} is not {schema['const']!r}")
    if "enum" in schema and value not in schema["enum"]:
        problems.append(f"{path}: {value!r} is not one of {schema['enum']}")
    if "oneOf" in schema:
        matching = [s for s in schema["oneOf"] if not validate(value, s, root, path)]
        if len(matching) != 1:
            problems.append(f"{path}: matches {len(matching)} of oneOf")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            problems.append(f"{path}: {value} < {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            problems.append(f"{path}: {value} > {schema['maximum']}")
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        for key in schema.get("required", ()):
            if key not in value:
                problems.append(f"{path}: no key {key!r}")
        extra = schema.get("additionalProperties", True)
        for key, item in value.items():
            if key in properties:
                problems += validate(item, properties[key], root, f"{path}.{key}")
            elif extra is False:
                problems.append(f"{path}: key {key!r} is not in the schema (document it in {root['$id']})")
            elif isinstance(extra, dict):
                problems += validate(item, extra, root, f"{path}.{key}")
    if isinstance(value, list) and "items" in schema:
        for index, item in enumerate(value):
            problems += validate(item, schema["items"], root, f"{path}[{index}]")
    return problems


def _schema(name: str) -> dict:
    return json.loads((SCHEMAS / name).read_text())


def test_the_validator_catches_what_it_should():
    schema = _schema("diff.schema.json")
    assert validate({"schema_version": 2}, schema, schema)  # wrong version, missing keys
    report = _schema("report.schema.json")
    assert any("not in the schema" in p for p in validate({"surprise": 1}, report, report))
    assert validate(True, {"type": "integer"}, {}) != []


@pytest.mark.parametrize("path", FIXTURE_DUMPS, ids=lambda p: p.stem)
def test_every_fixture_report_validates(path: Path):
    schema = _schema("report.schema.json")
    data = json.loads(pipeline.report_file(str(path), "json"))
    assert validate(data, schema, schema) == []
    assert data["schema_version"] == schema["properties"]["schema_version"]["const"]


@pytest.mark.parametrize("path", corpus_params())
def test_every_corpus_report_validates(path: Path):
    schema = _schema("report.schema.json")
    try:
        snapshot = load(path)
    except Exception:  # noqa: BLE001 - files the loader refuses have no report to check
        pytest.skip("not loadable")
    data = json.loads(pipeline.render_report(snapshot, "json", source=str(path)))
    assert validate(data, schema, schema) == []


OPTIMIZER = str(FIXTURES / "dumps" / "optimizer-state-buildup-gpt-adamw.pickle")
SPIKE = str(FIXTURES / "dumps" / "activation-spike-gpt-longer-sequence.pickle")
DIFFS = {
    "files": lambda: pipeline.diff_files(SPIKE, OPTIMIZER),
    "same": lambda: pipeline.diff_files(OPTIMIZER, OPTIMIZER),
    "steps": lambda: pipeline.diff_steps(OPTIMIZER, 0, 1),
    "redacted": lambda: pipeline.diff_files(SPIKE, OPTIMIZER, redact=True),
}


@pytest.mark.parametrize("name", sorted(DIFFS))
def test_every_diff_validates(name: str):
    schema = _schema("diff.schema.json")
    data = json.loads(pipeline.render_diff(DIFFS[name](), "json"))
    assert validate(data, schema, schema) == []


def _rank_folder(tmp_path: Path, files: dict[str, Path]) -> Path:
    import shutil

    folder = tmp_path / "ranks"
    folder.mkdir()
    for name, source in files.items():
        shutil.copy(source, folder / name)
    return folder


RANK_FOLDERS = {
    "two-ran-out": {
        "oom-rank0-node-1-20260101T000000Z.pickle": Path(SPIKE),
        "oom-rank1-node-2-20260101T000000Z.pickle": Path(OPTIMIZER),
    },
    "none-ran-out-one-junk": {
        "oom-rank0-node-1-20260101T000000Z.pickle": FIXTURES / "dumps" / "no-oom-gpt-adamw.pickle",
        "oom-rank3-node-1-20260101T000000Z.pickle": FIXTURES / "dumps" / "no-oom-gpt-adamw-batch-32.pickle",
    },
}


@pytest.mark.parametrize("name", sorted(RANK_FOLDERS))
def test_every_folder_report_validates(name: str, tmp_path: Path):
    schema = _schema("ranks.schema.json")
    folder = _rank_folder(tmp_path, RANK_FOLDERS[name])
    if name.endswith("junk"):
        (folder / "notes.pickle").write_bytes(b"not a pickle")
    data = json.loads(pipeline.report_folder(str(folder), "json"))
    assert validate(data, schema, schema) == []
    assert data["file_count"] == len(RANK_FOLDERS[name])
    assert bool(data["skipped"]) == name.endswith("junk")
    broken = json.loads(json.dumps(data))
    broken["ranks"][0]["components"]["activations"] = "many"  # the schema is not vacuous
    assert validate(broken, schema, schema)
    report = _schema("report.schema.json")
    featured = {key: value for key, value in data["report"].items() if key != "file"}
    assert validate(featured, report, report) == []  # the featured rank's report is a report
