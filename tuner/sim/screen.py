"""Screening: the capacity of many configs in virtual time, ranked.

Every config of a grid over the searched knobs gets a full capacity search on the `SimTarget`
(the same request list, arrivals, level lengths, verdicts and rate search as a real trial, with
a finer rate tolerance, since a simulated level costs milliseconds). The grid follows the
structure of the problem: budgets spaced evenly in log space across the searched range, and at
each budget the threshold off or at a few fractions of the budget, with and without the
adaptive floor, and each policy the target has.
"""

from __future__ import annotations

import asyncio
import itertools
import multiprocessing
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

from engine_lite import Policy
from engine_lite.defaults import usable_cores
from tuner.measure.meter import Meter
from tuner.measure.ratesearch import RateSearchSettings
from tuner.search.space import BUDGET, THRESHOLD, Choices, IntRange, SearchSpace
from tuner.sim.target import SimTarget
from tuner.targets.knobs import Knobs

GRID_BUDGETS = 10
THRESHOLD_FRACTIONS = (1 / 16, 1 / 8, 1 / 4, 1 / 2)
SIM_REL_TOL = 0.04
ADAPTIVE = "long_prefill_token_threshold_adaptive"
# Configs screened one after another, each search starting where the last ended. A split this
# size (not the number of cores) decides every search's start, so the figures are the same on
# one core or many; each chain costs a cold start of a few simulated levels.
CHAIN = 6


@dataclass(frozen=True, slots=True)
class Screened:
    """One config's simulated capacity (req/s within the SLO) and the levels it took."""

    knobs: Knobs
    capacity_rps: float
    levels: int


@dataclass(frozen=True, slots=True)
class Screening:
    ranked: list[Screened]  # best first
    wall_s: float

    def top(self, k: int, exclude: list[Knobs] | None = None) -> list[Screened]:
        skip = exclude or []
        return [s for s in self.ranked if s.knobs not in skip][:k]


def budgets(space: SearchSpace, count: int = GRID_BUDGETS) -> list[int]:
    """Budgets evenly spaced in log space across the searched range (the default's if none)."""
    domain = space.domains.get(BUDGET)
    if not isinstance(domain, IntRange):
        return [space.default_config()[BUDGET]]
    ratio = (domain.high / domain.low) ** (1 / max(1, count - 1))
    base = space.default_config()
    raw = [round(domain.low * ratio**i) for i in range(count)]
    return sorted({space.normalise({**base, BUDGET: b})[BUDGET] for b in raw})


def grid(space: SearchSpace, at_budgets: list[int], thresholds: bool) -> list[Knobs]:
    """The configs at these budgets: threshold off, or (with `thresholds`) at fractions of the
    budget with and without the adaptive floor; each policy the target has. The default first."""
    base = space.default_config()
    dims: list[list[dict]] = [[{BUDGET: b} for b in at_budgets]]
    if thresholds and THRESHOLD in space.domains:
        adaptive = [False, True] if ADAPTIVE in space.domains else [False]
        options: list[dict] = [{THRESHOLD: 0}]
        options += [{"fraction": f, ADAPTIVE: a} for f in THRESHOLD_FRACTIONS for a in adaptive]
        dims.append(options)
    policy = space.domains.get("policy")
    if isinstance(policy, Choices):
        dims.append([{"policy": Policy(p)} for p in policy.values])
    out: list[Knobs] = [base]
    for combo in itertools.product(*dims):
        knobs = {**base}
        for part in combo:
            knobs.update(part)
        fraction = knobs.pop("fraction", None)
        if fraction is not None:
            knobs[THRESHOLD] = round(fraction * knobs[BUDGET])
        # As a trial enqueued with them runs them (the threshold a block multiple): a config
        # screened at threshold 27 ran at 32, never matched the screened one, and was queued
        # again as a duplicate in every round of verification.
        knobs = space.as_queued(space.normalise(knobs))
        if knobs not in out:
            out.append(knobs)
    return out


async def screen_space(target: SimTarget, meter: Meter, space: SearchSpace, start_rps: float,
                       workers: int | None = None) -> Screening:  # fmt: skip
    """Two passes: every budget with the threshold off, then every threshold option at the
    three best budgets (the threshold only matters near the budget that serves most)."""
    started = time.perf_counter()
    configs = grid(space, budgets(space), thresholds=False)
    first = await screen(target, meter, configs, start_rps, workers)
    best = list(dict.fromkeys(s.knobs[BUDGET] for s in first.ranked))[:3]
    done = [s.knobs for s in first.ranked]
    more = [k for k in grid(space, best, thresholds=True) if k not in done]
    second = await screen(target, meter, more, first.ranked[0].capacity_rps or start_rps, workers)
    ranked = sorted(first.ranked + second.ranked, key=lambda s: -s.capacity_rps)
    return Screening(ranked, time.perf_counter() - started)


async def screen(target: SimTarget, meter: Meter, configs: list[Knobs], start_rps: float,
                 workers: int | None = None) -> Screening:  # fmt: skip
    """Each config's capacity on the simulator, best first. Chains of `CHAIN` configs run on
    up to `workers` processes (default: the cores this process may use): a simulated search
    is pure Python, one core each, and screening sat idle on the other core of a 2-core
    machine for 15-20 s of every run."""
    started = time.perf_counter()
    settings = _settings(start_rps)
    chains = [configs[i : i + CHAIN] for i in range(0, len(configs), CHAIN)]
    count = _processes(len(chains), workers)
    if count > 1:
        done = await _in_processes((target, meter, chains, settings), len(chains), count,
                                   _chain_in_child)  # fmt: skip
    else:
        done = [await _chain(target, meter, chain, settings) for chain in chains]
    out = sorted(itertools.chain.from_iterable(done), key=lambda s: -s.capacity_rps)
    return Screening(out, time.perf_counter() - started)


async def searches(target: SimTarget, jobs: list[tuple[Meter, Knobs, float]],
                   workers: int | None = None) -> list[float]:  # fmt: skip
    """Independent capacity searches on the simulator, each a (meter, config, start rate): their
    capacities in order, spread over processes as `screen` spreads its chains. Each search
    starts at its own rate, so the figures are the same on one core or many."""
    count = _processes(len(jobs), workers)
    if count > 1:
        return await _in_processes((target, jobs), len(jobs), count, _search_in_child)
    return [await _search(target, meter, knobs, start) for meter, knobs, start in jobs]


async def _search(target: SimTarget, meter: Meter, knobs: Knobs, start_rps: float) -> float:
    return (await _chain(target, meter, [knobs], _settings(start_rps)))[0].capacity_rps


def _settings(start_rps: float) -> RateSearchSettings:
    return RateSearchSettings(start_rps=start_rps, growth=1.6, rel_tol=SIM_REL_TOL,
                              min_rps=start_rps / 32, max_levels=14)  # fmt: skip


async def _chain(target: SimTarget, meter: Meter, configs: list[Knobs],
                 settings: RateSearchSettings) -> list[Screened]:  # fmt: skip
    out = []
    for knobs in configs:
        await target.apply(knobs)
        result = await meter.capacity(settings)
        out.append(Screened(knobs, result.capacity_rps, len(result.levels)))
        # The next search starts where this one ended: neighbouring configs are close.
        if result.capacity_rps > 0:
            settings = _restart(settings, result.capacity_rps)
    return out


# What the forked workers screen: inherited through fork, so the simulator (its model, the
# request list, the meter) is never pickled; only a job's index goes out and its results
# come back.
_JOB: tuple[Any, ...] | None = None


async def _in_processes(job: tuple[Any, ...], count: int, workers: int,
                        child: Callable[[int], Any]) -> list[Any]:  # fmt: skip
    """`child(i)` for every i below `count`, on `workers` forked processes that see `job`."""
    global _JOB
    _JOB = job
    try:
        context = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
            loop = asyncio.get_running_loop()
            return list(
                await asyncio.gather(*(loop.run_in_executor(pool, child, i) for i in range(count)))
            )
    finally:
        _JOB = None


def _chain_in_child(index: int) -> list[Screened]:
    assert _JOB is not None
    target, meter, chains, settings = _JOB
    return asyncio.run(_chain(target, meter, chains[index], settings))


def _search_in_child(index: int) -> float:
    assert _JOB is not None
    target, jobs = _JOB
    return asyncio.run(_search(target, *jobs[index]))


def _processes(tasks: int, workers: int | None) -> int:
    """How many processes `tasks` independent tasks go to (1: this one, where fork is absent)."""
    if "fork" not in multiprocessing.get_all_start_methods():
        return 1
    return min(tasks, workers if workers is not None else usable_cores())


def _restart(settings: RateSearchSettings, rate: float) -> RateSearchSettings:
    return RateSearchSettings(start_rps=rate, growth=settings.growth, rel_tol=settings.rel_tol,
                              min_rps=min(settings.min_rps, rate / 32), max_levels=14)  # fmt: skip
