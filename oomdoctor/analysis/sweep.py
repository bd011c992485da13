"""The search of `oomdoctor rehearse --sweep NAME`: the largest value of one script argument that fits.

`sweep(probe, lo=1, hi=65536)` calls `probe(value)` (one rehearsal of the script with NAME set to
`value`, in a fresh process: the command does that) first at `lo`, doubling until a value does not
fit or `hi` is reached, then bisecting between the last value that fit and the first that did not,
so that the answer's neighbour (answer + 1) is always one of the probes and did not fit. It assumes
memory grows with the value; `contradictions` lists what the probes say against that: a value that
fit above one that did not, or a fitting value whose reserved peak is below a smaller value's. A
probe that ends for another reason (the script failed, or needs data under --fake) stops the search.
No I/O: the probes are given.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

DEFAULT_LO = 1
DEFAULT_HI = 65536

FITS = "fits"
OUT_OF_MEMORY = "out_of_memory"
FAILED = "failed"  # the script stopped for another reason (an exception, a non-zero exit status)
NEEDS_DATA = "needs_data"  # under --fake: the script did something fake tensors cannot do
OUTCOMES = (FITS, OUT_OF_MEMORY, FAILED, NEEDS_DATA)
_STOPS = frozenset({FAILED, NEEDS_DATA})


@dataclass(frozen=True, slots=True)
class FailedRequest:
    """The request the simulated allocator could not satisfy, and where the script made it."""

    request_bytes: int
    op: str
    phase: str | None
    site: str  # "model.py:40 in forward", or "unknown line"
    message: str  # torch's OutOfMemoryError message


@dataclass(frozen=True, slots=True)
class Probe:
    """One rehearsal of the script at one value."""

    value: int
    outcome: str  # one of OUTCOMES
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    request: FailedRequest | None = None  # when it ran out
    reason: str | None = None  # one line, when it failed or needs data
    dumps: tuple[str, ...] = ()  # the dumps the probe left (its OOM dump)
    peak_requested_bytes: int = 0  # the sizes asked for, before the allocator's rounding

    @property
    def fits(self) -> bool:
        return self.outcome == FITS


@dataclass(frozen=True, slots=True)
class Contradiction:
    """Two probes that say memory does not grow with the value."""

    kind: str  # "fits_above_failure" or "peak_fell"
    smaller: Probe
    larger: Probe


@dataclass(frozen=True, slots=True)
class Sweep:
    lo: int
    hi: int
    probes: tuple[Probe, ...]  # in the order they were made
    largest_fit: Probe | None
    smallest_failure: Probe | None  # largest_fit.value + 1 when both exist
    stopped: Probe | None  # the probe that ended the search early (FAILED or NEEDS_DATA)
    contradictions: tuple[Contradiction, ...]

    @property
    def reached_hi(self) -> bool:
        """Every value up to `hi` fits (as far as the probes tell)."""
        return self.largest_fit is not None and self.largest_fit.value >= self.hi and self.smallest_failure is None


def sweep(probe: Callable[[int], Probe], *, lo: int = DEFAULT_LO, hi: int = DEFAULT_HI) -> Sweep:
    if lo < 1 or hi < lo:
        raise ValueError(f"the range must have 1 <= lo <= hi, not lo={lo}, hi={hi}")
    probes: list[Probe] = []
    fit: Probe | None = None
    failure: Probe | None = None

    def done(stopped: Probe | None) -> Sweep:
        return Sweep(lo, hi, tuple(probes), fit, failure, stopped, contradictions(probes))

    value = lo
    while True:
        result = probe(value)
        probes.append(result)
        if result.outcome in _STOPS:
            return done(result)
        if not result.fits:
            failure = result
            break
        fit = result
        if value >= hi:
            break
        value = min(2 * value, hi)
    while fit is not None and failure is not None and failure.value - fit.value > 1:
        result = probe((fit.value + failure.value) // 2)
        probes.append(result)
        if result.outcome in _STOPS:
            return done(result)
        if result.fits:
            fit = result
        else:
            failure = result
    return done(None)


def contradictions(probes: list[Probe]) -> tuple[Contradiction, ...]:
    """What the probes say against memory growing with the value, smallest values first."""
    found: list[Contradiction] = []
    ordered = sorted((probe for probe in probes if probe.outcome in (FITS, OUT_OF_MEMORY)), key=lambda p: p.value)
    failures = [probe for probe in ordered if not probe.fits]
    for probe in ordered:
        if not probe.fits:
            continue
        below = [failure for failure in failures if failure.value < probe.value]
        if below:
            found.append(Contradiction("fits_above_failure", below[0], probe))
    fitting = [probe for probe in ordered if probe.fits]
    for smaller, larger in zip(fitting, fitting[1:]):
        if larger.peak_reserved_bytes < smaller.peak_reserved_bytes:
            found.append(Contradiction("peak_fell", smaller, larger))
    return tuple(found)
