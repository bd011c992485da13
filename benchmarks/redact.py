"""`oomdoctor redact` and `report --redact` on a one-million-event snapshot, as ratios to baselines.

    python benchmarks/redact.py [--events 1000000] [--source SNAPSHOT]

The snapshot is built as benchmarks/analyse.py builds it (a real trace repeated). Each measurement
runs in a fresh process and keeps the best of --repeats:

* redact IN OUT against a restricted pickle.load plus pickle.dump (protocol 4) of the same file, the
  cycle GC paused, the least any rewrite of the dump costs, in time and in peak memory; redact also
  loads its output once to check it;
* redact IN OUT.gz against the same load and dump through gzip at redact's level (GZIP_LEVEL), and
  against the dump at level 9, GzipFile's default;
* report --format md --redact against report --format md: what redacting the results adds.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.analyse import build, source_snapshot  # noqa: E402

CHILD = r"""
import gc, io, json, os, pickle, sys, time
sys.path.insert(0, {root!r})
from oomdoctor.load.safe_pickle import RestrictedUnpickler
from oomdoctor.cli import main
mode, source, target = sys.argv[1], sys.argv[2], sys.argv[3]
start = time.perf_counter()
if mode.startswith("copy"):
    import gzip
    from oomdoctor.commands.redact import GZIP_LEVEL
    gc.disable()  # as oomdoctor reads and writes with the cycle GC paused (the GC is no part of the floor)
    with open(source, "rb") as f:
        data = RestrictedUnpickler(f).load()
    with open(target, "wb") as f:
        if mode == "copy":
            pickle.dump(data, f, protocol=4)
        else:
            level = GZIP_LEVEL if mode == "copy-gz" else 9
            with gzip.GzipFile(filename="", mode="wb", fileobj=f, mtime=0, compresslevel=level) as packed:
                pickle.dump(data, packed, protocol=4)
elif mode.startswith("redact"):
    assert main(["redact", source, target + (".gz" if mode == "redact-gz" else ""), "--force"]) == 0
else:
    sys.stdout = io.TextIOWrapper(open(os.devnull, "wb"))
    assert main(["report", source, "--format", "md", *(["--redact"] if mode == "report-redact" else [])]) == 0
elapsed = time.perf_counter() - start
with open("/proc/self/status") as status:  # the process's peak resident memory (Linux)
    peak = next((int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM:")), 0)
print(json.dumps({{"seconds": elapsed, "peak_bytes": peak}}), file=sys.stderr)
"""


def measure(mode: str, source: Path, target: Path, repeats: int) -> tuple[float, int]:
    """The best wall seconds of `repeats` fresh processes, and the least peak memory among them."""
    code = CHILD.format(root=str(ROOT))
    best, least = None, None
    for _ in range(repeats):
        done = subprocess.run(
            [sys.executable, "-c", code, mode, str(source), str(target)], capture_output=True, text=True, check=True
        )
        result = json.loads(done.stderr.strip().splitlines()[-1])
        best = result["seconds"] if best is None else min(best, result["seconds"])
        least = result["peak_bytes"] if least is None else min(least, result["peak_bytes"])
    assert best is not None and least is not None
    return best, least


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--source", type=Path, default=None)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    source = source_snapshot(args.source)
    if source is None:
        return 2
    with tempfile.TemporaryDirectory() as folder:
        path, out = Path(folder) / "million.pickle", Path(folder) / "out.pickle"
        count = build(source, args.events, path)
        copy, copy_peak = measure("copy", path, out, args.repeats)
        redact, redact_peak = measure("redact", path, out, args.repeats)
        copy_gz, _ = measure("copy-gz", path, out, args.repeats)
        copy_gz9, _ = measure("copy-gz9", path, out, args.repeats)
        redact_gz, _ = measure("redact-gz", path, out, args.repeats)
        report, _ = measure("report", path, out, args.repeats)
        report_redacted, _ = measure("report-redact", path, out, args.repeats)
    print(f"snapshot: {count} events from {source.name}")
    print(
        f"restricted load + pickle.dump: {copy:.2f} s, peak {copy_peak / 2**20:.0f} MiB;"
        f"  redact IN OUT: {redact:.2f} s, peak {redact_peak / 2**20:.0f} MiB"
    )
    print(
        f"load + dump through gzip: {copy_gz:.2f} s at redact's level, {copy_gz9:.2f} s at level 9;"
        f"  redact IN OUT.gz: {redact_gz:.2f} s"
    )
    print(f"report --format md: {report:.2f} s;  with --redact: {report_redacted:.2f} s")
    print(f"redact / load+dump:           {redact / copy:.2f}x time, {redact_peak / copy_peak:.2f}x peak memory")
    print(f"redact to .gz / load+dump .gz: {redact_gz / copy_gz:.2f}x time")
    print(f"report md --redact / without: {report_redacted / report:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
