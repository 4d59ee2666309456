"""One trial on the simulated target: how a rate search that ends early is told to the study."""

import asyncio

import optuna
import pytest
from optuna.trial import TrialState

from loadgen import build_workload
from slo import parse_slo
from tuner.measure.meter import LevelSettings, Meter
from tuner.measure.ratesearch import RateSearchSettings
from tuner.report.live import RunStatus, StatusSink
from tuner.search.space import SpaceFacts, build_space
from tuner.search.trial import TrialRunner
from tuner.store.attrs import role_attrs
from tuner.store.records import Mode, Role, TrialEnding, rules_for
from tuner.store.runfiles import RunFiles

optuna.logging.set_verbosity(optuna.logging.WARNING)


def runner(tmp_path, target, clock, start_rps: float) -> TrialRunner:
    requests = build_workload("mixed", num_requests=40, seed=0, vocab_size=4096).requests
    meter = Meter(target, requests, parse_slo("tpot_p99=30ms"), LevelSettings(duration_s=1.0),
                  rules_for(Mode.CAPACITY, False), clock)  # fmt: skip
    space = build_space(target.knobs, SpaceFacts(16, 8192, 4000))
    return TrialRunner(meter, space, RateSearchSettings(start_rps, rel_tol=0.2),
                       RunFiles(tmp_path), StatusSink(RunStatus(4, 600.0, clock)))  # fmt: skip


async def test_a_trial_cut_by_the_deadline_before_any_pass_fails_rather_than_scoring_zero(
    tmp_path, sim_target, fake_clock
):
    study = optuna.create_study(direction="maximize")
    # 20 req/s is far above any config's simulated capacity: the one level it gets fails.
    run = runner(tmp_path, sim_target, fake_clock, start_rps=20.0)
    record = await run.run(study, study.ask(), deadline_s=fake_clock() - 1)
    assert len(record.levels) == 1 and record.ending is TrialEnding.TIME_BUDGET
    assert record.state is TrialState.FAIL and record.value is None
    assert study.trials[0].state is TrialState.FAIL and study.trials[0].value is None


async def test_a_reference_starts_at_its_own_rate_not_at_the_best_so_far(
    tmp_path, sim_target, fake_clock
):
    study = optuna.create_study(direction="maximize")
    study.add_trial(optuna.trial.create_trial(value=11.0))  # a better config found earlier
    study.enqueue_trial({}, user_attrs=role_attrs(Role.DEFAULT))
    run = runner(tmp_path, sim_target, fake_clock, start_rps=4.0)
    record = await run.run(study, study.ask())
    assert record.levels[0].rate_rps == 4.0  # not 11 req/s, where it fails at once
    assert record.state is TrialState.COMPLETE and record.ending is TrialEnding.CONVERGED
    assert record.capacity_rps > 0 and len(record.levels) > 1


async def test_a_reference_cut_after_a_pass_keeps_that_rate_as_a_lower_bound(
    tmp_path, sim_target, fake_clock
):
    study = optuna.create_study(direction="maximize")
    study.enqueue_trial({}, user_attrs=role_attrs(Role.DEFAULT))
    run = runner(tmp_path, sim_target, fake_clock, start_rps=2.0)
    record = await run.run(study, study.ask(), deadline_s=fake_clock() - 1)
    assert len(record.levels) == 1 and record.levels[0].passed
    assert record.state is TrialState.COMPLETE and record.ending is TrialEnding.TIME_BUDGET
    assert record.value == record.capacity_rps == 2.0


async def test_a_screened_config_starts_a_step_below_its_prediction_a_placed_default_above(
    tmp_path, sim_target, fake_clock
):
    # The simulator's top picks are those it overstates most: their search starts one
    # tolerance step (20% here) below the prediction. A default it placed is only a hint,
    # which the first fit (burst and small-budget level) reads slow: a step above it.
    study = optuna.create_study(direction="maximize")
    study.enqueue_trial({}, user_attrs=role_attrs(Role.SCREENED, predicted_rps=12.0,
                                                  predicted_default_rps=6.0))  # fmt: skip
    study.enqueue_trial({}, user_attrs=role_attrs(Role.DEFAULT, start_hint_rps=9.0))
    run = runner(tmp_path, sim_target, fake_clock, start_rps=4.0)
    screened = await run.run(study, study.ask())
    default = await run.run(study, study.ask())
    assert abs(screened.levels[0].rate_rps - 10.0) < 1e-6
    assert abs(default.levels[0].rate_rps - 10.8) < 1e-6


async def test_a_default_queued_again_after_a_deadline_cut_goes_on_and_starts_nothing_late(
    tmp_path, sim_target, fake_clock
):
    # The first attempt fails 20 req/s and has no time for 10 (a level on a slow target takes
    # minutes): it ran its first level past the deadline, the next attempt runs none there.
    study = optuna.create_study(direction="maximize")
    run = runner(tmp_path, sim_target, fake_clock, start_rps=20.0)
    default, attempts = run.space.to_params(run.space.default_config()), []
    for deadline_s in (fake_clock() - 1, fake_clock() - 1, None):
        study.enqueue_trial(default, user_attrs=role_attrs(Role.DEFAULT))
        attempts.append(await run.run(study, study.ask(), deadline_s=deadline_s))
    cut, waited, done = attempts
    assert [lv.rate_rps for lv in cut.levels] == [20.0] and cut.left_out.rate_rps == 10.0
    assert waited.levels == [] and waited.ending is TrialEnding.TIME_BUDGET
    assert waited.continues == cut.number and waited.carried == [(20.0, False)]
    assert waited.left_out.rate_rps == 10.0 and waited.state is TrialState.FAIL
    # With time, the third goes on from the second (which carries the first): 10 req/s first.
    assert done.continues == waited.number and done.carried == [(20.0, False)]
    assert done.levels[0].rate_rps == 10.0 and 20.0 not in [lv.rate_rps for lv in done.levels]
    assert done.state is TrialState.COMPLETE and 0 < done.capacity_rps < 20.0
    assert done.upper_bound_rps <= 20.0 and done.left_out is None


async def test_a_trial_a_kill_cut_goes_on_with_its_next_level_as_a_new_one_runs_its_first(
    tmp_path, faulty_target, fake_clock
):
    study = optuna.create_study(direction="maximize")
    killed = runner(tmp_path, faulty_target(at_level=2), fake_clock, start_rps=20.0)
    default = killed.space.to_params(killed.space.default_config())
    study.enqueue_trial(default, user_attrs=role_attrs(Role.DEFAULT))
    with pytest.raises(asyncio.CancelledError):  # Ctrl-C during its second level
        await killed.run(study, study.ask())
    # The interrupted trial queued its config again; past the deadline, its next level runs.
    run = runner(tmp_path, faulty_target(), fake_clock, start_rps=20.0)
    record = await run.run(study, study.ask(), deadline_s=fake_clock() - 1)
    assert record.continues == 0 and record.carried == [(20.0, False)]
    assert [lv.rate_rps for lv in record.levels] == [10.0]
