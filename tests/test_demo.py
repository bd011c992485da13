"""`oomdoctor demo` explains the example dump shipped inside the package."""

from __future__ import annotations

import json

from oomdoctor.cli import main
from oomdoctor.examples import EXAMPLE_DUMP
from oomdoctor.load import load


def test_the_example_ships_inside_the_package_and_loads():
    snapshot = load(EXAMPLE_DUMP)
    assert snapshot.oomdoctor is not None and snapshot.oomdoctor.reason == "oom"


def test_demo_leads_with_the_verdict(capsys):
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("Verdict: optimizer-state-buildup")


def test_demo_json_carries_the_verdict_and_components(capsys):
    assert main(["demo", "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["verdict"] == "optimizer-state-buildup"
    assert report["components"]["optimizer_state"] > report["components"]["activations"]


def test_demo_counts_the_batch_as_inputs_not_other(capsys):
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    section = out.split("Live memory by component", 1)[1].split("\n\n", 1)[0]
    lines = section.splitlines()
    inputs_at = next(index for index, line in enumerate(lines) if line.strip().startswith("inputs"))
    assert "registry" in lines[inputs_at]
    # grouped by the argument of the model's forward: the batch and its targets
    assert "MLP.forward arg 0" in lines[inputs_at + 1] and "MLP.forward arg 1" in lines[inputs_at + 2]
    assert not any(line.strip().startswith("other") for line in lines)
    # and the blocks are the ones make_batch made
    from oomdoctor.analysis import analyse

    (inputs,) = [share for share in analyse(load(EXAMPLE_DUMP)).components if share.name == "inputs"]
    assert {group.key.rsplit(" in ", 1)[1] for group in inputs.by_source_line} == {"make_batch"}
