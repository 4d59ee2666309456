"""The replay runner: absolute send times, an honest schedule flag, worker processes."""

from __future__ import annotations

import asyncio
import os
import re
import time

import pytest

from loadgen import HttpTarget, LoadgenError, RequestSpec, arrival_offsets, replay
from loadgen.lag import LoopLagMonitor
from loadgen.scripted_server import Script, start_scripted_server


def _specs(n: int, output_len: int = 4) -> list[RequestSpec]:
    return [RequestSpec(i, [4, 5, 6, 7], output_len, "short") for i in range(n)]


@pytest.fixture
async def server():
    srv, runner, url = await start_scripted_server(Script(ttft_ms=5, itl_ms=3))
    yield srv, url
    await runner.cleanup()


class StallingTarget(HttpTarget):
    """Blocks the event loop for `stall_s` while preparing one request."""

    def __init__(self, url: str, stall_index: int, stall_s: float) -> None:
        super().__init__(url, "m")
        self.stall_index, self.stall_s = stall_index, stall_s

    def prepare(self, spec: RequestSpec) -> bytes:
        if spec.index == self.stall_index:
            time.sleep(self.stall_s)
        return super().prepare(spec)


async def test_sends_follow_absolute_times_and_a_stall_does_not_shift_the_rest(server):
    _, url = server
    offsets = arrival_offsets("constant", 40.0, 24)  # every 25 ms, 0.025 .. 0.6 s
    res = await replay(StallingTarget(url, stall_index=2, stall_s=0.2), _specs(24), offsets)
    lags = [r.sent_s - r.scheduled_s for r in res.records]
    assert all(lag >= 0 for lag in lags)  # never early
    assert lags[2] > 0.15  # the stalled request went late, and so did those due meanwhile...
    # ...but the schedule is absolute: requests 3..8 (due 0.1 .. 0.225 s, during the stall) go
    # out together as soon as the loop is free. Relative sleeps would space them 25 ms apart
    # again and shift every later request by the whole stall.
    burst = [r.sent_s for r in res.records[3:9]]
    assert max(burst) - min(burst) < 0.125 / 2
    assert all(r.success for r in res.records)
    assert not res.schedule_ok
    assert any("fell behind its schedule" in note for note in res.notes)
    assert res.max_send_lag_s == pytest.approx(max(lags))


async def test_an_unhurried_run_keeps_schedule_and_reports_lag(server):
    _, url = server
    res = await replay(HttpTarget(url, "m"), _specs(5), arrival_offsets("constant", 50.0, 5))
    assert res.max_loop_lag_s >= res.p99_loop_lag_s >= 0.0
    assert res.lag_tolerance_s == 0.010
    assert res.workers == 1


async def test_loop_lag_monitor_sees_a_blocked_loop():
    mon = LoopLagMonitor(interval_s=0.002)
    mon.start()
    await asyncio.sleep(0.01)
    time.sleep(0.05)  # the loop cannot run its timers
    await asyncio.sleep(0.01)
    await mon.stop()
    assert mon.max_s >= 0.04
    assert len(mon.samples_s) >= 3


async def test_worker_processes_share_one_schedule(server):
    srv, url = server
    offsets = arrival_offsets("poisson", 100.0, 16, seed=1)
    res = await replay(HttpTarget(url, "m"), _specs(16), offsets, warmup=1, workers=2)
    assert res.workers == 2
    assert [r.index for r in res.records] == list(range(16))
    assert res.records[0].warmup and not any(r.warmup for r in res.records[1:])
    start = res.start_s
    for rec, off in zip(res.records, offsets, strict=True):
        assert rec.success
        assert rec.scheduled_s == pytest.approx(start + off)  # one anchor for all workers
        assert rec.sent_s >= rec.scheduled_s
        truth = srv.truth[str(rec.index)]
        assert all(c >= s for c, s in zip(rec.chunk_times_s, truth.chunk_sent_s, strict=True))


class DyingWorkerFactory:
    """Builds nothing: the worker process dies at once, as a crash would."""

    def __call__(self) -> HttpTarget:
        os._exit(3)


class DyingWorkersTarget(HttpTarget):
    def worker_factory(self) -> DyingWorkerFactory:
        return DyingWorkerFactory()


async def test_a_dead_worker_is_an_error_not_a_hang(server):
    _, url = server
    with pytest.raises(LoadgenError, match="worker 0 exited unexpectedly"):
        await asyncio.wait_for(
            replay(DyingWorkersTarget(url, "m"), _specs(4), [0.0] * 4, workers=2), timeout=60
        )


async def test_workers_fail_fast_on_an_unreachable_url(unused_tcp_port):
    with pytest.raises(LoadgenError, match="cannot reach"):
        await replay(
            HttpTarget(f"http://127.0.0.1:{unused_tcp_port}", "m"), _specs(2), [0, 0], workers=2
        )


@pytest.mark.parametrize(
    ("offsets", "named"),
    [
        ([0.0, 1e300], "sent 1e+300 s after the first"),  # a rate typed as 1e-300
        ([0.0, float("inf")], "sent inf s"),
        ([0.0, float("nan")], "sent nan s"),
        ([0.0, -1.0], "must be >= 0"),
    ],
)
async def test_a_schedule_that_would_never_end_is_refused(offsets, named):
    # Refused before anything is sent, so no server is needed and nothing sleeps.
    with pytest.raises(LoadgenError, match=re.escape(named)):
        await replay(HttpTarget("http://127.0.0.1:9", "m"), _specs(2), offsets)


async def test_more_workers_than_can_help_is_refused_before_spawning():
    with pytest.raises(LoadgenError, match="workers=100000 is more than can help here"):
        await replay(HttpTarget("http://127.0.0.1:9", "m"), _specs(3), [0.0] * 3, workers=100000)
    with pytest.raises(LoadgenError, match="use at most 3"):
        await replay(HttpTarget("http://127.0.0.1:9", "m"), _specs(3), [0.0] * 3, workers=4)
