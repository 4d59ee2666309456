"""What a hostile client sends on the wire: each case is a 4xx, never a 500 or a traceback.

Requests go over raw sockets, so headers and framing are exactly what the test writes.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import logging

import pytest

API_KEY = "test-key"  # the session server of conftest.py
SERVED_NAME = "tiny-served"
READ_LIMIT_S = 30.0  # a bound on each exchange, not a timing assertion
GOOD_BODY = json.dumps({"model": SERVED_NAME, "prompt": "hi", "max_tokens": 2}).encode()


def _request(
    body: bytes,
    path: str = "/v1/completions",
    headers: dict[str, bytes | None] | None = None,
    version: bytes = b"1.1",
    length: bool = True,
) -> bytes:
    """A POST with our defaults; a header set to None is left out."""
    fields: dict[str, bytes | None] = {
        "Host": b"127.0.0.1",
        "Authorization": b"Bearer " + API_KEY.encode(),
        "Content-Type": b"application/json",
        "Connection": b"close",
        "Content-Length": str(len(body)).encode() if length else None,
        **(headers or {}),
    }
    lines = [b"POST " + path.encode() + b" HTTP/" + version]
    lines += [k.encode() + b": " + v for k, v in fields.items() if v is not None]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


async def _exchange(url: str, data: bytes) -> tuple[int, bytes, bytes]:
    """Writes `data`, keeps the connection open, reads until the server closes it."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(data)
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(), READ_LIMIT_S)
    finally:
        writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), head, body


def _error(body: bytes) -> dict:
    err = json.loads(body)["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    return err


async def test_lone_surrogates_in_prompt_or_chat_text_are_400(server):
    prompt = b'{"prompt": "a\\ud800b", "max_tokens": 2}'
    status, _, body = await _exchange(server.url, _request(prompt))
    assert status == 400 and _error(body)["param"] == "prompt"
    assert "lone surrogate" in _error(body)["message"]
    for content in (b'"x\\udfff"', b'[{"type": "text", "text": "\\udc00"}]'):
        chat = b'{"messages": [{"role": "user", "content": %s}]}' % content
        status, _, body = await _exchange(server.url, _request(chat, "/v1/chat/completions"))
        assert status == 400 and _error(body)["param"] == "messages"


@pytest.mark.parametrize("key", ["Bearer é".encode("latin-1"), "Bearer é".encode(), b"\xff\xfe"])
async def test_non_ascii_authorization_is_401(server, key):
    sent = _request(GOOD_BODY, headers={"Authorization": key})
    status, _, body = await _exchange(server.url, sent)
    assert status == 401 and _error(body)["code"] == "invalid_api_key"


@pytest.mark.parametrize("payload", [b"not gzip at all", gzip.compress(GOOD_BODY)])
async def test_compressed_bodies_are_400_as_in_vllm(server, payload):
    sent = _request(payload, headers={"Content-Encoding": b"gzip"})
    status, _, body = await _exchange(server.url, sent)
    assert status == 400 and "Content-Encoding: gzip" in _error(body)["message"]


@pytest.mark.parametrize("content_type", [b"text/plain", b"multipart/form-data", None])
async def test_content_type_other_than_json_is_400(server, content_type):
    sent = _request(GOOD_BODY, headers={"Content-Type": content_type})
    status, _, body = await _exchange(server.url, sent)
    assert status == 400 and "Content-Type: application/json" in _error(body)["message"]


async def test_json_content_type_with_charset_is_served(server):
    sent = _request(GOOD_BODY, headers={"Content-Type": b"Application/JSON; charset=utf-8"})
    status, _, body = await _exchange(server.url, sent)
    assert status == 200 and json.loads(body)["usage"]["completion_tokens"] == 2


@pytest.mark.parametrize("version", [b"1.0", b"1.1"])
async def test_post_without_content_length_gets_a_400_naming_it(server, version):
    # Headers only: the body an HTTP/1.0 client would stream until it closes never counts.
    sent = _request(b"", version=version, length=False)
    status, _, body = await _exchange(server.url, sent)
    assert status == 400 and "Content-Length" in _error(body)["message"]


@pytest.mark.slow
async def test_a_body_that_stops_arriving_gets_a_408(server):
    settings = server.state.settings
    saved, settings.body_timeout_s = settings.body_timeout_s, 0.2
    try:
        status, head, body = await _exchange(server.url, _request(GOOD_BODY)[:-5])
    finally:
        settings.body_timeout_s = saved
    assert status == 408 and "did not arrive within 0.2 s" in _error(body)["message"]
    assert b"Connection: close" in head


@pytest.mark.slow
async def test_a_body_announced_over_the_limit_is_refused_before_reading(server):
    sent = _request(b"{}", length=False, headers={"Content-Length": b"99999999999"})
    status, _, body = await _exchange(server.url, sent)
    assert status == 413 and "MiB limit" in _error(body)["message"]


@pytest.mark.parametrize(
    "data",
    [
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n{}",
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"GET /health HTTP/1.1\r\nHost: x\r\nX-Long: " + b"a" * 20000 + b"\r\n\r\n",
    ],
)
async def test_malformed_http_is_a_plain_400_logged_in_one_line(server, data, caplog):
    with caplog.at_level(logging.WARNING):
        status, _, _ = await _exchange(server.url, data)
    assert status == 400
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"
