"""What the terminal app shows, as plain data built from an analysis (no Textual, no Rich).

Each tab's widgets only lay out what these builders return, so tests check the data first and the
app second (builder, then presenter).

Every string that comes from the file (frame file and function names, tensor names, segment
types, the file's own name, evidence built from them) leaves these builders through `printable`:
control characters escaped, one line each, bounded, so no terminal escape reaches the screen.
The widgets still wrap each one in a `rich.text.Text` (oomdoctor.tui.safe), never markup.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from oomdoctor.analysis import Replayer
from oomdoctor.analysis.attribution import module_of, source_line
from oomdoctor.analysis.frame_kinds import lead_frame_index
from oomdoctor.analysis.results import Analysis, EventState, LiveBlock, PhaseSpan, SeriesPeak, SeriesPoint
from oomdoctor.metadata import COMPONENTS
from oomdoctor.model import ACTIVE_ALLOCATED, ACTIVE_PENDING_FREE, NO_STACK, DeviceTrace, Segment, Stack
from oomdoctor.safetext import printable
from oomdoctor.units import human_size, plural
from oomdoctor.views import phrasing
from oomdoctor.views.frames import BASIS_WORDS, shown_frames, without_user_code
from oomdoctor.views.report_rows import (
    COMPONENT_LABELS,
    ESTIMATE_NOTE,
    allocated_rows,
    changes_title,
    evidence_line,
    layout_estimated,
    main_risk,
    risk_line,
    target_step_words,
    verdict_words,
    where_label,
)
from oomdoctor.views.shorten import PathStyle, frame_text, shorten_name

PHASE_LETTERS = {
    "forward": "F",
    "backward": "B",
    "optimizer_step": "O",
    "zero_grad": "Z",
    "evaluation": "E",
    "between_steps": "·",
    "before_first_step": "-",
    "unknown": "?",
}
_FIT_WORDS = {True: "would fit on its own", False: "not enough on its own", None: ""}


def phase_words(phase: str) -> str:
    """'optimizer step' for "optimizer_step"; a phase name a marker brought is shown escaped."""
    return printable(phase.replace("_", " "))


# --- Overview -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Section:
    title: str
    lines: tuple[str, ...]  # each one line, printable


def _section(title: str, lines: Iterable[str]) -> Section:
    return Section(printable(title), tuple(printable(line) for line in lines))


def overview_sections(analysis: Analysis, source: str) -> list[Section]:
    """The verdict and summary, then evidence, recommendations and the memory at the target."""
    replay = analysis.replay
    step = target_step_words(analysis)
    event = f", event {replay.target_index} of {replay.event_count}" if replay.target_index is not None else ""
    risk, others, others_title = main_risk(analysis)
    headline = (
        phrasing.summary(analysis.summary),
        *((risk_line(risk),) if risk is not None else ()),
        f"Device {analysis.device} {where_label(analysis)} ({step}{phase_words(analysis.target_phase)}{event}).",
        f"File: {source}",
    )
    sections = [_section(f"Verdict: {verdict_words(analysis)} (confidence {analysis.confidence:.0%})", headline)]
    sections.append(_section("Evidence", tuple(evidence_line(item) for item in analysis.evidence)))
    if analysis.recommendations:
        lines = []
        for position, rec in enumerate(analysis.recommendations, 1):
            fits = _FIT_WORDS[rec.would_fit_alone]
            lines.append(
                f"{position}. {phrasing.recommendation(rec)} ({phrasing.saving(rec, where_label(analysis))}{'; ' + fits if fits else ''})"
            )
            regions = phrasing.regions_line(rec)
            if regions:  # the lines from the file, printable (their own line, as the text report has it)
                lines.append(f"   {regions}")
        sections.append(_section(changes_title(analysis), tuple(lines)))
    sections.append(_section(f"Memory {where_label(analysis)}", tuple(memory_lines(analysis))))
    sections.append(_section("Live memory by component", tuple(component_lines(analysis))))
    if analysis.what_if.largest_fitting_scale is not None:
        sections.append(
            _section(
                "What if the batch were scaled",
                (
                    f"largest scale that fits: {phrasing.largest_scale(analysis.what_if)}"
                    f" ({phrasing.what_if_note(analysis.what_if)})",
                ),
            )
        )
    if others:
        sections.append(_section(others_title, tuple(f"{f.verdict}: {phrasing.summary(f.summary)}" for f in others)))
    if analysis.unknowns:
        sections.append(_section("Not determined from this file", phrasing.unknowns(analysis.unknowns)))
    return sections


def memory_lines(analysis: Analysis) -> list[str]:
    acc = analysis.accounting
    rows: list[tuple[str, int | None, str]] = []
    if acc.device_total_bytes is not None:
        rows.append(("device total", acc.device_total_bytes, ""))
    if acc.non_pytorch_bytes is not None:
        rows.append(("outside PyTorch", acc.non_pytorch_bytes, ""))
    if acc.device_free_bytes is not None:
        rows.append(("free on the device", acc.device_free_bytes, ""))
    rows.append(("reserved by PyTorch", acc.reserved_bytes, ""))
    allocated = allocated_rows(analysis)
    for position, (label, value, note) in enumerate(allocated, 1):
        if position == len(allocated):
            note += f"{'; ' if note else ''}rounding {human_size(acc.rounding_bytes)}"
        rows.append((f"  {label}", value, note))
    rows.append(
        (
            "  cached, free",
            acc.free_cached_bytes,
            (f"{ESTIMATE_NOTE}: " if layout_estimated(analysis) else "")
            + f"releasable {human_size(acc.releasable_bytes)}, fragments {human_size(acc.non_releasable_bytes)}",
        )
    )
    if acc.pending_free_bytes:
        rows.append(("  pending free", acc.pending_free_bytes, ""))
    if acc.request_bytes is not None:
        rows.append(
            (
                "failed request",
                acc.request_bytes,
                f'the OOM message would say "Tried to allocate {human_size(acc.message_bytes)}"',
            )
        )
    if acc.missing_bytes is not None:
        # what it could have had counts the free blocks of its pool: as laid out, an estimate when replayed
        estimate = f"; {ESTIMATE_NOTE}" if layout_estimated(analysis) else ""
        rows.append(("missing", acc.missing_bytes, f"request minus what it could have had{estimate}"))
    return [f"{label:<20} {human_size(value):>12}" + (f"  ({note})" if note else "") for label, value, note in rows]


def component_lines(analysis: Analysis) -> list[str]:
    total = sum(c.bytes for c in analysis.components)
    lines = []
    for share in analysis.components:
        if share.bytes:
            percent = f"{share.bytes / total:6.1%}" if total else ""
            lines.append(
                f"{COMPONENT_LABELS[share.name]:<16} {human_size(share.bytes):>12} {percent}  ({plural(share.block_count, 'block')}, {share.method})"
            )
    return lines or ["no live blocks"]


# --- Timeline -----------------------------------------------------------------------------------


# One letter per component (COMPONENTS order), for the chart and its legend where colour is off.
COMPONENT_LETTERS = {
    "parameters": "P",
    "gradients": "G",
    "optimizer_state": "O",
    "activations": "A",
    "temporaries": "T",
    "inputs": "I",
    "buffers": "B",
    "workspace": "W",
    "preallocated": "R",
    "other": "X",
    "unknown": "?",
}
CHART_MIN_ROWS = 6
CHART_PANE_SHARE = 0.4  # of the Timeline pane's height, for the chart's stacked rows


@dataclass(frozen=True)
class ChartColumn:
    """One column of the timeline chart: the series points it covers and the most allocated bytes
    over their events (the true maximum, `SeriesPeak`), with the components there."""

    first_point: int  # positions in the series, inclusive
    last_point: int
    first_event: int  # the events those points stand for, inclusive
    last_event: int
    peak: SeriesPeak  # the most allocated over those events: the column's height
    phase: str  # at the peak's event
    step: int | None
    oom: bool  # an OOM event lies among them


def chart_rows(pane_height: int) -> int:
    """Stacked rows for a chart in a pane this tall: a share of it, at least CHART_MIN_ROWS."""
    return max(CHART_MIN_ROWS, int(pane_height * CHART_PANE_SHARE))


def axis_label(size_bytes: int) -> str:
    """A size in at most five characters for the chart's axis: '953M', '1.66G', '0'."""
    if size_bytes <= 0:
        return "0"
    for unit, scale in (("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if size_bytes >= scale:
            value = size_bytes / scale
            if value >= 99.95:
                return f"{value:.0f}{unit}"
            return f"{value:.1f}{unit}" if value >= 9.995 else f"{value:.2f}{unit}"
    return f"{size_bytes}B"


class Timeline:
    """The memory series with its phases, the chart's columns, and the cursor arithmetic over it.

    A column's height is the most allocated over the events its points stand for
    (`ReplaySummary.series_peaks`), so the column holding the peak reaches `max_bytes`, the peak.
    """

    def __init__(self, analysis: Analysis, *, scale_bytes: int = 0):
        """`scale_bytes`: a chart top at least this high (two charts drawn to one scale compare)."""
        replay = analysis.replay
        self.series: tuple[SeriesPoint, ...] = replay.series
        if len(replay.series_peaks) == len(self.series):
            self.peaks: tuple[SeriesPeak, ...] = replay.series_peaks
        else:  # a summary without them (made by hand): each point stands for itself
            self.peaks = tuple(SeriesPeak(p.event_index, p.allocated_bytes, p.components) for p in self.series)
        self.event_count = replay.event_count
        self.phases: tuple[PhaseSpan, ...] = analysis.phases
        self._phase_starts = [span.first_index for span in self.phases]
        self._point_events = [point.event_index for point in self.series]
        self.has_steps = bool(analysis.steps)
        self.target_index = replay.target_index
        self.peak_index = replay.peak_index
        self.oom_indices = sorted(oom.event_index for oom in replay.ooms)
        self.peak_bytes = replay.peak_allocated_bytes
        self.max_bytes = max([replay.peak_allocated_bytes, *(p.allocated_bytes for p in self.peaks)]) if self else 0
        if self:
            self.max_bytes = max(self.max_bytes, scale_bytes)
        self._columns: dict[int, list[ChartColumn]] = {}

    def __bool__(self) -> bool:
        return bool(self.series)

    def phase_at(self, event_index: int) -> PhaseSpan | None:
        position = bisect.bisect_right(self._phase_starts, event_index) - 1
        if position < 0:
            return None
        span = self.phases[position]
        return span if span.first_index <= event_index <= span.last_index else None

    def start_index(self) -> int:
        """Where the cursor starts: the target event (the OOM), else the peak, else the last event."""
        for index in (self.target_index, self.peak_index):
            if index is not None:
                return index
        return max(self.event_count - 1, 0)

    def point_position(self, event_index: int) -> int:
        """The series position at or before `event_index`."""
        return max(bisect.bisect_right(self._point_events, event_index) - 1, 0)

    def covering_position(self, event_index: int) -> int:
        """The series position whose events hold `event_index`: the first point at or after it."""
        return min(bisect.bisect_left(self._point_events, event_index), len(self.series) - 1)

    def next_point(self, event_index: int, points: int) -> int:
        """The event `points` sampled points after (or, negative, before) `event_index`."""
        if not self.series:
            return event_index
        position = bisect.bisect_right(self._point_events, event_index) - 1
        if points < 0 and position >= 0 and self._point_events[position] < event_index:
            position += 1  # between two samples: one step back lands on the earlier one
        position = min(max(position + points, 0), len(self.series) - 1)
        return self._point_events[position]

    def clamp(self, event_index: int) -> int:
        return min(max(event_index, 0), max(self.event_count - 1, 0))

    def columns(self, width: int) -> list[ChartColumn]:
        """`width` columns over the series (kept per width: the chart asks at every repaint)."""
        known = self._columns.get(width)
        if known is not None:
            return known
        count = len(self.series)
        if not count or width <= 0:
            return []
        events = self._point_events
        result = []
        for column in range(width):
            first = column * count // width
            last = max(first, (column + 1) * count // width - 1)
            peak = max(self.peaks[first : last + 1], key=lambda p: p.allocated_bytes)
            first_event = events[first - 1] + 1 if first else 0
            last_event = events[last]
            span = self.phase_at(peak.event_index)
            oom = bisect.bisect_left(self.oom_indices, first_event)
            result.append(
                ChartColumn(
                    first,
                    last,
                    first_event,
                    last_event,
                    peak,
                    span.phase if span else "unknown",
                    span.step if span and self.has_steps else None,
                    oom < len(self.oom_indices) and self.oom_indices[oom] <= last_event,
                )
            )
        self._columns[width] = result
        return result

    def cursor_column(self, columns: Sequence[ChartColumn], event_index: int) -> int:
        """The column whose events hold `event_index` (the first, where columns repeat a point)."""
        if not columns:
            return 0
        position = self.covering_position(event_index)
        starts = [column.first_point for column in columns]
        number = bisect.bisect_right(starts, position) - 1
        while number > 0 and columns[number - 1].first_point == columns[number].first_point:
            number -= 1
        return max(number, 0)


def stacked_cells(point: SeriesPoint | SeriesPeak, max_bytes: int, height: int) -> list[int | None]:
    """Component index (into COMPONENTS) filling each cell of one chart column, bottom cell first.

    As many cells as `point.allocated_bytes` is of `max_bytes` (at least one for any bytes); each
    takes the component holding most of the bytes in its band of the components; None above.
    """
    if max_bytes <= 0 or height <= 0:
        return [None] * max(height, 0)
    total = sum(point.components)
    allocated = min(max(point.allocated_bytes, 0), max_bytes)
    filled_cells = round(height * allocated / max_bytes)
    if allocated and not filled_cells:
        filled_cells = 1
    cells: list[int | None] = []
    bounds = []
    running = 0
    for component, value in enumerate(point.components):
        bounds.append((running, running + value, component))
        running += value
    scale = (total or 1) / max(filled_cells, 1)
    for cell in range(height):
        if cell >= filled_cells:
            cells.append(None)
            continue
        low, high = cell * scale, (cell + 1) * scale
        best, best_overlap = len(COMPONENTS) - 1, -1.0
        for start, end, component in bounds:
            overlap = min(end, high) - max(start, low)
            if overlap > best_overlap:
                best, best_overlap = component, overlap
        cells.append(best)
    return cells


# --- Labels and stacks (every tab's block labels and stack panes) -------------------------------

# A block's label in a table or tree: at 80 columns the name or source line gets this many
# characters, and one more for every two columns the terminal has past 80 (`label_width`).
LABEL_WIDTH = 32
FRAMES_KEY = "f"  # the app's key that shows every frame of a stack, or the user's again
STACK_LINE_LIMIT = 500
_PATH_STYLES: dict[int, tuple[Analysis, PathStyle]] = {}


def label_width(terminal_width: int) -> int:
    return max(LABEL_WIDTH, LABEL_WIDTH + (terminal_width - 80) // 2)


def path_style(analysis: Analysis) -> PathStyle:
    """How this analysis's file names are shown: the directory of the user's files stripped.
    Computed once per analysis (the analysis is kept beside it, so its id is not reused)."""
    known = _PATH_STYLES.get(id(analysis))
    if known is not None and known[0] is analysis:
        return known[1]
    style = PathStyle.of_stacks(block.frames for block in analysis.live_blocks)
    if len(_PATH_STYLES) >= 4:
        _PATH_STYLES.clear()
    _PATH_STYLES[id(analysis)] = (analysis, style)
    return style


@dataclass(frozen=True)
class StackText:
    note: str  # what was left out and the key that shows it; "" when the stack is shown whole
    lines: tuple[str, ...]  # one frame a line, printable


def stack_text(frames: Stack, *, all_frames: bool = False, paths: PathStyle | None = None) -> StackText:
    """A block's stack to show: from the user's line outwards, library and C++ frames left out
    (views.frames), or every frame, innermost first, with `all_frames`."""
    if not frames:
        return StackText("", ("(no stack recorded for this block)",))
    paths = paths if paths is not None else PathStyle()
    filtered = shown_frames(frames)
    shown = shown_frames(frames, all_frames=True) if all_frames else filtered
    lines = [frame_text(frame, paths) for frame in shown.frames[:STACK_LINE_LIMIT]]
    if len(shown.frames) > STACK_LINE_LIMIT:
        lines.append(f"... {len(shown.frames) - STACK_LINE_LIMIT} more frames")
    bits = []
    if filtered.hidden:
        if all_frames:
            bits.append(f"all {shown.total} frames; {FRAMES_KEY} shows only {BASIS_WORDS[filtered.basis]}")
        else:
            bits.extend(filter(None, (without_user_code(filtered), f"{filtered.hidden_words()} hidden")))
            bits.append(f"{FRAMES_KEY} shows all")
    if paths.prefix and any(frame.path.startswith(paths.prefix) for frame in shown.frames):
        lines.append(f"(paths under {printable(paths.prefix)})")
    return StackText("; ".join(bits), tuple(lines))


def stack_lines(frames: Stack, *, all_frames: bool = False, paths: PathStyle | None = None) -> list[str]:
    """The frames `stack_text` shows, one `file:line in function` a line."""
    return list(stack_text(frames, all_frames=all_frames, paths=paths).lines)


@dataclass(frozen=True)
class BlockRow:
    address: int
    size_bytes: int
    alloc_index: int | None
    component: str  # "" when the analysis did not place this allocation
    label: str  # registry name, else the user's source line, else why neither is known (printable)
    frames: Stack


def describe_block(
    name: str | None,
    frames: Stack,
    alloc_index: int | None,
    *,
    paths: PathStyle | None = None,
    width: int | None = None,
    has_trace: bool = True,
) -> str:
    """The block's registry name, else its user source line (the frame `source_line` names), else
    why neither is known (`has_trace`: whether the file holds an allocation history at all);
    printable, cut to `width` from the middle (views.shorten)."""
    if name:
        return shorten_name(name, width) if width else printable(name)
    position = lead_frame_index(frames)
    if position is not None:
        return (paths if paths is not None else PathStyle()).frame(frames[position], width)
    if alloc_index is None:
        return "allocated before the trace began" if has_trace else "no stack, no allocation history"
    return "no stack recorded"


def live_rows_at(
    state: EventState,
    trace: DeviceTrace,
    segments: Sequence[Segment],
    analysis: Analysis,
    limit: int | None = None,
    *,
    width: int = LABEL_WIDTH,
) -> list[BlockRow]:
    """The blocks live right after an event, largest first, named where the analysis knows them."""
    paths = path_style(analysis)
    known = {(b.address, b.alloc_index): b for b in analysis.live_blocks}
    final_frames = {b.address: b.frames for s in segments for b in s.blocks if b.state == ACTIVE_ALLOCATED}
    rows = []
    largest = sorted(state.live, key=lambda live: (-live.size_bytes, live.address))[: limit if limit else None]
    for address, alloc_index, size_bytes, _requested in largest:  # LiveAllocation's fields
        block = known.get((address, alloc_index))
        if alloc_index is not None and 0 <= alloc_index < len(trace):
            frames = trace.frames_at(alloc_index)
        else:
            frames = final_frames.get(address, NO_STACK)
        if block is not None and block.frames:
            frames = block.frames
        name = block.name if block is not None else None
        component = block.component if block is not None else ""
        rows.append(
            BlockRow(
                address,
                size_bytes,
                alloc_index,
                component,
                describe_block(
                    name, frames, alloc_index, paths=paths, width=width, has_trace=bool(analysis.replay.event_count)
                ),
                frames,
            )
        )
    return rows


@dataclass(frozen=True)
class EventRow:
    """One trace event for the Timeline's event list."""

    index: int
    action: str  # alloc, free_requested, segment_alloc, ... (printable)
    size_bytes: int
    address: int
    label: str  # the user's source line, else why none is known (printable)
    frames: Stack


EVENTS_AROUND = 8  # events listed before the cursor's, and as many after


def event_rows_around(
    trace: DeviceTrace,
    event_index: int,
    analysis: Analysis,
    *,
    around: int = EVENTS_AROUND,
    width: int = LABEL_WIDTH,
) -> list[EventRow]:
    """The events `around` before and after `event_index` (fewer at the trace's ends), oldest
    first. Only that window of the trace's columns is read (and only its stacks converted), so a
    cursor move costs the same on a trace of a million events as on one of a hundred."""
    count = len(trace)
    if count <= 0:
        return []
    index = min(max(event_index, 0), count - 1)
    first, last = max(index - around, 0), min(index + around + 1, count)
    paths = path_style(analysis)
    rows = []
    for position, action, address, size_bytes in zip(
        range(first, last), trace.actions[first:last], trace.addrs[first:last], trace.sizes[first:last]
    ):
        frames = trace.frames_at(position)
        label = describe_block(
            None, frames, position, paths=paths, width=width, has_trace=bool(analysis.replay.event_count)
        )
        rows.append(EventRow(position, printable(str(action)), size_bytes, address, label, frames))
    return rows


# --- Segments -----------------------------------------------------------------------------------

BAR_ALLOCATED = "█"
BAR_PENDING = "▒"
BAR_FREE = "░"


def segment_bar(segment: Segment, width: int) -> str:
    """The segment's blocks in address order, each cell showing the state holding most of its bytes."""
    if width <= 0 or segment.total_size <= 0:
        return ""
    cells = []
    per_cell = segment.total_size / width
    blocks = segment.blocks
    position = 0
    for cell in range(width):
        low = segment.address + cell * per_cell
        high = low + per_cell
        weights = {BAR_ALLOCATED: 0.0, BAR_PENDING: 0.0, BAR_FREE: 0.0}
        while position < len(blocks) and blocks[position].address + blocks[position].size <= low:
            position += 1
        scan = position
        while scan < len(blocks) and blocks[scan].address < high:
            block = blocks[scan]
            overlap = min(block.address + block.size, high) - max(block.address, low)
            mark = (
                BAR_ALLOCATED
                if block.state == ACTIVE_ALLOCATED
                else BAR_PENDING
                if block.state == ACTIVE_PENDING_FREE
                else BAR_FREE
            )
            weights[mark] += max(overlap, 0.0)
            scan += 1
        # a cell touched by any allocated byte shows it: a small live block pins the whole segment
        cells.append(BAR_ALLOCATED if weights[BAR_ALLOCATED] > 0 else max(weights, key=weights.get))
    return "".join(cells)


def segment_pool(segment: Segment) -> str:
    pool = segment.segment_type
    if segment.pool_id != (0, 0):
        pool = f"private {segment.pool_id} {pool}"
    return printable(pool + (" expandable" if segment.is_expandable else ""))


def largest_free_block_bytes(segment: Segment) -> int:
    return max((b.size for b in segment.blocks if b.state not in (ACTIVE_ALLOCATED, ACTIVE_PENDING_FREE)), default=0)


def fragmentation_lines(analysis: Analysis) -> list[str]:
    frag = analysis.fragmentation
    estimated = f" ({ESTIMATE_NOTE})" if layout_estimated(analysis) else ""
    lines = [
        f"internal (rounding) {human_size(frag.internal_bytes)}, external (free cached) {human_size(frag.external_bytes)}{estimated}"
    ]
    if frag.request_pool is not None:
        fits = {True: "yes", False: "no", None: "unknown"}[frag.would_fit_if_contiguous]
        expandable = phrasing.expandable_words(frag.expandable_segments)
        lines.append(
            f"{frag.request_pool} pool, stream {frag.request_stream}: free {human_size(frag.usable_free_bytes)}, "
            f"largest block {human_size(frag.largest_usable_free_block_bytes)}{estimated}; "
            f"request fits if contiguous: {fits}{estimated}; expandable segments: {expandable}"
        )
    return [printable(line) for line in lines]


def block_rows_of(
    segment: Segment,
    analysis: Analysis,
    trace: DeviceTrace,
    state: EventState | None = None,
    *,
    width: int = LABEL_WIDTH,
) -> list[BlockRow]:
    """Every block of one segment in address order (free gaps too), with stacks where known.

    `segment` is the target's, or one of `state`'s (replayed at another event): there a block is
    named only when it is the same allocation the analysis named (same address and alloc event),
    and its stack is its alloc event's."""
    paths = path_style(analysis)
    named = {b.address: b for b in analysis.live_blocks}
    if state is not None and not state.exact:
        return _replayed_block_rows(segment, analysis, trace, state, paths, width)
    rows = []
    for block in segment.blocks:
        if block.state == ACTIVE_ALLOCATED:
            live = named.get(block.address)
            frames = block.frames or (live.frames if live is not None else NO_STACK)
            alloc_index = live.alloc_index if live is not None else None
            label = describe_block(
                live.name if live is not None else None,
                frames,
                alloc_index,
                paths=paths,
                width=width,
                has_trace=bool(analysis.replay.event_count),
            )
            rows.append(
                BlockRow(
                    block.address, block.size, alloc_index, live.component if live is not None else "", label, frames
                )
            )
        else:
            label = "pending free (waiting for other streams)" if block.state == ACTIVE_PENDING_FREE else "free"
            rows.append(BlockRow(block.address, block.size, None, "", label, block.frames))
    return rows


def _replayed_block_rows(
    segment: Segment, analysis: Analysis, trace: DeviceTrace, state: EventState, paths: PathStyle, width: int
) -> list[BlockRow]:
    known = {(b.address, b.alloc_index): b for b in analysis.live_blocks}
    allocations = {live.address: live for live in state.live}
    rows = []
    for block in segment.blocks:
        if block.state != ACTIVE_ALLOCATED:
            label = "pending free (waiting for other streams)" if block.state == ACTIVE_PENDING_FREE else "free"
            rows.append(BlockRow(block.address, block.size, None, "", label, NO_STACK))
            continue
        allocation = allocations.get(block.address)
        alloc_index = allocation.alloc_index if allocation is not None else None
        named = known.get((block.address, alloc_index))
        frames = named.frames if named is not None and named.frames else NO_STACK
        if not frames and alloc_index is not None and 0 <= alloc_index < len(trace):
            frames = trace.frames_at(alloc_index)
        label = describe_block(
            named.name if named is not None else None,
            frames,
            alloc_index,
            paths=paths,
            width=width,
            has_trace=bool(analysis.replay.event_count),
        )
        component = named.component if named is not None else ""
        rows.append(BlockRow(block.address, block.size, alloc_index, component, label, frames))
    return rows


# --- Components ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class BlockGroup:
    key: str  # a module path, or a source line when the blocks have no registry names (printable)
    bytes: int
    blocks: tuple[LiveBlock, ...]


@dataclass(frozen=True)
class ComponentNode:
    name: str
    bytes: int
    method: str
    confidence: float
    groups: tuple[BlockGroup, ...]


def component_nodes(
    analysis: Analysis, *, width: int = LABEL_WIDTH, blocks: Sequence[LiveBlock] | None = None
) -> list[ComponentNode]:
    """Components with bytes, largest first; in each, blocks grouped by module path or source line
    (each group's key shortened from the middle for the tree: views.shorten).

    `blocks` (`live_blocks_at`: the blocks live at another event) instead of the analysis's: each
    known component holds the bytes of its blocks there, and the blocks the analysis did not place
    (component "") go under one node, NOT_ATTRIBUTED, last."""
    paths = path_style(analysis)
    by_component: dict[str, list[LiveBlock]] = {}
    for block in analysis.live_blocks if blocks is None else blocks:
        by_component.setdefault(block.component, []).append(block)
    nodes = []
    for share in analysis.components:
        members = by_component.get(share.name, [])
        if not members:
            continue
        size_bytes = share.bytes if blocks is None else sum(b.size_bytes for b in members)
        nodes.append(
            ComponentNode(share.name, size_bytes, share.method, share.confidence, _block_groups(members, paths, width))
        )
    nodes.sort(key=lambda node: -node.bytes)
    unplaced = by_component.get(NOT_ATTRIBUTED, []) if blocks is not None else []
    if unplaced:
        size_bytes = sum(b.size_bytes for b in unplaced)
        nodes.append(ComponentNode(NOT_ATTRIBUTED, size_bytes, "", 0.0, _block_groups(unplaced, paths, width)))
    return nodes


def _block_groups(blocks: Sequence[LiveBlock], paths: PathStyle, width: int) -> tuple[BlockGroup, ...]:
    groups: dict[str, list[LiveBlock]] = {}
    shown_keys: dict[str, str] = {}
    for block in blocks:
        key = module_of(block.name) if block.name else (source_line(block.frames) or "(no stack recorded)")
        if key not in groups:
            lead = None if block.name else lead_frame_index(block.frames)
            shown_keys[key] = shorten_name(key, width) if lead is None else paths.frame(block.frames[lead], width)
        groups.setdefault(key, []).append(block)
    ordered = sorted(
        (
            BlockGroup(
                shown_keys[key],
                sum(b.size_bytes for b in members),
                tuple(sorted(members, key=lambda b: -b.size_bytes)),
            )
            for key, members in groups.items()
        ),
        key=lambda group: (-group.bytes, group.key),
    )
    return tuple(ordered)


def component_label(name: str) -> str:
    """'optimizer state'; 'not attributed' for a block the analysis did not place (at another event)."""
    return NOT_ATTRIBUTED_LABEL if name == NOT_ATTRIBUTED else COMPONENT_LABELS.get(name, name)


# --- At the timeline cursor (Allocations and Components follow it) --------------------------------

NOT_ATTRIBUTED = ""  # the component of a block live at the cursor that the analysis did not place
NOT_ATTRIBUTED_LABEL = "not attributed"


_TARGET_WORDS = {"oom": "the OOM", "peak": "the peak", "dump": "the dump's state"}


def target_words(analysis: Analysis) -> str:
    """'the OOM': what the `t` key goes back to."""
    return _TARGET_WORDS.get(analysis.replay.target_kind, "the target")


def cursor_label(event_index: int) -> str:
    """Which moment a tab shows when it follows the timeline cursor away from the target."""
    return f"after event {event_index} (the timeline cursor)"


def cursor_moment(analysis: Analysis, event_index: int | None, replay: Replayer | None) -> int | None:
    """The event a tab that follows the timeline cursor shows: None (the target, as the analysis
    has it) when the cursor is at the target or nowhere yet, or when no replayer is ready."""
    target = analysis.replay.target_index
    return None if event_index is None or event_index == target or replay is None else event_index


def blocks_after(replay: Replayer, event_index: int, analysis: Analysis) -> list[LiveBlock]:
    """The blocks live right after `event_index`, replayed (`live_blocks_at`)."""
    return live_blocks_at(replay.state_at(event_index), replay.trace, replay.segments, analysis)


def live_blocks_at(
    state: EventState, trace: DeviceTrace, segments: Sequence[Segment], analysis: Analysis
) -> list[LiveBlock]:
    """The blocks live right after an event, as the Allocations and Components tabs list them.

    A block that is the same allocation the analysis named (same address and alloc event) is the
    analysis's own, component and all; any other has no component (NOT_ATTRIBUTED: the analysis
    places only what is live at the target, and oomdoctor does not guess), the phase and step of
    its alloc event and that event's stack (as `live_rows_at` names it)."""
    known = {(b.address, b.alloc_index): b for b in analysis.live_blocks}
    final_frames: dict[int, Stack] | None = None
    starts = [span.first_index for span in analysis.phases]
    blocks = []
    for address, alloc_index, size_bytes, requested_bytes in state.live:  # LiveAllocation's fields
        block = known.get((address, alloc_index))
        if block is not None:
            blocks.append(block)
            continue
        if alloc_index is not None and 0 <= alloc_index < len(trace):
            frames = trace.frames_at(alloc_index)
        else:
            if final_frames is None:
                final_frames = {b.address: b.frames for s in segments for b in s.blocks if b.state == ACTIVE_ALLOCATED}
            frames = final_frames.get(address, NO_STACK)
        phase, step = "unknown", None
        if alloc_index is not None:
            position = bisect.bisect_right(starts, alloc_index) - 1
            if position >= 0 and analysis.phases[position].last_index >= alloc_index:
                span = analysis.phases[position]
                phase, step = span.phase, span.step if analysis.steps else None
        else:
            phase = "before_first_step"
        blocks.append(
            LiveBlock(
                address,
                size_bytes,
                requested_bytes,
                alloc_index,
                phase,
                step,
                NOT_ATTRIBUTED,
                "",
                0.0,
                None,
                frames,
            )
        )
    return blocks


# --- Allocations --------------------------------------------------------------------------------


@dataclass(frozen=True)
class AllocationRow:
    block: LiveBlock
    label: str
    search_text: str  # lower-case: name, component, phase and every frame, for the search box


def allocation_rows(
    analysis: Analysis, *, width: int = LABEL_WIDTH, blocks: Sequence[LiveBlock] | None = None
) -> list[AllocationRow]:
    """Every block live at the target (or `blocks`: `live_blocks_at` another event), largest first."""
    paths = path_style(analysis)
    rows = []
    stack_texts: dict[int, str] = {}  # by the stack's identity: blocks share their stacks
    for block in sorted(analysis.live_blocks if blocks is None else blocks, key=lambda b: (-b.size_bytes, b.address)):
        label = describe_block(
            block.name,
            block.frames,
            block.alloc_index,
            paths=paths,
            width=width,
            has_trace=bool(analysis.replay.event_count),
        )
        frames = stack_texts.get(id(block.frames))
        if frames is None:
            frames = stack_texts[id(block.frames)] = " ".join(f"{f.filename}:{f.line} {f.name}" for f in block.frames)
        text = " ".join(
            (
                block.name or "",
                source_line(block.frames) or label,
                block.component,
                component_label(block.component),
                block.phase,
                frames,
                f"{block.address:#x}",
            )
        )
        rows.append(AllocationRow(block, label, text.lower()))
    return rows


def filter_rows(rows: Iterable[AllocationRow], query: str) -> list[AllocationRow]:
    """Rows whose name, component, phase, address or any frame contains every word of `query`."""
    words = query.lower().split()
    return [row for row in rows if all(word in row.search_text for word in words)]


# --- Going from evidence to what it cites ---------------------------------------------------------


@dataclass(frozen=True)
class EvidencePlace:
    line: str  # the evidence as the overview words it (printable)
    event_index: int | None
    address: int | None

    @property
    def goes_somewhere(self) -> bool:
        return self.event_index is not None or self.address is not None


def evidence_places_of(analysis: Analysis) -> list[EvidencePlace]:
    """Each piece of evidence with the event and block it was read at, in the overview's order."""
    return [EvidencePlace(printable(evidence_line(item)), item.event_index, item.address) for item in analysis.evidence]
