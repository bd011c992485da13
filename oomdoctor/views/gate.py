"""The lines `--fail-if` prints on stderr when its condition holds: which figure crossed which bound."""

from __future__ import annotations

from oomdoctor.analysis.gate import PERCENT, Crossing
from oomdoctor.units import human_size


def value_text(value: float, unit: str) -> str:
    if unit == PERCENT:
        return f"{value:+.1f}%"
    return human_size(int(value)) if abs(value) < 1 << 80 else f"{value:.3g} bytes"


def crossing(item: Crossing, who: str | None = None) -> str:
    """'--fail-if: peak is 1.50 GiB (1610612736 bytes), crossing the bound peak > 1GiB'; with
    `who` ('rank 3'): 'rank 3's peak is ...'."""
    value = item.value
    exact = f" ({int(value.value)} bytes)" if value.unit != PERCENT else ""
    return (
        f"--fail-if: {who + chr(39) + 's ' if who else ''}{item.comparison.figure} is {value_text(value.value, value.unit)}{exact}, "
        f"crossing the bound {item.comparison.text}"
    )
