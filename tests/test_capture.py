"""oomdoctor.install() on CPU, against a small fake backend (pure Python, synthetic snapshots).

The fake plays torch's part: it records `alloc` events when the test says, answers `snapshot()`
with a memory_viz-shaped dict, and on `oom()` runs the observers and raises `torch.OutOfMemoryError`
as torch's allocator does (observer first, exception after). End-to-end runs through the rehearsal
simulator live in test_capture_rehearsal.py.
"""

from __future__ import annotations

import pickle
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from time import time_ns

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import oomdoctor  # noqa: E402
from oomdoctor import capture  # noqa: E402
from oomdoctor.capture import backend as backend_module  # noqa: E402
from oomdoctor.capture import options as options_module  # noqa: E402
from oomdoctor.capture import writer  # noqa: E402
from oomdoctor.metadata import METADATA_KEY, PHASES, REGISTRY_COMPONENTS  # noqa: E402

MiB = 1 << 20
BASE_ADDRESS = 0x7F0000000000


class FakeBackend:
    name = "fake"

    def __init__(self, total_bytes: int = 1024 * MiB, reason: str | None = None) -> None:
        self.total_bytes = total_bytes
        self.reason = reason
        self.observers: list = []
        self.history: dict | None = None
        self.history_calls: list = []
        self.events: list[dict] = []
        self.blocks: list[tuple[int, int]] = []  # (address, size) of live blocks, one segment each
        self.snapshots_taken = 0

    # the Backend protocol
    def unavailable_reason(self):
        return self.reason

    def record_history(self, *, max_entries, stacks, context):
        self.history = {"max_entries": max_entries, "stacks": stacks, "context": context}
        self.history_calls.append(("start", dict(self.history)))

    def stop_history(self):
        self.history = None
        self.history_calls.append(("stop", None))

    def snapshot(self):
        self.snapshots_taken += 1
        segments = []
        for address, size in self.blocks:
            segment_bytes = -(-size // (2 * MiB)) * 2 * MiB
            blocks = [
                {"address": address, "size": size, "requested_size": size, "state": "active_allocated", "frames": []}
            ]
            if segment_bytes > size:
                blocks.append(
                    {
                        "address": address + size,
                        "size": segment_bytes - size,
                        "requested_size": 0,
                        "state": "inactive",
                        "frames": [],
                    }
                )
            segments.append(
                {
                    "device": 0,
                    "address": address,
                    "total_size": segment_bytes,
                    "allocated_size": size,
                    "active_size": size,
                    "requested_size": size,
                    "stream": 0,
                    "segment_type": "large",
                    "segment_pool_id": (0, 0),
                    "is_expandable": False,
                    "frames": [],
                    "blocks": blocks,
                }
            )
        return {
            "segments": segments,
            "device_traces": [[dict(event) for event in self.events]],
            "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "", "expandable_segments": False, "max_split_size": -1},
            "external_annotations": [],
        }

    def attach_oom_observer(self, observer):
        self.observers.append(observer)

    def current_device(self):
        return 0

    def reserved_bytes(self):
        return sum(-(-size // (2 * MiB)) * 2 * MiB for _, size in self.blocks)

    def mem_get_info(self, device):
        return self.total_bytes - self.reserved_bytes(), self.total_bytes

    def memory_stats(self, device):
        allocated = sum(size for _, size in self.blocks)
        return {
            "num_alloc_retries": 0,
            "num_ooms": sum(1 for e in self.events if e["action"] == "oom"),
            "allocated_bytes.all.current": allocated,
            "reserved_bytes.all.current": self.reserved_bytes(),
            "inactive_split_bytes.all.current": 0,
        }

    def device_properties(self, device):
        return {"name": "Fake GPU", "capability": [9, 0], "total_memory_bytes": self.total_bytes}

    def storage_address(self, tensor):
        if tensor.device.type != "cpu":
            return None
        return int(tensor.untyped_storage().data_ptr())

    def cuda_version(self):
        return "12.4"

    # what the test drives
    def alloc(self, size: int) -> int:
        address = BASE_ADDRESS + 64 * MiB * len(self.blocks)
        self.blocks.append((address, size))
        self.events.append(
            {
                "action": "segment_alloc",
                "addr": address,
                "size": -(-size // (2 * MiB)) * 2 * MiB,
                "stream": 0,
                "time_us": time_ns() // 1000,
            }
        )
        self.events.append(
            {"action": "alloc", "addr": address, "size": size, "stream": 0, "time_us": time_ns() // 1000}
        )
        return address

    def observe_oom(self, size: int) -> None:
        free = self.total_bytes - self.reserved_bytes()
        self.events.append(
            {"action": "oom", "size": size, "device_free": free, "stream": 0, "time_us": time_ns() // 1000}
        )
        for observer in list(self.observers):
            observer(0, -(-size // (2 * MiB)) * 2 * MiB, self.total_bytes, free)

    def oom(self, size: int) -> None:
        self.observe_oom(size)
        raise torch.OutOfMemoryError(
            f"CUDA out of memory. Tried to allocate {size / MiB:.2f} MiB. GPU 0 has a total capacity of 1.00 GiB"
        )


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """A fake backend made active, a clean environment, and install() undone afterwards."""
    for name in list(options_module.OPTIONS.values()):
        monkeypatch.delenv(name[0], raising=False)
    monkeypatch.delenv(options_module.DISABLE_VARIABLE, raising=False)
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)  # under torchrun, dumps go to run-{id}/
    monkeypatch.chdir(tmp_path)
    backend = FakeBackend()
    backend_module.set_backend(backend)
    yield backend
    oomdoctor.uninstall()
    backend_module.set_backend(None)


def dumps_in(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.pickle")) if directory.is_dir() else []


def load(path: Path) -> dict:
    with open(path, "rb") as file:
        return pickle.load(file)


class SmallModel(nn.Module):
    """An MLP with a BatchNorm (for a buffer); `fail` makes its forward run out of (fake) memory."""

    def __init__(self, backend: FakeBackend) -> None:
        super().__init__()
        self.backend = backend
        self.fail = False
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.BatchNorm1d(16), nn.Linear(16, 2))

    def forward(self, batch):
        hidden = self.net(batch)
        if self.fail:
            self.backend.oom(64 * MiB)
        return hidden


def small_training(steps: int, oom_at: tuple[int, str] | None, backend: FakeBackend):
    """A tiny model + Adam loop; `oom_at=(step, phase)` makes the fake device fail in that phase."""
    torch.manual_seed(0)
    model = SmallModel(backend)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    batch = torch.randn(4, 8)
    for step in range(steps):
        optimizer.zero_grad()
        model.fail = oom_at == (step, "forward")
        loss = model(batch).square().mean()
        if oom_at == (step, "backward"):
            loss.register_hook(lambda grad: backend.oom(64 * MiB))
        loss.backward()
        optimizer.step()
    return model, optimizer


# -- options ------------------------------------------------------------------------------------


def test_options_defaults_environment_and_arguments(tmp_path):
    warnings: list[str] = []
    defaults = options_module.resolve_options({}, environ={}, warn=warnings.append)
    assert defaults.max_entries == 100_000 and defaults.stacks == "python" and defaults.context == "all"
    assert defaults.max_dumps == 5 and defaults.dump_dir.name == "oom-dumps" and defaults.dump_dir.is_absolute()

    environ = {
        "OOMDOCTOR_DIR": str(tmp_path / "d"),
        "OOMDOCTOR_MAX_ENTRIES": "500",
        "OOMDOCTOR_STACKS": "all",
        "OOMDOCTOR_MAX_DUMPS": "zero",
    }
    merged = options_module.resolve_options({"max_entries": 7, "colour": "red"}, environ=environ, warn=warnings.append)
    assert merged.dump_dir == tmp_path / "d" and merged.stacks == "all"
    assert merged.max_entries == 7  # the argument beats the environment
    assert merged.max_dumps == 5  # a bad value is reported and the default kept
    assert any("OOMDOCTOR_MAX_DUMPS" in warning for warning in warnings)
    assert any("colour" in warning for warning in warnings)


def test_dump_file_names_sort_by_rank_and_are_distinct(tmp_path):
    name = writer.dump_file_name("oom", 3, "node-7.cluster", 4242)
    assert name.startswith("oom-rank3-node-7.cluster-4242-") and name.endswith("Z.pickle")
    first = writer.unique_path(tmp_path, name)
    first.write_bytes(b"x")
    assert writer.unique_path(tmp_path, name) != first


# -- installing ---------------------------------------------------------------------------------


def test_install_is_idempotent_and_uninstall_restores_everything(fake):
    from torch.optim import optimizer as optimizer_module

    before = {
        "call": nn.Module.__call__,
        "backward": torch.autograd.backward,
        "opt_zero_grad": torch.optim.Optimizer.zero_grad,
        "opt_init": torch.optim.Optimizer.__init__,
        "mod_zero_grad": nn.Module.zero_grad,
        "excepthook": sys.excepthook,
        "thread_hook": threading.excepthook,
        "pre_hooks": len(optimizer_module._global_optimizer_pre_hooks),
        "post_hooks": len(optimizer_module._global_optimizer_post_hooks),
    }
    oomdoctor.install()
    oomdoctor.install()
    oomdoctor.install(max_entries=100_000)  # the same options: nothing to say
    assert capture.is_installed()
    assert len(fake.observers) == 1 and fake.history_calls == [
        ("start", {"max_entries": 100_000, "stacks": "python", "context": "all"})
    ]
    assert nn.Module.__call__ is not before["call"] and sys.excepthook is not before["excepthook"]
    assert "__init__" in torch.OutOfMemoryError.__dict__
    assert len(optimizer_module._global_optimizer_pre_hooks) == before["pre_hooks"] + 1

    oomdoctor.uninstall()
    assert not capture.is_installed()
    assert fake.history is None and fake.history_calls[-1] == ("stop", None)
    assert nn.Module.__call__ is before["call"]
    assert torch.autograd.backward is before["backward"]
    assert torch.optim.Optimizer.zero_grad is before["opt_zero_grad"]
    assert torch.optim.Optimizer.__init__ is before["opt_init"]
    assert nn.Module.zero_grad is before["mod_zero_grad"]
    assert sys.excepthook is before["excepthook"] and threading.excepthook is before["thread_hook"]
    assert "__init__" not in torch.OutOfMemoryError.__dict__
    assert len(optimizer_module._global_optimizer_pre_hooks) == before["pre_hooks"]
    assert len(optimizer_module._global_optimizer_post_hooks) == before["post_hooks"]

    oomdoctor.install()  # again: the observer torch keeps forever is not attached twice
    assert len(fake.observers) == 1 and capture.is_installed()


def test_a_second_install_with_other_options_says_they_are_ignored(fake, capsys):
    oomdoctor.install()
    oomdoctor.install(max_dumps=1)
    assert "already installed; the options of this install() call are ignored" in capsys.readouterr().err
    assert capture._session.options.max_dumps == 5


def test_without_cuda_install_says_why_once_and_does_nothing(fake, capsys, monkeypatch):
    fake.reason = "torch reports no CUDA device"
    monkeypatch.setattr(capture, "_unavailable_reported", False)
    call = nn.Module.__call__
    oomdoctor.install()
    oomdoctor.install()
    err = capsys.readouterr().err
    assert err.count("not recording CUDA memory: torch reports no CUDA device") == 1
    assert not capture.is_installed() and fake.observers == [] and fake.history is None
    assert nn.Module.__call__ is call


def test_disabled_by_environment(fake, monkeypatch):
    monkeypatch.setenv("OOMDOCTOR_DISABLE", "1")
    oomdoctor.install()
    assert not capture.is_installed() and fake.history is None


def test_history_already_on_is_kept(fake):
    fake.history_enabled = lambda: True
    oomdoctor.install()
    oomdoctor.uninstall()
    assert fake.history_calls == []


# -- markers and registry -----------------------------------------------------------------------


@pytest.mark.slow
def test_markers_bracket_phases_with_step_numbers(fake):
    oomdoctor.install()
    small_training(2, None, fake)
    markers = capture.current_markers()
    assert all(set(marker) == {"phase", "edge", "step", "time_us"} for marker in markers)
    assert {marker["phase"] for marker in markers} <= set(PHASES)
    sequence = [(marker["phase"], marker["edge"], marker["step"]) for marker in markers]
    one_step = ["zero_grad", "forward", "backward", "optimizer_step"]
    expected = [(phase, edge, step) for step in range(2) for phase in one_step for edge in ("start", "end")]
    assert sequence == expected  # only the outermost module call makes a forward marker
    times = [marker["time_us"] for marker in markers]
    assert times == sorted(times) and abs(times[-1] - time_ns() // 1000) < 60_000_000


def test_a_model_called_with_gradients_off_is_marked_an_evaluation(fake):
    oomdoctor.install()
    model, _ = small_training(1, None, fake)
    model.eval()
    with torch.no_grad():
        model(torch.randn(4, 8))
    with torch.inference_mode():
        model(torch.randn(4, 8))
    model(torch.randn(4, 8))  # eval mode with gradients on: a forward (it could still train)
    sequence = [(marker["phase"], marker["edge"], marker["step"]) for marker in capture.current_markers()]
    assert sequence[-6:] == [
        ("evaluation", "start", 1),
        ("evaluation", "end", 1),
        ("evaluation", "start", 1),
        ("evaluation", "end", 1),
        ("forward", "start", 1),
        ("forward", "end", 1),
    ]


def test_oom_in_forward_leaves_one_dump_with_registry_and_markers(fake, capsys):
    oomdoctor.install()
    with pytest.raises(torch.OutOfMemoryError):
        small_training(3, (2, "forward"), fake)
    files = dumps_in(Path("oom-dumps"))
    assert len(files) == 1
    assert files[0].name.startswith("oom-rank0-")
    err = capsys.readouterr().err
    assert f"wrote {Path('oom-dumps') / files[0].name}" in err and "oomdoctor report" in err and "oomdoctor open" in err

    data = load(files[0])
    assert set(data) == {"segments", "device_traces", "allocator_settings", "external_annotations", METADATA_KEY}
    meta = data[METADATA_KEY]
    assert meta["reason"] == "oom" and meta["oom"]["alloc_bytes"] == 64 * MiB
    assert meta["device"]["name"] == "Fake GPU" and meta["mem_get_info"]["total_bytes"] == 1024 * MiB
    assert meta["versions"]["torch"] == torch.__version__ and meta["pid"] > 0
    assert meta["recording"]["stacks"] == "python"
    # the OOM is in step 2's forward: the last marker before it is that forward's start
    last = meta["markers"][-1]
    assert (last["phase"], last["edge"], last["step"]) == ("forward", "start", 2)
    assert last["time_us"] <= meta["oom"]["time_us"]
    # zero_grad(set_to_none=True) began step 2, so no gradient is alive in its forward
    components = {entry["component"] for entry in meta["tensors"]}
    assert components == set(REGISTRY_COMPONENTS) - {"gradient"}
    names = {(entry["component"], entry["name"]) for entry in meta["tensors"]}
    assert ("parameter", "net.0.weight") in names
    assert ("optimizer_state", "net.3.bias.exp_avg_sq") in names and ("buffer", "net.2.running_mean") in names
    weight = next(e for e in meta["tensors"] if e["name"] == "net.0.weight")
    assert weight["shape"] == [16, 8] and weight["dtype"] == "float32" and weight["size_bytes"] == 16 * 8 * 4


def test_a_frozen_parameter_is_registered_as_not_requiring_grad(fake):
    """A LoRA-style run: the first layer frozen, the optimizer on the rest, out of memory in the
    first forward, before anything else in the dump shows which parameters train."""
    oomdoctor.install()
    torch.manual_seed(0)
    model = SmallModel(fake)
    model.net[0].requires_grad_(False)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    model.fail = True
    with pytest.raises(torch.OutOfMemoryError):
        model(torch.randn(4, 8))
    (file,) = dumps_in(Path("oom-dumps"))
    meta = load(file)[METADATA_KEY]
    flags = {e["name"]: e.get("requires_grad") for e in meta["tensors"] if e["component"] == "parameter"}
    assert flags == {
        "net.0.weight": False,
        "net.0.bias": False,
        "net.2.weight": True,
        "net.2.bias": True,
        "net.3.weight": True,
        "net.3.bias": True,
    }
    del optimizer


def test_an_optimizer_is_counted_from_its_making_before_any_step(fake):
    """The first forward runs out before any zero_grad or step: the dump still says the process had
    made an optimizer (it trains), counted once however it is later used; one that is gone is not."""
    oomdoctor.install()
    torch.manual_seed(0)
    model = SmallModel(fake)
    dropped = torch.optim.SGD(model.parameters(), lr=0.1)
    del dropped
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model.fail = True
    with pytest.raises(torch.OutOfMemoryError):
        model(torch.randn(4, 8))
    (file,) = dumps_in(Path("oom-dumps"))
    meta = load(file)[METADATA_KEY]
    assert meta["optimizers"] == 1
    # and which optimizer it is, with what decides the state its first step will make
    assert meta["optimizer_kinds"] == [
        {"class": "torch.optim.adamw.AdamW", "moments": 2, "options": {"amsgrad": False}}
    ]
    assert not any(m["phase"] in ("optimizer_step", "zero_grad") for m in meta["markers"])
    optimizer.zero_grad()
    assert capture.current_markers()  # still recording after the dump


def test_memory_viz_reads_the_dump_unchanged(fake):
    from torch.cuda import _memory_viz

    oomdoctor.install()
    fake.alloc(3 * MiB)
    fake.alloc(40 * MiB)
    with pytest.raises(torch.OutOfMemoryError):
        fake.oom(900 * MiB)
    (path,) = dumps_in(Path("oom-dumps"))
    raw = path.read_bytes()
    assert raw[:2] == b"\x80\x04"  # pickle protocol 4, the highest memory_viz reads
    data = pickle.loads(raw)
    assert "raise OutOfMemoryError" in _memory_viz.trace(data)
    assert "Summary of segments" in _memory_viz.segsum(data)


@pytest.mark.slow
def test_uncaught_oom_adds_exception_through_chained_excepthook(fake, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import sys
            sys.path.insert(0, {str(Path(__file__).parent)!r})
            import torch, oomdoctor
            from oomdoctor.capture import backend
            from test_capture import FakeBackend
            seen = []
            def earlier_hook(kind, value, trace):
                seen.append(kind.__name__)
                print("earlier hook ran:", kind.__name__, file=sys.stderr)
            sys.excepthook = earlier_hook
            fake = FakeBackend()
            backend.set_backend(fake)
            oomdoctor.install()
            model = torch.nn.Linear(4, 4)
            def train():
                model(torch.randn(2, 4))
                fake.oom(300 * 2**20)
            train()
            """
        )
    )
    result = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert "earlier hook ran: OutOfMemoryError" in result.stderr  # the script's own hook still runs
    (path,) = dumps_in(tmp_path / "oom-dumps")
    lines = [line for line in result.stderr.splitlines() if f"oom-dumps/{path.name}" in line]
    assert len(lines) == 2  # when written, and again after the traceback
    assert lines[1].startswith("oomdoctor: the dump of this OOM is")
    assert result.stderr.index("earlier hook ran") < result.stderr.index(lines[1])
    meta = load(path)[METADATA_KEY]
    exception = meta["exception"]
    assert exception["type"] == "torch.OutOfMemoryError" and "Tried to allocate 300.00 MiB" in exception["message"]
    assert "in train" in exception["traceback"] and "fake.oom(300" in exception["traceback"]
    assert meta["oom"]["surfaced"] is True and meta["ooms_observed"][-1]["surfaced"] is True


def test_oom_on_worker_thread(fake):
    oomdoctor.install()
    errors: list[BaseException] = []

    def work():
        nn.Linear(2, 2)(torch.randn(1, 2))
        fake.oom(128 * MiB)

    hook_calls: list = []
    previous = threading.excepthook
    threading.excepthook = lambda args: hook_calls.append(args.exc_type)
    try:
        oomdoctor.uninstall()
        oomdoctor.install()  # chains the test's hook
        worker = threading.Thread(target=work)
        worker.start()
        worker.join()
    finally:
        oomdoctor.uninstall()
        threading.excepthook = previous
    assert hook_calls == [torch.OutOfMemoryError] and not errors
    (path,) = dumps_in(Path("oom-dumps"))
    meta = load(path)[METADATA_KEY]
    assert meta["exception"]["type"] == "torch.OutOfMemoryError"
    assert "in work" in meta["exception"]["traceback"]


def test_caught_oom_retried_with_smaller_batch_gets_two_dumps(fake):
    oomdoctor.install()
    model = nn.Linear(8, 8)
    batch_size = 64
    attempts = 0
    while True:
        try:
            attempts += 1
            model(torch.randn(batch_size, 8))
            if batch_size > 16:
                fake.oom(batch_size * MiB)
            break
        except torch.OutOfMemoryError:
            batch_size //= 2
    assert attempts == 3
    files = dumps_in(Path("oom-dumps"))
    assert len(files) == 2
    metas = [load(path)[METADATA_KEY] for path in files]
    metas.sort(key=lambda meta: meta["oom"]["time_us"])
    assert [meta["oom"]["alloc_bytes"] for meta in metas] == [64 * MiB, 32 * MiB]
    for meta in metas:  # both were caught: type and message recorded when the loop went on
        assert meta["exception"]["type"] == "torch.OutOfMemoryError" and meta["exception"]["traceback"] is None
        assert meta["oom"]["surfaced"] is True
    assert len(metas[1]["ooms_observed"]) == 2


def test_internally_retried_oom_never_surfaces_and_makes_no_extra_dump(fake, capsys):
    oomdoctor.install()
    model = nn.Linear(8, 8)
    model(torch.randn(2, 8))
    fake.observe_oom(500 * MiB)  # cuDNN's workspace search: caught inside torch, no exception
    fake.observe_oom(250 * MiB)
    model(torch.randn(2, 8))
    with pytest.raises(torch.OutOfMemoryError):
        fake.oom(700 * MiB)
    files = dumps_in(Path("oom-dumps"))
    assert len(files) == 1
    meta = load(files[0])[METADATA_KEY]
    assert meta["oom"]["alloc_bytes"] == 700 * MiB
    assert [entry["surfaced"] for entry in meta["ooms_observed"]] == [False, False, None]
    assert capsys.readouterr().err.count("wrote ") == 1


def test_ooms_at_one_site_keep_the_first_and_the_latest(fake, capsys):
    oomdoctor.install(max_dumps=1)
    for size in (10, 20, 30, 40):
        with pytest.raises(torch.OutOfMemoryError):
            fake.oom(size * MiB)
    metas = sorted(
        (load(path)[METADATA_KEY] for path in dumps_in(Path("oom-dumps"))), key=lambda m: m["oom"]["time_us"]
    )
    assert [meta["oom"]["alloc_bytes"] for meta in metas] == [10 * MiB, 40 * MiB]
    assert [meta["oom"]["occurrence"] for meta in metas] == [1, 4]
    assert "test_capture.py:" in metas[0]["oom"]["site"]  # the fake device, here the innermost frame of the script
    assert metas[0]["exception"]["caught"] is True  # the next OOM showed the loop went on
    assert "rewrote " in capsys.readouterr().err


def test_dump_cap_counts_sites_and_the_last_oom_always_gets_a_dump(fake, capsys):
    oomdoctor.install(max_dumps=2)
    places = [  # one line each: a site is the script's stack, line by line
        lambda: fake.oom(10 * MiB),
        lambda: fake.oom(20 * MiB),
        lambda: fake.oom(30 * MiB),
    ]
    for place in places:
        with pytest.raises(torch.OutOfMemoryError):
            place()
    with pytest.raises(torch.OutOfMemoryError):
        fake.oom(40 * MiB)  # a fourth place: it replaces the third's file, shared past the cap
    files = dumps_in(Path("oom-dumps"))
    assert sorted(load(path)[METADATA_KEY]["oom"]["alloc_bytes"] for path in files) == [10 * MiB, 20 * MiB, 40 * MiB]
    assert "OOMs at 2 places have dumps" in capsys.readouterr().err


def test_unwritable_dump_directory_falls_back_to_temp(fake, tmp_path, monkeypatch, capsys):
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the directory should be")
    fallback = tmp_path / "fallback"
    monkeypatch.setattr(writer, "fallback_directory", lambda: fallback)
    oomdoctor.install(dir=str(blocked / "dumps"))
    with pytest.raises(torch.OutOfMemoryError):
        fake.oom(10 * MiB)
    err = capsys.readouterr().err
    assert "cannot write to" in err and str(fallback) in err
    (path,) = dumps_in(fallback)
    assert load(path)[METADATA_KEY]["reason"] == "oom"


def test_failures_inside_capture_are_reported_and_swallowed(fake, capsys):
    def broken_snapshot():
        raise RuntimeError("driver went away")

    fake.snapshot = broken_snapshot
    oomdoctor.install()
    with pytest.raises(torch.OutOfMemoryError):  # torch's error, not ours
        fake.oom(10 * MiB)
    assert "capture failed and was skipped (RuntimeError: driver went away)" in capsys.readouterr().err
    assert dumps_in(Path("oom-dumps")) == []


def test_manual_dump_and_rank_in_name(fake, monkeypatch):
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("WORLD_SIZE", "8")
    oomdoctor.install()
    model, optimizer = small_training(1, None, fake)
    path = oomdoctor.dump()
    assert path is not None and path.name.startswith("manual-rank5-")
    meta = load(path)[METADATA_KEY]
    assert meta["reason"] == "manual" and meta["oom"] is None and meta["rank"] == 5 and meta["world_size"] == 8
    names = {(entry["component"], entry["name"]) for entry in meta["tensors"]}
    assert ("gradient", "net.0.weight.grad") in names and ("optimizer_state", "net.0.weight.exp_avg") in names
    # the batch went out of scope with small_training(): no input is alive to name
    assert {entry["component"] for entry in meta["tensors"]} == set(REGISTRY_COMPONENTS) - {"input"}
    explicit = oomdoctor.dump(Path("peak.pickle"))
    assert explicit == Path("peak.pickle") and load(explicit)[METADATA_KEY]["reason"] == "manual"


def test_registry_holds_models_weakly(fake):
    import gc
    import weakref

    oomdoctor.install()
    model = nn.Linear(4, 4)
    model(torch.randn(1, 4))
    alive = weakref.ref(model)
    del model
    gc.collect()
    assert alive() is None


class Tagger(nn.Module):
    """A model whose forward takes tokens, a list of extra tensors and a keyword mask."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(32, 4)
        self.head = nn.Linear(4, 2)

    def forward(self, tokens, extras, attention_mask=None, options=None):
        hidden = self.embed(tokens) * attention_mask.unsqueeze(-1)
        return self.head(hidden)


def test_registry_names_the_tensors_given_to_the_outermost_forward_as_inputs(fake):
    oomdoctor.install()
    model = Tagger()
    loss_function = nn.MSELoss()
    tokens = torch.randint(32, (4, 6))
    mask = torch.ones(4, 6)
    targets = torch.randn(4, 6, 2)
    old_batch = torch.randint(32, (4, 6))
    model(old_batch, [], attention_mask=mask)  # an earlier call: only the latest call counts
    extras = [torch.zeros(3), "not a tensor", torch.ones(2)]
    options = {"scale": torch.full((5,), 2.0), "weight": model.head.weight}
    output = model(tokens, extras, attention_mask=mask, options=options)
    loss = loss_function(output, targets)  # a parameterless root module: its targets are inputs too
    loss.backward()
    path = oomdoctor.dump()
    meta = load(path)[METADATA_KEY]
    inputs = {entry["name"]: entry for entry in meta["tensors"] if entry["component"] == "input"}
    assert set(inputs) == {
        "Tagger.forward arg 0",
        "Tagger.forward arg 1[0]",
        "Tagger.forward arg 1[2]",
        "Tagger.forward kwarg attention_mask",
        "Tagger.forward kwarg options[scale]",
        "MSELoss.forward arg 1",
    }  # not the old batch, not the parameter, not the model's output (an autograd result)
    assert inputs["Tagger.forward arg 0"]["address"] == tokens.untyped_storage().data_ptr()
    assert inputs["Tagger.forward arg 0"]["shape"] == [4, 6] and inputs["Tagger.forward arg 0"]["dtype"] == "int64"
    assert inputs["MSELoss.forward arg 1"]["size_bytes"] == 4 * 6 * 2 * 4
    # inputs come last, after every parameter, gradient, optimizer state tensor and buffer
    components = [entry["component"] for entry in meta["tensors"]]
    assert components[-len(inputs) :] == ["input"] * len(inputs)
    # only what is still alive is named
    del tokens, extras
    meta = load(oomdoctor.dump())[METADATA_KEY]
    names = {entry["name"] for entry in meta["tensors"] if entry["component"] == "input"}
    assert names == {
        "Tagger.forward kwarg attention_mask",
        "Tagger.forward kwarg options[scale]",
        "MSELoss.forward arg 1",
    }


def test_inputs_are_remembered_for_a_few_dozen_tensors_per_call(fake):
    from oomdoctor.capture.markers import MAX_INPUT_TENSORS

    class Counter(nn.Module):
        def forward(self, *args):
            return len(args)

    oomdoctor.install()
    many = [torch.zeros(1) for _ in range(3 * MAX_INPUT_TENSORS)]
    counter = Counter()  # inputs are remembered for as long as their module lives
    counter(many, *many)
    meta = load(oomdoctor.dump())[METADATA_KEY]
    inputs = [entry for entry in meta["tensors"] if entry["component"] == "input"]
    assert len(inputs) == MAX_INPUT_TENSORS
    assert (
        inputs[0]["name"] == "Counter.forward arg 0[0]"
        and inputs[-1]["name"] == f"Counter.forward arg 0[{MAX_INPUT_TENSORS - 1}]"
    )


def test_oom_in_backward_is_placed_in_backward(fake):
    oomdoctor.install()
    with pytest.raises(torch.OutOfMemoryError):
        small_training(2, (1, "backward"), fake)
    oomdoctor.uninstall()  # the exception was caught (by the test): uninstall, like exit, records it
    (path,) = dumps_in(Path("oom-dumps"))
    meta = load(path)[METADATA_KEY]
    starts = [m for m in meta["markers"] if m["edge"] == "start" and m["time_us"] <= meta["oom"]["time_us"]]
    assert (starts[-1]["phase"], starts[-1]["step"]) == ("backward", 1)
    assert meta["oom"]["surfaced"] is True and meta["exception"]["type"] == "torch.OutOfMemoryError"
    # markers are as they were at the OOM: that backward's start is the last one
    assert (meta["markers"][-1]["phase"], meta["markers"][-1]["edge"]) == ("backward", "start")


def test_compiled_models_keep_working(fake):
    from torch._dynamo.utils import counters

    oomdoctor.install()
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    compiled = torch.compile(model, backend="eager")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    counters.clear()
    for _ in range(3):
        optimizer.zero_grad()
        compiled(torch.randn(4, 8)).sum().backward()
        optimizer.step()
    assert dict(counters["graph_break"]) == {} and counters["stats"]["unique_graphs"] == 1
    phases = [(m["phase"], m["edge"], m["step"]) for m in capture.current_markers()]
    assert ("forward", "start", 2) in phases and ("optimizer_step", "end", 2) in phases


@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        ("PYTORCH_NO_CUDA_MEMORY_CACHING", "1", "PYTORCH_NO_CUDA_MEMORY_CACHING is set"),
        ("PYTORCH_CUDA_ALLOC_CONF", "backend:cudaMallocAsync", "cudaMallocAsync"),
    ],
)
def test_cuda_setups_that_cannot_record_are_said_once(monkeypatch, capsys, variable, value, expected):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_allocator_backend", lambda: "native", raising=False)
    monkeypatch.setenv(variable, value)
    monkeypatch.setattr(capture, "_unavailable_reported", False)
    backend_module.set_backend(backend_module.CudaBackend())
    try:
        call = nn.Module.__call__
        oomdoctor.install()
        oomdoctor.install()
        assert not capture.is_installed() and nn.Module.__call__ is call
        err = capsys.readouterr().err
        assert err.count("oomdoctor: not recording CUDA memory") == 1 and expected in err
    finally:
        backend_module.set_backend(None)


def test_rewrapped_oom_makes_no_second_dump(fake):
    oomdoctor.install()
    try:
        try:
            fake.oom(10 * MiB)
        except torch.OutOfMemoryError as error:
            raise torch.OutOfMemoryError(f"Caught OutOfMemoryError in replica 0 on device 0.\n{error}")  # noqa: B904 - the chain DataParallel makes
    except torch.OutOfMemoryError:
        pass
    # as torch's ExceptionWrapper.reraise() does, outside any except block
    wrapped = torch.OutOfMemoryError("Caught OutOfMemoryError in DataLoader worker process 0.")
    assert len(dumps_in(Path("oom-dumps"))) == 1 and wrapped.args


def test_oom_raised_without_an_observer_call_still_dumps(fake):
    """torch 2.12+ rejects some requests (a memory fraction with throw_on_cudamalloc_oom) before the
    allocator's OOM path, so no observer runs; the exception itself is the moment of the OOM."""
    oomdoctor.install()
    with pytest.raises(torch.OutOfMemoryError):
        raise torch.OutOfMemoryError(
            "CUDA out of memory. Allocation was preemptively rejected because it would exceed "
            "per_process_memory_fraction limit."
        )
    oomdoctor.uninstall()
    (path,) = dumps_in(Path("oom-dumps"))
    meta = load(path)[METADATA_KEY]
    assert meta["reason"] == "oom" and meta["oom"] is None
    assert "preemptively rejected" in meta["exception"]["message"]


def test_snapshot_of_an_internally_retried_oom_is_not_held_once_training_goes_on(fake):
    oomdoctor.install()
    model = nn.Linear(4, 4)
    fake.observe_oom(100 * MiB)
    record = capture._session.records[-1]
    assert record.payload is not None
    model(torch.randn(1, 4))  # the next phase starts: that OOM never surfaced
    assert record.payload is None and record.observed["surfaced"] is False
    with pytest.raises(torch.OutOfMemoryError):
        fake.oom(200 * MiB)
    (path,) = dumps_in(Path("oom-dumps"))  # the retried OOM's file was reused
    assert [entry["surfaced"] for entry in load(path)[METADATA_KEY]["ooms_observed"]] == [False, None]


def test_a_later_oom_exception_is_not_linked_to_an_old_internal_retry(fake):
    oomdoctor.install()
    model = nn.Linear(4, 4)
    fake.observe_oom(100 * MiB)  # retried inside torch
    model(torch.randn(1, 4))
    stale = capture._session.records[-1]
    try:
        raise torch.OutOfMemoryError("Caught OutOfMemoryError in replica 1 on device 0.")
    except torch.OutOfMemoryError:
        pass
    assert stale.exception is None and stale.observed["surfaced"] is False
    assert len(dumps_in(Path("oom-dumps"))) == 1


def test_an_unhashable_optimizer_does_not_break_training(fake):
    class ComparableSGD(torch.optim.SGD):
        def __eq__(self, other):
            return isinstance(other, ComparableSGD)

        __hash__ = None  # type: ignore[assignment]

    oomdoctor.install()
    model = nn.Linear(4, 4)
    optimizer = ComparableSGD(model.parameters(), lr=0.1)
    for _ in range(2):
        optimizer.zero_grad()
        model(torch.randn(2, 4)).sum().backward()
        optimizer.step()
    steps = [m["step"] for m in capture.current_markers() if m["phase"] == "optimizer_step"]
    assert steps == [0, 0, 1, 1]


def test_recording_waits_until_cuda_is_initialized(fake):
    """install() runs before the script picks its device: starting history or attaching the
    observer then would initialize CUDA on the default device (and break forked children)."""
    queued = []
    fake.when_ready = queued.append
    oomdoctor.install()
    assert capture.is_installed() and fake.history is None and fake.observers == []
    queued.pop()()  # torch initializes CUDA
    assert fake.history is not None and len(fake.observers) == 1
    oomdoctor.uninstall()
    assert fake.history is None

    oomdoctor.install()
    oomdoctor.uninstall()  # before CUDA ever started: the queued start does nothing
    queued.pop()()
    assert fake.history is None


def test_cuda_backend_defers_to_torch_lazy_init(monkeypatch):
    calls, queued = [], []
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "_lazy_call", queued.append)
    backend_module.CudaBackend().when_ready(lambda: calls.append("started"))
    assert calls == [] and len(queued) == 1
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    backend_module.CudaBackend().when_ready(lambda: calls.append("started"))
    assert calls == ["started"]


def test_the_module_call_wrapper_frame_is_not_taken_for_user_code():
    """On a GPU torch records the wrapper's frame in allocation stacks (one per module nesting
    level); the analysis must still name the user's line."""
    from oomdoctor.analysis.attribution import source_line
    from oomdoctor.capture import markers
    from oomdoctor.model import Frame

    stack = (
        Frame(filename="/env/lib/python3.11/site-packages/torch/nn/modules/linear.py", line=125, name="forward"),
        Frame(filename=markers.__file__, line=130, name="module_call"),
        Frame(filename="/home/me/project/model.py", line=40, name="forward"),
    )
    assert source_line(stack) == "/home/me/project/model.py:40 in forward"


def test_the_torchelastic_error_file_names_the_dump(fake, tmp_path, monkeypatch, capsys):
    import json

    from torch.distributed.elastic.multiprocessing.errors.error_handler import ErrorHandler

    error_file = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(error_file))
    oomdoctor.install()
    try:
        fake.oom(300 * MiB)
    except torch.OutOfMemoryError as error:  # what @record does before it re-raises
        ErrorHandler().record_exception(error)
        caught = error
    sys.excepthook(type(caught), caught, caught.__traceback__)  # the re-raised exception, uncaught
    (path,) = dumps_in(Path("oom-dumps"))
    extra = json.loads(error_file.read_text())["message"]["extraInfo"]
    assert Path(extra["oomdoctor_dump"]).resolve() == path.resolve()
    assert extra["py_callstack"].rstrip().endswith(f"oomdoctor report {extra['oomdoctor_dump']}")
    assert "OutOfMemoryError" in extra["py_callstack"]  # torchelastic's own text is kept
    capsys.readouterr()
