"""Arrival times: Poisson, gamma with burstiness, constant, and trace timestamps.

Each process is drawn once at rate 1 (a *pattern*) and divided by the rate, so every rate of a
capacity search replays the same pattern, only faster or slower.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence

import numpy as np

from loadgen.errors import LoadgenError

# The longest schedule a replay takes: past it a timestamp is in the wrong unit or corrupt,
# or a rate is a typo, and the replay would sleep until killed. A week-long trace still fits.
MAX_SCHEDULE_S = 30 * 86400.0


class ArrivalKind(enum.StrEnum):
    POISSON = "poisson"
    GAMMA = "gamma"
    CONSTANT = "constant"
    TRACE = "trace"


def arrival_pattern(
    kind: str | ArrivalKind,
    n: int,
    seed: int = 0,
    burstiness: float = 1.0,
    timestamps: Sequence[float] | None = None,
) -> list[float]:
    """Offsets (s) at a mean rate of 1 request/s; `arrival_offsets` divides them by the rate.

    Gaps follow vLLM's `get_request` (vllm/benchmarks/serve.py): gamma with shape =
    burstiness and scale = 1 / (rate * burstiness), so burstiness 1 is a Poisson process, < 1
    is burstier, and infinity is constant. Cumulative gaps are then rescaled, as vLLM does, so
    that the last request arrives at exactly n / rate: the realized rate is the one asked for.
    A trace keeps its own gaps, rescaled the same way.
    """
    kind = _kind(kind)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise LoadgenError(f"number of arrivals n={n!r} is invalid; use an integer >= 1")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise LoadgenError(f"seed={seed!r} is invalid; use an integer >= 0")
    if kind is ArrivalKind.TRACE:
        offsets = _trace_offsets(timestamps, n)
    else:
        offsets = np.cumsum(_unit_gaps(kind, n, seed, burstiness))
    if offsets[-1] <= 0:  # a trace whose requests all arrive at once
        return [0.0] * n
    return (offsets * (n / offsets[-1])).tolist()


def arrival_offsets(
    kind: str | ArrivalKind,
    rate_rps: float | None,
    n: int,
    seed: int = 0,
    burstiness: float = 1.0,
    timestamps: Sequence[float] | None = None,
    time_scale: float = 1.0,
) -> list[float]:
    """Seconds from the start at which each of n requests is sent; the same seed, the same list.

    `rate_rps` = inf sends everything at once. For `trace`, `rate_rps=None` keeps the trace's
    own timing stretched by `time_scale` (2.0 = half the rate); a rate rescales it to that rate.
    """
    kind = _kind(kind)
    if kind is ArrivalKind.TRACE and rate_rps is None:
        if not time_scale > 0 or math.isinf(time_scale):
            raise LoadgenError(f"time_scale={time_scale!r} is invalid; use a positive number")
        base = _trace_offsets(timestamps, n)
        return (base * time_scale).tolist()
    if rate_rps is None or not rate_rps > 0:
        raise LoadgenError(f"rate={rate_rps!r} req/s is invalid; use a positive number (or inf)")
    if math.isinf(rate_rps):
        return [0.0] * n
    pattern = arrival_pattern(kind, n, seed, burstiness, timestamps)
    return [t / rate_rps for t in pattern]


def _unit_gaps(kind: ArrivalKind, n: int, seed: int, burstiness: float) -> np.ndarray:
    if kind is ArrivalKind.CONSTANT:
        return np.ones(n)
    if kind is ArrivalKind.POISSON and burstiness != 1.0:
        raise LoadgenError(
            f"burstiness={burstiness!r} needs gamma arrivals; use --arrival gamma "
            "(poisson is gamma with burstiness 1)"
        )
    if not burstiness > 0:
        raise LoadgenError(f"burstiness={burstiness!r} is invalid; use a positive number")
    if math.isinf(burstiness):
        return np.ones(n)
    rng = np.random.default_rng(seed)
    return rng.gamma(shape=burstiness, scale=1.0 / burstiness, size=n)


def _trace_offsets(timestamps: Sequence[float] | None, n: int) -> np.ndarray:
    if timestamps is None or len(timestamps) < n:
        have = 0 if timestamps is None else len(timestamps)
        raise LoadgenError(
            f"trace arrivals need {n} timestamps but got {have}; "
            "use a trace workload or another --arrival"
        )
    ts = np.asarray(timestamps[:n], dtype=np.float64)
    if np.any(np.diff(ts) < 0):
        raise LoadgenError("trace timestamps go backwards; sort the trace by time")
    return ts - ts[0]


def _kind(kind: str | ArrivalKind) -> ArrivalKind:
    try:
        return ArrivalKind(kind)
    except ValueError:
        names = ", ".join(k.value for k in ArrivalKind)
        raise LoadgenError(f"arrival process {kind!r} is unknown; use one of {names}") from None
