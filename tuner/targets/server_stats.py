"""Server-side figures over one load level, whichever target measured them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ServerStats:
    """Preemptions and KV-cache usage over one level (None where the target cannot tell)."""

    preemptions: int | None = None
    kv_cache_usage_max: float | None = None
    kv_cache_usage_mean: float | None = None

    def as_row(self) -> dict[str, Any]:
        return {
            "preemptions": self.preemptions,
            "kv_cache_usage_max": self.kv_cache_usage_max,
            "kv_cache_usage_mean": self.kv_cache_usage_mean,
        }
