"""slo: the SLO grammar and `vllm bench serve`'s metric definitions; pure, no I/O."""

from slo.evaluate import SLOReport, TermResult, evaluate, is_good, term_result
from slo.grammar import SLO, Metric, SLOError, SLOTerm, Stat, parse_slo
from slo.metrics import ClassMetrics, RunMetrics, compute_metrics, metric_samples
from slo.requests import RecordLike, RequestLatency, measured_latencies, request_latency
from slo.stats import LatencySummary, percentile, stat_value

__all__ = [
    "SLO",
    "ClassMetrics",
    "LatencySummary",
    "Metric",
    "RecordLike",
    "RequestLatency",
    "RunMetrics",
    "SLOError",
    "SLOReport",
    "SLOTerm",
    "Stat",
    "TermResult",
    "compute_metrics",
    "evaluate",
    "is_good",
    "measured_latencies",
    "metric_samples",
    "parse_slo",
    "percentile",
    "request_latency",
    "stat_value",
    "term_result",
]
