"""Redaction on real snapshots from public repositories: nothing personal survives in the Markdown
report or the redacted dump, and the dump keeps its verdict and component bytes."""

from __future__ import annotations

import pickle
import re

import pytest

from oomdoctor.analysis import analyse
from oomdoctor.load import load, load_raw
from oomdoctor.pipeline import render_report
from oomdoctor.redact import Redactor, redact_snapshot_data, redactor_for_data
from tests.conftest import corpus_params

_PERSONAL_PREFIX = re.compile(r"(?:/home/|/Users/|[A-Za-z]:[\\/]Users[\\/])[^<]")


@pytest.mark.slow
@pytest.mark.parametrize("path", corpus_params())
def test_real_snapshot_redacts_cleanly(path):
    snapshot = load(path)
    redactor = Redactor.from_snapshot(snapshot)
    report = render_report(snapshot, "md", source=path.name, redact=True).decode()
    assert not _PERSONAL_PREFIX.search(report)
    for name in redactor.users + redactor.hosts:
        assert not re.search(rf"(?<![A-Za-z0-9]){re.escape(name)}(?![A-Za-z0-9])", report), name

    data = load_raw(path)
    learned = redactor_for_data(data)
    assert learned.users == redactor.users and learned.project_roots == redactor.project_roots
    written = pickle.dumps(redact_snapshot_data(data, learned), protocol=4)
    for name in learned.users:
        assert f"/{name}/".encode() not in written
    before, after = analyse(snapshot), analyse(load(written))
    assert (after.verdict, after.component_bytes(), after.accounting) == (
        before.verdict,
        before.component_bytes(),
        before.accounting,
    )
