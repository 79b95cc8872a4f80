"""The machine a figure was taken on and the versions it depends on: the processor as
lscpu names it, its SIMD features (AMX included, to say when a machine advertises it),
cores, memory and load averages; Python, the packages and the checkout's commit.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

PEER_PACKAGES = ("llama-cpp-python", "mlx-lm")

# the x86 features a figure depends on; AMX is listed so a run on a machine that has it
# says so (this project never emits AMX: the VMs advertise it and refuse it)
SIMD_FLAGS = (
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "avx_vnni",
    "amx_tile",
    "amx_int8",
    "amx_bf16",
)
LSCPU_FIELDS = {
    "Model name": "cpu",
    "Vendor ID": "vendor",
    "CPU family": "cpu_family",
    "Model": "cpu_model_number",
    "Socket(s)": "sockets",
    "Core(s) per socket": "cores_per_socket",
    "Thread(s) per core": "threads_per_core",
}


def machine() -> dict[str, Any]:
    """The processor (lscpu's model name), its SIMD features, cores, memory and the load
    averages when the run started."""
    load = os.getloadavg()
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else os.cpu_count(),
        "load_average_1m": round(load[0], 2),
        "load_average_5m": round(load[1], 2),
        "load_average_15m": round(load[2], 2),
    }
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        text = cpuinfo.read_text()
        for line in text.splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
        flags = next((ln for ln in text.splitlines() if ln.startswith("flags")), "").split()
        info["simd"] = [f for f in SIMD_FLAGS if f in flags]
    info.update(_lscpu())
    meminfo = Path("/proc/meminfo")
    if meminfo.is_file():
        total_kb = int(meminfo.read_text().split()[1])
        info["memory_gib"] = round(total_kb / 2**20, 1)
    return info


def _lscpu() -> dict[str, Any]:
    """lscpu's processor name and topology (empty where lscpu is missing)."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    info: dict[str, Any] = {}
    for line in out.splitlines():
        field, _, value = line.partition(":")
        key = LSCPU_FIELDS.get(field.strip())
        if key is not None and value.strip():
            value = value.strip()
            info[key] = int(value) if value.isdigit() else value
    return info


def versions() -> dict[str, str | None]:
    """Versions of Python and the packages a figure depends on (None: not installed)."""
    out: dict[str, str | None] = {"python": platform.python_version()}
    for package in ("branchchat", "numpy", "mlx", "tokenizers", *PEER_PACKAGES):
        try:
            out[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            out[package] = None
    out["git"] = _git_revision()
    try:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]  # type: ignore[index]
        out["numpy_blas"] = f"{blas.get('name')} {blas.get('version')}"
    except Exception:  # older numpy prints the config instead of returning it
        out["numpy_blas"] = None
    return out


def _git_revision() -> str | None:
    """The checkout's commit, with "+dirty" when tracked files differ from it."""
    root = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
        ).stdout.strip()
    except OSError:
        return None
    return f"{commit}+dirty" if commit and dirty else commit or None


def warn_if_busy(max_load: float = 1.5) -> float:
    """Say on stderr when the 1-minute load average is above max_load: on a 2-core machine
    another busy process halves a multi-threaded figure. Returns the load average."""
    load = os.getloadavg()[0]
    if load > max_load:
        print(
            f"warning: load average {load:.2f} > {max_load}; figures will be noisy "
            "(wait for a quiet machine, see `uptime`)",
            file=sys.stderr,
        )
    return load
