"""The CLI's verbs, one module each; helpers here are what several verbs share."""

from __future__ import annotations

import argparse
import sys

from oomdoctor.errors import OomdoctorError


def max_bytes_argument(args: argparse.Namespace) -> int | None:
    """The --max-bytes a verb was given, in bytes (None when not given)."""
    if args.max_bytes is None:
        return None
    from oomdoctor.load import parse_size

    try:
        return parse_size(args.max_bytes)
    except (ValueError, TypeError) as error:
        raise OomdoctorError(f"--max-bytes: {error}") from None


def require_device(snapshot, device: int | None, source: str) -> None:
    """Refuse a --device the snapshot has no memory of (None: the failing one, always there)."""
    if device is not None and (device < 0 or device not in snapshot.devices):
        known = ", ".join(str(d) for d in snapshot.devices) or "none"
        raise OomdoctorError(f"{source}: no device {device} in this snapshot (devices: {known})")


def write_output(data: bytes) -> None:
    """All of `data` to standard output: one write() call sends at most about 2 GiB on Linux, and
    a report cut short there must not look complete."""
    out = sys.stdout.buffer
    sys.stdout.flush()
    view = memoryview(data)
    step = 1 << 30
    for start in range(0, len(view), step):
        chunk = view[start : start + step]
        while chunk:
            written = out.write(chunk)
            if written is None:  # a non-blocking stream that took nothing yet
                continue
            chunk = chunk[written:]
    out.flush()
