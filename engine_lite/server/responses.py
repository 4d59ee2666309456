"""OpenAI response bodies; streaming chunks are built from bytes encoded once per request."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from engine_lite.server.protocol import Endpoint

DONE = b"data: [DONE]\n\n"
SSE_HEADERS = {
    "Content-Type": "text/event-stream; charset=utf-8",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",
}
_FINISH_JSON = {None: b"null", "stop": b'"stop"', "length": b'"length"', "abort": b'"abort"'}
_dumps = json.dumps


@dataclass(slots=True, frozen=True)
class ResponseHeader:
    """What every chunk or body of one response repeats."""

    endpoint: Endpoint
    request_id: str
    model: str
    created: int

    @classmethod
    def new(cls, endpoint: Endpoint, request_id: str, model: str) -> ResponseHeader:
        return cls(endpoint, request_id, model, int(time.time()))


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


class ChunkEncoder:
    """SSE `data:` lines for one streaming request.

    The per-token hot path only JSON-escapes the new text and joins pre-encoded pieces: no dict
    is built and no full `json.dumps` runs per token.
    """

    __slots__ = ("_first_head", "_head", "_mid", "_prompt_tokens", "_tail")

    def __init__(self, header: ResponseHeader, prompt_tokens: int, continuous_usage: bool) -> None:
        chat = header.endpoint is Endpoint.CHAT
        obj = "chat.completion.chunk" if chat else "text_completion"
        prefix = (
            f'data: {{"id":{_dumps(header.request_id)},"object":"{obj}",'
            f'"created":{header.created},"model":{_dumps(header.model)},"choices":[{{"index":0,'
        )
        if chat:
            self._head = (prefix + '"delta":{"content":').encode()
            # The role rides on the first token's chunk, so every chunk carries a token.
            self._first_head = (prefix + '"delta":{"role":"assistant","content":').encode()
            self._mid = b'},"logprobs":null,"finish_reason":'
        else:
            self._head = self._first_head = (prefix + '"text":').encode()
            self._mid = b',"logprobs":null,"finish_reason":'
        self._prompt_tokens = prompt_tokens
        self._tail = None if continuous_usage else b"}]}\n\n"

    def chunk(
        self, text: str, finish_reason: str | None, num_output_tokens: int, first: bool
    ) -> bytes:
        head = self._first_head if first else self._head
        tail = self._tail
        if tail is None:  # continuous_usage_stats: usage in every chunk, as vLLM sends it
            tail = b'}],"usage":' + _dumps(usage(self._prompt_tokens, num_output_tokens)).encode()
            tail += b"}\n\n"
        return b"".join((head, _dumps(text).encode(), self._mid, _FINISH_JSON[finish_reason], tail))


def usage_chunk(header: ResponseHeader, prompt_tokens: int, completion_tokens: int) -> bytes:
    """The final chunk of `stream_options.include_usage`: empty choices, the request's usage."""
    obj = "chat.completion.chunk" if header.endpoint is Endpoint.CHAT else "text_completion"
    body = {
        "id": header.request_id,
        "object": obj,
        "created": header.created,
        "model": header.model,
        "choices": [],
        "usage": usage(prompt_tokens, completion_tokens),
    }
    return b"data: " + _dumps(body).encode() + b"\n\n"


def error_chunk(body: dict[str, Any]) -> bytes:
    """An error after the stream has started: vLLM sends it as one more `data:` event."""
    return b"data: " + _dumps(body).encode() + b"\n\n"


def full_response(
    header: ResponseHeader, text: str, finish_reason: str | None, prompt_tokens: int, output: int
) -> dict[str, Any]:
    """The non-streaming body of either endpoint."""
    if header.endpoint is Endpoint.CHAT:
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": None,
            "finish_reason": finish_reason,
        }
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
    return {
        "id": header.request_id,
        "object": header.endpoint.value,
        "created": header.created,
        "model": header.model,
        "choices": [choice],
        "usage": usage(prompt_tokens, output),
    }
