"""One sequence's state as the scheduler, block manager and runner see it."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from engine_lite.sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    """Lifecycle of a request; the FINISHED_* members map to a finish reason."""

    WAITING = enum.auto()
    RUNNING = enum.auto()
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH = enum.auto()
    FINISHED_ABORTED = enum.auto()

    @property
    def is_finished(self) -> bool:
        return self in _FINISH_REASONS

    @property
    def finish_reason(self) -> str | None:
        """vLLM's finish reason strings: "stop", "length", "abort"; None while unfinished."""
        return _FINISH_REASONS.get(self)


_FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
}


@dataclass(slots=True, eq=False)
class Request:
    """A prompt plus the tokens sampled so far, and how much of it has KV in the cache."""

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    arrival_time_s: float
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    block_table: list[int] = field(default_factory=list)
    status: RequestStatus = RequestStatus.WAITING
    # Stats only: recompute preemptions so far, and the engine's timestamps.
    num_preemptions: int = 0
    first_scheduled_time_s: float | None = None
    token_times_s: list[float] = field(default_factory=list)  # one per output token
    # The prompt never changes: its length is read on every scheduling decision.
    _num_prompt: int = field(init=False, repr=False, default=0)

    def __post_init__(self) -> None:
        self._num_prompt = len(self.prompt_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return self._num_prompt

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        return self._num_prompt + len(self.output_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_uncomputed_tokens(self) -> int:
        """Known tokens whose KV is not cached yet (the rest of a prefill, or 1 for a decode)."""
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_prefill(self) -> bool:
        """True while more than the last sampled token still needs computing.

        After a recompute preemption the prompt plus all outputs so far are a prefill again,
        exactly as vLLM V0 treats a recomputed sequence group.
        """
        out = self.output_token_ids
        return not out or self._num_prompt + len(out) - self.num_computed_tokens > 1
