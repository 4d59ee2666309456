"""SLO verdicts: per-term values and margins, vLLM's goodput, attainment, per-class views."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from slo.grammar import SLO, Metric, SLOTerm
from slo.metrics import RunMetrics, metric_samples, metrics_from_latencies, run_duration_s
from slo.requests import RequestLatency, measured_latencies
from slo.stats import stat_value


@dataclass(slots=True, frozen=True)
class TermResult:
    """One term over a run: its measured value and how much room is left.

    `margin_frac` = (limit - value) / limit: 0.2 means 20% under the limit, negative means
    violated. With no successful request the value is +inf (nothing met the limit).
    """

    term: SLOTerm
    value_s: float
    margin_frac: float

    @property
    def met(self) -> bool:
        return self.value_s <= self.term.limit_s


@dataclass(slots=True, frozen=True)
class SLOReport:
    """The verdict of one run against an SLO."""

    slo: SLO
    met: bool
    terms: list[TermResult]
    binding: TermResult  # the term with the smallest margin
    goodput_rps: float  # vLLM's request_goodput: good requests / duration
    attainment: float  # share of measured requests (failures count) meeting every bound
    metrics: RunMetrics
    class_terms: dict[str, list[TermResult]] = field(default_factory=dict)
    class_attainment: dict[str, float] = field(default_factory=dict)

    def to_vllm_dict(self) -> dict[str, Any]:
        """`RunMetrics.to_vllm_dict()` with `request_goodput` filled, plus verdict and margins."""
        out: dict[str, Any] = self.metrics.to_vllm_dict()
        out["request_goodput"] = self.goodput_rps
        out["slo"] = str(self.slo)
        out["slo_met"] = self.met
        out["slo_attainment"] = self.attainment
        out["slo_binding_term"] = self.binding.term.name
        for res in self.terms:
            out[f"slo_margin_{res.term.name}"] = res.margin_frac
        out["slo_terms"] = [_term_dict(res) for res in self.terms]
        return out


def evaluate(records: Iterable[Any], slo: SLO) -> SLOReport:
    """Judge the non-warm-up records against `slo`.

    A run meets the SLO when every term's statistic over the run is <= its limit (DESIGN.md).
    Errors do not fail a term by themselves; callers read `metrics.error_rate` for that.
    """
    if not slo.terms:
        raise ValueError("evaluate() needs an SLO with at least one term")
    lats = measured_latencies(records)
    metrics = metrics_from_latencies(lats)
    terms = [term_result(lats, t) for t in slo.terms]
    good = [is_good(lat, slo) for lat in lats]
    duration = run_duration_s(lats)
    classes = sorted({lat.class_name for lat in lats})
    return SLOReport(
        slo=slo,
        met=all(r.met for r in terms),
        terms=terms,
        binding=min(terms, key=lambda r: r.margin_frac),
        goodput_rps=sum(good) / duration if duration > 0 else math.nan,
        attainment=sum(good) / len(lats) if lats else 0.0,
        metrics=metrics,
        class_terms={c: [term_result(_of(lats, c), t) for t in slo.terms] for c in classes},
        class_attainment={c: _attainment(_of(lats, c), slo) for c in classes},
    )


def term_result(lats: list[RequestLatency], term: SLOTerm) -> TermResult:
    """The term's statistic over the run's pooled samples of its metric."""
    samples = metric_samples(lats, term.metric)
    if samples:
        value = stat_value(samples, term.stat)
    elif any(lat.ok for lat in lats):
        # Requests finished but the metric has no samples (one-token outputs have no TPOT,
        # one-chunk streams no ITL): vLLM counts such a request's TPOT as 0 for goodput.
        value = 0.0
    else:
        value = math.inf
    return TermResult(term=term, value_s=value, margin_frac=(term.limit_s - value) / term.limit_s)


def is_good(lat: RequestLatency, slo: SLO) -> bool:
    """Does one request meet every per-request bound? (vLLM's goodput test, extended to ITL.)

    vllm/benchmarks/serve.py `calculate_metrics`: a request is good when each of its ttft,
    tpot (0 when output_len <= 1) and e2el is <= the bound. For ITL we use the request's
    largest gap. Several terms on one metric bound it by the strictest limit.
    """
    if not lat.ok:
        return False
    values = {
        Metric.TTFT: lat.ttft_s,
        Metric.TPOT: lat.goodput_tpot_s,
        Metric.ITL: lat.max_itl_s,
        Metric.E2EL: lat.e2el_s,
    }
    for metric, value in values.items():
        limit = slo.limit_for(metric)
        if limit is not None and value > limit:
            return False
    return True


def _attainment(lats: list[RequestLatency], slo: SLO) -> float:
    return sum(is_good(lat, slo) for lat in lats) / len(lats) if lats else 0.0


def _of(lats: list[RequestLatency], class_name: str) -> list[RequestLatency]:
    return [lat for lat in lats if lat.class_name == class_name]


def _term_dict(res: TermResult) -> dict[str, Any]:
    return {
        "term": res.term.name,
        "limit_ms": res.term.limit_s * 1e3,
        "value_ms": res.value_s * 1e3,
        "margin": res.margin_frac,
        "met": res.met,
    }
