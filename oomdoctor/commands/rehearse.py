"""Run a script on CPU against a simulated GPU: would it fit, where would it fail? (experimental)

    oomdoctor rehearse train.py --device-memory 24GiB
    oomdoctor rehearse SCRIPT --device-memory SIZE [--alloc-conf STR] \\
        [--world-size N [--rank R | --ranks all]] [--out DIR] [-- ARGS]

The script runs in this process as `python train.py ARGS` would, on the CPU, while every tensor
storage it creates is also allocated in a simulator of torch's CUDA caching allocator (rounding,
pools, segments, splitting, caching, expandable segments) on a device of the given size. When the
simulated device cannot satisfy a request, the script gets torch.OutOfMemoryError with torch's
message at that operation, oomdoctor's capture writes a dump there (explain it with `oomdoctor report`),
and this command says where it happened.

The script must choose its device as a parameter: under rehearsal torch.cuda.is_available() is
False, OOMDOCTOR_REHEARSAL=1 is set, and the script should run on "cpu".
torch.cuda.memory_allocated(), max_memory_allocated(), memory_reserved(), mem_get_info(),
memory_stats() and empty_cache() answer from the simulator. Optimizers take the foreach path and
keep their step counters on the host, as they do on CUDA.

Sizes: 24GiB, 512MiB, 1.5GB (GB, MB = powers of 1000; GiB, MiB, G, M = powers of 1024), or bytes.
Options given after SCRIPT belong to rehearse up to `--` or the first argument rehearse does not
know; everything after that goes to the script.

Limitations (experimental): every CPU tensor the script creates while it runs counts as device
memory, including ones a GPU run would keep on the host (DataLoader batches before .to(device));
memory that kernels use internally (cuBLAS/cuDNN workspaces) and tensors created on other threads
or in other processes (DataLoader workers) are not seen; storages made outside torch's dispatcher
(torch.from_numpy, torch.load) are not counted; the script runs at CPU speed, a little slower for
the bookkeeping.

--fake: the script's tensors carry no data (torch's FakeTensorMode), so a step costs a small part
of its CPU time and host RAM stays small at any model size; the allocations are the same. Scalars
read from tensors (.item(), bool(), tolist()) are placeholders (0, 0.0, False), each call site
reported; sizes that depend on the data (nonzero, boolean masks) are taken at their upper bound;
torch.save of fake tensors is skipped. What cannot run without data (torch.unique, a custom op without
a fake implementation, NumPy reading a tensor) ends the run with one line and exit status 3.

Exit status: 0 the script ran to completion (it fit), 1 it ran out of simulated memory or failed,
the script's own status when it calls sys.exit, 2 bad input, 3 (--fake) the script needs data.

--sweep NAME [--lo A] [--hi B]: the largest value of the script's option NAME that fits, e.g.
    oomdoctor rehearse --fake train.py --device-memory 24GiB --sweep batch-size -- --steps 2
NAME is the option as the script spells it, its dashes optional (batch-size, --batch-size; before
SCRIPT write --sweep=--batch-size). Each probe is this command in a fresh process with NAME set to
the value in the script's arguments (replaced where ARGS give it, else appended): from --lo (1)
doubling until a value does not fit or --hi (65536) is reached, then bisecting between the last
that fit and the first that did not. It says the largest value that fits, its neighbour that does
not and the request it could not get, the fitting probe's peak and every probe. It assumes memory
grows with the value and says when a probe contradicts that. A probe that fails for another reason
stops the sweep with one line. Exit status: 0 a value fits, 1 even --lo does not (or a probe
failed), 2 bad input (a NAME the script does not take), 3 (--fake) a probe needs data.

--world-size N [--rank R | --ranks all]: the script runs as rank R (default 0) of N would under
torchrun, alone: RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT are
set (up to 8 ranks a node), and init_process_group, whatever its arguments, gets torch's fake
process group at that rank: collectives move no data, so an unmodified torchrun script runs, and
each rank's allocations are its own. FSDP2 (fully_shard) and DTensor run as they are; DDP gets a
comm hook that hands each bucket back as reduced, and under --fake its parameter check, broadcast
and bucket rebuild are skipped (they read data). Not modelled: NCCL's own buffers (give them as
--outside-memory) and the all-gather and reduce-scatter streams. --ranks all rehearses every rank,
each in its own process, two at a time (--ranks 0,7: those ranks), and says per rank its peak
allocated and reserved and whether it fits or where it ran out, and the maximum; exit status 0
every rank fits, 1 one ran out or failed, 3 (--fake) one needs data. --sweep plans one rank.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from oomdoctor.commands import add_width_argument, text_width
from oomdoctor.errors import OomdoctorError
from oomdoctor.units import parse_size, plural

_OPTIONS = {
    "--device-memory": "device_memory",
    "--alloc-conf": "alloc_conf",
    "--outside-memory": "outside_memory",
    "--cuda-context": "cuda_context",
    "--out": "out",
    "--format": "format",
    "--width": "width",
    "--sweep": "sweep",
    "--lo": "lo",
    "--hi": "hi",
    "--world-size": "world_size",
    "--rank": "rank",
    "--ranks": "ranks",
}
_FLAGS = {"--fake": "fake"}


def parse_size_bytes(text: str) -> int:
    """'24GiB' -> 25769803776 (oomdoctor.units.parse_size); a bad size is a one-line user error."""
    try:
        return parse_size(text)
    except ValueError as error:
        raise OomdoctorError(str(error)) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device-memory", metavar="SIZE", help="memory of the simulated GPU (required)")
    parser.add_argument(
        "--alloc-conf",
        metavar="STR",
        help="PYTORCH_CUDA_ALLOC_CONF for the simulated allocator (default: the environment's)",
    )
    parser.add_argument(
        "--outside-memory", metavar="SIZE", default="0", help="memory held on the device by other processes"
    )
    parser.add_argument(
        "--cuda-context",
        metavar="SIZE",
        default="0",
        help="this process's CUDA context and other non-PyTorch memory",
    )
    parser.add_argument(
        "--out",
        metavar="DIR",
        help="folder for the dump written at an OOM (default: $OOMDOCTOR_DIR or ./oom-dumps)",
    )
    parser.add_argument(
        "--format",
        choices=("text", "md", "json"),
        default="text",
        help="the memory plan of a run that fits as text, Markdown or JSON (default text)",
    )
    parser.add_argument(
        "--fake",
        action="store_true",
        help="tensors carry no data (torch's fake tensors): far less CPU time and host RAM, the same allocations",
    )
    parser.add_argument(
        "--world-size", metavar="N", help="rehearse one rank of N (torch's fake process group; torchrun's environment)"
    )
    parser.add_argument("--rank", metavar="R", help="--world-size: the rank rehearsed (default 0)")
    parser.add_argument(
        "--ranks",
        metavar="all|R,R",
        help="--world-size: rehearse these ranks (all: every rank), each in its own process",
    )
    add_width_argument(parser)
    parser.add_argument(
        "command", nargs=argparse.REMAINDER, metavar="SCRIPT [-- ARGS]", help="the script and its arguments"
    )
    add_sweep_arguments(parser)


def split_command(args: argparse.Namespace) -> tuple[Path, list[str]]:
    """Take SCRIPT, rehearse's own options after it, and the script's arguments apart."""
    command = list(args.command or [])
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise OomdoctorError("rehearse needs a script to run: oomdoctor rehearse SCRIPT --device-memory SIZE")
    script, rest = command[0], command[1:]
    index = 0
    while index < len(rest):
        token = rest[index]
        if token == "--":
            index += 1
            break
        if token in _FLAGS:
            setattr(args, _FLAGS[token], True)
            index += 1
            continue
        name, equals, value = token.partition("=")
        if name not in _OPTIONS:
            break
        if not equals:
            if index + 1 >= len(rest):
                raise OomdoctorError(f"{name} needs a value")
            value = rest[index + 1]
            index += 1
        setattr(args, _OPTIONS[name], value)
        index += 1
    return Path(script), rest[index:]


def _require_device_and_script(args: argparse.Namespace, script: Path) -> None:
    if args.device_memory is None:
        raise OomdoctorError("--device-memory SIZE is required (for example --device-memory 24GiB)")
    if not script.is_file():
        raise OomdoctorError(f"no such script: {script}")


def _output_format(args: argparse.Namespace) -> str:
    """--format of the plan, a sweep or the ranks: text, md or json."""
    output_format = getattr(args, "format", None) or "text"
    if output_format not in ("text", "md", "json"):
        raise OomdoctorError(f"--format must be text, md or json, not {output_format!r}")
    return output_format


def _dump_dir(args: argparse.Namespace) -> Path:
    """Where dumps go: --out, else $OOMDOCTOR_DIR, else ./oom-dumps."""
    return Path(args.out or os.environ.get("OOMDOCTOR_DIR") or "oom-dumps").resolve()


def run(args: argparse.Namespace) -> int:
    script, script_args = split_command(args)
    width = text_width(args)  # a bad --width fails before the script runs
    world_size, ranks = world_ranks(args)
    if getattr(args, "sweep", None) is not None or getattr(args, "lo", None) or getattr(args, "hi", None):
        if getattr(args, "ranks", None) is not None:
            raise OomdoctorError("--sweep plans one rank: give --rank R (default 0), not --ranks")
        return run_sweep(args, script, script_args)
    if getattr(args, "ranks", None) is not None and not getattr(args, "probe_result", None):
        assert world_size is not None
        return run_ranks(args, script, script_args, world_size, ranks)
    _require_device_and_script(args, script)
    if importlib.util.find_spec("torch") is None:
        raise OomdoctorError("rehearse runs the script with PyTorch, which is not installed here")
    device_memory_bytes = parse_size_bytes(args.device_memory)
    outside_bytes = parse_size_bytes(args.outside_memory)
    cuda_context_bytes = parse_size_bytes(args.cuda_context)
    if device_memory_bytes <= 0:
        raise OomdoctorError("--device-memory must be more than 0 bytes")
    if outside_bytes + cuda_context_bytes >= device_memory_bytes:
        raise OomdoctorError("--outside-memory and --cuda-context leave no device memory for PyTorch")
    alloc_conf = args.alloc_conf
    if alloc_conf is None:
        alloc_conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or os.environ.get("PYTORCH_ALLOC_CONF") or ""
    _check_alloc_conf(alloc_conf)
    dump_dir = _dump_dir(args)

    from oomdoctor.rehearse.session import RehearsalConfig, rehearse_script

    config = RehearsalConfig(
        device_memory_bytes=device_memory_bytes,
        alloc_conf=alloc_conf,
        outside_bytes=outside_bytes,
        cuda_context_bytes=cuda_context_bytes,
        fake=bool(getattr(args, "fake", False)),
        world_size=world_size,
        rank=ranks[0] if ranks else 0,
    )
    probing = getattr(args, "probe_result", None)
    result = rehearse_script(script, script_args, config, dump_dir=dump_dir, dump_at_end=not probing)
    sys.stdout.flush()
    sys.stderr.flush()
    if probing:
        write_probe_result(Path(probing), result)
        return result.exit_code
    output_format = _output_format(args)
    plan = _plan(script, config, result, output_format)
    text = plan if plan is not None else format_result(script, config, result)
    if output_format == "text" or plan is None:  # the result without a plan is text in any format
        from oomdoctor.views.wrap import wrap_text

        text = wrap_text(text, width)
    print(text)
    return result.exit_code


def _plan(script: Path, config: Any, result: Any, output_format: str) -> str | None:
    """The memory plan of a run that fits, read from its end-of-run dump; None otherwise."""
    if result.exit_code != 0 or result.oom is not None or result.end_dump is None:
        return None
    from oomdoctor.analysis import analyser
    from oomdoctor.analysis.plan import memory_plan
    from oomdoctor.pipeline import load_snapshot
    from oomdoctor.units import format_size
    from oomdoctor.views.plan import render_plan

    try:
        snapshot = load_snapshot(str(result.end_dump))
    except OomdoctorError:
        return None
    events = len(snapshot.traces[0]) if snapshot.traces else 0
    if not events:
        return None
    # one reading of the device: every event a point of the series, and each phase's peak judged in full
    moments = analyser(snapshot, series_points=events + 1)
    plan = memory_plan(
        moments.analyse(),
        moments.analyse,
        device_memory_bytes=config.device_memory_bytes,
        outside_bytes=config.outside_bytes + config.cuda_context_bytes,
        peak_allocated_bytes=result.peak_allocated_bytes,
        peak_reserved_bytes=result.peak_reserved_bytes,
    )
    mode = _rank_words(config) + ("rehearsal without data" if config.fake else "rehearsal")
    title = (
        f"Fits: {script.name} ran to completion on a simulated {format_size(config.device_memory_bytes)} GPU"
        f" ({mode}, experimental). Memory plan:"
    )
    notes = list(result.fake_notes.lines()) if result.fake_notes is not None else []
    caught = [oom for oom in result.ooms_seen if oom is not result.oom]
    if caught:
        notes.append(f"  the script caught {_errors(len(caught))}, the first at {_where(caught[0])}")
    notes.append(f"  dump: {_display(result.end_dump)}  (oomdoctor report {_display(result.end_dump)})")
    extra: dict[str, Any] = {"script": script.name, "fits": True, "fake": bool(config.fake)}
    extra["peak_requested_bytes"] = result.peak_requested_bytes
    if config.world_size is not None:
        extra.update(world_size=config.world_size, rank=config.rank)
    if result.fake_notes is not None:
        extra["fake_notes"] = result.fake_notes.to_json()
    extra["dump"] = _display(result.end_dump)
    return render_plan(plan, output_format, title=title, notes=notes, extra=extra)


def _rank_words(config: Any) -> str:
    world_size = getattr(config, "world_size", None)
    return f"rank {config.rank} of {world_size}, " if world_size is not None else ""


def _check_alloc_conf(alloc_conf: str) -> None:
    from oomdoctor.allocator_rules import AllocatorConfigError, parse_alloc_conf

    try:
        parse_alloc_conf(alloc_conf)
    except AllocatorConfigError as error:
        raise OomdoctorError(f"bad --alloc-conf {alloc_conf!r}: {error}") from None


def format_result(script: Path, config: Any, result: Any) -> str:
    """The report: one line saying whether it ran out, then where, torch's message and the dump."""
    from oomdoctor.units import format_size

    device = f"a simulated {format_size(config.device_memory_bytes)} GPU"
    rehearsal = f"{_rank_words(config)}rehearsal"
    peaks = (
        f"  peak: {format_size(result.peak_allocated_bytes)} allocated, "
        f"{format_size(result.peak_reserved_bytes)} reserved by PyTorch"
    )
    lines = []
    if result.oom is not None:
        oom = result.oom
        cell = " in a notebook cell" if getattr(result, "oom_in_cell", False) else ""
        lines.append(f"Out of memory: {script.name} ran out of memory{cell} on {device} ({rehearsal}, experimental).")
        lines.append(f"  where: {_where(oom)}")
        innermost = oom.frames[0] if oom.frames else None
        if innermost is not None and innermost is not oom.user_frame:
            lines.append(f"  inside: {_frame_text(innermost)}")
        lines.append(f"  request: {format_size(oom.request_bytes)} (rounded) for {oom.op}")
        lines.append(f"  torch: {oom.message}")
        lines.append(peaks)
    elif result.exit_code == 0:
        lines.append(f"Fits: {script.name} ran to completion on {device} ({rehearsal}, experimental).")
        usable_bytes = config.device_memory_bytes - config.outside_bytes - config.cuda_context_bytes
        headroom_bytes = max(0, usable_bytes - result.peak_reserved_bytes)
        lines.append(f"{peaks}; {format_size(headroom_bytes)} to spare at the peak")
    elif result.fake_failure is not None:
        lines.append(f"Cannot rehearse without data: {result.fake_failure}")
        lines.append(peaks)
    else:
        status = result.exit_code
        lines.append(f"Failed: {script.name} stopped with exit status {status} before running out of memory.")
        lines.append(peaks)
        if result.error_text and "not compiled with CUDA enabled" in result.error_text:
            lines.append(
                '  hint: the script asked for CUDA; under rehearsal it must run on "cpu". Make the device a'
                " parameter, or pick it with torch.cuda.is_available() (False here) or OOMDOCTOR_REHEARSAL=1."
            )
    if result.fake_notes is not None:
        lines.extend(result.fake_notes.lines())
    caught = [oom for oom in result.ooms_seen if oom is not result.oom]
    if caught:
        first = _where(caught[0])
        lines.append(f"  the script caught {_errors(len(caught))}, the first at {first}")
    for path in result.dump_paths:
        lines.append(f"  dump: {_display(path)}  (oomdoctor report {_display(path)})")
    if result.oom is not None and not result.dump_paths:
        lines.append("  dump: none was written (see the messages above)")
    return "\n".join(lines)


def _errors(count: int) -> str:
    return plural(count, "out-of-memory error")


def _where(oom: Any) -> str:
    frame = oom.user_frame
    place = _frame_text(frame) if frame else "unknown line"
    return f"{place} (phase: {oom.phase})" if oom.phase else place


def _frame_text(frame: dict) -> str:
    filename = frame["filename"]
    marker = f"{os.sep}torch{os.sep}"
    if marker in filename:  # library frames read better from the package down
        shown = "torch" + os.sep + filename.rsplit(marker, 1)[1]
    else:
        shown = _display(Path(filename))
    return f"{shown}:{frame['line']} in {frame['name']}"


def _display(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


# -- --sweep NAME: the largest value of one script argument that fits -----------------------------

_SWEEP_NAME = re.compile(r"^--?[A-Za-z0-9][A-Za-z0-9_.-]*$")
_UNRECOGNIZED = "unrecognized arguments"


def add_sweep_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--sweep",
        metavar="NAME",
        help="the largest value of the script's option NAME (--sweep batch-size, or --sweep=--batch-size) that fits",
    )
    parser.add_argument("--lo", metavar="N", help="--sweep: the first value tried (default 1)")
    parser.add_argument("--hi", metavar="N", help="--sweep: the largest value tried (default 65536)")
    # a sweep's probe: rehearse once and write what happened as JSON to FILE (no memory plan)
    parser.add_argument("--probe-result", metavar="FILE", help=argparse.SUPPRESS)


def sweep_option(name: str) -> str:
    """The script's option a --sweep NAME means: 'batch-size' and '--batch-size' -> '--batch-size'."""
    option = name.strip()
    if option and not option.startswith("-"):
        option = "--" + option
    if not _SWEEP_NAME.match(option):
        raise OomdoctorError(
            f"--sweep needs the name of one of the script's options, like batch-size or --batch-size, not {name!r}"
        )
    return option


def with_value(script_args: list[str], option: str, value: int) -> list[str]:
    """The script's arguments with `option` set to `value`: each `option V` or `option=V` replaced,
    or `option value` appended when the arguments do not give it."""
    out: list[str] = []
    found = False
    index = 0
    while index < len(script_args):
        token = script_args[index]
        if token == option:
            out += [option, str(value)]
            found = True
            index += 2
            continue
        if token.startswith(option + "="):
            out.append(f"{option}={value}")
            found = True
        else:
            out.append(token)
        index += 1
    return out if found else [*out, option, str(value)]


def _sweep_bound(flag: str, text: str | None, default: int) -> int:
    if text is None:
        return default
    try:
        value = int(str(text).replace("_", ""))
    except ValueError:
        raise OomdoctorError(f"{flag} must be a whole number, not {text!r}") from None
    if value < 1:
        raise OomdoctorError(f"{flag} must be 1 or more, not {value}")
    return value


def run_sweep(args: argparse.Namespace, script: Path, script_args: list[str]) -> int:
    """`rehearse --sweep NAME`: double from --lo, then bisect; each probe is `oomdoctor rehearse` in
    a fresh process with NAME set in the script's arguments (oomdoctor.analysis.sweep)."""
    from oomdoctor.analysis.sweep import DEFAULT_HI, DEFAULT_LO, NEEDS_DATA, sweep
    from oomdoctor.views.sweep import render_sweep

    if getattr(args, "sweep", None) is None:
        raise OomdoctorError("--lo and --hi go with --sweep NAME")
    option = sweep_option(args.sweep)
    lo = _sweep_bound("--lo", args.lo, DEFAULT_LO)
    hi = _sweep_bound("--hi", args.hi, max(DEFAULT_HI, lo))
    if hi < lo:
        raise OomdoctorError(f"--hi {hi} is below --lo {lo}")
    _require_device_and_script(args, script)
    device_memory_bytes = parse_size_bytes(args.device_memory)
    usable_bytes = device_memory_bytes - parse_size_bytes(args.outside_memory) - parse_size_bytes(args.cuda_context)
    output_format = _output_format(args)
    dump_dir = _dump_dir(args)
    with tempfile.TemporaryDirectory(prefix="oomdoctor-sweep-") as work:

        def probe(value: int) -> Any:
            return _probe(args, script, with_value(script_args, option, value), option, value, Path(work))

        result = sweep(probe, lo=lo, hi=hi)
        dump = _keep_dump(result.smallest_failure, dump_dir) if result.stopped is None else None
    print(
        render_sweep(
            result,
            output_format,
            name=option,
            device_memory_bytes=device_memory_bytes,
            usable_bytes=usable_bytes,
            script=script.name,
            fake=bool(getattr(args, "fake", False)),
            dump=dump,
        )
    )
    if result.stopped is not None:
        return 3 if result.stopped.outcome == NEEDS_DATA else 1
    return 0 if result.largest_fit is not None else 1


def _child_rehearsal(
    args: argparse.Namespace, script: Path, script_args: list[str], result_file: Path, dump_dir: Path, rank: int | None
) -> tuple[dict[str, Any] | None, str, int]:
    """`python -m oomdoctor rehearse --probe-result FILE ...` of the script in a fresh process, with
    this command's device options (and --world-size N --rank `rank`): its record (None when it
    wrote none), the last line of its stderr and its exit status."""
    argv = [sys.executable, "-m", "oomdoctor", "rehearse", "--probe-result", str(result_file)]
    argv += ["--device-memory", args.device_memory, "--out", str(dump_dir)]
    argv += ["--outside-memory", args.outside_memory, "--cuda-context", args.cuda_context]
    if args.alloc_conf is not None:
        argv += ["--alloc-conf", args.alloc_conf]
    if getattr(args, "fake", False):
        argv.append("--fake")
    if getattr(args, "world_size", None) is not None:
        argv += ["--world-size", str(args.world_size), "--rank", str(rank if rank is not None else 0)]
    argv += [str(script), "--", *script_args]
    env = dict(os.environ)
    package_root = str(Path(__file__).resolve().parent.parent.parent)  # the oomdoctor this process runs
    env["PYTHONPATH"] = os.pathsep.join(part for part in (package_root, env.get("PYTHONPATH")) if part)
    done = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL, env=env)
    last_error = next((line.strip() for line in reversed(done.stderr.splitlines()) if line.strip()), "")
    record = json.loads(result_file.read_text()) if result_file.is_file() else None
    return record, last_error, done.returncode


def _as_probe(record: dict[str, Any], value: int, last_error: str) -> Any:
    from oomdoctor.analysis.sweep import FAILED, FailedRequest, Probe

    reason = record.get("reason")
    if record["outcome"] == FAILED and record.get("error") is None and last_error:
        reason = f"{reason}: {last_error}"
    request = record.get("request")
    return Probe(
        value=value,
        outcome=record["outcome"],
        peak_allocated_bytes=int(record["peak_allocated_bytes"]),
        peak_reserved_bytes=int(record["peak_reserved_bytes"]),
        request=FailedRequest(**request) if request else None,
        reason=reason,
        dumps=tuple(record.get("dumps", ())),
        peak_requested_bytes=int(record.get("peak_requested_bytes", 0)),
    )


def _probe(args: argparse.Namespace, script: Path, script_args: list[str], option: str, value: int, work: Path) -> Any:
    """One rehearsal at `value`: `python -m oomdoctor rehearse --probe-result FILE ...` of the script."""
    from oomdoctor.analysis.sweep import FAILED

    folder = work / str(value)
    record, last_error, status = _child_rehearsal(
        args, script, script_args, folder / "probe.json", folder / "dumps", getattr(args, "rank_chosen", None)
    )
    if record is None:
        reason = last_error.removeprefix("oomdoctor: ") or f"exit status {status}"
        raise OomdoctorError(f"the rehearsal of {option} {value} gave no result: {reason}")
    if record["outcome"] == FAILED and _UNRECOGNIZED in last_error and option in last_error:
        raise OomdoctorError(f"{script.name} does not take {option}: {last_error}")
    probe = _as_probe(record, value, last_error)
    if sys.stderr.isatty():
        print(f"oomdoctor: {option} {value}: {probe.outcome.replace('_', ' ')}", file=sys.stderr)
    return probe


def write_probe_result(path: Path, result: Any) -> None:
    """What one rehearsal of a sweep found, as JSON, for the sweeping process to read."""
    from oomdoctor.analysis.sweep import FAILED, FITS, NEEDS_DATA, OUT_OF_MEMORY

    request = None
    error = None
    if result.fake_failure is not None:
        outcome, reason = NEEDS_DATA, result.fake_failure
    elif result.oom is not None:
        oom = result.oom
        outcome, reason = OUT_OF_MEMORY, None
        site = _frame_text(oom.user_frame) if oom.user_frame else "unknown line"
        request = {
            "request_bytes": oom.request_bytes,
            "op": oom.op,
            "phase": oom.phase,
            "site": site,
            "message": oom.message,
        }
    elif result.exit_code == 0:
        outcome, reason = FITS, None
    else:
        outcome, reason = FAILED, f"exit status {result.exit_code}"
        if result.error_text:
            error = next((line.strip() for line in reversed(result.error_text.splitlines()) if line.strip()), None)
            reason = error or reason
    record = {
        "outcome": outcome,
        "exit_code": result.exit_code,
        "peak_allocated_bytes": result.peak_allocated_bytes,
        "peak_reserved_bytes": result.peak_reserved_bytes,
        "peak_requested_bytes": result.peak_requested_bytes,
        "request": request,
        "reason": reason,
        "error": error,
        "dumps": [str(path) for path in result.dump_paths],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record))


def _keep_dump(failure: Any, dump_dir: Path) -> str | None:
    """The OOM dump of the value that did not fit, copied out of the sweep's temporary folder."""
    if failure is None or not failure.dumps:
        return None
    source = Path(failure.dumps[-1])
    if not source.is_file():
        return None
    dump_dir.mkdir(parents=True, exist_ok=True)
    target = dump_dir / source.name
    shutil.copy2(source, target)
    return _display(target)


# -- --world-size N [--rank R | --ranks all]: simulated ranks -------------------------------------

RANKS_AT_ONCE = 2  # --ranks: rank processes run side by side


def _whole_number(flag: str, text: Any, least: int) -> int:
    try:
        value = int(str(text).replace("_", ""))
    except ValueError:
        raise OomdoctorError(f"{flag} must be a whole number, not {text!r}") from None
    if value < least:
        raise OomdoctorError(f"{flag} must be {least} or more, not {value}")
    return value


def world_ranks(args: argparse.Namespace) -> tuple[int | None, list[int]]:
    """--world-size, --rank and --ranks read and checked: (N, the ranks to rehearse), or (None, [])."""
    world_text, rank_text, ranks_text = (getattr(args, name, None) for name in ("world_size", "rank", "ranks"))
    if world_text is None:
        if rank_text is not None or ranks_text is not None:
            raise OomdoctorError("--rank and --ranks go with --world-size N")
        return None, []
    world_size = _whole_number("--world-size", world_text, 1)
    args.world_size = world_size
    if rank_text is not None and ranks_text is not None:
        raise OomdoctorError("give --rank R or --ranks, not both")
    if ranks_text is None:
        rank = _whole_number("--rank", rank_text, 0) if rank_text is not None else 0
        if rank >= world_size:
            raise OomdoctorError(f"--rank {rank} is not in a world of {world_size} (ranks 0 to {world_size - 1})")
        args.rank_chosen = rank
        return world_size, [rank]
    if str(ranks_text).strip().lower() == "all":
        return world_size, list(range(world_size))
    ranks: list[int] = []
    for part in str(ranks_text).split(","):
        rank = _whole_number("--ranks", part.strip(), 0)
        if rank >= world_size:
            raise OomdoctorError(
                f"--ranks: rank {rank} is not in a world of {world_size} (ranks 0 to {world_size - 1})"
            )
        if rank not in ranks:
            ranks.append(rank)
    return world_size, ranks


def run_ranks(args: argparse.Namespace, script: Path, script_args: list[str], world_size: int, ranks: list[int]) -> int:
    """`rehearse --world-size N --ranks all`: each rank rehearsed in a fresh process (two at a time),
    a row per rank and the maximum (oomdoctor.analysis.world)."""
    from concurrent.futures import ThreadPoolExecutor

    from oomdoctor.analysis.sweep import FAILED, Probe
    from oomdoctor.analysis.world import world
    from oomdoctor.views.world import render_world

    _require_device_and_script(args, script)
    if importlib.util.find_spec("torch") is None:
        raise OomdoctorError("rehearse runs the script with PyTorch, which is not installed here")
    device_memory_bytes = parse_size_bytes(args.device_memory)
    usable_bytes = device_memory_bytes - parse_size_bytes(args.outside_memory) - parse_size_bytes(args.cuda_context)
    if usable_bytes <= 0:
        raise OomdoctorError("--outside-memory and --cuda-context leave no device memory for PyTorch")
    _check_alloc_conf(args.alloc_conf or "")
    output_format = _output_format(args)
    dump_dir = _dump_dir(args)
    with tempfile.TemporaryDirectory(prefix="oomdoctor-ranks-") as work:

        def rehearse_rank(rank: int) -> Probe:
            folder = Path(work) / f"rank{rank}"  # its own: ranks run side by side
            record, last_error, status = _child_rehearsal(
                args, script, script_args, folder / "result.json", folder / "dumps", rank
            )
            if record is None:
                reason = last_error.removeprefix("oomdoctor: ") or f"exit status {status}"
                return Probe(rank, FAILED, 0, 0, reason=f"no result: {reason}")
            kept = (_move_dump(Path(dump), dump_dir) for dump in record.get("dumps", ()))
            record["dumps"] = [dump for dump in kept if dump is not None]
            probe = _as_probe(record, rank, last_error)
            if sys.stderr.isatty():
                print(f"oomdoctor: rank {rank}: {probe.outcome.replace('_', ' ')}", file=sys.stderr)
            return probe

        with ThreadPoolExecutor(max_workers=RANKS_AT_ONCE) as pool:
            result = world(world_size, list(pool.map(rehearse_rank, ranks)))
    dumps = [dump for rank in result.ranks for dump in rank.dumps]
    print(
        render_world(
            result,
            output_format,
            device_memory_bytes=device_memory_bytes,
            usable_bytes=usable_bytes,
            script=script.name,
            fake=bool(getattr(args, "fake", False)),
            dumps=dumps,
        )
    )
    if result.all_fit:
        return 0
    if result.out_of_memory or result.failed:
        return 1
    return 3 if result.needs_data else 1


def _move_dump(source: Path, dump_dir: Path) -> str | None:
    """A rank's dump moved out of the temporary folder into the dump folder (as shown)."""
    if not source.is_file():
        return None
    dump_dir.mkdir(parents=True, exist_ok=True)
    target = dump_dir / source.name
    shutil.move(str(source), target)
    return _display(target)
