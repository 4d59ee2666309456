"""Does a config hold at a rate? The one `LevelVerdict` that the search, the confirmation, the
same-traffic check, the report and `tune bench` all read, and the one capacity envelope. Pure:
no records, no I/O."""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable
from dataclasses import dataclass

from slo import SLOTerm

# DistServe (OSDI'24) counts capacity only while the service is healthy; a level fails once 1%
# of its requests fail, whatever their latency.
MAX_ERROR_RATE = 0.01
# TPOT and ITL exclude queueing, so without a keep-up rule a config that starves prefills (a
# tiny budget, decode first) would "meet" a TPOT SLO at any rate while its queue grows without
# bound. measure/judge.py's served_fraction estimates the share of the offered rate served.
MIN_SERVED_FRACTION = 0.85


class Failure(enum.StrEnum):
    """Why a level failed, in the order a report names them."""

    ERRORS = "errors"  # too many requests failed
    SLO = "slo"  # a term over its limit (or, for `clears`, its interval reaching over)
    QUEUE = "queue"  # completions fell behind arrivals
    SCHEDULE = "schedule"  # the load generator fell behind: a measurement failure


@dataclass(frozen=True, slots=True)
class VerdictRules:
    """The rules beyond the SLO terms; one instance per run, shared by every phase."""

    max_error_rate: float = MAX_ERROR_RATE
    min_served_fraction: float = MIN_SERVED_FRACTION
    # vLLM's goodput at a fixed --rate already pays for a queue; capacity needs the rule.
    require_keep_up: bool = True
    # In process the engine stamps chunk times itself, so a lagging client cannot skew them.
    require_schedule: bool = True


@dataclass(frozen=True, slots=True)
class Interval:
    """A point estimate with its two-sided bootstrap interval."""

    point: float
    low: float
    high: float


@dataclass(frozen=True, slots=True)
class TermVerdict:
    """One SLO term at one level: its value, its limit and, when re-measured, its interval."""

    term: SLOTerm
    value_s: float  # inf when no request succeeded
    interval_s: Interval | None = None

    @property
    def name(self) -> str:
        """`tpot_p99`: the metric and statistic."""
        return self.term.name

    @property
    def limit_s(self) -> float:
        return self.term.limit_s

    @property
    def holds(self) -> bool:
        return self.value_s <= self.limit_s

    @property
    def clears(self) -> bool:
        """The point and the whole interval hold (the point alone when there is no interval)."""
        high = self.interval_s.high if self.interval_s else self.value_s
        return self.holds and high <= self.limit_s

    @property
    def margin_frac(self) -> float:
        """(limit - value) / limit: negative when violated."""
        return (self.limit_s - self.value_s) / self.limit_s


@dataclass(frozen=True, slots=True)
class LevelVerdict:
    """Whether one config held at one rate, over one run or several pooled."""

    rate_rps: float
    terms: tuple[TermVerdict, ...]
    error_rate: float
    served_fraction: float  # completion rate / arrival rate (1.0 when the server kept up)
    schedule_ok: bool
    rules: VerdictRules

    @property
    def slo_met(self) -> bool:
        return all(t.holds for t in self.terms)

    @property
    def kept_up(self) -> bool:
        return self.served_fraction >= self.rules.min_served_fraction

    @property
    def passed(self) -> bool:
        """Every rule holds on the point estimates (what a search level is judged by)."""
        return self.failure() is None

    @property
    def clears(self) -> bool:
        """Every rule holds with each term's whole interval (what a confirmation asks)."""
        return self.failure(whole_interval=True) is None

    @property
    def binding(self) -> TermVerdict | None:
        """The term with the least room left."""
        return min(self.terms, key=lambda t: t.margin_frac, default=None)

    def failure(self, whole_interval: bool = False) -> Failure | None:
        """The first rule this level breaks, or None."""
        rules = self.rules
        if self.error_rate >= rules.max_error_rate:
            return Failure.ERRORS
        if not all(t.clears if whole_interval else t.holds for t in self.terms):
            return Failure.SLO
        if rules.require_keep_up and not self.kept_up:
            return Failure.QUEUE
        if rules.require_schedule and not self.schedule_ok:
            return Failure.SCHEDULE
        return None

    def reason(self) -> str:
        """What failed, in words: 'tpot_p99 41.2 ms over its limit at 12.00 req/s'."""
        at = f"at {self.rate_rps:.2f} req/s"
        failure = self.failure()
        if failure is Failure.ERRORS:
            return f"errors: {self.error_rate:.0%} of requests failed {at}"
        if failure is Failure.SLO and (term := self.binding) is not None:
            value = f" {term.value_s * 1e3:.1f} ms" if math.isfinite(term.value_s) else ""
            return f"{term.name}{value} over its limit {at}"
        if failure is Failure.QUEUE:
            served = f"{self.served_fraction:.1%}"
            return f"queue: completions kept pace with only {served} of arrivals {at}"
        if failure is Failure.SCHEDULE:
            return f"the load generator fell behind its schedule {at}"
        return f"nothing: it held {at}"


def capacity_envelope(levels: Iterable[tuple[float, bool]]) -> tuple[float, float]:
    """(capacity, upper bound) from (rate, passed): the highest passing rate below the lowest
    failing one (0 if none) and that failing rate (inf if none). Noise can pass a rate above a
    failure; the first failure bounds capacity regardless."""
    levels = list(levels)
    upper = min((rate for rate, ok in levels if not ok), default=math.inf)
    capacity = max((rate for rate, ok in levels if ok and rate < upper), default=0.0)
    return capacity, upper
