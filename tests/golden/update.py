"""Write the golden reports: text, Markdown and JSON of a few fixtures, checked by tests/test_golden.py.

    python tests/golden/update.py        # after fixtures are regenerated or a view changes

Review the diff like code: it is exactly what users will see. One fixture per verdict family, and
one report redacted, so a change in any format or in redaction shows up here.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
DUMPS = ROOT / "fixtures" / "dumps"

GOLDEN_FIXTURES = (
    "optimizer-state-buildup-mlp-adam",
    "activation-spike-gpt-longer-sequence",
    "gradients-kept-mlp-plain-sgd",
    "fragmentation-retrieval-class-scores",
    "outside-pytorch-cnn",
    "no-oom-mlp-adam",
)
REDACTED_FIXTURE = "optimizer-state-buildup-mlp-adam"
FORMATS = {"txt": "text", "md": "md", "json": "json"}


def expected_reports() -> dict[str, bytes]:
    """Golden file name -> the bytes `oomdoctor report` prints for it (the dump named by its file name only)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from oomdoctor.load import load
    from oomdoctor.pipeline import render_report

    reports = {}
    for name in GOLDEN_FIXTURES:
        snapshot = load(DUMPS / f"{name}.pickle")
        for suffix, output_format in FORMATS.items():
            reports[f"{name}.{suffix}"] = render_report(snapshot, output_format, source=f"{name}.pickle")
        if name == REDACTED_FIXTURE:
            reports[f"{name}.redacted.md"] = render_report(snapshot, "md", source=f"{name}.pickle", redact=True)
    return reports


def main() -> int:
    reports = expected_reports()
    for stale in HERE.glob("*"):
        if stale.suffix in (".txt", ".md", ".json") and stale.name not in reports:
            stale.unlink()
    changed = 0
    for file_name, content in reports.items():
        path = HERE / file_name
        if not path.exists() or path.read_bytes() != content:
            path.write_bytes(content)
            changed += 1
    print(f"{len(reports)} golden reports, {changed} changed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
