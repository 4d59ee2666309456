"""Bootstrap intervals: they cover the truth, shrink with data, and gate the recommendation."""

import numpy as np

from loadgen.records import RequestRecord
from slo import parse_slo
from tuner.measure.bootstrap import RequestSamples, goodput_interval, term_intervals
from tuner.measure.judge import Run, capacity_interval, served_fraction
from tuner.measure.verdict import MIN_SERVED_FRACTION, VerdictRules


def records(tpot_s, n=200, seed=0, start=0.0, spread=0.2, fail=0, service_s=0.0, free_slots=0):
    """Requests of 20 tokens, one chunk per token, whose TPOT is lognormal around `tpot_s`.

    Arrivals are 0.1 s apart; `service_s` > 0.1 makes a server that starts one request every
    `service_s`, so its queue grows and it falls behind. With `free_slots` it first admits that
    many on arrival (a batch with room), and falls behind only after.
    """
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        sent = start + i * 0.1
        gap = tpot_s * rng.lognormal(0.0, spread)
        slow = start + free_slots * 0.1 + max(0, i - free_slots) * service_s
        first = max(sent, slow if i >= free_slots else sent) + 0.05
        times = [first + k * gap for k in range(20)]
        rec = RequestRecord(
            i,
            "short",
            100,
            20,
            scheduled_s=sent,
            sent_s=sent,
            chunk_times_s=times,
            chunk_tokens=[1] * 20,
            prompt_tokens=100,
            output_tokens=20,
            success=True,
            finished_s=times[-1],
        )
        if i < fail:
            rec.fail("HTTP 500", sent + 0.01)
        out.append(rec)
    return out


SLO = parse_slo("tpot_p99=30ms")
RULES = VerdictRules(require_schedule=False)


def term(recs, n_boot=300):
    return term_intervals(RequestSamples(recs), SLO, n_boot=n_boot)[0]


def levels(*pairs):
    return [Run(rate, recs) for rate, recs in pairs]


def test_interval_brackets_the_point_and_clears_only_with_room_to_spare():
    comfortable = term(records(0.015))
    interval = comfortable.interval_s
    assert interval.low <= comfortable.value_s == interval.point <= interval.high
    assert comfortable.clears and comfortable.margin_frac > 0
    # A p99 right at the limit passes as a point but its interval does not clear.
    edge = term(records(0.0205))
    assert edge.holds and edge.value_s <= 0.030 < edge.interval_s.high
    assert not edge.clears


def test_more_requests_narrow_the_interval():
    small = term(records(0.015, n=50)).interval_s
    large = term(records(0.015, n=800)).interval_s
    assert large.high - large.low < small.high - small.low


def test_capacity_interval_follows_the_levels():
    measured = levels(
        (1.0, records(0.010, seed=1)),
        (2.0, records(0.015, seed=2)),
        (4.0, records(0.040, seed=3)),
    )
    interval = capacity_interval(measured, SLO, RULES, n_boot=200)
    assert interval.point == 2.0 and interval.low >= 1.0 and interval.high == 2.0
    # A server that falls behind at 4 req/s caps capacity even with fast tokens.
    behind = levels((2.0, records(0.010, seed=1)), (4.0, records(0.010, seed=2, service_s=0.2)))
    assert capacity_interval(behind, SLO, RULES, n_boot=50).point == 2.0
    # Errors at 2 req/s fail that level however fast the rest were.
    failing = levels((1.0, records(0.010)), (2.0, records(0.015, fail=10)))
    assert capacity_interval(failing, SLO, RULES, n_boot=50).point == 1.0


def test_goodput_counts_good_requests_per_second():
    recs = records(0.015, n=100)
    duration = max(r.finished_s for r in recs) - min(r.sent_s for r in recs)
    g = goodput_interval(recs, SLO, n_boot=200)
    assert abs(g.point - 100 / duration) < 1e-9 and g.low <= g.point <= g.high


def test_served_fraction_is_one_when_keeping_up_and_the_rate_ratio_when_not():
    assert served_fraction(records(0.010, n=100)) == 1.0
    # A server starting one request per 0.2 s against arrivals every 0.1 s serves half.
    assert abs(served_fraction(records(0.010, n=100, service_s=0.2)) - 0.5) < 0.02
    # Long outputs spread completions but not the waits: still kept up.
    assert served_fraction(records(0.200, n=100, spread=1.0)) == 1.0
    # A server whose free batch slots absorb the first half of the arrivals, then starts one
    # request every 0.125 s, sustains 0.8 of the rate and falls behind: read over the whole
    # level the flat start would pass it (0.89 against the 0.85 rule).
    filling = records(0.010, n=100, service_s=0.125, free_slots=50)
    assert abs(served_fraction(filling) - 0.8) < 0.01 < MIN_SERVED_FRACTION - 0.8
    # A queue built over the first half (a heavier first half of the draw) and carried, flat,
    # through the second: the second half alone shows no trend, the whole level does.
    carried = records(0.010, n=100)
    for i, r in enumerate(carried):
        shift = min(i, 50) * 0.1
        r.chunk_times_s = [c + shift for c in r.chunk_times_s]
        r.finished_s += shift
    assert served_fraction(carried) < MIN_SERVED_FRACTION
    assert served_fraction(carried[50:]) == 1.0
    # Everything at once has no sustained rate to judge.
    burst = records(0.010, n=20)
    for r in burst:
        r.scheduled_s = 0.0
    assert served_fraction(burst) == 1.0


def test_a_level_stopped_with_its_slo_broken_fails_in_every_resample():
    # What a stopped level keeps: its first 10 requests, 2 of them far over the 30 ms limit.
    kept = records(0.010, n=10, seed=4)
    for r in kept[3], kept[7]:
        r.chunk_times_s = [r.chunk_times_s[0] + k * 0.080 for k in range(20)]
    passing = Run(1.0, records(0.010, seed=1))
    # Resampled, 10 requests often draw neither slow one: read as a whole level, the rate
    # above would pass in some resamples and lift the interval's top to it.
    as_whole = capacity_interval([passing, Run(2.0, kept)], SLO, RULES, n_boot=400)
    assert as_whole.point == 1.0 and as_whole.high == 2.0
    stopped = capacity_interval([passing, Run(2.0, kept, stopped=True)], SLO, RULES, n_boot=400)
    assert stopped.point == 1.0 and stopped.high == 1.0
