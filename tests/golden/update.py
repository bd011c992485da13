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
# `oomdoctor diff A B` of a pair with known differences: the same run at batch 16 and 32
GOLDEN_PAIRS = (("no-oom-gpt-adamw", "no-oom-gpt-adamw-batch-32"),)
GOLDEN_PAIR_FILES = tuple(f"diff-{a}-vs-{b}.{suffix}" for a, b in GOLDEN_PAIRS for suffix in FORMATS)


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
    reports.update(expected_diffs())
    return reports


def expected_diffs() -> dict[str, bytes]:
    """Golden file name -> the bytes `oomdoctor diff A.pickle B.pickle` prints for each pair."""
    from oomdoctor.analysis.diff import DIFF_FILES, compare
    from oomdoctor.load import load
    from oomdoctor.pipeline import diff_side
    from oomdoctor.views import diff_report

    reports = {}
    for a, b in GOLDEN_PAIRS:
        sides = [diff_side(load(DUMPS / f"{name}.pickle"), f"{name}.pickle") for name in (a, b)]
        diff = compare(sides[0], sides[1], kind=DIFF_FILES)
        stem = f"diff-{a}-vs-{b}"
        reports[f"{stem}.txt"] = diff_report.to_text(diff).encode()
        reports[f"{stem}.md"] = diff_report.to_markdown(diff).encode()
        reports[f"{stem}.json"] = diff_report.to_json(diff)
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
