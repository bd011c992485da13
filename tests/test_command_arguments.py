"""What the verbs share (oomdoctor.commands): --max-bytes parsing and the unknown --device line."""

import pytest

from oomdoctor.cli import main
from tests.conftest import FIXTURES


@pytest.mark.parametrize(
    "argv",
    [
        ["report", "dump.pickle", "--max-bytes", "lots"],
        ["open", "dump.pickle", "--max-bytes", "lots"],
        ["redact", "dump.pickle", "out.pickle", "--max-bytes", "lots"],
    ],
)
def test_a_bad_max_bytes_is_one_line_before_any_file_is_read(argv, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--max-bytes: not a size: 'lots'" in err
    assert "dump.pickle" not in err and "Traceback" not in err


def test_max_bytes_is_parsed_and_applied(capsys):
    dump = sorted((FIXTURES / "dumps").glob("*.pickle"))[0]
    assert main(["report", str(dump), "--max-bytes", "1KiB"]) == 2
    assert "is larger than the 1 KiB limit" in capsys.readouterr().err


def test_an_unknown_device_names_the_devices_there(capsys):
    from oomdoctor.errors import OomdoctorError
    from oomdoctor.load import load
    from oomdoctor.pipeline import require_device

    snapshot = load(sorted((FIXTURES / "dumps").glob("*.pickle"))[0])
    require_device(snapshot, None, "dump.pickle")
    require_device(snapshot, snapshot.devices[0], "dump.pickle")
    with pytest.raises(OomdoctorError, match=r"^dump.pickle: no device 9 in this snapshot \(devices: 0\)$"):
        require_device(snapshot, 9, "dump.pickle")


def _option_help(verb: str) -> dict[str, str | None]:
    """Each option string of `verb` and its help, as the shared builders made them."""
    import argparse

    from oomdoctor.cli import build_parser

    parser = build_parser()
    (subparsers,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return {action.dest: action.help for action in subparsers.choices[verb]._actions}


def test_the_shared_arguments_keep_each_verbs_own_help():
    from oomdoctor.commands import MAX_BYTES_HELP

    for verb in ("open", "report", "redact"):
        assert _option_help(verb)["max_bytes"] == MAX_BYTES_HELP
    assert _option_help("info")["max_bytes"] == "refuse larger files (default 4GiB)"
    assert _option_help("info")["format"] == "output format (default text)"
    assert _option_help("report")["device"] == "judge this device instead of the failing one"
    assert _option_help("open")["device"] == "show this device instead of the failing one"


def test_info_parses_max_bytes_with_the_other_arguments(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["info", "dump.pickle", "--max-bytes", "lots"])
    assert exited.value.code == 2
    assert "argument --max-bytes: not a size: 'lots'" in capsys.readouterr().err
