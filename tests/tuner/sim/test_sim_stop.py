"""A simulated level stops as a real one does: once its SLO is broken whatever the rest does,
with the same verdict as the whole level and the requests it cut marked, not dropped."""

import asyncio
from pathlib import Path

from loadgen import build_workload
from loadgen.stop import measured_part, was_stopped
from slo import parse_slo
from tuner.bench.sim import SuiteProfile
from tuner.measure.meter import LevelSettings, Meter
from tuner.sim.profile import Profile
from tuner.store.records import Mode, rules_for

PROFILE = Path(__file__).resolve().parents[3] / "results/baselines/cpu-tiny.profile.json"


def meter_and_target():
    profile = Profile.load(PROFILE)
    target = SuiteProfile(PROFILE, profile, "").target()
    wl = build_workload("mixed", num_requests=400, seed=0,
                        max_model_len=profile.shape.max_model_len)  # fmt: skip
    rules = rules_for(Mode.CAPACITY, require_schedule=False)
    meter = Meter(target, wl.requests, parse_slo("tpot_p99=30ms"), LevelSettings(duration_s=8.0),
                  rules)  # fmt: skip
    return meter, target


def both_ways(rate_rps):
    async def go():
        meter, target = meter_and_target()
        await target.apply(target.knobs.complete({}))
        return await meter.level(rate_rps), await meter.level(rate_rps, stop_failing=True)

    return asyncio.run(go())


def test_an_overloaded_simulated_level_stops_with_the_whole_levels_verdict():
    whole, stopped = both_ways(30.0)
    assert not whole.level.passed and whole.level.stopped_s is None
    assert stopped.level.stopped_s is not None
    assert stopped.level.stopped_s < max(r.finished_s for r in whole.records)
    assert stopped.level.verdict.failure() == whole.level.verdict.failure()
    assert not stopped.level.passed
    # Every request of the level is still a record; those it cut say so.
    assert len(stopped.records) == len(whole.records)
    cut = [r for r in stopped.records if was_stopped(r)]
    assert cut and len(measured_part(stopped.records)) == len(stopped.records) - len(cut)
    # What finished before the stop is what the whole level had for those requests.
    by_index = {r.index: r for r in whole.records}
    for r in measured_part(stopped.records):
        assert r.chunk_times_s == by_index[r.index].chunk_times_s


def test_a_passing_simulated_level_runs_to_the_end_unchanged():
    whole, watched = both_ways(2.0)
    assert whole.level.passed and watched.level.stopped_s is None
    assert [r.chunk_times_s for r in watched.records] == [r.chunk_times_s for r in whole.records]
