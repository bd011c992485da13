"""Two analyses compared: what changed between two dumps, two steps of one dump or two ranks.

    sides = Side.of(analysis_at_target, analysis_at_peak, label="a.pickle", metadata=snapshot.oomdoctor)
    result = compare(side_a, side_b, kind=DIFF_FILES)
    result.at_peak.components, result.at_peak.sites, result.at_target.memory, result.headline

Each side is read at two moments: its peak (the highest allocated bytes; for a step, that step's
peak) and its target (the OOM, else the moment the dump describes; for a step, the step's OOM or
its last event). At each moment the comparison lists the change of every component, of the
allocation sites (a source line or a module path, within a component) that appeared, went, grew
or shrank, largest change first, and of reserved, allocated, cached and fragmented memory. The
`headline` holds what the summary sentence names, and `causes` only what the dumps record: input
tensors whose shapes differ (oomdoctor's registry) and arguments of the command line that differ.
`unlike` says what makes two files or ranks not like for like, as far as the dumps record it: the
devices (which one was judged, total memory, name), the world sizes, the models (the registry's
parameters), the programs, torch's versions.

Pure functions over `Analysis` results; no words (oomdoctor.views.diff_report says it all).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from oomdoctor.analysis.attribution import shares
from oomdoctor.analysis.environment import Environment
from oomdoctor.analysis.replay import columns
from oomdoctor.analysis.results import Analysis, LiveBlock, StepSummary, UnknownKind
from oomdoctor.analysis.sizing import round_size
from oomdoctor.dump_metadata import DumpMetadata
from oomdoctor.metadata import COMPONENT_INPUT, COMPONENT_PARAMETER, COMPONENTS
from oomdoctor.model import ALLOC, FREE_REQUESTED, DeviceTrace, TraceEvent, slashed

DIFF_SCHEMA_VERSION = 1

DIFF_FILES = "files"
DIFF_STEPS = "steps"
DIFF_RANKS = "ranks"

# What a side's moment is (`Moment.kind`).
MOMENT_OOM = "oom"
MOMENT_PEAK = "peak"
MOMENT_DUMP = "dump"
MOMENT_STEP_END = "step-end"  # the last event of a step

SITE_SOURCE_LINE = "source_line"
SITE_MODULE = "module"

APPEARED = "appeared"
WENT = "went"
GREW = "grew"
SHRANK = "shrank"

# A change smaller than this, and than this share of the larger side, is no change.
SAME_BYTES = 4096
ARGV_CHANGES_MAX = 4  # more differing arguments than this: the command lines are simply different

# What makes two sides not like for like (`Unlike.what`).
UNLIKE_DEVICE_MEMORY = "device_memory"  # the devices' total memory differs
UNLIKE_DEVICE_NAME = "device_name"
UNLIKE_DEVICE_INDEX = "device_index"  # the devices judged are not the same index (cuda:1 against cuda:0)
UNLIKE_MODEL = "model"  # the registry's parameters differ (by name, or for two files of one rank by shape)
UNLIKE_PROGRAM = "program"  # the command lines run different scripts
UNLIKE_TORCH = "torch"  # torch's versions differ
UNLIKE_WORLD_SIZE = "world_size"  # the distributed runs' world sizes differ


@dataclass(frozen=True, slots=True)
class Figure:
    """One number on both sides."""

    name: str
    a_bytes: int
    b_bytes: int

    @property
    def delta_bytes(self) -> int:
        return self.b_bytes - self.a_bytes

    @property
    def ratio(self) -> float | None:
        """b / a (None when a is zero)."""
        return self.b_bytes / self.a_bytes if self.a_bytes else None

    @property
    def growth_percent(self) -> float | None:
        return (self.b_bytes - self.a_bytes) * 100.0 / self.a_bytes if self.a_bytes else None

    @property
    def changed(self) -> bool:
        return abs(self.delta_bytes) >= SAME_BYTES


@dataclass(frozen=True, slots=True)
class SiteChange:
    """An allocation site's live bytes on both sides, within one component."""

    kind: str  # SITE_SOURCE_LINE | SITE_MODULE
    key: str  # 'attn.py:88 in forward' or 'model.layers.3.mlp' (strings from the dumps)
    component: str
    a_bytes: int
    b_bytes: int
    a_blocks: int
    b_blocks: int
    status: str  # APPEARED | WENT | GREW | SHRANK

    @property
    def delta_bytes(self) -> int:
        return self.b_bytes - self.a_bytes

    @property
    def ratio(self) -> float | None:
        return self.b_bytes / self.a_bytes if self.a_bytes else None


@dataclass(frozen=True, slots=True)
class Moment:
    """One side at one moment: where it is and what was live there (from an `Analysis`)."""

    kind: str  # MOMENT_OOM | MOMENT_PEAK | MOMENT_DUMP | MOMENT_STEP_END
    event_index: int | None  # None: the dump's own state
    step: int | None
    phase: str
    allocated_bytes: int
    reserved_bytes: int
    free_cached_bytes: int
    fragmented_bytes: int  # free cached memory not in the largest free block of its pool
    largest_free_block_bytes: int
    rounding_bytes: int
    components: tuple[tuple[str, int], ...]  # COMPONENTS order
    blocks: tuple[LiveBlock, ...]
    # blocks were allocated or freed after the moment: the layout there was rebuilt back from the dump
    # (blocks freed since at their rounded requests), so LAYOUT_FIGURES are an estimate
    layout_estimated: bool = False


@dataclass(frozen=True, slots=True)
class InputChange:
    """A model input the registry names on both sides, with a different shape."""

    name: str
    a_shape: tuple[int, ...]
    b_shape: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ArgumentChange:
    """One command-line argument that differs (the option before it, when there is one)."""

    option: str | None
    a_value: str
    b_value: str


@dataclass(frozen=True, slots=True)
class Unlike:
    """One way two sides differ that is not a change of the run compared: its values on each side
    (strings from the dumps, or byte counts as text), and for a model how many parameters differ."""

    what: str  # UNLIKE_*
    a: str
    b: str
    count: int = 0  # UNLIKE_MODEL: parameters named on one side only or shaped differently
    of: int = 0  # UNLIKE_MODEL: parameters named on either side


@dataclass(frozen=True, slots=True)
class Side:
    """What is compared of one dump, step or rank."""

    label: str  # a file name, "step 1", "rank 5"
    at_target: Moment
    at_peak: Moment
    verdict: str
    confidence: float
    target_kind: str  # the analysis' own: "oom" | "peak" | "dump"
    inputs: tuple[tuple[str, tuple[int, ...]], ...] = ()  # (registry name, shape) of the model's inputs
    argv: tuple[str, ...] = ()
    device_total_bytes: int | None = None  # None: the dump does not say
    device_name: str | None = None
    torch_version: str | None = None
    world_size: int | None = None
    rank: int | None = None
    device: int | None = None  # the index of the device judged
    parameters: tuple[tuple[str, tuple[int, ...]], ...] = ()  # (registry name, shape) of the parameters

    @classmethod
    def of(
        cls,
        at_target: Analysis,
        at_peak: Analysis,
        *,
        label: str,
        metadata: DumpMetadata | None = None,
        environment: Environment | None = None,
        argv: tuple[str, ...] = (),
        target_moment: str | None = None,
        peak_moment: str = MOMENT_PEAK,
    ) -> Side:
        """A side from its analysis at the target and at the peak (the same object when they
        agree), the registry's inputs and parameters in `metadata`, what `environment` (redacted or
        not) says of the device, torch and the distributed run, and the command line (redacted or not)."""
        inputs: tuple[tuple[str, tuple[int, ...]], ...] = ()
        parameters: tuple[tuple[str, tuple[int, ...]], ...] = ()
        if metadata is not None:
            inputs = _registered(metadata, COMPONENT_INPUT)
            parameters = _registered(metadata, COMPONENT_PARAMETER)
        environment = environment if environment is not None else Environment()
        return cls(
            label=label,
            at_target=moment_of(at_target, target_moment or at_target.replay.target_kind),
            at_peak=moment_of(at_peak, peak_moment),
            verdict=at_target.verdict,
            confidence=at_target.confidence,
            target_kind=at_target.replay.target_kind,
            inputs=inputs,
            argv=argv,
            device_total_bytes=at_target.accounting.device_total_bytes,
            device_name=environment.device_name,
            torch_version=environment.torch_version,
            world_size=environment.world_size,
            rank=environment.rank,
            device=at_target.device,
            parameters=parameters,
        )


def _registered(metadata: DumpMetadata, component: str) -> tuple[tuple[str, tuple[int, ...]], ...]:
    return tuple(
        (t.name, t.shape)
        for t in metadata.tensors
        if t.component == component and t.name is not None and t.shape is not None
    )


@dataclass(frozen=True, slots=True)
class MomentDiff:
    a: Moment
    b: Moment
    components: tuple[Figure, ...]  # every component, COMPONENTS order
    sites: tuple[SiteChange, ...]  # changed sites, largest change first
    memory: tuple[Figure, ...]  # MEMORY_FIGURES order

    def figure(self, name: str) -> Figure | None:
        return next((f for f in (*self.memory, *self.components) if f.name == name), None)


# The memory figures of a moment, in the order the reports list them.
ALLOCATED = "allocated"
RESERVED = "reserved"
FREE_CACHED = "free_cached"
FRAGMENTED = "fragmented"
LARGEST_FREE_BLOCK = "largest_free_block"
ROUNDING = "rounding"
MEMORY_FIGURES = (ALLOCATED, RESERVED, FREE_CACHED, FRAGMENTED, LARGEST_FREE_BLOCK, ROUNDING)
# those read from the layout at the moment: an estimate where it was rebuilt (`Moment.layout_estimated`)
LAYOUT_FIGURES = (FREE_CACHED, FRAGMENTED, LARGEST_FREE_BLOCK, ROUNDING)


@dataclass(frozen=True, slots=True)
class Headline:
    """What the summary sentence names: the peak's change, the component and the site that
    changed most at the peak (None when nothing did), and whether the verdict changed."""

    peak: Figure
    component: Figure | None
    site: SiteChange | None
    verdict_changed: bool


@dataclass(frozen=True, slots=True)
class Diff:
    schema_version: int
    kind: str  # DIFF_FILES | DIFF_STEPS | DIFF_RANKS
    a: Side
    b: Side
    at_peak: MomentDiff
    at_target: MomentDiff
    headline: Headline
    inputs: tuple[InputChange, ...]  # shown by the registry: what may explain the change
    arguments: tuple[ArgumentChange, ...]  # the command lines' differing arguments
    unlike: tuple[Unlike, ...] = ()  # what makes the two not like for like (none for two steps of one dump)

    @property
    def verdict_changed(self) -> bool:
        return self.a.verdict != self.b.verdict


def moment_of(analysis: Analysis, kind: str) -> Moment:
    """The figures of `analysis` at the moment it judged."""
    accounting = analysis.accounting
    pools = analysis.fragmentation.pools
    largest = max((p.largest_free_block_bytes for p in pools), default=0)
    fragmented = sum(p.free_bytes - p.largest_free_block_bytes for p in pools)
    replay = analysis.replay
    return Moment(
        kind=kind,
        event_index=replay.target_index,
        step=analysis.target_step,
        phase=analysis.target_phase,
        allocated_bytes=replay.target_allocated_bytes,
        reserved_bytes=accounting.reserved_bytes,
        free_cached_bytes=accounting.free_cached_bytes,
        fragmented_bytes=fragmented,
        largest_free_block_bytes=largest,
        rounding_bytes=accounting.rounding_bytes,
        components=tuple((c.name, c.bytes) for c in analysis.components),
        blocks=analysis.live_blocks,
        layout_estimated=any(u.kind == UnknownKind.REPLAYED_AFTER_TARGET for u in analysis.unknowns),
    )


def compare(a: Side, b: Side, *, kind: str) -> Diff:
    """What changed from side `a` to side `b`."""
    at_peak = compare_moments(a.at_peak, b.at_peak)
    at_target = compare_moments(a.at_target, b.at_target)
    peak = at_peak.figure(ALLOCATED)
    assert peak is not None
    # What the summary names moved the way the peak did, when it moved.
    sign = (peak.delta_bytes > 0) - (peak.delta_bytes < 0) if peak.changed else 0
    component = _largest((f for f in at_peak.components if f.changed), sign)
    site = _largest(at_peak.sites, sign)
    return Diff(
        schema_version=DIFF_SCHEMA_VERSION,
        kind=kind,
        a=a,
        b=b,
        at_peak=at_peak,
        at_target=at_target,
        headline=Headline(peak, component, site, a.verdict != b.verdict),
        inputs=input_changes(a.inputs, b.inputs),
        arguments=argument_changes(a.argv, b.argv),
        # ranks of one sharded model hold shards of different shapes: shapes tell models apart only
        # between two files of one rank (or of no rank)
        unlike=() if kind == DIFF_STEPS else unlike(a, b, shapes=kind == DIFF_FILES and a.rank == b.rank),
    )


def unlike(a: Side, b: Side, *, shapes: bool = True) -> tuple[Unlike, ...]:
    """What the two sides' dumps record that differs besides the run: the devices, the world sizes,
    the models (the parameters the registries name, and with `shapes` their shapes: ranks of one
    sharded model hold shards of different shapes), the programs, torch's versions. Nothing is said of what a side does
    not record."""
    found = []
    if a.device is not None and b.device is not None and a.device != b.device:
        found.append(Unlike(UNLIKE_DEVICE_INDEX, str(a.device), str(b.device)))
    if a.device_total_bytes is not None and b.device_total_bytes is not None:
        if a.device_total_bytes != b.device_total_bytes:
            found.append(Unlike(UNLIKE_DEVICE_MEMORY, str(a.device_total_bytes), str(b.device_total_bytes)))
    if a.device_name and b.device_name and a.device_name != b.device_name:
        found.append(Unlike(UNLIKE_DEVICE_NAME, a.device_name, b.device_name))
    if a.world_size is not None and b.world_size is not None and a.world_size != b.world_size:
        found.append(Unlike(UNLIKE_WORLD_SIZE, str(a.world_size), str(b.world_size)))
    if a.parameters and b.parameters:
        a_params, b_params = dict(a.parameters), dict(b.parameters)
        names = a_params.keys() | b_params.keys()
        differing = sum(
            1
            for name in names
            if name not in a_params or name not in b_params or (shapes and a_params[name] != b_params[name])
        )
        if differing:
            found.append(Unlike(UNLIKE_MODEL, str(len(a_params)), str(len(b_params)), differing, len(names)))
    if a.argv and b.argv:
        a_program, b_program = _program(a.argv), _program(b.argv)
        if a_program != b_program:
            found.append(Unlike(UNLIKE_PROGRAM, a_program, b_program))
    if a.torch_version and b.torch_version and a.torch_version != b.torch_version:
        found.append(Unlike(UNLIKE_TORCH, a.torch_version, b.torch_version))
    return tuple(found)


def _program(argv: tuple[str, ...]) -> str:
    """The script a command line runs: its first argument's file name."""
    return slashed(argv[0]).rsplit("/", 1)[-1]


def _largest(changes: Iterable[Figure | SiteChange], sign: int):  # type: ignore[no-untyped-def]
    """The largest change in the direction `sign` (either, when 0)."""
    chosen = [c for c in changes if sign == 0 or c.delta_bytes * sign > 0]
    return max(chosen, key=lambda c: abs(c.delta_bytes), default=None)


def compare_moments(a: Moment, b: Moment) -> MomentDiff:
    a_components, b_components = dict(a.components), dict(b.components)
    components = tuple(Figure(name, a_components.get(name, 0), b_components.get(name, 0)) for name in COMPONENTS)
    memory = tuple(Figure(name, _memory(a, name), _memory(b, name)) for name in MEMORY_FIGURES)
    return MomentDiff(a, b, components, site_changes(a.blocks, b.blocks), memory)


def _memory(moment: Moment, name: str) -> int:
    value: int = getattr(moment, f"{name}_bytes")
    return value


def site_changes(a_blocks: Sequence[LiveBlock], b_blocks: Sequence[LiveBlock]) -> tuple[SiteChange, ...]:
    """Every site (source line and module path, per component) whose live bytes changed, largest
    change first."""
    a_sites, b_sites = _sites(a_blocks), _sites(b_blocks)
    changes = []
    for key in a_sites.keys() | b_sites.keys():
        a_bytes, a_count = a_sites.get(key, (0, 0))
        b_bytes, b_count = b_sites.get(key, (0, 0))
        if abs(b_bytes - a_bytes) < SAME_BYTES:
            continue
        status = APPEARED if not a_bytes else WENT if not b_bytes else GREW if b_bytes > a_bytes else SHRANK
        kind, site, component = key
        changes.append(SiteChange(kind, site, component, a_bytes, b_bytes, a_count, b_count, status))
    changes.sort(key=lambda c: (-abs(c.delta_bytes), c.kind != SITE_SOURCE_LINE, c.component, c.key))
    return tuple(changes)


def _sites(blocks: Iterable[LiveBlock]) -> dict[tuple[str, str, str], tuple[int, int]]:
    """(kind, site, component) -> (bytes, blocks), over every live block (no group limit)."""
    sites: dict[tuple[str, str, str], tuple[int, int]] = {}
    for share in shares(list(blocks), group_limit=1 << 30):
        for kind, groups in ((SITE_SOURCE_LINE, share.by_source_line), (SITE_MODULE, share.by_module)):
            for group in groups:
                sites[(kind, group.key, share.name)] = (group.bytes, group.block_count)
    return sites


def input_changes(
    a: Sequence[tuple[str, tuple[int, ...]]], b: Sequence[tuple[str, tuple[int, ...]]]
) -> tuple[InputChange, ...]:
    """Inputs the registry names on both sides whose shapes differ."""
    b_shapes = dict(b)
    return tuple(
        InputChange(name, shape, b_shapes[name]) for name, shape in a if name in b_shapes and b_shapes[name] != shape
    )


def argument_changes(a: Sequence[str], b: Sequence[str]) -> tuple[ArgumentChange, ...]:
    """The arguments two command lines of the same length differ in (none when the program
    differs, the lengths differ or more than ARGV_CHANGES_MAX differ: then nothing is known)."""
    if not a or len(a) != len(b) or a[0] != b[0]:
        return ()
    changes = []
    for position, (a_value, b_value) in enumerate(zip(a, b)):
        if a_value == b_value:
            continue
        before = a[position - 1] if position > 1 and a[position - 1] == b[position - 1] else None
        is_value = not a_value.startswith("-") and not b_value.startswith("-")
        option = before if is_value and before is not None and before.startswith("-") else None
        changes.append(ArgumentChange(option, a_value, b_value))
    return tuple(changes) if len(changes) <= ARGV_CHANGES_MAX else ()


def step_of(steps: Sequence[StepSummary], step: int) -> StepSummary | None:
    return next((s for s in steps if s.step == step), None)


def step_peak_index(
    trace: DeviceTrace | Sequence[TraceEvent], step: StepSummary, divisions: tuple[tuple[int, int], ...] = ()
) -> int:
    """The event of `step` after which the most was allocated (the first such): the walk's own
    count (docs/definitions.md, "The peak"), block sizes rounded as the allocator rounds them."""
    trace = columns(trace)
    live: dict[int, int] = {}
    allocated = 0
    best, best_bytes = step.first_index, None
    for index, action, address, size in zip(range(step.last_index + 1), trace.actions, trace.addrs, trace.sizes):
        if action == ALLOC:
            live[address] = round_size(size, divisions)
            allocated += live[address]
        elif action == FREE_REQUESTED:
            allocated -= live.pop(address, 0) or round_size(size, divisions)
        if index >= step.first_index and (best_bytes is None or allocated > best_bytes):
            best, best_bytes = index, allocated
    return best
