"""`--synthetic`: a stand-in target whose levels wait and whose capacity is known."""

from __future__ import annotations

import time

from loadgen import build_workload
from slo import parse_slo
from tuner.measure.meter import LevelSettings, Meter
from tuner.targets.synthetic import SyntheticTarget, synthetic_capacity_rps


async def test_levels_meet_the_slo_up_to_the_capacity_and_take_their_wall_time():
    target = SyntheticTarget(level_wall_s=0.05)
    requests = build_workload("mixed", num_requests=40, seed=0, max_model_len=8192,
                              vocab_size=4096).requests  # fmt: skip
    meter = Meter(target, requests, parse_slo("tpot_p99=30ms"), LevelSettings(duration_s=2.0))
    knobs = {"max_num_batched_tokens": 512}
    await target.apply(knobs)
    capacity = synthetic_capacity_rps(target.knobs.complete(knobs))
    assert capacity == 12.0  # the peak
    start = time.monotonic()
    below, above = await meter.level(0.8 * capacity), await meter.level(1.3 * capacity)
    assert time.monotonic() - start >= 0.1  # two levels of 0.05 s each, and little more
    assert below.level.passed and not above.level.passed
    assert synthetic_capacity_rps({"max_num_batched_tokens": 8192}) < capacity
