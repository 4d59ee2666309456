"""After the search: re-measure the top configs, and the default at the recommended rate.

A searched capacity is where the SLO only just held, and the luckiest of several noisy configs
tends to win; so the top few are measured again, their runs pooled, and each term gets a
bootstrap interval. The default measured once more at the recommended rate answers the plainer
question: at that traffic, would the default have met the SLO?
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from loadgen.stop import StopRule
from slo import SLO
from tuner.measure.bootstrap import goodput_interval
from tuner.measure.early_stop import AllBroken, SloBroken
from tuner.measure.judge import (
    Run,
    capacity_interval,
    confirmed_capacity,
    judge_alone,
    judge_runs,
)
from tuner.measure.meter import LevelRun, Meter
from tuner.measure.verdict import VerdictRules
from tuner.settings import MAX_STEPS_DOWN
from tuner.store.records import Candidate, Mode, Role, SameRateCheck, TrialRecord
from tuner.store.runfiles import SAME_RATE_RECORDS, RunFiles


@dataclass(slots=True)
class Confirmer:
    """Re-measures candidates with the meter the search used."""

    meter: Meter
    files: RunFiles
    mode: Mode
    rate_rps: float | None = None  # --rate mode
    seed: int = 0
    step_factor: float = 1.1  # the rate search's tolerance
    max_steps_down: int = MAX_STEPS_DOWN

    async def confirm(
        self, trial: TrialRecord, repeats: int, deadline_s: float | None = None,
        rivals: Sequence[Candidate] = (), kept_rates: Collection[float] = (),
    ) -> Candidate:  # fmt: skip
        """Repeat the trial's capacity (or --rate) level and build its intervals.

        A capacity sits where the SLO only just held, so a repeat there fails about half the
        time; then the rate steps down (`step_below`, at most `max_steps_down` times) while a
        step could raise the rate that clears, rather than call the config unusable. One that
        cannot beat a confirmed rival is not measured. A draw whose SLO is already broken stops
        (`stop_pool`); a reference's never does at `kept_rates`, where the same-traffic check
        may pool more draws of it.
        """
        rate = candidate_rate(trial, self.mode, self.rate_rps)
        if cannot_win(trial, rivals, self.mode):
            return search_candidate(trial, rate)
        runs = self.files.search_runs(trial)
        measured = 0

        async def measure(at_rps: float, last: bool = True) -> bool:
            nonlocal measured
            if repeats == 0 or (deadline_s is not None and self.meter.clock() >= deadline_s):
                return False
            if measured == 0:
                await self.meter.target.apply(trial.knobs)
            measured += 1
            pool = stop_pool(trial, self.mode, runs, at_rps, last, kept_rates)
            stop = self.meter.stop_failing and pool is not None
            run = await self.meter.level(at_rps, draw=measured,  # not the search's draw
                                         stop_failing=stop, pooled_with=pool or ())  # fmt: skip
            self.files.write_confirm_run(trial.number, measured, run)
            runs.append(run.run())
            return True

        def candidate() -> Candidate:
            slo, rules = self.meter.slo, self.meter.rules
            return build_candidate(trial, runs, rate, measured, slo, rules, self.mode, self.seed)

        # A config another worker found has its search records on that worker's disk: it is
        # measured here as often as it was there at this rate, so every candidate pools as many.
        elsewhere = sum(lv.rate_rps == rate for lv in trial.search_levels) - sum(
            run.rate_rps == rate for run in runs)  # fmt: skip
        draws = repeats + max(0, elsewhere)
        for i in range(draws):
            if any(r.stopped for r in runs if r.rate_rps == rate):
                break  # a draw that missed alone already fails the rate: step down instead
            if not await measure(rate, last=i == draws - 1):
                break
        if not any(run.rate_rps == rate for run in runs):
            return search_candidate(trial, rate)
        cand, probe = candidate(), rate
        for step in range(self.max_steps_down if self.mode is Mode.CAPACITY else 0):
            below = probe / self.step_below(step)
            # Only to a rate above what clears already (a lower search level may).
            if cand.confirmed_rps >= below or step_wasted(trial, cand, probe, below, rivals):
                break
            if not await measure(probe := below):
                break
            cand = candidate()
        return cand

    def step_below(self, step: int) -> float:
        """Half the search's tolerance first (its square root), then all of it: the knee lies
        between the search's last pass and a tolerance above, so a miss at the pass puts it
        just below (vLLM stated 15.35 req/s, 15% under a search pass that missed again)."""
        return math.sqrt(self.step_factor) if step == 0 else self.step_factor


def stop_pool(trial: TrialRecord, mode: Mode, runs: Sequence[Run], rate: float, last: bool,
              kept_rates: Collection[float] = ()) -> list[Any] | None:  # fmt: skip
    """What a re-measurement at `rate` is judged with when it stops once its SLO is already
    broken (measure/early_stop.py): [] for a draw alone, the earlier runs' records at that rate
    for a pooled verdict, None when it runs to the end.

    A searched config's rate clears only if each draw passes alone, so a draw that misses alone
    fails it. A reference's capacity is judged on its runs at a rate pooled, so its draw stops
    only once the pool is certainly over, and only if nothing will join that pool later: the
    last draw planned at the rate, and not a rate in `kept_rates` (where the same-traffic check
    may add draws of the default; a pool cut short there could understate the default, and so
    overstate every ratio over it). --rate mode reads every figure: nothing stops."""
    if mode is not Mode.CAPACITY:
        return None
    if not trial.role.is_reference:
        return []
    if not last or rate in kept_rates:
        return None
    return [r for run in runs if run.rate_rps == rate for r in run.records]


def candidate_rate(trial: TrialRecord, mode: Mode, rate_rps: float | None) -> float:
    """Where a candidate is re-measured: its capacity, or the --rate."""
    if mode is Mode.GOODPUT:
        assert rate_rps is not None
        return rate_rps
    return float(trial.capacity_rps or trial.value or 0.0)


def search_candidate(trial: TrialRecord, rate: float) -> Candidate:
    """A candidate from its search level alone (its records are on another worker's disk and
    nothing was re-measured here): point estimates, no interval, not confirmed."""
    level = trial.level_at(rate) or trial.search_levels[-1]
    return Candidate(trial.number, trial.role, trial.knobs, float(trial.value or 0.0),
                     level.verdict, 0, 0.0)  # fmt: skip


def build_candidate(
    trial: TrialRecord, runs: Sequence[Run], rate: float, repeats: int, slo: SLO,
    rules: VerdictRules, mode: Mode, seed: int = 0,
) -> Candidate:  # fmt: skip
    """A candidate from measured runs (no new measurement): its terms are those at the
    confirmed rate, or at `rate` when nothing clears."""
    confirmed, verdicts = confirmed_capacity(runs, slo, rules, seed)
    at = confirmed or rate
    verdict = verdicts.get(at)
    if verdict is None or not verdict.passed:  # every term the report shows has its interval
        verdict = judge_runs([r for r in runs if r.rate_rps == at], slo, rules, at, seed)
    cand = Candidate(trial.number, trial.role, trial.knobs, float(trial.value or 0.0), verdict,
                     repeats, confirmed)  # fmt: skip
    if mode is Mode.GOODPUT:
        records = [r for run in runs if run.rate_rps == at for r in run.records]
        cand.goodput_ci = goodput_interval(records, slo, seed=seed)
    else:
        cand.capacity_ci = capacity_interval(runs, slo, rules, seed=seed)
    return cand


def repooled(candidates: list[Candidate], default: TrialRecord, files: RunFiles, mode: Mode,
             rate_rps: float | None, slo: SLO, rules: VerdictRules, draws: int,
             seed: int = 0) -> list[Candidate]:  # fmt: skip
    """The candidates with the default judged on every run kept of it, its `draws` at the
    recommended rate too: a default that missed there cannot claim a capacity above it.

    Only when this folder holds every level of the default's search: a default another worker
    measured keeps the figures the study has for it, since judged on this folder's draws alone
    its terms at its own capacity would have no records behind them."""
    search_runs = files.search_runs(default)
    if len(search_runs) < len(default.search_levels):
        return candidates
    mine = next((c for c in candidates if c.trial == default.number), None)
    runs = search_runs + files.confirm_runs(default.number)
    rate = candidate_rate(default, mode, rate_rps)
    repeats = (mine.repeats if mine else 0) + draws
    fresh = build_candidate(default, runs, rate, repeats, slo, rules, mode, seed)
    return [c for c in candidates if c.trial != default.number] + [fresh]


def confirm_order(trials: list[TrialRecord]) -> list[TrialRecord]:
    """The best search capacity first, so that a config which cannot beat one already
    confirmed is not measured (`cannot_win`); the references after, the default last, so the
    same-traffic check that follows finds the default's server up (vLLM's 45-75 s start)."""

    def rank(t: TrialRecord) -> tuple[int, float]:
        kind = 2 if t.role is Role.DEFAULT else 1 if t.role.is_reference else 0
        return kind, -float(t.capacity_rps or t.value or 0.0)

    return sorted(trials, key=rank)


def cannot_win(trial: TrialRecord, confirmed: Sequence[Candidate], mode: Mode) -> bool:
    """A config that could not be chosen over one confirmed already, so it is not re-measured
    here: confirmation only steps down from a search capacity.

    A searched config whose search capacity is at most the best confirmed rate. The default
    whose search capacity is below it: the same-traffic check that follows measures the default
    at the winner's rate (tuner/run.py), and its figure is judged on its search with those
    draws pooled in. Its own confirmation could only lower that figure: in 12 of 17 built-in
    runs its draw at its search capacity missed and a second level a step lower set the
    figure, two levels (18 s) that changed no choice. The rule of thumb is always confirmed:
    the report states its capacity and nothing else measures it again."""
    if mode is not Mode.CAPACITY or trial.role is Role.RULE_OF_THUMB:
        return False
    best = max((c.confirmed_rps for c in confirmed), default=0.0)
    search = float(trial.capacity_rps or trial.value or 0.0)
    if trial.role is Role.DEFAULT:
        return best > search
    return best > 0 and search <= best


def step_wasted(trial: TrialRecord, cand: Candidate, probe: float, below: float,
                rivals: Sequence[Candidate]) -> bool:  # fmt: skip
    """Whether stepping down from `probe` to `below` could change neither the choice nor a
    figure the report states, because a rival is confirmed already above what this one could
    clear (`rivals` is empty under --robust, whose choice goes by the traffic band).

    A searched config clearing below a rival's confirmed rate could not be chosen (`choose`):
    one built-in run stepped 432 / 224 from 11.36 to 9.88 and 8.59 req/s beside 432 confirmed
    at 10.18, two levels for nothing. A reference (the default, the rule of thumb) is reported
    at the highest rate its pooled runs pass on point estimates, so once they pass at `probe`
    and a searched config cleared above it, a lower rate changes nothing either: on vLLM the
    default passed on 3 draws at 19.16 req/s beside 768 / 384 confirmed at 27.45, and two more
    levels at 16.66 and 14.49 (43 s) only made its interval clear there. The default, once its
    pooled runs pass at `probe` beside any rival, is kept over a searched config that clears at
    or below that figure and loses to one clearing above it (`choose`), whatever a lower level
    reads: two built-in runs stepped it from 7.82 to 6.80 and from 8.14 to 7.07 req/s after it
    had passed there on both draws."""
    best = max((c.confirmed_rps for c in rivals), default=0.0)
    if not trial.role.is_reference:
        return below < best
    passes = cand.capacity_ci is not None and cand.capacity_ci.point >= probe
    if trial.role is Role.DEFAULT and rivals:
        return passes
    return passes and best > probe


def worth_checking(
    mode: Mode, chosen: Candidate | None, default: TrialRecord | None, repeats: int
) -> bool:
    """Only in capacity mode, for a confirmed recommendation that is not the default itself,
    and not with --repeats 0 (which asks for no re-measurement at all)."""
    if mode is not Mode.CAPACITY or chosen is None or not chosen.clears or repeats == 0:
        return False
    return default is not None and default.knobs != chosen.knobs


async def default_at_rate(meter: Meter, files: RunFiles, default_knobs: dict, chosen: Candidate,
                          seed: int = 0, draws: int = 1, end_s: float | None = None,
                          trial: int | None = None) -> SameRateCheck:  # fmt: skip
    """Measure the default at the recommendation's confirmed rate on up to `draws` arrival
    draws (the search's and fresh ones, as many as the recommendation pooled), judged pooled
    and each alone, with one more when the draws split evenly between missing and holding;
    a draw after the first starts only if one as long as the last still ends by `end_s`.
    With the default's `trial`, each draw is kept as one of its re-measurements too, so its
    own capacity is judged on everything measured of it.

    A draw stops once its SLO is certainly broken both alone (what the headline counts) and
    pooled with the draws before it and every draw that may follow (what the default's
    capacity is judged on, measure/early_stop.py): the verdicts the whole draws would get. At
    the recommended rate the default is often far past its capacity, and such a draw spent
    most of its time draining the queue it built (a built-in run: three draws to the end took
    37 s of a 3-minute run)."""
    rate = chosen.verdict.rate_rps
    slo, rules = meter.slo, meter.rules
    await meter.target.apply(default_knobs)
    most = draws + (draws % 2 == 0)  # an even count may split and take one more
    size = len(meter.settings.requests_at(meter.requests, rate))

    def stop(runs: list[LevelRun]) -> StopRule | None:
        pool = [r for run in runs for r in run.records]
        alone = SloBroken.of(slo)
        pooled = SloBroken.of(slo, pool, room=(most - len(runs) - 1) * size)
        return AllBroken((alone, pooled)) if alone is not None and pooled is not None else None

    async def draw(runs: list[LevelRun]) -> LevelRun:
        return await meter.level(rate, draw=len(runs), stop_failing=meter.stop_failing,
                                 stop_rule=stop(runs))  # fmt: skip

    started = meter.clock()
    runs = [await draw([])]
    missed = int(not judge_alone(runs[0].run(), slo, rules, rate).passed)
    # As many draws missed as held (a tie): one more decides.
    while len(runs) < draws or (len(runs) == draws and 2 * missed == len(runs)):
        last_s, started = meter.clock() - started, meter.clock()
        if end_s is not None and started + last_s > end_s:
            break
        runs.append(await draw(runs))
        missed += not judge_alone(runs[-1].run(), slo, rules, rate).passed
    files.write_records(files.root / SAME_RATE_RECORDS, [r for run in runs for r in run.records])
    if trial is not None:
        first = files.confirm_run_count(trial) + 1
        for i, run in enumerate(runs):
            files.write_confirm_run(trial, first + i, run)
    default = judge_runs([run.run() for run in runs], slo, rules, rate, seed)
    stopped = sum(run.level.stopped_s is not None for run in runs)
    return SameRateCheck(rate, default, chosen.verdict, chosen.repeats, len(runs), missed,
                         stopped)  # fmt: skip
