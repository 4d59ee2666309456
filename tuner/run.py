"""One `tune` run end to end: target, workload, study, search, confirmation, report."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from loadgen import LoadgenError, Workload, build_workload
from slo import SLO, SLOError, parse_slo
from tuner.confirm.candidates import Candidate, Confirmer, choose, top_trials
from tuner.confirm.same_rate import default_at_rate
from tuner.errors import TuneError
from tuner.measure.level import LevelResult, LevelSettings, measure_level
from tuner.measure.ratesearch import RateSearchSettings
from tuner.report.live import RunStatus, StatusSink, make_display
from tuner.report.recommendation import build_recommendation, write_reports
from tuner.search.loop import REPORT_RESERVE_S, Budget, SearchLog, run_search
from tuner.search.rules import Scenario, scenario_for
from tuner.search.space import SearchSpace, build_space
from tuner.search.starting import enqueue_starting_configs, reference_configs
from tuner.search.study import (
    CapacityPruner,
    Role,
    SamplerName,
    finished_trials,
    make_sampler,
    open_study,
    recover_stale_trials,
    storage_url,
    trial_with_role,
)
from tuner.search.trial import CAPACITY, KNOBS, Mode, Objective
from tuner.settings import MIN_REQUESTS_PER_LEVEL, START_FRACTION_OF_BURST, TuneSettings
from tuner.store.runfiles import (
    CONFIRMATION_FILE,
    RUN_FILE,
    RunFiles,
    trial_levels,
    write_trials_table,
)
from tuner.targets.base import Target
from tuner.targets.factory import TargetFacts, launch_searched_knobs, open_target

CALIBRATION = "calibrated_start_rps"  # study user attr
# Seconds a level spends draining after its last arrival (the longest requests finishing).
LEVEL_TAIL_S = 6.0


@dataclass
class RunContext:
    """What the phases of a run share."""

    settings: TuneSettings
    slo: SLO
    files: RunFiles
    target: Target
    facts: TargetFacts
    workload: Workload
    space: SearchSpace
    study: optuna.Study
    mode: Mode
    level_settings: LevelSettings
    scenario: Scenario


async def run_tune(
    settings: TuneSettings,
    quiet: bool = False,
    clock: Callable[[], float] = time.monotonic,
) -> dict[str, Any]:
    """Run (or resume) a study and write its report; returns the recommendation JSON."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    budget = Budget(settings.time_budget_s, clock)
    slo = _parse_slo(settings.slo)
    files = RunFiles(settings.resolved_run_dir())
    files.ensure()
    target, facts = open_target(settings, files)
    try:
        ctx = _context(settings, slo, files, target, facts)
        files.write_json(RUN_FILE, _run_file(ctx))
        status = RunStatus(settings.trials, settings.time_budget_s, clock)
        status.start_s = budget.start_s
        with make_display(status, quiet) as display:
            log = await _search(ctx, budget, display)
            display.set_phase("confirming the top configs")
            candidates = await _confirm(ctx, budget)
            chosen = choose(candidates)
            display.set_phase("measuring the default at the recommended rate")
            same_rate = await _default_at_recommended_rate(ctx, chosen, budget)
            display.set_phase("writing the report")
            return _finish(ctx, candidates, chosen, log, budget, same_rate)
    finally:
        await target.close()


def _parse_slo(text: str) -> SLO:
    try:
        return parse_slo(text)
    except SLOError as exc:
        raise TuneError(f"--slo: {exc}") from None


def _context(
    settings: TuneSettings, slo: SLO, files: RunFiles, target: Target, facts: TargetFacts
) -> RunContext:
    try:
        workload = build_workload(
            settings.workload,
            num_requests=settings.resolved_num_requests(facts.device),
            seed=settings.workload_seed,
            max_model_len=facts.max_model_len,
            vocab_size=facts.vocab_size,
        )
    except LoadgenError as exc:
        raise TuneError(str(exc)) from None
    space = _space(settings, facts, workload)
    mode = Mode.GOODPUT if settings.rate_rps is not None else Mode.CAPACITY
    sampler = make_sampler(
        SamplerName(settings.sampler), settings.seed, settings.n_startup_trials,
        constraints=mode is Mode.GOODPUT,
    )  # fmt: skip
    meta = {
        "slo": str(slo),
        "workload": workload.name,
        "workload_fingerprint": workload.fingerprint(),
        "mode": mode.value,
        "rate_rps": settings.rate_rps,
        "model": facts.model,
        "arrival": settings.arrival,
    }
    storage = storage_url(settings.storage, files.root)
    study = open_study(storage, settings.resolved_study_name(), sampler, CapacityPruner(), meta)
    scenario = Scenario(settings.scenario) if settings.scenario else scenario_for(workload.name)
    level_settings = LevelSettings(
        arrival=settings.arrival,
        burstiness=settings.burstiness,
        seed=settings.workload_seed,
        timeout_s=settings.request_timeout_s,
        require_schedule=facts.require_schedule,
        duration_s=settings.level_s or None,
        min_requests=MIN_REQUESTS_PER_LEVEL,
    )
    return RunContext(settings, slo, files, target, facts, workload, space, study, mode,
                      level_settings, scenario)  # fmt: skip


def _space(settings: TuneSettings, facts: TargetFacts, workload: Workload) -> SearchSpace:
    space = build_space(
        block_size=facts.block_size,
        max_model_len=facts.max_model_len,
        longest_prompt=max(r.prompt_len for r in workload.requests),
        params=settings.param_domains(),
        fixed=settings.fixed_values(),
    )
    allowed = launch_searched_knobs(settings)
    if allowed is not None:  # a launched server only takes the knobs its command names
        domains = {k: v for k, v in space.domains.items() if k in allowed}
        space = dataclasses.replace(space, domains=domains)
    return space


async def _search(ctx: RunContext, budget: Budget, display: StatusSink) -> SearchLog:
    s = ctx.settings
    recovered = recover_stale_trials(ctx.study)
    if recovered:
        display.line(f"resuming: trials {[n + 1 for n in recovered]} were cut off; queued again")
    for note in enqueue_starting_configs(ctx.study, ctx.space, ctx.scenario, s.budget_sweep):
        display.line(note)
    start = s.start_rps or await _calibrated_start(ctx, display)
    search = RateSearchSettings(
        start_rps=start,
        growth=s.growth,
        rel_tol=s.rel_tol,
        min_rps=s.min_rps or start / 8,
        max_levels=s.max_levels,
    )
    objective = Objective(
        ctx.target, ctx.workload.requests, ctx.slo, ctx.space, ctx.level_settings, search,
        mode=ctx.mode, rate_rps=s.rate_rps, progress=display,
        on_level=lambda trial, step, level: _save_records(ctx, trial, step, level),
    )  # fmt: skip
    display.set_phase(f"searching ({s.sampler}, {ctx.mode.value})")
    first_guess = 3 * _level_s(ctx, s.rate_rps or start)
    return await run_search(ctx.study, objective, s.trials, budget,
                            lambda: _reserve_s(ctx), display, first_guess)  # fmt: skip


async def _calibrated_start(ctx: RunContext, display: StatusSink) -> float:
    """First trial's start rate: a share of the throughput on a burst of the request list.

    Kept in the study, so a resumed run and other workers reuse it instead of measuring again.
    """
    known = ctx.study.user_attrs.get(CALIBRATION)
    if known:
        return float(known)
    if ctx.settings.rate_rps is not None:
        return ctx.settings.rate_rps
    display.set_phase("calibrating: a burst of the request list on the default config")
    default = reference_configs(ctx.space, ctx.scenario)[0][1]
    await ctx.target.apply(default)
    burst = ctx.workload.requests[: ctx.settings.burst_requests(ctx.facts.device)]
    level = await measure_level(ctx.target, burst, math.inf, ctx.slo, ctx.level_settings)
    start = max(0.05, START_FRACTION_OF_BURST * level.request_throughput_rps)
    ctx.study.set_user_attr(CALIBRATION, start)
    display.line(f"burst throughput {level.request_throughput_rps:.2f} req/s; "
                 f"first trial starts at {start:.2f} req/s")  # fmt: skip
    return start


def _save_records(ctx: RunContext, trial: int, step: int, level: LevelResult) -> None:
    ctx.files.write_records(ctx.files.level_path(trial, step), level.records)


def _level_s(ctx: RunContext, rate_rps: float) -> float:
    """Expected wall time of one level at this rate: arrivals plus the drain."""
    n = len(ctx.level_settings.requests_at(ctx.workload.requests, rate_rps))
    return n / rate_rps + LEVEL_TAIL_S


def _reserve_s(ctx: RunContext) -> float:
    """Time the confirmation and the report will need, given the current top configs: the
    repeats, and one step down each in capacity mode."""
    reps = ctx.settings.repeats
    if reps == 0:
        return REPORT_RESERVE_S
    levels = reps + (1 if ctx.mode is Mode.CAPACITY else 0)
    top = top_trials(ctx.study, ctx.settings.top_k, ctx.mode)
    rates = [ctx.settings.rate_rps or t.value or 1.0 for t in top]
    # Plus one level of the default at the best config's rate (capacity mode).
    same_rate = _level_s(ctx, max(rates)) if rates and ctx.mode is Mode.CAPACITY else 0.0
    return REPORT_RESERVE_S + levels * sum(_level_s(ctx, r) for r in rates) + same_rate


async def _confirm(ctx: RunContext, budget: Budget) -> list[Candidate]:
    confirmer = Confirmer(ctx.target, ctx.workload.requests, ctx.slo, ctx.files,
                          ctx.level_settings, ctx.mode, ctx.settings.rate_rps,
                          seed=ctx.settings.seed,
                          step_factor=1 + ctx.settings.rel_tol)  # fmt: skip
    out = []
    for trial in top_trials(ctx.study, ctx.settings.top_k, ctx.mode):
        # A level starts only if it can end before the time kept for the report.
        rate = ctx.settings.rate_rps or trial.value or 1.0
        deadline = budget.end_s - REPORT_RESERVE_S - _level_s(ctx, rate)
        knobs = ctx.space.normalise(trial.user_attrs[KNOBS])
        out.append(await confirmer.confirm(trial, knobs, ctx.settings.repeats, deadline))
    return out


async def _default_at_recommended_rate(
    ctx: RunContext, chosen: Candidate | None, budget: Budget
) -> dict[str, Any] | None:
    """The default, measured at the confirmed recommendation's rate (when it is another config
    and the level fits in the time left)."""
    if ctx.mode is not Mode.CAPACITY or chosen is None or not chosen.clears:
        return None
    if ctx.settings.repeats == 0:
        return None  # --repeats 0 asks for no re-measurement at all
    default = trial_with_role(finished_trials(ctx.study), Role.DEFAULT)
    if default is None or KNOBS not in default.user_attrs:
        return None
    knobs = ctx.space.normalise(default.user_attrs[KNOBS])
    if knobs == ctx.space.normalise(chosen.knobs):
        return None  # the default is the recommendation: nothing to compare
    if budget.clock() + _level_s(ctx, chosen.rate_rps) > budget.end_s - REPORT_RESERVE_S:
        return None
    return await default_at_rate(ctx.target, ctx.workload.requests, ctx.slo, ctx.level_settings,
                                 ctx.files, knobs, chosen, seed=ctx.settings.seed)  # fmt: skip


def _finish(
    ctx: RunContext,
    candidates: list[Candidate],
    chosen: Candidate | None,
    log: SearchLog,
    budget: Budget,
    same_rate: dict[str, Any] | None,
) -> dict[str, Any]:
    confirmation = {
        "candidates": [c.summary() for c in candidates],
        "chosen_trial": chosen.trial if chosen else None,
        "default_at_recommended_rate": same_rate,
        "stopped_by": log.stopped_by,
        "elapsed_s": budget.clock() - budget.start_s,
    }
    ctx.files.write_json(CONFIRMATION_FILE, confirmation)
    if chosen is not None:
        ctx.files.write_records(ctx.files.root / "records_recommended.jsonl", chosen.records)
    _write_default_records(ctx)
    write_trials_table(ctx.study, ctx.files)
    run_info = ctx.files.read_json(RUN_FILE) or {}
    rec = build_recommendation(ctx.study, run_info, confirmation, ctx.files)
    write_reports(rec, ctx.study, ctx.files)
    return rec


def _write_default_records(ctx: RunContext) -> None:
    """Records of the default config at its capacity (its first level if it never passed)."""
    complete = ctx.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    trial = trial_with_role(complete, Role.DEFAULT)
    if trial is None:
        return
    levels = trial_levels(trial)
    capacity = trial.user_attrs.get(CAPACITY) or 0.0
    index = next((i for i, lv in enumerate(levels) if lv.get("rate_rps") == capacity), 0)
    records = ctx.files.read_records(ctx.files.level_path(trial.number, index))
    if records is not None:
        ctx.files.write_records(ctx.files.root / "records_default.jsonl", records)


def _run_file(ctx: RunContext) -> dict[str, Any]:
    from tuner.store.environment import environment

    s = ctx.settings
    return {
        "settings": s.to_json(),
        "storage": s.storage or f"sqlite:///{(ctx.files.root / 'study.db').resolve()}",
        "study_name": s.resolved_study_name(),
        "slo": str(ctx.slo),
        "mode": ctx.mode.value,
        "rate_rps": s.rate_rps,
        "scenario": ctx.scenario.value,
        "workload": {
            "name": ctx.workload.name,
            "num_requests": len(ctx.workload.requests),
            "level_s": s.level_s,
            "min_requests_per_level": MIN_REQUESTS_PER_LEVEL,
            "seed": s.workload_seed,
            "arrival": s.arrival,
            "burstiness": s.burstiness,
            "fingerprint": ctx.workload.fingerprint(),
            "classes": ctx.workload.class_counts(),
            "longest_prompt": max(r.prompt_len for r in ctx.workload.requests),
            "max_model_len": ctx.facts.max_model_len,
        },
        "target": dataclasses.asdict(ctx.facts),
        "space": ctx.space.describe(),
        "fixed": {k: getattr(v, "value", v) for k, v in ctx.space.fixed.items()},
        "environment": environment(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "path": str(Path(ctx.files.root)),
        "budget_s": s.time_budget_s,
    }
