"""Every simulated rank of `oomdoctor rehearse --world-size N --ranks all`: one rehearsal a rank.

Each rank is rehearsed in its own process (the command does that) and comes back as a
`sweep.Probe` whose `value` is the rank. `world(...)` puts them in rank order and finds the rank
that needs the most; the run fits when every rank fits. No I/O: the rehearsals are given.
"""

from __future__ import annotations

from dataclasses import dataclass

from oomdoctor.analysis.sweep import FAILED, FITS, NEEDS_DATA, OUT_OF_MEMORY, Probe


@dataclass(frozen=True, slots=True)
class World:
    world_size: int
    ranks: tuple[Probe, ...]  # in rank order; `value` is the rank

    def _with(self, outcome: str) -> tuple[Probe, ...]:
        return tuple(rank for rank in self.ranks if rank.outcome == outcome)

    @property
    def fitting(self) -> tuple[Probe, ...]:
        return self._with(FITS)

    @property
    def out_of_memory(self) -> tuple[Probe, ...]:
        return self._with(OUT_OF_MEMORY)

    @property
    def failed(self) -> tuple[Probe, ...]:
        return self._with(FAILED)

    @property
    def needs_data(self) -> tuple[Probe, ...]:
        return self._with(NEEDS_DATA)

    @property
    def all_fit(self) -> bool:
        return bool(self.ranks) and len(self.fitting) == len(self.ranks)

    @property
    def every_rank(self) -> bool:
        """Whether every rank of the world was rehearsed (not a chosen few)."""
        return len(self.ranks) == self.world_size

    @property
    def most_allocated(self) -> Probe | None:
        """The rank with the highest allocated peak (the lowest such rank on a tie)."""
        return max(self.ranks, key=lambda rank: (rank.peak_allocated_bytes, -rank.value), default=None)

    @property
    def most_reserved(self) -> Probe | None:
        """The rank with the highest reserved peak (the lowest such rank on a tie)."""
        return max(self.ranks, key=lambda rank: (rank.peak_reserved_bytes, -rank.value), default=None)


def world(world_size: int, ranks: list[Probe]) -> World:
    if world_size < 1:
        raise ValueError(f"a world has at least one rank, not {world_size}")
    outside = [rank.value for rank in ranks if not 0 <= rank.value < world_size]
    if outside:
        raise ValueError(f"ranks {outside} are not in a world of {world_size}")
    return World(world_size, tuple(sorted(ranks, key=lambda rank: rank.value)))
