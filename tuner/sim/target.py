"""A target that serves in virtual time: engine_lite's real scheduler and a fitted cost model.

It takes the real target's facts and knob space, so a config it measures is a config the real
target can run, and it answers a level with the same `RequestRecord`s a real replay would, so
the same meter, verdicts and rate search apply unchanged. A level costs milliseconds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from engine_lite import EngineConfig, Policy
from engine_lite.costmodel import CostModel
from engine_lite.sim import SimEngine, SimRequest, SimTimeline, simulate
from loadgen import ReplayResult, RequestRecord, RequestSpec
from tuner.targets.base import LevelReplay, ReplayPlan, ServerStats, TargetFacts
from tuner.targets.knobs import Knobs, KnobSpace


@dataclass(slots=True)
class SimTarget:
    """The Target protocol in virtual time (start 0 s; a level's records end where it ends)."""

    facts: TargetFacts
    knobs: KnobSpace
    engine: SimEngine
    model: CostModel
    config: EngineConfig | None = None

    async def apply(self, knobs: Knobs) -> None:
        self.config = engine_config(self.knobs.complete(knobs))

    async def replay(self, requests: Sequence[RequestSpec], offsets: Sequence[float],
                     plan: ReplayPlan) -> LevelReplay:  # fmt: skip
        return self.replay_now(requests, offsets, plan)

    def replay_now(self, requests: Sequence[RequestSpec], offsets: Sequence[float],
                   plan: ReplayPlan | None = None) -> LevelReplay:  # fmt: skip
        """The level, synchronously (screening runs many of them without a loop)."""
        assert self.config is not None, "apply() a config first"
        pairs = zip(requests, offsets, strict=True)
        sim = [SimRequest(off, r.prompt_len, r.output_len) for r, off in pairs]
        timelines = simulate(self.config, self.engine, self.model, sim)
        warmup = plan.warmup if plan else 0
        records = [_record(r, t, i < warmup) for i, (r, t) in
                   enumerate(zip(requests, timelines, strict=True))]  # fmt: skip
        preempted = sum(t.num_preemptions for t in timelines)
        result = ReplayResult(records, 0.0, 0.0, 0.0, 0.0, 0.0, math.inf)
        return LevelReplay(result, ServerStats(preemptions=preempted))

    async def close(self) -> None:
        return None


def engine_config(knobs: Knobs) -> EngineConfig:
    """The scheduler config a knob set means (a vLLM target's knobs lack policy: vLLM's)."""
    return EngineConfig(**{**knobs, "policy": Policy(knobs.get("policy", Policy.DECODE_FIRST))})


def _record(spec: RequestSpec, tl: SimTimeline, warmup: bool) -> RequestRecord:
    n = len(tl.token_times_s)
    return RequestRecord(spec.index, spec.class_name, spec.prompt_len, spec.output_len,
                         tl.arrival_s, sent_s=tl.arrival_s, chunk_times_s=list(tl.token_times_s),
                         chunk_tokens=[1] * n, prompt_tokens=spec.prompt_len, output_tokens=n,
                         success=n == spec.output_len, warmup=warmup,
                         finished_s=tl.finish_s)  # fmt: skip
