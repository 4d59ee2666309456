"""Versions and machine facts a report must carry to be comparable with another one."""

from __future__ import annotations

import os
import platform
import sys
from importlib import metadata
from typing import Any


def environment() -> dict[str, Any]:
    """Python, the packages that shape a measurement, and the machine."""
    versions = {"python": sys.version.split()[0]}
    for package in ("chunked-prefill-tuner", "torch", "optuna", "numpy", "aiohttp"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    return {
        "versions": versions,
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
    }
