"""Fit the simulator to the target: from the engine's own steps, then from real levels.

1. Profile: the built-in engine reports every step (`StepStats`: what it computed and how
   long it took) while it serves real levels; the cost model is fitted on them. (Bursts of
   all requests at once fitted a model that read serving steps about a third too fast.)
2. Refit: whatever the profile missed (other processes on the machine, the serving path) shows
   when simulated levels are compared with real ones at the same rate and config. One factor
   on step time and a fixed token delivery latency are fitted to the real levels measured so
   far, by matching their TPOT and TTFT percentiles.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from engine_lite.costmodel import CostModel, StepFeatures
from loadgen import RequestRecord
from loadgen.stop import was_stopped
from slo import Metric, compute_metrics
from tuner.measure.meter import Meter
from tuner.sim.target import SimTarget
from tuner.targets.knobs import Knobs

# A step whose end came more than this after the previous one's (plus its own duration) had an
# idle engine before it: its duration alone is the step's cost.
_BUSY_GAP_S = 0.02
# Step-time factors a refit tries: wide for a model fitted elsewhere (a profile, vLLM's request
# spans), narrow for one fitted on this engine's own steps, which it only corrects.
WIDE_SCALES = tuple(float(x) for x in np.geomspace(0.6, 2.5, 11))
OWN_STEP_SCALES = tuple(float(x) for x in np.geomspace(0.8, 1.25, 7))
_FIGURES = (("tpot", "p99"), ("tpot", "p50"), ("ttft", "p99"), ("ttft", "p50"))


class StepLog:
    """Collects (features, seconds) from an engine's step listener while active."""

    def __init__(self) -> None:
        self.samples: list[tuple[StepFeatures, float]] = []
        self.active = False
        self._last_end: float | None = None
        self._level_start = 0
        self.rejected = 0  # steps dropped with the levels the meter measured again

    def level_started(self) -> None:
        self._level_start = len(self.samples)

    def level_rejected(self) -> None:
        """The level since `level_started` ran on a machine that was not the run's."""
        self.rejected += len(self.samples) - self._level_start
        del self.samples[self._level_start :]

    def __call__(self, step: Any) -> None:
        if not self.active or not step.features.num_reqs:
            return
        seconds = step.step_duration_s
        if self._last_end is not None:
            period = step.time_s - self._last_end
            if period < step.step_duration_s + _BUSY_GAP_S:
                seconds = max(seconds, period)  # busy: the time between steps counts too
        self._last_end = step.time_s
        self.samples.append((step.features, seconds))


@dataclass(frozen=True, slots=True)
class RealLevel:
    """A real level to compare the simulator against: config, rate and what the client saw."""

    knobs: Knobs
    rate_rps: float
    records: list[RequestRecord]


@dataclass(frozen=True, slots=True)
class Refit:
    model: CostModel
    scale: float
    errors: list[dict[str, float]]  # per level: relative error of each figure
    max_error: float


def figures(records: Sequence[RequestRecord]) -> dict[str, float]:
    m = compute_metrics(list(records))
    out = {}
    for metric, stat in _FIGURES:
        s = m.summary(Metric(metric))
        out[f"{metric}_{stat}"] = float(s.p99_s if stat == "p99" else s.median_s)
    return out


async def simulate_level(sim: SimTarget, meter: Meter, level: RealLevel
                         ) -> list[tuple[RequestRecord, RequestRecord]]:  # fmt: skip
    """The real level's requests at the real level's send times, on the simulator: each sent
    request with its simulated twin. A level stopped early (loadgen.stop) replays the requests
    it sent, those it cut short too: they loaded the engine while the measured ones ran."""
    await sim.apply(level.knobs)
    by_index = {r.index: r for r in meter.requests}
    sent = [r for r in level.records if math.isfinite(r.sent_s)]
    start = min(r.scheduled_s for r in sent)
    offsets = [r.scheduled_s - start for r in sent]
    replay = sim.replay_now([by_index[r.index] for r in sent], offsets)
    return list(zip(sent, replay.result.records, strict=True))


async def compare(sim: SimTarget, meter: Meter, level: RealLevel) -> dict[str, float]:
    """Relative error of the simulated level against the real one, per figure (over the
    requests the real level measured)."""
    pairs = [p for p in await simulate_level(sim, meter, level) if not was_stopped(p[0])]
    real = figures([r for r, _ in pairs])
    simulated = figures([s for _, s in pairs])
    return {k: _rel(simulated[k], real[k]) for k in real}


async def fit_request_overhead(sim: SimTarget, meter: Meter, levels: Sequence[RealLevel]) -> float:
    """Seconds from a request's send to the engine having it, beyond what the model has: the
    median gap between real and simulated TTFT (the serving path's fixed cost)."""
    gaps = []
    for level in levels:
        for real, sim_rec in await simulate_level(sim, meter, level):
            if real.success and real.chunk_times_s and sim_rec.chunk_times_s:
                gaps.append((real.chunk_times_s[0] - real.sent_s)
                            - (sim_rec.chunk_times_s[0] - sim_rec.sent_s))  # fmt: skip
    return max(0.0, float(np.median(gaps))) if gaps else 0.0


async def refit(sim: SimTarget, meter: Meter, levels: Sequence[RealLevel],
                scales: Sequence[float] = WIDE_SCALES) -> Refit:  # fmt: skip
    """The step-time factor (and serving-path latency) that makes the simulated levels match
    the real ones best. The model as given is a candidate too: a refit never makes it worse."""
    base = sim.model
    best: Refit | None = None
    for scale in sorted({1.0, *(float(x) for x in scales)}):
        sim.model = scaled(base, scale)
        candidate = await _judged(sim, meter, levels, scale)
        if best is None or _score(candidate) < _score(best):
            best = candidate
    assert best is not None
    sim.model = best.model
    overhead = await fit_request_overhead(sim, meter, levels)
    if overhead > 0:
        sim.model = replace(best.model, request_overhead_s=best.model.request_overhead_s + overhead)
        with_overhead = await _judged(sim, meter, levels, best.scale)
        best = with_overhead if _score(with_overhead) < _score(best) else best
    sim.model = best.model
    return best


async def _judged(sim: SimTarget, meter: Meter, levels: Sequence[RealLevel],
                  scale: float) -> Refit:  # fmt: skip
    errors = [await compare(sim, meter, lv) for lv in levels]
    worst = max((max(e.values()) for e in errors), default=0.0)
    return Refit(sim.model, scale, errors, worst)


def scaled(model: CostModel, scale: float) -> CostModel:
    return replace(model, coefficients=tuple(c * scale for c in model.coefficients))


def _score(r: Refit) -> float:
    return float(np.mean([np.mean(list(e.values())) for e in r.errors])) if r.errors else 0.0


def _rel(simulated: float, real: float) -> float:
    if not (math.isfinite(simulated) and math.isfinite(real)) or real <= 0:
        return 0.0 if simulated == real else 1.0
    return abs(simulated - real) / real
