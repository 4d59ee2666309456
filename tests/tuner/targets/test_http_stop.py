"""Over HTTP the stop rule travels to the load loop's own process: a failing search level ends
there as soon as its SLO is already broken (a real aiohttp server, the real client process)."""

from __future__ import annotations

import math

from loadgen import RequestSpec
from loadgen.scripted_server import Script, start_scripted_server
from loadgen.stop import was_stopped
from slo import parse_slo
from tuner.measure.meter import LevelSettings, Meter
from tuner.measure.verdict import Failure, VerdictRules
from tuner.targets.http import UrlTarget


async def test_a_level_whose_every_token_is_slow_stops_after_the_requests_that_settle_it():
    # 41 ms between tokens against a 30 ms TPOT limit: every finished request is over.
    _, runner, url = await start_scripted_server(Script(ttft_ms=5, itl_ms=41))
    target = UrlTarget(url, "m")
    requests = [RequestSpec(i, [4, 5, 6, 7], 16, "short") for i in range(40)]
    meter = Meter(target, requests, parse_slo("tpot_p99=30ms"),
                  LevelSettings(arrival="constant", duration_s=4.0, min_requests=40),
                  VerdictRules())  # fmt: skip
    try:
        stopped = await meter.level(10.0, stop_failing=True)
        whole = await meter.level(10.0)
    finally:
        await target.close()
        await runner.cleanup()
    assert whole.level.stopped_s is None and whole.level.verdict.failure() is Failure.SLO
    assert stopped.level.verdict.failure() is Failure.SLO
    # Two of 40 over settle a p99; the first two finish about 0.7 s in, of 4 s of arrivals.
    assert stopped.level.stopped_s is not None and stopped.level.stopped_s < 2.0
    assert stopped.level.wall_s < whole.level.wall_s / 2
    assert len(stopped.measured) >= 2 and len(stopped.records) == 40
    unsent = [r for r in stopped.records if was_stopped(r) and math.isnan(r.sent_s)]
    assert unsent and stopped.level.verdict.schedule_ok
    # This server has no /metrics: whether it dropped the cut requests cannot be told.
    assert stopped.level.server.left_running is None
