"""The answer of `oomdoctor rehearse --world-size N --ranks all` as text, Markdown or JSON (`analysis.world.World`).

The first line is the answer: whether every rank fits, or which ran out, failed or need data; then
a row per simulated rank (its peak allocated and reserved, and the request and line of an OOM or
the reason of a failure) and the maximum over the ranks, with the rank that holds it.
"""

from __future__ import annotations

from typing import Any

import orjson

from oomdoctor.analysis.sweep import OUT_OF_MEMORY, Probe
from oomdoctor.analysis.world import World
from oomdoctor.safetext import printable
from oomdoctor.units import format_size, plural
from oomdoctor.views.sweep import probe_cells, request_json, request_words, table_lines

WORLD_FORMATS = ("text", "md", "json")


def _ranks(ranks: tuple[Probe, ...]) -> str:
    return ", ".join(str(rank.value) for rank in ranks)


def _some(ranks: tuple[Probe, ...], result: World) -> str:
    if result.every_rank:
        return f"{len(ranks)} of {plural(result.world_size, 'rank')} ({_ranks(ranks)})"
    return f"{len(ranks)} of the {plural(len(result.ranks), 'rank')} rehearsed ({_ranks(ranks)})"


def headline(result: World, *, device_memory_bytes: int, script: str) -> str:
    where = f"{script} at world size {result.world_size}, a simulated {format_size(device_memory_bytes)} GPU a rank"
    if result.out_of_memory:
        return f"Out of memory on {_some(result.out_of_memory, result)}: {where}"
    if result.failed:
        return f"Failed on {_some(result.failed, result)}: {script} stopped before running out of memory"
    if result.needs_data:
        return f"Cannot rehearse without data on {_some(result.needs_data, result)}: {script}"
    if result.every_rank:
        return f"Fits on every rank: {where}"
    return f"Fits on the {plural(len(result.ranks), 'rank')} rehearsed ({_ranks(result.ranks)}): {where}"


def _detail(rank: Probe) -> str:
    if rank.outcome == OUT_OF_MEMORY:
        return request_words(rank.request)
    return rank.reason or ""


def _rows(result: World) -> list[tuple[str, str, str, str, str]]:
    return [(*probe_cells(rank), _detail(rank)) for rank in result.ranks]


def _maximum(result: World, usable_bytes: int) -> str | None:
    allocated, reserved = result.most_allocated, result.most_reserved
    if allocated is None or reserved is None:
        return None
    line = (
        f"max: {format_size(allocated.peak_allocated_bytes)} allocated (rank {allocated.value}), "
        f"{format_size(reserved.peak_reserved_bytes)} reserved by PyTorch (rank {reserved.value})"
    )
    if result.all_fit:
        line += f"; {format_size(max(0, usable_bytes - reserved.peak_reserved_bytes))} to spare"
    return line


def render_world_text(
    result: World, *, device_memory_bytes: int, usable_bytes: int, script: str, mode: str, dumps: list[str]
) -> str:
    lines = [f"{headline(result, device_memory_bytes=device_memory_bytes, script=script)} — {mode}, experimental"]
    rows = [("rank", "result", "peak allocated", "peak reserved", ""), *_rows(result)]
    lines += table_lines(rows, "  ")
    maximum = _maximum(result, usable_bytes)
    if maximum is not None:
        lines.append(f"  {maximum}")
    lines.extend(f"  dump: {dump}  (oomdoctor report {dump})" for dump in dumps)
    return "\n".join(printable(line, None) for line in lines)


def render_world_markdown(
    result: World, *, device_memory_bytes: int, usable_bytes: int, script: str, mode: str, dumps: list[str]
) -> str:
    from oomdoctor.views.markdown_report import inline_text

    first = headline(result, device_memory_bytes=device_memory_bytes, script=script)
    lines = [f"## {inline_text(first)}", "", f"_{inline_text(mode)}, experimental_", ""]
    lines += ["| rank | result | peak allocated | peak reserved | |", "|---|---|---|---|---|"]
    lines += [f"| {' | '.join(inline_text(cell, cell=True) for cell in row)} |" for row in _rows(result)]
    maximum = _maximum(result, usable_bytes)
    if maximum is not None:
        lines += ["", f"- {inline_text(maximum)}"]
    lines += [f"- dump: {inline_text(dump)}" for dump in dumps]
    return "\n".join(lines)


def world_rows(result: World, *, device_memory_bytes: int, script: str) -> dict[str, Any]:
    """The ranks as plain data (the JSON form)."""
    allocated, reserved = result.most_allocated, result.most_reserved
    return {
        "script": script,
        "world_size": result.world_size,
        "device_memory_bytes": device_memory_bytes,
        "headline": headline(result, device_memory_bytes=device_memory_bytes, script=script),
        "all_fit": result.all_fit,
        "ranks": [
            {
                "rank": rank.value,
                "outcome": rank.outcome,
                "fits": rank.fits,
                "peak_allocated_bytes": rank.peak_allocated_bytes,
                "peak_reserved_bytes": rank.peak_reserved_bytes,
                "peak_requested_bytes": rank.peak_requested_bytes,
                "request": request_json(rank.request),
                "reason": rank.reason,
                "dumps": list(rank.dumps),
            }
            for rank in result.ranks
        ],
        "max_allocated_bytes": allocated.peak_allocated_bytes if allocated else None,
        "max_allocated_rank": allocated.value if allocated else None,
        "max_reserved_bytes": reserved.peak_reserved_bytes if reserved else None,
        "max_reserved_rank": reserved.value if reserved else None,
        "max_requested_bytes": max((rank.peak_requested_bytes for rank in result.ranks), default=None),
    }


def render_world(
    result: World,
    output_format: str,
    *,
    device_memory_bytes: int,
    usable_bytes: int,
    script: str,
    fake: bool,
    dumps: list[str] | None = None,
) -> str:
    """`usable_bytes`: the device less what is held outside PyTorch; `dumps`: the OOM dumps the ranks left."""
    dumps = list(dumps or [])
    if output_format == "json":
        rows = world_rows(result, device_memory_bytes=device_memory_bytes, script=script)
        rows.update(fake=fake)
        return orjson.dumps(rows, option=orjson.OPT_INDENT_2).decode()
    mode = "rehearsal without data" if fake else "rehearsal"
    render = render_world_markdown if output_format == "md" else render_world_text
    return render(
        result,
        device_memory_bytes=device_memory_bytes,
        usable_bytes=usable_bytes,
        script=script,
        mode=mode,
        dumps=dumps,
    )
