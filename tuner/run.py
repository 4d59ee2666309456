"""One `tune` run: `run_tune` reads as the run's phases in order, each one function below that
calls into the package owning it; nothing calls back into this module."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.samplers import BaseSampler

from loadgen import LoadgenError, Workload
from slo import SLO, SLOError, parse_slo
from tuner.errors import TuneError
from tuner.measure.contention import CpuGuard
from tuner.measure.meter import Clock, Meter
from tuner.measure.ratesearch import RateSearchSettings
from tuner.report.live import RunStatus, StatusSink, make_display
from tuner.report.publish import publish, report_lost_server
from tuner.search.choice import choose, choose_robust
from tuner.search.claim import claim_confirmation, latest_report, open_jobs
from tuner.search.confirm import (
    Confirmer,
    confirm_order,
    default_at_rate,
    repooled,
    worth_checking,
)
from tuner.search.fidelity import SIM_ERROR_BOUND
from tuner.search.loop import Budget, ConfirmPlan, SearchLog, search_to_the_end
from tuner.search.pruner import CapacityPruner
from tuner.search.screened import screens_with_simulator, search_with_simulator
from tuner.search.space import SearchSpace, SpaceFacts, build_space
from tuner.search.starting import (
    Scenario,
    enqueue_starting_configs,
    first_start_rps,
    scenario_for,
)
from tuner.search.storage import open_storage
from tuner.search.study import (
    SamplerName,
    make_sampler,
    queued_count,
    queued_phase,
    recover_stale_trials,
    top_trials,
)
from tuner.search.trial import TrialRunner
from tuner.search.workers import Workers, join_study
from tuner.settings import TuneSettings
from tuner.store import attrs
from tuner.store.codec import confirmation_json
from tuner.store.environment import environment
from tuner.store.identity import device_of, engine_of, model_of
from tuner.store.records import Candidate, Confirmation, Mode, Role, SameRateCheck, rules_for
from tuner.store.runfiles import CONFIRMATION_FILE, RUN_FILE, RunFiles, RunView
from tuner.targets.base import ServerLost, Target
from tuner.targets.factory import open_target


@dataclass(slots=True)
class TuneRun:
    """What the phases of a run share."""

    settings: TuneSettings
    files: RunFiles
    target: Target
    workload: Workload
    space: SearchSpace
    study: optuna.Study
    mode: Mode
    meter: Meter
    scenario: Scenario
    workers: Workers
    setup_notes: list[str]  # what setting the study up skipped (the creating worker only)


async def run_tune(settings: TuneSettings, quiet: bool = False, clock: Clock = time.monotonic,
                   target: Target | None = None) -> dict[str, Any]:  # fmt: skip
    """Run (or resume) a study and write its report; returns the recommendation JSON. Every
    deadline is read on `clock`, so a test can run it on a simulated target in simulated time."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    budget = Budget(settings.time_budget_s, clock)
    try:
        slo = parse_slo(settings.slo)
    except SLOError as exc:
        raise TuneError(f"--slo: {exc}") from None
    files = RunFiles(settings.resolved_run_dir())
    files.check_writable()
    target = target or open_target(settings.target_options(files.root / "server-logs"))
    try:
        run = prepare(settings, slo, files, target, clock)
        files.write_json(RUN_FILE, run_info(run))
        if run.workers.created:  # what a report shows if no worker gets to confirm
            attrs.set_run_info(run.study, run_info(run))
        status = RunStatus(settings.trials, settings.time_budget_s, clock, str(files.root),
                           budget.start_s)  # fmt: skip
        with make_display(status, quiet) as display:
            try:
                log = await measure(run, budget, display)
                # Every worker gets here; one confirms, the others wait for its report.
                jobs = open_jobs(run.workers, settings.resolved_study_name())
                claim = await claim_confirmation(run.study, jobs, run.workers, display.line)
                if claim is not None:
                    with claim.held():
                        conf = await confirm(run, budget, display, log)
                        claim.done(run_info(run), confirmation_json(conf))
            except ServerLost as lost:  # report what was measured, then say what happened
                save_server_starts(run)
                raise report_lost_server(files, run.study, lost) from None
            save_server_starts(run)
            display.set_phase("writing the report")
            return publish(files, run.study, latest_report(jobs))
    finally:
        await target.close()


async def measure(run: TuneRun, budget: Budget, display: StatusSink) -> SearchLog:
    """The search: screened by the simulator where there is one, else on the target alone."""
    log = await search_with_simulator(run, budget, display, search)
    return log if log is not None else await search(run, budget, display)


async def confirm(
    run: TuneRun, budget: Budget, display: StatusSink, log: SearchLog
) -> Confirmation:
    """Re-measure the top configs, choose one, and measure the default at its rate."""
    view = RunView.read(run.files, run.study)  # the trials as the search left them
    display.set_phase("confirming the top configs")
    candidates = await confirm_top(run, view, budget)
    band = attrs.robustness(run.study)
    chosen = choose_robust(candidates, band) if run.settings.robust else choose(candidates)
    display.set_phase("measuring the default at the recommended rate")
    same_rate = await check_same_traffic(run, view, chosen, budget)
    if same_rate is not None:  # more measurements of the default: its figures include them
        default, s = view.with_role(Role.DEFAULT), run.settings
        assert default is not None
        candidates = repooled(candidates, default, run.files, run.mode, s.rate_rps, run.meter.slo,
                              run.meter.rules, same_rate.default_draws, s.seed)  # fmt: skip
    now = budget.clock()  # one reading, so the phases add up to the elapsed time exactly
    conf = Confirmation(candidates, chosen.trial if chosen else None, same_rate, log.stopped_by,
                        now - budget.start_s, display.status.phase_seconds(now))  # fmt: skip
    run.files.write_json(CONFIRMATION_FILE, confirmation_json(conf))
    return conf


def prepare(
    settings: TuneSettings, slo: SLO, files: RunFiles, target: Target, clock: Clock
) -> TuneRun:
    """The workload, the space, the study and the meter, all sized by the target."""
    facts = target.facts
    try:
        workload = settings.request_list(facts)
    except LoadgenError as exc:
        raise TuneError(str(exc)) from None
    longest = max(r.prompt_len for r in workload.requests)
    space = build_space(target.knobs, SpaceFacts(facts.block_size, facts.max_model_len, longest),
                        settings.param_domains(), settings.fixed_values())  # fmt: skip
    mode = Mode.GOODPUT if settings.rate_rps is not None else Mode.CAPACITY
    meter = Meter(target, workload.requests, slo, settings.level_settings(),
                  rules_for(mode, facts.require_schedule),
                  clock, CpuGuard.watching(target))  # fmt: skip
    scenario = Scenario(settings.scenario) if settings.scenario else scenario_for(workload.name)
    storage = open_storage(settings.storage, files.root, settings.heartbeat_s)

    def sampler(seed: int) -> BaseSampler:
        return make_sampler(SamplerName(settings.sampler), seed, settings.n_startup_trials,
                            constraints=mode is Mode.GOODPUT)  # fmt: skip

    def setup(study: optuna.Study) -> list[str]:
        if screens_with_simulator(settings.fidelity, mode, settings.storage):
            return []  # the simulator queues the default (placed, where it can) and what follows
        return enqueue_starting_configs(study, space, scenario, settings.budget_sweep)

    mine = study_identity(settings, workload, mode, slo, target, space)
    study, workers, notes = join_study(storage, settings.resolved_study_name(), sampler,
                                       settings.seed, CapacityPruner(SIM_ERROR_BOUND), mine,
                                       setup)  # fmt: skip
    return TuneRun(settings, files, target, workload, space, study, mode, meter, scenario,
                   workers, notes)  # fmt: skip


def study_identity(settings: TuneSettings, workload: Workload, mode: Mode, slo: SLO,
                   target: Target, space: SearchSpace) -> dict[str, Any]:  # fmt: skip
    """What a worker must share with a study to join it (store/identity.py)."""
    facts = target.facts
    fixed = {k: getattr(v, "value", v) for k, v in space.fixed.items()}
    return {
        "slo": str(slo), "workload": workload.name,
        "workload_fingerprint": workload.fingerprint(), "mode": mode.value,
        "rate_rps": settings.rate_rps, "model": model_of(facts), "arrival": settings.arrival,
        "device": device_of(facts), "engine": engine_of(facts, settings.launch),
        "target": facts.kind.value, "burstiness": settings.burstiness,
        "level_s": settings.level_s, "min_requests": settings.resolved_min_requests(),
        "level_mix": settings.level_mix, "space": {"searched": space.describe(), "fixed": fixed},
    }  # fmt: skip


async def search(run: TuneRun, budget: Budget, display: StatusSink,
                 queued_only: bool = False) -> SearchLog:  # fmt: skip
    """Queue the references and the sweep, find the first start rate, run trials; with
    `queued_only`, just the configs already queued."""
    s = run.settings
    recovered = recover_stale_trials(run.study)
    if recovered:
        display.line(f"resuming: trials {[n + 1 for n in recovered]} were cut off; queued again")
    for note in run.setup_notes:
        display.line(note)
    run.setup_notes.clear()
    if not queued_only and run.settings.storage is None:
        # One worker on its own folder: queue what is missing (a reference a resume found cut,
        # or everything after the simulator missed). Shared studies are set up by their creator.
        for note in enqueue_starting_configs(run.study, run.space, run.scenario, s.budget_sweep):
            display.line(note)
    burst = s.burst_requests(run.target.facts.device)
    start = s.start_rps or s.rate_rps or await first_start_rps(
        run.study, run.meter, run.space.default_config(), burst, display)  # fmt: skip
    rate_search = RateSearchSettings(start_rps=start, growth=s.growth, rel_tol=s.rel_tol,
                                     min_rps=s.min_rps or start / 8,
                                     max_levels=s.max_levels)  # fmt: skip
    runner = TrialRunner(run.meter, run.space, rate_search, run.files, display, run.mode,
                         s.rate_rps, s.time_budget_s)  # fmt: skip
    plan = ConfirmPlan(run.meter, run.mode, s.top_k, s.repeats, s.rate_rps, s.robust)
    display.set_phase(queued_phase(run.study) if queued_only
                      else f"searching ({s.sampler}, {run.mode.value})")  # fmt: skip
    first_guess_s = 3 * run.meter.expected_level_s(s.rate_rps or start)
    trials = queued_count(run.study) if queued_only else s.trials
    return await search_to_the_end(run.study, runner, trials, budget, plan, first_guess_s,
                                   run.workers)  # fmt: skip


async def confirm_top(run: TuneRun, view: RunView, budget: Budget) -> list[Candidate]:
    """Re-measure the top configs; a level starts only if it ends before the report's time."""
    s = run.settings
    confirmer = Confirmer(run.meter, run.files, run.mode, s.rate_rps, seed=s.seed,
                          step_factor=1 + s.rel_tol)  # fmt: skip
    frozen = {t.number: t for t in top_trials(run.study, s.top_k, run.mode)}
    top = [view.trial(n) for n in frozen]
    out = []
    for trial in confirm_order(top):
        level_s = run.meter.expected_level_s(s.rate_rps or frozen[trial.number].value or 1.0)
        deadline = budget.level_deadline_s(level_s)
        rivals = [] if s.robust else out  # --robust may choose a config that cannot win here
        # Where the same-traffic check may measure the default: any rate a config cleared at.
        kept = [c.verdict.rate_rps for c in out if c.clears]
        out.append(await confirmer.confirm(trial, s.repeats, deadline, rivals, kept))
    return out


async def check_same_traffic(
    run: TuneRun, view: RunView, chosen: Candidate | None, budget: Budget
) -> SameRateCheck | None:
    """The default at the recommendation's confirmed rate, when that is worth a level and the
    level fits in the time left."""
    default = view.with_role(Role.DEFAULT)
    if not worth_checking(run.mode, chosen, default, run.settings.repeats):
        return None
    assert chosen is not None and default is not None
    level_s = run.meter.expected_level_s(chosen.verdict.rate_rps)
    if not budget.fits(level_s):
        return None
    draws = 1 + run.settings.repeats  # as many as the recommendation's pooled runs
    return await default_at_rate(run.meter, run.files, default.knobs, chosen, run.settings.seed,
                                 draws, budget.level_deadline_s(0.0), default.number)  # fmt: skip


def save_server_starts(run: TuneRun) -> None:
    """What starting servers cost (vLLM's 45-75 s each on a CPU), kept in the study for the
    report; targets that start none have no `start_log`."""
    start_log = getattr(run.target, "start_log", None)
    if start_log is not None:
        attrs.record_server_starts(run.study, run.workers.worker, start_log())


def run_info(run: TuneRun) -> dict[str, Any]:
    """run.json: what `tune report` and a resume need to read this run back."""
    s, wl, facts = run.settings, run.workload, run.target.facts
    workload = {
        "name": wl.name, "num_requests": len(wl.requests), "level_s": s.level_s,
        "min_requests_per_level": s.resolved_min_requests(), "level_mix": s.level_mix,
        "seed": s.workload_seed,
        "arrival": s.arrival, "burstiness": s.burstiness, "fingerprint": wl.fingerprint(),
        "classes": wl.class_counts(), "longest_prompt": max(r.prompt_len for r in wl.requests),
        "max_model_len": facts.max_model_len,
    }  # fmt: skip
    return {
        "settings": s.to_json(),
        "storage": s.storage or f"sqlite:///{(run.files.root / 'study.db').resolve()}",
        "study_name": s.resolved_study_name(), "slo": str(run.meter.slo), "mode": run.mode.value,
        "rate_rps": s.rate_rps, "scenario": run.scenario.value, "workload": workload,
        "target": {**dataclasses.asdict(facts), **run.target.knobs.to_json()},
        "space": run.space.describe(),
        "fixed": {k: getattr(v, "value", v) for k, v in run.space.fixed.items()},
        "environment": environment(), "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "path": str(run.files.root), "budget_s": s.time_budget_s,
    }  # fmt: skip
