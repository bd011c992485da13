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
    from oomdoctor.commands import require_device
    from oomdoctor.errors import OomdoctorError
    from oomdoctor.load import load

    snapshot = load(sorted((FIXTURES / "dumps").glob("*.pickle"))[0])
    require_device(snapshot, None, "dump.pickle")
    require_device(snapshot, snapshot.devices[0], "dump.pickle")
    with pytest.raises(OomdoctorError, match=r"^dump.pickle: no device 9 in this snapshot \(devices: 0\)$"):
        require_device(snapshot, 9, "dump.pickle")
