"""Plain dataclasses the engine hands out: outputs, token events and statistics."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine_lite.costmodel import StepFeatures


@dataclass(slots=True)
class CompletionOutput:
    """One generated sequence (vLLM's `CompletionOutput`, token ids only)."""

    index: int
    token_ids: list[int]
    finish_reason: str | None  # "stop" | "length" | "abort"; None while unfinished


@dataclass(slots=True)
class RequestStats:
    """Timeline of one request, in monotonic seconds (clock injected by the engine)."""

    request_id: str
    arrival_time_s: float
    first_scheduled_time_s: float | None
    first_token_time_s: float | None
    finish_time_s: float
    num_prompt_tokens: int
    num_output_tokens: int
    finish_reason: str
    token_times_s: list[float] = field(default_factory=list)  # one per output token
    num_preemptions: int = 0


@dataclass(slots=True)
class RequestOutput:
    """Result of one prompt from `LLM.generate` (vLLM's `RequestOutput` shape)."""

    request_id: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestStats | None = None


@dataclass(slots=True)
class TokenEvent:
    """New tokens of one request from one step, as the async API streams them."""

    token_ids: list[int]
    time_s: float  # time.monotonic() when the step that made them ended
    finished: bool
    finish_reason: str | None
    num_prompt_tokens: int
    num_output_tokens: int  # so far, including token_ids


@dataclass(slots=True)
class StepStats:
    """What one engine step did and how long it took."""

    time_s: float
    step_duration_s: float
    forward_duration_s: float
    num_prefill_tokens: int
    num_decode_tokens: int
    num_prefill_reqs: int
    num_decode_reqs: int
    # Time running decodes waited for prefill work in this step: the step's duration times
    # the prefill share of its tokens when it had both kinds, else 0.
    decode_stall_s: float
    num_preemptions: int
    num_running: int
    num_waiting: int
    kv_cache_usage: float
    # What the step computed, as `engine_lite.costmodel` fits step times on.
    features: StepFeatures = field(default_factory=StepFeatures)

    @property
    def sched_overhead_s(self) -> float:
        """Step wall time outside the model forward (scheduling, bookkeeping, events)."""
        return max(0.0, self.step_duration_s - self.forward_duration_s)


@dataclass(slots=True)
class EngineStats:
    """A snapshot of the engine's queues and cache."""

    num_running: int
    num_waiting: int
    kv_cache_usage: float  # 0..1
    num_preemptions_total: int
    num_steps_total: int
