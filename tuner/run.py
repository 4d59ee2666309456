"""One `tune` run: `run_tune` reads as the run's phases in order, each one function below that
calls into the package owning it; nothing calls back into this module."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna

from loadgen import LoadgenError, Workload, build_workload
from slo import SLO, SLOError, parse_slo
from tuner.errors import TuneError
from tuner.measure.meter import Clock, LevelSettings, Meter
from tuner.measure.ratesearch import RateSearchSettings
from tuner.report.live import RunStatus, StatusSink, make_display
from tuner.report.publish import publish, report_lost_server
from tuner.search import fidelity
from tuner.search.confirm import Confirmer, choose, default_at_rate, worth_checking
from tuner.search.loop import Budget, ConfirmPlan, SearchLog, run_search
from tuner.search.space import SearchSpace, SpaceFacts, build_space
from tuner.search.starting import (
    Scenario,
    calibrated_start_rps,
    enqueue_default,
    enqueue_starting_configs,
    scenario_for,
)
from tuner.search.study import (
    CapacityPruner,
    SamplerName,
    has_role,
    make_sampler,
    open_study,
    recover_stale_trials,
    storage_url,
    top_trials,
)
from tuner.search.trial import TrialRunner
from tuner.settings import MIN_REQUESTS_PER_LEVEL, TuneSettings
from tuner.sim.profile import Profile
from tuner.store import attrs
from tuner.store.codec import confirmation_json
from tuner.store.environment import environment
from tuner.store.records import Candidate, Confirmation, Mode, Role, SameRateCheck, rules_for
from tuner.store.runfiles import CONFIRMATION_FILE, RUN_FILE, RunFiles, RunView
from tuner.targets.base import ReplayPlan, ServerLost, Target
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
        status = RunStatus(settings.trials, settings.time_budget_s, clock, str(files.root))
        with make_display(status, quiet) as display:
            try:
                conf = await measure(run, budget, display)
            except ServerLost as lost:  # report what was measured, then say what happened
                raise report_lost_server(files, run.study, lost) from None
            display.set_phase("writing the report")
            files.write_json(CONFIRMATION_FILE, confirmation_json(conf))
            return publish(files, run.study)
    finally:
        await target.close()


async def measure(run: TuneRun, budget: Budget, display: StatusSink) -> Confirmation:
    """The measuring phases: search, confirm the top configs, the default at their rate."""
    log = await search_with_simulator(run, budget, display)
    if log is None:
        log = await search(run, budget, display)
    view = RunView.read(run.files, run.study)  # the trials as the search left them
    display.set_phase("confirming the top configs")
    candidates = await confirm_top(run, view, budget)
    chosen = choose(candidates)
    display.set_phase("measuring the default at the recommended rate")
    same_rate = await check_same_traffic(run, view, chosen, budget)
    return Confirmation(candidates, chosen.trial if chosen else None, same_rate, log.stopped_by,
                        budget.elapsed_s)  # fmt: skip


def prepare(
    settings: TuneSettings, slo: SLO, files: RunFiles, target: Target, clock: Clock
) -> TuneRun:
    """The workload, the space, the study and the meter, all sized by the target."""
    facts = target.facts
    try:
        workload = build_workload(settings.workload, seed=settings.workload_seed,
                                  num_requests=settings.resolved_num_requests(facts.device),
                                  max_model_len=facts.max_model_len,
                                  vocab_size=facts.vocab_size)  # fmt: skip
    except LoadgenError as exc:
        raise TuneError(str(exc)) from None
    longest = max(r.prompt_len for r in workload.requests)
    space = build_space(target.knobs, SpaceFacts(facts.block_size, facts.max_model_len, longest),
                        settings.param_domains(), settings.fixed_values())  # fmt: skip
    mode = Mode.GOODPUT if settings.rate_rps is not None else Mode.CAPACITY
    level = LevelSettings(arrival=settings.arrival, burstiness=settings.burstiness,
                          seed=settings.workload_seed, duration_s=settings.level_s or None,
                          min_requests=MIN_REQUESTS_PER_LEVEL,
                          replay=ReplayPlan(timeout_s=settings.request_timeout_s))  # fmt: skip
    meter = Meter(target, workload.requests, slo, level,
                  rules_for(mode, facts.require_schedule), clock)  # fmt: skip
    study = _open_study(settings, files, workload, mode, slo, facts.model)
    scenario = Scenario(settings.scenario) if settings.scenario else scenario_for(workload.name)
    return TuneRun(settings, files, target, workload, space, study, mode, meter, scenario)


def _open_study(settings: TuneSettings, files: RunFiles, workload: Workload, mode: Mode, slo: SLO,
                model: str) -> optuna.Study:  # fmt: skip
    sampler = make_sampler(SamplerName(settings.sampler), settings.seed,
                           settings.n_startup_trials, constraints=mode is Mode.GOODPUT)  # fmt: skip
    meta = {"slo": str(slo), "workload": workload.name,
            "workload_fingerprint": workload.fingerprint(), "mode": mode.value,
            "rate_rps": settings.rate_rps, "model": model, "arrival": settings.arrival}  # fmt: skip
    storage = storage_url(settings.storage, files.root)
    return open_study(storage, settings.resolved_study_name(), sampler, CapacityPruner(), meta)


async def search_with_simulator(run: TuneRun, budget: Budget, display: StatusSink
                                ) -> SearchLog | None:  # fmt: skip
    """--fidelity sim (docs/tuner.md, tuner/search/fidelity.py): the default for real, a
    simulator fitted on what the target served, then rounds of screening in virtual time and
    verifying the best config for real. None when there is no simulator for this target."""
    s = run.settings
    if s.fidelity != "sim" or run.mode is not Mode.CAPACITY:
        return None
    profile = Profile.load(Path(s.profile)) if s.profile else None
    simulator = fidelity.Simulator.for_target(run.target, profile)
    if simulator is None:
        display.line("no simulator for this target (pass --profile FILE): measuring for real")
        return None
    if not has_role(run.study, Role.DEFAULT):
        enqueue_default(run.study, run.space)
    simulator.recording(True)
    log = await search(run, budget, display, queued_only=True)
    if has_role(run.study, Role.SCREENED):
        # Resumed after screening: the engine steps the simulator was fitted on died with the
        # killed process, so the queued configs are verified and the rest is searched for real.
        simulator.recording(False)
        return await search(run, budget, display)
    view = RunView.read(run.files, run.study)
    default = view.with_role(Role.DEFAULT)
    if simulator.steps is not None and default is not None and default.capacity_rps:
        display.set_phase("one level on a small budget: chunked steps for the simulator")
        await fidelity.calibration_level(run.meter, run.space, default.capacity_rps)
    if not await simulator.fit(run.meter, fidelity.real_levels(view)):
        display.line("too few engine steps to fit a simulator: searching for real")
        return await search(run, budget, display)
    for _ in range(s.verify_top):
        if not await verify_next(run, simulator, budget, display):
            break
        log = await search(run, budget, display, queued_only=True)
        await simulator.fit(run.meter, fidelity.real_levels(RunView.read(run.files, run.study)))
    simulator.recording(False)
    return await check_simulator(run, simulator, budget, display, log)


async def verify_next(run: TuneRun, simulator: fidelity.Simulator, budget: Budget,
                      display: StatusSink) -> bool:  # fmt: skip
    """Screen (again) and queue the best config not measured yet, if the budget allows."""
    view = RunView.read(run.files, run.study)
    best = max((t.capacity_rps or 0.0 for t in view.finished), default=0.0)
    start = best or attrs.start_rate(run.study) or 1.0
    display.set_phase("screening the space in virtual time")
    ranked = await simulator.rescreen(run.space, start)
    top = ranked[0].capacity_rps
    display.line(f"screened {simulator.screened} configs in {simulator.screen_s:.0f} s "
                 f"({simulator.source}); best simulated {top:.2f} req/s")  # fmt: skip
    if not budget.fits(3 * run.meter.expected_level_s(ranked[0].capacity_rps or start)):
        return False
    return simulator.queue_next(run.study, run.space, [t.knobs for t in view.trials])


async def check_simulator(run: TuneRun, simulator: fidelity.Simulator, budget: Budget,
                          display: StatusSink, log: SearchLog) -> SearchLog:  # fmt: skip
    """Simulated against measured; when the simulator missed, search on the target for the
    rest of the budget."""
    summary = fidelity.summary(simulator, RunView.read(run.files, run.study).trials)
    attrs.set_sim_summary(run.study, summary)
    if not summary["fell_back"]:
        return log
    miss, bound = summary["max_error"], summary["error_bound"]
    display.line(f"the simulator missed a verified capacity by {miss:.0%} (bound {bound:.0%}): "
                 "searching on the target itself")  # fmt: skip
    return await search(run, budget, display)


async def search(run: TuneRun, budget: Budget, display: StatusSink,
                 queued_only: bool = False) -> SearchLog:  # fmt: skip
    """Queue the references and the sweep, find the first start rate, run trials; with
    `queued_only`, just the configs already queued."""
    s = run.settings
    recovered = recover_stale_trials(run.study)
    if recovered:
        display.line(f"resuming: trials {[n + 1 for n in recovered]} were cut off; queued again")
    if not queued_only:
        for note in enqueue_starting_configs(run.study, run.space, run.scenario, s.budget_sweep):
            display.line(note)
    start = s.start_rps or s.rate_rps or attrs.start_rate(run.study)
    if start is None:
        display.set_phase("calibrating: a burst of the request list on the default config")
        burst = s.burst_requests(run.target.facts.device)
        start = await calibrated_start_rps(run.study, run.meter, run.space.default_config(), burst)
        display.line(f"first trial starts at {start:.2f} req/s (80% of a burst's throughput)")
    rate_search = RateSearchSettings(start_rps=start, growth=s.growth, rel_tol=s.rel_tol,
                                     min_rps=s.min_rps or start / 8,
                                     max_levels=s.max_levels)  # fmt: skip
    runner = TrialRunner(run.meter, run.space, rate_search, run.files, display, run.mode,
                         s.rate_rps)  # fmt: skip
    plan = ConfirmPlan(run.meter, run.mode, s.top_k, s.repeats, s.rate_rps)
    trials = _queued_count(run.study) if queued_only else s.trials
    phase = (
        "measuring on the target" if queued_only else f"searching ({s.sampler}, {run.mode.value})"
    )
    display.set_phase(phase)
    first_guess_s = 3 * run.meter.expected_level_s(s.rate_rps or start)
    return await run_search(run.study, runner, trials, budget, plan, first_guess_s)


def _queued_count(study: optuna.Study) -> int:
    """Finished plus waiting trials: the search stops once the queue is measured."""
    from optuna.trial import TrialState

    states = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.WAITING)
    return len(study.get_trials(deepcopy=False, states=states))


async def confirm_top(run: TuneRun, view: RunView, budget: Budget) -> list[Candidate]:
    """Re-measure the top configs; a level starts only if it ends before the report's time."""
    s = run.settings
    confirmer = Confirmer(run.meter, run.files, run.mode, s.rate_rps, seed=s.seed,
                          step_factor=1 + s.rel_tol)  # fmt: skip
    out = []
    for frozen in top_trials(run.study, s.top_k, run.mode):
        level_s = run.meter.expected_level_s(s.rate_rps or frozen.value or 1.0)
        deadline = budget.level_deadline_s(level_s)
        out.append(await confirmer.confirm(view.trial(frozen.number), s.repeats, deadline))
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
    if not budget.fits(run.meter.expected_level_s(chosen.verdict.rate_rps)):
        return None
    return await default_at_rate(run.meter, run.files, default.knobs, chosen, run.settings.seed)


def run_info(run: TuneRun) -> dict[str, Any]:
    """run.json: what `tune report` and a resume need to read this run back."""
    s, wl, facts = run.settings, run.workload, run.target.facts
    workload = {
        "name": wl.name, "num_requests": len(wl.requests), "level_s": s.level_s,
        "min_requests_per_level": MIN_REQUESTS_PER_LEVEL, "seed": s.workload_seed,
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
