"""Measure one config: one load level at one rate, or its capacity by a rate search.

This is the layer `tune` and `tune bench` share. It knows loadgen (replay), slo (verdicts) and
a target that is already configured; it knows nothing of Optuna.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from loadgen import InProcessTarget, RequestRecord, RequestSpec, arrival_offsets, replay
from slo import SLO, Metric, RunMetrics, SLOReport, TermResult, evaluate
from tuner.measure.keepup import MIN_SERVED_FRACTION, served_fraction
from tuner.measure.ratesearch import Outcome, RateSearch, RateSearchSettings
from tuner.targets.base import Target
from tuner.targets.server_stats import ServerStats

# DistServe (OSDI'24) counts capacity only while the service is healthy; we call a level failed
# once 1% of its requests fail, whatever their latency.
MAX_ERROR_RATE = 0.01


@dataclass(frozen=True)
class LevelSettings:
    """How one load level replays the request list."""

    arrival: str = "poisson"
    burstiness: float = 1.0
    seed: int = 0
    warmup: int = 0
    timeout_s: float = 120.0
    max_error_rate: float = MAX_ERROR_RATE
    min_served_fraction: float = MIN_SERVED_FRACTION
    # Over HTTP a client that fell behind its schedule also stamps chunks late, so such a
    # level cannot pass; in process the engine stamps chunks itself. None: decide by target.
    require_schedule: bool | None = None
    lag_tolerance_s: float = 0.010  # loadgen's default: p99 loop / send lag allowed
    # Seconds of arrivals per level: a level at rate r replays the first ceil(r * duration_s)
    # requests of the list (at least min_requests), so every level runs long enough to reach a
    # steady state and a fast rate is not a burst in disguise. None replays the whole list.
    duration_s: float | None = None
    min_requests: int = 20

    def requests_at(self, requests: Sequence[RequestSpec], rate_rps: float) -> list[RequestSpec]:
        """The prefix of the request list a level at this rate replays."""
        if self.duration_s is None or not math.isfinite(rate_rps):
            return list(requests)
        n = max(self.min_requests, math.ceil(rate_rps * self.duration_s))
        return list(requests[:n])


@dataclass
class TermValue:
    """One SLO term's measured value at a level."""

    term: str  # e.g. "tpot_p99=30ms"
    metric: str  # e.g. "tpot_p99"
    value_s: float
    limit_s: float
    margin_frac: float  # (limit - value) / limit: negative when violated


@dataclass
class LevelResult:
    """One replay of the request list at one arrival rate, and its verdict."""

    rate_rps: float
    passed: bool
    slo_met: bool
    error_rate: float
    served_fraction: float  # completion rate / arrival rate (1.0 when the server kept up)
    schedule_ok: bool
    terms: list[TermValue]
    binding: str  # the term with the smallest margin
    goodput_rps: float
    request_throughput_rps: float
    latency_s: dict[str, float]  # ttft_p99, tpot_p99, itl_p99, e2el_p99, ttft_p50, ...
    wall_s: float
    max_loop_lag_s: float
    server: ServerStats
    records: list[RequestRecord] = field(repr=False)

    def summary(self) -> dict[str, Any]:
        """Flat figures for a trials table row (no records)."""
        row: dict[str, Any] = {
            "rate_rps": self.rate_rps,
            "passed": self.passed,
            "slo_met": self.slo_met,
            "error_rate": self.error_rate,
            "served_fraction": self.served_fraction,
            "schedule_ok": self.schedule_ok,
            "binding": self.binding,
            "goodput_rps": self.goodput_rps,
            "request_throughput_rps": self.request_throughput_rps,
            "wall_s": self.wall_s,
            "max_loop_lag_s": self.max_loop_lag_s,
        }
        row.update({f"{k}_s": v for k, v in self.latency_s.items()})
        for t in self.terms:
            row[f"slo_{t.metric}_s"] = t.value_s
            row[f"slo_{t.metric}_margin"] = t.margin_frac
        row["binding_margin"] = min((t.margin_frac for t in self.terms), default=None)
        row.update(self.server.as_row())
        return row


@dataclass
class CapacityResult:
    """The outcome of a rate search for one config."""

    capacity_rps: float
    upper_bound_rps: float
    outcome: Outcome
    levels: list[LevelResult]
    wall_s: float

    @property
    def at_capacity(self) -> LevelResult | None:
        """The passing level the capacity comes from."""
        hits = [lv for lv in self.levels if lv.passed and lv.rate_rps == self.capacity_rps]
        return hits[-1] if hits else None


def judge(
    records: Sequence[RequestRecord], slo: SLO, max_error_rate: float
) -> tuple[SLOReport, bool]:
    """slo's verdict plus the error-rate rule; returns (SLOReport, passed)."""
    report = evaluate(records, slo)
    return report, bool(report.met and report.metrics.error_rate < max_error_rate)


async def measure_level(
    target: Target,
    requests: Sequence[RequestSpec],
    rate_rps: float,
    slo: SLO,
    settings: LevelSettings = LevelSettings(),
) -> LevelResult:
    """Replay `requests` (the prefix `settings` picks for this rate) at `rate_rps` against the
    configured target and judge the SLO."""
    requests = settings.requests_at(requests, rate_rps)
    offsets = arrival_offsets(
        settings.arrival,
        rate_rps=rate_rps,
        n=len(requests),
        seed=settings.seed,
        burstiness=settings.burstiness,
    )
    await target.level_begin()
    start = time.monotonic()
    result = await replay(
        target.replay_target(),
        list(requests),
        offsets,
        warmup=settings.warmup,
        timeout_s=settings.timeout_s,
        progress=False,
        lag_tolerance_s=settings.lag_tolerance_s,
    )
    wall_s = time.monotonic() - start
    server = await target.level_end(wall_s)
    report, passed = judge(result.records, slo, settings.max_error_rate)
    served = served_fraction(result.records)
    passed = passed and served >= settings.min_served_fraction
    # A run whose client fell behind its schedule offered less load than asked: not a pass.
    passed = passed and (result.schedule_ok or not _schedule_required(settings, target))
    return LevelResult(
        rate_rps=rate_rps,
        passed=passed,
        slo_met=bool(report.met),
        error_rate=float(report.metrics.error_rate),
        served_fraction=served,
        schedule_ok=bool(result.schedule_ok),
        terms=[_term_value(t) for t in report.terms],
        binding=report.binding.term.name,
        goodput_rps=float(report.goodput_rps),
        request_throughput_rps=float(report.metrics.request_throughput),
        latency_s=latency_summary(report.metrics),
        wall_s=wall_s,
        max_loop_lag_s=float(result.max_loop_lag_s),
        server=server,
        records=list(result.records),
    )


def _schedule_required(settings: LevelSettings, target: Target) -> bool:
    if settings.require_schedule is not None:
        return settings.require_schedule
    return not isinstance(target.replay_target(), InProcessTarget)


LevelHook = Callable[[LevelResult, RateSearch], bool]


async def find_capacity(
    target: Target,
    requests: Sequence[RequestSpec],
    slo: SLO,
    search: RateSearchSettings,
    settings: LevelSettings = LevelSettings(),
    on_level: LevelHook | None = None,
    deadline_s: float | None = None,
) -> CapacityResult:
    """Capacity of the configured target: measure levels until the rate search ends.

    `on_level` sees each level after it is recorded; returning True stops the search (the tuner
    uses it for Optuna's pruning). `deadline_s` (time.monotonic()) stops before a new level.
    """
    state = RateSearch(search)
    levels: list[LevelResult] = []
    start = time.monotonic()
    while (rate := state.next_rate()) is not None:
        if deadline_s is not None and levels and time.monotonic() >= deadline_s:
            break
        level = await measure_level(target, requests, rate, slo, settings)
        levels.append(level)
        state.record(rate, level.passed)
        if on_level is not None and on_level(level, state):
            break
    return CapacityResult(
        capacity_rps=state.capacity_rps,
        upper_bound_rps=state.upper_bound_rps,
        outcome=state.outcome,
        levels=levels,
        wall_s=time.monotonic() - start,
    )


def latency_summary(metrics: RunMetrics) -> dict[str, float]:
    """p50/p99 of TTFT, TPOT, ITL and E2EL in seconds from slo's RunMetrics."""
    out = {}
    for metric in Metric:
        summary = metrics.summary(metric)
        out[f"{metric.value}_p50"] = float(summary.median_s)
        out[f"{metric.value}_p99"] = float(summary.p99_s)
    return out


def _term_value(result: TermResult) -> TermValue:
    term = result.term
    return TermValue(
        term=str(term),
        metric=term.name,
        value_s=float(result.value_s),
        limit_s=float(term.limit_s),
        margin_frac=float(result.margin_frac),
    )
