"""Per-request latency values from one record, as `vllm bench serve` derives them."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol


class RecordLike(Protocol):
    """The `RequestRecord` fields slo reads (by attribute, so it imports nothing of ours)."""

    index: int
    class_name: str
    prompt_len: int
    output_len: int
    scheduled_s: float
    sent_s: float
    chunk_times_s: Sequence[float]
    chunk_tokens: Sequence[int]
    prompt_tokens: int
    output_tokens: int
    success: bool
    error: str | None
    warmup: bool


@dataclass(slots=True, frozen=True)
class RequestLatency:
    """One measured request's values, in seconds; latency fields are NaN for failures."""

    index: int
    class_name: str
    ok: bool
    prompt_tokens: int
    output_tokens: int
    sent_s: float
    end_s: float
    ttft_s: float
    tpot_s: float | None  # None when output_tokens <= 1, as in vLLM
    itls_s: tuple[float, ...]
    e2el_s: float
    ttft_from_scheduled_s: float
    e2el_from_scheduled_s: float
    send_lag_s: float

    @property
    def max_itl_s(self) -> float:
        """The request's largest token gap: its per-request ITL value for goodput (0 if none)."""
        return max(self.itls_s) if self.itls_s else 0.0

    @property
    def goodput_tpot_s(self) -> float:
        """TPOT for the goodput check; vLLM counts a request with <= 1 output token as 0."""
        return 0.0 if self.tpot_s is None else self.tpot_s


def request_latency(rec: Any) -> RequestLatency:
    """Derive one record's values the way vLLM's request functions and `calculate_metrics` do.

    vllm/benchmarks/lib/endpoint_request_func.py: `st` is taken right before the POST; TTFT is
    the first token-bearing chunk minus `st`; each later chunk appends one ITL (gap to the
    previous chunk); latency (E2EL) is the last chunk minus `st`. vllm/benchmarks/serve.py
    `calculate_metrics`: output_len comes from the server's usage; TPOT = (E2EL - TTFT) /
    (output_len - 1), only when output_len > 1.
    """
    times = [float(t) for t in rec.chunk_times_s]
    ok = bool(rec.success) and len(times) > 0
    sent, sched = float(rec.sent_s), float(rec.scheduled_s)
    out_tokens = int(rec.output_tokens) or int(sum(rec.chunk_tokens))
    prompt_tokens = int(rec.prompt_tokens) or int(rec.prompt_len)
    end = _end_time(rec, times, sent)
    if not ok:
        nan = math.nan
        return RequestLatency(
            rec.index, rec.class_name, False, prompt_tokens, out_tokens, sent, end,
            nan, None, (), nan, nan, nan, sent - sched,
        )  # fmt: skip
    ttft, e2el = times[0] - sent, times[-1] - sent
    tpot = (e2el - ttft) / (out_tokens - 1) if out_tokens > 1 else None
    itls = tuple(b - a for a, b in itertools.pairwise(times))
    return RequestLatency(
        index=rec.index,
        class_name=rec.class_name,
        ok=True,
        prompt_tokens=prompt_tokens,
        output_tokens=out_tokens,
        sent_s=sent,
        end_s=end,
        ttft_s=ttft,
        tpot_s=tpot,
        itls_s=itls,
        e2el_s=e2el,
        ttft_from_scheduled_s=times[0] - sched,
        e2el_from_scheduled_s=times[-1] - sched,
        send_lag_s=sent - sched,
    )


def measured_latencies(records: Iterable[Any]) -> list[RequestLatency]:
    """Values for every record that is not a warm-up request, in the given order."""
    return [request_latency(r) for r in records if not getattr(r, "warmup", False)]


def _end_time(rec: Any, times: list[float], sent: float) -> float:
    # A record may carry when it ended (success or failure); else its last chunk or its send.
    finished = getattr(rec, "finished_s", None)
    if finished is not None and math.isfinite(finished):
        return float(finished)
    return times[-1] if times else sent
