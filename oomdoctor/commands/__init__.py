"""The CLI's verbs, one module each; helpers here are what several verbs share."""

from __future__ import annotations

import argparse

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
    if device is not None and device not in snapshot.devices:
        known = ", ".join(str(d) for d in snapshot.devices) or "none"
        raise OomdoctorError(f"{source}: no device {device} in this snapshot (devices: {known})")
