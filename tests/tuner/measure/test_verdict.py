"""One verdict: every way of judging a level gives the same answer for the same requests."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loadgen.records import RequestRecord
from slo import evaluate, parse_slo
from tuner.measure.judge import (
    Run,
    capacity_interval,
    confirmed_capacity,
    judge_report,
    judge_runs,
    served_fraction,
)
from tuner.measure.verdict import (
    Failure,
    Interval,
    LevelVerdict,
    TermVerdict,
    VerdictRules,
    capacity_envelope,
)

SLO = parse_slo("tpot_p99=30ms,ttft_p99=1s")
RULES = VerdictRules()


def records(tpots, fail=0, gap_s=0.1):
    out = []
    for i, tpot in enumerate(tpots):
        sent = i * gap_s
        times = [sent + 0.05 + k * tpot for k in range(8)]
        rec = RequestRecord(i, "short", 64, 8, scheduled_s=sent, sent_s=sent, chunk_times_s=times,
                            chunk_tokens=[1] * 8, prompt_tokens=64, output_tokens=8, success=True,
                            finished_s=times[-1])  # fmt: skip
        if i < fail:
            rec.fail("HTTP 500", sent)
        out.append(rec)
    return out


@settings(max_examples=40, deadline=None)
@given(
    tpots=st.lists(st.floats(0.001, 0.06), min_size=1, max_size=40),
    fail=st.integers(0, 3),
    schedule_ok=st.booleans(),
)
def test_the_search_and_the_pooled_confirmation_give_one_answer(tpots, fail, schedule_ok):
    recs = records(tpots, fail=min(fail, len(tpots)))
    rules = VerdictRules(require_schedule=True)
    search = judge_report(evaluate(recs, SLO), 4.0, served_fraction(recs), schedule_ok, rules)
    pooled = judge_runs([Run(4.0, recs, schedule_ok)], SLO, rules, 4.0)
    assert search.passed == pooled.passed and search.failure() == pooled.failure()
    assert search.error_rate == pooled.error_rate
    for a, b in zip(search.terms, pooled.terms, strict=True):
        assert a.name == b.name and (a.value_s == b.value_s or math.isclose(a.value_s, b.value_s))


def test_an_empty_run_fails_the_same_way_on_every_path():
    search = judge_report(evaluate([], SLO), 2.0, served_fraction([]), True, RULES)
    pooled = judge_runs([Run(2.0, [])], SLO, RULES, 2.0, seed=0)
    # No request, no error, no latency: the SLO fails (every term is inf), not the error rule.
    assert search.failure() is pooled.failure() is Failure.SLO
    assert search.error_rate == pooled.error_rate == 0.0


def verdict(**kw):
    term = TermVerdict(SLO.terms[0], kw.pop("tpot_s", 0.010), kw.pop("interval", None))
    base = dict(rate_rps=8.0, terms=(term,), error_rate=0.0, served_fraction=1.0,
                schedule_ok=True, rules=RULES)  # fmt: skip
    return LevelVerdict(**{**base, **kw})


@pytest.mark.parametrize(
    ("kw", "failure", "reason"),
    [
        ({}, None, "nothing: it held at 8.00 req/s"),
        ({"error_rate": 0.02, "tpot_s": 0.05}, Failure.ERRORS,
         "errors: 2% of requests failed at 8.00 req/s"),
        ({"tpot_s": 0.0412, "served_fraction": 0.5}, Failure.SLO,
         "tpot_p99 41.2 ms over its limit at 8.00 req/s"),
        ({"served_fraction": 0.8}, Failure.QUEUE,
         "queue: completions kept pace with only 80.0% of arrivals at 8.00 req/s"),
        ({"schedule_ok": False}, Failure.SCHEDULE,
         "the load generator fell behind its schedule at 8.00 req/s"),
    ],
)  # fmt: skip
def test_the_first_rule_broken_is_the_reason_given(kw, failure, reason):
    v = verdict(**kw)
    assert v.failure() is failure and v.passed == (failure is None) and v.reason() == reason


def test_rules_that_do_not_apply_do_not_fail_a_level():
    # --rate mode pays for a queue in goodput; in process the client cannot skew chunk times.
    lenient = VerdictRules(require_keep_up=False, require_schedule=False)
    assert verdict(served_fraction=0.5, schedule_ok=False, rules=lenient).passed


def test_a_confirmation_asks_the_whole_interval_to_hold():
    # The point estimate holds, the interval reaches over the limit: passes, does not clear.
    edge = verdict(tpot_s=0.028, interval=Interval(0.028, 0.020, 0.035))
    assert edge.passed and not edge.clears and edge.failure(whole_interval=True) is Failure.SLO
    assert verdict(tpot_s=0.028, interval=Interval(0.028, 0.020, 0.029)).clears


@pytest.mark.parametrize(
    ("levels", "expected"),
    [
        ([], (0.0, math.inf)),
        ([(2.0, True), (4.0, True)], (4.0, math.inf)),
        ([(2.0, True), (4.0, False), (3.0, True)], (3.0, 4.0)),
        # Noise above a failure does not count: the first failure bounds capacity.
        ([(2.0, True), (3.0, False), (5.0, True)], (2.0, 3.0)),
        ([(1.0, False)], (0.0, 1.0)),
    ],
)
def test_the_capacity_envelope(levels, expected):
    assert capacity_envelope(levels) == expected


def test_the_capacity_interval_judges_resamples_by_the_same_rules():
    rng = np.random.default_rng(0)
    ok = records(rng.uniform(0.005, 0.015, 60))
    slow = records(rng.uniform(0.040, 0.060, 60))
    runs = [Run(2.0, ok), Run(4.0, ok), Run(6.0, slow)]
    assert capacity_interval(runs, SLO, RULES, n_boot=50).point == 4.0
    # The client fell behind at 4 req/s over HTTP: that level cannot count as a pass.
    lagged = [Run(2.0, ok), Run(4.0, ok, schedule_ok=False), Run(6.0, slow)]
    assert capacity_interval(lagged, SLO, RULES, n_boot=50).point == 2.0


def test_a_confirmed_rate_holds_on_each_draw_not_only_pooled():
    rng = np.random.default_rng(1)
    calm = records(rng.uniform(0.005, 0.012, 380))
    # A short draw whose slowest request misses: its own p99 is over the limit, while pooled
    # with the calm draw it is a quarter of 1% of the requests.
    unlucky = records([*rng.uniform(0.005, 0.012, 29), 0.050])
    pooled = judge_runs([Run(4.0, calm), Run(4.0, unlucky)], SLO, RULES, 4.0, seed=0)
    assert pooled.clears
    capacity, verdicts = confirmed_capacity(
        [Run(2.0, calm), Run(2.0, calm), Run(4.0, calm), Run(4.0, unlucky)], SLO, RULES
    )
    # 4 req/s missed on one draw: the promise is 2, and the report names what missed at 4.
    assert capacity == 2.0
    missed = verdicts[4.0]
    assert not missed.passed and missed.failure() is Failure.SLO
    assert missed.binding.term.metric.value == "tpot" and missed.binding.value_s > 0.03
