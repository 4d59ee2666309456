"""Watch a vLLM-compatible server's own /metrics while a level runs.

vLLM 0.32 (and `engine-lite serve`) export running and waiting requests, KV-cache usage, the
preemption counter and a histogram of tokens per engine step. Polled once a second in the
tuner's process (the load loop runs elsewhere, so the poll cannot delay it), they tell why a
config failed: a queue that grew, preemptions, steps packed to the budget.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from dataclasses import dataclass, field

import aiohttp

from tuner.targets.base import ServerStats

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = "vllm:kv_cache_usage_perc"  # a fraction in [0, 1] despite its name
PREEMPTIONS = "vllm:num_preemptions_total"
STEP_TOKENS_SUM = "vllm:iteration_tokens_total_sum"
STEP_TOKENS_COUNT = "vllm:iteration_tokens_total_count"
WATCHED = (RUNNING, WAITING, KV_USAGE, PREEMPTIONS, STEP_TOKENS_SUM, STEP_TOKENS_COUNT)
POLL_S = 1.0
# How long a server may take to drop the requests of a level that stopped early.
IDLE_WAIT_S = 15.0


def parse_metrics(text: str) -> dict[str, float]:
    """The watched series of a Prometheus text exposition, summed over label sets."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        name_labels, _, value = line.rpartition(" ")
        name = name_labels.split("{", 1)[0]
        if name in WATCHED:
            with contextlib.suppress(ValueError):
                out[name] = out.get(name, 0.0) + float(value)
    return out


@dataclass(slots=True)
class _Samples:
    first: dict[str, float] = field(default_factory=dict)
    last: dict[str, float] = field(default_factory=dict)
    running: list[float] = field(default_factory=list)
    waiting: list[float] = field(default_factory=list)
    kv: list[float] = field(default_factory=list)

    def add(self, sample: dict[str, float]) -> None:
        if not self.first:
            self.first = sample
        self.last = sample
        for series, name in ((self.running, RUNNING), (self.waiting, WAITING), (self.kv, KV_USAGE)):
            if name in sample:
                series.append(sample[name])

    def stats(self) -> ServerStats:
        def delta(name: str) -> float | None:
            if name not in self.first or name not in self.last:
                return None
            end, start = self.last[name], self.first[name]
            return end if end < start else end - start  # a restarted server counts from 0

        preempt, tokens, steps = (
            delta(PREEMPTIONS),
            delta(STEP_TOKENS_SUM),
            delta(STEP_TOKENS_COUNT),
        )
        return ServerStats(
            preemptions=None if preempt is None else round(preempt),
            kv_cache_usage_max=max(self.kv) if self.kv else None,
            kv_cache_usage_mean=sum(self.kv) / len(self.kv) if self.kv else None,
            running_max=round(max(self.running)) if self.running else None,
            waiting_max=round(max(self.waiting)) if self.waiting else None,
            tokens_per_step_mean=tokens / steps if tokens is not None and steps else None,
            steps=None if steps is None else round(steps),
        )


class MetricsWatch:
    """`async with MetricsWatch(url) as watch:` polls /metrics until the block ends; then
    `watch.stats()` holds the level's figures. A failed poll only leaves a gap."""

    def __init__(self, url: str, poll_s: float = POLL_S) -> None:
        self.url = url.rstrip("/") + "/metrics"
        self.poll_s = poll_s
        self._samples = _Samples()
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> MetricsWatch:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5))
        await self._poll_once()  # the counters' values at the start
        self._task = asyncio.create_task(self._poll())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._poll_once()  # and at the end
        await self._session.close()

    def stats(self) -> ServerStats:
        return self._samples.stats()

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.poll_s)
            await self._poll_once()

    async def _poll_once(self) -> None:
        sample = await read_metrics(self._session, self.url)
        if sample and all(math.isfinite(v) for v in sample.values()):
            self._samples.add(sample)


async def read_metrics(session: aiohttp.ClientSession, url: str) -> dict[str, float]:
    """One GET of a /metrics URL, parsed; {} when it fails (a failed poll only leaves a gap)."""
    try:
        async with session.get(url) as resp:
            return parse_metrics(await resp.text()) if resp.status == 200 else {}
    except (aiohttp.ClientError, TimeoutError, OSError):
        return {}


async def wait_idle(url: str, timeout_s: float = IDLE_WAIT_S, poll_s: float = 0.2) -> int | None:
    """Poll the server's /metrics until it runs and queues no request, for at most `timeout_s`:
    after a level stopped early, the requests it cut should be gone before the next level.
    The requests still there when the wait ended (0: none), or None when /metrics says nothing."""
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
        while True:
            sample = await read_metrics(session, url.rstrip("/") + "/metrics")
            if RUNNING not in sample or WAITING not in sample:
                return None  # no /metrics of vLLM's names: nothing to wait on
            left = round(sample[RUNNING] + sample[WAITING])
            if left == 0 or time.monotonic() >= deadline:
                return left
            await asyncio.sleep(poll_s)
