"""`oomdoctor demo` explains the example dump shipped inside the package."""

from __future__ import annotations

import json

from oomdoctor.cli import main
from oomdoctor.examples import EXAMPLE_DUMP
from oomdoctor.load import load


def test_the_example_ships_inside_the_package_and_loads():
    snapshot = load(EXAMPLE_DUMP)
    assert snapshot.oomdoctor is not None and snapshot.oomdoctor["reason"] == "oom"


def test_demo_leads_with_the_verdict(capsys):
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("Verdict: optimizer-state-buildup")


def test_demo_json_carries_the_verdict_and_components(capsys):
    assert main(["demo", "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["verdict"] == "optimizer-state-buildup"
    assert report["components"]["optimizer_state"] > report["components"]["activations"]
