"""One line for an OSError met while opening a file or listing a folder, naming the path.

except OSError as error:
    raise access_error(shown, error) from None
"""

from __future__ import annotations

from oomdoctor.errors import LoadError


def access_error(shown: str, error: OSError, *, folder: bool = False, wrong_kind: str | None = None) -> LoadError:
    """The LoadError for `error`, met reading the file (or, with `folder`, listing the folder) `shown`.

    `wrong_kind` replaces the line for a folder given as a file (or a file given as a folder).
    """
    if isinstance(error, FileNotFoundError):
        return LoadError(f"{shown}: no such {'folder' if folder else 'file'}")
    if isinstance(error, NotADirectoryError if folder else IsADirectoryError):
        default = "not a folder" if folder else "is a directory, not a snapshot file"
        return LoadError(f"{shown}: {wrong_kind or default}")
    if isinstance(error, PermissionError):
        return LoadError(f"{shown}: permission denied")
    return LoadError(f"{shown}: cannot {'list' if folder else 'read'} ({error.strerror or error})")
