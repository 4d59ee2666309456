"""Run-level metrics (`RunMetrics`) with `vllm bench serve`'s definitions, plus per-class views."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from slo.grammar import Metric
from slo.requests import RequestLatency, measured_latencies
from slo.stats import LatencySummary

# Percentiles written to the vLLM-shaped dict; vLLM names them p{int} or p{float} ("p99.9").
VLLM_PERCENTILES = (90.0, 95.0, 99.0, 99.9)


@dataclass(slots=True, frozen=True)
class ClassMetrics:
    """One request class's (e.g. "short" / "long" prompts) share of a run."""

    class_name: str
    requests: int
    completed: int
    failed: int
    ttft: LatencySummary
    tpot: LatencySummary
    itl: LatencySummary
    e2el: LatencySummary
    ttft_from_scheduled: LatencySummary

    @property
    def error_rate(self) -> float:
        return self.failed / self.requests if self.requests else 0.0


@dataclass(slots=True, frozen=True)
class RunMetrics:
    """A run's metrics, seconds throughout; warm-up requests are excluded."""

    completed: int
    failed: int
    total_input_tokens: int
    total_output_tokens: int
    duration_s: float
    request_throughput: float
    output_throughput: float
    total_token_throughput: float
    ttft: LatencySummary
    tpot: LatencySummary
    itl: LatencySummary
    e2el: LatencySummary
    # Latency from the *scheduled* arrival: client-side queueing cannot hide in these.
    ttft_from_scheduled: LatencySummary
    e2el_from_scheduled: LatencySummary
    send_lag: LatencySummary
    per_class: dict[str, ClassMetrics] = field(default_factory=dict)

    @property
    def requests(self) -> int:
        return self.completed + self.failed

    @property
    def error_rate(self) -> float:
        """Failed share of measured requests (0 for an empty run)."""
        return self.failed / self.requests if self.requests else 0.0

    def summary(self, metric: Metric) -> LatencySummary:
        return {
            Metric.TTFT: self.ttft,
            Metric.TPOT: self.tpot,
            Metric.ITL: self.itl,
            Metric.E2EL: self.e2el,
        }[metric]

    mean_ttft_s = property(lambda self: self.ttft.mean_s)
    median_ttft_s = property(lambda self: self.ttft.median_s)
    p99_ttft_s = property(lambda self: self.ttft.p99_s)
    mean_tpot_s = property(lambda self: self.tpot.mean_s)
    median_tpot_s = property(lambda self: self.tpot.median_s)
    p99_tpot_s = property(lambda self: self.tpot.p99_s)
    mean_itl_s = property(lambda self: self.itl.mean_s)
    median_itl_s = property(lambda self: self.itl.median_s)
    p99_itl_s = property(lambda self: self.itl.p99_s)
    mean_e2el_s = property(lambda self: self.e2el.mean_s)
    median_e2el_s = property(lambda self: self.e2el.median_s)
    p99_e2el_s = property(lambda self: self.e2el.p99_s)

    def to_vllm_dict(self) -> dict[str, float | int | None]:
        """The keys of `vllm bench serve`'s result JSON (latencies in ms; NaN when no samples).

        `request_goodput` is None here as in vLLM without `--goodput`; `SLOReport` fills it.
        """
        out: dict[str, float | int | None] = {
            "duration": self.duration_s,
            "completed": self.completed,
            "failed": self.failed,
            "total_input_tokens": self.total_input_tokens,
            "total_output_tokens": self.total_output_tokens,
            "request_throughput": self.request_throughput,
            "request_goodput": None,
            "output_throughput": self.output_throughput,
            "total_token_throughput": self.total_token_throughput,
        }
        for metric in Metric:
            s = self.summary(metric)
            out[f"mean_{metric}_ms"] = s.mean_s * 1e3
            out[f"median_{metric}_ms"] = s.median_s * 1e3
            out[f"std_{metric}_ms"] = s.std_s * 1e3
            for q, value in zip(
                VLLM_PERCENTILES, (s.p90_s, s.p95_s, s.p99_s, s.p999_s), strict=True
            ):
                out[f"p{_p_word(q)}_{metric}_ms"] = value * 1e3
        return out


def metric_samples(lats: Iterable[RequestLatency], metric: Metric) -> list[float]:
    """The samples a metric's percentiles pool, as in vLLM's `calculate_metrics`.

    TTFT and E2EL: one per successful request. TPOT: one per successful request with more than
    one output token. ITL: one per gap between token-bearing chunks, pooled over requests.
    """
    ok = [lat for lat in lats if lat.ok]
    if metric is Metric.TTFT:
        return [lat.ttft_s for lat in ok]
    if metric is Metric.E2EL:
        return [lat.e2el_s for lat in ok]
    if metric is Metric.TPOT:
        return [lat.tpot_s for lat in ok if lat.tpot_s is not None]
    return [gap for lat in ok for gap in lat.itls_s]


def compute_metrics(records: Iterable[Any]) -> RunMetrics:
    """Metrics over the non-warm-up records (objects with `RequestRecord`'s attributes)."""
    return metrics_from_latencies(measured_latencies(records))


def metrics_from_latencies(lats: list[RequestLatency]) -> RunMetrics:
    ok = [lat for lat in lats if lat.ok]
    duration = run_duration_s(lats)
    total_in = sum(lat.prompt_tokens for lat in ok)
    total_out = sum(lat.output_tokens for lat in ok)
    # vLLM divides by the benchmark duration and counts successful requests only.
    per_s = (lambda x: x / duration) if duration > 0 else (lambda x: math.nan)
    return RunMetrics(
        completed=len(ok),
        failed=len(lats) - len(ok),
        total_input_tokens=total_in,
        total_output_tokens=total_out,
        duration_s=duration,
        request_throughput=per_s(len(ok)),
        output_throughput=per_s(total_out),
        total_token_throughput=per_s(total_in + total_out),
        ttft=LatencySummary.of(metric_samples(lats, Metric.TTFT)),
        tpot=LatencySummary.of(metric_samples(lats, Metric.TPOT)),
        itl=LatencySummary.of(metric_samples(lats, Metric.ITL)),
        e2el=LatencySummary.of(metric_samples(lats, Metric.E2EL)),
        ttft_from_scheduled=LatencySummary.of([lat.ttft_from_scheduled_s for lat in ok]),
        e2el_from_scheduled=LatencySummary.of([lat.e2el_from_scheduled_s for lat in ok]),
        send_lag=LatencySummary.of([lat.send_lag_s for lat in lats]),
        per_class=_per_class(lats),
    )


def run_duration_s(lats: list[RequestLatency]) -> float:
    """First send to last completion (success or failure) over measured requests; 0 if none."""
    if not lats:
        return 0.0
    return max(lat.end_s for lat in lats) - min(lat.sent_s for lat in lats)


def _per_class(lats: list[RequestLatency]) -> dict[str, ClassMetrics]:
    out: dict[str, ClassMetrics] = {}
    for name in sorted({lat.class_name for lat in lats}):
        group = [lat for lat in lats if lat.class_name == name]
        done = sum(lat.ok for lat in group)
        ok = [lat for lat in group if lat.ok]
        out[name] = ClassMetrics(
            class_name=name,
            requests=len(group),
            completed=done,
            failed=len(group) - done,
            ttft=LatencySummary.of(metric_samples(group, Metric.TTFT)),
            tpot=LatencySummary.of(metric_samples(group, Metric.TPOT)),
            itl=LatencySummary.of(metric_samples(group, Metric.ITL)),
            e2el=LatencySummary.of(metric_samples(group, Metric.E2EL)),
            ttft_from_scheduled=LatencySummary.of([lat.ttft_from_scheduled_s for lat in ok]),
        )
    return out


def _p_word(q: float) -> str:
    # vllm/benchmarks/serve.py: p_word = str(int(p)) if int(p) == p else str(p)
    return str(int(q)) if int(q) == q else str(q)
