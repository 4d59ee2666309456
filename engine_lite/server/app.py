"""The aiohttp application: routes, API-key and error middlewares, and server start-up."""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from prometheus_client import CONTENT_TYPE_LATEST

from engine_lite.config import EngineConfig
from engine_lite.errors import EngineLiteError
from engine_lite.server.body import MAX_BODY_BYTES
from engine_lite.server.generate import handle_generate
from engine_lite.server.protocol import APIError, parse_chat, parse_completion
from engine_lite.server.state import ServerSettings, ServerState

if TYPE_CHECKING:
    from engine_lite.async_engine import AsyncEngine

log = logging.getLogger("engine_lite.server")
# aiohttp's own log of requests it cannot parse as HTTP (see `OneLineBadRequests`).
http_log = logging.getLogger("engine_lite.server.http")
STATE = web.AppKey("state", ServerState)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def error_response(err: APIError) -> web.Response:
    resp = web.json_response(err.body(), status=err.status)
    if err.status == 408:
        resp.force_close()  # the rest of a stalled body would be read as the next request
    return resp


@web.middleware
async def errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every failure leaves as OpenAI-shaped JSON with the status that fits it."""
    try:
        return await handler(request)
    except APIError as err:
        return error_response(err)
    except EngineLiteError as err:
        return error_response(APIError(str(err)))
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return error_response(
            APIError(f"{exc.reason}: {request.method} {request.path}", exc.status)
        )
    except Exception:  # a bug of ours: still JSON, and its traceback in the log
        log.exception("request %s %s failed", request.method, request.path)
        return error_response(APIError("internal server error; see the server log", 500))


def auth_middleware(api_key: str) -> Callable[..., Awaitable[web.StreamResponse]]:
    """Bearer-token check on /v1 routes only, like `vllm serve --api-key` (health stays open)."""
    expected = f"Bearer {api_key}".encode()

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path.startswith("/v1"):
            # Header bytes that are not UTF-8 arrive as surrogate escapes; encoding them
            # back gives the bytes the client sent, which then simply do not match.
            got = request.headers.get("Authorization", "").encode("utf-8", "surrogateescape")
            if not hmac.compare_digest(got, expected):
                raise APIError(
                    "invalid or missing API key; send the --api-key value as "
                    "'Authorization: Bearer <key>'",
                    status=401,
                    code="invalid_api_key",
                )
        return await handler(request)

    return check


async def completions(request: web.Request) -> web.StreamResponse:
    return await handle_generate(request, request.app[STATE], parse_completion)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await handle_generate(request, request.app[STATE], parse_chat)


async def models(request: web.Request) -> web.Response:
    state = request.app[STATE]
    ready = state.require_ready()
    card = {
        "id": state.settings.served_model_name,
        "object": "model",
        "created": int(time.time()),
        "owned_by": "engine-lite",
        "root": state.config.model,
        "max_model_len": ready.max_model_len,
    }
    return web.json_response({"object": "list", "data": [card]})


async def health(request: web.Request) -> web.Response:
    request.app[STATE].require_ready()
    return web.Response(status=200)


async def metrics(request: web.Request) -> web.Response:
    ready = request.app[STATE].require_ready()
    body = ready.metrics.render(ready.engine.stats())
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def build_app(
    config: EngineConfig, settings: ServerSettings, engine: AsyncEngine | None = None
) -> web.Application:
    """The server app; it loads `config`'s model after start-up unless `engine` is given.

    A given engine must already be started and is not shut down with the app (the benchmark
    shares one engine between the in-process and the HTTP path).
    """
    middlewares = [errors_middleware]
    if settings.api_key:
        middlewares.append(auth_middleware(settings.api_key))
    app = web.Application(middlewares=middlewares, client_max_size=MAX_BODY_BYTES)
    state = ServerState(config, settings, engine)
    app[STATE] = state
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)

    async def on_startup(_: web.Application) -> None:
        state.start_loading()

    async def on_shutdown(_: web.Application) -> None:
        # Before aiohttp waits for open connections: stopping the engine ends every stream
        # with finish_reason "abort" at once, instead of holding shutdown for long outputs.
        await state.close()

    app.on_startup.append(on_startup)
    app.on_shutdown.append(on_shutdown)
    return app


async def start_site(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, int]:
    """Serves `app` on host:port (0 picks a free port); returns the runner and the real port.

    Handler cancellation is on so that a client that hangs up cancels its handler, which
    aborts the request and frees its KV blocks at once. Bodies are not decompressed, as in
    vLLM's server: a compressed body is then a 400 rather than a decoder error.
    """
    runner = web.AppRunner(
        app,
        handler_cancellation=True,
        access_log=None,
        auto_decompress=False,
        logger=http_log,
    )
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=1024)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise EngineLiteError(
            f"cannot listen on {host}:{port} ({exc.strerror or exc}); pick another --port or --host"
        ) from None
    return runner, int(runner.addresses[0][1])


class OneLineBadRequests(logging.Filter):
    """aiohttp answers a request that is not valid HTTP (a bad Content-Length or chunk size, a
    header line over 8 KiB) with a plain-text 400, as uvicorn does under vLLM, but logs it
    with a traceback; that is the client's mistake, so one warning line says it."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if not isinstance(exc, HttpProcessingError) or exc.code >= 500:
            return True
        reason = ((exc.message or "").strip().splitlines() or [""])[0].rstrip(":")
        log.warning("%s: %d %s", record.getMessage(), exc.code, reason[:200])
        return False


http_log.addFilter(OneLineBadRequests())
