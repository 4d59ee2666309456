"""Stop a level once its SLO is already broken: no later request can mend a percentile that
the finished ones (with the runs it is pooled with, if any) put over its limit, so draining
the rest only costs time (on a failing level, most of it: the queue it built). Sent to the
load loop as a `loadgen.StopRule`.

Only what is certain stops a level, so its verdict is the one the whole level would get: a
percentile term of a per-request metric (TTFT, TPOT, E2EL) whose finished samples above the
limit are already enough, however many samples the level ends with. Means and ITL (token gaps
pooled over requests, their count unknown before the end) never stop one."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from loadgen import RequestRecord
from loadgen.stop import Finished
from slo import SLO, Metric
from slo.requests import RequestLatency, request_latency

_PER_REQUEST = (Metric.TTFT, Metric.TPOT, Metric.E2EL)
# numpy's linear percentile reads position (n - 1) q / 100; a position a rounding away from a
# whole number is taken as the lower one, so the count asked for is never one short.
_POSITION_EPS = 1e-9


def over_needed(n: int, q: float) -> int:
    """How many of n samples above a limit put their q-th percentile above it (numpy's linear
    method): the sample at the lower interpolation point must be above, and every one after."""
    return n - math.floor((n - 1) * q / 100 - _POSITION_EPS)


@dataclass(frozen=True, slots=True)
class SloBroken:
    """The stop rule: (metric, percentile, limit in seconds) for each term it can decide."""

    terms: tuple[tuple[Metric, float, float], ...]
    # Per term, (samples, over the limit) of the runs this level is pooled with: the verdict
    # judged is the pooled one (a reference's draws at one rate), none for a level alone.
    prior: tuple[tuple[int, int], ...] = ()

    @classmethod
    def of(cls, slo: SLO, pooled_with: Sequence[RequestRecord] = (),
           room: int = 0) -> SloBroken | None:  # fmt: skip
        """`room`: samples that may still join the pool after this level (later draws that
        are not measured yet), counted as if none of them were over the limit."""
        terms = tuple((t.metric, t.stat.percentile, t.limit_s) for t in slo.terms
                      if t.metric in _PER_REQUEST and t.stat.percentile is not None)  # fmt: skip
        if not terms:
            return None
        watch = _Watch(terms, 0)
        for record in pooled_with:
            watch.count(record)
        # Only the most samples the pool can end with is read from the count, so the room
        # joins it: the percentile must be over however clean the later draws come.
        samples = [n + room for n in watch.samples]
        return cls(terms, tuple(zip(samples, watch.over, strict=True)))

    def watch(self, records: Sequence[RequestRecord]) -> Finished | None:
        measured = sum(not r.warmup for r in records)
        return _Watch(self.terms, measured, self.prior).finished if measured else None


class _Watch:
    """One level's counts: finished requests, and per term its samples and those over."""

    def __init__(self, terms: tuple[tuple[Metric, float, float], ...], measured: int,
                 prior: tuple[tuple[int, int], ...] = ()) -> None:  # fmt: skip
        self.terms = terms
        self.unfinished = measured
        self.samples = [n for n, _ in prior] or [0] * len(terms)
        self.over = [o for _, o in prior] or [0] * len(terms)

    def count(self, record: RequestRecord) -> None:
        """Add a finished request's samples (a warm-up request counts in no figure)."""
        if record.warmup:
            return
        lat = request_latency(record)
        for i, (metric, _, limit_s) in enumerate(self.terms):
            value = _value(lat, metric) if lat.ok else None
            if value is not None:
                self.samples[i] += 1
                self.over[i] += value > limit_s

    def finished(self, record: RequestRecord) -> bool:
        if record.warmup:
            return False
        self.unfinished -= 1
        self.count(record)
        broken = False
        for i, (_, q, _) in enumerate(self.terms):
            # over_needed grows with n, so the most samples the level can still end with
            # (each unfinished request adding at most one) asks the most.
            most = self.samples[i] + self.unfinished
            broken |= self.over[i] > 0 and self.over[i] >= over_needed(most, q)
        return broken


@dataclass(frozen=True, slots=True)
class AllBroken:
    """Stops only once every rule would: a draw judged alone and in its pool."""

    rules: tuple[SloBroken, ...]

    def watch(self, records: Sequence[RequestRecord]) -> Finished | None:
        watches = [w for w in (rule.watch(records) for rule in self.rules) if w is not None]
        if not watches or len(watches) < len(self.rules):
            return None

        def finished(record: RequestRecord) -> bool:
            return all([w(record) for w in watches])  # a list: every watch counts the record

        return finished


def _value(lat: RequestLatency, metric: Metric) -> float | None:
    if metric is Metric.TTFT:
        return lat.ttft_s
    if metric is Metric.TPOT:
        return lat.tpot_s
    return lat.e2el_s
