"""Raw HTTP behaviour: error shapes and statuses, abuse under load, disconnects, /metrics."""

import asyncio
import json
import time

import aiohttp
import pytest

# The session server of conftest.py serves this name behind this key.
API_KEY = "test-key"
SERVED_NAME = "tiny-served"


ABORTS = "vllm:request_success_total"
AUTH = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"}


async def _post(session, url, body, headers=AUTH):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with session.post(url, data=data, headers=headers) as resp:
        return resp.status, await resp.read()


def _metric(text, name, **labels):
    """The value of one sample in Prometheus exposition text."""
    want = {"model_name": SERVED_NAME, "engine": "0", **labels}
    for line in text.splitlines():
        if line.startswith(name + "{"):
            got = dict(kv.split("=", 1) for kv in line[len(name) + 1 : line.index("}")].split(","))
            if {k: v.strip('"') for k, v in got.items()} == want:
                return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} {labels} not in /metrics")


BAD_BODIES = [
    (b"{not json", 400),
    (b"[]", 400),
    ({"model": SERVED_NAME, "prompt": 5}, 400),
    ({"model": SERVED_NAME, "prompt": "x", "max_tokens": -5}, 400),
    ({"model": SERVED_NAME, "prompt": "x", "max_tokens": 10**30}, 400),
    ({"model": SERVED_NAME, "prompt": "x", "max_tokens": "ten"}, 400),
    ({"model": SERVED_NAME, "prompt": "y" * 5000, "max_tokens": 1}, 400),
    ({"model": SERVED_NAME, "prompt": [1, 2, 99999]}, 400),
    ({"model": SERVED_NAME, "prompt": "x", "min_tokens": 9, "max_tokens": 2}, 400),
    ({"model": "gpt-4", "prompt": "x"}, 404),
    ({"model": SERVED_NAME, "prompt": "x", "stream": "yes"}, 400),
]


async def test_errors_are_openai_shaped_with_the_right_status(server):
    async with aiohttp.ClientSession() as s:
        for body, status in BAD_BODIES:
            got, raw = await _post(s, f"{server.url}/v1/completions", body)
            err = json.loads(raw)["error"]
            assert got == status, (body, raw)
            assert set(err) == {"message", "type", "param", "code"} and err["message"]
        got, raw = await _post(s, f"{server.url}/v1/chat/completions", {"messages": "hi"})
        assert got == 400 and json.loads(raw)["error"]["param"] == "messages"
        got, raw = await _post(s, f"{server.url}/v1/completions", {"prompt": "x"}, headers={})
        assert got == 401 and json.loads(raw)["error"]["code"] == "invalid_api_key"
        async with s.get(f"{server.url}/v1/nothing", headers=AUTH) as resp:
            assert resp.status == 404 and "error" in await resp.json()
        # Health and metrics stay open without the key, as with vllm serve --api-key.
        async with s.get(f"{server.url}/health") as resp:
            assert resp.status == 200


async def test_too_long_prompt_names_the_context_length(server):
    async with aiohttp.ClientSession() as s:
        status, raw = await _post(
            s, f"{server.url}/v1/completions", {"prompt": list(range(3, 1100)), "max_tokens": 1}
        )
    assert status == 400 and "maximum context length is 1024" in json.loads(raw)["error"]["message"]


async def _stream_tokens(session, url, max_tokens):
    body = {
        "model": SERVED_NAME,
        "prompt": "stream me",
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    events = []
    async with session.post(f"{url}/v1/completions", json=body, headers=AUTH) as resp:
        assert resp.status == 200 and resp.content_type == "text/event-stream"
        async for line in resp.content:
            if line.startswith(b"data: "):
                events.append(line[6:].strip())
    assert events[-1] == b"[DONE]"
    usage = json.loads(events[-2])["usage"]
    return sum(1 for e in events[:-1] if json.loads(e)["choices"]), usage["completion_tokens"]


async def test_burst_of_bad_requests_never_500s_nor_disturbs_streams(server):
    async with aiohttp.ClientSession() as s:
        good = [asyncio.create_task(_stream_tokens(s, server.url, 48)) for _ in range(4)]
        bad = [
            _post(s, f"{server.url}/v1/completions", body)
            for _ in range(8)
            for body, _ in BAD_BODIES
        ]
        bad += [_post(s, f"{server.url}/v1/chat/completions", b'{"messages": [{}]}')] * 20
        statuses = [status for status, _ in await asyncio.gather(*bad)]
        results = await asyncio.gather(*good)
    assert all(400 <= st < 500 for st in statuses), sorted(set(statuses))
    assert results == [(48, 48)] * 4


async def _scrape(session, url):
    async with session.get(f"{url}/metrics") as resp:
        assert resp.status == 200
        return await resp.text()


async def _wait_idle(session, url, also=lambda text: True, deadline_s=30.0):
    """Scrapes until the server is idle and `also(text)` holds, or the deadline passes."""
    end = time.monotonic() + deadline_s
    while True:
        text = await _scrape(session, url)
        idle = (
            _metric(text, "vllm:num_requests_running") == 0
            and _metric(text, "vllm:kv_cache_usage_perc") == 0
            and also(text)
        )
        if idle or time.monotonic() > end:
            return text
        await asyncio.sleep(0.05)


async def test_disconnect_mid_stream_aborts_and_frees_kv(server):
    body = {
        "model": SERVED_NAME,
        "prompt": "long one",
        "max_tokens": 900,
        "ignore_eos": True,
        "stream": True,
    }
    async with aiohttp.ClientSession() as s:
        before = _metric(await _scrape(s, server.url), ABORTS, finished_reason="abort")
        resp = await s.post(f"{server.url}/v1/completions", json=body, headers=AUTH)
        got = 0
        async for line in resp.content:
            got += line.startswith(b"data: ")
            if got == 3:
                break
        mid = await _scrape(s, server.url)
        assert _metric(mid, "vllm:kv_cache_usage_perc") > 0
        resp.close()  # hang up mid-stream

        def abort_counted(text):
            return _metric(text, ABORTS, finished_reason="abort") == before + 1

        text = await _wait_idle(s, server.url, also=abort_counted)
    assert _metric(text, "vllm:num_requests_running") == 0
    assert _metric(text, "vllm:kv_cache_usage_perc") == 0
    assert _metric(text, ABORTS, finished_reason="abort") == before + 1
    assert server.state.ready.engine.stats().kv_cache_usage == 0


async def test_client_timeout_on_a_non_streaming_request_aborts_it(server):
    body = {"model": SERVED_NAME, "prompt": "slow", "max_tokens": 1000, "ignore_eos": True}
    async with aiohttp.ClientSession() as s:
        before = _metric(await _scrape(s, server.url), ABORTS, finished_reason="abort")
        with pytest.raises(asyncio.TimeoutError):
            timeout = aiohttp.ClientTimeout(total=0.3)
            await s.post(f"{server.url}/v1/completions", json=body, headers=AUTH, timeout=timeout)

        def abort_counted(text):
            return _metric(text, ABORTS, finished_reason="abort") == before + 1

        text = await _wait_idle(s, server.url, also=abort_counted)
    assert _metric(text, ABORTS, finished_reason="abort") == before + 1
    assert _metric(text, "vllm:kv_cache_usage_perc") == 0


async def test_metrics_count_served_tokens_and_return_to_idle(server):
    async with aiohttp.ClientSession() as s:
        first = await _scrape(s, server.url)
        await asyncio.gather(*(_stream_tokens(s, server.url, 10) for _ in range(3)))
        text = await _wait_idle(s, server.url)
    gen = "vllm:generation_tokens_total"
    assert _metric(text, gen) - _metric(first, gen) == 30
    assert (
        _metric(text, "vllm:prompt_tokens_total") - _metric(first, "vllm:prompt_tokens_total") == 27
    )
    assert _metric(text, "vllm:e2e_request_latency_seconds_count") >= 3
    assert _metric(text, "vllm:inter_token_latency_seconds_count") >= 27
    assert _metric(text, "engine_lite:steps_total") > 0
    assert _metric(text, "vllm:kv_cache_usage_perc") == 0


@pytest.mark.parametrize("path", ["/health", "/v1/models", "/metrics"])
async def test_get_routes_answer(server, path):
    async with aiohttp.ClientSession() as s, s.get(server.url + path, headers=AUTH) as resp:
        assert resp.status == 200
