"""Re-measure the top configs (`--repeats`) and recommend the best one whose interval clears.

A capacity found by a rate search is, by construction, a rate where the SLO only just held, and
the luckiest of several noisy configs tends to win the search. So the top few are measured again
at their capacity, the runs are pooled, and each SLO term gets a bootstrap interval; a config's
confirmed capacity is the highest measured rate at which every term's whole interval holds.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from loadgen import RequestSpec
from loadgen.records import RequestRecord
from slo import SLO
from tuner.measure.bootstrap import (
    Interval,
    TermInterval,
    capacity_interval,
    goodput_interval,
    term_intervals,
)
from tuner.measure.keepup import served_fraction
from tuner.measure.level import LevelSettings, measure_level
from tuner.search.study import CONSTRAINTS, ROLE, Role
from tuner.search.trial import CAPACITY, KNOBS, Mode
from tuner.store.runfiles import RunFiles, levels_with_records
from tuner.targets.base import Target


@dataclass
class Candidate:
    """One top config after re-measurement."""

    trial: int
    role: str
    knobs: dict[str, Any]
    value: float  # capacity (req/s) or goodput at --rate, as the search measured it
    rate_rps: float  # where the terms' intervals were taken (the confirmed rate if any)
    terms: list[TermInterval]
    repeats: int
    confirmed_rps: float  # highest measured rate whose every term interval clears (0: none)
    capacity_ci: Interval | None = None
    goodput_ci: Interval | None = None
    error_rate: float = 0.0
    served_fraction: float = 1.0
    records: list[RequestRecord] = field(default_factory=list, repr=False)

    @property
    def clears(self) -> bool:
        return self.confirmed_rps > 0

    def summary(self) -> dict[str, Any]:
        return {
            "trial": self.trial,
            "role": self.role,
            "config": self.knobs,
            "value": self.value,
            "rate_rps": self.rate_rps,
            "repeats": self.repeats,
            "confirmed_rps": self.confirmed_rps,
            "clears": self.clears,
            "error_rate": self.error_rate,
            "served_fraction": self.served_fraction,
            "capacity_ci": self.capacity_ci.as_dict() if self.capacity_ci else None,
            "goodput_ci": self.goodput_ci.as_dict() if self.goodput_ci else None,
            "terms": [term_dict(t) for t in self.terms],
        }


def term_dict(t: TermInterval) -> dict[str, Any]:
    return {
        "term": t.term,
        "metric": t.metric,
        "limit_ms": t.limit_s * 1e3,
        "value_ms": t.value_s.point * 1e3,
        "low_ms": t.value_s.low * 1e3,
        "high_ms": t.value_s.high * 1e3,
        "margin": t.margin_frac,
        "clears": t.clears,
    }


def top_trials(study: optuna.Study, k: int, mode: Mode) -> list[FrozenTrial]:
    """The k best finished trials worth confirming (positive value; feasible in goodput mode)."""
    done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if mode is Mode.GOODPUT:
        done = [t for t in done if all(c <= 0 for c in t.user_attrs.get(CONSTRAINTS, [1.0]))]
    ranked = sorted(
        (t for t in done if t.value is not None and t.value > 0),
        key=lambda t: t.value or 0.0,
        reverse=True,
    )
    seen: set[str] = set()
    unique = []
    for t in ranked:  # the same knobs measured twice (a reference and a search hit) once
        key = repr(sorted(t.user_attrs.get(KNOBS, {}).items()))
        if key not in seen:
            seen.add(key)
            unique.append(t)
    return unique[:k]


@dataclass
class Confirmer:
    """Re-measures candidates against the target the search used."""

    target: Target
    requests: Sequence[RequestSpec]
    slo: SLO
    files: RunFiles
    level_settings: LevelSettings
    mode: Mode
    rate_rps: float | None = None
    seed: int = 0
    step_factor: float = 1.1  # the rate search's tolerance
    max_steps_down: int = 2

    async def confirm(
        self,
        trial: FrozenTrial,
        knobs: dict[str, Any],
        repeats: int,
        deadline_s: float | None = None,
    ) -> Candidate:
        """Repeat the trial's capacity (or --rate) level and build its intervals.

        A capacity sits where the SLO only just held, so a repeat there fails about half the
        time; then the rate steps down by the search's tolerance (at most `max_steps_down`
        times) until the pooled intervals clear, rather than calling the config unusable.
        """
        levels = levels_with_records(self.files, trial)
        rate = self._rate(trial)
        measured = 0

        async def measure(at_rps: float) -> bool:
            nonlocal measured
            if repeats == 0 or (deadline_s is not None and time.monotonic() >= deadline_s):
                return False
            if measured == 0:
                await self.target.apply(knobs)
            level = await measure_level(self.target, self.requests, at_rps, self.slo,
                                        self.level_settings)  # fmt: skip
            measured += 1
            self.files.write_records(
                self.files.confirm_path(trial.number, measured, at_rps), level.records
            )
            levels.append((at_rps, level.records))
            return True

        for _ in range(repeats):
            await measure(rate)
        cand = self.build(trial, knobs, levels, rate, measured)
        probe = rate
        for _ in range(self.max_steps_down if self.mode is Mode.CAPACITY else 0):
            if cand.clears or not await measure(probe := probe / self.step_factor):
                break
            cand = self.build(trial, knobs, levels, rate, measured)
        return cand

    def build(
        self,
        trial: FrozenTrial,
        knobs: dict[str, Any],
        levels: list[tuple[float, list[RequestRecord]]],
        rate: float,
        repeats: int,
    ) -> Candidate:
        """Intervals from measured levels (no new measurement).

        The terms shown are those at the confirmed rate when the config confirmed below `rate`.
        """
        at_rate = [r for lv_rate, recs in levels if lv_rate == rate for r in recs]
        terms = term_intervals(at_rate, self.slo, seed=self.seed)
        error_rate = _error_rate(at_rate)
        served = _served(levels, rate)
        confirmed = self._confirmed_rate(levels, rate, terms, error_rate, served)
        if 0 < confirmed < rate:
            rate = confirmed
            at_rate = [r for lv_rate, recs in levels if lv_rate == rate for r in recs]
            terms = term_intervals(at_rate, self.slo, seed=self.seed)
            error_rate, served = _error_rate(at_rate), _served(levels, rate)
        cand = Candidate(
            trial=trial.number,
            role=trial.user_attrs.get(ROLE, Role.SEARCH.value),
            knobs=knobs,
            value=float(trial.value or 0.0),
            rate_rps=rate,
            terms=terms,
            repeats=repeats,
            confirmed_rps=confirmed,
            error_rate=error_rate,
            served_fraction=served,
            records=at_rate,
        )
        if self.mode is Mode.GOODPUT:
            cand.goodput_ci = goodput_interval(at_rate, self.slo, seed=self.seed)
        else:
            max_err = self.level_settings.max_error_rate
            cand.capacity_ci = capacity_interval(
                levels, self.slo, max_err, self.level_settings.min_served_fraction, seed=self.seed
            )
        return cand

    def _rate(self, trial: FrozenTrial) -> float:
        if self.mode is Mode.GOODPUT:
            assert self.rate_rps is not None
            return self.rate_rps
        return float(trial.user_attrs.get(CAPACITY) or trial.value or 0.0)

    def _confirmed_rate(
        self,
        levels: list[tuple[float, list[RequestRecord]]],
        rate: float,
        terms: list[TermInterval],
        error_rate: float,
        served: float,
    ) -> float:
        if self._holds(terms, error_rate, served):
            return rate
        if self.mode is Mode.GOODPUT:
            return 0.0
        # Fall back to the highest lower level the search measured whose interval clears.
        for lower in sorted({r for r, _ in levels if r < rate}, reverse=True):
            recs = [x for r, rs in levels if r == lower for x in rs]
            lower_terms = term_intervals(recs, self.slo, seed=self.seed)
            if self._holds(lower_terms, _error_rate(recs), _served(levels, lower)):
                return lower
        return 0.0

    def _holds(self, terms: list[TermInterval], error_rate: float, served: float) -> bool:
        settings = self.level_settings
        # vLLM's goodput at a fixed rate already pays for a queue; capacity needs the rule.
        kept_up = self.mode is Mode.GOODPUT or served >= settings.min_served_fraction
        return all(t.clears for t in terms) and error_rate < settings.max_error_rate and kept_up


def _error_rate(records: list[RequestRecord]) -> float:
    measured = [r for r in records if not r.warmup]
    return sum(not r.success for r in measured) / len(measured) if measured else 1.0


def _served(levels: list[tuple[float, list[RequestRecord]]], rate: float) -> float:
    """Mean served fraction of the runs at this rate (each run on its own clock)."""
    runs = [recs for r, recs in levels if r == rate]
    return sum(served_fraction(run) for run in runs) / len(runs) if runs else 0.0


def choose(candidates: list[Candidate]) -> Candidate | None:
    """The best config whose interval clears; else the best point estimate (or None)."""
    clearing = [c for c in candidates if c.clears]
    if clearing:
        return max(clearing, key=lambda c: (c.confirmed_rps, c.value))
    return max(candidates, key=lambda c: c.value, default=None)
