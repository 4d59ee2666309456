"""The meter against a simulated target: levels and capacity searches in simulated time."""

from loadgen import build_workload
from slo import parse_slo
from tuner.measure.draws import LevelMix
from tuner.measure.meter import LevelSettings, Meter
from tuner.measure.ratesearch import Outcome, RateSearchSettings
from tuner.measure.verdict import VerdictRules

SLO = parse_slo("tpot_p99=30ms")


def meter(target, clock, duration_s=2.0):
    requests = build_workload("mixed", num_requests=80, seed=0, vocab_size=4096).requests
    settings = LevelSettings(duration_s=duration_s, min_requests=10)
    return Meter(target, requests, SLO, settings, VerdictRules(require_schedule=False), clock)


async def test_a_level_replays_its_prefix_and_times_itself_on_the_injected_clock(
    sim_target, fake_clock
):
    await sim_target.apply({})  # the default: 2048 tokens, 6 req/s of capacity
    m = meter(sim_target, fake_clock)
    start = fake_clock()
    run = await m.level(5.0)
    assert len(run.records) == 10  # 5 req/s x 2 s of arrivals
    assert run.level.wall_s == fake_clock() - start > 1.0  # simulated seconds only
    assert run.level.passed
    assert not (await m.level(12.0)).level.passed  # twice the capacity


async def test_a_capacity_search_brackets_the_simulated_capacity(sim_target, fake_clock):
    await sim_target.apply({"max_num_batched_tokens": 512})  # 12 req/s of capacity
    result = await meter(sim_target, fake_clock).capacity(RateSearchSettings(4.0, rel_tol=0.1))
    assert result.outcome is Outcome.CONVERGED
    assert result.capacity_rps <= 12.0 * 1.05 < result.upper_bound_rps * 1.05
    assert result.capacity_rps > 12.0 / 1.25


async def test_no_level_starts_past_the_deadline_on_the_injected_clock(sim_target, fake_clock):
    await sim_target.apply({})
    deadline = fake_clock() + 1.0  # passes during the first level
    result = await meter(sim_target, fake_clock).capacity(RateSearchSettings(1.0), deadline)
    assert len(result.levels) == 1 and result.outcome is Outcome.RUNNING


def test_a_contiguous_draw_replays_the_next_stretch_of_the_list_and_wraps():
    settings = LevelSettings(duration_s=1.0, min_requests=4, mix=LevelMix.CONTIGUOUS)
    requests = list(range(10))
    assert settings.requests_at(requests, 4.0) == [0, 1, 2, 3]
    assert settings.requests_at(requests, 4.0, draw=1) == [4, 5, 6, 7]
    assert settings.requests_at(requests, 4.0, draw=2) == [8, 9, 0, 1]
    assert settings.requests_at(requests, 40.0, draw=3) == requests  # never more than the list


def test_every_draw_carries_the_lists_prompt_mix_where_stretches_do_not():
    requests = build_workload("mixed", num_requests=400, seed=0, vocab_size=4096).requests
    mean = sum(r.prompt_len for r in requests) / len(requests)

    def spread(mix):
        settings = LevelSettings(duration_s=1.0, min_requests=60, mix=mix)
        means = [sum(r.prompt_len for r in settings.requests_at(requests, 1.0, draw=d)) / 60
                 for d in range(12)]  # fmt: skip
        return min(means) / mean, max(means) / mean

    low, high = spread(LevelMix.STRATIFIED)
    assert low > 0.95 and high < 1.05
    low, high = spread(LevelMix.CONTIGUOUS)
    assert low < 0.85 and high > 1.3  # what the search and its re-measurement met before


def test_draws_differ_keep_the_lists_order_and_repeat_for_the_same_seed():
    requests = build_workload("mixed", num_requests=400, seed=0, vocab_size=4096).requests
    settings = LevelSettings(duration_s=1.0, min_requests=60)
    first, again = settings.requests_at(requests, 1.0), settings.requests_at(requests, 1.0)
    second = settings.requests_at(requests, 1.0, draw=1)
    assert [r.index for r in first] == [r.index for r in again]  # same requests every config
    assert [r.index for r in first] != [r.index for r in second]
    assert [r.index for r in first] == sorted(r.index for r in first)
    assert len({r.index for r in first}) == 60
    assert settings.requests_at(requests, 1000.0) == requests  # the whole list, in order


async def test_no_level_starts_that_would_end_past_the_deadline(sim_target, fake_clock):
    # Levels of at least 10 requests: 10 s at 1 req/s, 5 s (and the drain) at 2 req/s.
    await sim_target.apply({})
    start = fake_clock()
    result = await meter(sim_target, fake_clock).capacity(RateSearchSettings(1.0), start + 14.0)
    assert len(result.levels) == 1  # the second could start in time, not end in time
    assert fake_clock() <= start + 14.0
    roomy = await meter(sim_target, fake_clock).capacity(RateSearchSettings(1.0),
                                                         fake_clock() + 60.0)  # fmt: skip
    assert len(roomy.levels) >= 2
