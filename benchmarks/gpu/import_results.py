"""Bring a GPU validation run home: its real dumps become fixtures/gpu/, with provenance and ground truth.

    python benchmarks/gpu/import_results.py RESULTS_DIR [--into fixtures/gpu] [--variants default]
                                            [--all] [--skip RUN,...] [--expect RUN=VERDICT,...]
                                            [--commit SHA]

RESULTS_DIR holds what run_all.sh left in $OUT: summary.json and results.tar.gz. For each real run
of the chosen variants that left a dump, this writes INTO/RUN/dump.pickle (paths under the
repository made relative, the frames of the machinery that ran the scenario removed, nothing else
changed) and INTO/RUN/provenance.json (GPU, driver, torch and CUDA versions, date, command, how the
device was made small, what was changed in the file), and INTO/manifest.json with, per dump, the
scenario's intended ground truth (from fixtures/manifest.json), the real figures measured on the
GPU, and the rehearsed ones.

Only runs that stopped where the scenario was built to stop (OOM or not, phase, step) are taken,
with the intended verdict as `expected_verdict`, which tests/test_gpu_fixtures.py holds `oomdoctor
report` to. --all takes the others too; their `expected_verdict` is null (the test then checks only
that they load and report) unless --expect gives one. --skip leaves runs out. Dumps larger than
--max-dump-bytes are left out (fixtures stay small). The import replaces INTO's previous contents.
"""

from __future__ import annotations

import argparse
import json
import pickle
import shutil
import sys
import tarfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent.parent))

from layout import MACHINERY_FILES, REPOSITORY_ROOT, SUMMARY_VERSION, VARIANTS, clean_dump, read_dump_dict  # noqa: E402

GPU_MANIFEST_VERSION = 1
PROVENANCE_KEYS = (
    "gpu_name", "nvidia_smi_gpu", "capability", "total_memory_bytes", "driver_version", "torch_version",
    "cuda_version", "python_version", "allocator_backend", "repository_commit",
)  # fmt: skip
MODIFIED = (
    "paths under the repository made relative to it; frames of "
    + ", ".join(MACHINERY_FILES)
    + " and runpy removed from every stack (the machinery that ran the scenario); nothing else changed"
)


def _list(text: str) -> list[str]:
    return [part for part in text.split(",") if part]


def _pairs(text: str) -> dict[str, str]:
    pairs = {}
    for part in _list(text):
        name, _, verdict = part.partition("=")
        if not verdict:
            raise argparse.ArgumentTypeError(f"expected RUN=VERDICT, got {part!r}")
        pairs[name] = verdict
    return pairs


def import_results(
    results_dir: Path,
    into: Path,
    *,
    variants: list[str],
    take_all: bool = False,
    skip: list[str] | None = None,
    expect: dict[str, str] | None = None,
    max_dump_bytes: int = 1 << 20,
    commit: str | None = None,
) -> list[dict[str, Any]]:
    """Write INTO from RESULTS_DIR; returns the manifest entries written."""
    summary = json.loads((results_dir / "summary.json").read_text())
    if summary.get("summary_version") != SUMMARY_VERSION:
        raise SystemExit(
            f"{results_dir / 'summary.json'}: summary_version {summary.get('summary_version')!r}, expected {SUMMARY_VERSION}"
        )
    skip, expect = set(skip or ()), dict(expect or {})
    environment = summary.get("environment") or {}
    root = environment.get("repository_root") or ""
    runs = {(run["run"], run["arm"]): run for run in summary["runs"]}
    provenance_common = {key: environment.get(key) for key in PROVENANCE_KEYS}
    if commit and not provenance_common.get("repository_commit"):
        provenance_common["repository_commit"] = commit
    provenance_common.update(
        mode=summary["mode"],
        date_utc=summary.get("started_utc"),
        command=summary.get("command"),
        modified=MODIFIED,
    )
    if into.exists():
        for old in into.iterdir():
            if old.is_dir() and (old / "provenance.json").exists():
                shutil.rmtree(old)
    into.mkdir(parents=True, exist_ok=True)
    entries = []
    with tarfile.open(results_dir / "results.tar.gz") as tar:
        members = {member.name: member for member in tar.getmembers() if member.isfile()}
        for row in summary["compare"]:
            name = row["run"]
            if row["variant"] not in variants or name in skip:
                continue
            if not row["real_as_intended"] and not take_all and name not in expect:
                print(
                    f"left out {name}: the real run did not stop where intended ({_where(row['real'])} vs {_where(row['intended'])})"
                )
                continue
            run = runs[(name, "real")]
            member = members.get(f"{run['dir']}/dump.pickle")
            if member is None:
                print(f"left out {name}: no dump ({row['real']['status']})")
                continue
            if member.size > max_dump_bytes:
                print(f"left out {name}: its dump is {member.size} bytes (--max-dump-bytes {max_dump_bytes})")
                continue
            dump = clean_dump(read_dump_dict(tar.extractfile(member).read()), root)
            folder = into / name
            folder.mkdir()
            (folder / "dump.pickle").write_bytes(pickle.dumps(dump, protocol=4))
            expected = expect.get(name, row["intended"]["verdict"] if row["real_as_intended"] else None)
            entry = _entry(row, run, name, expected)
            provenance = {
                **provenance_common,
                "run": name,
                "variant": row["variant"],
                "variant_environment": VARIANTS.get(row["variant"], {}),
                "device_limit": (run.get("result") or {}).get("setup"),
                "ground_truth": {"intended": row["intended"], "real": entry["real"]},
            }
            (folder / "provenance.json").write_text(json.dumps(provenance, indent=2) + "\n")
            entries.append(entry)
            print(f"imported {name}: {(folder / 'dump.pickle').stat().st_size} bytes, expected verdict {expected}")
    manifest = {"version": GPU_MANIFEST_VERSION, "source": provenance_common, "fixtures": entries}
    (into / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return entries


def _where(side: dict[str, Any]) -> str:
    return f"{side.get('status', 'oom' if side.get('oom') else 'fit')} at {side.get('phase')}/{side.get('step')}"


def _entry(row: dict[str, Any], run: dict[str, Any], name: str, expected: str | None) -> dict[str, Any]:
    real, rehearsed, intended = row["real"], row["rehearsed"], row["intended"]
    spec_keys = ("verdict", "oom", "phase", "step", "components", "allocated_bytes", "request_bytes", "message_bytes")
    measured = (
        "status", "verdict", "phase", "step", "state_components", "allocated_bytes", "reserved_bytes",
        "request_bytes", "message_bytes", "tried_to_allocate", "num_alloc_retries", "ooms_observed",
        "capture_problems",
    )  # fmt: skip
    return {
        "name": name,
        "scenario": row["scenario"],
        "variant": row["variant"],
        "file": f"{name}/dump.pickle",
        "provenance": f"{name}/provenance.json",
        "expected_verdict": expected,
        "real_as_intended": row["real_as_intended"],
        "intended": {key: intended.get(key) for key in spec_keys},
        "real": {key: real.get(key) for key in measured},
        "rehearsed": {key: rehearsed.get(key) for key in measured},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results_dir", type=Path, help="folder with summary.json and results.tar.gz")
    parser.add_argument("--into", type=Path, default=REPOSITORY_ROOT / "fixtures" / "gpu")
    parser.add_argument(
        "--variants", type=_list, default=["default"], help=f"of {', '.join(VARIANTS)} (default: default)"
    )
    parser.add_argument(
        "--all", dest="take_all", action="store_true", help="also runs that did not stop where intended"
    )
    parser.add_argument("--skip", type=_list, default=[], help="runs to leave out")
    parser.add_argument("--expect", type=_pairs, default={}, help="RUN=VERDICT: the verdict to hold a run's report to")
    parser.add_argument("--max-dump-bytes", type=int, default=1 << 20)
    parser.add_argument("--commit", help="the commit that was run, when the machine's copy had no .git")
    args = parser.parse_args(argv)
    for name in ("summary.json", "results.tar.gz"):
        if not (args.results_dir / name).is_file():
            parser.error(f"{args.results_dir / name} not found")
    entries = import_results(
        args.results_dir, args.into, variants=args.variants, take_all=args.take_all, skip=args.skip,
        expect=args.expect, max_dump_bytes=args.max_dump_bytes, commit=args.commit,
    )  # fmt: skip
    print(f"{len(entries)} dump(s) in {args.into}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
