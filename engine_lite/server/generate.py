"""One completion or chat request: validate, tokenize, run on the engine, stream or answer."""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from engine_lite.errors import EngineLiteError
from engine_lite.sampling_params import SamplingParams
from engine_lite.server.body import read_json_body
from engine_lite.server.protocol import APIError, Endpoint, GenerationRequest
from engine_lite.server.responses import (
    DONE,
    SSE_HEADERS,
    ChunkEncoder,
    ResponseHeader,
    error_chunk,
    full_response,
    usage_chunk,
)

if TYPE_CHECKING:
    from engine_lite.outputs import TokenEvent
    from engine_lite.server.state import Ready, ServerState

log = logging.getLogger("engine_lite.server")
_MIN_TEMP = 0.01
_MIN_TOP_P = 1e-6
Parser = Callable[[dict[str, Any]], GenerationRequest]


async def handle_generate(
    request: web.Request, state: ServerState, parse: Parser
) -> web.StreamResponse:
    ready = state.require_ready()
    greq = parse(await read_json_body(request, state.settings.body_timeout_s))
    served = state.settings.served_model_name
    if greq.model is not None and greq.model != served:
        raise APIError(
            f"The model `{greq.model}` does not exist; this server serves `{served}`",
            status=404,
            param="model",
            code="model_not_found",
        )
    prompt_ids = _prompt_token_ids(greq, ready)
    params = _sampling_params(greq, len(prompt_ids), ready)
    prefix = "chatcmpl" if greq.endpoint is Endpoint.CHAT else "cmpl"
    header = ResponseHeader.new(greq.endpoint, f"{prefix}-{uuid.uuid4().hex}", served)
    # Bad input raises EngineLiteError here, at the call (a 400); leaving the iteration early
    # (client gone, cancelled handler, aclose) aborts the request and frees its KV blocks.
    events = ready.engine.generate(prompt_ids, params, request_id=header.request_id)
    if greq.stream:
        return await _stream(request, state, ready, greq, header, len(prompt_ids), events)
    return await _complete(state, ready, header, len(prompt_ids), events)


def _prompt_token_ids(greq: GenerationRequest, ready: Ready) -> list[int]:
    if greq.messages is not None:
        ids = ready.tokenizer.encode_chat(greq.messages)
        param = "messages"
    elif greq.prompt_text is not None:
        ids = ready.tokenizer.encode(greq.prompt_text)
        param = "prompt"
    else:
        assert greq.prompt_token_ids is not None
        ids, param = greq.prompt_token_ids, "prompt"
        _check_in_vocab(ids, ready.vocab_size, param)
    if not ids:
        raise APIError(f"{param} tokenizes to no tokens; send some text", param=param)
    if len(ids) >= ready.max_model_len:
        raise APIError(
            f"This model's maximum context length is {ready.max_model_len} tokens. However, "
            f"your {param} has {len(ids)} tokens, leaving no room for output; shorten it to at "
            f"most {ready.max_model_len - 1} tokens",
            param=param,
        )
    return ids


def _check_in_vocab(ids: list[int], vocab_size: int, param: str) -> None:
    bad = next((t for t in ids if t >= vocab_size), None)
    if bad is not None:
        raise APIError(
            f"{param} holds token id {bad}, outside the vocabulary of {vocab_size} tokens; "
            f"use ids in [0, {vocab_size})",
            param=param,
        )


def _sampling_params(greq: GenerationRequest, num_prompt: int, ready: Ready) -> SamplingParams:
    room = ready.max_model_len - num_prompt
    # vLLM's default when max_tokens is omitted: whatever room the context window leaves.
    max_tokens = room if greq.max_tokens is None else greq.max_tokens
    if max_tokens > room:
        raise APIError(
            f"This model's maximum context length is {ready.max_model_len} tokens. However, you "
            f"requested {num_prompt + max_tokens} tokens ({num_prompt} in the prompt, "
            f"{max_tokens} in the completion); lower max_tokens to at most {room}",
            param="max_tokens",
        )
    _check_in_vocab(list(greq.stop_token_ids), ready.vocab_size, "stop_token_ids")
    _check_min_tokens_reachable(greq, ready)
    # vLLM V1 raises temperatures in (0, 0.01) to 0.01: dividing logits by less overflows to
    # inf, and the softmax turns it into NaN probabilities.
    temperature = greq.temperature if greq.temperature == 0 else max(greq.temperature, _MIN_TEMP)
    # Any top_p at or below the top token's probability (>= 1/vocab) keeps that token alone, so
    # raising a tiny top_p to 1e-6 changes no answer; below float32's range it would read as 0.
    top_p = max(greq.top_p, _MIN_TOP_P)
    try:
        return SamplingParams(
            max_tokens=max_tokens,
            min_tokens=greq.min_tokens,
            temperature=temperature,
            top_p=top_p,
            seed=greq.seed,
            ignore_eos=greq.ignore_eos,
            stop_token_ids=greq.stop_token_ids,
        )
    except EngineLiteError as exc:
        raise APIError(str(exc), param=str(exc).split("=", 1)[0]) from None


def _check_min_tokens_reachable(greq: GenerationRequest, ready: Ready) -> None:
    # Until min_tokens are out, stop ids cannot be sampled; if they are every id, nothing can.
    if greq.min_tokens == 0 or len(greq.stop_token_ids) < ready.vocab_size:
        return
    banned = set(greq.stop_token_ids)
    if len(banned) >= ready.vocab_size:
        raise APIError(
            f"stop_token_ids cover all {ready.vocab_size} token ids, so min_tokens="
            f"{greq.min_tokens} could never be met; drop some stop ids or set min_tokens=0",
            param="stop_token_ids",
        )


def _engine_failed(state: ServerState, header: ResponseHeader, exc: Exception) -> APIError:
    # The input passed validation and generate() accepted it, so an error while iterating
    # comes from the engine itself (its step thread died).
    log.error("request %s failed in the engine: %r", header.request_id, exc)
    state.mark_engine_failed(repr(exc))
    return APIError(f"the engine failed: {exc}", status=500)


async def _complete(
    state: ServerState,
    ready: Ready,
    header: ResponseHeader,
    num_prompt: int,
    events: AsyncIterator[TokenEvent],
) -> web.Response:
    detok = ready.tokenizer.detokenizer()
    pieces: list[str] = []
    finish_reason, num_output, first = None, 0, True
    try:
        async for ev in events:
            ready.metrics.on_tokens(len(ev.token_ids), num_prompt, first)
            first = False
            pieces.append(detok.step(ev.token_ids))
            num_output = ev.num_output_tokens
            if ev.finished:
                finish_reason = ev.finish_reason
    except Exception as exc:  # the input was valid; only the engine itself fails here
        raise _engine_failed(state, header, exc) from None
    pieces.append(detok.flush())
    body = full_response(header, "".join(pieces), finish_reason, num_prompt, num_output)
    return web.json_response(body)


async def _stream(
    request: web.Request,
    state: ServerState,
    ready: Ready,
    greq: GenerationRequest,
    header: ResponseHeader,
    num_prompt: int,
    events: AsyncIterator[TokenEvent],
) -> web.StreamResponse:
    it = events.__aiter__()
    try:
        # Headers go out with the first token, so a failure before it is still a plain status.
        ev = await it.__anext__()
    except StopAsyncIteration:
        raise APIError("the request was aborted before its first token", status=503) from None
    except Exception as exc:
        raise _engine_failed(state, header, exc) from None
    resp = web.StreamResponse(headers=SSE_HEADERS)
    await resp.prepare(request)
    try:
        num_output = await _write_tokens(resp, ready, greq, header, num_prompt, ev, it)
        if greq.include_usage:
            await resp.write(usage_chunk(header, num_prompt, num_output))
        await resp.write(DONE)
    except ConnectionError:
        pass  # the client hung up; closing the iterator below aborts the request
    except Exception as exc:  # headers are out: report in-band, as vLLM does
        err = _engine_failed(state, header, exc)
        with contextlib.suppress(ConnectionError):
            await resp.write(error_chunk(err.body()) + DONE)
    finally:
        await it.aclose()  # type: ignore[attr-defined]
    return resp


async def _write_tokens(
    resp: web.StreamResponse,
    ready: Ready,
    greq: GenerationRequest,
    header: ResponseHeader,
    num_prompt: int,
    ev: TokenEvent,
    it: AsyncIterator[TokenEvent],
) -> int:
    """The per-token hot path: detokenize, count, join pre-encoded bytes, write."""
    encoder = ChunkEncoder(header, num_prompt, greq.continuous_usage_stats)
    detok = ready.tokenizer.detokenizer()
    count_generated = ready.metrics.generation_tokens.inc
    ready.metrics.prompt_tokens.inc(num_prompt)
    write, chunk, step = resp.write, encoder.chunk, detok.step
    first = True
    while True:
        text = step(ev.token_ids)
        count_generated(len(ev.token_ids))
        if ev.finished:
            text += detok.flush()
            await write(chunk(text, ev.finish_reason, ev.num_output_tokens, first))
            return ev.num_output_tokens
        await write(chunk(text, None, ev.num_output_tokens, first))
        first = False
        ev = await it.__anext__()
