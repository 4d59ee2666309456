"""Did the server keep up with the offered load? The estimate behind the keep-up rule."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

# Theil-Sen over all pairs is O(n^2) in time and memory: a GPU level of 4000 requests takes ~1 s
# and ~0.5 GB, and the capacity bootstrap re-judges every level hundreds of times. Above this
# many requests the slopes come from pairs half a run apart instead (O(n), long spans, as robust).
ALL_PAIRS_UP_TO = 400


def served_fraction(records: Sequence[Any]) -> float:
    """Share of the offered rate the server sustained (1.0 when it kept up).

    An overloaded server (arrival rate r above its service rate mu) builds a queue that grows
    by r - mu per second, so a request arriving t seconds into the run waits t * (r/mu - 1)
    before its first token. The slope of (first token - scheduled arrival) against the
    scheduled arrival therefore estimates r/mu - 1, and mu/r = 1 / (1 + slope). Prompt lengths
    spread the waits but not their trend. Theil-Sen (the median of pairwise slopes) keeps a few
    long prompts from tilting it. Requests that never produced a token are left out; the error
    rule judges them.
    """
    points = [
        (r.scheduled_s, r.chunk_times_s[0] - r.scheduled_s)
        for r in records
        if not r.warmup and r.chunk_times_s and math.isfinite(r.scheduled_s)
    ]
    if len(points) < 5:
        return 1.0
    t = np.array([p[0] for p in points])
    wait = np.array([p[1] for p in points])
    i, j = _pairs(t)
    dt = t[j] - t[i]
    keep = dt > 1e-6
    if not keep.any():
        return 1.0  # everything arrived at once: a burst has no sustained rate to judge
    slope = float(np.median((wait[j] - wait[i])[keep] / dt[keep]))
    return 1.0 / (1.0 + slope) if slope > 0 else 1.0


def _pairs(t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Index pairs whose slopes the median is taken over."""
    if len(t) <= ALL_PAIRS_UP_TO:
        return np.triu_indices(len(t), k=1)
    order = np.argsort(t, kind="stable")
    half = len(t) // 2
    return order[: len(t) - half], order[half:]
