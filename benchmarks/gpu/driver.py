"""Every fixture scenario for real on a GPU, beside its rehearsal, plus capture overhead and dump time.

    python benchmarks/gpu/driver.py --out DIR                    # on a CUDA machine (run_all.sh)
    python benchmarks/gpu/driver.py --out DIR --mode rehearsal   # dry run on CPU: rehearsal stands in for CUDA

For each fixture in fixtures/manifest.json (or those named by --scenarios), in a fresh process
each (scenario_child.py):

* `real`: the scenario on CUDA, the device made as small as the fixture's (a per-process memory
  fraction; for `outside-pytorch` fixtures another process holding the rest), once per --variants
  entry: `default` as a user runs it, `no-cublas-workspace` with CUBLAS_WORKSPACE_CONFIG=:0:0 so
  that cuBLAS takes no workspace from the caching allocator (the simulator does not model it);
* `rehearsed`: the same scenario under `oomdoctor rehearse` at the same capacity, on this machine's
  torch;

then `oomdoctor report` (JSON and text) of every dump, and a comparison with the fixture's ground
truth. In --mode rehearsal the `real` runs are rehearsals too: the dry run checks the plumbing.

Outputs (at most 8 files, as the device tool brings back): DIR/summary.json (everything measured,
and a `compare` table), DIR/log.txt, DIR/results.tar.gz (runs/RUN/{real,rehearsed}/: dump.pickle,
report.json, report.txt, result.json, log.txt; bench/; probe/). Import with import_results.py.
The driver keeps to --budget-s: runs it cannot start in time are listed as skipped, and whatever
happened is packed, even when it is interrupted.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPOSITORY_ROOT = HERE.parent.parent
sys.path.insert(0, str(REPOSITORY_ROOT))
sys.path.insert(0, str(HERE))

from layout import (  # noqa: E402
    SUMMARY_VERSION,
    VARIANTS,
    parse_tried_to_allocate,
    read_fixture_manifest,
    run_name,
    truth_components,
)

TAR_LIMIT_BYTES = 15 << 20  # the device tool brings back files of up to 16 MiB
KEEP_FILE_LIMIT_BYTES = 4 << 20


class Log:
    def __init__(self, path: Path) -> None:
        self.file = open(path, "a", buffering=1)
        self.started = time.monotonic()
        self.lock = threading.Lock()

    def __call__(self, message: str) -> None:
        line = f"[{time.monotonic() - self.started:7.1f}s] {message}"
        with self.lock:
            print(line, flush=True)
            self.file.write(line + "\n")

    def elapsed(self) -> float:
        return time.monotonic() - self.started


def child_environment(mode: str, variant: str, alloc_conf: str = "") -> dict[str, str]:
    environment = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("OOMDOCTOR_", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "CUBLAS"))
    }
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPOSITORY_ROOT), os.environ.get("PYTHONPATH", "")]))
    environment["PYTHONUNBUFFERED"] = "1"
    environment.update(VARIANTS[variant])
    if alloc_conf:
        environment["PYTORCH_CUDA_ALLOC_CONF"] = alloc_conf
    environment["OMP_NUM_THREADS"] = "2"  # several children share the CPUs
    if mode == "rehearsal":
        environment["CUDA_VISIBLE_DEVICES"] = ""  # rehearsal never touches the GPU
    return environment


def run_process(
    command: list[str], log_path: Path, environment: dict[str, str], timeout_s: float, cwd: Path
) -> tuple[int, float]:
    started = time.monotonic()
    with open(log_path, "w") as log_file:
        try:
            completed = subprocess.run(
                command, stdout=log_file, stderr=subprocess.STDOUT, env=environment, cwd=cwd, timeout=timeout_s
            )
            code = completed.returncode
        except subprocess.TimeoutExpired:
            log_file.write(f"\n[driver] killed after {timeout_s:.0f} s\n")
            code = -9
    return code, time.monotonic() - started


class Driver:
    def __init__(self, args: argparse.Namespace, work: Path, log: Log) -> None:
        self.args = args
        self.work = work
        self.log = log
        self.fixtures = {entry["name"]: entry for entry in read_fixture_manifest()}
        self.runs: list[dict[str, Any]] = []
        self.problems: list[str] = []
        self.summary: dict[str, Any] = {
            "summary_version": SUMMARY_VERSION,
            "mode": args.mode,
            "started_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "command": os.environ.get("GPU_VALIDATION_COMMAND") or _command_line(sys.argv[1:]),
            "variants": args.variants,
            "environment": {},
            "probes": {},
            "runs": self.runs,
            "compare": [],
            "bench": None,
            "problems": self.problems,
        }

    def time_left(self) -> float:
        return self.args.budget_s - self.log.elapsed()

    # ------------------------------------------------------------------ environment

    def probe(self) -> None:
        environment = self.summary["environment"]
        environment.update(
            python_version=platform.python_version(),
            host_cpu_count=os.cpu_count(),
            repository_commit=_git_commit(),
            repository_root=str(REPOSITORY_ROOT),  # import_results.py makes dump paths relative to it
        )
        if self.args.mode == "cuda":
            environment.update(_nvidia_smi())
        probe_dir = self.work / "probe"
        probe_dir.mkdir(parents=True, exist_ok=True)
        variants = self.args.variants if self.args.mode == "cuda" else ["default"]

        def probe_variant(variant: str) -> None:
            out = probe_dir / f"{variant}.json"
            code, _ = run_process(
                [sys.executable, str(HERE / "scenario_child.py"), "probe", str(out)],
                probe_dir / f"{variant}.log",
                child_environment(self.args.mode, variant),
                120,
                self.work,
            )
            found = json.loads(out.read_text()) if out.exists() else {"error": f"probe exited {code}"}
            self.summary["probes"][variant] = found
            self.log(f"probe {variant}: {found}")

        with concurrent.futures.ThreadPoolExecutor(len(variants)) as pool:
            list(pool.map(probe_variant, variants))
        default = self.summary["probes"].get("default", {})
        for key in (
            "torch_version",
            "cuda_version",
            "gpu_name",
            "capability",
            "total_memory_bytes",
            "allocator_backend",
        ):
            if key in default:
                environment[key] = default[key]

    # ------------------------------------------------------------------ benchmarks

    def bench(self) -> None:
        bench_dir = self.work / "bench"
        bench_dir.mkdir(parents=True, exist_ok=True)
        out = bench_dir / "result.json"
        command = [
            sys.executable, str(HERE / "bench_child.py"), str(out), "--mode", self.args.mode,
            "--rounds", str(self.args.bench_rounds), "--steps", str(self.args.bench_steps),
            "--dump-events", str(self.args.dump_events),
        ]  # fmt: skip
        self.log("bench: capture overhead and dump time (alone on the device)")
        code, seconds = run_process(
            command,
            bench_dir / "log.txt",
            child_environment(self.args.mode, "default"),
            self.args.bench_timeout_s,
            self.work,
        )
        if out.exists():
            self.summary["bench"] = json.loads(out.read_text())
        else:
            self.summary["bench"] = {"error": f"bench_child exited {code} after {seconds:.0f} s (see bench/log.txt)"}
            self.problems.append(self.summary["bench"]["error"])
        bench = self.summary["bench"]
        overhead, dump_time = bench.get("overhead") or {}, bench.get("dump_time") or {}
        self.log(
            f"bench done in {seconds:.0f} s: oomdoctor/torch recording {overhead.get('ratio_oomdoctor_to_torch_recording')}, "
            f"torch recording/none {overhead.get('ratio_torch_recording_to_none')}, "
            f"dump of {dump_time.get('events_in_dump')} events {dump_time.get('dump_seconds')} s"
        )

    # ------------------------------------------------------------------ scenarios

    def plan(self) -> list[dict[str, Any]]:
        names = self.args.scenarios or list(self.fixtures)
        unknown = [name for name in names if name not in self.fixtures]
        if unknown:
            raise SystemExit(f"unknown scenario(s): {', '.join(unknown)} (see fixtures/manifest.json)")
        # Most precious first, should the budget run out: real runs as users run them, then the
        # other variants, then the rehearsals (which any CPU can redo).
        planned = [
            {"scenario": name, "variant": variant, "arm": "real"} for variant in self.args.variants for name in names
        ]
        return planned + [{"scenario": name, "variant": "default", "arm": "rehearsed"} for name in names]

    def run_one(self, planned: dict[str, Any]) -> dict[str, Any]:
        try:
            return self._run_one(planned)
        except Exception as error:  # one broken run must not stop the others
            import traceback

            name = (
                run_name(planned["scenario"], planned["variant"]) if planned["arm"] == "real" else planned["scenario"]
            )
            return {**planned, "run": name, "dir": f"runs/{name}/{planned['arm']}", "status": "error", "why": f"driver: {type(error).__name__}: {error}",
                    "traceback": traceback.format_exc()[-3000:]}  # fmt: skip

    def _run_one(self, planned: dict[str, Any]) -> dict[str, Any]:
        fixture = self.fixtures[planned["scenario"]]
        name = run_name(planned["scenario"], planned["variant"]) if planned["arm"] == "real" else planned["scenario"]
        run_dir = self.work / "runs" / name / planned["arm"]
        run_dir.mkdir(parents=True, exist_ok=True)
        mode = self.args.mode if planned["arm"] == "real" else "rehearsal"
        spec = {
            "mode": mode,
            "script": fixture["scenario"],
            "args": fixture["args"],
            "device_memory_bytes": fixture["device_memory_bytes"],
            "alloc_conf": fixture["alloc_conf"],
            "outside_bytes": fixture["outside_bytes"],
            "dump_dir": str(run_dir / "dumps"),
        }
        record: dict[str, Any] = {**planned, "run": name, "dir": f"runs/{name}/{planned['arm']}"}
        if self.time_left() < self.args.run_timeout_s / 2:
            record["status"] = "skipped"
            record["why"] = "the time budget ran out"
            return record
        (run_dir / "spec.json").write_text(json.dumps(spec, indent=1))
        code, seconds = run_process(
            [sys.executable, str(HERE / "scenario_child.py"), "run", str(run_dir / "spec.json")],
            run_dir / "log.txt",
            child_environment(mode, planned["variant"], fixture["alloc_conf"]),
            min(self.args.run_timeout_s, max(30.0, self.time_left() - 30)),
            run_dir,
        )
        record["wall_seconds"] = round(seconds, 2)
        result_path = run_dir / "result.json"
        if not result_path.exists():
            record["status"] = "timeout" if code == -9 else "error"
            record["why"] = f"scenario_child exited {code} without a result (see {record['dir']}/log.txt)"
            return record
        result = json.loads(result_path.read_text())
        record["status"] = result["status"]
        record["result"] = {k: v for k, v in result.items() if k not in ("dumps",)}
        dumps = [Path(path) for path in result.get("dumps", [])]
        if len(dumps) > 1:
            record["note"] = f"{len(dumps)} dumps written; the last one is kept as dump.pickle"
        if dumps:
            shutil.move(str(dumps[-1]), run_dir / "dump.pickle")
            record["dump_bytes"] = (run_dir / "dump.pickle").stat().st_size
            shutil.rmtree(run_dir / "dumps", ignore_errors=True)
            self.report(run_dir, record)
        return record

    def report(self, run_dir: Path, record: dict[str, Any]) -> None:
        environment = child_environment("rehearsal", "default")
        for fmt, name in (("json", "report.json"), ("text", "report.txt")):
            with open(run_dir / name, "wb") as out:
                try:
                    completed = subprocess.run(
                        [sys.executable, "-m", "oomdoctor", "report", str(run_dir / "dump.pickle"), "--format", fmt],
                        stdout=out, stderr=subprocess.PIPE, env=environment, cwd=run_dir, timeout=60,
                    )  # fmt: skip
                except subprocess.TimeoutExpired:
                    record.setdefault("report_errors", []).append(f"oomdoctor report --format {fmt} took over 60 s")
                    continue
            if completed.returncode != 0:
                record.setdefault("report_errors", []).append(completed.stderr.decode(errors="replace")[-2000:])
        try:
            report = json.loads((run_dir / "report.json").read_text())
        except (OSError, ValueError):
            self.problems.append(f"{record['run']} {record['arm']}: oomdoctor report failed")
            return
        accounting = report.get("accounting") or {}
        record["report"] = {
            "verdict": report.get("verdict"),
            "confidence": report.get("confidence"),
            "summary": report.get("summary"),
            "phase": report.get("target_phase"),
            "step": report.get("target_step"),
            "components": report.get("components"),
            "allocated_bytes": accounting.get("allocated_bytes"),
            "reserved_bytes": accounting.get("reserved_bytes"),
            "request_bytes": accounting.get("request_bytes"),
            "message_bytes": accounting.get("message_bytes"),
            "non_pytorch_bytes": accounting.get("non_pytorch_bytes"),
            "device_total_bytes": accounting.get("device_total_bytes"),
            "device_free_bytes": accounting.get("device_free_bytes"),
            "unknowns": report.get("unknowns"),
        }
        from oomdoctor.load import load

        snapshot = load(run_dir / "dump.pickle")
        moment = (record.get("result") or {}).get("moment")
        if moment:
            record["truth"] = truth_components(snapshot, moment)
        log_text = (run_dir / "log.txt").read_text(errors="replace") if (run_dir / "log.txt").exists() else ""
        record["capture_problems"] = capture_problems(snapshot, record, log_text)
        for problem in record["capture_problems"]:
            self.problems.append(f"{record['run']} {record['arm']}: capture: {problem}")

    def scenarios(self) -> None:
        planned = self.plan()
        outside = [
            p
            for p in planned
            if p["arm"] == "real" and self.fixtures[p["scenario"]]["outside_bytes"] and self.args.mode == "cuda"
        ]
        parallel = [p for p in planned if p not in outside]
        self.log(f"scenarios: {len(outside)} one by one, then {len(parallel)} in parallel ({self.args.jobs} at a time)")
        for planned_run in outside:  # they take the whole GPU's free memory: nothing else may run
            self._finished(self.run_one(planned_run))
        with concurrent.futures.ThreadPoolExecutor(self.args.jobs) as pool:
            for record in pool.map(self.run_one, parallel):
                self._finished(record)

    def _finished(self, record: dict[str, Any]) -> None:
        self.runs.append(record)
        report = record.get("report") or {}
        truth = record.get("truth") or {}
        self.log(
            f"{record['run']:50s} {record['arm']:9s} {record['status']:7s} "
            f"verdict {report.get('verdict')} at {truth.get('phase')}/{truth.get('step')} "
            f"({record.get('wall_seconds')} s){' ' + record['why'] if record.get('why') else ''}"
        )
        self.summary["compare"] = compare_table(self.fixtures, self.runs)

    # ------------------------------------------------------------------ output

    def write_summary(self) -> None:
        self.summary["elapsed_seconds"] = round(self.log.elapsed(), 1)
        text = json.dumps(self.summary, indent=1)
        (self.args.out / "summary.json").write_text(text)
        (self.work / "summary.json").write_text(text)

    def pack(self) -> None:
        archive = self.args.out / "results.tar.gz"
        dropped: list[str] = []
        for drop_rehearsed_dumps in (False, True):
            with tarfile.open(archive, "w:gz") as tar:
                for path in sorted(self.work.rglob("*")):
                    if not path.is_file():
                        continue
                    relative = path.relative_to(self.work)
                    too_big = path.stat().st_size > KEEP_FILE_LIMIT_BYTES
                    if too_big or (drop_rehearsed_dumps and relative.parts[-2:] == ("rehearsed", "dump.pickle")):
                        dropped.append(str(relative))
                        continue
                    tar.add(path, arcname=str(relative))
            if archive.stat().st_size <= TAR_LIMIT_BYTES:
                break
            dropped.clear()
        if dropped:
            self.log(f"left out of results.tar.gz: {', '.join(sorted(set(dropped)))}")
        self.log(f"results.tar.gz: {archive.stat().st_size} bytes")


CAPTURE_TROUBLE_WORDS = ("fail", "error", "cannot", "could not", "unwritable", "timed out")


def capture_problems(snapshot: Any, record: dict[str, Any], log_text: str) -> list[str]:
    """How capture misbehaved in this run, from its dump and its output (empty: it did its job)."""
    meta = snapshot.oomdoctor
    if meta is None:
        return ["the dump has no oomdoctor metadata"]
    problems = []
    if record["status"] == "oom":
        oom = meta.oom
        surfaced = oom.surfaced if oom is not None else None
        if surfaced is not True:
            problems.append(f"oom.surfaced is {surfaced!r}, not True")
        exception = meta.exception
        exception_type = exception.type if exception is not None else None
        if not (exception_type or "").endswith("OutOfMemoryError"):
            problems.append(f"exception recorded as {exception_type!r}")
        elif not exception.traceback:
            problems.append("no traceback in the dump")
        device = oom.device if oom is not None and oom.device is not None else 0
        if not any(event.action == "oom" for event in snapshot.trace_of(device)):
            problems.append("no oom event in the trace")
    started_by = meta.recording.started_by if meta.recording is not None else None
    if started_by != "oomdoctor":
        problems.append(f"recording started by {started_by!r}")
    if not meta.tensors:
        problems.append("empty tensor registry")
    if not meta.markers:
        problems.append("no phase markers")
    if record.get("note"):
        problems.append(record["note"])
    for line in log_text.splitlines():
        if line.startswith("oomdoctor:") and any(word in line.lower() for word in CAPTURE_TROUBLE_WORDS):
            problems.append(line[:300])
    return problems


def compare_table(fixtures: dict[str, dict[str, Any]], runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per real run: intended (the fixture's ground truth), real, and rehearsed here."""
    rehearsed = {r["scenario"]: r for r in runs if r["arm"] == "rehearsed"}
    rows = []
    for run in runs:
        if run["arm"] != "real":
            continue
        fixture = fixtures[run["scenario"]]
        row: dict[str, Any] = {
            "run": run["run"],
            "scenario": run["scenario"],
            "variant": run["variant"],
            "intended": {
                "verdict": fixture["verdict"],
                "oom": fixture["oom"],
                "phase": fixture["phase"],
                "step": fixture["step"],
                "allocated_bytes": fixture["allocated_bytes"],
                "reserved_bytes": fixture["reserved_bytes"],
                "request_bytes": fixture["request_bytes"],
                "message_bytes": fixture["message_bytes"],
                "components": fixture["components"],
            },
            "real": _side(run),
            "rehearsed": _side(rehearsed.get(run["scenario"])),
        }
        real = row["real"]
        row["real_as_intended"] = real["status"] == ("oom" if fixture["oom"] else "fit") and (
            real["phase"],
            real["step"],
        ) == (fixture["phase"], fixture["step"])
        row["verdict_matches"] = real["verdict"] == fixture["verdict"]
        rows.append(row)
    return rows


def table_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The compare table in plain text: intended / real / rehearsed, sizes in MiB."""

    def mib(value: Any) -> str:
        return f"{value / 2**20:.1f}" if isinstance(value, int) else "-"

    def where(side: dict[str, Any]) -> str:
        return f"{side.get('status')}:{side.get('phase')}/{side.get('step')}"

    lines = [
        "run | intended verdict, where | real verdict, where | rehearsed verdict, where | "
        "allocated MiB intended/real/rehearsed | Tried to allocate MiB intended/real/rehearsed"
    ]
    for row in rows:
        intended, real, rehearsed = row["intended"], row["real"], row["rehearsed"]
        lines.append(
            f"{row['run']} | {intended['verdict']}, {'oom' if intended['oom'] else 'fit'}:{intended['phase']}/{intended['step']}"
            f" | {real.get('verdict')}, {where(real)} | {rehearsed.get('verdict')}, {where(rehearsed)}"
            f" | {mib(intended['allocated_bytes'])}/{mib(real.get('allocated_bytes'))}/{mib(rehearsed.get('allocated_bytes'))}"
            f" | {mib(intended['message_bytes'])}/{mib(real.get('message_bytes'))}/{mib(rehearsed.get('message_bytes'))}"
        )
    return lines


def _side(run: dict[str, Any] | None) -> dict[str, Any]:
    if run is None:
        return {"status": "missing"}
    report = run.get("report") or {}
    truth = run.get("truth") or {}
    result = run.get("result") or {}
    moment = result.get("moment") or {}
    observer = moment.get("observer") or {}
    exception = result.get("exception") or {}
    return {
        "status": run["status"],
        "verdict": report.get("verdict"),
        "confidence": report.get("confidence"),
        "phase": truth.get("phase"),
        "step": truth.get("step"),
        "report_phase": report.get("phase"),
        "report_step": report.get("step"),
        "allocated_bytes": truth.get("allocated_bytes"),
        "reserved_bytes": (moment.get("memory") or {}).get("reserved_bytes"),
        "state_components": truth.get("components"),
        "report_components": report.get("components"),
        "request_bytes": report.get("request_bytes"),
        "message_bytes": observer.get("alloc_bytes"),
        "tried_to_allocate": parse_tried_to_allocate(exception.get("message", "")),
        "oom_message": exception.get("message"),
        "num_alloc_retries": (moment.get("memory") or {}).get("num_alloc_retries"),
        "ooms_observed": len(result.get("ooms_observed") or []),
        "capture_problems": run.get("capture_problems"),
    }


def _command_line(argv: list[str]) -> str:
    """How the driver was started, with its output and work folders as $OUT and $WORK."""
    shown, hide = [], {"--out": "$OUT", "--work": "$WORK"}
    for index, part in enumerate(argv):
        name = part.split("=", 1)[0]
        if name in hide and "=" in part:
            part = f"{name}={hide[name]}"
        elif index and argv[index - 1] in hide:
            part = hide[argv[index - 1]]
        shown.append(part)
    return " ".join(["python3 benchmarks/gpu/driver.py", *shown])


def _git_commit() -> str | None:
    try:
        completed = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPOSITORY_ROOT, capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return completed.stdout.strip() or None if completed.returncode == 0 else None


def _nvidia_smi() -> dict[str, Any]:
    query = "name,driver_version,memory.total"
    try:
        completed = subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError) as error:
        return {"nvidia_smi": f"unavailable: {error}"}
    fields = [part.strip() for part in completed.stdout.splitlines()[0].split(",")] if completed.stdout.strip() else []
    if len(fields) != 3:
        return {"nvidia_smi": completed.stdout.strip() or completed.stderr.strip()}
    return {"nvidia_smi_gpu": fields[0], "driver_version": fields[1], "nvidia_smi_memory_mib": int(float(fields[2]))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="where summary.json, log.txt and results.tar.gz go")
    parser.add_argument("--mode", choices=("cuda", "rehearsal"), default="cuda")
    parser.add_argument(
        "--scenarios",
        type=lambda text: [p for p in text.split(",") if p],
        default=None,
        help="fixture names, comma-separated (default: all)",
    )
    parser.add_argument(
        "--variants",
        type=lambda text: [p for p in text.split(",") if p],
        default=list(VARIANTS),
        help=f"of {', '.join(VARIANTS)} (default: all)",
    )
    parser.add_argument("--jobs", type=int, default=8, help="scenario processes at a time")
    parser.add_argument("--budget-s", type=float, default=360, help="start no run after this; pack by then")
    parser.add_argument("--run-timeout-s", type=float, default=120)
    parser.add_argument("--no-bench", dest="bench", action="store_false", help="skip overhead and dump time")
    parser.add_argument("--bench-rounds", type=int, default=12)
    parser.add_argument("--bench-steps", type=int, default=20)
    parser.add_argument("--bench-timeout-s", type=float, default=120)
    parser.add_argument("--dump-events", type=int, default=100_000)
    parser.add_argument("--work", type=Path, default=None, help="working folder (default: a temporary one)")
    args = parser.parse_args(argv)
    bad = [v for v in args.variants if v not in VARIANTS]
    if bad:
        parser.error(f"unknown variant(s): {', '.join(bad)}")

    args.out.mkdir(parents=True, exist_ok=True)
    log = Log(args.out / "log.txt")
    work = args.work or Path(tempfile.mkdtemp(prefix="oomdoctor-gpu-"))
    work.mkdir(parents=True, exist_ok=True)
    driver = Driver(args, work, log)

    def interrupted(signum: int, frame: Any) -> None:
        raise SystemExit(f"interrupted by signal {signum}")

    signal.signal(signal.SIGTERM, interrupted)
    log(f"mode {args.mode}, work folder {work}, budget {args.budget_s:.0f} s")
    try:
        driver.probe()
        driver.write_summary()
        if args.bench:
            driver.bench()
            driver.write_summary()
        driver.scenarios()
    except BaseException as error:  # noqa: BLE001 - whatever happened is still packed
        driver.problems.append(f"driver stopped: {type(error).__name__}: {error}")
        log(f"driver stopped: {type(error).__name__}: {error}")
        if not isinstance(error, (Exception, SystemExit, KeyboardInterrupt)):
            raise
    finally:
        driver.write_summary()
        driver.pack()
        rows = driver.summary["compare"]
        for line in table_lines(rows):
            log(line)
        log(
            f"done in {log.elapsed():.0f} s: {sum(r['verdict_matches'] for r in rows)}/{len(rows)} real verdicts as intended, "
            f"{sum(r['real_as_intended'] for r in rows)}/{len(rows)} real runs stopped where intended"
        )
    return 0 if not driver.problems else 1


if __name__ == "__main__":
    sys.exit(main())
