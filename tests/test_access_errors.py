"""The one-line messages for files and folders that cannot be opened (oomdoctor.load.access)."""

import errno

import pytest

from oomdoctor.load.access import access_error


@pytest.mark.parametrize(
    "error, folder, expected",
    [
        (FileNotFoundError(errno.ENOENT, "No such file or directory"), False, "dump.pickle: no such file"),
        (FileNotFoundError(errno.ENOENT, "No such file or directory"), True, "dump.pickle: no such folder"),
        (IsADirectoryError(errno.EISDIR, "Is a directory"), False, "dump.pickle: is a directory, not a snapshot file"),
        (NotADirectoryError(errno.ENOTDIR, "Not a directory"), True, "dump.pickle: not a folder"),
        (NotADirectoryError(errno.ENOTDIR, "Not a directory"), False, "dump.pickle: cannot read (Not a directory)"),
        (PermissionError(errno.EACCES, "Permission denied"), False, "dump.pickle: permission denied"),
        (PermissionError(errno.EACCES, "Permission denied"), True, "dump.pickle: permission denied"),
        (OSError(errno.EIO, "Input/output error"), False, "dump.pickle: cannot read (Input/output error)"),
        (OSError(errno.EIO, "Input/output error"), True, "dump.pickle: cannot list (Input/output error)"),
        (OSError("no strerror"), False, "dump.pickle: cannot read (no strerror)"),
    ],
)
def test_each_error_is_one_line_naming_the_path(error, folder, expected):
    assert str(access_error("dump.pickle", error, folder=folder)) == expected


def test_a_caller_words_the_wrong_kind_itself():
    error = IsADirectoryError(errno.EISDIR, "Is a directory")
    assert (
        str(access_error("dumps", error, wrong_kind="is a directory; name one file"))
        == "dumps: is a directory; name one file"
    )


def test_open_and_report_keep_their_own_lines_for_a_folder(tmp_path, capsys):
    from oomdoctor.cli import main

    assert main(["open", str(tmp_path)]) == 2
    assert f"{tmp_path}: is a directory; oomdoctor open reads one dump file" in capsys.readouterr().err
    assert main(["info", str(tmp_path / "missing")]) == 2
    assert f"{tmp_path / 'missing'}: no such file" in capsys.readouterr().err
