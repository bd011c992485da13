"""Errors that reach the user as one line on stderr and an exit code, never a traceback."""

from __future__ import annotations

EXIT_OK = 0
EXIT_FINDINGS = 1
EXIT_BAD_INPUT = 2


class OomdoctorError(Exception):
    """A problem the user can act on. `str(error)` is the whole message, one line."""

    exit_code = EXIT_BAD_INPUT


class LoadError(OomdoctorError):
    """The input is not a snapshot oomdoctor can read (or not safely)."""
