"""One load level: which requests it replays, and what it measured (`LevelRecord`)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from loadgen import RequestRecord, RequestSpec
from slo import SLO, Metric, RunMetrics, evaluate
from tuner.measure.judge import Run, judge_report
from tuner.measure.keepup import served_fraction
from tuner.measure.verdict import LevelVerdict, VerdictRules
from tuner.targets.base import LevelReplay, ReplayPlan, ServerStats

# Seconds a level spends draining after its last arrival (the longest requests finishing).
LEVEL_TAIL_S = 6.0


@dataclass(frozen=True, slots=True)
class LevelSettings:
    """How one load level replays the request list."""

    arrival: str = "poisson"
    burstiness: float = 1.0
    seed: int = 0
    replay: ReplayPlan = field(default_factory=ReplayPlan)
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

    def expected_s(self, requests: Sequence[RequestSpec], rate_rps: float) -> float:
        """Expected wall time of one level at this rate: its arrivals plus the drain."""
        return len(self.requests_at(requests, rate_rps)) / rate_rps + LEVEL_TAIL_S


@dataclass(frozen=True, slots=True)
class LatencyFigures:
    """p50 and p99 of each latency metric over one level, in seconds (slo's percentiles)."""

    ttft_p50_s: float = math.nan
    ttft_p99_s: float = math.nan
    tpot_p50_s: float = math.nan
    tpot_p99_s: float = math.nan
    itl_p50_s: float = math.nan
    itl_p99_s: float = math.nan
    e2el_p50_s: float = math.nan
    e2el_p99_s: float = math.nan

    @classmethod
    def of(cls, metrics: RunMetrics) -> LatencyFigures:
        values = {}
        for metric in Metric:
            summary = metrics.summary(metric)
            values[f"{metric.value}_p50_s"] = float(summary.median_s)
            values[f"{metric.value}_p99_s"] = float(summary.p99_s)
        return cls(**values)

    def as_dict(self) -> dict[str, float]:
        return dataclasses.asdict(self)


@dataclass(frozen=True, slots=True)
class LevelRecord:
    """What one level measured, without its per-request records: what a trial keeps."""

    verdict: LevelVerdict
    goodput_rps: float  # vLLM's request_goodput
    request_throughput_rps: float
    latency: LatencyFigures
    wall_s: float
    max_loop_lag_s: float
    server: ServerStats

    @property
    def rate_rps(self) -> float:
        return self.verdict.rate_rps

    @property
    def passed(self) -> bool:
        return self.verdict.passed


@dataclass(slots=True)
class LevelRun:
    """A measured level with its per-request records."""

    level: LevelRecord
    records: list[RequestRecord] = field(repr=False)

    def run(self) -> Run:
        return Run(self.level.rate_rps, self.records, self.level.verdict.schedule_ok)


def judge_replay(
    replay: LevelReplay, rate_rps: float, slo: SLO, rules: VerdictRules, wall_s: float
) -> LevelRun:
    """A level's record and verdict from what the target returned."""
    records = list(replay.result.records)
    report = evaluate(records, slo)
    served = served_fraction(records)
    verdict = judge_report(report, rate_rps, served, bool(replay.result.schedule_ok), rules)
    level = LevelRecord(
        verdict=verdict,
        goodput_rps=float(report.goodput_rps),
        request_throughput_rps=float(report.metrics.request_throughput),
        latency=LatencyFigures.of(report.metrics),
        wall_s=wall_s,
        max_loop_lag_s=float(replay.result.max_loop_lag_s),
        server=replay.server,
    )
    return LevelRun(level, records)
