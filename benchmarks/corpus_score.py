"""Score oomdoctor against the expert readings of the real corpus (issue 11).

    python benchmarks/corpus_score.py [--corpus DIR] [--json] [--timeout SECONDS]

For every file in the corpus's `labels/labels.json` it runs `oomdoctor report FILE --format json`
in a child process (so a file that crashes, hangs or is refused costs only its own row) and compares
the report with the expert's reading on three counts:

* verdict: right or wrong. A file with an `oom` event needs the expert's verdict as the headline; a
  file without one where the expert still found the problem needs it as the headline or as a
  secondary finding; "no OOM (cannot tell)" needs `no-oom`; "cannot tell" needs `no-oom` or
  `unknown`.
* moment: right when the device, the step and the phase of the judged moment (the OOM, else the
  peak, else the dump) all agree with the expert's.
* categories: every expert category (categories that map onto the same oomdoctor components merged
  into one) holding at least 5% of the expert's total at that moment, compared with the sum of the
  oomdoctor components it maps to: right within 10% of the expert's bytes, partial within 50%,
  wrong otherwise.

The rules, the mapping of the labels' categories and phases onto oomdoctor's words and the
baseline figures are in docs/corpus-score.md. The oomdoctor scored is the one this interpreter
imports (PYTHONPATH first, so `PYTHONPATH=<worktree> python benchmarks/corpus_score.py` scores
another commit); the header names its commit. A file that oomdoctor refuses or that errors is
wrong on every count, with the reason. The corpus is found at --corpus, else $OOMDOCTOR_CORPUS,
else ../shared/corpus from the project root.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

# the pure scoring lives next to this script (the CI tests import it too)
sys.path.insert(0, str(Path(__file__).resolve().parent))
from corpus_scoring import (  # noqa: E402
    FileScore,
    Observed,
    expected_of,
    json_report,
    observed_of,
    score,
    text_report,
)

ROOT = Path(__file__).resolve().parent.parent


# ---- running ----------------------------------------------------------------------------------------


def child_env(package_root: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(package_root), env.get("PYTHONPATH")) if p)
    return env


def child_package(package_root: Path, workdir: str) -> Path | None:
    """The package folder a child process imports (it must be the one this process found)."""
    probe = [sys.executable, "-c", "import oomdoctor; print(oomdoctor.__file__)"]
    try:
        done = subprocess.run(
            probe, cwd=workdir, env=child_env(package_root), capture_output=True, text=True, timeout=120
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return Path(done.stdout.strip()).resolve().parent if done.returncode == 0 and done.stdout.strip() else None


def run_report(path: Path, package_root: Path, timeout: float, workdir: str) -> Observed:
    """`oomdoctor report PATH --format json` in a child process: a crash or hang costs one row."""
    env = child_env(package_root)
    command = [sys.executable, "-m", "oomdoctor", "report", str(path), "--format", "json"]
    try:
        done = subprocess.run(command, cwd=workdir, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return Observed(error=f"timed out after {timeout:g} s")
    except OSError as exc:
        return Observed(error=f"could not start: {exc}")
    if done.returncode != 0:
        lines = [line.strip() for line in done.stderr.splitlines() if line.strip()]
        return Observed(error=f"exit {done.returncode}: {lines[-1] if lines else 'no message'}"[:300])
    try:
        report = json.loads(done.stdout)
    except ValueError as exc:
        return Observed(error=f"output is not JSON ({exc})")
    try:
        return observed_of(report)
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        return Observed(error=f"report JSON not understood ({type(exc).__name__}: {exc})")


def package_info() -> tuple[Path | None, str]:
    """Where the oomdoctor this interpreter imports lives, and its commit ("+dirty" with local edits)."""
    spec = importlib.util.find_spec("oomdoctor")
    if spec is None or not spec.origin:
        sys.path.insert(0, str(ROOT))
        spec = importlib.util.find_spec("oomdoctor")
        if spec is None or not spec.origin:
            return None, "oomdoctor not importable"
    root = Path(spec.origin).resolve().parent.parent
    try:
        commit = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=30
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no", "--", "oomdoctor"],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit, dirty = "", ""
    return root, (commit + ("+dirty" if dirty else "")) if commit else "(not a git checkout)"


def corpus_dir(argument: str | None) -> Path:
    if argument:
        return Path(argument)
    env = os.environ.get("OOMDOCTOR_CORPUS")
    return Path(env) if env else ROOT.parent / "shared" / "corpus"


def run(corpus: Path, timeout: float) -> tuple[list[FileScore], str]:
    labels = json.loads((corpus / "labels" / "labels.json").read_text(encoding="utf-8"))
    package_root, commit = package_info()
    scores = []
    with tempfile.TemporaryDirectory(prefix="corpus-score-") as workdir:
        refused = None
        if package_root is None:
            refused = "oomdoctor not importable"
        elif child_package(package_root, workdir) != package_root / "oomdoctor":
            refused = f"a child process does not import the oomdoctor under {package_root}"
        for label in labels:
            expected = expected_of(label)
            path = corpus / "snapshots" / expected.file
            if not path.is_file():
                observed = Observed(error="file missing from the corpus's snapshots/")
            elif refused is not None or package_root is None:
                observed = Observed(error=refused or "oomdoctor not importable")
            else:
                observed = run_report(path, package_root, timeout, workdir)
            scores.append(score(expected, observed))
    return scores, commit


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", help="the corpus folder (holding labels/ and snapshots/)")
    parser.add_argument("--json", action="store_true", help="print the scores as JSON")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds one report may take (default 300)")
    args = parser.parse_args(argv)
    corpus = corpus_dir(args.corpus).resolve()
    if not (corpus / "labels" / "labels.json").is_file():
        print(f"corpus_score: no labels/labels.json under {corpus}", file=sys.stderr)
        return 2
    scores, commit = run(corpus, args.timeout)
    sys.stdout.write(json_report(scores, commit) if args.json else text_report(scores, commit))
    return 0


if __name__ == "__main__":
    sys.exit(main())
