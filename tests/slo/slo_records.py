"""A record type for slo tests: any object with `RequestRecord`'s attributes will do."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Rec:
    index: int
    sent_s: float
    chunk_times_s: list[float]
    output_tokens: int
    prompt_len: int = 100
    class_name: str = "short"
    scheduled_s: float | None = None
    chunk_tokens: list[int] = field(default_factory=list)
    prompt_tokens: int = 0
    output_len: int = 0
    success: bool = True
    error: str | None = None
    warmup: bool = False
    finished_s: float | None = None

    def __post_init__(self) -> None:
        if self.scheduled_s is None:
            self.scheduled_s = self.sent_s
        if not self.chunk_tokens:
            self.chunk_tokens = [1] * len(self.chunk_times_s)
