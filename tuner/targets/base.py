"""What every target is: facts the search needs, a knob space, and one load level's replay."""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from loadgen import ReplayResult, RequestRecord, RequestSpec
from loadgen.stop import StopRule
from tuner.errors import TuneError
from tuner.targets.knobs import Knobs, KnobSpace


class TargetKind(enum.StrEnum):
    BUILTIN = "builtin"  # engine_lite in this process
    LAUNCH = "launch"  # a server command started per config
    URL = "url"  # a running server, measured as it is
    VLLM = "vllm"  # real vLLM, started per config with only the flags it accepts
    SYNTHETIC = "synthetic"  # measures nothing: rehearsals and tests of the workers (--synthetic)


@dataclass(frozen=True, slots=True)
class TargetFacts:
    """What the tuner must know about the engine before it builds a space and a workload."""

    kind: TargetKind
    description: str
    model: str
    device: str
    max_model_len: int
    vocab_size: int
    block_size: int  # KV block size: budgets and thresholds round to it
    # In process, chunk times come from the engine itself, so a lagging client loop cannot
    # distort them; over HTTP it can, and such a level must not count as a pass.
    require_schedule: bool


class ServerLost(TuneError):
    """The server stopped answering during a level: it exited, or cannot be reached. Not a
    verdict on the config's capacity, so the level is not judged; its requests (failed ones
    included) travel with the error to be kept. `restartable`: the next config starts a server
    of its own (`--launch`), so the run can go on; a `--url` server cannot come back by itself."""

    def __init__(self, message: str, records: Sequence[RequestRecord] = (),
                 restartable: bool = False) -> None:  # fmt: skip
        super().__init__(message)
        self.records = list(records)
        self.restartable = restartable


@dataclass(frozen=True, slots=True)
class ServerStats:
    """The server's own view of one level (None where the target cannot tell): what explains a
    failed level beyond the client's latencies."""

    preemptions: int | None = None
    kv_cache_usage_max: float | None = None
    kv_cache_usage_mean: float | None = None
    running_max: int | None = None  # most requests in the running set
    waiting_max: int | None = None  # the longest waiting queue: the server fell behind
    tokens_per_step_mean: float | None = None  # vLLM's iteration_tokens over the level
    steps: int | None = None
    # After a level stopped early: requests the server still ran or queued once the wait for
    # it to drop the cut ones ended (0: it did; None: not stopped, or the server did not say).
    left_running: int | None = None

    def describe(self) -> str:
        """The server side of a level in words, or '' when it said nothing."""
        parts = []
        if self.waiting_max:
            parts.append(f"up to {self.waiting_max} requests waiting")
        if self.running_max is not None:
            parts.append(f"up to {self.running_max} running")
        if self.preemptions:
            parts.append(f"{self.preemptions} preemptions")
        if self.kv_cache_usage_max is not None and self.kv_cache_usage_max >= 0.9:
            parts.append(f"KV cache {self.kv_cache_usage_max:.0%} full")
        if self.tokens_per_step_mean is not None:
            parts.append(f"{self.tokens_per_step_mean:.0f} tokens per step")
        if self.left_running:
            parts.append(f"{self.left_running} requests still held after the level stopped: "
                         "the server keeps requests whose client left, so the next level "
                         "shares it with them")  # fmt: skip
        return ", ".join(parts)


@dataclass(slots=True)
class LevelReplay:
    """One level as the target served it: loadgen's replay and the server's own figures."""

    result: ReplayResult
    server: ServerStats


@dataclass(frozen=True, slots=True)
class ReplayPlan:
    """How loadgen replays one level (the arrival times come with it)."""

    timeout_s: float = 120.0
    lag_tolerance_s: float = 0.010  # loadgen's default: p99 loop / send lag allowed
    warmup: int = 0
    # Ends the level early once the outcome is settled (measure/early_stop.py); a target in
    # virtual time may ignore it, since a drain costs it nothing.
    stop: StopRule | None = None


class Target(Protocol):
    """A serving engine the tuner configures per trial and loads per level."""

    facts: TargetFacts
    knobs: KnobSpace

    async def apply(self, knobs: Knobs) -> None:
        """Make the next levels run with these knobs (the rest at the target's defaults)."""

    async def replay(self, requests: Sequence[RequestSpec], offsets: Sequence[float],
                     plan: ReplayPlan) -> LevelReplay:  # fmt: skip
        """Send `requests` at `offsets` seconds from the start; records and server figures."""

    async def close(self) -> None:
        """Release the engine or stop the server."""


def span_s(result: ReplayResult) -> float:
    """Seconds from the replay's start to its last request's end (a level's metrics window)."""
    ends = [r.finished_s for r in result.records if math.isfinite(r.finished_s)]
    ends += [r.chunk_times_s[-1] for r in result.records if r.chunk_times_s]
    return max(0.0, max(ends, default=result.start_s) - result.start_s)
