"""Screening on several processes gives the figures one process gives, config for config."""

import asyncio
from pathlib import Path

from loadgen import build_workload
from slo import parse_slo
from tuner.bench.sim import SuiteProfile
from tuner.measure.meter import LevelSettings, Meter
from tuner.sim.profile import Profile
from tuner.sim.screen import CHAIN, screen
from tuner.store.records import Mode, rules_for

PROFILE = Path(__file__).resolve().parents[3] / "results/baselines/cpu-tiny.profile.json"


def screened(workers):
    profile = Profile.load(PROFILE)
    target = SuiteProfile(PROFILE, profile, "").target()
    wl = build_workload("mixed", num_requests=400, seed=0,
                        max_model_len=profile.shape.max_model_len)  # fmt: skip
    rules = rules_for(Mode.CAPACITY, require_schedule=False)
    meter = Meter(target, wl.requests, parse_slo("tpot_p99=30ms"), LevelSettings(duration_s=8.0),
                  rules)  # fmt: skip
    base = target.knobs.complete({})
    configs = [{**base, "max_num_batched_tokens": b} for b in (256, 384, 512, 768, 1024, 1536,
                                                               2048, 4096, 8192)]  # fmt: skip
    assert len(configs) > CHAIN  # at least two chains, so two processes share the work
    return asyncio.run(screen(target, meter, configs, 6.0, workers=workers)).ranked


def test_two_processes_screen_exactly_what_one_does():
    one, two = screened(1), screened(2)
    assert [(s.knobs, s.capacity_rps, s.levels) for s in one] == [
        (s.knobs, s.capacity_rps, s.levels) for s in two
    ]
    assert len({s.capacity_rps for s in one}) > 1  # budgets that differ, ranked
