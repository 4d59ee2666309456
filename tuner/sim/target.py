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
from loadgen.stop import mark_stopped
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
        """The level, synchronously (screening runs many of them without a loop). A plan's
        stop rule ends it as it ends a real replay: told of each request as it finishes, in
        virtual time; what was still running is cut, what had not arrived is never sent, and
        both are marked so (loadgen.stop). A failing level then costs a fraction of its steps."""
        assert self.config is not None, "apply() a config first"
        warmup = plan.warmup if plan else 0
        records = [RequestRecord(r.index, r.class_name, r.prompt_len, r.output_len, off,
                                 warmup=i < warmup)
                   for i, (r, off) in enumerate(zip(requests, offsets, strict=True))]  # fmt: skip
        finished = plan.stop.watch(records) if plan and plan.stop else None
        sim = [SimRequest(r.scheduled_s, r.prompt_len, r.output_len) for r in records]
        stop_s: float | None = None

        def on_finish(i: int, timeline: SimTimeline) -> bool:
            nonlocal stop_s
            _fill(records[i], timeline)
            if finished is not None and finished(records[i]) and stop_s is None:
                stop_s = timeline.finish_s
            return stop_s is not None

        timelines = simulate(self.config, self.engine, self.model, sim, on_finish=on_finish)
        for rec, tl in zip(records, timelines, strict=True):
            if not rec.success and (stop_s is None or tl.arrival_s <= stop_s):
                _fill(rec, tl)  # what a cut request had received; all of it when not stopped
        if stop_s is not None and not mark_stopped(records, stop_s):
            stop_s = None  # it stopped at the last request: nothing was cut
        preempted = sum(t.num_preemptions for t in timelines)
        result = ReplayResult(records, 0.0, 0.0, 0.0, 0.0, 0.0, math.inf, stopped_s=stop_s)
        return LevelReplay(result, ServerStats(preemptions=preempted))

    async def close(self) -> None:
        return None


def engine_config(knobs: Knobs) -> EngineConfig:
    """The scheduler config a knob set means (a vLLM target's knobs lack policy: vLLM's)."""
    return EngineConfig(**{**knobs, "policy": Policy(knobs.get("policy", Policy.DECODE_FIRST))})


def _fill(rec: RequestRecord, tl: SimTimeline) -> None:
    """A record as a client would have it from this timeline (tokens one per chunk)."""
    n = len(tl.token_times_s)
    rec.sent_s = tl.arrival_s
    rec.chunk_times_s, rec.chunk_tokens = list(tl.token_times_s), [1] * n
    rec.prompt_tokens, rec.output_tokens = rec.prompt_len, n
    rec.success = n == rec.output_len
    rec.finished_s = tl.finish_s
