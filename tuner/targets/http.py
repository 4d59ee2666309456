"""Targets over HTTP: a server command launched per config (`--launch`) or a running `--url`,
and `--prometheus-url`: the server's preemptions and KV-cache usage over each load level."""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from loadgen import HttpTarget, LoadgenError, RequestRecord, RequestSpec
from tuner.errors import TuneError
from tuner.targets.base import (
    LevelReplay,
    ReplayPlan,
    ServerLost,
    ServerStats,
    TargetFacts,
    TargetKind,
    span_s,
)
from tuner.targets.builtin import engine_defaults
from tuner.targets.client_process import ClientProcess, ReplayJob
from tuner.targets.knobs import KNOBS, Knobs, KnobSpace
from tuner.targets.launch import LaunchedServer, LaunchSpec
from tuner.targets.scrape import MetricsWatch, wait_idle

# vLLM's KV block size (CacheConfig.block_size): what budgets round to on a server we cannot ask.
VLLM_BLOCK_SIZE = 16
DEFAULT_MODEL_LEN = 8192
# Prompt token ids must be valid for the served model; ids below 4096 are valid in every
# Llama-family vocabulary, and lengths, not ids, drive serving time.
SAFE_VOCAB = 4096


# A server we did not start runs its own flags; without better knowledge the report compares
# against what `vllm serve` runs when given none.
def assumed_defaults() -> tuple[Knobs, str]:
    """A server's defaults when its flags are unseen: vLLM 0.32's row for this machine."""
    knobs, row = engine_defaults()
    return knobs, f"{row}, assumed (the server's own flags are not seen)"


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


def http_facts(
    kind: TargetKind, description: str, model: str, max_model_len: int | None
) -> TargetFacts:
    return TargetFacts(kind, description, model, "remote", max_model_len or DEFAULT_MODEL_LEN,
                       SAFE_VOCAB, VLLM_BLOCK_SIZE, require_schedule=True)  # fmt: skip


class HttpLevels:
    """One level against a server: Prometheus around the replay, and a liveness check."""

    def __init__(self, url: str, model: str, endpoint: str, prom: PrometheusProbe | None) -> None:
        self.url = url
        self.model = model
        self.endpoint = endpoint
        self.prometheus = prom
        # The load loop runs in a child process nothing else in `tune` can stall.
        self._loader = ClientProcess()
        self._probe = HttpTarget(url, model, endpoint=endpoint)  # is the server still there?

    async def replay(self, requests: Sequence[RequestSpec], offsets: Sequence[float],
                     plan: ReplayPlan) -> LevelReplay:  # fmt: skip
        job = ReplayJob(self.url, self.model, self.endpoint, len(requests), list(offsets),
                        plan.warmup, plan.timeout_s, plan.lag_tolerance_s, plan.stop)  # fmt: skip
        try:
            if self.prometheus is None:  # the server's own /metrics, polled beside the level
                async with MetricsWatch(self.url) as watch:
                    result = await self._loader.replay(requests, job)
            else:
                await self.prometheus.begin()
                result = await self._loader.replay(requests, job)
        except LoadgenError as exc:  # the server did not answer before the first request
            raise self.lost(str(exc), []) from None
        if (gone := await self.gone(result.records)) is not None:
            raise self.lost(gone, result.records)
        stats = watch.stats() if self.prometheus is None else await self.prometheus.end(
            span_s(result))  # fmt: skip
        if result.stopped_s is not None:  # the cut requests should leave with their clients
            stats = dataclasses.replace(stats, left_running=await wait_idle(self.url))
        return LevelReplay(result, stats)

    async def gone(self, records: Sequence[RequestRecord]) -> str | None:
        """Why the server is no longer there after a level, or None when it still answers.
        Failed requests alone are a verdict on the config; a server that no longer answers
        at all is not one."""
        if all(r.success for r in records):
            return None
        try:
            await self._probe.open()  # GET /v1/models, one line when unreachable
        except LoadgenError as exc:
            return str(exc)
        finally:
            await self._probe.close()
        return None

    def lost(self, why: str, records: Sequence[RequestRecord]) -> ServerLost:
        return ServerLost(why, records)


class ServerPerConfig(HttpLevels):
    """A server this run starts for each config (in its own process group) and stops before
    the next; subclasses say how a config's server starts (`server_for`)."""

    def __init__(self, url: str, model: str, endpoint: str, prom: PrometheusProbe | None) -> None:
        super().__init__(url, model, endpoint, prom)
        self.starts: list[tuple[Knobs, float]] = []  # each start's config and seconds to /health
        self._server: LaunchedServer | None = None
        self._knobs: Knobs = {}

    def server_for(self, config: Knobs, number: int) -> LaunchedServer:
        """The (not yet started) server of this config, the run's `number`-th start."""
        raise NotImplementedError

    async def apply(self, knobs: Knobs) -> None:
        config = self.knobs.complete(knobs)  # type: ignore[attr-defined]
        if self._server is not None and config == self._knobs and self._server.alive:
            return  # same config as the running server: no restart
        await self._stop_server()
        self._knobs = config
        self._server = self.server_for(config, len(self.starts) + 1)
        started = time.monotonic()
        await self._server.start()
        self.starts.append((config, time.monotonic() - started))

    @property
    def running_knobs(self) -> Knobs | None:
        """The config of the server that is up now (None when none is)."""
        return self._knobs if self._server is not None and self._server.alive else None

    async def gone(self, records: Sequence[RequestRecord]) -> str | None:
        if self._server is not None and (exited := self._server.exit_reason()) is not None:
            return exited
        return await super().gone(records)

    def lost(self, why: str, records: Sequence[RequestRecord]) -> ServerLost:
        return ServerLost(why, records, restartable=True)  # the next config starts its own

    async def _stop_server(self) -> None:
        if self._server is not None:
            await self._server.stop()
            self._server = None

    async def close(self) -> None:
        await self._stop_server()
        await self._loader.close()


class LaunchTarget(ServerPerConfig):
    """Starts the user's server command per config; it sets the knobs the command names as
    placeholders, the others stay at vLLM's defaults."""

    def __init__(
        self,
        spec: LaunchSpec,
        endpoint: str = "completions",
        prometheus: PrometheusProbe | None = None,
        health_timeout_s: float = 600.0,
        log_dir: Path | None = None,
        max_model_len: int | None = None,
    ) -> None:
        super().__init__(spec.url, spec.model, endpoint, prometheus)
        settable = spec.fields() & set(KNOBS)
        if not settable:
            raise TuneError(
                "--launch has no knob placeholder, so every trial would be the same server; add "
                "e.g. --max-num-batched-tokens {max_num_batched_tokens} to the command"
            )
        self.spec = spec
        defaults, source = assumed_defaults()
        self.knobs = KnobSpace(defaults, frozenset(settable), source,
                               refusal="the --launch command has no {{{name}}}")  # fmt: skip
        self.facts = http_facts(TargetKind.LAUNCH, f"launched: {spec.template}", spec.model,
                                max_model_len)  # fmt: skip
        self.health_timeout_s = health_timeout_s
        self.log_dir = log_dir

    def server_for(self, config: Knobs, number: int) -> LaunchedServer:
        log = self.log_dir / f"server-{number:03d}.log" if self.log_dir else None
        return LaunchedServer(self.spec.argv(config), self.url,
                              health_timeout_s=self.health_timeout_s, log_path=log)  # fmt: skip


class UrlTarget(HttpLevels):
    """A server someone else started: measured as it is; it can change no knob."""

    def __init__(
        self,
        url: str,
        model: str,
        endpoint: str = "completions",
        prometheus: PrometheusProbe | None = None,
        max_model_len: int | None = None,
    ) -> None:
        super().__init__(url, model, endpoint, prometheus)
        defaults, source = assumed_defaults()
        self.knobs = KnobSpace(
            defaults,
            frozenset(),
            source,
            refusal=f"the server at {url} cannot change it; use --launch 'CMD ... {{{{{{name}}}}}}'"
            " so each trial starts its own server",
        )
        self.facts = http_facts(TargetKind.URL, f"server at {url}", model, max_model_len)

    async def apply(self, knobs: Knobs) -> None:
        self.knobs.complete(knobs)  # a config it cannot run is refused, not measured as another

    async def close(self) -> None:
        await self._loader.close()
