"""Typed records through Optuna's attributes and JSON and back: nothing lost, nothing reshaped."""

import math

import optuna
from optuna.trial import TrialState

from slo import parse_slo
from tuner.measure.meter import LatencyFigures, LevelRecord
from tuner.measure.verdict import Interval, LevelVerdict, TermVerdict, VerdictRules
from tuner.store import attrs
from tuner.store.codec import confirmation_from_json, confirmation_json, level_row, term_json
from tuner.store.records import Candidate, Confirmation, Role, SameRateCheck, TrialEnding
from tuner.targets.base import ServerStats
from tuner.targets.knobs import KNOBS

optuna.logging.set_verbosity(optuna.logging.WARNING)
SLO = parse_slo("tpot_p99=30ms,ttft_p99=2s")
RULES = VerdictRules(require_schedule=True)
KNOB_VALUES = {"max_num_batched_tokens": 512, "max_num_seqs": 128}


def verdict(rate: float, tpot_s: float, interval: bool = False, ttft_high_s: float = 0.6):
    tpot, ttft = SLO.terms
    spread = Interval(tpot_s, 0.75 * tpot_s, 1.25 * tpot_s) if interval else None
    ttft_interval = Interval(0.5, 0.4, ttft_high_s) if interval else None
    terms = (TermVerdict(tpot, tpot_s, spread), TermVerdict(ttft, 0.5, ttft_interval))
    return LevelVerdict(rate, terms, 0.0, 0.97, True, RULES)


def level(rate: float, tpot_s: float) -> LevelRecord:
    return LevelRecord(verdict(rate, tpot_s), 3.5, 3.9, LatencyFigures(tpot_p99_s=tpot_s), 9.5,
                       0.002, ServerStats(1, 0.6, 0.3))  # fmt: skip


def close(a, b) -> bool:
    """Equal JSON, floats to 1e-12 (milliseconds go through seconds and back)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(close(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(map(close, a, b))
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-12)
    return a == b


def test_a_trial_reads_back_as_it_was_written():
    study = optuna.create_study(direction="maximize")
    study.enqueue_trial({}, user_attrs=attrs.role_attrs(Role.DEFAULT))
    trial = study.ask()
    attrs.start_trial(trial, attrs.role_of(trial), KNOB_VALUES)
    attrs.save_level(trial, 0, level(4.0, 0.012))
    attrs.save_level(trial, 1, level(8.0, math.inf))  # nothing succeeded at 8 req/s
    attrs.end_capacity(trial, TrialEnding.CONVERGED, 4.0, 8.0)
    study.tell(trial, 4.0)
    record = attrs.read_trial(study.trials[0], SLO, RULES)
    assert record.role is Role.DEFAULT and record.state is TrialState.COMPLETE
    assert record.knobs == KNOB_VALUES and record.ending is TrialEnding.CONVERGED
    assert (record.capacity_rps, record.upper_bound_rps) == (4.0, 8.0)
    first, second = record.levels
    assert first == level(4.0, 0.012)  # every field, typed
    assert first.passed and not second.passed and second.verdict.terms[0].value_s == math.inf
    assert second.verdict.reason() == "tpot_p99 over its limit at 8.00 req/s"


def test_a_level_row_keeps_the_trials_table_columns():
    row = level_row(level(4.0, 0.012))
    # The binding term is the one with the least room: TPOT at 12 of 30 ms, TTFT at 0.5 of 2 s.
    assert row["slo_tpot_p99_s"] == 0.012 and row["binding"] == "tpot_p99"
    assert row["passed"] is True and row["preemptions"] == 1 and row["tpot_p99_s"] == 0.012
    assert set(row) >= {"rate_rps", "slo_met", "served_fraction", "schedule_ok", "goodput_rps",
                        "binding_margin", "kv_cache_usage_max", "ttft_p50_s"}  # fmt: skip


def test_one_shape_per_slo_term():
    t = term_json(verdict(4.0, 0.012, interval=True).terms[0])
    assert close(t, {"term": "tpot_p99=30ms", "metric": "tpot_p99", "limit_ms": 30.0,
                    "value_ms": 12.0, "low_ms": 9.0, "high_ms": 15.0, "margin": 0.6,
                    "clears": True})  # fmt: skip
    point = term_json(verdict(4.0, 0.012).terms[0])
    assert set(point) == set(t) and point["low_ms"] is None and point["clears"] is True


def test_a_confirmation_survives_its_file():
    cand = Candidate(7, Role.SEARCH, {"max_num_batched_tokens": 512}, 9.0,
                     verdict(8.0, 0.021, interval=True), repeats=1, confirmed_rps=8.0,
                     capacity_ci=Interval(8.0, 6.0, 9.0))  # fmt: skip
    same = SameRateCheck(8.0, verdict(8.0, 0.041, interval=True), cand.verdict, 1)
    conf = Confirmation([cand], 7, same, "time budget", 120.5)
    data = confirmation_json(conf)
    again = confirmation_from_json(data, SLO, RULES)
    assert close(confirmation_json(again), data)
    assert again.chosen.knobs == cand.knobs and again.chosen.verdict.clears
    assert data["default_at_recommended_rate"]["default"]["meets_slo"] is False
    assert set(KNOBS) >= set(again.chosen.knobs)


def test_an_interval_that_reaches_infinity_is_null_in_json_and_inf_again():
    # A resample with no successful request has an infinite p99.
    endless = verdict(8.0, 0.02, interval=True, ttft_high_s=math.inf)
    cand = Candidate(1, Role.SEARCH, {}, 8.0, endless, repeats=1, confirmed_rps=0.0)
    data = confirmation_json(Confirmation([cand], None, None, "", None))
    assert data["candidates"][0]["terms"][1]["high_ms"] is None
    again = confirmation_from_json(data, SLO, RULES).candidates[0].verdict
    assert again.terms[1].interval_s.high == math.inf and not again.clears
