"""Golden reports are the contract: the checked-in text, Markdown and JSON match what the views print
now, and the three formats agree on the headline numbers. Refresh with `python tests/golden/update.py`."""

from __future__ import annotations

import re

import orjson
import pytest

from oomdoctor.units import human_size as human
from oomdoctor.views.markdown_report import COMPONENT_LABELS
from tests.golden.update import FORMATS, GOLDEN_FIXTURES, GOLDEN_PAIR_FILES, HERE, REDACTED_FIXTURE, expected_reports

REFRESH = "outputs changed; review them and run `python tests/golden/update.py`"


@pytest.fixture(scope="module")
def reports() -> dict[str, bytes]:
    return expected_reports()


def test_every_golden_file_is_checked(reports):
    on_disk = {p.name for p in HERE.iterdir() if p.suffix in (".txt", ".md", ".json")}
    assert on_disk == set(reports), REFRESH


GOLDEN_FILES = [
    *(f"{name}.{suffix}" for name in GOLDEN_FIXTURES for suffix in FORMATS),
    f"{REDACTED_FIXTURE}.redacted.md",
    *GOLDEN_PAIR_FILES,
]


@pytest.mark.parametrize("file_name", GOLDEN_FILES)
def test_report_matches_its_golden_file(reports, file_name):
    assert (HERE / file_name).read_bytes().decode() == reports[file_name].decode(), REFRESH


def _from_json(text: str) -> dict:
    data = orjson.loads(text)
    return {
        "verdict": data["verdict"],
        "confidence": round(data["confidence"] * 100),
        "components": {k: v for k, v in data["components"].items() if v},
        "request_bytes": data["accounting"]["request_bytes"],
    }


def _from_markdown(text: str) -> dict:
    head = re.search(r"^## oomdoctor: `([a-z-]+)` \(confidence (\d+)%\)$", text, re.M)
    labels = {label: name for name, label in COMPONENT_LABELS.items()}
    components = {}
    section = text.split("### Live memory by component", 1)[1].split("\n### ", 1)[0]
    for row in section.splitlines():
        cells = [c.strip() for c in row.strip("|").split(" | ")]
        if len(cells) > 3 and cells[0] in labels:
            components[labels[cells[0]]] = int(cells[2].replace(",", ""))
    request = re.search(r"^\| \*\*failed request\*\* \| \*\*[^*]+\*\* \| ([\d,]+) \|$", text, re.M)
    return {
        "verdict": head.group(1),
        "confidence": int(head.group(2)),
        "components": components,
        "request_bytes": int(request.group(1).replace(",", "")) if request else None,
    }


def _from_text(text: str) -> dict:
    head = re.search(r"^Verdict: ([a-z-]+)  \(confidence (\d+)%\)$", text, re.M)
    labels = {label: name for name, label in COMPONENT_LABELS.items()}
    components = {}
    section = text.split("\nLive memory by component\n", 1)[1].split("\n\n", 1)[0]
    for row in section.splitlines():
        match = re.match(r"^  (\S.*?)\s{2,}(\d[\d.]* [A-Za-z]+)\s", row)
        if match and match.group(1) in labels:
            components[labels[match.group(1)]] = match.group(2)
    request = re.search(r"^  failed request\s+(\d[\d.]* [A-Za-z]+)", text, re.M)
    return {
        "verdict": head.group(1),
        "confidence": int(head.group(2)),
        "components": components,
        "request": request.group(1) if request else None,
    }


@pytest.mark.parametrize("name", GOLDEN_FIXTURES)
def test_formats_agree_on_the_headline(name):
    from_json = _from_json((HERE / f"{name}.json").read_text())
    from_markdown = _from_markdown((HERE / f"{name}.md").read_text())
    from_text = _from_text((HERE / f"{name}.txt").read_text())
    assert from_json["components"], "a report with no live memory proves nothing here"
    assert from_markdown == from_json
    assert from_text == {
        "verdict": from_json["verdict"],
        "confidence": from_json["confidence"],
        "components": {k: human(v) for k, v in from_json["components"].items()},
        "request": None if from_json["request_bytes"] is None else human(from_json["request_bytes"]),
    }


def test_redaction_keeps_the_headline():
    plain = _from_markdown((HERE / f"{REDACTED_FIXTURE}.md").read_text())
    redacted_text = (HERE / f"{REDACTED_FIXTURE}.redacted.md").read_text()
    assert _from_markdown(redacted_text) == plain
    # torch's frames, where the redacted `<env>/site-packages/` paths showed, are left out of the
    # Markdown stacks (views/frames.py); tests/test_redact.py checks how those paths are redacted
    assert "| host | `<host>` |" in redacted_text
    assert ".venv/" not in redacted_text and "| pid |" not in redacted_text


def test_goldens_hold_no_machine_paths():
    for path in HERE.iterdir():
        if path.suffix in (".txt", ".md", ".json"):
            text = path.read_text()
            assert not re.search(r"(?<![\w.<>])/(?:home|Users|root|tmp)/", text), path.name
