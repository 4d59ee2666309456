"""Per-request sampling and stop settings (vLLM's `SamplingParams` names)."""

from __future__ import annotations

from dataclasses import dataclass

from engine_lite.errors import EngineLiteError


@dataclass(slots=True, frozen=True)
class SamplingParams:
    """How one request samples and when it stops; temperature 0 means greedy."""

    max_tokens: int = 16
    min_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        _check_int("max_tokens", self.max_tokens, minimum=1)
        _check_int("min_tokens", self.min_tokens, minimum=0)
        if self.min_tokens > self.max_tokens:
            raise EngineLiteError(
                f"min_tokens={self.min_tokens} exceeds max_tokens={self.max_tokens}; "
                "set min_tokens <= max_tokens"
            )
        if not isinstance(self.temperature, (int, float)) or self.temperature < 0:
            raise EngineLiteError(
                f"temperature={self.temperature!r} is invalid; use 0 (greedy) or a positive number"
            )
        if not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1:
            raise EngineLiteError(f"top_p={self.top_p!r} is invalid; use a number in (0, 1]")
        if self.seed is not None:
            _check_int("seed", self.seed, minimum=0)
        # A list is accepted for convenience; stored as a tuple so params stay hashable.
        stop = tuple(self.stop_token_ids)
        for tok in stop:
            _check_int("stop_token_ids entry", tok, minimum=0)
        object.__setattr__(self, "stop_token_ids", stop)


def _check_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise EngineLiteError(f"{name}={value!r} is invalid; use an integer >= {minimum}")
