"""Versions and machine facts a report or a bench baseline carries to be comparable."""

from __future__ import annotations

import os
import platform
from importlib import metadata
from pathlib import Path
from typing import Any

# The packages that shape a measurement: this tool, the engines, the search.
PACKAGES = ("chunked-prefill-tuner", "torch", "flash-attn", "vllm", "sglang", "optuna", "numpy",
            "aiohttp")  # fmt: skip


def software_versions() -> dict[str, str]:
    """Python and each of `PACKAGES` that is installed."""
    out = {"python": platform.python_version()}
    for package in PACKAGES:
        try:
            out[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            continue
    return out


def environment() -> dict[str, Any]:
    """The versions (None for a package not installed) and the machine."""
    installed = software_versions()
    return {
        "versions": {"python": installed["python"], **{p: installed.get(p) for p in PACKAGES}},
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
    }


def device_description() -> str:
    """The accelerator's name, or the CPU's model and core count (what speed depends on)."""
    import torch

    if torch.cuda.is_available():
        return f"cuda:{torch.cuda.get_device_name(0)}"
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"cpu:{cpu} x{os.cpu_count()}"
