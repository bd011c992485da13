"""Facts about the process and the device that go into a dump's `oomdoctor` key.

Everything is read through the backend seam or the environment; each fact is gathered on its own, so
one that fails (a driver call, an odd environment) leaves a None and never costs the dump.
"""

from __future__ import annotations

import os
import platform
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
