"""A search level stops once its SLO is already broken, and only then: the rule never stops a
level whose whole run would have passed, and the real engine's failing level ends sooner with
the verdict it would have had."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from engine_lite import EngineConfig
from loadgen import RequestRecord, build_workload
from loadgen.stop import was_stopped
from slo import evaluate, parse_slo
from slo.requests import request_latency
from tuner.measure.early_stop import AllBroken, SloBroken, over_needed
from tuner.measure.meter import LevelSettings, Meter
from tuner.measure.verdict import Failure, VerdictRules
from tuner.targets.builtin import BuiltinTarget


def record(i: int, tpot_s: float | None, ok: bool = True, tokens: int = 11) -> RequestRecord:
    """A finished request with this TPOT (first token at 50 ms); None: it failed."""
    r = RequestRecord(i, "short", 8, tokens, scheduled_s=0.0, sent_s=0.0)
    if tpot_s is None or not ok:
        r.fail("HTTP 500: boom", 1.0)
        return r
    r.chunk_times_s, r.chunk_tokens = [0.05, 0.05 + tpot_s * (tokens - 1)], [1, tokens - 1]
    r.prompt_tokens, r.output_tokens = 8, tokens
    r.success, r.finished_s = True, r.chunk_times_s[-1]
    return r


def test_the_count_asked_for_breaks_numpys_percentile_and_the_count_grows_with_n():
    for q in (50.0, 90.0, 99.0, 99.9):
        needed = [over_needed(n, q) for n in range(1, 600)]
        assert all(b - a in (0, 1) for a, b in itertools.pairwise(needed))
        for n, m in zip(range(1, 600), needed, strict=True):
            assert np.percentile([0.030] * (n - m) + [0.031] * m, q) > 0.030


def draw_records(rng: random.Random, n: int, share: float, first: int = 0) -> list:
    """n finished requests, `share` of them far over a 30 ms TPOT, a few failed."""
    tpots = [rng.uniform(0.040, 0.2) if rng.random() < share else rng.uniform(0.005, 0.030)
             for _ in range(n)]  # fmt: skip
    return [record(first + i, t, ok=rng.random() > 0.02) for i, t in enumerate(tpots)]


@pytest.mark.parametrize("seed", range(60))
def test_a_level_is_stopped_only_when_no_completion_of_it_could_pass(seed):
    """Alone, or pooled with earlier runs at its rate (a reference's draws): the verdict
    judged is the pooled one, and a stop means no completion of the level could pass it."""
    rng = random.Random(seed)
    n = rng.choice([20, 48, 160, 320])
    slo = parse_slo(rng.choice(["tpot_p99=30ms", "tpot_p90=30ms", "tpot_p50=30ms"]))
    share = rng.choice([0.0, 0.01, 0.03, 0.2])  # of requests far over the limit
    prior = draw_records(rng, rng.choice([0, 0, 80, 320]), rng.choice([0.0, 0.01, 0.05]), 10**4)
    recs = draw_records(rng, n, share)
    watch = SloBroken.of(slo, prior).watch(recs)
    order = rng.sample(range(n), n)
    for k, i in enumerate(order, 1):
        if watch(recs[i]):
            done = prior + [recs[j] for j in order[:k]]
            # The best the rest could do: every request still to come at 0 ms.
            best = done + [record(j, 0.0) for j in order[k:]]
            assert not evaluate(best, slo).met
            assert not evaluate(done, slo).met  # the figures it keeps show it too
            return
    # Never stopped: then not even the whole pool has the count that settles it (it passed,
    # or failed only by interpolating towards a sample above the limit).
    q = slo.terms[0].stat.percentile
    tpots = [lat.tpot_s for lat in map(request_latency, prior + recs) if lat.ok]
    assert sum(t > 0.030 for t in tpots) < over_needed(len(tpots), q)


def test_a_pool_of_clean_earlier_runs_holds_back_a_stop_the_level_alone_would_make():
    # 2 of 20 over the limit break a p99 of 20; pooled with 300 clean requests they do not
    # (5 of 320 are needed), so a reference's draw runs on.
    recs = [record(i, 0.050 if i < 2 else 0.010) for i in range(20)]
    clean = [record(100 + i, 0.010) for i in range(300)]
    slo = parse_slo("tpot_p99=30ms")
    alone, pooled = SloBroken.of(slo).watch(recs), SloBroken.of(slo, clean).watch(recs)
    assert [k for k, r in enumerate(recs, 1) if alone(r)][:1] == [2]
    assert not any(pooled(r) for r in recs)
    # Earlier runs already over make the pool break sooner: 4 over of 300 plus 1 of 20.
    dirty = [record(100 + i, 0.050 if i < 4 else 0.010) for i in range(300)]
    early = SloBroken.of(slo, dirty).watch(recs)
    assert [k for k, r in enumerate(recs, 1) if early(r)][:1] == [1]


@pytest.mark.parametrize("seed", range(40))
def test_a_same_traffic_draw_stops_only_when_it_misses_alone_and_whatever_the_later_draws_do(
    seed,
):
    """The default's draws at the recommended rate: a stop must leave both the draw missing
    alone and its pool with the draws before it missing, however clean the draws still to
    come (`room`) turn out."""
    rng = random.Random(seed)
    n = rng.choice([20, 48, 160])
    later = rng.choice([0, 1, 2])  # draws that may still follow, each of n requests
    slo = parse_slo("tpot_p99=30ms")
    earlier = draw_records(rng, rng.choice([0, n]), rng.choice([0.0, 0.02, 0.3]), 10**4)
    recs = draw_records(rng, n, rng.choice([0.0, 0.01, 0.05, 0.3]))
    rule = AllBroken((SloBroken.of(slo), SloBroken.of(slo, earlier, room=later * n)))
    watch = rule.watch(recs)
    order = rng.sample(range(n), n)
    for k, i in enumerate(order, 1):
        if watch(recs[i]):
            done = [recs[j] for j in order[:k]]
            best = done + [record(j, 0.0) for j in order[k:]]
            clean_later = [record(10**5 + j, 0.0) for j in range(later * n)]
            assert not evaluate(best, slo).met  # alone
            assert not evaluate(earlier + best + clean_later, slo).met  # pooled
            return


def test_room_for_later_draws_holds_back_a_stop_the_draw_alone_would_make():
    # 2 of 20 over break a p99 of 20 alone; with two more draws of 20 to come (60 in all,
    # 2 needed over) that still stops; with room for 300 more (5 of 320 needed) it does not.
    recs = [record(i, 0.050 if i < 2 else 0.010) for i in range(20)]
    slo = parse_slo("tpot_p99=30ms")
    stops = AllBroken((SloBroken.of(slo), SloBroken.of(slo, room=40))).watch(recs)
    assert [k for k, r in enumerate(recs, 1) if stops(r)][:1] == [2]
    held = AllBroken((SloBroken.of(slo), SloBroken.of(slo, room=300))).watch(recs)
    assert not any(held(r) for r in recs)


def test_it_stops_at_the_first_finished_request_that_settles_the_p99():
    recs = [record(i, 0.050 if i % 10 == 9 else 0.010) for i in range(160)]
    watch = SloBroken.of(parse_slo("tpot_p99=30ms")).watch(recs)
    stops = [k for k, r in enumerate(recs, 1) if watch(r)]
    # 3 of 160 over put a p99 over (numpy: position 157.41); the third is request 30.
    assert stops[0] == 30


def test_only_percentiles_of_per_request_metrics_can_stop_a_level():
    assert SloBroken.of(parse_slo("itl_p99=30ms")) is None  # gaps pooled: their count unknown
    assert SloBroken.of(parse_slo("tpot_mean=30ms")) is None
    rule = SloBroken.of(parse_slo("ttft_p99=2s,itl_p99=30ms,e2el_p90=10s"))
    assert [m.value for m, _, _ in rule.terms] == ["ttft", "e2el"]


SLO = parse_slo("tpot_p99=30ms")


@pytest.fixture(scope="module")
def builtin():
    return BuiltinTarget(EngineConfig(kv_cache_memory_gb=0.25))


async def test_an_overloaded_search_level_on_the_real_engine_ends_early_and_still_fails(builtin):
    facts = builtin.facts
    wl = build_workload("mixed", num_requests=120, seed=0, max_model_len=facts.max_model_len,
                        vocab_size=facts.vocab_size)  # fmt: skip
    meter = Meter(builtin, wl.requests, SLO, LevelSettings(duration_s=4.0, min_requests=20),
                  VerdictRules(require_schedule=False))  # fmt: skip
    try:
        await builtin.apply({})
        stopped = await meter.level(30.0, stop_failing=True)  # about 4x what it serves here
        whole = await meter.level(30.0)  # the same requests at the same times, to the end
    finally:
        await builtin.close()
    assert not whole.level.passed and whole.level.stopped_s is None
    assert stopped.level.verdict.failure() is Failure.SLO  # the same verdict, sooner
    assert stopped.level.stopped_s is not None
    assert stopped.level.wall_s < 0.8 * whole.level.wall_s
    cut = [r for r in stopped.records if was_stopped(r)]
    assert cut and len(stopped.records) == len(whole.records) == 120
    assert len(stopped.measured) == 120 - len(cut)
    assert stopped.level.verdict.error_rate == 0.0  # the requests it cut are no errors
    # The engine dropped the cut requests before the next level: none left running.
    assert stopped.level.server.left_running == 0 and whole.level.server.left_running is None
