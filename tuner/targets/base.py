"""What a trial measures: the built-in engine (reconfigured in place), a launched server, a URL."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Protocol

from engine_lite import EngineConfig
from loadgen import HttpTarget, InProcessTarget
from tuner.errors import TuneError
from tuner.targets.launch import LaunchedServer, LaunchSpec
from tuner.targets.prom import PrometheusProbe
from tuner.targets.server_stats import ServerStats


class Target(Protocol):
    """A serving engine the tuner can configure per trial and load per level."""

    description: str

    async def apply(self, knobs: dict[str, Any]) -> None:
        """Make the next levels run with these scheduler knobs."""

    def replay_target(self) -> InProcessTarget | HttpTarget:
        """What loadgen's `replay` sends requests to."""

    async def level_begin(self) -> None:
        """Called right before a level's first request."""

    async def level_end(self, wall_s: float) -> ServerStats:
        """Called after a level's last response; server-side figures over the level."""

    async def close(self) -> None:
        """Release the engine or stop the server."""


class _StepWindow:
    """Accumulates the engine's per-step stats between `reset()` calls (written by its thread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self.preemptions = 0
            self.kv_max = 0.0
            self.kv_sum = 0.0
            self.steps = 0

    def __call__(self, step: Any) -> None:
        with self._lock:
            self.preemptions += step.num_preemptions
            self.kv_max = max(self.kv_max, step.kv_cache_usage)
            self.kv_sum += step.kv_cache_usage
            self.steps += 1

    def stats(self) -> ServerStats:
        with self._lock:
            mean = self.kv_sum / self.steps if self.steps else 0.0
            return ServerStats(self.preemptions, self.kv_max, mean)


class BuiltinTarget:
    """engine_lite in this process: weights load once, each trial only swaps scheduler knobs."""

    def __init__(self, config: EngineConfig) -> None:
        from engine_lite import AsyncEngine

        self.config = config
        self.engine = AsyncEngine(config)
        self._window = _StepWindow()
        self.engine.add_step_listener(self._window)
        self._target = InProcessTarget(self.engine)
        self._started = False
        self.description = f"engine_lite {config.model}"

    async def apply(self, knobs: dict[str, Any]) -> None:
        if not self._started:
            await self.engine.start()
            self._started = True
        # Knobs a config leaves out mean the engine's defaults, not the previous trial's values.
        await self.engine.reconfigure(**(self.config.scheduler_knobs() | knobs))

    def replay_target(self) -> InProcessTarget:
        return self._target

    async def level_begin(self) -> None:
        self._window.reset()

    async def level_end(self, wall_s: float) -> ServerStats:
        return self._window.stats()

    async def close(self) -> None:
        if self._started:
            await self.engine.shutdown()
            self._started = False


class LaunchTarget:
    """Starts the user's server command per trial with the trial's knobs filled in."""

    def __init__(
        self,
        spec: LaunchSpec,
        url: str,
        model: str,
        endpoint: str = "completions",
        prometheus: PrometheusProbe | None = None,
        health_timeout_s: float = 600.0,
        log_dir: Path | None = None,
    ) -> None:
        self.spec = spec
        self.health_timeout_s = health_timeout_s
        self.log_dir = log_dir
        self._launches = 0
        self.url = url
        self.model = model
        self.endpoint = endpoint
        self.prometheus = prometheus
        self._server: LaunchedServer | None = None
        self._knobs: dict[str, Any] = {}
        self._target = HttpTarget(url, model, endpoint=endpoint)
        self.description = f"launched: {spec.template}"

    async def apply(self, knobs: dict[str, Any]) -> None:
        if self._server is not None and knobs == self._knobs:
            self._server.check_alive()
            return  # same config as the running server: no restart
        await self.close()
        self._knobs = dict(knobs)
        self._launches += 1
        log = self.log_dir / f"server-{self._launches:03d}.log" if self.log_dir else None
        self._server = LaunchedServer(
            self.spec.argv(knobs),
            self.url,
            health_timeout_s=self.health_timeout_s,
            log_path=log,
        )
        await self._server.start()

    def replay_target(self) -> HttpTarget:
        return self._target

    async def level_begin(self) -> None:
        if self.prometheus is not None:
            await self.prometheus.begin()

    async def level_end(self, wall_s: float) -> ServerStats:
        if self._server is not None:
            self._server.check_alive()
        if self.prometheus is None:
            return ServerStats()
        return await self.prometheus.end(wall_s)

    async def close(self) -> None:
        if self._server is not None:
            await self._server.stop()
            self._server = None


class UrlTarget:
    """A server someone else started: it is measured as it is and cannot be reconfigured."""

    def __init__(
        self,
        url: str,
        model: str,
        endpoint: str = "completions",
        prometheus: PrometheusProbe | None = None,
    ) -> None:
        self.url = url
        self.prometheus = prometheus
        self._target = HttpTarget(url, model, endpoint=endpoint)
        self._applied: dict[str, Any] | None = None
        self.description = f"server at {url}"

    async def apply(self, knobs: dict[str, Any]) -> None:
        if self._applied is not None and knobs != self._applied:
            raise TuneError(
                f"the server at {self.url} cannot change its knobs between trials; use --launch "
                "'CMD {max_num_batched_tokens} ...' so each trial starts its own server"
            )
        self._applied = dict(knobs)

    def replay_target(self) -> HttpTarget:
        return self._target

    async def level_begin(self) -> None:
        if self.prometheus is not None:
            await self.prometheus.begin()

    async def level_end(self, wall_s: float) -> ServerStats:
        if self.prometheus is None:
            return ServerStats()
        return await self.prometheus.end(wall_s)

    async def close(self) -> None:
        return None
