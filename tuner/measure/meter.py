"""Measure a configured target: one load level (`LevelRecord`), or its capacity by a rate
search. Shared by `tune` and `tune bench`; knows loadgen, slo and the target, not Optuna. Time
is read on the injected clock only."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from loadgen import RequestRecord, RequestSpec, arrival_offsets
from loadgen.stop import StopRule, measured_part
from slo import SLO, Metric, RunMetrics, evaluate
from tuner.errors import TuneError
from tuner.measure.contention import CpuGuard, CpuShare
from tuner.measure.draws import LevelMix, draw_requests
from tuner.measure.early_stop import SloBroken
from tuner.measure.judge import Run, judge_report, served_fraction
from tuner.measure.ratesearch import LeftOut, Outcome, RateSearch, RateSearchSettings
from tuner.measure.verdict import LevelVerdict, VerdictRules
from tuner.targets.base import LevelReplay, ReplayPlan, ServerStats, Target

Clock = Callable[[], float]
# Seconds a level spends draining after its last arrival (the longest requests finishing).
LEVEL_TAIL_S = 6.0
# Tries of a level whose client fell behind its schedule before it counts as unmeasurable; a
# level on a machine others were using (`contention`) is measured again within the same tries.
LAG_TRIES = 3


class ClientLagError(TuneError):
    """The load generator, not the server, could not keep a level's schedule: a measurement
    failure, never a server that missed its SLO."""


@dataclass(frozen=True, slots=True)
class LevelSettings:
    """How one load level replays the request list."""

    arrival: str = "poisson"
    burstiness: float = 1.0
    seed: int = 0
    replay: ReplayPlan = field(default_factory=ReplayPlan)
    # Seconds of arrivals per level: a level at rate r replays ceil(r * duration_s) requests
    # of the list (at least min_requests), so every level runs long enough to reach a steady
    # state and a fast rate is not a burst in disguise. None replays the whole list.
    duration_s: float | None = None
    min_requests: int = 20
    mix: LevelMix = LevelMix.STRATIFIED  # which requests a level takes (measure/draws.py)

    def requests_at(self, requests: Sequence[RequestSpec], rate_rps: float,
                    draw: int = 0) -> list[RequestSpec]:  # fmt: skip
        """The requests a level at this rate replays on this draw: by default one of each
        prompt-length stratum of the list, so every draw carries its mix (`draws`)."""
        if self.duration_s is None or not math.isfinite(rate_rps):
            return list(requests)
        n = max(self.min_requests, math.ceil(rate_rps * self.duration_s))
        return draw_requests(requests, n, draw, self.seed, self.mix)

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
    # What others had of the machine during the level that counted (None: not watched), and
    # how many times the level was run to get one the run could judge.
    foreign_cpu_cores: float | None = None
    steal_share: float | None = None
    tries: int = 1
    step_pace: float | None = None  # the built-in engine's steps over the run's usual pace
    # Seconds into the level at which it stopped, its SLO already broken by the requests that
    # had finished (None: it ran to the end). Its figures are over those requests.
    stopped_s: float | None = None

    @property
    def rate_rps(self) -> float:
        return self.verdict.rate_rps

    @property
    def passed(self) -> bool:
        return self.verdict.passed


@dataclass(slots=True)
class LevelRun:
    """A measured level with its per-request records: every request of the level, those a
    stopped level left unmeasured marked so (loadgen.stop), as they are kept on disk."""

    level: LevelRecord
    records: list[RequestRecord] = field(repr=False)

    @property
    def measured(self) -> list[RequestRecord]:
        """The records its figures are over: all of them, unless the level stopped early."""
        return measured_part(self.records)

    def run(self) -> Run:
        return Run(self.level.rate_rps, self.measured, self.level.verdict.schedule_ok,
                   self.level.stopped_s is not None)  # fmt: skip


def judge_replay(
    replay: LevelReplay, rate_rps: float, slo: SLO, rules: VerdictRules, wall_s: float
) -> LevelRun:
    """A level's record and verdict from what the target returned (over the requests it
    measured, when it stopped early)."""
    records = list(replay.result.records)
    measured = measured_part(records)
    report = evaluate(measured, slo)
    served = served_fraction(measured)
    verdict = judge_report(report, rate_rps, served, bool(replay.result.schedule_ok), rules)
    level = LevelRecord(
        verdict=verdict,
        goodput_rps=float(report.goodput_rps),
        request_throughput_rps=float(report.metrics.request_throughput),
        latency=LatencyFigures.of(report.metrics),
        wall_s=wall_s,
        max_loop_lag_s=float(replay.result.max_loop_lag_s),
        server=replay.server,
        stopped_s=replay.result.stopped_s,
    )
    return LevelRun(level, records)


def _watched(level: LevelRecord, share: CpuShare | None, tries: int) -> LevelRecord:
    if share is None:
        return dataclasses.replace(level, tries=tries)
    return dataclasses.replace(level, foreign_cpu_cores=share.foreign_cores,
                               steal_share=share.steal_share, tries=tries,
                               step_pace=share.step_pace)  # fmt: skip


def machine_summary(levels: Sequence[LevelRecord]) -> dict[str, Any]:
    """How shared the machine was over these levels: how many were measured again, and the
    most CPU others used, the hypervisor stole, and the engine's steps slowed (over the run's
    usual pace) during a level kept (None: not watched)."""
    foreign = [lv.foreign_cpu_cores for lv in levels if lv.foreign_cpu_cores is not None]
    steal = [lv.steal_share for lv in levels if lv.steal_share is not None]
    pace = [lv.step_pace for lv in levels if lv.step_pace is not None]
    return {"remeasured": sum(lv.tries > 1 for lv in levels),
            "max_foreign_cpu_cores": max(foreign, default=None),
            "max_steal_share": max(steal, default=None),
            "max_step_pace": max(pace, default=None)}  # fmt: skip


@dataclass(slots=True)
class CapacityResult:
    """The outcome of a rate search for one config."""

    capacity_rps: float
    upper_bound_rps: float
    outcome: Outcome
    levels: list[LevelRun]
    wall_s: float


@dataclass(slots=True)
class Meter:
    """Replays one request list against one target and judges each level by one SLO."""

    target: Target
    requests: Sequence[RequestSpec]
    slo: SLO
    settings: LevelSettings = field(default_factory=LevelSettings)
    rules: VerdictRules = field(default_factory=VerdictRules)
    clock: Clock = time.monotonic
    # Watches what other processes take of the machine during each level (None: not watched;
    # a simulator in virtual time, or a server elsewhere).
    guard: CpuGuard | None = None
    # A search level ends once its SLO is already broken (measure/early_stop.py), and so does
    # a searched config's re-measurement (search/confirm.py); the levels that are pooled or
    # read for their figures (references, the same-traffic check, goodput) run to the end.
    # False: nothing stops early.
    stop_failing: bool = True

    async def level(self, rate_rps: float, draw: int = 0, stop_failing: bool = False,
                    pooled_with: Sequence[RequestRecord] = (),
                    stop_rule: StopRule | None = None) -> LevelRun:  # fmt: skip
        """Replay the requests this rate and draw take, at this rate, and judge it. A level
        whose client fell behind (over HTTP) is measured again; after `LAG_TRIES` such tries
        it raises `ClientLagError` instead of reporting the server as failing. A level during
        which other processes took the machine, or the engine's steps slowed (`guard`), is
        measured again too, once the machine is quiet again; when every try was, or the
        machine stayed busy through a whole wait (`CpuGuard.settle`), the quietest is kept.

        Draw 0 is the search's: every config meets the same requests at the same times, so
        configs differ by what they do, not by luck. A re-measurement takes another draw (a
        p99 over one level's requests belongs to its draw): other requests and arrivals.

        `stop_failing` ends the level once the requests finished (pooled with `pooled_with`,
        earlier runs at this rate; or by `stop_rule`) break the SLO beyond what the rest could
        mend: the same verdict, without the drain of a failing level."""
        s, plan = self.settings, self.settings.replay
        if stop_failing and math.isfinite(rate_rps):
            plan = dataclasses.replace(plan, stop=stop_rule or SloBroken.of(self.slo, pooled_with))
        requests = s.requests_at(self.requests, rate_rps, draw)
        offsets = arrival_offsets(s.arrival, rate_rps=rate_rps, n=len(requests),
                                  seed=s.seed + draw, burstiness=s.burstiness)  # fmt: skip
        quietest: tuple[float, LevelRun] | None = None
        for attempt in range(1, LAG_TRIES + 1):
            mark = self.guard.mark() if self.guard is not None else None
            start_s = self.clock()
            replay = await self.target.replay(requests, offsets, plan)
            wall_s = self.clock() - start_s
            run = judge_replay(replay, rate_rps, self.slo, self.rules, wall_s)
            # A burst (infinite rate) has no schedule to keep: it measures throughput only.
            lag_matters = self.rules.require_schedule and math.isfinite(rate_rps)
            if not replay.result.schedule_ok and lag_matters:
                continue
            share = self.guard.since(mark) if self.guard and mark is not None else None
            run.level = _watched(run.level, share, attempt)
            # A level the machine's other work slowed is not this config's: measured again
            # while tries remain, and the quietest one kept with what others used.
            if share is None or not share.contended:
                return run
            assert self.guard is not None
            self.guard.reject()
            if quietest is None or share.excess < quietest[0]:
                quietest = (share.excess, run)
            # Not straight back into the same stretch; a machine busy through the whole wait
            # would be busy for the next try too (on a 2-core VM, minutes of 7-26% steal ran
            # through every try of five levels in a row), so the quietest so far is kept.
            if attempt == LAG_TRIES or not (await self.guard.settle()).quiet:
                break
        if quietest is not None:
            kept = quietest[1]
            kept.level = dataclasses.replace(kept.level, tries=attempt)
            return kept
        r = replay.result
        raise ClientLagError(
            f"the load generator fell behind its schedule at {rate_rps:.2f} req/s in "
            f"{LAG_TRIES} tries (p99 loop lag {r.p99_loop_lag_s * 1e3:.0f} ms, p99 send lag "
            f"{r.p99_send_lag_s * 1e3:.0f} ms, tolerance {r.lag_tolerance_s * 1e3:g} ms): this "
            "machine is too busy to measure that rate; stop other work on it or run tune elsewhere"
        )

    async def search_levels(
        self, search: RateSearch, deadline_s: float | None = None, draw: int = 0
    ) -> AsyncIterator[LevelRun]:
        """Measure the levels `search` asks for, recording each verdict in it, until it ends
        or a new level would end past `deadline_s` (one left out is kept in `search.left_out`);
        the caller may stop early. The first always runs, unless the search goes on from an
        attempt a deadline cut (`left_out` set). Checked at the level's end, not its start:
        under 1 req/s, 640 requests take 10 min or more (vLLM 0.32 in bfloat16 on an AVX2-only
        CPU: a level at 0.38 req/s, 28 min, 11 min into 20)."""
        carried = len(search.levels)  # an earlier attempt's levels (search/trial.py)
        while (rate := search.next_rate()) is not None:
            expected_s = self.expected_level_s(rate)
            short_s = self.clock() + expected_s - deadline_s if deadline_s is not None else 0.0
            if (len(search.levels) > carried or search.left_out) and short_s > 0:
                n = len(self.settings.requests_at(self.requests, rate))
                search.left_out = LeftOut(rate, n, expected_s, short_s)
                return
            run = await self.level(rate, draw, self.stop_failing)
            search.record(rate, run.level.passed)
            yield run

    async def capacity(
        self, search: RateSearchSettings, deadline_s: float | None = None, draw: int = 0
    ) -> CapacityResult:
        """Capacity of the configured target: measure levels until the rate search ends (every
        level on one draw: the search's, 0, unless told another)."""
        state = RateSearch(search)
        start_s = self.clock()
        levels = [run async for run in self.search_levels(state, deadline_s, draw)]
        return CapacityResult(state.capacity_rps, state.upper_bound_rps, state.outcome, levels,
                              self.clock() - start_s)  # fmt: skip

    def expected_level_s(self, rate_rps: float) -> float:
        return self.settings.expected_s(self.requests, rate_rps)
