"""Screening on several processes gives the figures one process gives, config for config, and
so does the traffic band."""

import asyncio

from test_sim_stop import meter_and_target  # the CPU sim gate's profile, `mixed`, 30 ms

from tuner.sim.robust import BURSTINESS, LONG_FACTORS, bands
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


def banded(workers):
    meter, target = meter_and_target()
    base = target.knobs.complete({})
    configs = [({**base, "max_num_batched_tokens": b}, 6.0) for b in (512, 2048)]
    return asyncio.run(bands(target, meter, configs, workers=workers))


def test_the_band_on_two_processes_is_the_band_on_one():
    one, two = banded(1), banded(2)
    assert one == two and len(one) == 2
    assert all(len(cells) == len(LONG_FACTORS) * len(BURSTINESS) for cells in one)
    # Cells differ: more long prompts or burstier arrivals serve fewer requests.
    assert len({c.capacity_rps for c in one[0]}) > 1
    assert one[0] != one[1]  # each config's own cells
