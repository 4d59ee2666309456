"""A simulated serving target on a simulated clock, for tests of the whole tune pipeline.

Its capacity is known in closed form, so a test can check that the search finds the knobs that
serve the most; time only passes when it serves a level, so a whole run takes no real time.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Sequence

import pytest

from loadgen import ReplayResult, RequestRecord, RequestSpec
from tuner.targets.base import LevelReplay, ReplayPlan, ServerStats, TargetFacts, TargetKind
from tuner.targets.knobs import Knobs, KnobSpace

FIRST_TOKEN_S = 0.05
TOKENS_PER_CHUNK = 16  # a few chunks per request keep records small; TPOT does not change
SIM_TPOT_LIMIT_S = 0.030  # the SLO a test asks: TPOT p99 reaches it exactly at capacity


class FakeClock:
    """A monotonic clock that moves only when told to."""

    def __init__(self, start_s: float = 1000.0) -> None:
        self.now_s = start_s

    def __call__(self) -> float:
        return self.now_s

    def advance(self, seconds: float) -> None:
        self.now_s += max(0.0, seconds)


def sim_capacity_rps(knobs: Knobs) -> float:
    """Capacity peaks at a 512-token budget and falls off by half per factor of four."""
    budget = knobs["max_num_batched_tokens"]
    return 12.0 / (1.0 + abs(math.log2(budget / 512)) / 2)


class SimulatedTarget:
    """A vLLM-like server with four knobs whose TPOT grows with load / capacity."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.facts = TargetFacts(TargetKind.BUILTIN, "simulated server", "sim", "cpu", 8192,
                                 4096, 16, require_schedule=False)  # fmt: skip
        defaults = {"max_num_batched_tokens": 2048, "max_num_seqs": 128,
                    "enable_chunked_prefill": True, "long_prefill_token_threshold": 0}  # fmt: skip
        self.knobs = KnobSpace(defaults, frozenset(defaults), "the simulated CPU row")
        self.applied: list[Knobs] = []
        self.closed = False

    async def apply(self, knobs: Knobs) -> None:
        self.applied.append(self.knobs.complete(knobs))

    async def replay(
        self, requests: Sequence[RequestSpec], offsets: Sequence[float], plan: ReplayPlan
    ) -> LevelReplay:
        start = self.clock()
        capacity = sim_capacity_rps(self.applied[-1])
        span = offsets[-1] - offsets[0] if len(offsets) > 1 else 0.0
        burst = span <= 0
        rate = len(offsets) / span if not burst else capacity
        tpot = SIM_TPOT_LIMIT_S * rate / capacity
        records = []
        for i, (spec, offset) in enumerate(zip(requests, offsets, strict=True)):
            sent = start + offset
            first = sent + FIRST_TOKEN_S + (i / capacity if burst else 0.0)
            sizes = [1, *_chunks(spec.output_len - 1)]
            times = [first + (sum(sizes[: k + 1]) - 1) * tpot for k in range(len(sizes))]
            records.append(RequestRecord(
                spec.index, spec.class_name, spec.prompt_len, spec.output_len, scheduled_s=sent,
                sent_s=sent, chunk_times_s=times, chunk_tokens=sizes,
                prompt_tokens=spec.prompt_len, output_tokens=spec.output_len, success=True,
                finished_s=times[-1],
            ))  # fmt: skip
        self.clock.advance(max(r.finished_s for r in records) - start)
        result = ReplayResult(records, start, 0.0, 0.0, 0.0, 0.0, plan.lag_tolerance_s)
        return LevelReplay(result, ServerStats())

    async def close(self) -> None:
        self.closed = True


def _chunks(tokens: int) -> list[int]:
    full, rest = divmod(tokens, TOKENS_PER_CHUNK)
    return [TOKENS_PER_CHUNK] * full + ([rest] if rest else [])


@pytest.fixture
def fake_clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def sim_target(fake_clock: FakeClock) -> SimulatedTarget:
    return SimulatedTarget(fake_clock)


@pytest.fixture
def sim_targets(fake_clock: FakeClock) -> Callable[[], SimulatedTarget]:
    """A fresh simulated server per call, on the one clock: one per worker of a study."""
    return lambda: SimulatedTarget(fake_clock)


class FaultyTarget(SimulatedTarget):
    """The simulated server, with a fault raised in place of its `at_level`-th level (counted
    over calibration, search and confirmation alike)."""

    def __init__(self, clock: FakeClock, at_level: int | None = None,
                 fault: BaseException | None = None) -> None:  # fmt: skip
        super().__init__(clock)
        self.at_level, self.fault = at_level, fault or asyncio.CancelledError()
        self.levels = 0

    async def replay(
        self, requests: Sequence[RequestSpec], offsets: Sequence[float], plan: ReplayPlan
    ) -> LevelReplay:
        self.levels += 1
        if self.levels == self.at_level:
            raise self.fault
        return await super().replay(requests, offsets, plan)


@pytest.fixture
def faulty_target(fake_clock: FakeClock) -> Callable[..., FaultyTarget]:
    """`faulty_target(at_level=2)`: Ctrl-C (a cancellation, as asyncio delivers it) during the
    second level; `fault=` raises something else there."""
    return lambda **kw: FaultyTarget(fake_clock, **kw)


class DefaultRefusesEverything(SimulatedTarget):
    """The simulated server, except that with its default knobs every request fails, from its
    `from_level`-th level on (counted over all levels: the first is the calibration burst)."""

    def __init__(self, clock: FakeClock, from_level: int = 1) -> None:
        super().__init__(clock)
        self.from_level, self.levels = from_level, 0

    async def replay(
        self, requests: Sequence[RequestSpec], offsets: Sequence[float], plan: ReplayPlan
    ) -> LevelReplay:
        level = await super().replay(requests, offsets, plan)
        self.levels += 1
        if self.applied[-1] == self.knobs.defaults and self.levels >= self.from_level:
            for r in level.result.records:
                r.chunk_times_s, r.chunk_tokens, r.output_tokens = [], [], 0
                r.fail("HTTP 503: overloaded", r.sent_s)
        return level


@pytest.fixture
def refusing_default_target(fake_clock: FakeClock) -> Callable[..., DefaultRefusesEverything]:
    """`refusing_default_target(from_level=2)`: the default serves the calibration burst, then
    fails every request."""
    return lambda **kw: DefaultRefusesEverything(fake_clock, **kw)
