"""One scenario of fixtures/ in this process, for real on CUDA or under rehearsal; run by driver.py.

    python benchmarks/gpu/scenario_child.py run SPEC.json     # writes result.json beside SPEC.json
    python benchmarks/gpu/scenario_child.py probe OUT.json    # this machine's torch, GPU and cuBLAS workspace

SPEC.json: {"mode": "cuda" | "rehearsal", "script", "args", "device_memory_bytes", "alloc_conf",
"outside_bytes", "dump_dir"}. The scenario runs as `python script ARGS` would, as __main__, with
its own `oomdoctor.install()` call. On CUDA the device is made as small as the fixture's
simulated one before the script allocates anything:

* no outside memory: `torch.cuda.set_per_process_memory_fraction(device_memory / total)`, so PyTorch
  may reserve exactly the fixture's capacity (the CUDA context is not counted by the fraction, nor by
  the simulator);
* outside memory (the `outside-pytorch` fixtures): another process (holder.py) takes all free device
  memory but `device_memory - outside` bytes, as a second job sharing the GPU would. The kernels the
  scenarios use are loaded and cuBLAS is initialized first (then its workspace and the cache are
  released), so that lazy loading does not eat the little memory left.

Independently of oomdoctor's analysis, the result records at the first OOM (inside torch's OOM
observer, after oomdoctor's own, before anything unwinds) or at the script's `oomdoctor.dump()`:
the phase and step (the fixtures' own PhaseTracker), the storage addresses of every parameter,
gradient, optimizer state tensor and buffer alive (by identity, as fixtures/ground_truth.py does),
and the allocator's own counters. driver.py turns the addresses into bytes with the dump's blocks.
"""

from __future__ import annotations

import gc
import json
import os
import runpy
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPOSITORY_ROOT = HERE.parent.parent
SCENARIOS_DIR = REPOSITORY_ROOT / "fixtures" / "scenarios"
sys.path.insert(0, str(REPOSITORY_ROOT / "fixtures"))  # ground_truth.py: PhaseTracker, _named_tensors

STATS_KEYS = {
    "allocated_bytes": "allocated_bytes.all.current",
    "reserved_bytes": "reserved_bytes.all.current",
    "inactive_split_bytes": "inactive_split_bytes.all.current",
    "num_alloc_retries": "num_alloc_retries",
    "num_ooms": "num_ooms",
}


def _stats(backend: Any, device: int) -> dict[str, int]:
    try:
        stats = backend.memory_stats(device)
    except Exception:
        return {}
    return {name: int(stats.get(key, 0)) for name, key in STATS_KEYS.items()}


class Witness:
    """The ground truth this process can see at the OOM or the on-demand dump (see module doc)."""

    def __init__(self) -> None:
        from ground_truth import PhaseTracker

        self.tracker = PhaseTracker()
        self.tracker.install()
        self.ooms: list[dict[str, Any]] = []
        self.moment: dict[str, Any] | None = None

    def take(self, reason: str) -> dict[str, Any]:
        from ground_truth import _named_tensors
        from oomdoctor.capture.backend import active_backend

        backend = active_backend()
        addresses: dict[str, list[int]] = {}
        for component, tensor in _named_tensors():
            address = backend.storage_address(tensor)
            if address is not None:
                addresses.setdefault(component, []).append(int(address))
        device = backend.current_device()
        return {
            "reason": reason,
            "phase": self.tracker.phase,
            "step": self.tracker.steps_completed,
            "state_addresses": addresses,
            "memory": _stats(backend, device),
        }

    def observer(self, device: int, alloc_bytes: int, device_total_bytes: int, device_free_bytes: int) -> None:
        try:
            call = {
                "alloc_bytes": int(alloc_bytes),
                "device_total_bytes": int(device_total_bytes),
                "device_free_bytes": int(device_free_bytes),
                "phase": self.tracker.phase,
                "step": self.tracker.steps_completed,
            }
            self.ooms.append(call)
            if self.moment is None:
                self.moment = {**self.take("oom"), "observer": call}
        except Exception:  # never replace torch's OutOfMemoryError
            traceback.print_exc()

    def wrap_oomdoctor(self) -> None:
        """The script's own install() also attaches our observer (after oomdoctor's); its dump()
        first records the moment."""
        import oomdoctor
        from oomdoctor.capture.backend import active_backend

        install, dump = oomdoctor.install, oomdoctor.dump
        attached = []

        def install_then_observe(**options: Any) -> None:
            install(**options)
            if not attached:
                active_backend().attach_oom_observer(self.observer)
                attached.append(True)

        def dump_with_moment(path: Any = None) -> Any:
            if self.moment is None:
                self.moment = self.take("dump")
            return dump(path)

        oomdoctor.install, oomdoctor.dump = install_then_observe, dump_with_moment


# --------------------------------------------------------------------------- making the GPU small


def warm_up_cuda() -> dict[str, Any]:
    """Load the kernels the scenarios use and create the cuBLAS/cuDNN handles, then give every
    byte back to the device: afterwards the allocator is empty, as in a fresh process."""
    import torch
    import torch.nn as nn

    device = "cuda"
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(8, 16), nn.GELU(), nn.LayerNorm(16), nn.Linear(16, 10),
    ).to(device)
    embedding = nn.Embedding(32, 16).to(device)
    parameters = [*model.parameters(), *embedding.parameters()]
    for optimizer in (torch.optim.AdamW(parameters, foreach=True), torch.optim.SGD(parameters, lr=0.1, momentum=0.9, foreach=True)):
        images = torch.randn(4, 3, 8, 8, device=device)
        tokens = torch.randint(32, (4, 5), device=device)
        attention = torch.softmax(embedding(tokens) @ embedding(tokens).transpose(1, 2), dim=-1).tril()
        loss = nn.functional.cross_entropy(model(images), torch.randint(10, (4,), device=device))
        loss = loss + attention.sum() + torch.cat([images.flatten(), images.flatten()]).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    del model, embedding, parameters, optimizer, images, tokens, attention, loss
    gc.collect()  # optimizers can sit in reference cycles, holding their state on the device
    torch.cuda.synchronize()
    clear_workspaces = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear_workspaces is not None:
        clear_workspaces()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.reset_accumulated_memory_stats()
    return {"reserved_bytes_after": int(torch.cuda.memory_reserved()), "workspaces_cleared": clear_workspaces is not None}


def limit_cuda(spec: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """Make the device as small as the fixture's; returns what was done and the holder process."""
    import torch

    torch.cuda.init()
    free_bytes, total_bytes = (int(v) for v in torch.cuda.mem_get_info())
    setup: dict[str, Any] = {"device_total_bytes": total_bytes, "free_bytes_at_start": free_bytes}
    if not spec["outside_bytes"]:
        capacity = spec["device_memory_bytes"]
        fraction = (capacity + 0.5) / total_bytes  # torch floors fraction * total: exactly `capacity`
        torch.cuda.set_per_process_memory_fraction(fraction)
        setup.update(limit="fraction", fraction=fraction, allowed_bytes=int(fraction * total_bytes))
        return setup, None
    setup["warm_up"] = warm_up_cuda()
    target_free = spec["device_memory_bytes"] - spec["outside_bytes"]
    holder = subprocess.Popen(
        [sys.executable, str(HERE / "holder.py"), str(target_free)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    line = holder.stdout.readline().strip()  # "held BYTES" once it holds them
    if not line.startswith("held "):
        raise RuntimeError(f"the memory holder failed: {line!r}")
    free_after, _ = (int(v) for v in torch.cuda.mem_get_info())
    setup.update(limit="held", target_free_bytes=target_free, held_bytes=int(line.split()[1]), free_bytes_after_hold=free_after)
    return setup, holder


# --------------------------------------------------------------------------- running the script


def run_script(spec: dict[str, Any], witness: Witness) -> dict[str, Any]:
    """Run the scenario as __main__ (as `python script ARGS`); how it ended."""
    script = SCENARIOS_DIR / spec["script"]
    sys.argv = [str(script), *spec["args"]]
    sys.path.insert(0, str(SCENARIOS_DIR))
    ended: dict[str, Any] = {"exit_code": 0, "exception": None}
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as exit_:
        ended["exit_code"] = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    except BaseException as error:  # noqa: BLE001 - as an uncaught exception would end the script
        ended["exit_code"] = 1
        ended["exception"] = {"type": f"{type(error).__module__}.{type(error).__qualname__}", "message": str(error)}
        sys.excepthook(type(error), error, error.__traceback__)  # capture adds it to the dump
    return ended


def run_rehearsed(spec: dict[str, Any], witness: Witness) -> dict[str, Any]:
    from oomdoctor.rehearse.session import RehearsalConfig, rehearse_script

    config = RehearsalConfig(
        device_memory_bytes=spec["device_memory_bytes"],
        alloc_conf=spec["alloc_conf"],
        outside_bytes=spec["outside_bytes"],
    )
    result = rehearse_script(SCENARIOS_DIR / spec["script"], list(spec["args"]), config, dump_dir=Path(spec["dump_dir"]))
    exception = None
    if result.oom is not None:
        exception = {"type": "torch.OutOfMemoryError", "message": str(getattr(result.oom, "message", "") or "")}
    elif result.error_text:
        exception = {"type": "error", "message": result.error_text[-2000:]}
    return {"exit_code": result.exit_code, "exception": exception}


def run(spec_path: Path) -> int:
    spec = json.loads(spec_path.read_text())
    os.environ["OOMDOCTOR_DIR"] = spec["dump_dir"]
    os.environ["OOMDOCTOR_MAX_ENTRIES"] = "100000"
    started = time.perf_counter()
    result: dict[str, Any] = {"mode": spec["mode"], "setup": {}}
    holder = None
    try:
        import oomdoctor  # noqa: F401 - before the witness wraps it

        if spec["mode"] == "cuda":
            result["setup"], holder = limit_cuda(spec)
        witness = Witness()
        witness.wrap_oomdoctor()
        ended = run_rehearsed(spec, witness) if spec["mode"] == "rehearsal" else run_script(spec, witness)
        result.update(ended)
        result["ooms_observed"] = witness.ooms
        result["moment"] = witness.moment
        exception_type = (ended["exception"] or {}).get("type", "")
        if "OutOfMemoryError" in exception_type:
            result["status"] = "oom"
        elif ended["exit_code"] == 0:
            result["status"] = "fit"
        else:
            result["status"] = "error"
    except BaseException as error:  # noqa: BLE001 - reported in result.json, never lost
        result.update(status="error", error=traceback.format_exc()[-4000:], exit_code=1)
        print(f"scenario_child: {type(error).__name__}: {error}", file=sys.stderr)
    finally:
        if holder is not None:
            holder.stdin.close()
            holder.wait(timeout=60)
    result["seconds"] = round(time.perf_counter() - started, 3)
    result["dumps"] = sorted(str(path) for path in Path(spec["dump_dir"]).glob("*.pickle"))
    (spec_path.parent / "result.json").write_text(json.dumps(result, indent=1))
    return 0


# --------------------------------------------------------------------------- probe


def probe(out_path: Path) -> int:
    """torch and GPU facts, and how many bytes cuBLAS's workspace takes from the caching allocator."""
    import platform

    import torch

    found: dict[str, Any] = {
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "python_version": platform.python_version(),
        "cuda_available": torch.cuda.is_available(),
        "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        found.update(
            gpu_name=props.name,
            capability=[props.major, props.minor],
            total_memory_bytes=int(props.total_memory),
            allocator_backend=torch.cuda.get_allocator_backend(),
        )
        # cuBLAS keeps a workspace per handle and stream from its first product; cuBLASLt (a
        # linear layer with bias) another. Both come from the caching allocator.
        a = torch.randn(256, 256, device="cuda")
        bias = torch.zeros(256, device="cuda")
        allocated = torch.cuda.memory_allocated()
        b = a @ a
        torch.cuda.synchronize()
        found["cublas_workspace_bytes"] = int(torch.cuda.memory_allocated() - allocated - b.untyped_storage().nbytes())
        allocated = torch.cuda.memory_allocated()
        c = torch.nn.functional.linear(a, a, bias)
        torch.cuda.synchronize()
        found["cublaslt_workspace_bytes"] = int(torch.cuda.memory_allocated() - allocated - c.untyped_storage().nbytes())
        found["reserved_bytes_after_products"] = int(torch.cuda.memory_reserved())
        free_bytes, total_bytes = torch.cuda.mem_get_info()
        found["context_bytes"] = int(total_bytes - free_bytes - torch.cuda.memory_reserved())
    out_path.write_text(json.dumps(found, indent=1))
    return 0


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("run", "probe"):
        print(__doc__, file=sys.stderr)
        return 2
    return run(Path(argv[1])) if argv[0] == "run" else probe(Path(argv[1]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
