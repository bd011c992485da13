"""CPU time and host RAM of `rehearse --fake` against the real-CPU rehearsal, on one GPT training step.

    python benchmarks/rehearse_fake.py [--preset small|gpt2|1.3b|7b] [--steps 2] [--fake-only]
    python benchmarks/rehearse_fake.py --world-size 8 [--ranks 0,7|all] [--bf16] [--preset 7b] \
        [--device-memory 80GiB]
    python benchmarks/rehearse_fake.py --sweep --preset 1.3b --device-memory 24GB [--seq-len 1024]

Each mode runs in a fresh process (`--child`) that rehearses a GPT training script (the fixtures'
TinyGPT: token and position embeddings, pre-norm blocks, LM head; foreach AdamW; `loss.item()`
printed each step) on a simulated 1 TiB device, timing each step with `time.process_time()`. The
parent prints CPU seconds per step, the process's max RSS, the simulator's peaks, and the ratio of
the steady-state steps (the first step is warm-up). `--fake-only` skips the real run (the larger
presets do not fit a laptop's RAM for real). CPU seconds are the figures to compare on a loaded
machine, not wall time. Not a test: nothing here is timed in CI.

--world-size N plans an FSDP2 run instead: the same GPT, each block and the root `fully_shard`ed
over N ranks (with --bf16, MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)), a
torchrun-style script (init_process_group() without arguments) run by
`oomdoctor rehearse --fake --world-size N --ranks RANKS --format json` on a device of
--device-memory; it prints each rank's peak allocated, reserved and requested, whether it fits,
and the CPU seconds and wall time of the whole plan.

--sweep finds the largest batch of the same GPT (single device, fp32 foreach AdamW) that fits
--device-memory: `oomdoctor rehearse --fake --sweep batch-size`, printed as the verb prints it.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PRESETS = {
    # layers, d_model, heads, seq, batch, vocab
    "small": (4, 512, 8, 512, 8, 8192),  # 17M parameters (the study's gpt_train.py)
    "gpt2": (12, 768, 12, 1024, 4, 50304),  # GPT-2 small sized, 124M
    "1.3b": (24, 2048, 16, 2048, 8, 50304),
    "7b": (32, 4096, 32, 2048, 1, 32000),
}

WORKLOAD = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, {scenarios!r})
    import torch
    from models import TinyGPT

    layers, width, heads, seq, batch, vocab, steps = (int(value) for value in sys.argv[1:8])
    model = TinyGPT(vocab, width, layers, heads, seq)
    optimizer = torch.optim.AdamW(model.parameters(), foreach=True)
    for step in range(steps):
        start = time.process_time()
        tokens = torch.randint(vocab, (batch, seq + 1))
        _, loss = model(tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        print(f"loss {{loss.item():.3f}}", file=sys.stderr)
        print(f"STEP {{time.process_time() - start:.3f}}", flush=True)
    """
)


FSDP_WORKLOAD = textwrap.dedent(
    """
    import os, sys
    sys.path.insert(0, {scenarios!r})
    import torch, torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from models import TinyGPT

    layers, width, heads, seq, batch, vocab, steps = (int(value) for value in sys.argv[1:8])
    bf16 = sys.argv[8] == "bf16"
    dist.init_process_group()
    mesh = init_device_mesh("cpu", (int(os.environ["WORLD_SIZE"]),))
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else None
    options = {{"mesh": mesh, **({{"mp_policy": policy}} if policy else {{}})}}
    model = TinyGPT(vocab, width, layers, heads, seq)
    for block in model.blocks:
        fully_shard(block, **options)
    fully_shard(model, **options)
    optimizer = torch.optim.AdamW(model.parameters(), foreach=True)
    for step in range(steps):
        tokens = torch.randint(vocab, (batch, seq + 1))
        _, loss = model(tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    dist.destroy_process_group()
    """
)


SWEEP_WORKLOAD = textwrap.dedent(
    """
    import argparse, sys
    sys.path.insert(0, {scenarios!r})
    import torch
    from models import TinyGPT

    parser = argparse.ArgumentParser()
    for name in ("--layers", "--width", "--heads", "--seq-len", "--batch-size", "--vocab", "--steps"):
        parser.add_argument(name, type=int)
    args = parser.parse_args()
    model = TinyGPT(args.vocab, args.width, args.layers, args.heads, args.seq_len)
    optimizer = torch.optim.AdamW(model.parameters(), foreach=True)
    for step in range(args.steps):
        tokens = torch.randint(args.vocab, (args.batch_size, args.seq_len + 1))
        _, loss = model(tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    """
)


def run_oomdoctor(argv: list[str]) -> tuple[subprocess.CompletedProcess, float]:
    """`argv` (a `python -m oomdoctor ...` command) with this checkout importable; (what it
    printed, its wall seconds)."""
    import os
    import time

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(part for part in (str(ROOT), env.get("PYTHONPATH")) if part)
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, check=False, env=env)
    return done, time.monotonic() - started


def sweep_batch(preset: str, steps: int, device_memory: str, seq_len: int | None) -> None:
    """`oomdoctor rehearse --fake --sweep batch-size` of the preset's GPT on a device of
    `device_memory`: the largest batch that fits, as the verb prints it."""

    layers, width, heads, seq, _batch, vocab = PRESETS[preset]
    seq = seq_len or seq
    print(f"GPT {preset} ({layers} layers, d_model {width}, seq {seq}, vocab {vocab}), fp32 AdamW, {steps} steps")
    with tempfile.TemporaryDirectory() as folder:
        script = Path(folder) / "gpt_sweep.py"
        script.write_text(SWEEP_WORKLOAD.format(scenarios=str(ROOT / "fixtures" / "scenarios")))
        argv = [sys.executable, "-m", "oomdoctor", "rehearse", "--fake", "--device-memory", device_memory]
        argv += ["--out", folder, "--sweep", "batch-size", str(script), "--"]
        options = {"--layers": layers, "--width": width, "--heads": heads, "--seq-len": seq, "--vocab": vocab}
        argv += [str(part) for name, value in {**options, "--steps": steps}.items() for part in (name, value)]
        argv += ["--batch-size", "1"]
        done, wall = run_oomdoctor(argv)
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(done.stdout.rstrip() or done.stderr[-3000:])
    print(f"  exit status {done.returncode}; {usage.ru_utime + usage.ru_stime:.1f} CPU s, {wall:.0f} s wall")


def plan_world(preset: str, steps: int, world_size: int, ranks: str, bf16: bool, device_memory: str) -> None:

    layers, width, heads, seq, batch, vocab = PRESETS[preset]
    precision = "bf16 mixed precision" if bf16 else "fp32"
    print(
        f"FSDP2 GPT {preset} ({layers} layers, d_model {width}, batch {batch}x{seq}, vocab {vocab}), {precision}, "
        f"world size {world_size}, ranks {ranks}, {device_memory} a rank, {steps} steps, --fake"
    )
    with tempfile.TemporaryDirectory() as folder:
        script = Path(folder) / "fsdp_step.py"
        script.write_text(FSDP_WORKLOAD.format(scenarios=str(ROOT / "fixtures" / "scenarios")))
        argv = [sys.executable, "-m", "oomdoctor", "rehearse", "--fake", "--world-size", str(world_size)]
        argv += ["--ranks", ranks, "--device-memory", device_memory, "--format", "json", "--out", folder]
        argv += [str(script), "--", *(str(value) for value in (*PRESETS[preset], steps)), "bf16" if bf16 else "fp32"]
        done, wall = run_oomdoctor(argv)
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    if "{" not in done.stdout:
        raise SystemExit(f"the plan failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    answer = json.loads(done.stdout[done.stdout.index("{") :])
    print(f"  {answer['headline']}")
    for rank in answer["ranks"]:
        where = f"  ({rank['request']['op']} at {rank['request']['site']})" if rank["request"] else ""
        print(
            f"  rank {rank['rank']}: {rank['outcome']:<13} peak {gib(rank['peak_allocated_bytes'])} allocated, "
            f"{gib(rank['peak_reserved_bytes'])} reserved, {gib(rank['peak_requested_bytes'])} requested{where}"
        )
    print(f"  max: {gib(answer['max_reserved_bytes'] or 0)} reserved (rank {answer['max_reserved_rank']})")
    print(
        f"  {usage.ru_utime + usage.ru_stime:.1f} CPU s for {len(answer['ranks'])} ranks "
        f"(max RSS of a rank process {gib(usage.ru_maxrss * 1024)}), {wall:.0f} s wall"
    )


def child(fake: bool, preset: str, steps: int) -> None:
    from oomdoctor.rehearse.session import RehearsalConfig, rehearse_script

    with tempfile.TemporaryDirectory() as folder:
        script = Path(folder) / "gpt_step.py"
        script.write_text(WORKLOAD.format(scenarios=str(ROOT / "fixtures" / "scenarios")))
        config = RehearsalConfig(device_memory_bytes=2**40, fake=fake)
        args = [str(value) for value in (*PRESETS[preset], steps)]
        result = rehearse_script(script, args, config, dump_dir=Path(folder) / "dumps")
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(
        "RESULT "
        + json.dumps(
            {
                "exit_code": result.exit_code,
                "cpu_s": usage.ru_utime + usage.ru_stime,
                "max_rss_bytes": usage.ru_maxrss * 1024,
                "peak_allocated": result.peak_allocated_bytes,
                "peak_reserved": result.peak_reserved_bytes,
            }
        )
    )


def measure(fake: bool, preset: str, steps: int) -> dict:
    argv = [sys.executable, __file__, "--child", "fake" if fake else "real", "--preset", preset, "--steps", str(steps)]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    steps_s = [float(line.split()[1]) for line in done.stdout.splitlines() if line.startswith("STEP ")]
    results = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if not results:
        raise SystemExit(f"the {'fake' if fake else 'real'} run failed:\n{done.stderr[-3000:]}")
    figures = json.loads(results[-1].removeprefix("RESULT "))
    figures["steps_s"] = steps_s
    return figures


def gib(value: int) -> str:
    return f"{value / 2**30:.2f} GiB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="small")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--fake-only", action="store_true")
    parser.add_argument("--world-size", type=int, help="plan an FSDP2 run of this many ranks (--fake)")
    parser.add_argument("--ranks", default=None, help="--world-size: the ranks planned (default 0 and the last)")
    parser.add_argument("--bf16", action="store_true", help="--world-size: bf16 mixed precision (fp32 reduce)")
    parser.add_argument("--device-memory", default="80GiB", help="--world-size: each rank's device (default 80GiB)")
    parser.add_argument("--sweep", action="store_true", help="the largest batch that fits --device-memory (--fake)")
    parser.add_argument("--seq-len", type=int, default=None, help="--sweep: the sequence length (default the preset's)")
    parser.add_argument("--child", choices=("real", "fake"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.sweep:
        sweep_batch(args.preset, args.steps, args.device_memory, args.seq_len)
        return
    if args.world_size:
        ranks = args.ranks or ",".join(sorted({"0", str(args.world_size - 1)}, key=int))
        plan_world(args.preset, args.steps, args.world_size, ranks, args.bf16, args.device_memory)
        return
    if args.child:
        child(args.child == "fake", args.preset, args.steps)
        return
    layers, width, heads, seq, batch, vocab = PRESETS[args.preset]
    print(f"GPT {args.preset}: {layers} layers, d_model {width}, {heads} heads, batch {batch}x{seq}, vocab {vocab}")
    modes = [("fake", True)] if args.fake_only else [("real", False), ("fake", True)]
    figures = {name: measure(fake, args.preset, args.steps) for name, fake in modes}
    for name, values in figures.items():
        per_step = " / ".join(f"{value:.2f}" for value in values["steps_s"])
        print(
            f"  {name:4}  CPU s per step {per_step}  (process {values['cpu_s']:.1f} CPU s)  "
            f"max RSS {gib(values['max_rss_bytes'])}  "
            f"peak {gib(values['peak_allocated'])} allocated / {gib(values['peak_reserved'])} reserved"
        )
    if "real" in figures:
        real, fake = figures["real"], figures["fake"]
        steady = slice(1, None) if len(real["steps_s"]) > 1 else slice(None)
        ratio = statistics.median(real["steps_s"][steady]) / max(statistics.median(fake["steps_s"][steady]), 1e-9)
        same = (real["peak_allocated"], real["peak_reserved"]) == (fake["peak_allocated"], fake["peak_reserved"])
        print(f"  fake is {ratio:.1f}x less CPU per steady-state step; peaks identical: {'yes' if same else 'no'}")
        print(f"  host RAM: real {gib(real['max_rss_bytes'])}, fake {gib(fake['max_rss_bytes'])}")


if __name__ == "__main__":
    main()
