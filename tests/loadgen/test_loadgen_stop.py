"""A stop rule ends a replay early: no more sends, the requests in flight cut, every request
still a record (those it left unmeasured marked so), over real HTTP to a real aiohttp server."""

from __future__ import annotations

import asyncio
import math

import pytest

from loadgen import HttpTarget, LoadgenError, RequestSpec, arrival_offsets, replay
from loadgen.scripted_server import Script, start_scripted_server
from loadgen.stop import STOPPED_REASON, measured_part, was_stopped


class AfterFinished:
    """Stops once `n` requests have finished."""

    def __init__(self, n: int) -> None:
        self.n = n

    def watch(self, records):
        seen = [0]

        def finished(record) -> bool:
            seen[0] += 1
            return seen[0] >= self.n

        return finished


class Never:
    def watch(self, records):
        return None


def _specs(n: int, output_len: int) -> list[RequestSpec]:
    return [RequestSpec(i, [4, 5, 6, 7], output_len, "short") for i in range(n)]


@pytest.fixture
async def server():
    # 40 tokens at 10 ms: each request streams for about 0.4 s.
    srv, runner, url = await start_scripted_server(Script(ttft_ms=5, itl_ms=10))
    yield srv, url
    await runner.cleanup()


async def test_a_stopped_replay_sends_no_more_and_cuts_the_requests_in_flight(server):
    srv, url = server
    offsets = arrival_offsets("constant", 20.0, 40)  # one every 50 ms: 2 s of arrivals
    loop = asyncio.get_running_loop()
    start = loop.time()
    res = await replay(HttpTarget(url, "m"), _specs(40, 40), offsets, stop=AfterFinished(3))
    elapsed = loop.time() - start
    assert len(res.records) == 40  # every request is a record
    assert res.stopped_s is not None and 0.4 < res.stopped_s < 1.5
    assert elapsed < 1.8  # without the stop: 2 s of arrivals and 0.4 s of the last stream
    done = measured_part(res.records)  # the three, and any that ended as the stop came
    assert 3 <= len(done) <= 5 and all(r.success for r in done)
    stopped = [r for r in res.records if was_stopped(r)]
    assert len(stopped) == 40 - len(done) and all(r.error == STOPPED_REASON for r in stopped)
    unsent = [r for r in stopped if math.isnan(r.sent_s)]
    in_flight = [r for r in stopped if not math.isnan(r.sent_s)]
    assert unsent and in_flight  # some never went out; some were cut mid-stream
    assert all(math.isfinite(r.finished_s) for r in stopped)
    await asyncio.sleep(0.3)  # the server's handlers see the disconnects
    truth = srv.truth
    cut = [len(truth[k].chunk_sent_s) for k in truth if int(k) in {r.index for r in in_flight}]
    assert cut and max(cut) < 40  # the server stopped streaming them: nothing ran to its end
    assert len(truth) == 40 - len(unsent)  # what was never sent never reached the server
    assert res.schedule_ok  # unsent requests are no send lag


async def test_a_rule_that_cannot_stop_the_replay_lets_it_run_to_the_end(server):
    _, url = server
    offsets = arrival_offsets("constant", 40.0, 8)
    res = await replay(HttpTarget(url, "m"), _specs(8, 4), offsets, stop=Never())
    assert res.stopped_s is None and all(r.success for r in res.records)


async def test_a_stop_rule_needs_one_process_to_see_every_request(server):
    _, url = server
    with pytest.raises(LoadgenError, match="workers=1"):
        await replay(HttpTarget(url, "m"), _specs(8, 4), arrival_offsets("constant", 40.0, 8),
                     workers=2, stop=AfterFinished(1))  # fmt: skip


async def test_a_replay_with_a_stop_rule_cancelled_from_outside_cancels_its_requests(server):
    _, url = server
    offsets = arrival_offsets("constant", 20.0, 20)
    task = asyncio.ensure_future(
        replay(HttpTarget(url, "m"), _specs(20, 200), offsets, stop=AfterFinished(100))
    )
    await asyncio.sleep(1.2)  # every request sent, each streaming for 2 s
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.sleep(0)
    requests_left = [t for t in asyncio.all_tasks() if t.get_coro().__qualname__ == "_one"]
    assert requests_left == []  # the server's handlers in this loop are not the client's


async def test_a_halt_is_seen_before_the_next_send_at_a_low_rate(server):
    _, url = server
    offsets = [0.0, 0.05, 5.0]  # the last one five seconds later
    loop = asyncio.get_running_loop()
    start = loop.time()
    res = await replay(HttpTarget(url, "m"), _specs(3, 4), offsets, stop=AfterFinished(1))
    assert loop.time() - start < 2.0 and res.stopped_s is not None
    assert math.isnan(res.records[2].sent_s) and was_stopped(res.records[2])
