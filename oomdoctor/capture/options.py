"""What `install()` can be told, from keyword arguments or from the environment.

Precedence: a keyword argument beats its environment variable, which beats the default, so a job
can be configured without touching the script (`OOMDOCTOR_DIR=/scratch/dumps torchrun train.py`)
while an explicit argument in code still means what it says. A bad value is reported on stderr and
the default kept: configuration never stops a training run.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_DIR = "oom-dumps"
DEFAULT_MAX_ENTRIES = 100_000
DEFAULT_MAX_DUMPS = 5
STACKS_CHOICES = ("python", "all")
CONTEXT_CHOICES = ("all", "alloc", "state")


@dataclass(frozen=True)
class CaptureOptions:
    dump_dir: Path
    max_entries: int = DEFAULT_MAX_ENTRIES
    stacks: str = "python"  # "all" adds C++ frames, whose symbolization can make a dump take minutes
    context: str = "all"
    max_dumps: int = DEFAULT_MAX_DUMPS


# option name -> (environment variable, parser)
def _positive_int(text: Any) -> int:
    value = int(text)
    if value <= 0:
        raise ValueError("must be a positive integer")
    return value


def _choice(choices: tuple[str, ...]) -> Callable[[Any], str]:
    def parse(text: Any) -> str:
        value = str(text).strip().lower()
        if value not in choices:
            raise ValueError(f"must be one of {', '.join(choices)}")
        return value

    return parse


def _directory(text: Any) -> Path:
    if not str(text).strip():
        raise ValueError("must not be empty")
    return Path(os.path.expanduser(str(text)))


OPTIONS: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "dump_dir": ("OOMDOCTOR_DIR", _directory),
    "max_entries": ("OOMDOCTOR_MAX_ENTRIES", _positive_int),
    "stacks": ("OOMDOCTOR_STACKS", _choice(STACKS_CHOICES)),
    "context": ("OOMDOCTOR_CONTEXT", _choice(CONTEXT_CHOICES)),
    "max_dumps": ("OOMDOCTOR_MAX_DUMPS", _positive_int),
}
ALIASES = {"dir": "dump_dir", "directory": "dump_dir"}
DISABLE_VARIABLE = "OOMDOCTOR_DISABLE"


def disabled_by_environment(environ: Mapping[str, str] | None = None) -> bool:
    value = (os.environ if environ is None else environ).get(DISABLE_VARIABLE, "")
    return value.strip().lower() not in ("", "0", "false", "no")


def resolve_options(
    arguments: Mapping[str, Any],
    environ: Mapping[str, str] | None = None,
    warn: Callable[[str], None] = lambda message: None,
) -> CaptureOptions:
    """Merge keyword arguments over environment variables over defaults; warn about bad values."""
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {"dump_dir": Path(DEFAULT_DIR)}
    for name, (variable, parse) in OPTIONS.items():
        raw = environ.get(variable)
        if raw is None or not raw.strip():
            continue
        try:
            values[name] = parse(raw)
        except (TypeError, ValueError) as error:
            warn(f"ignoring {variable}={raw!r}: {error}")
    for given_name, raw in arguments.items():
        name = ALIASES.get(given_name, given_name)
        if name not in OPTIONS:
            known = ", ".join(sorted(set(OPTIONS) | set(ALIASES)))
            warn(f"ignoring unknown install() option {given_name!r} (known: {known})")
            continue
        if raw is None:
            continue
        try:
            values[name] = OPTIONS[name][1](raw)
        except (TypeError, ValueError) as error:
            warn(f"ignoring install({given_name}={raw!r}): {error}")
    values["dump_dir"] = Path(os.path.abspath(values["dump_dir"]))
    return CaptureOptions(**values)
