"""--fidelity sim: the default measured for real, a simulator fitted on the engine steps the
target served, then rounds of screening the space in virtual time and verifying the best
config not measured yet; a simulator that misses a verified capacity hands the rest of the
budget to a real search (docs/tuner.md)."""

from __future__ import annotations

import itertools
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, Protocol

import optuna
from optuna.trial import TrialState

from tuner.measure.meter import Meter
from tuner.report.live import StatusSink
from tuner.report.summary import short_config
from tuner.search import fidelity
from tuner.search.loop import Budget, ConfirmPlan, SearchLog
from tuner.search.space import SearchSpace
from tuner.search.starting import Scenario, enqueue_default, first_start_rps, reference_configs
from tuner.search.study import has_role, top_trials
from tuner.sim import robust
from tuner.sim.profile import Profile
from tuner.sim.screen import Screened
from tuner.store import attrs
from tuner.store.records import Mode, Role
from tuner.store.runfiles import RunFiles, RunView
from tuner.targets.base import Target
from tuner.targets.knobs import knobs_to_json


class ScreenedRun(Protocol):
    """What screening needs of a run (tuner.run.TuneRun)."""

    settings: Any
    files: RunFiles
    target: Target
    space: SearchSpace
    study: optuna.Study
    mode: Mode
    meter: Meter
    scenario: Scenario


class SearchFn(Protocol):
    """tuner.run.search: measure the queued configs (`queued_only`) or search for real."""

    def __call__(self, run: Any, budget: Budget, display: StatusSink,
                 queued_only: bool = False) -> Awaitable[SearchLog]: ...  # fmt: skip


async def search_with_simulator(run: ScreenedRun, budget: Budget, display: StatusSink,
                                search: SearchFn) -> SearchLog | None:  # fmt: skip
    """--fidelity sim (docs/tuner.md, tuner/search/fidelity.py): the default for real, a
    simulator fitted on what the target served, then rounds of screening in virtual time and
    verifying the best config for real. None when there is no simulator for this target."""
    s = run.settings
    if not screens_with_simulator(s.fidelity, run.mode, s.storage):
        return None
    profile = Profile.load(Path(s.profile)) if s.profile else None
    if profile is not None:
        profile.check_model(run.target.facts.model)
    simulator = fidelity.Simulator.for_target(run.target, profile)
    if simulator is None:
        display.line("no simulator for this target (pass --profile FILE): measuring for real")
        return None
    if run.meter.guard is not None and simulator.steps is not None:
        run.meter.guard.follow(simulator.steps)
    simulator.recording(True)
    placed = False
    if not has_role(run.study, Role.DEFAULT):
        hint = None
        if simulator.steps is not None:
            hint, placed = await _place_default(run, simulator, display), True
        enqueue_default(run.study, run.space, hint)
    log = await search(run, budget, display, queued_only=True)
    if any(has_role(run.study, role) for role in _PAST_SCREENING):
        # Resumed after screening (or after its fall-back to a real search): the engine steps
        # the simulator was fitted on died with the killed process, so the queued configs are
        # verified and the rest is searched for real.
        simulator.recording(False)
        return await search(run, budget, display)
    view = RunView.read(run.files, run.study)
    default = view.with_role(Role.DEFAULT)
    phase = simulator.calibration_phase
    if phase and not placed and default is not None and default.capacity_rps:
        display.set_phase(phase)
        await simulator.calibrate(run.meter, run.space, default.capacity_rps)
    if not await simulator.fit(run.meter, fidelity.real_levels(view)):
        display.line("too few engine steps to fit a simulator: searching for real")
        return await search(run, budget, display)
    for rounds in itertools.count():
        summary = fidelity.summary(simulator, view.trials)  # as of the last refit's read
        if not keep_verifying(rounds, s.verify_top, summary):
            break
        if rounds == s.verify_top:
            display.line(f"the simulator overstated the gain of every config it chose, by "
                         f"{summary['min_gain_error']:.0%} at least (bound "
                         f"{summary['error_bound']:.0%}); refitted on them, it chooses again "
                         "before the budget goes to a search on the target")  # fmt: skip
        held = rounds > 0 and not summary["fell_back"]
        if not await _verify_next(run, simulator, budget, display, held):
            break
        log = await search(run, budget, display, queued_only=True)
        # Refitted on what was just measured: a config the model overstated teaches it most.
        view = RunView.read(run.files, run.study)
        await simulator.fit(run.meter, fidelity.real_levels(view))
    simulator.recording(False)
    log = await _check_simulator(run, simulator, budget, display, log, search)
    await _robustness(run, simulator, display)
    return log


async def _place_default(run: ScreenedRun, simulator: fidelity.Simulator,
                         display: StatusSink) -> float | None:  # fmt: skip
    """The built-in engine on a fresh run: the burst's steps and one level on a small budget
    fit the simulator before the default is measured, so the default's rate search starts
    near its simulated capacity (a step above it, `trial.PLACED_STEPS_ABOVE`: two levels
    where the climb from 80% of the burst's throughput took five). None when there is too
    little to fit on."""
    s, default = run.settings, run.space.default_config()
    burst = s.burst_requests(run.target.facts.device)
    start = s.start_rps or await first_start_rps(run.study, run.meter, default, burst, display)
    display.set_phase(simulator.calibration_phase or "")
    await simulator.calibrate(run.meter, run.space, start)
    if not await simulator.fit(run.meter, []):
        return None
    hint = await simulator.capacity_of(default, start)
    display.line(f"the simulator puts the default at {hint:.2f} req/s; its search starts a "
                 "step above (the first fit reads it slow)")  # fmt: skip
    return hint or None


def keep_verifying(rounds: int, verify_top: int, summary: dict[str, Any]) -> bool:
    """`verify_top` screened configs are verified; then up to as many again while every one so
    far overstated its gain past the bound (`summary["fell_back"]`): the model, refitted on
    its misses, chooses once more before a search on the target takes the rest of the budget.
    One built-in run fell back on two configs overstated by 26% and searched 302 s for real to
    find budget 256; a verified config costs 2-4 levels (20-60 s)."""
    return rounds < verify_top or (rounds < 2 * verify_top and summary["fell_back"])


# Levels a verification is expected to cost (two to four).
VERIFY_LEVELS = 3

# Roles a study holds only once screening has run (or has handed over to a real search).
_PAST_SCREENING = (Role.SCREENED, Role.RULE_OF_THUMB, Role.SWEEP, Role.SEARCH)


def screens_with_simulator(fidelity_name: str, mode: Mode, storage: str | None) -> bool:
    """--fidelity sim screens a capacity search run by one worker on its own folder (workers
    sharing a --storage study search for real: each would screen and queue on its own)."""
    return fidelity_name == "sim" and mode is Mode.CAPACITY and storage is None


async def _verify_next(run: ScreenedRun, simulator: fidelity.Simulator, budget: Budget,
                       display: StatusSink, held: bool = False) -> bool:  # fmt: skip
    """Screen (again) and queue the best config not measured yet, if the budget allows and,
    once a verified config has `held` its gain, if it may beat the best measured one."""
    view = RunView.read(run.files, run.study)
    if len(view.finished) >= run.settings.trials:
        return False  # --trials counts verified configs too
    if any(t.state is TrialState.WAITING for t in view.trials):
        return False  # the last queued config did not fit in the time left
    best = max((t.capacity_rps or 0.0 for t in view.finished), default=0.0)
    start = best or attrs.start_rate(run.study) or 1.0
    display.set_phase("screening the space in virtual time")
    ranked = await simulator.rescreen(run.space, start)
    top = ranked[0].capacity_rps
    display.line(f"screened {simulator.screened} configs in {simulator.screen_s:.0f} s "
                 f"({simulator.source}); best simulated {top:.2f} req/s")  # fmt: skip
    if not budget.fits(VERIFY_LEVELS * run.meter.expected_level_s(ranked[0].capacity_rps or start)):
        return False
    following = simulator.next_unmeasured(run.space, [t.knobs for t in view.trials])
    if following is None:
        return False
    if held and not _goal_allows(run, simulator, budget, ranked[0].capacity_rps or start, display):
        return False
    if held and await _within_a_step(run, simulator, view, following, start, display):
        return False
    simulator.queue(run.study, run.space, following)
    return True


def _goal_allows(run: ScreenedRun, simulator: fidelity.Simulator, budget: Budget,
                 rate_rps: float, display: StatusSink) -> bool:  # fmt: skip
    """Can the run verify one more config (about three levels) and still confirm the top ones
    within its time goal (`--goal`)? Once a verified config held its simulated gain, another
    seldom beats it by more than noise (`_within_a_step`), and on a 2-core CPU the runs that
    verified a second or third config took 136-155 s against 96-105 s for one."""
    goal = run.settings.resolved_goal_s()
    if goal is None:
        return True
    s = run.settings
    plan = ConfirmPlan(run.meter, run.mode, s.top_k, s.repeats, s.rate_rps, s.robust)
    rest_s = plan.reserve_s(run.study)
    verify_s = VERIFY_LEVELS * run.meter.expected_level_s(rate_rps)
    end_s = budget.elapsed_s + verify_s + rest_s
    if end_s <= goal:
        return True
    simulator.verification_ended = (
        f"one more verified config (about {verify_s:.0f} s) and the confirmation (about "
        f"{rest_s:.0f} s) would end the run at {end_s:.0f} s, past its {goal:.0f} s goal (--goal)"
    )
    display.line(simulator.verification_ended)
    return False


async def _within_a_step(run: ScreenedRun, simulator: fidelity.Simulator, view: RunView,
                         following: Screened, start: float, display: StatusSink
                         ) -> bool:  # fmt: skip
    """Does the refitted simulator put the next config within one tolerance step of the best
    config measured so far (both read by the same model)? A rate search walks in such steps,
    so it could not tell the two apart, and a verification costs 2-4 levels (20-40 s). In
    seven built-in runs whose first verified config held, the second was verified beside it:
    six measured at most 1% above it (five below, or pruned); one 20% above, the same budget
    and threshold with the adaptive switch on, a gap the same config's runs show as noise."""
    best = max(view.finished, key=lambda t: t.capacity_rps or 0.0, default=None)
    if best is None or not best.capacity_rps:
        return False
    # Under the model that ranked the next one: as the last screening read it, if it did.
    wanted = fidelity.key(run.space.normalise(best.knobs))
    ours = next((s.capacity_rps for s in simulator.ranked
                 if fidelity.key(run.space.as_queued(s.knobs)) == wanted), None)  # fmt: skip
    if ours is None:
        ours = await simulator.capacity_of(best.knobs, start)
    step = 1 + run.settings.rel_tol
    if ours <= 0 or following.capacity_rps > step * ours:
        return False
    config = short_config(knobs_to_json(following.knobs))
    simulator.verification_ended = (
        f"the refitted simulator put the next config ({config}) at "
        f"{following.capacity_rps:.2f} req/s, within a tolerance step "
        f"({run.settings.rel_tol:.0%}) of its {ours:.2f} for the best measured config "
        f"({best.capacity_rps:.2f} measured), so no more configs were verified"
    )
    display.line(simulator.verification_ended)
    return True


async def _check_simulator(run: ScreenedRun, simulator: fidelity.Simulator, budget: Budget,
                           display: StatusSink, log: SearchLog, search: SearchFn
                           ) -> SearchLog:  # fmt: skip
    """Simulated against measured; when the simulator overstated a gain, search on the target
    for the rest of the budget."""
    view = RunView.read(run.files, run.study)
    summary = fidelity.summary(simulator, view.trials)
    summary["rule_of_thumb"] = await _rule_of_thumb(run, simulator, view)
    attrs.set_sim_summary(run.study, summary)
    if not summary["fell_back"]:
        return log
    miss, bound = summary["min_gain_error"], summary["error_bound"]
    display.line(f"the simulator overstated the gain over the default of every config it chose, "
                 f"by {miss:.0%} at least (bound {bound:.0%}): searching on the target "
                 "itself")  # fmt: skip
    return await search(run, budget, display)


async def _rule_of_thumb(run: ScreenedRun, simulator: fidelity.Simulator,
                         view: RunView) -> dict[str, Any] | None:  # fmt: skip
    """The table's config, which screening does not measure (only the default is), with its
    capacity in virtual time: the report says so instead of standing the default in for it
    (screened reports read "the rule of thumb (4096-8192 for chat) serves 7.05 req/s (the same
    as vLLM's default here)" of a budget of 4096 that no level ran). None when it is the
    default or was measured."""
    thumb = dict(reference_configs(run.space, run.scenario)).get(Role.RULE_OF_THUMB)
    if thumb is None or has_role(run.study, Role.RULE_OF_THUMB):
        return None
    default = view.with_role(Role.DEFAULT)
    start = (default.capacity_rps if default else None) or attrs.start_rate(run.study) or 1.0
    return {"config": knobs_to_json(thumb),
            "simulated_rps": await simulator.capacity_of(thumb, start)}  # fmt: skip


async def _robustness(run: ScreenedRun, simulator: fidelity.Simulator,
                      display: StatusSink) -> None:  # fmt: skip
    """The top measured configs and the default across the traffic band, in virtual time."""
    if simulator.sim is None or simulator.meter is None:
        return
    view = RunView.read(run.files, run.study)
    top = [view.trial(t.number) for t in top_trials(run.study, run.settings.top_k, run.mode)]
    default = view.with_role(Role.DEFAULT)
    numbers = {t.number for t in top}
    chosen = top + ([default] if default is not None and default.number not in numbers else [])
    if not chosen:
        return
    display.set_phase("the top configs across the traffic band, in virtual time")
    starts = [(t.knobs, t.capacity_rps or attrs.start_rate(run.study) or 1.0) for t in chosen]
    found = await robust.bands(simulator.sim, simulator.meter, starts)
    configs = [robust.band_json(t.number, t.knobs, cells)
               for t, cells in zip(chosen, found, strict=True)]  # fmt: skip
    summary = attrs.sim_summary(run.study) or {}
    attrs.set_robustness(run.study, {
        "long_factors": list(robust.LONG_FACTORS), "burstiness": list(robust.BURSTINESS),
        "long_fraction": robust.long_fraction(list(run.meter.requests)),
        "basis": f"simulated ({simulator.source})",
        "trusted": not summary.get("fell_back", False), "configs": configs,
    })  # fmt: skip
