"""`--prometheus-url`: pull a server's preemptions and KV-cache usage over each load level."""

from __future__ import annotations

import asyncio
import math
from typing import Any

from tuner.errors import TuneError
from tuner.targets.base import ServerStats

# vLLM V1 metric names (vllm/v1/metrics/loggers.py); engine_lite exports the same ones.
# vllm:kv_cache_usage_perc is a fraction in [0, 1] despite its name.
PREEMPTIONS = "vllm:num_preemptions_total"
KV_USAGE = "vllm:kv_cache_usage_perc"


class PrometheusProbe:
    """Queries one Prometheus server with range functions spanning the level just measured."""

    def __init__(self, url: str, scrape_interval_s: float = 5.0) -> None:
        from prometheus_api_client import PrometheusConnect

        self.url = url
        # A level's window reaches back one scrape further, so the sample taken just before the
        # level started anchors the counter's increase.
        self.scrape_interval_s = scrape_interval_s
        self._client = PrometheusConnect(url=url, disable_ssl=True)
        self._preempt_start: float | None = None

    def check(self) -> None:
        """Fail fast, in one line, when the server is not there."""
        try:
            ok = self._client.check_prometheus_connection()
        except Exception as exc:  # the client raises requests' many exception types
            raise TuneError(
                f"--prometheus-url {self.url} is unreachable ({exc}); check the URL"
            ) from None
        if not ok:
            raise TuneError(f"--prometheus-url {self.url} did not answer /-/healthy; check it")

    async def begin(self) -> None:
        self._preempt_start = await self._scalar(f"sum({PREEMPTIONS})")

    async def end(self, wall_s: float) -> ServerStats:
        """Preemptions and KV usage over the last `wall_s` seconds (plus one scrape)."""
        # Let the scrape that covers the level's end land first.
        await asyncio.sleep(self.scrape_interval_s)
        window = f"{math.ceil(wall_s + 2 * self.scrape_interval_s)}s"
        preempt_end, kv_max, kv_mean = await asyncio.gather(
            self._scalar(f"sum({PREEMPTIONS})"),
            self._scalar(f"max(max_over_time({KV_USAGE}[{window}]))"),
            self._scalar(f"avg(avg_over_time({KV_USAGE}[{window}]))"),
        )
        return ServerStats(
            preemptions=_counter_delta(self._preempt_start, preempt_end),
            kv_cache_usage_max=kv_max,
            kv_cache_usage_mean=kv_mean,
        )

    async def _scalar(self, query: str) -> float | None:
        try:
            result: list[dict[str, Any]] = await asyncio.to_thread(self._client.custom_query, query)
        except Exception:  # a missed pull leaves a gap in the table, not a failed trial
            return None
        if not result:
            return None
        value = float(result[0]["value"][1])
        return None if math.isnan(value) else value


def _counter_delta(start: float | None, end: float | None) -> int | None:
    """A counter's growth over a level; a server restarted since `start` counts from zero."""
    if end is None:
        return None
    if start is None or end < start:
        return round(end)
    return round(end - start)
