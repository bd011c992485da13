"""The memory plan of a rehearsed run that fits (`oomdoctor rehearse`), as text, Markdown or JSON.

It renders `oomdoctor.analysis.plan.MemoryPlan`; the findings and changes are worded by `phrasing`,
as every report words them.
"""

from __future__ import annotations

from typing import Any

import orjson

from oomdoctor.analysis.plan import MemoryPlan
from oomdoctor.safetext import printable
from oomdoctor.units import format_size
from oomdoctor.views import phrasing

PLAN_FORMATS = ("text", "md", "json")


def _share(size: int, total: int) -> str:
    return f"{format_size(size)} ({100 * size / total:.0f}%)" if total > 0 else format_size(size)


def _words(name: str) -> str:
    return name.replace("_", " ")


def plan_rows(plan: MemoryPlan) -> dict[str, Any]:
    """The plan as plain data (the JSON form)."""
    analysis = plan.analysis
    return {
        "device_memory_bytes": plan.device_memory_bytes,
        "outside_bytes": plan.outside_bytes,
        "peak_allocated_bytes": plan.peak_allocated_bytes,
        "peak_reserved_bytes": plan.peak_reserved_bytes,
        "headroom_bytes": plan.headroom_bytes,
        "dominant": plan.dominant,
        "peak_components": dict(plan.peak_components),
        "phases": [
            {
                "phase": phase.phase,
                "step": phase.step,
                "allocated_bytes": phase.allocated_bytes,
                "reserved_bytes": phase.reserved_bytes,
                "components": dict(phase.components),
            }
            for phase in plan.phases
        ],
        "steps": [
            {
                "step": step.step,
                "peak_allocated_bytes": step.allocated_bytes,
                "peak_reserved_bytes": step.reserved_bytes,
                "optimizer_state_bytes": step.optimizer_state_bytes,
            }
            for step in plan.steps
        ],
        "step_two_jump_bytes": plan.step_two_jump_bytes,
        "verdict": analysis.verdict,
        "summary": phrasing.summary(analysis.summary),
        "recommendations": [phrasing.recommendation(item) for item in analysis.recommendations],
    }


def _lines(plan: MemoryPlan, bullet: str) -> list[str]:
    usable = plan.device_memory_bytes - plan.outside_bytes
    lines = [
        f"{bullet}peak: {format_size(plan.peak_allocated_bytes)} allocated, "
        f"{format_size(plan.peak_reserved_bytes)} reserved by PyTorch, of {format_size(usable)} usable",
        f"{bullet}headroom at the peak: {format_size(plan.headroom_bytes)}",
    ]
    if plan.dominant is not None:
        total = sum(size for _, size in plan.peak_components)
        parts = ", ".join(f"{_words(name)} {_share(size, total)}" for name, size in plan.peak_components)
        lines.append(f"{bullet}at the peak: {parts}")
        lines.append(f"{bullet}what dominates: {_words(plan.dominant)}")
    for step in plan.steps:
        lines.append(
            f"{bullet}step {step.step}: peak {format_size(step.allocated_bytes)} allocated, "
            f"{format_size(step.reserved_bytes)} reserved; optimizer state {format_size(step.optimizer_state_bytes)}"
        )
    if plan.step_two_jump_bytes is not None:
        lines.append(
            f"{bullet}step two: its forward and backward peak is {format_size(max(0, plan.step_two_jump_bytes))} "
            "above step one's (optimizer state made in the first optimizer step stays)"
        )
    return lines


def render_plan_text(plan: MemoryPlan, title: str, notes: list[str]) -> str:
    lines = [title, *_lines(plan, "  ")]
    lines.append("  by phase (the highest point of each):")
    for phase in plan.phases:
        parts = ", ".join(f"{_words(name)} {format_size(size)}" for name, size in phase.components[:4])
        lines.append(
            f"    {_words(phase.phase):<18} {format_size(phase.allocated_bytes):>12} allocated "
            f"{format_size(phase.reserved_bytes):>12} reserved (step {phase.step}){': ' + parts if parts else ''}"
        )
    lines.append(f"  {phrasing.summary(plan.analysis.summary)}")
    for item in plan.analysis.recommendations:
        lines.append(f"  - {phrasing.recommendation(item)}")
    lines.extend(notes)
    return "\n".join(printable(line, None) for line in lines)


def render_plan_markdown(plan: MemoryPlan, title: str, notes: list[str]) -> str:
    from oomdoctor.views.markdown_report import inline_text

    lines = [f"## {inline_text(title)}", "", *(inline_text(line) for line in _lines(plan, "- ")), ""]
    lines += ["| phase | step | allocated | reserved | largest parts |", "|---|---|---|---|---|"]
    for phase in plan.phases:
        parts = ", ".join(f"{_words(name)} {format_size(size)}" for name, size in phase.components[:4])
        lines.append(
            f"| {_words(phase.phase)} | {phase.step} | {format_size(phase.allocated_bytes)} | "
            f"{format_size(phase.reserved_bytes)} | {parts} |"
        )
    lines += ["", inline_text(phrasing.summary(plan.analysis.summary))]
    lines += [f"- {inline_text(phrasing.recommendation(item))}" for item in plan.analysis.recommendations]
    if notes:
        lines += ["", *(f"- {inline_text(note.strip())}" for note in notes)]
    return "\n".join(lines)


def render_plan(plan: MemoryPlan, output_format: str, *, title: str, notes: list[str], extra: dict[str, Any]) -> str:
    """`notes` are the rehearsal's own lines (the fake section); `extra` is added to the JSON."""
    if output_format == "json":
        return orjson.dumps({**plan_rows(plan), **extra}, option=orjson.OPT_INDENT_2).decode()
    if output_format == "md":
        return render_plan_markdown(plan, title, notes)
    return render_plan_text(plan, title, notes)
