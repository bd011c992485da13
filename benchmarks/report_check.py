"""The JSON report of every fixture dump and corpus file, to compare two versions byte for byte.

    PYTHONPATH=<tree> python benchmarks/report_check.py OUT_DIR        # write one report per file
    python benchmarks/report_check.py --compare BEFORE_DIR AFTER_DIR   # list the files that differ

A change meant to leave the analysis alone (a speed-up) writes the same reports before and after.
Each report is rendered in this process, by the oomdoctor that PYTHONPATH puts first, as
`oomdoctor report FILE --format json` renders it; a file the loader refuses gets its one-line
error instead. The corpus is found at --corpus, else $OOMDOCTOR_CORPUS, else ../shared/corpus.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def inputs(corpus: Path) -> list[Path]:
    found = sorted((ROOT / "fixtures" / "dumps").rglob("*.pickle"))
    for folder in ("snapshots", "other_formats"):
        if (corpus / folder).is_dir():
            found += sorted(p for p in (corpus / folder).iterdir() if p.is_file())
    return found


def write_reports(out: Path, corpus: Path) -> int:
    from oomdoctor.errors import OomdoctorError
    from oomdoctor.pipeline import report_file

    out.mkdir(parents=True, exist_ok=True)
    for path in inputs(corpus):
        try:
            body = report_file(str(path), "json")
        except OomdoctorError as error:
            body = f"error: {error}\n".encode()
        name = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path.name
        (out / (name.replace("/", "__") + ".json")).write_bytes(body)
    return 0


def compare(before: Path, after: Path) -> int:
    names = sorted({p.name for p in before.iterdir()} | {p.name for p in after.iterdir()})
    differ = [n for n in names if not (before / n).is_file() or not (after / n).is_file()]
    differ += [n for n in names if n not in differ and (before / n).read_bytes() != (after / n).read_bytes()]
    for name in differ:
        print(f"differs: {name}")
    print(f"{len(names) - len(differ)}/{len(names)} reports byte-identical")
    return 1 if differ else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, nargs="?")
    parser.add_argument("--compare", type=Path, nargs=2, metavar=("BEFORE", "AFTER"))
    parser.add_argument("--corpus", type=Path, default=None)
    args = parser.parse_args()
    if args.compare:
        return compare(*args.compare)
    if args.out is None:
        parser.error("give OUT_DIR or --compare BEFORE AFTER")
    env = os.environ.get("OOMDOCTOR_CORPUS")
    corpus = args.corpus or (Path(env) if env else ROOT.parent / "shared" / "corpus")
    return write_reports(args.out, corpus)


if __name__ == "__main__":
    sys.exit(main())
