"""What a file holds is counted below the views (oomdoctor.analysis.contents) and rendered by
oomdoctor.views.info: typed results, no wording, no view imported to count."""

from __future__ import annotations

import pickle
import subprocess
import sys

from oomdoctor.analysis.contents import ByteTotals, Contents, describe
from oomdoctor.load import load
from oomdoctor.views.info import to_dict
from tests.builders import MiB, make_snapshot


def test_describe_gives_typed_contents_the_view_renders():
    contents = describe(load(pickle.dumps(make_snapshot(), protocol=4)), "x")
    assert isinstance(contents, Contents) and isinstance(contents.totals, ByteTotals)
    assert contents.totals.rounding_bytes == contents.totals.allocated_bytes - contents.totals.requested_bytes
    assert contents.totals.free_bytes == 2 * MiB - 1024
    assert contents.device_list == (0,) and contents.trace_events == (6,)
    info = to_dict(contents)
    assert info["free_bytes"] == contents.totals.free_bytes and info["device_list"] == [0]
    assert info["oom_events"][0]["request_bytes"] == contents.ooms[0].request_bytes


def test_counting_imports_no_view():
    code = "import sys, oomdoctor.analysis.contents\nprint([m for m in sys.modules if m.startswith('oomdoctor.views')])"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
