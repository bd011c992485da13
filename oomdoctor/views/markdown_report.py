"""The analysis as GitHub-flavoured Markdown, to paste into an issue.

The verdict, its confidence and summary come first, then the evidence, what to change, memory at
the OOM, live memory by component (exact bytes beside the readable size, so a reader can check the
sums), fragmentation, the what-if, the environment the dump came from, and, collapsed in a
<details> section, the largest live blocks with their allocation stacks.

Whatever the dump holds, the report stays safe to paste into an issue (and to print to a terminal):
every string from the file is made printable (safetext.printable: controls escaped, one line,
bounded) and then shown either as escaped text (inline_text), as a code span whose fence outlasts
any run of backticks in it (code_span), or in a fenced block whose fence outlasts any in its lines
(code_block). Only the report's own HTML (<details>, <summary>, <br>, <sub>), headings, links (none)
and emphasis are live; `@name` and `#12` from the file never notify anyone.
"""

from __future__ import annotations

import re

from oomdoctor.analysis.environment import Environment
from oomdoctor.analysis.results import Analysis, LiveBlock
from oomdoctor.safetext import printable
from oomdoctor.units import human_size as human
from oomdoctor.views import phrasing
from oomdoctor.views.frames import BASIS_WORDS, shown_frames, without_user_code
from oomdoctor.views.report_rows import (
    COMPONENT_LABELS,
    DEVICE_COLUMNS,
    ESTIMATE_NOTE,
    NO_FRAMES_GROUP,
    allocated_rows,
    cannot_tell,
    changes_basis,
    component_rows,
    device_rows,
    evidence_places,
    evidence_value,
    largest_groups,
    layout_estimated,
    main_risk,
    step_end_note,
    steps_shown,
    target_context,
    where_label,
)

TOP_BLOCKS = 10
STACK_FRAMES = 8
MAX_ENVIRONMENT_ROWS = 64  # environment variables shown (a GitHub comment holds 65,536 characters)
MAX_ENVIRONMENT_VALUE = 200

# Characters that open Markdown or HTML in running text: backslash (it would escape what follows),
# backticks (code spans), brackets (links, images, footnotes, alerts, task boxes), `*` and `~`
# (emphasis, strikethrough), `$` (GitHub's math) and `!` before `[` (images). `<`, `>` and `&`
# become entities (HTML, autolinks, character references); `_` is handled apart (_UNDERSCORES),
# `@` and `#` by _NOTIFIES.
_SPECIAL = re.compile(r"[\\`*~$\[\]]|!(?=\[)")
_ENTITIES = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}
_HTML = re.compile("[&<>]")
# A run of underscores opens or closes emphasis only where it is not between two letters or digits
# (CommonMark's flanking rules): body.2.weight.exp_avg is left as it is, _x_ is escaped.
_UNDERSCORES = re.compile("_+")
# GitHub turns `@name` (and `@org/team`) into a mention that notifies that person, and `#12`,
# `owner/repo#12` into a cross-reference that shows up in that issue, even when the `@` or `#` is
# backslash-escaped or written as an entity: it looks at the rendered text, skipping only code,
# links and preformatted blocks. So an `@` before a letter or digit, and a `#` before a digit, are
# written as a one-character code span (`` `@`name ``): visible, copied as they were, and never a
# mention or a reference, whatever the text around them.
_NOTIFIES = re.compile(r"@(?=\w)|#(?=\d)")
# At the start of a list item or quote (`- {text}`, `> {text}`) these would open a heading or a
# list inside it.
_BLOCK_START = re.compile(r"^( *)(?:(#|[+-](?= |$))|(\d{1,9})([.)])(?= |$))")
_BACKTICKS = re.compile("`+")


def _underscores(match: re.Match[str]) -> str:
    text, start, end = match.string, match.start(), match.end()
    inside_word = start > 0 and end < len(text) and text[start - 1].isalnum() and text[end].isalnum()
    return match.group() if inside_word else "\\_" * (end - start)


def _block_start(match: re.Match[str]) -> str:
    indent, marker, number, delimiter = match.groups()
    return f"{indent}\\{marker}" if marker else f"{indent}{number}\\{delimiter}"


def inline_text(text: object, *, cell: bool = False) -> str:
    """A string from the file as literal Markdown text, to stand after `- `, `> ` or in a table
    cell (`cell`: pipes escaped too): made printable (controls escaped, one line, bounded), then
    every character that could open a link, image, HTML, code or emphasis escaped, and `@name`,
    `#12` kept from notifying anyone (see _NOTIFIES). Ordinary prose comes out unchanged."""
    text = printable(text)
    text = _SPECIAL.sub(lambda m: "\\" + m.group(), text)
    text = _UNDERSCORES.sub(_underscores, text)
    text = _HTML.sub(lambda m: _ENTITIES[m.group()], text)
    text = _NOTIFIES.sub(lambda m: f"`{m.group()}`", text)
    text = _BLOCK_START.sub(_block_start, text)
    return text.replace("|", "\\|") if cell else text


def code_span(text: object, *, cell: bool = False) -> str:
    """A string from the file as an inline code span (`cell`: inside a table, pipes escaped, which
    GFM requires even in code). Made printable first, so no newline can end the line; the fence is
    one backtick longer than the longest run of backticks inside (CommonMark), padded with a space
    when the text starts or ends with a backtick or a space, so nothing inside can close it."""
    text = printable(text)
    if cell:
        text = text.replace("|", "\\|")
    if not text:
        return "` `"
    fence = "`" * (1 + max((len(run) for run in _BACKTICKS.findall(text)), default=0))
    pad = " " if (text[0] in "` " or text[-1] in "` ") and text.strip(" ") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def code_block(lines: list[str]) -> list[str]:
    """Lines (each already printable: no newline inside) as a fenced code block whose fence of
    backticks is longer than any run of backticks in them, so no line can close it."""
    longest = max((len(run) for line in lines for run in _BACKTICKS.findall(line)), default=0)
    fence = "`" * max(3, longest + 1)
    return [fence, *lines, fence]


def _escape(text: object) -> str:
    return inline_text(text)


def _cell(text: object) -> str:
    return inline_text(text, cell=True)


def _own_cell(text: str) -> str:
    """One of oomdoctor's own sentences (never the file's) in a table cell: what it puts between
    backticks becomes a code span, the rest is escaped as any text is."""
    parts = text.split("`")
    if len(parts) % 2 == 0:  # an unpaired backtick: no code spans
        return _cell(text)
    return "".join(_code(part) if position % 2 else _cell(part) for position, part in enumerate(parts))


def _code(text: object) -> str:
    """An inline code span, safe in a table cell."""
    return code_span(text, cell=True)


def _exact(size_bytes: int) -> str:
    return f"{size_bytes:,}"


def _fits(value: bool | None) -> str:
    return {True: "yes", False: "no", None: "-"}[value]


def render(analysis: Analysis, *, source: str | None = None, environment: Environment | None = None) -> str:
    lines: list[str] = []
    add = lines.append
    replay = analysis.replay
    where = where_label(analysis)

    blind = ", cannot tell" if cannot_tell(analysis) else ""
    add(f"## oomdoctor: {_code(analysis.verdict)}{blind} (confidence {analysis.confidence:.0%})")
    add("")
    add(f"> {_escape(phrasing.summary(analysis.summary))}")
    risk, others, others_title = main_risk(analysis)
    if risk is not None:
        add(">")
        add(
            f"> **Main risk**, {_code(risk.verdict)} (confidence {risk.confidence:.0%}): {_escape(phrasing.summary(risk.summary))}"
        )
    add("")
    context = _escape(target_context(analysis)) + "."
    if source:
        context += f" File: {code_span(source)}."
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
        basis = changes_basis(analysis)
        if basis is not None:  # the savings' basis, when not the OOM instant
            add(f"Largest saving first; {_escape(basis)}.")
            add("")
        add("| # | change | saves about | would fit on its own |")
        add("|---:|---|---:|:---:|")
        for position, rec in enumerate(analysis.recommendations, 1):
            change = _own_cell(phrasing.recommendation(rec))
            regions = phrasing.regions_note(rec)
            if regions:  # the lines from the file as code spans
                called = ", ".join(_code(phrasing.frame_words(f)) for f in phrasing.regions_called_from(rec))
                change += f" ({_cell(regions)} {called}{_cell(phrasing.regions_basis(rec))})"
            add(
                f"| {position} | {change} | {phrasing.saving_cell(rec, where_label(analysis))} | {_fits(rec.would_fit_alone)} |"
            )
        add("")

    _memory(analysis, where, add)
    _components(analysis, add)
    _fragmentation(analysis, add)

    wi = analysis.what_if
    add("### What if the batch (or sequence) were scaled")
    add("")
    words = phrasing.what_if_note(wi)
    note = _escape(words[:1].upper() + words[1:]) + ("" if words.endswith(".") else ".")
    if wi.largest_fitting_scale is not None:
        add(f"Largest scale that fits: **{phrasing.largest_scale(wi)}**. {note}")
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
        step_rows, shown = steps_shown(analysis)
        add(f"### Steps{' (' + shown + ')' if shown else ''}")
        add("")
        add("| step | peak allocated | allocated at its end | activations peak |")
        add("|---:|---:|---:|---:|")
        for summary in step_rows:
            note = step_end_note(analysis, summary)
            after = f" ({note})" if note else ""
            add(
                f"| {summary.step} | {human(summary.peak_allocated_bytes)} | {'at least ' if summary.end_at_least else ''}{human(summary.end_allocated_bytes)}{after} | {'unknown' if summary.peak_activation_bytes is None else human(summary.peak_activation_bytes)} |"
            )
        add("")

    if others:
        add(f"### {others_title}")
        add("")
        for finding in others:
            add(
                f"- {_code(finding.verdict)} (confidence {finding.confidence:.0%}): {_escape(phrasing.summary(finding.summary))}"
            )
        add("")
    if analysis.device_summaries:
        _devices(analysis, add)
    if analysis.unknowns:
        add("### Not determined from this file")
        add("")
        for unknown in phrasing.unknowns(analysis.unknowns):
            add(f"- {_escape(unknown)}")
        add("")

    if environment is not None:
        _environment(environment, add)
    _live_blocks(analysis, add)
    add(
        "<sub>Made by `oomdoctor report --format md`. To attach the dump itself: `oomdoctor redact DUMP"
        " DUMP.redacted.pickle.gz` (GitHub takes `.gz` files up to 25 MB, not `.pickle`).</sub>"
    )
    return "\n".join(lines).rstrip() + "\n"


def _evidence(item) -> str:
    text = _escape(phrasing.evidence(item))
    value = evidence_value(item)
    if value is not None:
        text += f": **{_escape(value)}**"
    where_bits = evidence_places(item, code_span)
    return text + (f" ({'; '.join(where_bits)})" if where_bits else "")


def _devices(analysis: Analysis, add) -> None:
    """The devices compared, one row each, when the snapshot holds several."""
    add("### Devices")
    add("")
    add(_escape(phrasing.devices_intro(analysis.device_summaries)))
    add("")
    add("| " + " | ".join(_cell(c) for c in DEVICE_COLUMNS) + " |")
    add("|---|" + "---:|" * 5 + "---|---|")
    for row in device_rows(analysis):
        add("| " + " | ".join(_cell(c) for c in row) + " |")
    add("")
    for note in phrasing.device_notes(analysis.device_summaries):
        add(f"- {_escape(note)}")
    if phrasing.device_notes(analysis.device_summaries):
        add("")


def _memory(analysis: Analysis, where: str, add) -> None:
    acc = analysis.accounting
    estimated = f" ({ESTIMATE_NOTE})" if layout_estimated(analysis) else ""
    add(f"### Memory {where}")
    add("")
    add("| | size | bytes |")
    add("|---|---:|---:|")
    rows: list[tuple[str, int | None]] = [
        ("device total", acc.device_total_bytes),
        ("outside PyTorch", acc.non_pytorch_bytes),
        ("free on the device", acc.device_free_bytes),
        ("reserved by PyTorch", acc.reserved_bytes),
        *(
            (f"&nbsp;&nbsp;{label}" + (f" ({note})" if note else ""), value)
            for label, value, note in allocated_rows(analysis)
        ),
        ("&nbsp;&nbsp;&nbsp;&nbsp;of which rounding", acc.rounding_bytes),
        ("&nbsp;&nbsp;cached, free" + estimated, acc.free_cached_bytes),
        ("&nbsp;&nbsp;&nbsp;&nbsp;releasable" + estimated, acc.releasable_bytes),
        ("&nbsp;&nbsp;&nbsp;&nbsp;fragments" + estimated, acc.non_releasable_bytes),
    ]
    if acc.pending_free_bytes:
        rows.append(("&nbsp;&nbsp;pending free", acc.pending_free_bytes))
    for label, value in rows:
        if value is not None:
            add(f"| {label} | {human(value)} | {_exact(value)} |")
    if acc.request_bytes is not None:
        add(f"| **failed request** | **{human(acc.request_bytes)}** | {_exact(acc.request_bytes)} |")
        if acc.message_bytes is not None:
            add(
                f'| "Tried to allocate" in the OOM message (computed from the request) | {human(acc.message_bytes)} | {_exact(acc.message_bytes)} |'
            )
    add("")


def _components(analysis: Analysis, add) -> None:
    add("### Live memory by component")
    add("")
    add("| component | size | bytes | share | blocks | method | confidence | largest groups |")
    add("|---|---:|---:|---:|---:|---|---:|---|")
    for share, fraction in component_rows(analysis):
        group_text = "<br>".join(
            f"{human(g.bytes)} {g.key if g.key == NO_FRAMES_GROUP else _code(g.key)}" for g in largest_groups(share)
        )
        percent = f"{fraction:.1%}" if fraction is not None else "-"
        add(
            f"| {_cell(COMPONENT_LABELS.get(share.name, share.name))} | {human(share.bytes)} | {_exact(share.bytes)} | {percent} "
            f"| {share.block_count} | {_cell(share.method)} | {share.confidence:.0%} | {group_text} |"
        )
    add("")


def _fragmentation(analysis: Analysis, add) -> None:
    frag = analysis.fragmentation
    estimated = f" ({ESTIMATE_NOTE})" if layout_estimated(analysis) else ""
    add("### Fragmentation")
    add("")
    add(
        f"- rounding inside allocated blocks: {human(frag.internal_bytes)}; free cached blocks: {human(frag.external_bytes)}{estimated}"
    )
    if frag.request_pool is not None:
        add(
            f"- free in the {_escape(frag.request_pool)} pool on the request's stream: {human(frag.usable_free_bytes)}, largest block {human(frag.largest_usable_free_block_bytes)}{estimated}"
        )
        add(f"- would fit if contiguous: {_fits(frag.would_fit_if_contiguous)}{estimated}")
    add(f"- expandable segments: {phrasing.expandable_words(frag.expandable_segments)}")
    if frag.alloc_conf:
        add(f"- `PYTORCH_CUDA_ALLOC_CONF`: {code_span(frag.alloc_conf)}")
    add("")


def _environment(env: Environment, add) -> None:
    torch_text = env.torch_version or (
        f"{env.torch_version_hint} (from the snapshot's keys)" if env.torch_version_hint else None
    )
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
    run = None
    if env.run_id:
        run = env.run_id if not env.restart_count else f"{env.run_id} (restart {env.restart_count})"
    rows = [
        ("torch", torch_text),
        ("CUDA", env.cuda_version),
        ("cuDNN", env.cudnn_version),
        ("NCCL", env.nccl_version),
        ("Python", env.python_version),
        ("oomdoctor", env.oomdoctor_version),
        ("GPU", device),
        ("rank", rank),
        ("torchrun run", run),
        ("framework", env.framework),
        ("packages", ", ".join(f"{name} {version}" for name, version in env.packages) or None),
        ("host", env.host),
        ("pid", str(env.pid) if env.pid is not None else None),
        ("command", " ".join(env.argv) if env.argv else None),
        ("PYTORCH_CUDA_ALLOC_CONF", env.alloc_conf),
        ("history recorded with", env.recording),
        (
            "dump written",
            {"oom": "at the OOM", "manual": "on request (oomdoctor.dump())", "peak": "at the peak"}.get(
                env.reason or "", env.reason
            ),
        ),
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
    variables = env.environment_variables
    if variables:
        shown = [
            printable(f"{name}={value}", MAX_ENVIRONMENT_VALUE) for name, value in variables[:MAX_ENVIRONMENT_ROWS]
        ]
        if len(variables) > MAX_ENVIRONMENT_ROWS:
            shown.append(f"... and {len(variables) - MAX_ENVIRONMENT_ROWS} more")
        add("<details>")
        add(f"<summary>Environment variables ({len(variables)}; names that look secret are never recorded)</summary>")
        add("")
        for line in code_block(shown):
            add(line)
        add("")
        add("</details>")
        add("")


def _live_blocks(analysis: Analysis, add) -> None:
    blocks = sorted(analysis.live_blocks, key=lambda b: (-b.size_bytes, b.address))[:TOP_BLOCKS]
    if not blocks:
        return
    add("<details>")
    add(
        f"<summary>The {len(blocks)} largest live blocks (of {len(analysis.live_blocks)}) and where they were allocated</summary>"
    )
    add("")
    add("| block | size | component | phase | step | name |")
    add("|---|---:|---|---|---:|---|")
    for block in blocks:
        step = "" if block.step is None else str(block.step)
        name = _code(block.name) if block.name else ""
        component = _cell(COMPONENT_LABELS.get(block.component, block.component))
        add(
            f"| `{block.address:#x}` | {human(block.size_bytes)} | {component} | {_cell(block.phase.replace('_', ' '))} | {step} | {name} |"
        )
    add("")
    if any(shown_frames(block.frames).hidden for block in blocks):
        add(
            "Each stack starts at the line of your code that allocated the block, its callers after it;"
            " torch, library and C++ frames are hidden (the JSON report and `oomdoctor open` list every frame)."
        )
        add("")
    for block in blocks:
        add(
            f"`{block.address:#x}` ({human(block.size_bytes)}, {_stack_origin(block, bool(analysis.replay.event_count))}):"
        )
        add("")
        if block.frames:
            # the user's line first, its callers after it; full paths, as the JSON report has them
            shown = shown_frames(block.frames)
            stack = [
                f"{printable(frame.filename)}:{printable(frame.line)} in {printable(frame.name)}"
                for frame in shown.frames[:STACK_FRAMES]
            ]
            if len(shown.frames) > STACK_FRAMES:
                stack.append(f"... {len(shown.frames) - STACK_FRAMES} more of {BASIS_WORDS[shown.basis]}")
            hidden = "; ".join(
                filter(None, (without_user_code(shown), shown.hidden_words() and f"{shown.hidden_words()} hidden"))
            )
            if hidden:
                stack.append(f"({hidden})")
            for line in code_block(stack):
                add(line)
        else:
            add("no stack recorded")
        add("")
    add("</details>")
    add("")


def _stack_origin(block: LiveBlock, has_trace: bool) -> str:
    """When the block was allocated: at its event, before the trace, or unknown (no trace at all)."""
    if block.alloc_index is None:
        return (
            "allocated before the trace began"
            if has_trace
            else "allocated at a time the file does not record (no allocation history)"
        )
    return f"allocated at event {block.alloc_index}"
