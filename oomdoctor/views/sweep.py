"""The answer of `oomdoctor rehearse --sweep NAME` as text, Markdown or JSON (`analysis.sweep.Sweep`).

The first line is the answer: the largest value that fits and its neighbour that does not, with the
request that neighbour could not get and where; then the fitting probe's peak, every probe made, the
assumption the search rests on (memory grows with the value) and what the probes say against it. A
search a probe stopped (the script failed, or needs data under --fake) is one line.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from oomdoctor.analysis.sweep import FITS, NEEDS_DATA, OUT_OF_MEMORY, Contradiction, FailedRequest, Probe, Sweep
from oomdoctor.safetext import printable
from oomdoctor.units import format_size

SWEEP_FORMATS = ("text", "md", "json")
# how a probe (a sweep's value, or a rank of `--world-size`) came out, in the tables of both
RESULT_WORDS = {FITS: "fits", OUT_OF_MEMORY: "runs out", NEEDS_DATA: "needs data"}


def request_words(request: FailedRequest | None) -> str:
    """'the request of 21.00 MiB (aten.mm.default) in backward at train.py:33' (a probe's OOM)."""
    if request is None:
        return "the request it could not get is not known"
    phase = f" in {request.phase.replace('_', ' ')}" if request.phase else ""
    return f"the request of {format_size(request.request_bytes)} ({request.op}){phase} at {request.site}"


def _stopped_line(result: Sweep, name: str, script: str) -> str:
    probe = result.stopped
    assert probe is not None
    if probe.outcome == NEEDS_DATA:
        return f"Sweep stopped at {name} {probe.value}: cannot rehearse without data: {probe.reason}"
    return f"Sweep stopped at {name} {probe.value}: {script} failed before running out of memory: {probe.reason}"


def headline(result: Sweep, *, name: str, device_memory_bytes: int, script: str) -> str:
    """The answer in one line (or the one line of a stopped search)."""
    if result.stopped is not None:
        return _stopped_line(result, name, script)
    device = format_size(device_memory_bytes)
    fit, failure = result.largest_fit, result.smallest_failure
    if fit is None:
        assert failure is not None
        return (
            f"Nothing fits: {name} {failure.value} (--lo, the smallest tried) runs out in {device}: "
            f"{request_words(failure.request)}"
        )
    if failure is None:
        return (
            f"Largest {name} that fits in {device}: {fit.value}, the top of the range "
            f"(--hi {result.hi}; larger values were not tried)"
        )
    return f"Largest {name} that fits in {device}: {fit.value} ({failure.value} runs out: {request_words(failure.request)})"


def _contradiction(item: Contradiction, name: str) -> str:
    if item.kind == "fits_above_failure":
        return (
            f"{name} {item.larger.value} fits though {item.smaller.value} ran out: memory does not grow with "
            f"{name} here, so a value between the probes may behave differently; check values near the answer"
        )
    return (
        f"{name} {item.larger.value} reserved {format_size(item.larger.peak_reserved_bytes)} at its peak, less than "
        f"{item.smaller.value}'s {format_size(item.smaller.peak_reserved_bytes)}: memory does not grow steadily "
        f"with {name} (rounding, caching, fragmentation), so check values near the answer"
    )


def _assumption(result: Sweep, name: str) -> str:
    agree = "; the probes agree" if not result.contradictions else "; the probes disagree:"
    return f"assumes memory grows with {name} (doubling from --lo {result.lo}, then bisection){agree}"


def _probe_rows(result: Sweep) -> list[tuple[str, str, str, str]]:
    return [probe_cells(probe) for probe in result.probes]


def probe_cells(probe: Probe) -> tuple[str, str, str, str]:
    """A probe's value, how it came out, its peak allocated and reserved: a row of either table."""
    return (
        str(probe.value),
        RESULT_WORDS.get(probe.outcome, probe.outcome),
        format_size(probe.peak_allocated_bytes),
        format_size(probe.peak_reserved_bytes),
    )


def table_lines(rows: Sequence[tuple[str, ...]], indent: str) -> list[str]:
    """The rows with their first four cells aligned (two left, two right: the figures), any
    further cell after them as it is."""
    widths = [max(len(row[column]) for row in rows) for column in range(4)]
    return [
        (
            f"{indent}{row[0]:<{widths[0]}}  {row[1]:<{widths[1]}}  {row[2]:>{widths[2]}}  {row[3]:>{widths[3]}}"
            + "".join(f"  {cell}" for cell in row[4:])
        ).rstrip()
        for row in rows
    ]


def _peak(fit: Probe, usable_bytes: int) -> str:
    spare = max(0, usable_bytes - fit.peak_reserved_bytes)
    return (
        f"peak at {fit.value}: {format_size(fit.peak_allocated_bytes)} allocated, "
        f"{format_size(fit.peak_reserved_bytes)} reserved by PyTorch; {format_size(spare)} to spare"
    )


def render_sweep_text(
    result: Sweep, *, name: str, device_memory_bytes: int, usable_bytes: int, script: str, mode: str, dump: str | None
) -> str:
    first = headline(result, name=name, device_memory_bytes=device_memory_bytes, script=script)
    if result.stopped is not None:
        return printable(first, None)
    lines = [f"{first} — {mode}, experimental"]
    if result.largest_fit is not None:
        lines.append("  " + _peak(result.largest_fit, usable_bytes))
    lines.append(f"  probes ({len(result.probes)}, in the order made):")
    lines += table_lines([(name, "result", "peak allocated", "peak reserved"), *_probe_rows(result)], "    ")
    lines.append("  " + _assumption(result, name))
    lines.extend(f"    {_contradiction(item, name)}" for item in result.contradictions)
    if dump is not None and result.smallest_failure is not None:
        lines.append(f"  dump of {result.smallest_failure.value}: {dump}  (oomdoctor report {dump})")
    return "\n".join(printable(line, None) for line in lines)


def render_sweep_markdown(
    result: Sweep, *, name: str, device_memory_bytes: int, usable_bytes: int, script: str, mode: str, dump: str | None
) -> str:
    from oomdoctor.views.markdown_report import inline_text

    first = headline(result, name=name, device_memory_bytes=device_memory_bytes, script=script)
    if result.stopped is not None:
        return inline_text(first)
    lines = [f"## {inline_text(first)}", "", f"_{inline_text(mode)}, experimental_", ""]
    if result.largest_fit is not None:
        lines.append(f"- {inline_text(_peak(result.largest_fit, usable_bytes))}")
    lines.append(f"- {inline_text(_assumption(result, name))}")
    lines += [f"  - {inline_text(_contradiction(item, name))}" for item in result.contradictions]
    if dump is not None and result.smallest_failure is not None:
        lines.append(f"- dump of {result.smallest_failure.value}: {inline_text(dump)}")
    lines += ["", f"| {inline_text(name, cell=True)} | result | peak allocated | peak reserved |", "|---|---|---|---|"]
    lines += [f"| {' | '.join(row)} |" for row in _probe_rows(result)]
    return "\n".join(lines)


def request_json(request: FailedRequest | None) -> dict[str, Any] | None:
    if request is None:
        return None
    return {
        "request_bytes": request.request_bytes,
        "op": request.op,
        "phase": request.phase,
        "site": request.site,
        "message": request.message,
    }


def _probe_json(probe: Probe | None) -> dict[str, Any] | None:
    if probe is None:
        return None
    return {
        "value": probe.value,
        "outcome": probe.outcome,
        "fits": probe.fits,
        "peak_allocated_bytes": probe.peak_allocated_bytes,
        "peak_reserved_bytes": probe.peak_reserved_bytes,
        "request": request_json(probe.request),
        "reason": probe.reason,
    }


def sweep_rows(result: Sweep, *, name: str, device_memory_bytes: int, script: str) -> dict[str, Any]:
    """The sweep as plain data (the JSON form)."""
    return {
        "name": name,
        "script": script,
        "device_memory_bytes": device_memory_bytes,
        "lo": result.lo,
        "hi": result.hi,
        "headline": headline(result, name=name, device_memory_bytes=device_memory_bytes, script=script),
        "largest_fit": result.largest_fit.value if result.largest_fit is not None else None,
        "smallest_failure": result.smallest_failure.value if result.smallest_failure is not None else None,
        "reached_hi": result.reached_hi,
        "peak_allocated_bytes": result.largest_fit.peak_allocated_bytes if result.largest_fit else None,
        "peak_reserved_bytes": result.largest_fit.peak_reserved_bytes if result.largest_fit else None,
        "failing_request": request_json(result.smallest_failure.request) if result.smallest_failure else None,
        "assumes_monotone": True,
        "contradictions": [
            {"kind": item.kind, "smaller": item.smaller.value, "larger": item.larger.value}
            for item in result.contradictions
        ],
        "stopped": _probe_json(result.stopped),
        "probes": [_probe_json(probe) for probe in result.probes],
    }


def render_sweep(
    result: Sweep,
    output_format: str,
    *,
    name: str,
    device_memory_bytes: int,
    usable_bytes: int,
    script: str,
    fake: bool,
    dump: str | None = None,
) -> str:
    """`usable_bytes`: the device less what is held outside PyTorch; `dump`: the neighbour's OOM dump."""
    if output_format == "json":
        rows = sweep_rows(result, name=name, device_memory_bytes=device_memory_bytes, script=script)
        rows.update(fake=fake, dump=dump)
        return orjson.dumps(rows, option=orjson.OPT_INDENT_2).decode()
    mode = "rehearsal without data" if fake else "rehearsal"
    render = render_sweep_markdown if output_format == "md" else render_sweep_text
    return render(
        result,
        name=name,
        device_memory_bytes=device_memory_bytes,
        usable_bytes=usable_bytes,
        script=script,
        mode=mode,
        dump=dump,
    )
