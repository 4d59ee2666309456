"""The SLO grammar: `metric_stat=value[unit]` terms joined by commas, e.g. `tpot_p99=30ms`."""

from __future__ import annotations

import enum
import math
import re
from dataclasses import dataclass, field


class SLOError(ValueError):
    """A malformed SLO string or term; the message names the bad term and the fix."""


class Metric(enum.StrEnum):
    """Latency metrics as `vllm bench serve` defines them (see slo/metrics.py)."""

    TTFT = "ttft"
    TPOT = "tpot"
    ITL = "itl"
    E2EL = "e2el"


class Stat(enum.StrEnum):
    """The statistic a term limits: a percentile of the run's distribution, or its mean."""

    P50 = "p50"
    P90 = "p90"
    P95 = "p95"
    P99 = "p99"
    P999 = "p99.9"
    MEAN = "mean"

    @property
    def percentile(self) -> float | None:
        """The percentile in 0..100, or None for the mean."""
        return None if self is Stat.MEAN else float(self.value[1:])


_UNIT_TO_S = {"ms": 1e-3, "s": 1.0}
_TERM_EXAMPLE = "write terms like tpot_p99=30ms or ttft_p99=2s"
# Possessive quantifiers: with plain ones a long run of digits followed by a stray character
# backtracks quadratically (10 kB took seconds). Numbers are `3`, `3.5` or `.5`, optional `e-3`.
_VALUE_RE = re.compile(
    r"^(?P<num>(?:[0-9]++(?:\.[0-9]++)?|\.[0-9]++)(?:e[+-]?+[0-9]++)?+)(?P<unit>[a-z]*+)$"
)
_ECHO_CHARS = 60  # an error quotes at most this much of what the user typed


@dataclass(slots=True, frozen=True)
class SLOTerm:
    """One limit: `stat` of `metric` over a run must be <= `limit_s` seconds."""

    metric: Metric
    stat: Stat
    limit_s: float

    def __post_init__(self) -> None:
        if not math.isfinite(self.limit_s) or self.limit_s <= 0:
            raise SLOError(
                f"SLO limit {self.limit_s!r} s for {self.metric}_{self.stat} is invalid; "
                "use a positive finite number"
            )

    @property
    def name(self) -> str:
        """The term's left-hand side, e.g. `tpot_p99`."""
        return f"{self.metric.value}_{self.stat.value}"

    def __str__(self) -> str:
        return f"{self.name}={_format_ms(self.limit_s)}ms"


@dataclass(slots=True, frozen=True)
class SLO:
    """A set of terms that must all hold; at most one term per (metric, stat)."""

    terms: list[SLOTerm] = field(default_factory=list)

    def __str__(self) -> str:
        return ",".join(str(t) for t in self.terms)

    def limit_for(self, metric: Metric) -> float | None:
        """Strictest limit on `metric` across terms: the per-request bound used for goodput."""
        limits = [t.limit_s for t in self.terms if t.metric is metric]
        return min(limits) if limits else None


def parse_slo(text: str) -> SLO:
    """Parse `tpot_p99=30ms,ttft_p99=2s` into an `SLO`; raise `SLOError` naming any bad term."""
    if not isinstance(text, str) or not text.strip():
        raise SLOError(f"SLO {_echo(text)} is empty; {_TERM_EXAMPLE}")
    terms: list[SLOTerm] = []
    seen: set[str] = set()
    for raw in text.split(","):
        term = parse_term(raw)
        if term.name in seen:
            raise SLOError(
                f"SLO term {_echo(raw.strip())} repeats {term.name}; give each metric_stat once"
            )
        seen.add(term.name)
        terms.append(term)
    return SLO(terms=terms)


def parse_term(raw: str) -> SLOTerm:
    """Parse one `metric_stat=value[unit]` term."""
    text = raw.strip().lower()
    if not text:
        raise SLOError(f"SLO has an empty term (a stray comma?); {_TERM_EXAMPLE}")
    if text.count("=") != 1:
        raise SLOError(f"SLO term {_echo(raw.strip())} needs exactly one '='; {_TERM_EXAMPLE}")
    lhs, rhs = (part.strip() for part in text.split("="))
    metric, stat = _parse_lhs(raw.strip(), lhs)
    return SLOTerm(metric=metric, stat=stat, limit_s=_parse_value(raw.strip(), rhs))


def _parse_lhs(raw: str, lhs: str) -> tuple[Metric, Stat]:
    metric_txt, sep, stat_txt = lhs.partition("_")
    metrics = ", ".join(m.value for m in Metric)
    stats = ", ".join(s.value for s in Stat)
    if not sep:
        raise SLOError(f"SLO term {_echo(raw)} needs metric_stat on the left, e.g. tpot_p99")
    try:
        metric = Metric(metric_txt)
    except ValueError:
        raise SLOError(
            f"SLO term {_echo(raw)} has unknown metric {_echo(metric_txt)}; use one of {metrics}"
        ) from None
    try:
        stat = Stat(stat_txt)
    except ValueError:
        raise SLOError(
            f"SLO term {_echo(raw)} has unknown statistic {_echo(stat_txt)}; use one of {stats}"
        ) from None
    return metric, stat


def _parse_value(raw: str, rhs: str) -> float:
    match = _VALUE_RE.match(rhs.replace(" ", ""))
    if match is None:
        raise SLOError(
            f"SLO term {_echo(raw)} has value {_echo(rhs)}, not a positive number with optional "
            "unit; write e.g. 30ms, 0.5s or 30 (ms)"
        )
    unit = match["unit"] or "ms"
    if unit not in _UNIT_TO_S:
        raise SLOError(f"SLO term {_echo(raw)} has unknown unit {_echo(unit)}; use ms or s")
    value_s = float(match["num"]) * _UNIT_TO_S[unit]
    if not math.isfinite(value_s) or value_s <= 0:
        raise SLOError(
            f"SLO term {_echo(raw)} has limit {_echo(rhs)}; use a positive finite number"
        )
    return value_s


def _echo(text: str) -> str:
    """`text` quoted for an error message, cut short: a pasted blob must not flood the line."""
    return repr(text if len(text) <= _ECHO_CHARS else text[:_ECHO_CHARS] + "...")


def _format_ms(limit_s: float) -> str:
    """Shortest decimal that round-trips, so `str(slo)` parses back to the same limits."""
    return repr(limit_s * 1e3).removesuffix(".0")
