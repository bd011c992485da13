"""The same truth from every torch release's format (2.0-2.14): a metamorphic audit.

Each fixture and realism variant (oomdoctor's metadata stripped, as a plain torch snapshot) is
rewritten as an older torch would have written the same run (tests/versions.py: keys the release
lacks dropped, torch 2.0's per-block `history` for its blocks' stacks) and analysed again. What a
release did not record may make the report say less (no annotations: phases from the stacks; no
`allocator_settings`: expandable segments read from the segments or unknown), never something
else. Per fixture and era:

- the verdict is the truth's (the manifest's; for a run without an OOM, its finding as the headline
  or a secondary finding), or the modern reading's where that differs from the truth (what other
  tests list as known misses);
- the judged moment (phase and step), the number of steps and the peak are the modern reading's
  (where no annotation shows the optimizer's steps and the gradients stay alive across passes, a
  step number may be lower, said to be the least the trace shows, and the steps fewer); what each
  step held at its end is too, or is said to be a lower bound of it ("at least": no mark shows
  where the step ended) and is;
- no component is claimed over the truth by more than 10% and 1 MiB (a run without an OOM is judged
  at its peak, not at its dump's moment, so there over the modern reading);
- the text report names no field the era lacks ("phases from annotations" before 2.5, "by time_us"
  before 2.2, the allocator configuration before 2.3).

The corpus's real snapshots in the dict format are rewritten the same way into the eras older than
they are, and each aspect the expert labels score right on the file as it is (verdict, moment,
categories) must stay right.

KNOWN_MISSES lists what is still wrong, as strict xfails: a fix flips its row to XPASS, which fails.
"""

from __future__ import annotations

import functools
import io
import json
import pickle
import re
from typing import Any

import pytest

from oomdoctor.analysis import analyse
from oomdoctor.analysis.results import UnknownKind
from oomdoctor.load import load
from oomdoctor.pipeline import render_report
from oomdoctor.views.phrasing import summary
from tests.conftest import CORPUS, FIXTURES, fixture_module
from tests.versions import ERAS, as_written_by, representable

MiB = 1 << 20
SLACK = 0.10
strip = fixture_module("strip")
MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())
ENTRIES = {entry["name"]: entry for entry in [*MANIFEST["fixtures"], *MANIFEST.get("realism", [])]}

# (fixture, torch minor) -> why the reading of that era is still wrong.
KNOWN_MISSES: dict[tuple[str, int], str] = {}

# What the text report may only say where the era recorded it: (oldest minor, pattern).
FIELD_STATEMENTS = (
    (5, re.compile(r"from annotations")),  # external_annotations: 2.5
    (2, re.compile(r"by time_us")),  # time_us: 2.2
    (3, re.compile(r"^\s*PYTORCH_CUDA_ALLOC_CONF:", re.MULTILINE)),  # allocator_settings (advice may name it): 2.3
    (8, re.compile(r"compile_context|compiled region", re.IGNORECASE)),  # compile_context: 2.8
    (10, re.compile(r"user_metadata")),  # user_metadata: 2.10
)


@functools.cache
def _modern(name: str) -> dict[str, Any]:
    return strip.strip_metadata(strip.read_snapshot(FIXTURES / ENTRIES[name]["file"]))


@functools.cache
def _reading(name: str, minor: int | None) -> tuple[Any, str]:
    """(analysis, text report) of fixture `name` as torch 2.<minor> wrote it (None: as it is)."""
    raw = _modern(name) if minor is None else as_written_by(_modern(name), minor)
    snapshot = load(io.BytesIO(pickle.dumps(raw, protocol=4)))
    analysis = analyse(snapshot)
    return analysis, render_report(snapshot, "text", analysis=analysis, source="snapshot").decode()


def _params() -> list[Any]:
    params = []
    for name in ENTRIES:
        for minor in ERAS:
            if not representable(_modern(name), minor):
                continue  # torch 2.0 had no expandable segments
            reason = KNOWN_MISSES.get((name, minor))
            marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
            params.append(pytest.param(name, minor, id=f"{name}-2.{minor}", marks=marks))
    return params


PARAMS = _params()


def _section(text: str, heading: str) -> list[str]:
    """The lines of the report's section whose heading starts with `heading`, up to a blank line."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith(heading)), None)
    if start is None:
        return []
    end = next((i for i in range(start, len(lines)) if not lines[i].strip()), len(lines))
    return lines[start:end]


def _found(analysis: Any) -> set[str]:
    return {analysis.verdict, *(finding.verdict for finding in analysis.secondary)}


@pytest.mark.parametrize(("name", "minor"), PARAMS)
def test_an_older_format_reads_the_same_truth(name, minor):
    entry = ENTRIES[name]
    modern, _ = _reading(name, None)
    old, text = _reading(name, minor)
    wrong = []
    # the verdict: the truth's where the modern reading has it, else the modern reading's
    if entry["oom"]:
        expected = entry["verdict"] if modern.verdict == entry["verdict"] else modern.verdict
        if old.verdict != expected:
            wrong.append(f"verdict {old.verdict}, expected {expected}")
    elif entry.get("finding") in _found(modern) and entry["finding"] not in _found(old):
        wrong.append(f"finding {entry['finding']} lost: {sorted(_found(old))}")
    elif old.verdict != modern.verdict:
        wrong.append(f"verdict {old.verdict}, modern {modern.verdict}")
    # a run without an OOM: the headline (what fills memory at the peak and at the dump) is the same
    if (
        not entry["oom"]
        and old.verdict == modern.verdict == "no-oom"
        and summary(old.summary) != summary(modern.summary)
    ):
        wrong.append(f"headline {summary(old.summary)!r}, modern {summary(modern.summary)!r}")
    # the moment, the steps and the peak: what the allocator's events say, whatever else was recorded;
    # where no annotation shows the optimizer's steps and the gradients stay alive across passes
    # (plain SGD without zero_grad), whether a pass began a step the file cannot tell: its step
    # number is the least the trace shows, and says so, never more than the modern reading's
    fewer = any(u.kind == UnknownKind.PASSES_MAY_BE_STEPS for u in old.unknowns) and not any(
        u.kind == UnknownKind.PASSES_MAY_BE_STEPS for u in modern.unknowns
    )
    step_read = old.target_step == modern.target_step or (
        fewer
        and old.target_step is not None
        and modern.target_step is not None
        and old.target_step <= modern.target_step
    )
    if old.target_phase != modern.target_phase or not step_read:
        wrong.append(
            f"moment {old.target_phase} step {old.target_step}, modern {modern.target_phase} step {modern.target_step}"
        )
    if len(old.steps) != len(modern.steps) and not (fewer and len(old.steps) < len(modern.steps)):
        wrong.append(f"{len(old.steps)} steps, modern {len(modern.steps)}")
    elif len(old.steps) == len(
        modern.steps
    ):  # what each step held at its end: the modern reading's, or a lower bound of it said so
        for step, then in zip(old.steps, modern.steps, strict=True):
            if step.end_allocated_bytes != then.end_allocated_bytes and not (
                step.end_at_least and step.end_allocated_bytes <= then.end_allocated_bytes
            ):
                wrong.append(
                    f"step {step.step} at its end {step.end_allocated_bytes}"
                    f"{' at least' if step.end_at_least else ''}, modern {then.end_allocated_bytes}"
                )
    if old.replay.peak_allocated_bytes != modern.replay.peak_allocated_bytes:
        wrong.append(f"peak {old.replay.peak_allocated_bytes}, modern {modern.replay.peak_allocated_bytes}")
    # no component over the truth (at an OOM; where the modern reading already claims more, over
    # that: its own miss is another test's) or over the modern reading (at a peak)
    modern_bytes = modern.component_bytes()
    for component, held in old.component_bytes().items():
        bound = modern_bytes.get(component, 0)
        if entry["oom"]:
            bound = max(bound, entry["components"].get(component, 0))
        if component != "unknown" and held > bound * (1 + SLACK) + MiB:
            wrong.append(f"{component} {held / MiB:.1f} MiB read, at most {bound / MiB:.1f} MiB true or modern")
    # what the allocator's state says at the judged moment ("Memory at ..."): the same figures
    if _section(text, "Memory ") != _section(_reading(name, None)[1], "Memory "):
        wrong.append(
            f"memory section {_section(text, 'Memory ')}, modern {_section(_reading(name, None)[1], 'Memory ')}"
        )
    # no statement about a field this era did not write
    for since, pattern in FIELD_STATEMENTS:
        if minor < since and pattern.search(text):
            wrong.append(f"mentions {pattern.pattern!r}, which 2.{minor} did not record")
    assert not wrong, wrong


@pytest.mark.parametrize("minor", [minor for minor in ERAS if 1 <= minor < 5])
def test_without_annotations_the_frees_show_the_steps_that_allocate_nothing(minor):
    """Before 2.5 no annotation marks an optimizer step or zero_grad. A plain SGD run as
    `optimizer.step(closure)` allocates nothing in its step, but frees the closure's loss inside it
    and calls zero_grad (whose frees carry its stack): the steps are the modern reading's, and the
    run is not said to show no optimizer step. Plain SGD without a closure or zero_grad leaves no
    trace of its steps at all: there the report says so. (torch 2.0's frees carry their allocation's
    stack, not the free's: there zero_grad shows by the gradients it releases, and a step ends where
    the loop's own code allocates again after the closure's work, the frees before it the step's.)"""
    closure, text = _reading("closure-activation-spike-gpt", minor)
    modern, _ = _reading("closure-activation-spike-gpt", None)
    assert [(s.phase, s.step) for s in closure.phases][-3:] == [(s.phase, s.step) for s in modern.phases][-3:]
    assert "no optimizer step shows" not in text
    _, plain = _reading("gradients-kept-mlp-plain-sgd", minor)
    assert "no optimizer step shows since they were made" in plain


@pytest.mark.parametrize(
    "name", [name for name, entry in ENTRIES.items() if entry["verdict"] == "fragmentation"], ids=str
)
def test_torch_2_0_has_no_expandable_segments_to_set(name):
    """torch 2.0 wrote per-block history and had no expandable segments (2.1 added them; 2.0
    refuses the option): its fragmentation is told they were off, and the advice is to move to a
    torch that has them, not to set an option that release rejects."""
    modern, _ = _reading(name, None)
    old, text = _reading(name, 0)
    assert old.verdict == "fragmentation"
    assert old.fragmentation.expandable_segments is False
    ids = [recommendation.id for recommendation in old.recommendations]
    assert "upgrade-for-expandable-segments" in ids and "expandable-segments" not in ids, ids
    assert "expandable-segments" in [recommendation.id for recommendation in modern.recommendations]
    assert not re.search(r"^\s*\d+\. Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments", text, re.MULTILINE)


# --------------------------------------------------------------------------- the corpus

CORPUS_ERAS = (3, 1, 0)  # without annotations; without settings and times; torch 2.0's blocks


def _corpus_labels() -> dict[str, dict[str, Any]]:
    if CORPUS is None or not (CORPUS / "labels" / "labels.json").is_file():
        return {}
    labels = json.loads((CORPUS / "labels" / "labels.json").read_text(encoding="utf-8"))
    return {str(label["file"]): label for label in labels if isinstance(label, dict)}


LABELS = _corpus_labels()


@functools.cache
def _corpus_raw(file: str) -> Any:
    assert CORPUS is not None
    return strip.read_snapshot(CORPUS / "snapshots" / file)


@functools.cache
def _corpus_grades(file: str, minor: int | None) -> tuple[bool, bool, tuple[str, ...]]:
    from tests.test_corpus_labels import scoring

    raw = _corpus_raw(file) if minor is None else as_written_by(_corpus_raw(file), minor)
    snapshot = load(io.BytesIO(pickle.dumps(raw, protocol=4)))
    observed = scoring.observed_of(json.loads(render_report(snapshot, "json")))
    result = scoring.score(scoring.expected_of(LABELS[file]), observed)
    return result.verdict_right, result.moment_right, tuple(g.grade for g in result.expected.groups if g.scored)


def _corpus_params() -> list[Any]:
    if not LABELS:
        return [pytest.param(None, None, marks=pytest.mark.skip(reason="corpus labels not found"))]
    params = []
    for file in LABELS:
        raw = _corpus_raw(file)
        if type(raw) is not dict:
            continue  # a bare list of segments has no older form
        for minor in CORPUS_ERAS:
            if representable(raw, minor) and as_written_by(raw, minor) != raw:
                reason = CORPUS_KNOWN_MISSES.get((file, minor))
                marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
                params.append(pytest.param(file, minor, id=f"{file.rsplit('.', 1)[0]}-2.{minor}", marks=marks))
    return params


# (corpus file, torch minor) -> why an aspect right on the file as it is goes wrong in that era.
CORPUS_KNOWN_MISSES: dict[tuple[str, int], str] = {}


@pytest.mark.parametrize(("file", "minor"), _corpus_params())
def test_a_real_snapshot_in_an_older_format_keeps_what_it_reads_right(file, minor):
    modern, old = _corpus_grades(file, None), _corpus_grades(file, minor)
    worse = [
        aspect for aspect, was, now in zip(("verdict", "moment"), modern[:2], old[:2], strict=True) if was and not now
    ]
    worse += [
        f"category {n}: {was} -> {now}"
        for n, (was, now) in enumerate(zip(modern[2], old[2], strict=True))
        if was == "right" and now != "right"
    ]
    assert not worse, worse


# --------------------------------------------------------------------------- a step the trace ends in


def _custom_optimizer_run(*, ran_out: bool):
    """Parameters, a forward, a backward, then a step of an optimizer written by the user (its
    frames: its own file inside torch's step wrapper) that makes a temporary, frees it, then makes
    its state; no annotation. The trace ends inside that step: the program wrote the dump after the
    step returned, or (`ran_out`) the OOM handler wrote it while the step's next request failed."""
    from oomdoctor.model import Frame
    from tests.builders import BACKWARD_STACK, FORWARD_STACK, SETUP_STACK, Sim

    step = (
        Frame("my_optim.py", 75, "step"),
        Frame("/usr/lib/python3/site-packages/torch/optim/optimizer.py", 493, "wrapper"),
        Frame("train.py", 44, "main"),
    )
    sim = Sim()
    weights = sim.alloc(64 * MiB, SETUP_STACK)
    activation = sim.alloc(32 * MiB, FORWARD_STACK)
    sim.alloc(64 * MiB, BACKWARD_STACK)  # the gradient
    sim.free(activation)
    sim.free(sim.alloc(64 * MiB, step))  # the update's temporary
    state = sim.alloc(64 * MiB, step)  # the moment it keeps
    if ran_out:
        sim.oom(512 * MiB, step)
    del weights
    return analyse(sim.snapshot(metadata=False)), state


def test_a_plain_dump_is_written_after_the_step_the_trace_ends_in_returned():
    """Without the Optimizer.step# END (torch < 2.5) the stacks cannot show where a step that ends
    the trace returned. A dump without an OOM is written by the program between its calls, so the
    step had returned: what it made and kept is its state, as the annotation would have shown. With
    an OOM the step may have been cut short there: what it made may be a temporary still."""
    analysis, state = _custom_optimizer_run(ran_out=False)
    placed = {block.address: block.component for block in analysis.live_blocks}
    assert placed[state] == "optimizer_state", placed
    analysis, state = _custom_optimizer_run(ran_out=True)
    placed = {block.address: block.component for block in analysis.live_blocks}
    assert placed[state] == "temporaries", placed


def test_a_forward_that_may_train_fits_only_up_to_a_bound_before_annotations():
    """The real DataParallel run whose first forward ran out (its rest extrapolated from a replica
    that ran no backward) trains, which only its optimizer annotations tell. Written by a torch
    before 2.5 the file cannot say whether a backward follows: the forward's fitting scale is an
    upper bound and no change is said to fit on its own, as with the annotations."""
    file = "multi_device_expandable__constructor_sun_code_location__memory_snapshot.pickle"
    if file not in LABELS:
        pytest.skip("corpus labels not found")
    modern = analyse(load(io.BytesIO(pickle.dumps(_corpus_raw(file), protocol=4))))
    assert modern.what_if.case == "backward-unknown"
    for minor in (3, 2):
        old = analyse(load(io.BytesIO(pickle.dumps(as_written_by(_corpus_raw(file), minor), protocol=4))))
        assert old.what_if.case == "backward-unknown", (minor, old.what_if.case)
        assert not any(r.would_fit_alone for r in old.recommendations), (minor, old.recommendations)


def test_balancing_replicas_without_times_saves_at_least_its_saving_at_the_oom():
    """The real DataParallel run: with `time_us` (2.2+) a replica's pass that ran to its end while
    the judged device was still in its own extrapolates the rest of the interrupted pass, and
    balancing saves about that projection's excess over the mean. Written by 2.1 (no times) the
    replica's pass is not known to have ended there, so the rest is unknown: the saving at the OOM is
    a lower bound of the one at the pass's peak (what the rest adds raises it), said "at least",
    never a smaller "about"."""
    file = "multi_device_expandable__constructor_sun_code_location__memory_snapshot.pickle"
    if file not in LABELS:
        pytest.skip("corpus labels not found")

    def advice(minor: int | None) -> dict[str, Any]:
        raw = _corpus_raw(file) if minor is None else as_written_by(_corpus_raw(file), minor)
        analysis = analyse(load(io.BytesIO(pickle.dumps(raw, protocol=4))))
        return {r.id: r for r in analysis.recommendations}

    modern, timed, untimed = advice(None), advice(3), advice(1)
    assert not modern["balance-devices"].saved_at_least
    assert timed["balance-devices"] == modern["balance-devices"]
    balance = untimed["balance-devices"]
    assert balance.saved_at_least, balance
    assert balance.estimated_saved_bytes <= modern["balance-devices"].estimated_saved_bytes


def test_before_annotations_checkpointing_is_advised_if_the_run_trains():
    """The real DataParallel run trains (its optimizer annotations, the expert's label), and the
    expert advises checkpointing its message-passing iterations. Written by a torch before 2.5 the
    file cannot tell whether it trains (no annotation, and the OOM came before any backward): the
    advice is given on that condition, its fit not said, not dropped and not asserted."""
    file = "multi_device_expandable__constructor_sun_code_location__memory_snapshot.pickle"
    if file not in LABELS:
        pytest.skip("corpus labels not found")
    modern = analyse(load(io.BytesIO(pickle.dumps(_corpus_raw(file), protocol=4))))
    advised = {r.id: r for r in modern.recommendations}
    assert not advised["activation-checkpointing"].if_trains
    for minor in (3, 1):
        old = analyse(load(io.BytesIO(pickle.dumps(as_written_by(_corpus_raw(file), minor), protocol=4))))
        checkpointing = {r.id: r for r in old.recommendations}.get("activation-checkpointing")
        assert checkpointing is not None, (minor, old.recommendations)
        assert checkpointing.if_trains and checkpointing.would_fit_alone is None, (minor, checkpointing)
