"""The analysis as GitHub-flavoured Markdown, to paste into an issue.

The verdict, its confidence and summary come first, then the evidence, what to change, memory at
the OOM, live memory by component (exact bytes beside the readable size, so a reader can check the
sums), fragmentation, the what-if, the environment the dump came from, and, collapsed in a
<details> section, the largest live blocks with their allocation stacks.
"""

from __future__ import annotations

from oomdoctor.analysis.diagnosis import human
from oomdoctor.analysis.environment import Environment
from oomdoctor.analysis.results import Analysis, LiveBlock
from oomdoctor.views.report_rows import COMPONENT_LABELS, component_rows, evidence_places, evidence_value, largest_groups, target_context, where_label

TOP_BLOCKS = 10
STACK_FRAMES = 8



def _escape(text: str) -> str:
    """Text outside code: angle brackets would be read as HTML."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _cell(text: str) -> str:
    return _escape(text).replace("|", "\\|").replace("\n", " ")


def _code(text: str) -> str:
    """An inline code span, safe in a table cell."""
    text = text.replace("\n", " ").replace("|", "\\|")
    fence = "``" if "`" in text else "`"
    return f"{fence}{text}{fence}" if fence == "`" else f"{fence} {text} {fence}"


def _exact(size_bytes: int) -> str:
    return f"{size_bytes:,}"


def _fits(value: bool | None) -> str:
    return {True: "yes", False: "no", None: "-"}[value]


def _flag(value: bool | None) -> str:
    return {True: "on", False: "off", None: "unknown"}[value]


def render(analysis: Analysis, *, source: str | None = None, environment: Environment | None = None) -> str:
    lines: list[str] = []
    add = lines.append
    replay = analysis.replay
    where = where_label(analysis)

    add(f"## oomdoctor: `{analysis.verdict}` (confidence {analysis.confidence:.0%})")
    add("")
    add(f"> {_escape(analysis.summary)}")
    add("")
    context = target_context(analysis) + "."
    if source:
        context += f" File: {_code(source)}."
    add(context)
    add("")

    add("### Evidence")
    add("")
    for item in analysis.evidence:
        add(f"- {_evidence(item)}")
    add("")

    if analysis.recommendations:
        add("### What to change")
        add("")
        add("| # | change | saves about | would fit on its own |")
        add("|---:|---|---:|:---:|")
        for position, rec in enumerate(analysis.recommendations, 1):
            add(f"| {position} | {_cell(rec.text)} | {human(rec.estimated_saved_bytes)} | {_fits(rec.would_fit_alone)} |")
        add("")

    _memory(analysis, where, add)
    _components(analysis, add)
    _fragmentation(analysis, add)

    wi = analysis.what_if
    add("### What if the batch (or sequence) were scaled")
    add("")
    note = _escape(wi.note[:1].upper() + wi.note[1:]) + ("" if wi.note.endswith(".") else ".")
    if wi.largest_fitting_scale is not None:
        add(f"Largest scale that fits: **{wi.largest_fitting_scale:.2f}x**. {note}")
    else:
        add(note)
    add("")

    if len(replay.ooms) > 1:
        add("### OOM events on this device")
        add("")
        for oom in replay.ooms:
            fate = "fatal: the one judged here" if oom.fatal else "recovered or caught"
            add(f"- event {oom.event_index}: {human(oom.request_bytes)} ({fate})")
        add("")

    if analysis.steps:
        add("### Steps")
        add("")
        add("| step | peak allocated | allocated at its end | activations peak |")
        add("|---:|---:|---:|---:|")
        for summary in analysis.steps[-8:]:
            add(f"| {summary.step} | {human(summary.peak_allocated_bytes)} | {human(summary.end_allocated_bytes)} | {human(summary.peak_activation_bytes)} |")
        add("")

    if analysis.secondary:
        add("### Also found")
        add("")
        for finding in analysis.secondary:
            add(f"- `{finding.verdict}` (confidence {finding.confidence:.0%}): {_escape(finding.summary)}")
        add("")
    if analysis.unknowns:
        add("### Not determined from this file")
        add("")
        for item in analysis.unknowns:
            add(f"- {_escape(item)}")
        add("")

    if environment is not None:
        _environment(environment, add)
    _live_blocks(analysis, add)
    add("<sub>Made by `oomdoctor report --format md`.</sub>")
    return "\n".join(lines).rstrip() + "\n"


def _evidence(item) -> str:
    text = _escape(item.text)
    value = evidence_value(item)
    if value is not None:
        text += f": **{value}**"
    where_bits = evidence_places(item, _code)
    return text + (f" ({'; '.join(where_bits)})" if where_bits else "")


def _memory(analysis: Analysis, where: str, add) -> None:
    acc = analysis.accounting
    add(f"### Memory {where}")
    add("")
    add("| | size | bytes |")
    add("|---|---:|---:|")
    rows: list[tuple[str, int | None]] = [
        ("device total", acc.device_total_bytes),
        ("outside PyTorch", acc.non_pytorch_bytes),
        ("free on the device", acc.device_free_bytes),
        ("reserved by PyTorch", acc.reserved_bytes),
        ("&nbsp;&nbsp;allocated", acc.allocated_bytes),
        ("&nbsp;&nbsp;&nbsp;&nbsp;of which rounding", acc.rounding_bytes),
        ("&nbsp;&nbsp;cached, free", acc.free_cached_bytes),
        ("&nbsp;&nbsp;&nbsp;&nbsp;releasable", acc.releasable_bytes),
        ("&nbsp;&nbsp;&nbsp;&nbsp;fragments", acc.non_releasable_bytes),
    ]
    if acc.pending_free_bytes:
        rows.append(("&nbsp;&nbsp;pending free", acc.pending_free_bytes))
    for label, value in rows:
        if value is not None:
            add(f"| {label} | {human(value)} | {_exact(value)} |")
    if acc.request_bytes is not None:
        add(f"| **failed request** | **{human(acc.request_bytes)}** | {_exact(acc.request_bytes)} |")
        if acc.message_bytes is not None:
            add(f"| \"Tried to allocate\" in the message | {human(acc.message_bytes)} | {_exact(acc.message_bytes)} |")
    add("")


def _components(analysis: Analysis, add) -> None:
    add("### Live memory by component")
    add("")
    add("| component | size | bytes | share | blocks | method | confidence | largest groups |")
    add("|---|---:|---:|---:|---:|---|---:|---|")
    for share, fraction in component_rows(analysis):
        group_text = "<br>".join(f"{human(g.bytes)} {_code(g.key)}" for g in largest_groups(share))
        percent = f"{fraction:.1%}" if fraction is not None else "-"
        add(
            f"| {COMPONENT_LABELS.get(share.name, share.name)} | {human(share.bytes)} | {_exact(share.bytes)} | {percent} "
            f"| {share.block_count} | {share.method} | {share.confidence:.0%} | {group_text} |"
        )
    add("")


def _fragmentation(analysis: Analysis, add) -> None:
    frag = analysis.fragmentation
    add("### Fragmentation")
    add("")
    add(f"- rounding inside allocated blocks: {human(frag.internal_bytes)}; free cached blocks: {human(frag.external_bytes)}")
    if frag.request_pool is not None:
        add(f"- free in the {frag.request_pool} pool on the request's stream: {human(frag.usable_free_bytes)}, largest block {human(frag.largest_usable_free_block_bytes)}")
        add(f"- would fit if contiguous: {_fits(frag.would_fit_if_contiguous)}")
    add(f"- expandable segments: {_flag(frag.expandable_segments)}")
    if frag.alloc_conf:
        add(f"- `PYTORCH_CUDA_ALLOC_CONF`: {_code(frag.alloc_conf)}")
    add("")


def _environment(env: Environment, add) -> None:
    torch_text = env.torch_version or (f"{env.torch_version_hint} (from the snapshot's keys)" if env.torch_version_hint else None)
    device = env.device_name
    if device and env.device_capability:
        device += f" (compute capability {env.device_capability})"
    if device and env.device_total_bytes is not None:
        device += f", {human(env.device_total_bytes)}"
    rank = None
    if env.rank is not None or env.world_size is not None:
        rank = f"rank {env.rank if env.rank is not None else '?'} of {env.world_size if env.world_size is not None else '?'}"
        if env.local_rank is not None:
            rank += f" (local rank {env.local_rank})"
    rows = [
        ("torch", torch_text),
        ("CUDA", env.cuda_version),
        ("Python", env.python_version),
        ("oomdoctor", env.oomdoctor_version),
        ("GPU", device),
        ("rank", rank),
        ("host", env.host),
        ("pid", str(env.pid) if env.pid is not None else None),
        ("command", " ".join(env.argv) if env.argv else None),
        ("PYTORCH_CUDA_ALLOC_CONF", env.alloc_conf),
        ("history recorded with", env.recording),
        ("dump written", {"oom": "at the OOM", "manual": "on request (oomdoctor.dump())", "peak": "at the peak"}.get(env.reason or "", env.reason)),
        ("exception", env.exception_type),
        ("rehearsal", "yes: a simulated allocator on the CPU (oomdoctor rehearse)" if env.rehearsed else None),
        ("file", " / ".join(x for x in (env.container, env.source_format) if x) or None),
    ]
    add("### Environment")
    add("")
    add("| | |")
    add("|---|---|")
    for label, value in rows:
        if value:
            add(f"| {label} | {_code(value)} |")
    add("")


def _live_blocks(analysis: Analysis, add) -> None:
    blocks = sorted(analysis.live_blocks, key=lambda b: (-b.size_bytes, b.address))[:TOP_BLOCKS]
    if not blocks:
        return
    add("<details>")
    add(f"<summary>The {len(blocks)} largest live blocks (of {len(analysis.live_blocks)}) and where they were allocated</summary>")
    add("")
    add("| block | size | component | phase | step | name |")
    add("|---|---:|---|---|---:|---|")
    for block in blocks:
        step = "" if block.step is None else str(block.step)
        name = _code(block.name) if block.name else ""
        add(f"| `{block.address:#x}` | {human(block.size_bytes)} | {COMPONENT_LABELS.get(block.component, block.component)} | {block.phase.replace('_', ' ')} | {step} | {name} |")
    add("")
    for block in blocks:
        add(f"`{block.address:#x}` ({human(block.size_bytes)}, {_stack_origin(block)}):")
        add("")
        if block.frames:
            add("```")
            for frame in block.frames[:STACK_FRAMES]:
                add(f"{frame.filename}:{frame.line} in {frame.name}")
            if len(block.frames) > STACK_FRAMES:
                add(f"... {len(block.frames) - STACK_FRAMES} more frames")
            add("```")
        else:
            add("no stack recorded")
        add("")
    add("</details>")
    add("")


def _stack_origin(block: LiveBlock) -> str:
    if block.alloc_index is None:
        return "allocated before the trace began"
    return f"allocated at event {block.alloc_index}"
