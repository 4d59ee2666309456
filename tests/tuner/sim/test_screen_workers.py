"""Screening on several processes gives the figures one process gives, config for config."""

import asyncio

from test_sim_stop import meter_and_target  # the CPU sim gate's profile, `mixed`, 30 ms

from tuner.sim.screen import CHAIN, screen


def screened(workers):
    meter, target = meter_and_target()
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
