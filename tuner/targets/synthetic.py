"""`--synthetic SECONDS`: a stand-in target that measures nothing.

Each load level waits SECONDS on the event loop (an asyncio sleep: no CPU) and returns made-up
per-request records whose TPOT is 30 ms x rate / capacity, with a capacity peaking at a
512-token budget. It is for rehearsing a cluster (PostgreSQL, N workers, a node that dies)
before spending GPU hours, for the tests of that, and for measuring what coordinating workers
costs (benchmarks/cluster_scaling.py). Its figures mean nothing about any engine.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Sequence

from loadgen import ReplayResult, RequestRecord, RequestSpec
from tuner.targets.base import LevelReplay, ReplayPlan, ServerStats, TargetFacts, TargetKind
from tuner.targets.knobs import Knobs, KnobSpace

TPOT_AT_CAPACITY_S = 0.030  # so `--slo tpot_p99=30ms` holds exactly up to the capacity
PEAK_RPS, PEAK_BUDGET = 12.0, 512
FIRST_TOKEN_S = 0.05
TOKENS_PER_CHUNK = 16  # a few chunks per request keep the records small
DEFAULTS: Knobs = {"max_num_batched_tokens": 2048, "max_num_seqs": 128,
                   "enable_chunked_prefill": True, "long_prefill_token_threshold": 0}  # fmt: skip


def synthetic_capacity_rps(knobs: Knobs) -> float:
    """Peaks at a 512-token budget and halves per factor of four away from it."""
    budget = knobs["max_num_batched_tokens"]
    return PEAK_RPS / (1.0 + abs(math.log2(budget / PEAK_BUDGET)) / 2)


class SyntheticTarget:
    """Four vLLM knobs, a known capacity, and levels that take a fixed wall time."""

    def __init__(self, level_wall_s: float) -> None:
        self.level_wall_s = level_wall_s
        self.facts = TargetFacts(TargetKind.SYNTHETIC,
                                 f"synthetic ({level_wall_s:g} s per level; measures nothing)",
                                 "synthetic", "synthetic", 8192, 4096, 16,
                                 require_schedule=False)  # fmt: skip
        self.knobs = KnobSpace(dict(DEFAULTS), frozenset(DEFAULTS), "the synthetic target's own")
        self._knobs: Knobs = dict(DEFAULTS)

    async def apply(self, knobs: Knobs) -> None:
        self._knobs = self.knobs.complete(knobs)

    async def replay(self, requests: Sequence[RequestSpec], offsets: Sequence[float],
                     plan: ReplayPlan) -> LevelReplay:  # fmt: skip
        start = time.monotonic()
        await asyncio.sleep(self.level_wall_s)
        capacity = synthetic_capacity_rps(self._knobs)
        span = offsets[-1] - offsets[0] if len(offsets) > 1 else 0.0
        rate = len(offsets) / span if span > 0 else capacity  # a burst runs at capacity
        records = [_record(spec, start + offset, TPOT_AT_CAPACITY_S * rate / capacity)
                   for spec, offset in zip(requests, offsets, strict=True)]  # fmt: skip
        result = ReplayResult(records, start, 0.0, 0.0, 0.0, 0.0, plan.lag_tolerance_s)
        return LevelReplay(result, ServerStats())

    async def close(self) -> None:
        return None


def _record(spec: RequestSpec, sent_s: float, tpot_s: float) -> RequestRecord:
    full, rest = divmod(spec.output_len - 1, TOKENS_PER_CHUNK)
    sizes = [1] + [TOKENS_PER_CHUNK] * full + ([rest] if rest else [])
    first = sent_s + FIRST_TOKEN_S
    times, tokens = [], 0
    for size in sizes:
        tokens += size
        times.append(first + (tokens - 1) * tpot_s)
    return RequestRecord(spec.index, spec.class_name, spec.prompt_len, spec.output_len,
                         scheduled_s=sent_s, sent_s=sent_s, chunk_times_s=times,
                         chunk_tokens=sizes, prompt_tokens=spec.prompt_len,
                         output_tokens=spec.output_len, success=True,
                         finished_s=times[-1])  # fmt: skip
