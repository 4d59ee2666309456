"""When the simulator's check sends the search back to the target: an overstated gain over the
default, not a capacity that the machine's drifting speed moved."""

import optuna
import pytest
from optuna.trial import TrialState

from tuner.search.fidelity import Simulator, summary
from tuner.search.pruner import CapacityPruner
from tuner.search.screened import keep_verifying
from tuner.store.attrs import role_attrs
from tuner.store.records import Role, TrialRecord

DEFAULT = {"max_num_batched_tokens": 2048}
SMALL = {"max_num_batched_tokens": 256}
MID = {"max_num_batched_tokens": 512}


def trial(number, role, knobs, capacity, predicted=None, default_predicted=None, upper=None,
          state=TrialState.COMPLETE):  # fmt: skip
    return TrialRecord(number, state, role, knobs, capacity_rps=capacity,
                       upper_bound_rps=upper, predicted_rps=predicted,
                       predicted_default_rps=default_predicted)  # fmt: skip


def simulator():
    return Simulator(target=None, steps=None, profile=None, source="a model")


def test_a_winner_measured_far_better_than_simulated_does_not_send_the_search_back():
    # The run that prompted this: 256 simulated at 6.03 beside a default at 5.9, measured at
    # 8.94 against 4.50. Capacity error 33%, but the simulator ranked it right.
    trials = [
        trial(0, Role.DEFAULT, DEFAULT, 4.50),
        trial(1, Role.SCREENED, SMALL, 8.94, predicted=6.03, default_predicted=5.9),
    ]
    out = summary(simulator(), trials, bound=0.2)
    (verified,) = out["verified"]
    assert verified["capacity_err"] > 0.3
    assert verified["gain_err"] == 0.0
    assert not out["fell_back"] and out["max_error"] > 0.3


def test_a_gain_overstated_past_the_bound_sends_the_search_back():
    # Simulated 1.6x the default; measured at the default's own capacity.
    trials = [
        trial(0, Role.DEFAULT, DEFAULT, 5.0),
        trial(1, Role.SCREENED, SMALL, 5.0, predicted=8.0, default_predicted=5.0),
    ]
    out = summary(simulator(), trials, bound=0.2)
    assert out["verified"][0]["gain_err"] == pytest.approx(0.6)
    assert out["fell_back"] and out["max_gain_error"] == pytest.approx(0.6)


def test_a_pruned_config_is_judged_from_its_lowest_failing_rate():
    # Failed at 6.0 where the simulator put it at 9.0 over a default of 5.0: its gain over the
    # measured 5.0 is below 1.2, against 1.8 simulated.
    trials = [trial(0, Role.DEFAULT, DEFAULT, 5.0),
              trial(1, Role.SCREENED, MID, 0.0, predicted=9.0, default_predicted=5.0, upper=6.0,
                    state=TrialState.PRUNED)]  # fmt: skip
    out = summary(simulator(), trials, bound=0.2)
    (verified,) = out["verified"]
    assert verified["measured_rps"] is None and verified["gain_err"] == pytest.approx(0.5)
    assert out["fell_back"]


def test_a_study_queued_without_the_defaults_prediction_is_judged_on_capacity():
    trials = [
        trial(0, Role.DEFAULT, DEFAULT, 4.5),
        trial(1, Role.SCREENED, SMALL, 8.94, predicted=6.03),
    ]
    out = summary(simulator(), trials, bound=0.2)
    assert out["verified"][0]["gain_err"] is None
    assert out["fell_back"]


def test_a_gain_within_the_rate_ladder_step_does_not_send_the_search_back():
    # A built-in run: 256 simulated at 9.82 and measured at 9.82 (failing at 11.29), beside a
    # default simulated at 6.70 and measured at 8.23. Against the last rate passed the gain
    # reads 23% overstated; its capacity may lie up to 11.29, which allows a gain of 1.37
    # against 1.47 simulated (7%).
    trials = [
        trial(0, Role.DEFAULT, DEFAULT, 8.23, upper=9.47),
        trial(1, Role.SCREENED, SMALL, 9.82, predicted=9.82, default_predicted=6.70, upper=11.29),
    ]
    out = summary(simulator(), trials, bound=0.2)
    (verified,) = out["verified"]
    assert verified["capacity_err"] == 0.0
    assert verified["gain_err"] == pytest.approx((9.82 / 6.70) / (11.29 / 8.23) - 1)
    assert not out["fell_back"]
    # Simulated further (14.0, 2.1x the default) both its gain and its capacity (24% over the
    # failing 11.29) are overstated past the bound.
    trials[1] = trial(1, Role.SCREENED, SMALL, 9.82, predicted=14.0, default_predicted=6.70,
                      upper=11.29)  # fmt: skip
    assert summary(simulator(), trials, bound=0.2)["fell_back"]


def test_one_config_the_simulator_got_right_keeps_the_search_on_its_picks():
    # A built-in run: 256 / 128 adaptive simulated 1.60x the default and measured 1.53x at
    # most (within 5%), beside a 752 / 96 pruned where it allowed 1.40x against 1.71x (22%).
    right = trial(1, Role.SCREENED, SMALL, 6.47, predicted=9.84, default_predicted=6.15,
                  upper=7.44)  # fmt: skip
    wrong = trial(2, Role.SCREENED, MID, 0.0, predicted=9.01, default_predicted=5.27, upper=6.81,
                  state=TrialState.PRUNED)  # fmt: skip
    default = trial(0, Role.DEFAULT, DEFAULT, 4.86, upper=5.59)
    out = summary(simulator(), [default, right, wrong], bound=0.2)
    assert out["max_gain_error"] == pytest.approx(0.22, abs=0.005)
    assert out["min_gain_error"] == pytest.approx(0.046, abs=0.005)
    assert not out["fell_back"]
    # Had the first also missed its promise, nothing the simulator chose held: measure for real.
    missed = trial(1, Role.SCREENED, SMALL, 5.0, predicted=9.84, default_predicted=6.15,
                   upper=5.75)  # fmt: skip
    out = summary(simulator(), [default, missed, wrong], bound=0.2)
    assert out["fell_back"] and out["min_gain_error"] > 0.2


def test_a_simulator_that_missed_every_pick_chooses_again_before_the_real_search():
    # s2 of docs/tuner.md: 432 / 32 and 256 / 64 (adaptive) simulated at 11.12 and 9.60 beside
    # a default at 7.16, each failing one tolerance step below, the default measured at 7.82:
    # gains 26% overstated, capacities 15%, within the bound, so no longer a miss.
    default = trial(0, Role.DEFAULT, DEFAULT, 7.82, upper=8.99)
    first = trial(1, Role.SCREENED, MID, 0.0, predicted=11.12, default_predicted=7.16,
                  upper=9.67, state=TrialState.PRUNED)  # fmt: skip
    second = trial(2, Role.SCREENED, SMALL, 0.0, predicted=9.60, default_predicted=7.16,
                   upper=8.35, state=TrialState.PRUNED)  # fmt: skip
    assert not summary(simulator(), [default, first, second], bound=0.2)["fell_back"]
    # Each failing two steps below: both past the bound on both counts.
    first.upper_bound_rps, second.upper_bound_rps = 8.41, 7.26
    missed = summary(simulator(), [default, first, second], bound=0.2)
    assert missed["fell_back"]
    # The first verify_top rounds always run; past them only while every pick missed, and at
    # most as many again.
    assert [keep_verifying(r, 2, missed) for r in range(5)] == [True, True, True, True, False]
    # A third pick that holds its gain (256 at 8.65 measured, simulated 1.15x the default)
    # ends the extra rounds, and the run keeps to the simulator's picks.
    third = trial(3, Role.SCREENED, {"max_num_batched_tokens": 272}, 8.65, predicted=8.20,
                  default_predicted=7.16, upper=9.57)  # fmt: skip
    held = summary(simulator(), [default, first, second, third], bound=0.2)
    assert not held["fell_back"] and held["configs_verified"] == 3
    assert not keep_verifying(3, 2, held)
    assert [keep_verifying(r, 2, {"fell_back": False}) for r in range(3)] == [True, True, False]


async def test_configs_not_screened_again_after_a_refit_move_with_the_default(monkeypatch):
    # The refit read every config 30% slower; only the best 24 are screened again. A config
    # ranked 25th under the old model kept its old 5.0 req/s, above every re-screened one
    # (4.2-5.6 x 0.7), and would have been verified next on a figure no model holds any more.
    from tuner.search import fidelity
    from tuner.sim.screen import Screened, Screening

    old = {i: 6.0 + 0.1 * i for i in range(24)}
    configs = [{"max_num_batched_tokens": 256 + 16 * i} for i in range(24)]
    configs[0] = DEFAULT

    async def rescreened(sim, meter, knobs_list, start_rps):
        index = {str(k): i for i, k in enumerate(configs)}
        out = [Screened(k, 0.7 * old[index[str(k)]], 3) for k in knobs_list]
        return Screening(sorted(out, key=lambda s: -s.capacity_rps), 0.01)

    monkeypatch.setattr(fidelity, "screen", rescreened)
    sim = simulator()
    sim.sim, sim.meter = object(), object()
    last = {"max_num_batched_tokens": 8192}
    sim.ranked = sorted([Screened(k, old[i], 3) for i, k in enumerate(configs)]
                        + [Screened(last, 5.0, 3)], key=lambda s: -s.capacity_rps)  # fmt: skip
    sim.default_rps = old[0]

    class Space:
        def default_config(self):
            return DEFAULT

    ranked = await sim.rescreen(Space(), 5.0)
    assert sim.default_rps == pytest.approx(0.7 * old[0])
    assert ranked[-1].knobs == last and ranked[-1].capacity_rps == pytest.approx(3.5)


def test_a_capacity_simulated_right_beside_a_default_simulated_wrong_does_not_send_it_back():
    # A built-in run: after a refit the default was simulated at 6.18 req/s (measured 9.05),
    # and 432 / 224 adaptive at 11.79, measured at 11.78 (failing at 13.55). Its gain reads
    # 27% overstated, its capacity exactly right: the simulator chose well.
    trials = [
        trial(0, Role.DEFAULT, DEFAULT, 9.05),
        trial(1, Role.SCREENED, MID, 11.78, predicted=11.79, default_predicted=6.18, upper=13.55),
    ]
    out = summary(simulator(), trials, bound=0.2)
    (verified,) = out["verified"]
    assert verified["gain_err"] > 0.2 and verified["overshoot"] == 0.0
    assert not out["fell_back"]


def test_a_screened_config_right_on_capacity_is_not_pruned_for_its_gain():
    study = optuna.create_study(direction="maximize", pruner=CapacityPruner(gain_bound=0.2))
    study.enqueue_trial({}, user_attrs=role_attrs(Role.DEFAULT))
    study.tell(study.ask(), 9.05)
    study.enqueue_trial({}, user_attrs=role_attrs(Role.SCREENED, 11.79, 6.18))
    trial = study.ask()
    trial.report(13.55, 1)  # passed 11.78, failed 13.55: the capacity is as simulated
    assert not trial.should_prune()
    trial.report(9.5, 2)  # had it failed at 9.5, both would be overstated past the bound
    assert trial.should_prune()
