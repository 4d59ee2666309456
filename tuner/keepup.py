"""Did the server keep up with the offered load? The rule that makes capacity mean sustained."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

# A level also fails when completions fall behind arrivals. TPOT and ITL exclude queueing, so
# without this a config that starves prefills (a tiny budget, decode first) would "meet" a TPOT
# SLO at any rate while its queue grows without bound.
MIN_SERVED_FRACTION = 0.85


def served_fraction(records: Sequence[Any]) -> float:
    """How much of the offered rate the server completed: 1 / slope of sorted completion times
    against sorted arrival times (capped at 1).

    With the i-th completion matched to the i-th arrival (cumulative departure against arrival
    curves), a server that keeps up completes requests as fast as they arrive, so the slope is
    ~1 whatever the latency; an overloaded one completes at its own rate mu < r, so the slope
    is r / mu. The middle 80% of requests is used, so start-up and drain do not bias it.
    """
    measured = [r for r in records if not r.warmup]
    arrivals = np.sort([r.scheduled_s for r in measured])
    done = np.sort([r.finished_s for r in measured if math.isfinite(r.finished_s)])
    n = min(len(arrivals), len(done))
    if n < 5:
        return 1.0
    lo, hi = int(0.1 * n), max(int(0.9 * n), int(0.1 * n) + 2)
    a, c = arrivals[lo:hi], done[lo:hi]
    spread = float(np.var(a))
    if spread <= 0:
        return 0.0  # everything arrived at once: no sustained rate was offered
    slope = float(np.mean((a - a.mean()) * (c - c.mean()))) / spread
    return 1.0 if slope <= 1.0 else 1.0 / slope
