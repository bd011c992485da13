"""The pure scoring of benchmarks/corpus_score.py (issue 11): oomdoctor's JSON report against the
expert readings of the real corpus (`labels/labels.json`, explained in `LABELS.md` next to it).

Nothing here runs oomdoctor or reads a file: `expected_of(label)` reads one label, `observed_of(report)`
one report's JSON, `score(expected, observed)` compares them on the verdict, the judged moment and the
components at that moment, and `text_report` / `json_report` print the scores. The script
(`benchmarks/corpus_score.py`) runs each report in a child process; the CI tests
(`tests/test_corpus_labels.py`, `tests/test_corpus_claims.py`) run them in-process and import this
module. The rules are in docs/corpus-score.md.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

RIGHT_WITHIN = 0.10  # relative to the expert's bytes
PARTIAL_WITHIN = 0.50
CATEGORY_SHARE = 0.05  # of the expert's total at the moment

# The labels' verdict vocabulary (LABELS.md "Conventions") in oomdoctor's verdict ids.
VERDICTS = {
    "optimizer-state buildup at step two": "optimizer-state-buildup",
    "activation spike": "activation-spike",
    "gradients kept across steps": "gradients-kept",
    "creeping leak": "creeping-leak",
    "fragmentation": "fragmentation",
    "model states do not fit": "model-states-too-large",
    "one oversized request": "oversized-request",
    "memory outside pytorch": "outside-pytorch",
    "inference with autograd on": "inference-with-grad",
}
NO_OOM_LABEL = "no oom (cannot tell)"
CANNOT_TELL_LABEL = "cannot tell"
CANNOT_TELL_VERDICTS = ("no-oom", "unknown", "cannot-tell")

# Scoring classes: oomdoctor's components, plus the kinds the labels name that oomdoctor may learn
# (issue 11 asks for workspaces and large pre-allocations as their own kinds).
MODEL_STATES = ("parameters", "gradients", "optimizer_state")
NON_SPECIFIC = ("activations", "temporaries", "inputs", "other", "unknown")
KNOWN_COMPONENTS = (
    "parameters",
    "gradients",
    "optimizer_state",
    "activations",
    "temporaries",
    "inputs",
    "buffers",
    "other",
    "unknown",
)

# The kinds the labels name that oomdoctor may report as components of their own: mapped, not "unmapped".
LEARNED_KINDS = ("workspace", "preallocated", "pending_free")

INFERENCE_PHASES = ("forward", "inference", "evaluation", "eval")
NO_PHASE = (None, "unknown")
_OPTIMIZER_SPAN = re.compile(r"\boptimizer step\b|\bstep\s*\d+\s+optimizer\b")
_LIKELY = re.compile(r"likely ([a-z0-9 ./+-]+)")


# ---- the expert's side ---------------------------------------------------------------------------


def category_classes(name: str) -> tuple[str, ...]:
    """The oomdoctor components an expert category stands for (docs/corpus-score.md, "Mapping")."""
    text = name.lower()
    lead = re.split(r"[(:]", text, maxsplit=1)[0]
    classes = _lead_classes(lead)
    if classes in (("unknown",), ("other", "unknown"), NON_SPECIFIC):
        for likely in _LIKELY.findall(text):
            extra = _lead_classes(likely)
            if set(extra) != set(NON_SPECIFIC):
                classes = tuple(dict.fromkeys(classes + extra))
    return classes


def _lead_classes(lead: str) -> tuple[str, ...]:
    if "model states" in lead:
        return MODEL_STATES
    if "pending" in lead:
        return ("pending_free",)
    if re.search(r"kv[- ]cache|pre-?alloc|memory pool", lead):
        return ("preallocated",)
    if "workspace" in lead:
        return ("workspace",)
    if "temporar" in lead:
        return ("temporaries", "gradients") if "grad" in lead else ("temporaries",)
    if "optimizer" in lead or "estimator" in lead:
        return ("optimizer_state",)
    if "unknown" in lead:
        return ("other", "unknown") if "other" in lead else ("unknown",)
    states = []
    if "param" in lead or "weight" in lead:
        states.append("parameters")
    if "grad" in lead:
        states.append("gradients")
    if "buffer" in lead:
        states.append("buffers")
    if states:
        return tuple(states)
    if "input" in lead:
        return ("inputs",)
    if "activation" in lead or "output" in lead:
        return ("activations",)
    if "other" in lead:
        return ("other",)
    return NON_SPECIFIC


def phase_of_text(text: str | None) -> tuple[str | None, ...] | None:
    """oomdoctor phases that fit a label's phase wording, or None when the wording names none."""
    if not text:
        return None
    text = text.lower()
    if "backward" in text:
        return ("backward",)
    if "optimizer" in text or "estimator" in text or "parameter update" in text:
        return ("optimizer_step",)
    if "zero_grad" in text:
        return ("zero_grad",)
    if "loss" in text or "forward" in text:  # loss code belongs to the step's forward
        return ("forward",)
    if "setup" in text:
        return ("before_first_step",)
    if "between steps" in text:
        return ("between_steps",)
    return None


@dataclass
class Group:
    """One scored expert category (or several the expert's wording maps onto the same components)."""

    names: list[str]
    classes: list[str]
    expert_bytes: int
    share: float
    scored: bool  # at least CATEGORY_SHARE of the expert's total
    oomdoctor_bytes: int = 0
    error: float | None = None
    grade: str = "wrong"


@dataclass
class Expected:
    file: str
    verdict_label: str
    verdict_rule: str  # "headline", "headline-or-finding", "no-oom", "cannot-tell"
    verdicts: list[str]
    device: int | None
    steps: list[int | None]
    phases: list[str | None]
    phase_text: str | None
    moment: str  # "oom", "peak" or "dump"
    index: int | None
    components_at: str | None  # the labels' components key
    total_bytes: int
    groups: list[Group]  # every category; only the scored ones count
    problems: list[str] = field(default_factory=list)  # the label could not be read on some count


def expected_of(label: Mapping[str, Any]) -> Expected:
    problems: list[str] = []
    verdict_label = str(label.get("verdict") or "")
    oom_state = label.get("oom_state")
    key = verdict_label.strip().lower()
    if key == NO_OOM_LABEL:
        rule, verdicts = "no-oom", ["no-oom"]
    elif key == CANNOT_TELL_LABEL:
        rule, verdicts = "cannot-tell", list(CANNOT_TELL_VERDICTS)
    elif key in VERDICTS:
        rule = "headline" if oom_state else "headline-or-finding"
        verdicts = [VERDICTS[key]]
    else:
        rule, verdicts = "headline", []
        problems.append(f"verdict {verdict_label!r} is not in the labels' vocabulary")

    steps_label = label.get("steps") or {}
    peak = steps_label.get("peak_allocated")
    spans = [span for span in steps_label.get("phases") or [] if isinstance(span, Mapping)]
    if oom_state:
        moment, device, index = "oom", oom_state.get("device"), oom_state.get("event_index")
    elif peak:
        moment, device, index = "peak", peak.get("device"), peak.get("index")
    else:
        moment, index = "dump", None
        device = _dump_device(label)

    phase_text: str | None = None
    phases: tuple[str | None, ...] | None
    traced = index is not None
    if not traced:
        phases = NO_PHASE
    else:
        span = _span_at(spans, device, index)
        texts = [span.get("phase") if span else None]
        if moment == "peak":
            texts.insert(0, steps_label.get("peak_phase"))
        phases = None
        for text in texts:
            phases = phase_of_text(text)
            if phases is not None:
                phase_text = text
                break
        if phases is None and "inference" in str((label.get("workload") or {}).get("kind", "")).lower():
            phases, phase_text = INFERENCE_PHASES, "inference (workload)"
        if phases is None:
            phases = NO_PHASE
            problems.append(f"phase wording {texts!r} names no oomdoctor phase")

    if traced:
        completed = sum(
            1
            for span in spans
            if span.get("device") == device
            and _OPTIMIZER_SPAN.search(str(span.get("phase", "")).lower())
            and isinstance(span.get("end_index"), int)
            and span["end_index"] < index
        )
        steps: list[int | None] = [completed]
    else:
        steps = [0]
    training = re.search(r"\btrain", str((label.get("workload") or {}).get("kind", "")).lower())
    if steps == [0] and (not traced or not training):
        steps.append(None)  # no training step to be in: "no step" is as true as step 0

    components = label.get("components") or {}
    at = {"oom": "oom", "peak": "peak", "dump": "end"}[moment]
    order = [at] + [k for k in ("oom", "peak", "end") if k != at]
    components_at = next((k for k in order if isinstance(components.get(k), Mapping)), None)
    categories = components.get(components_at) or {} if components_at else {}
    groups, total = _groups(categories)
    return Expected(
        file=str(label.get("file")),
        verdict_label=verdict_label,
        verdict_rule=rule,
        verdicts=verdicts,
        device=device,
        steps=steps,
        phases=list(phases),
        phase_text=phase_text,
        moment=moment,
        index=index,
        components_at=components_at,
        total_bytes=total,
        groups=groups,
        problems=problems,
    )


def _dump_device(label: Mapping[str, Any]) -> int | None:
    end = label.get("end_state") or {}
    if not end:
        end = label.get("trace_summary") or {}
    reserved = {
        int(name.split("_")[-1]): (state or {}).get("reserved", 0) if isinstance(state, Mapping) else 0
        for name, state in end.items()
        if re.fullmatch(r"device_\d+", name)
    }
    if len(reserved) == 1:
        return next(iter(reserved))
    if reserved and len(set(reserved.values())) == len(reserved):
        return max(reserved, key=reserved.get)
    return None  # not told by the label: not scored


def _span_at(spans: list[Mapping[str, Any]], device: Any, index: int) -> Mapping[str, Any] | None:
    on_device = [s for s in spans if s.get("device") == device]
    for position, span in enumerate(on_device):
        start, end = span.get("start_index"), span.get("end_index")
        if isinstance(start, int) and isinstance(end, int) and start <= index <= end:
            # a one-event span holding only the OOM names the event, not the phase it interrupted
            if start == end and str(span.get("phase", "")).lower().endswith("oom") and position:
                return on_device[position - 1]
            return span
    return None


def _groups(categories: Mapping[str, Any]) -> tuple[list[Group], int]:
    items = [
        (name, int(value.get("bytes", 0)), category_classes(name))
        for name, value in categories.items()
        if isinstance(value, Mapping)
    ]
    total = sum(size for _, size, _ in items)
    merged: list[tuple[list[str], set[str], int]] = []
    for name, size, classes in items:
        names, joined, bytes_ = [name], set(classes), size
        keep = []
        for other in merged:
            if other[1] & joined:
                names = other[0] + names
                joined |= other[1]
                bytes_ += other[2]
            else:
                keep.append(other)
        merged = keep + [(names, joined, bytes_)]
    groups = []
    for names, classes, size in merged:
        share = size / total if total else 0.0
        groups.append(Group(names, sorted(classes), size, share, scored=share >= CATEGORY_SHARE))
    return groups, total


# ---- oomdoctor's side ----------------------------------------------------------------------------


def component_class(name: str) -> str:
    """The scoring class of an oomdoctor component (its own name for the vocabulary's nine)."""
    if name in KNOWN_COMPONENTS:
        return name
    text = name.lower()
    for pattern, cls in (
        ("workspace", "workspace"),
        (r"kv|cache|prealloc|pool", "preallocated"),
        ("pending", "pending_free"),
        ("optim", "optimizer_state"),
        ("grad", "gradients"),
        ("param|weight", "parameters"),
        ("activation", "activations"),
        ("temporar", "temporaries"),
        ("input", "inputs"),
    ):
        if re.search(pattern, text):
            return cls
    return name  # unmapped: counted in no expert category, and named in the row's notes


@dataclass
class Observed:
    verdict: str | None = None
    findings: list[str] = field(default_factory=list)
    device: int | None = None
    step: int | None = None
    phase: str | None = None
    moment: str | None = None
    index: int | None = None
    components: dict[str, int] = field(default_factory=dict)
    dump_components: dict[str, int] | None = None  # the replay series' last point, when it is the dump
    error: str | None = None


def observed_of(report: Mapping[str, Any]) -> Observed:
    replay = report.get("replay") or {}
    components: dict[str, int] = {}
    for name, size in (report.get("components") or {}).items():
        components[str(name)] = int(size or 0)
    dump_components = None
    series = replay.get("series") or []
    if (
        series
        and isinstance(series[-1], Mapping)
        and series[-1].get("event_index") == (replay.get("event_count") or 0) - 1
    ):
        values = series[-1].get("components") or []
        if len(values) == len(components):  # in the order of the report's components
            dump_components = {name: int(v or 0) for name, v in zip(components, values)}
    return Observed(
        verdict=report.get("verdict"),
        findings=[str(f.get("verdict")) for f in report.get("secondary") or [] if isinstance(f, Mapping)],
        device=report.get("device"),
        step=report.get("target_step"),
        phase=report.get("target_phase"),
        moment=replay.get("target_kind"),
        index=replay.get("target_index"),
        components=components,
        dump_components=dump_components,
    )


# ---- the score -----------------------------------------------------------------------------------


@dataclass
class FileScore:
    file: str
    expected: Expected
    observed: Observed
    verdict_right: bool = False
    verdict_why: str = ""
    moment_right: bool = False
    moment_why: str = ""
    unclaimed: dict[str, int] = field(default_factory=dict)  # oomdoctor bytes in classes no category uses
    unmapped: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def score(expected: Expected, observed: Observed) -> FileScore:
    result = FileScore(file=expected.file, expected=expected, observed=observed)
    if observed.error is not None:
        result.verdict_why = result.moment_why = f"no report: {observed.error}"
        for group in expected.groups:
            group.grade, group.oomdoctor_bytes, group.error = "wrong", 0, None
        return result

    named = [observed.verdict, *observed.findings]
    if expected.verdict_rule == "headline-or-finding":
        result.verdict_right = any(v in expected.verdicts for v in named)
    else:
        result.verdict_right = observed.verdict in expected.verdicts
    if not result.verdict_right:
        where = "headline or finding" if expected.verdict_rule == "headline-or-finding" else "headline"
        findings = ", ".join(observed.findings) or "none"
        result.verdict_why = (
            f"wanted {' or '.join(expected.verdicts) or '?'} ({where}); got {observed.verdict}, findings: {findings}"
        )

    misses = []
    if expected.device is not None and observed.device != expected.device:
        misses.append(f"device {observed.device} (expert {expected.device})")
    if observed.step not in expected.steps:
        misses.append(f"step {observed.step} (expert {_or(expected.steps)})")
    if observed.phase not in expected.phases:
        misses.append(f"phase {observed.phase} (expert {_or(expected.phases)})")
    result.moment_right = not misses
    result.moment_why = "; ".join(misses)

    components = observed.components
    if expected.moment == "dump" and observed.moment not in (None, "dump") and observed.dump_components is not None:
        # the expert read only the dump; the report judged another moment but its series has the dump
        components = observed.dump_components
        result.notes.append(f"components at the dump (replay series), the report judged its {observed.moment}")
    by_class: dict[str, int] = {}
    for name, size in components.items():
        cls = component_class(name)
        by_class[cls] = by_class.get(cls, 0) + size
        if cls not in KNOWN_COMPONENTS and cls not in LEARNED_KINDS and cls == name:
            result.unmapped.append(name)
    for group in expected.groups:
        group.oomdoctor_bytes = sum(by_class.get(cls, 0) for cls in group.classes)
        group.error = abs(group.oomdoctor_bytes - group.expert_bytes) / group.expert_bytes
        group.grade = (
            "right" if group.error <= RIGHT_WITHIN else "partial" if group.error <= PARTIAL_WITHIN else "wrong"
        )
    claimed = {cls for group in expected.groups for cls in group.classes}
    result.unclaimed = {cls: size for cls, size in by_class.items() if size and cls not in claimed}
    return result


def _alt(values: Iterable[Any]) -> str:
    return "/".join("none" if v is None else str(v) for v in values)


def _or(values: Iterable[Any]) -> str:
    return " or ".join("none" if v is None else str(v) for v in values)


# ---- printing ----------------------------------------------------------------------------------------


def totals(scores: list[FileScore]) -> dict[str, Any]:
    grades = [g.grade for s in scores for g in s.expected.groups if g.scored]
    return {
        "files": len(scores),
        "verdicts_right": sum(s.verdict_right for s in scores),
        "moments_right": sum(s.moment_right for s in scores),
        "categories": {k: grades.count(k) for k in ("right", "partial", "wrong")},
        "errors": sum(s.observed.error is not None for s in scores),
    }


def _size(n: int | None) -> str:
    if n is None:
        return "-"
    if n >= 1 << 30:
        return f"{n / (1 << 30):.2f} GiB"
    if n >= 1 << 20:
        return f"{n / (1 << 20):.1f} MiB"
    return f"{n / 1024:.1f} KiB"


def _short(file: str) -> str:
    return file.split("__")[0] + "__" + file.split("__")[1] if file.count("__") >= 2 else file


def _cell(text: str) -> str:
    return text.replace("|", "/")


def text_report(scores: list[FileScore], commit: str) -> str:
    t = totals(scores)
    lines = [
        f"oomdoctor {commit} scored against the expert labels ({t['files']} files)",
        "",
        "| file | expert verdict | oomdoctor | verdict | moment (device, step, phase) | expert's | categories r/p/w | why |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in scores:
        e, o = s.expected, s.observed
        got = "error" if o.error else o.verdict + (f" (+{', '.join(o.findings)})" if o.findings else "")
        grades = [g.grade for g in e.groups if g.scored]
        counts = "/".join(str(grades.count(k)) for k in ("right", "partial", "wrong"))
        ours = "-" if o.error else f"{o.device}, {'none' if o.step is None else o.step}, {o.phase or 'none'}"
        theirs = f"{'any' if e.device is None else e.device}, {_alt(e.steps)}, {_alt(e.phases)}"
        why = "; ".join(w for w in (s.verdict_why, s.moment_why if not o.error else "") if w)
        notes = [why] if why else []
        notes += s.notes
        if s.unmapped:
            notes.append(f"unmapped components: {', '.join(s.unmapped)}")
        notes += e.problems
        lines.append(
            f"| {_short(e.file)} | {e.verdict_label} | {got} | {'right' if s.verdict_right else 'wrong'} "
            f"| {ours} {'right' if s.moment_right else 'wrong'} | {theirs} | {counts} | {_cell('; '.join(notes))} |"
        )
    lines += [
        "",
        "Categories (expert categories of at least 5% of the expert's total at the judged moment):",
        "",
        "| file | moment | expert category | oomdoctor components | expert | oomdoctor | off by | grade |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in scores:
        e = s.expected
        for g in e.groups:
            if not g.scored:
                continue
            off = "-" if g.error is None else f"{g.error:.0%}"
            lines.append(
                f"| {_short(e.file)} | {e.components_at} | {_cell(' + '.join(g.names))} | {' + '.join(g.classes)} "
                f"| {_size(g.expert_bytes)} ({g.share:.0%}) | {_size(g.oomdoctor_bytes)} | {off} | {g.grade} |"
            )
        shown = {c: n for c, n in s.unclaimed.items() if e.total_bytes and n >= CATEGORY_SHARE * e.total_bytes}
        if shown:
            extra = ", ".join(f"{cls} {_size(size)}" for cls, size in sorted(shown.items()))
            lines.append(f"| {_short(e.file)} | {e.components_at} | (no expert category) | {extra} | | | | |")
    c = t["categories"]
    lines += [
        "",
        f"verdicts {t['verdicts_right']}/{t['files']}, moments {t['moments_right']}/{t['files']}, "
        f"categories {c['right']} right / {c['partial']} partial / {c['wrong']} wrong"
        + (f"; {t['errors']} file(s) without a report" if t["errors"] else ""),
    ]
    return "\n".join(lines) + "\n"


def json_report(scores: list[FileScore], commit: str) -> str:
    files = []
    for s in scores:
        entry = asdict(s)
        entry["expected"].pop("file")
        files.append(entry)
    rules = {
        "right_within": RIGHT_WITHIN,
        "partial_within": PARTIAL_WITHIN,
        "category_share": CATEGORY_SHARE,
    }
    return json.dumps({"oomdoctor": commit, "rules": rules, "totals": totals(scores), "files": files}, indent=2) + "\n"
