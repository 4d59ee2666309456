"""The built-in engine as a target: engine_lite in this process, reconfigured between trials."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import Sequence
from typing import Any

from engine_lite import AsyncEngine, EngineConfig, EngineLiteError
from engine_lite.defaults import CPU_DEVICE, DeviceInfo
from loadgen import InProcessTarget, RequestSpec, replay
from tuner.errors import TuneError
from tuner.targets.base import (
    LevelReplay,
    ReplayPlan,
    ServerStats,
    TargetFacts,
    TargetKind,
)
from tuner.targets.knobs import KNOBS, Knobs, KnobSpace


def engine_defaults() -> tuple[Knobs, str]:
    """What `vllm serve` 0.32 (and `engine-lite serve`) runs without knob flags on this
    machine's device, and which row of vLLM's device table that is."""
    config, row = EngineConfig().resolved(local_device(), max_model_len=8192)
    return config.scheduler_knobs(), row.describe()


def local_device() -> DeviceInfo:
    """This machine's first accelerator, as vLLM's default table sees it, else the CPU."""
    import torch

    if not torch.cuda.is_available():
        return CPU_DEVICE
    props = torch.cuda.get_device_properties(0)
    return DeviceInfo("cuda", props.name, int(props.total_memory))


class _StepWindow:
    """Accumulates the engine's per-step stats between `reset()` calls (written by its thread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self.preemptions, self.kv_max, self.kv_sum, self.steps = 0, 0.0, 0.0, 0
            self.running_max = self.waiting_max = self.tokens = 0

    def __call__(self, step: Any) -> None:
        with self._lock:
            self.preemptions += step.num_preemptions
            self.kv_max = max(self.kv_max, step.kv_cache_usage)
            self.kv_sum += step.kv_cache_usage
            self.running_max = max(self.running_max, step.num_running)
            self.waiting_max = max(self.waiting_max, step.num_waiting)
            self.tokens += step.num_prefill_tokens + step.num_decode_tokens
            self.steps += 1

    def stats(self) -> ServerStats:
        with self._lock:
            n = self.steps
            return ServerStats(self.preemptions, self.kv_max, self.kv_sum / n if n else 0.0,
                               self.running_max, self.waiting_max,
                               self.tokens / n if n else None, n)  # fmt: skip


class BuiltinTarget:
    """engine_lite in this process: weights load once, each trial only swaps scheduler knobs. It
    can set every knob it has; its defaults are its config as resolved for this device."""

    def __init__(self, config: EngineConfig) -> None:
        try:
            self.engine = AsyncEngine(config)
        except EngineLiteError as exc:
            raise TuneError(str(exc)) from None
        # The engine's config as resolved for this device: what it runs when told nothing.
        defaults = {k: v for k, v in self.engine.config.scheduler_knobs().items() if k in KNOBS}
        device = _device_name(config.device)
        source = self.engine.batch_defaults.describe()
        self.knobs = KnobSpace(defaults, frozenset(defaults), source)
        # In process the engine stamps chunk times itself: a lagging client cannot skew them.
        self.facts = TargetFacts(TargetKind.BUILTIN, f"engine_lite {config.model}", config.model,
                                 device, self.engine.max_model_len, self.engine.vocab_size,
                                 self.engine.block_size, require_schedule=False)  # fmt: skip
        self._window = _StepWindow()
        self.engine.add_step_listener(self._window)
        self._target = InProcessTarget(self.engine)
        self._started = False

    async def apply(self, knobs: Knobs) -> None:
        if not self._started:
            await self.engine.start()
            self._started = True
        await self.engine.reconfigure(**self.knobs.complete(knobs))

    async def replay(self, requests: Sequence[RequestSpec], offsets: Sequence[float],
                     plan: ReplayPlan) -> LevelReplay:  # fmt: skip
        self._window.reset()
        result = await replay(self._target, list(requests), offsets, warmup=plan.warmup,
                              timeout_s=plan.timeout_s, progress=False,
                              lag_tolerance_s=plan.lag_tolerance_s, stop=plan.stop)  # fmt: skip
        stats = self._window.stats()
        if result.stopped_s is not None:  # the cut requests should be aborted by now
            stats = dataclasses.replace(stats, left_running=await self._left_running())
        return LevelReplay(result, stats)

    async def _left_running(self, timeout_s: float = 5.0) -> int:
        """Requests the engine still runs or queues, once it has none or `timeout_s` passed."""
        deadline = time.monotonic() + timeout_s
        while True:
            stats = self.engine.stats()
            left = stats.num_running + stats.num_waiting
            if left == 0 or time.monotonic() >= deadline:
                return left
            await asyncio.sleep(0.05)

    async def close(self) -> None:
        if self._started:
            await self.engine.shutdown()
            self._started = False


def _device_name(device: str) -> str:
    """The device engine_lite runs on: `cpu`, or `cuda (GPU name)`."""
    import torch

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda"):
        return f"{device} ({torch.cuda.get_device_name(torch.device(device))})"
    return device
