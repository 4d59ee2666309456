"""Measure a configured target: one load level, or its capacity by a rate search.

The layer `tune` and `tune bench` share. It knows loadgen (arrivals), slo (through the judge)
and a target that is already configured; it knows nothing of Optuna. Time is read on the
injected clock only.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field

from loadgen import RequestSpec, arrival_offsets
from slo import SLO
from tuner.measure.level import LevelRun, LevelSettings, judge_replay
from tuner.measure.ratesearch import Outcome, RateSearch, RateSearchSettings
from tuner.measure.verdict import VerdictRules
from tuner.targets.base import Target

Clock = Callable[[], float]


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

    async def level(self, rate_rps: float) -> LevelRun:
        """Replay the prefix of the list this rate takes, at this rate, and judge it."""
        s = self.settings
        requests = s.requests_at(self.requests, rate_rps)
        offsets = arrival_offsets(s.arrival, rate_rps=rate_rps, n=len(requests), seed=s.seed,
                                  burstiness=s.burstiness)  # fmt: skip
        start_s = self.clock()
        replay = await self.target.replay(requests, offsets, s.replay)
        return judge_replay(replay, rate_rps, self.slo, self.rules, self.clock() - start_s)

    async def search_levels(
        self, search: RateSearch, deadline_s: float | None = None
    ) -> AsyncIterator[LevelRun]:
        """Measure the levels `search` asks for, recording each verdict in it, until it ends
        or a new level would start past `deadline_s`; the caller may stop early."""
        measured = 0
        while (rate := search.next_rate()) is not None:
            if deadline_s is not None and measured and self.clock() >= deadline_s:
                return
            run = await self.level(rate)
            measured += 1
            search.record(rate, run.level.passed)
            yield run

    async def capacity(
        self, search: RateSearchSettings, deadline_s: float | None = None
    ) -> CapacityResult:
        """Capacity of the configured target: measure levels until the rate search ends."""
        state = RateSearch(search)
        start_s = self.clock()
        levels = [run async for run in self.search_levels(state, deadline_s)]
        return CapacityResult(state.capacity_rps, state.upper_bound_rps, state.outcome, levels,
                              self.clock() - start_s)  # fmt: skip

    def expected_level_s(self, rate_rps: float) -> float:
        return self.settings.expected_s(self.requests, rate_rps)
