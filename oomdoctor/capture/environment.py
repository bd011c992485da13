"""Facts about the process and the device that go into a dump's `oomdoctor` key.

Everything is read through the backend seam or the environment; each fact is gathered on its own, so
one that fails (a driver call, an odd environment) leaves a None and never costs the dump.
"""

from __future__ import annotations

import os
import platform
import re
import socket
import sys
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import oomdoctor

T = TypeVar("T")

# first variable found wins; torchrun/torch.distributed, then MPI, SLURM and PMI launchers
RANK_VARIABLES = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", "MV2_COMM_WORLD_RANK")
LOCAL_RANK_VARIABLES = ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID")
WORLD_SIZE_VARIABLES = ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS", "MV2_COMM_WORLD_SIZE")

ALLOC_CONF_VARIABLES = (
    "PYTORCH_CUDA_ALLOC_CONF",
    "PYTORCH_ALLOC_CONF",
    "PYTORCH_HIP_ALLOC_CONF",
    "PYTORCH_NO_CUDA_MEMORY_CACHING",
    "PYTORCH_CUDA_MEMORY_FRACTION",
    "CUDA_VISIBLE_DEVICES",
    "CUDA_LAUNCH_BLOCKING",
    "CUDA_MODULE_LOADING",
    "CUBLAS_WORKSPACE_CONFIG",
    "CUDNN_CONV_WSCAP_DBG",
    "TORCH_CUDNN_V8_API_LRU_CACHE_LIMIT",
    "NCCL_BUFFSIZE",
)

# The environment block, as vLLM's collect_env lists it: the set variables whose names start so (or
# are one of ENVIRONMENT_NAMES), except those whose names look secret.
ENVIRONMENT_PREFIXES = (
    "PYTORCH_",
    "TORCH",  # TORCH_*, TORCHINDUCTOR_*, TORCHELASTIC_*, TORCHDYNAMO_*
    "CUDA",
    "CUBLAS",
    "CUBLASLT",
    "CUDNN",
    "NCCL_",
    "NVIDIA_",
    "NVTE_",
    "OMP_",
    "MKL_",
    "HIP_",
    "ROCM_",
    "HSA_",
    "ACCELERATE_",
    "PL_",
    "OOMDOCTOR_",
)
ENVIRONMENT_NAMES = frozenset(
    {"RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "LOCAL_WORLD_SIZE", "GROUP_WORLD_SIZE"}
)
# a variable whose name holds one of these is never written, whatever its prefix
SECRET_NAME_PARTS = (
    "TOKEN",
    "KEY",
    "SECRET",
    "PASSWORD",
    "PASSWD",
    "CREDENTIAL",
    "PRIVATE",
    "AUTH",
    "COOKIE",
    "SESSION",
)
MAX_ENVIRONMENT_VARIABLES = 256
MAX_ENVIRONMENT_VALUE = 1024
_URL_USERINFO = re.compile(r"(?<=://)[^/@\s]*@")

# The frameworks whose versions a dump records when the process has imported them (never imports one).
FRAMEWORK_MODULES = (
    "lightning",
    "pytorch_lightning",
    "transformers",
    "accelerate",
    "peft",
    "trl",
    "deepspeed",
    "vllm",
    "sglang",
    "torchtitan",
    "transformer_engine",
    "apex",
    "bitsandbytes",
    "xformers",
    "flash_attn",
    "triton",
)

# torchrun's (torchelastic's) variables of a worker: metadata `elastic` name -> (variable, is a number)
ELASTIC_VARIABLES = {
    "run_id": ("TORCHELASTIC_RUN_ID", False),
    "restart_count": ("TORCHELASTIC_RESTART_COUNT", True),
    "max_restarts": ("TORCHELASTIC_MAX_RESTARTS", True),
    "group_rank": ("GROUP_RANK", True),
    "group_world_size": ("GROUP_WORLD_SIZE", True),
    "role_name": ("ROLE_NAME", False),
    "role_rank": ("ROLE_RANK", True),
    "role_world_size": ("ROLE_WORLD_SIZE", True),
    "local_world_size": ("LOCAL_WORLD_SIZE", True),
}

# metadata name -> memory_stats() key (all bytes are current values unless named peak)
MEMORY_STAT_KEYS = {
    "num_alloc_retries": "num_alloc_retries",
    "num_ooms": "num_ooms",
    "inactive_split_bytes": "inactive_split_bytes.all.current",
    "allocated_bytes": "allocated_bytes.all.current",
    "reserved_bytes": "reserved_bytes.all.current",
    "active_bytes": "active_bytes.all.current",
    "peak_allocated_bytes": "allocated_bytes.all.peak",
    "peak_reserved_bytes": "reserved_bytes.all.peak",
    "num_device_alloc": "num_device_alloc",
    "num_device_free": "num_device_free",
}


def attempt(gather: Callable[[], T], default: T | None = None) -> T | None:
    try:
        return gather()
    except Exception:
        return default


def rank_from_environment(names: tuple[str, ...], environ: Mapping[str, str] | None = None) -> int | None:
    environ = os.environ if environ is None else environ
    for name in names:
        value = environ.get(name, "").strip()
        if value:
            try:
                return int(value)
            except ValueError:
                continue
    return None


def looks_secret(name: str) -> bool:
    upper = name.upper()
    return any(part in upper for part in SECRET_NAME_PARTS)


def environment_variables(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The `environment` entry: the set variables that bear on memory, secret-looking names left out,
    a URL's user:password@ cut from a value, values cut at MAX_ENVIRONMENT_VALUE, at most
    MAX_ENVIRONMENT_VARIABLES of them, sorted by name."""
    environ = os.environ if environ is None else environ
    found: dict[str, str] = {}
    for name in sorted(environ):
        if len(found) >= MAX_ENVIRONMENT_VARIABLES:
            break
        if not (name.startswith(ENVIRONMENT_PREFIXES) or name in ENVIRONMENT_NAMES) or looks_secret(name):
            continue
        value = _URL_USERINFO.sub("", str(environ[name]))
        found[name] = value[:MAX_ENVIRONMENT_VALUE]
    return found


def imported_packages(modules: Mapping[str, Any] | None = None) -> dict[str, str]:
    """The `packages` entry: {import name: __version__} of FRAMEWORK_MODULES already imported."""
    modules = sys.modules if modules is None else modules
    found: dict[str, str] = {}
    for name in FRAMEWORK_MODULES:
        module = modules.get(name)
        version = getattr(module, "__version__", None) if module is not None else None
        if isinstance(version, str) and version:
            found[name] = version[:64]
    return found


def elastic_facts(environ: Mapping[str, str] | None = None) -> dict[str, Any] | None:
    """The `elastic` entry: torchrun's run id, restart count and group/role ranks; None outside
    torchelastic (no TORCHELASTIC_RUN_ID). A number that does not parse is left out (None)."""
    environ = os.environ if environ is None else environ
    if "TORCHELASTIC_RUN_ID" not in environ:
        return None
    facts: dict[str, Any] = {}
    for name, (variable, numeric) in ELASTIC_VARIABLES.items():
        value = environ.get(variable)
        if value is not None and numeric:
            value = rank_from_environment((variable,), environ)
        facts[name] = value
    return facts


def process_facts(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    environ = os.environ if environ is None else environ
    return {
        "host": attempt(socket.gethostname, "unknown"),
        "pid": os.getpid(),
        "argv": [str(argument) for argument in sys.argv],
        "rank": rank_from_environment(RANK_VARIABLES, environ),
        "local_rank": rank_from_environment(LOCAL_RANK_VARIABLES, environ),
        "world_size": rank_from_environment(WORLD_SIZE_VARIABLES, environ),
        "alloc_conf": {name: environ[name] for name in ALLOC_CONF_VARIABLES if name in environ},
        "elastic": elastic_facts(environ),
    }


def versions(backend: Any) -> dict[str, str | None]:
    def torch_version() -> str:
        import torch

        return str(torch.__version__)

    return {
        "oomdoctor": oomdoctor.__version__,
        "torch": attempt(torch_version),
        "cuda": attempt(backend.cuda_version),
        "python": platform.python_version(),
        # optional in a backend: where torch has no cuDNN or NCCL (or the backend no device), None
        "cudnn": attempt(getattr(backend, "cudnn_version", lambda: None)),
        "nccl": attempt(getattr(backend, "nccl_version", lambda: None)),
    }


def device_facts(backend: Any, device: int) -> dict[str, Any]:
    """`device`, `mem_get_info` and `memory_stats` entries for one device."""
    properties = attempt(lambda: backend.device_properties(device)) or {}
    free_total = attempt(lambda: backend.mem_get_info(device))
    stats = attempt(lambda: backend.memory_stats(device)) or {}
    return {
        "device": {
            "index": device,
            "name": properties.get("name"),
            "capability": properties.get("capability"),
            "total_memory_bytes": properties.get("total_memory_bytes"),
        },
        "mem_get_info": ({"free_bytes": int(free_total[0]), "total_bytes": int(free_total[1])} if free_total else None),
        "memory_stats": {
            name: int(stats[key]) for name, key in MEMORY_STAT_KEYS.items() if isinstance(stats.get(key), (int, float))
        },
    }
