"""The confirmation's reserve: what its levels and server starts will take, grown by what this
run's levels have actually cost."""

from __future__ import annotations

from types import SimpleNamespace

import optuna
import pytest
from optuna.trial import create_trial

from loadgen import RequestSpec
from slo import parse_slo
from tuner.measure.meter import LevelSettings, Meter
from tuner.search.loop import MAX_COST_FACTOR, REPORT_RESERVE_S, ConfirmPlan
from tuner.store.records import Mode

REQUESTS = [RequestSpec(i, [4, 5, 6, 7], 8, "short") for i in range(100)]


def plan() -> ConfirmPlan:
    meter = Meter(object(), REQUESTS, parse_slo("tpot_p99=30ms"),  # type: ignore[arg-type]
                  LevelSettings(duration_s=8.0, min_requests=20))  # fmt: skip
    return ConfirmPlan(meter, Mode.CAPACITY, top_k=2, repeats=1)


def study_with(levels: list[dict], value: float = 5.0) -> optuna.Study:
    study = optuna.create_study(direction="maximize")
    rows = {f"level_{i:03d}": row for i, row in enumerate(levels)}
    user_attrs = {"knobs": {"max_num_batched_tokens": 256}, **rows}
    study.add_trial(create_trial(value=value, params={}, distributions={}, user_attrs=user_attrs))
    return study


def test_levels_measured_again_grow_the_reserve() -> None:
    p = plan()
    level_s = p.meter.expected_level_s(5.0)
    once = study_with([{"rate_rps": 5.0, "wall_s": level_s, "tries": 1}] * 3)
    twice = study_with([{"rate_rps": 5.0, "wall_s": level_s, "tries": 2}] * 3)
    assert p.cost_factor(once.get_trials()) == 1.0
    assert p.cost_factor(twice.get_trials()) == 2.0
    # Two levels of the one top config and two of the default at its rate, each as dear again.
    extra = p.reserve_s(twice) - p.reserve_s(once)
    assert abs(extra - 4 * level_s) < 1e-6


def test_a_cheap_or_wild_run_keeps_the_reserve_within_bounds() -> None:
    p = plan()
    level_s = p.meter.expected_level_s(5.0)
    quick = study_with([{"rate_rps": 5.0, "wall_s": level_s / 4, "tries": 1}])
    stuck = study_with([{"rate_rps": 5.0, "wall_s": 50 * level_s, "tries": 3}])
    assert p.cost_factor(quick.get_trials()) == 1.0  # never below the plain estimate
    assert p.cost_factor(stuck.get_trials()) == MAX_COST_FACTOR
    # A burst (infinite rate) and rows without a wall time are not levels to go by.
    odd = study_with([{"rate_rps": float("inf"), "wall_s": 9.0}, {"rate_rps": 5.0}])
    assert p.cost_factor(odd.get_trials()) == 1.0
    assert p.reserve_s(optuna.create_study()) == REPORT_RESERVE_S


def test_a_default_among_the_top_is_kept_back_for_once_not_twice() -> None:
    """Its own re-measurement and the same-traffic check exclude each other (a config chosen
    over it cleared above its search capacity, so it is not re-measured there), and share its
    server start: the reserve holds the dearer of the two. --robust, which re-measures the
    default whatever beat it, holds both."""
    start_s = 40.0  # what each server start has cost so far
    target = SimpleNamespace(starts=[({}, start_s)])
    meter = Meter(target, REQUESTS, parse_slo("tpot_p99=30ms"),  # type: ignore[arg-type]
                  LevelSettings(duration_s=8.0, min_requests=20))  # fmt: skip
    study = study_with([])  # a searched config at 5 req/s
    default = {"knobs": {"max_num_batched_tokens": 2048}, "role": "default"}
    study.add_trial(create_trial(value=4.0, params={}, distributions={}, user_attrs=default))
    level_s = meter.expected_level_s
    searched, own, same_rate = 2 * level_s(5.0), 2 * level_s(4.0), 2 * level_s(5.0)
    plain = ConfirmPlan(meter, Mode.CAPACITY, top_k=2, repeats=1)
    assert plain.reserve_s(study) == pytest.approx(
        REPORT_RESERVE_S + searched + max(own, same_rate) + 2 * start_s
    )
    robust = ConfirmPlan(meter, Mode.CAPACITY, top_k=2, repeats=1, robust=True)
    assert robust.reserve_s(study) == pytest.approx(
        REPORT_RESERVE_S + searched + own + same_rate + 3 * start_s
    )
    # The default not among the top: the same-traffic check still needs its start.
    alone = study_with([])
    assert plain.reserve_s(alone) == pytest.approx(
        REPORT_RESERVE_S + searched + same_rate + 2 * start_s
    )
