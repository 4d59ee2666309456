"""A level that stops early over HTTP leaves `engine-lite serve` idle: the server aborts the
requests whose client left, and the tuner checks its /metrics before the next level."""

from __future__ import annotations

from engine_lite.config import EngineConfig
from engine_lite.server.state import ServerSettings
from loadgen import build_workload
from loadgen.stop import was_stopped
from slo import parse_slo
from tuner.measure.meter import LevelSettings, Meter
from tuner.measure.verdict import VerdictRules
from tuner.targets.base import ServerStats
from tuner.targets.http import UrlTarget

# Small KV cache and context: the tests run beside others on two cores.
CONFIG = EngineConfig(model="tiny", max_model_len=1024, kv_cache_memory_gb=0.05,
                      max_num_batched_tokens=512)  # fmt: skip


async def test_a_stopped_level_leaves_the_server_running_nothing(server_thread):
    server = server_thread(CONFIG, ServerSettings("m")).start()
    target = UrlTarget(server.url, "m")
    wl = build_workload("random", num_requests=40, input_len=512, output_len=32, seed=0,
                        max_model_len=CONFIG.max_model_len)  # fmt: skip
    meter = Meter(target, wl.requests, parse_slo("tpot_p99=1ms"),
                  LevelSettings(duration_s=2.0, min_requests=40), VerdictRules())  # fmt: skip
    try:
        run = await meter.level(20.0, stop_failing=True)  # nothing meets 1 ms a token here
    finally:
        await target.close()
        server.stop()
    assert run.level.stopped_s is not None and any(was_stopped(r) for r in run.records)
    assert run.level.server.left_running == 0


def test_a_server_that_keeps_cut_requests_is_named_in_the_level_figures():
    said = ServerStats(left_running=7).describe()
    assert "7 requests still held after the level stopped" in said
    assert ServerStats(left_running=0).describe() == ""
