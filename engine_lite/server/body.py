"""Reading a request's JSON body the way `vllm serve` accepts it, within a time limit."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import hdrs, web

from engine_lite.server.protocol import APIError, parse_json_body

JSON_MEDIA_TYPE = "application/json"
# Room for a 128k-token prompt sent as ids, far past aiohttp's 1 MiB default.
MAX_BODY_BYTES = 32 * 2**20


async def read_json_body(request: web.Request, timeout_s: float) -> dict[str, Any]:
    """The body as a JSON object, or a 4xx that says what to send instead.

    vLLM's server (FastAPI) refuses any media type but `application/json`, reads the body
    as it arrives (no decompression) and treats a POST without a length as having no body;
    we answer each case the same way. A body that stops arriving is cut off after
    `timeout_s` with a 408, which vLLM lacks: otherwise a client that stalls holds a
    connection and a handler forever.
    """
    _check_content_type(request)
    _check_length(request)
    try:
        async with asyncio.timeout(timeout_s):
            raw = await request.read()
    except TimeoutError:
        raise APIError(
            f"the request body did not arrive within {timeout_s:g} s; send the whole body "
            "at once, with a Content-Length that matches it",
            status=408,
        ) from None
    try:
        return parse_json_body(raw)
    except APIError as err:
        encoding = request.headers.get(hdrs.CONTENT_ENCODING, "identity")
        if encoding.lower() == "identity":
            raise
        raise APIError(
            f"{err.message}; the body came with Content-Encoding: {encoding[:40]}, but this "
            "server, like vLLM, reads request bodies uncompressed"
        ) from None


def _check_content_type(request: web.Request) -> None:
    given = request.headers.get(hdrs.CONTENT_TYPE)
    media_type = (given or "").split(";", 1)[0].strip().lower()
    if media_type != JSON_MEDIA_TYPE:
        what = f"Content-Type {given[:60]!r}" if given else "a missing Content-Type"
        raise APIError(
            f"{what} is not supported; send the body as JSON with 'Content-Type: {JSON_MEDIA_TYPE}'"
        )


def _check_length(request: web.Request) -> None:
    # Without Content-Length or chunked encoding a request has no body (RFC 9112 6.3); an
    # HTTP/1.0 client that streams its body until it closes would otherwise get only "not
    # valid JSON", or nothing at all, for a body the server never reads.
    chunked = "chunked" in request.headers.get(hdrs.TRANSFER_ENCODING, "").lower()
    if request.content_length is None and not chunked:
        raise APIError(
            f"the {request.method} request has no Content-Length header, so it has no body; "
            "send the JSON body with a Content-Length (HTTP/1.0 cannot send one without it)"
        )
    if request.content_length is not None and request.content_length > MAX_BODY_BYTES:
        # Refused before reading, so a client that announces a huge body is not waited for.
        raise APIError(
            f"the request body of {request.content_length} bytes is over the "
            f"{MAX_BODY_BYTES // 2**20} MiB limit; send a shorter prompt",
            status=413,
        )
