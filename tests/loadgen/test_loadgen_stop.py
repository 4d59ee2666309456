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
    done = measured_part(res.records)
    assert len(done) == 3 and all(r.success for r in done)
    stopped = [r for r in res.records if was_stopped(r)]
    assert len(stopped) == 37 and all(r.error == STOPPED_REASON for r in stopped)
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
