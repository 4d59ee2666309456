"""The HTTP client against a real scripted streaming server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import time

import pytest
from aiohttp import web

from loadgen import HttpTarget, LoadgenError, RequestSpec, arrival_offsets, replay
from loadgen.records import RequestRecord
from loadgen.scripted_server import Script, start_scripted_server
from slo import compute_metrics


def _specs(n: int, prompt_len: int = 20, output_len: int = 6) -> list[RequestSpec]:
    return [RequestSpec(i, list(range(4, 4 + prompt_len)), output_len, "short") for i in range(n)]


@pytest.fixture
async def scripted():
    servers = []

    async def start(script: Script | None = None, failures: dict[str, str] | None = None):
        server, runner, url = await start_scripted_server(
            script or Script(10, 5), failures=failures
        )
        servers.append(runner)
        return server, url

    yield start
    for runner in servers:
        await runner.cleanup()


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
async def test_every_chunk_is_recorded_after_the_server_sent_it(scripted, endpoint):
    server, url = await scripted(Script(ttft_ms=20, itl_ms=5))
    specs = _specs(8, prompt_len=30, output_len=6)
    res = await replay(HttpTarget(url, "m", endpoint), specs, arrival_offsets("constant", 100.0, 8))
    assert [r.index for r in res.records] == list(range(8))
    for rec in res.records:
        truth = server.truth[str(rec.index)]
        assert rec.success and rec.error is None
        assert (rec.output_tokens, rec.prompt_tokens) == (6, 30)
        assert rec.chunk_tokens == [1] * 6
        assert len(rec.chunk_times_s) == len(truth.chunk_sent_s)
        # Same monotonic clock: every chunk arrives after it was sent, in order.
        assert all(c >= s for c, s in zip(rec.chunk_times_s, truth.chunk_sent_s, strict=True))
        assert rec.chunk_times_s == sorted(rec.chunk_times_s)
        assert rec.sent_s <= truth.received_s
        ttft_truth = truth.chunk_sent_s[0] - truth.received_s
        assert rec.chunk_times_s[0] - rec.sent_s >= ttft_truth >= 0.020
    assert compute_metrics(res.records).completed == 8


async def test_multi_token_chunks_count_their_tokens(scripted):
    _, url = await scripted(Script(ttft_ms=5, itl_ms=2, tokens_per_chunk=3))
    res = await replay(HttpTarget(url, "m"), _specs(2, output_len=10), [0.0, 0.0])
    for rec in res.records:
        assert rec.chunk_tokens == [3, 3, 3, 1]
        assert rec.output_tokens == 10
    m = compute_metrics(res.records)
    assert m.itl.count == 2 * 3  # one ITL per chunk gap, as vLLM counts them


async def test_without_running_usage_each_text_chunk_is_one_token(scripted):
    _, url = await scripted(Script(ttft_ms=5, itl_ms=2))
    target = HttpTarget(url, "m", extra_body={"stream_options": {"include_usage": True}})
    res = await replay(target, _specs(2, output_len=5), [0.0, 0.01])
    assert all(r.chunk_tokens == [1] * 5 and r.output_tokens == 5 for r in res.records)


async def test_failures_are_records_and_the_run_goes_on(scripted):
    failures = {
        "1": "http_500",
        "2": "cut_after:2",
        "3": "error_after:1",
        "4": "no_done",
        "5": "hang",
    }
    _, url = await scripted(Script(ttft_ms=5, itl_ms=2), failures)
    res = await replay(HttpTarget(url, "m"), _specs(7), [0.01 * i for i in range(7)], timeout_s=1.0)
    by_index = {r.index: r for r in res.records}
    assert by_index[0].success and by_index[6].success
    assert by_index[1].error == "HTTP 500: scripted failure"
    assert by_index[2].error.startswith("stream cut after 2 chunks")
    assert by_index[3].error == "server error: scripted mid-stream failure"
    assert by_index[4].error == "stream cut after 6 chunks (no [DONE])"
    assert by_index[5].error == "timeout after 1 s (0 chunks)"
    for i in range(1, 6):
        assert not by_index[i].success and "\n" not in by_index[i].error
        assert by_index[i].finished_s >= by_index[i].sent_s
    m = compute_metrics(res.records)
    assert (m.completed, m.failed) == (2, 5)


async def test_unreachable_url_fails_fast_in_one_line(unused_tcp_port):
    t0 = time.monotonic()
    with pytest.raises(LoadgenError) as err:
        await replay(HttpTarget(f"http://127.0.0.1:{unused_tcp_port}", "m"), _specs(3), [0, 0, 0])
    assert time.monotonic() - t0 < 5.0
    msg = str(err.value)
    assert msg.startswith(f"cannot reach http://127.0.0.1:{unused_tcp_port} (")
    assert "--url" in msg and "\n" not in msg


async def test_connection_refused_mid_run_is_a_failed_record(scripted):
    server_runner = await start_scripted_server(Script(5, 2))
    _, runner, url = server_runner
    target = HttpTarget(url, "m")
    await target.open()
    await runner.cleanup()  # the server goes away after the client checked it
    spec = _specs(1)[0]
    rec = RequestRecord(0, "short", spec.prompt_len, spec.output_len, time.monotonic())
    await target.send(spec, target.prepare(spec), rec, timeout_s=5.0)
    await target.close()
    assert not rec.success
    assert rec.error.startswith("connection failed: ")


@pytest.mark.parametrize(
    ("url", "named"),
    [
        ("localhost:8000", "'localhost:8000'"),
        ("ftp://x", "'ftp://x'"),
        # These were ValueError tracebacks from the URL parser.
        ("http://127.0.0.1:99999", "Port out of range"),
        ("http://[::1", "Invalid IPv6 URL"),
        ("http://", "has no host"),
    ],
)
def test_bad_url_and_endpoint(url, named):
    with pytest.raises(LoadgenError, match=named):
        HttpTarget(url, "m")
    with pytest.raises(LoadgenError, match="'embeddings'"):
        HttpTarget("http://127.0.0.1:1", "m", endpoint="embeddings")


def test_base_url_accepts_v1_suffixes():
    for url in ("http://h:1", "http://h:1/", "http://h:1/v1", "http://h:1/v1/completions"):
        assert HttpTarget(url, "m").url == "http://h:1/v1/completions"
    assert HttpTarget("http://h:1/v1/", "m", "chat").url == "http://h:1/v1/chat/completions"


async def test_payload_forces_lengths_and_sends_token_ids(scripted):
    import json

    target = HttpTarget("http://127.0.0.1:1", "tiny")
    body = json.loads(target.prepare(RequestSpec(0, [5, 6, 7], 9, "short")))
    assert body["prompt"] == [5, 6, 7]
    assert body["max_tokens"] == body["min_tokens"] == 9 and body["ignore_eos"] is True
    assert body["stream"] is True and body["stream_options"]["include_usage"] is True
    chat = json.loads(
        HttpTarget("http://h:1", "tiny", "chat").prepare(RequestSpec(0, [5, 6], 4, "s"))
    )
    assert len(chat["messages"][0]["content"].split()) == 2
    assert chat["max_completion_tokens"] == 4


async def test_warmup_requests_are_flagged_and_left_out_of_metrics(scripted):
    _, url = await scripted()
    res = await replay(HttpTarget(url, "m"), _specs(5), [0.0, 0.0, 0.01, 0.02, 0.03], warmup=2)
    assert [r.warmup for r in res.records] == [True, True, False, False, False]
    assert len(res.measured) == 3
    assert compute_metrics(res.records).completed == 3


async def test_bad_replay_arguments(scripted):
    target = HttpTarget("http://127.0.0.1:1", "m")
    with pytest.raises(LoadgenError, match="2 arrival offsets for 3 requests"):
        await replay(target, _specs(3), [0.0, 1.0])
    with pytest.raises(LoadgenError, match="warmup=3"):
        await replay(target, _specs(3), [0.0] * 3, warmup=3)
    with pytest.raises(LoadgenError, match="workers=0"):
        await replay(target, _specs(3), [0.0] * 3, workers=0)
    with pytest.raises(LoadgenError, match="timeout=0"):
        await replay(target, _specs(3), [0.0] * 3, timeout_s=0)
    assert not asyncio.all_tasks() - {asyncio.current_task()}


async def test_a_refused_api_key_fails_before_the_run_in_one_line():
    async def refuse(request: web.Request) -> web.Response:
        return web.json_response({"error": {"message": "bad key"}}, status=401)

    app = web.Application()
    app.router.add_get("/v1/models", refuse)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        with pytest.raises(LoadgenError, match=r"refused the API key \(HTTP 401\)"):
            await replay(HttpTarget(url, "m", api_key="wrong"), _specs(2), [0.0, 0.0])
    finally:
        await runner.cleanup()
