"""Records to verdicts: one run's `LevelVerdict`, several runs pooled (with intervals), the
capacity interval that re-judges resampled runs, and the keep-up estimate. Every path applies
`LevelVerdict`'s rules to values computed by slo's definitions, so a level gets the same answer
on each."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from slo import SLO, SLOReport
from tuner.measure.bootstrap import (
    Draw,
    RequestSamples,
    bounds,
    pooled_error_rate,
    pooled_term_value,
    term_intervals,
)
from tuner.measure.verdict import (
    Interval,
    LevelVerdict,
    TermVerdict,
    VerdictRules,
    capacity_envelope,
)

# Each capacity resample re-judges every rate; 400 keep the 2.5% tails at 10 draws each.
CAPACITY_RESAMPLES = 400


# Theil-Sen over all pairs is O(n^2) in time and memory: a GPU level of 4000 requests takes ~1 s
# and ~0.5 GB, and the capacity bootstrap re-judges every level hundreds of times. Above this
# many requests the slopes come from pairs half a run apart instead (O(n), long spans, as robust).
ALL_PAIRS_UP_TO = 400


def served_fraction(records: Sequence[Any]) -> float:
    """Share of the offered rate the server sustained (1.0 when it kept up).

    An overloaded server (arrival rate r above its service rate mu) builds a queue that grows
    by r - mu per second, so a request arriving t seconds into the run waits t * (r/mu - 1)
    before its first token. The slope of (first token - scheduled arrival) against the
    scheduled arrival therefore estimates r/mu - 1, and mu/r = 1 / (1 + slope). Prompt lengths
    spread the waits but not their trend. Theil-Sen (the median of pairwise slopes) keeps a few
    long prompts from tilting it. Requests that never produced a token are left out; the error
    rule judges them.

    The slope is read over the second half of the arrivals. A server with free batch slots
    first admits everyone (vLLM's 128 running sequences), and only once they are full does its
    queue grow: over the whole level the flat start halves the slope. On vLLM 0.32 CPU serving
    `chat` at 50 req/s, admitting about 35, the whole level read 0.75-0.85 served (0.85 passes)
    where the second half read 0.59-0.65, as its first-token rate did (0.65-0.75).

    The whole level is read too, and the lower reading counts. A level whose first half brings
    more prefill than its second builds its queue early and carries it: on the built-in engine
    budget 256 / threshold 64 at 16.9 req/s (7.5 req/s served) let first tokens wait 0 to 6.5 s
    over the first half and a flat 6 s over the second, which read 0.89 served there and
    passed; the whole level read 0.52. A server that kept up shows no trend in either.
    """
    points = sorted(
        (r.scheduled_s, r.chunk_times_s[0] - r.scheduled_s)
        for r in records
        if not r.warmup and r.chunk_times_s and math.isfinite(r.scheduled_s)
    )
    if len(points) < 5:
        return 1.0
    middle = (points[0][0] + points[-1][0]) / 2
    late = [p for p in points if p[0] >= middle]
    readings = [_kept_share(points)]
    if len(late) >= 5:
        readings.append(_kept_share(late))
    return min(readings)


def _kept_share(points: list[tuple[float, float]]) -> float:
    """mu / r from the Theil-Sen slope of first-token wait against scheduled arrival."""
    t = np.array([p[0] for p in points])
    wait = np.array([p[1] for p in points])
    i, j = _pairs(t)
    dt = t[j] - t[i]
    keep = dt > 1e-6
    if not keep.any():
        return 1.0  # everything arrived at once: a burst has no sustained rate to judge
    slope = float(np.median((wait[j] - wait[i])[keep] / dt[keep]))
    return 1.0 / (1.0 + slope) if slope > 0 else 1.0


def _pairs(t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Index pairs whose slopes the median is taken over."""
    if len(t) <= ALL_PAIRS_UP_TO:
        return np.triu_indices(len(t), k=1)
    order = np.argsort(t, kind="stable")
    half = len(t) // 2
    return order[: len(t) - half], order[half:]


@dataclass(frozen=True, slots=True)
class Run:
    """One replay of a config at one rate: the unit that is pooled and resampled."""

    rate_rps: float
    records: Sequence[Any]
    schedule_ok: bool = True
    # Stopped early with its SLO already broken (measure/early_stop.py): `records` are what
    # it measured, and the whole run is known to fail.
    stopped: bool = False


def judge_report(report: SLOReport, rate_rps: float, served: float, schedule_ok: bool,
                 rules: VerdictRules) -> LevelVerdict:  # fmt: skip
    """One run's verdict from slo's evaluation of it."""
    terms = tuple(TermVerdict(r.term, float(r.value_s)) for r in report.terms)
    return LevelVerdict(rate_rps, terms, float(report.metrics.error_rate), served,
                        schedule_ok, rules)  # fmt: skip


def judge_runs(runs: Sequence[Run], slo: SLO, rules: VerdictRules, rate_rps: float,
               seed: int | None = None) -> LevelVerdict:  # fmt: skip
    """The runs at `rate_rps` pooled (served fraction: the mean over runs; the schedule: held in
    all); with a `seed`, each term gets its bootstrap interval."""
    if seed is None:
        return _pooled([(run, RequestSamples(run.records), None) for run in runs], slo, rules,
                       rate_rps)  # fmt: skip
    samples = RequestSamples([r for run in runs for r in run.records])
    verdict = _pooled([(run, RequestSamples(run.records), None) for run in runs], slo, rules,
                      rate_rps)  # fmt: skip
    return dataclasses.replace(verdict, terms=term_intervals(samples, slo, seed=seed))


def by_rate(runs: Sequence[Run]) -> dict[float, list[Run]]:
    """Runs grouped by rate, rates ascending."""
    out: dict[float, list[Run]] = {}
    for run in sorted(runs, key=lambda r: r.rate_rps):
        out.setdefault(run.rate_rps, []).append(run)
    return out


def confirmed_capacity(
    runs: Sequence[Run], slo: SLO, rules: VerdictRules, seed: int = 0
) -> tuple[float, dict[float, LevelVerdict]]:
    """The capacity envelope over rates that clear, and the verdict at each rate.

    A rate clears when its runs pooled clear (whole intervals) and each run passes on its own:
    a promise must hold on the next draw, and pooling can hide one that missed (on vLLM CPU a
    capacity confirmed pooled read tpot_p99 32.5, 21.9 and 24.9 ms on three fresh draws,
    limit 30). Where one run misses, that run's verdict is the rate's, so the report names
    what failed; a rate that fails pooled on its point estimates gets no bootstrap."""
    verdicts = {}
    for rate, group in by_rate(runs).items():
        point = judge_runs(group, slo, rules, rate)
        if not point.passed:
            verdicts[rate] = point
            continue
        missed = worst_draw(group, slo, rules, rate)
        verdicts[rate] = missed if missed is not None else judge_runs(group, slo, rules, rate, seed)
    return capacity_envelope((r, v.clears) for r, v in verdicts.items())[0], verdicts


def worst_draw(group: Sequence[Run], slo: SLO, rules: VerdictRules,
               rate_rps: float) -> LevelVerdict | None:  # fmt: skip
    """Of several runs at one rate, the verdict of the one that missed by most (None when
    each passes, or there is only one)."""
    if len(group) < 2:
        return None
    failed = [v for v in (judge_alone(run, slo, rules, rate_rps) for run in group) if not v.passed]
    return min(failed, key=_room, default=None)


def judge_alone(run: Run, slo: SLO, rules: VerdictRules, rate_rps: float) -> LevelVerdict:
    """One run of several at a rate, judged on its own point estimates."""
    return judge_runs([run], slo, rules, rate_rps)


def _room(verdict: LevelVerdict) -> float:
    binding = verdict.binding
    return binding.margin_frac if binding is not None else 0.0


def capacity_interval(
    runs: Sequence[Run], slo: SLO, rules: VerdictRules, n_boot: int = CAPACITY_RESAMPLES,
    seed: int = 0,
) -> Interval:  # fmt: skip
    """Capacity from measured runs, resampling each run's requests: each resample judges every
    rate on point estimates, as a search level is, and takes the capacity envelope."""
    measured = [dataclasses.replace(run, records=[r for r in run.records if not r.warmup])
                for run in runs]  # fmt: skip
    groups = {rate: [(run, RequestSamples(run.records)) for run in group]
              for rate, group in by_rate(measured).items()}  # fmt: skip
    rng = np.random.default_rng(seed)

    def capacity(draw: bool) -> float:
        judged = []
        for rate, group in groups.items():
            if any(run.stopped for run, _ in group):
                # Its few measured requests resampled could miss the violations; the whole
                # run fails, as every draw of it would.
                judged.append((rate, False))
                continue
            parts = [(run, s, s.draw(rng) if draw and len(s) else None) for run, s in group]
            judged.append((rate, _pooled(parts, slo, rules, rate).passed))
        return capacity_envelope(judged)[0]

    point = capacity(draw=False)
    return Interval(point, *bounds(np.array([capacity(draw=True) for _ in range(n_boot)])))


def _pooled(
    parts: Sequence[tuple[Run, RequestSamples, Draw]], slo: SLO, rules: VerdictRules,
    rate_rps: float,
) -> LevelVerdict:  # fmt: skip
    """Point estimates over runs pooled, each run as measured or resampled (`Draw`)."""
    samples = [(s, idx) for _, s, idx in parts]
    terms = tuple(TermVerdict(t, pooled_term_value(samples, t)) for t in slo.terms)
    served = [served_fraction(run.records if idx is None else [run.records[i] for i in idx])
              for run, _, idx in parts]  # fmt: skip
    return LevelVerdict(rate_rps, terms, pooled_error_rate(samples),
                        float(np.mean(served)) if served else 0.0,
                        all(run.schedule_ok for run, _, _ in parts), rules)  # fmt: skip
