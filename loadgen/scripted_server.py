"""A streaming OpenAI-shaped server with scripted timings; its own send timestamps are the truth.

Each request streams `max_tokens` tokens: the first after `ttft_ms`, then one chunk every
`itl_ms` (optionally varied by a seeded `itl_jitter`, several tokens per chunk with
`tokens_per_chunk`). The server stamps `time.monotonic()` right before writing each chunk and
serves those stamps at `GET /truth`, keyed by the client's `X-Request-Id`. A request body may
carry `"script": {...}` to override the defaults, and `failures` maps request ids to a failure:
`"http_500"`, `"cut_after:N"` (drop the connection after N chunks), `"error_after:N"` (an
in-band error event), `"no_done"` (end without `[DONE]`) or `"hang"` (never answer).

    python -m loadgen.scripted_server --port 8123 --ttft-ms 50 --itl-ms 20
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import random
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from aiohttp import web

SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


@dataclass(slots=True, frozen=True)
class Script:
    ttft_ms: float = 50.0
    itl_ms: float = 20.0
    itl_jitter: float = 0.0  # each gap is itl_ms * (1 + jitter * U[-1, 1]), seeded per request
    tokens_per_chunk: int = 1
    fail: str | None = None


@dataclass(slots=True)
class Truth:
    """What the server did for one request (monotonic seconds)."""

    received_s: float
    chunk_sent_s: list[float] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)


class ScriptedServer:
    """The aiohttp application plus the truth it records."""

    def __init__(
        self,
        script: Script | None = None,
        max_model_len: int = 8192,
        failures: dict[str, str] | None = None,
    ) -> None:
        self.script = script or Script()
        self.failures = dict(failures or {})  # X-Request-Id -> a `Script.fail` value
        self.max_model_len = max_model_len
        self.truth: dict[str, Truth] = {}
        self._next_id = 0
        self._closing = asyncio.Event()
        self.app = web.Application(client_max_size=64 << 20)
        self.app.router.add_post("/v1/completions", self._completions)
        self.app.router.add_post("/v1/chat/completions", self._chat)
        self.app.router.add_get("/v1/models", self._models)
        self.app.router.add_get("/truth", self._truth)
        self.app.router.add_post("/truth/reset", self._reset)
        self.app.on_shutdown.append(self._on_shutdown)

    async def _on_shutdown(self, app: web.Application) -> None:
        self._closing.set()

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        received = time.monotonic()
        body = await request.json()
        rid = request.headers.get("X-Request-Id") or f"auto-{self._next_id}"
        self._next_id += 1
        script = replace(self.script, **body.get("script", {}))
        if rid in self.failures:
            script = replace(script, fail=self.failures[rid])
        if script.fail == "http_500":
            return web.json_response({"error": {"message": "scripted failure"}}, status=500)
        truth = self.truth.setdefault(rid, Truth(received))
        n_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
        n_prompt = _prompt_len(body, chat)
        opts = body.get("stream_options") or {}
        resp = web.StreamResponse(headers=SSE_HEADERS)
        await resp.prepare(request)
        if script.fail == "hang":  # until the client gives up (or the server stops)
            await self._closing.wait()
            return resp
        chunks = _chunk_sizes(n_tokens, script.tokens_per_chunk)
        gaps = _gaps_s(script, len(chunks), rid)
        counts = list(itertools.accumulate(chunks))
        last = len(chunks) - 1
        # Encoded up front, so the send loop only sleeps, stamps and writes.
        payloads = [
            _chunk(chat, k == 0, size, counts[k], n_prompt, k == last, opts)
            for k, size in enumerate(chunks)
        ]
        due, sent = received + script.ttft_ms / 1e3, 0
        for k, (size, gap) in enumerate(zip(chunks, gaps, strict=True)):
            if script.fail == f"cut_after:{k}":
                request.transport.close()  # type: ignore[union-attr]
                return resp
            if script.fail == f"error_after:{k}":
                await resp.write(b'data: {"error":{"message":"scripted mid-stream failure"}}\n\n')
                break
            due += gap if k else 0.0
            await _sleep_until(due)
            sent += size
            truth.chunk_sent_s.append(time.monotonic())
            truth.chunk_tokens.append(size)
            await resp.write(payloads[k])
        if opts.get("include_usage"):
            usage = {"prompt_tokens": n_prompt, "completion_tokens": sent}
            await resp.write(
                b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n"
            )
        if script.fail != "no_done":
            await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def _models(self, request: web.Request) -> web.Response:
        card = {"id": "scripted", "object": "model", "max_model_len": self.max_model_len}
        return web.json_response({"object": "list", "data": [card]})

    async def _truth(self, request: web.Request) -> web.Response:
        return web.json_response({rid: asdict(t) for rid, t in self.truth.items()})

    async def _reset(self, request: web.Request) -> web.Response:
        self.truth.clear()
        return web.json_response({})


def _prompt_len(body: dict[str, Any], chat: bool) -> int:
    if chat:
        return sum(len(str(m.get("content", "")).split()) for m in body.get("messages", []))
    prompt = body.get("prompt", [])
    return len(prompt) if isinstance(prompt, list) else len(str(prompt).split())


def _chunk_sizes(n_tokens: int, per_chunk: int) -> list[int]:
    full, rest = divmod(max(1, n_tokens), max(1, per_chunk))
    return [per_chunk] * full + ([rest] if rest else [])


def _gaps_s(script: Script, n: int, rid: str) -> list[float]:
    rng = random.Random(rid)
    base = script.itl_ms / 1e3
    return [base * (1 + script.itl_jitter * rng.uniform(-1, 1)) for _ in range(n)]


def _chunk(
    chat: bool, first: bool, size: int, sent: int, n_prompt: int, last: bool, opts: dict[str, Any]
) -> bytes:
    text = "tok " * size
    finish = "length" if last else None
    if chat:
        delta: dict[str, Any] = {"content": text}
        if first:
            delta = {"role": "assistant", "content": text}
        choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish}
    else:
        choice = {"index": 0, "text": text, "finish_reason": finish}
    obj: dict[str, Any] = {"object": "chunk", "choices": [choice]}
    if opts.get("continuous_usage_stats"):
        obj["usage"] = {"prompt_tokens": n_prompt, "completion_tokens": sent}
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


async def _sleep_until(due_s: float) -> None:
    delay = due_s - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)


async def start_scripted_server(
    script: Script | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
    failures: dict[str, str] | None = None,
) -> tuple[ScriptedServer, web.AppRunner, str]:
    """Start in the running loop; returns (server, runner to clean up, base URL)."""
    server = ScriptedServer(script, failures=failures)
    # Cancel a handler when its client hangs up, as a real server stops generating.
    runner = web.AppRunner(server.app, access_log=None, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    sockets = site._server.sockets if site._server is not None else []  # type: ignore[attr-defined]
    bound = sockets[0].getsockname()[1] if sockets else port
    return server, runner, f"http://{host}:{bound}"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m loadgen.scripted_server", description=__doc__)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8123, help="0 picks a free port")
    p.add_argument("--ttft-ms", type=float, default=50.0)
    p.add_argument("--itl-ms", type=float, default=20.0)
    p.add_argument("--itl-jitter", type=float, default=0.0)
    p.add_argument("--tokens-per-chunk", type=int, default=1)
    args = p.parse_args(argv)
    script = Script(args.ttft_ms, args.itl_ms, args.itl_jitter, args.tokens_per_chunk)

    async def serve() -> None:
        _, runner, url = await start_scripted_server(script, args.host, args.port)
        print(f"listening on {url}", flush=True)
        try:
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()

    from loadgen.workers import run_event_loop

    with contextlib.suppress(KeyboardInterrupt):
        run_event_loop(serve())


if __name__ == "__main__":
    main()
