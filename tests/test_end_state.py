"""The components at the dump, beside those at the judged moment: where the moment is the trace's
last event, the dump is that moment's own state, and what the analysis reads there without placing
the blocks again is what placing them again gives."""

from __future__ import annotations

from pathlib import Path

import oomdoctor.analysis as analysis
from oomdoctor.analysis.reading import place
from oomdoctor.load import load

DUMPS = sorted((Path(__file__).resolve().parent.parent / "fixtures" / "dumps").glob("*.pickle"))


def test_a_moment_at_the_last_event_reads_the_dump_as_placing_it_again_does():
    checked = 0
    for path in DUMPS:
        snapshot = load(path)
        dump = analysis._read_device(snapshot, None)
        state = analysis.replay(dump, 480)
        target = analysis._pick_target(dump, state)
        if target.index != len(dump.trace) - 1:
            continue
        _, shares = analysis._attribute(dump, state, target)
        at_end = analysis._state_at_target(dump.trace, dump.segments, state.history, None)[0]
        again = {s.name: s.bytes for s in analysis._attribution.shares(place(dump, state.history, at_end.live, None))}
        assert analysis._at_end(dump, state, target, shares) == (again, at_end.allocated_bytes), path.name
        checked += 1
    assert checked >= 3
