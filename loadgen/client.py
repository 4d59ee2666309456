"""`HttpTarget`: an aiohttp SSE client for `/v1/completions` and `/v1/chat/completions`."""

from __future__ import annotations

import asyncio
import enum
import json
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import yarl

from loadgen.errors import LoadgenError
from loadgen.records import RequestRecord
from loadgen.sse import DONE, ChunkReader, SSEBuffer, loads
from loadgen.workloads import RequestSpec

# Long SSE lines (a chunk with many token ids, a big error body) fit without pausing the reader.
READ_BUFSIZE = 1 << 20
# Chat prompts are text: one common word per prompt token id, each a single token in the usual
# BPE vocabularies, so the prompt length is close; the server's usage gives the exact count.
_WORD_TEXT = (
    "the of and to in is was for on that with as by at from his her they this are be had not "
    "but have one all were when we there can an which their said if do will each about how "
    "up out them then she many some so these would other into has more two time could no "
    "make than first been its who now people my made over did down only way find use may "
    "water long"
)
_WORDS = _WORD_TEXT.split()


class Endpoint(enum.StrEnum):
    COMPLETIONS = "completions"
    CHAT = "chat"

    @property
    def path(self) -> str:
        return "/v1/completions" if self is Endpoint.COMPLETIONS else "/v1/chat/completions"


@dataclass(slots=True, frozen=True)
class HttpTargetConfig:
    """Everything needed to rebuild an `HttpTarget` (in a worker process, for instance)."""

    url: str
    model: str | None
    endpoint: str = "completions"
    api_key: str | None = None
    extra_body: dict[str, Any] = field(default_factory=dict)
    connect_timeout_s: float = 5.0

    def __call__(self) -> HttpTarget:
        return HttpTarget(
            self.url,
            self.model,
            self.endpoint,
            api_key=self.api_key,
            extra_body=self.extra_body,
            connect_timeout_s=self.connect_timeout_s,
        )


class HttpTarget:
    """Streams each request from an OpenAI-compatible server and records every chunk's arrival.

    Prompts go as token ids to `/v1/completions` (vLLM and engine-lite accept them, so input
    lengths are exact without a tokenizer); `ignore_eos`, `max_tokens` and `min_tokens` force
    the output length; `stream_options` asks for usage (and running usage, which gives each
    chunk's exact token count where the server supports it).
    """

    def __init__(
        self,
        url: str,
        model: str | None,
        endpoint: str = "completions",
        *,
        api_key: str | None = None,
        extra_body: dict[str, Any] | None = None,
        connect_timeout_s: float = 5.0,
    ) -> None:
        try:
            self.endpoint = Endpoint(endpoint)
        except ValueError:
            raise LoadgenError(
                f"endpoint {endpoint!r} is unknown; use completions or chat"
            ) from None
        self.base_url = normalize_base_url(url)
        self.model = model
        self.config = HttpTargetConfig(
            url, model, str(self.endpoint), api_key, dict(extra_body or {}), connect_timeout_s
        )
        self.url = self.base_url + self.endpoint.path
        self._url = yarl.URL(self.url)
        self.description = f"{self.url} (model {model or 'default'})"
        self._headers = {"Content-Type": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._session: aiohttp.ClientSession | None = None
        self.chunk_times_from_loop = True

    async def open(self) -> None:
        """Start the session and fail fast, in one line, when the server cannot be reached."""
        if self._session is None:
            self._session = self.new_session()
        try:
            await self.server_info()
        except BaseException:
            await self.close()
            raise

    def new_session(self, **extra: Any) -> aiohttp.ClientSession:
        """The one session of a replay (`extra` goes to `ClientSession`, e.g. trace_configs)."""
        # No connection cap: an open-loop replay must never queue behind a pool limit.
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=0)
        return aiohttp.ClientSession(
            connector=connector,
            read_bufsize=READ_BUFSIZE,
            # Less work between the send stamp and the request leaving: no cookies to store
            # or send, and the URL parsed once (in __init__) instead of per request.
            cookie_jar=aiohttp.DummyCookieJar(),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.config.connect_timeout_s),
            **extra,
        )

    async def server_info(self) -> dict[str, Any]:
        """The first model card of `GET /v1/models` ({} if the server has none to show)."""
        session = self._require_session()
        url = self.base_url + "/v1/models"
        try:
            timeout = aiohttp.ClientTimeout(total=self.config.connect_timeout_s)
            async with session.get(url, headers=self._headers, timeout=timeout) as resp:
                status = resp.status
                body = await resp.json(content_type=None) if status == 200 else None
        except (TimeoutError, aiohttp.ClientConnectionError, OSError) as exc:
            reason = _reason(exc) or f"no answer within {self.config.connect_timeout_s:g} s"
            raise LoadgenError(
                f"cannot reach {self.base_url} ({reason}); start the server or fix --url"
            ) from None
        except (ValueError, aiohttp.ContentTypeError):
            return {}
        if status in (401, 403):  # every request would fail the same way: say it once, now
            raise LoadgenError(
                f"{self.base_url} refused the API key (HTTP {status}); pass the server's key "
                "with --api-key"
            )
        data = body.get("data") if isinstance(body, dict) else None
        return data[0] if isinstance(data, list) and data and isinstance(data[0], dict) else {}

    def prepare(self, spec: RequestSpec) -> bytes:
        body: dict[str, Any] = {"model": self.model} if self.model else {}
        n = spec.output_len
        if self.endpoint is Endpoint.COMPLETIONS:
            body.update(prompt=spec.prompt_token_ids, max_tokens=n)
        else:
            text = " ".join(_WORDS[t % len(_WORDS)] for t in spec.prompt_token_ids)
            body.update(messages=[{"role": "user", "content": text}], max_completion_tokens=n)
        body.update(
            min_tokens=n,
            ignore_eos=True,
            temperature=0.0,
            stream=True,
            stream_options={"include_usage": True, "continuous_usage_stats": True},
        )
        body.update(self.config.extra_body)
        return json.dumps(body, separators=(",", ":")).encode()

    async def send(
        self, spec: RequestSpec, prepared: bytes, record: RequestRecord, timeout_s: float
    ) -> None:
        session = self._require_session()
        headers = {**self._headers, "X-Request-Id": str(spec.index)}
        record.sent_s = time.monotonic()
        try:
            await asyncio.wait_for(self._stream(session, prepared, headers, record), timeout_s)
        except TimeoutError:
            record.fail(
                f"timeout after {timeout_s:g} s ({len(record.chunk_times_s)} chunks)",
                time.monotonic(),
            )
        except aiohttp.ClientConnectorError as exc:
            record.fail(f"connection failed: {_reason(exc)}", time.monotonic())
        except (aiohttp.ClientError, OSError) as exc:
            n = len(record.chunk_times_s)
            record.fail(f"stream cut after {n} chunks: {_reason(exc)}", time.monotonic())

    async def _stream(
        self,
        session: aiohttp.ClientSession,
        payload: bytes,
        headers: dict[str, str],
        record: RequestRecord,
    ) -> None:
        async with session.post(self._url, data=payload, headers=headers) as resp:
            if resp.status != 200:
                record.fail(f"HTTP {resp.status}: {await _error_body(resp)}", time.monotonic())
                return
            reader = ChunkReader(chat=self.endpoint is Endpoint.CHAT)
            done = await _read_events(resp, reader, record)
        now = time.monotonic()
        record.prompt_tokens, record.output_tokens = reader.prompt_tokens, reader.completion_tokens
        if reader.error:
            record.fail(reader.error, now)
        elif not done:
            record.fail(f"stream cut after {len(record.chunk_times_s)} chunks (no [DONE])", now)
        elif not record.chunk_times_s:
            record.fail("the stream ended without any token", now)
        else:
            record.success, record.finished_s = True, now

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def worker_factory(self) -> HttpTargetConfig:
        return self.config

    def _require_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("HttpTarget.open() must run before requests are sent")
        return self._session


async def _read_events(
    resp: aiohttp.ClientResponse, reader: ChunkReader, record: RequestRecord
) -> bool:
    """Read the stream; one arrival time per network read (events read together arrived
    together). Returns whether `[DONE]` came."""
    buffer = SSEBuffer()
    times, tokens = record.chunk_times_s, record.chunk_tokens
    async for data in resp.content.iter_any():
        now = time.monotonic()
        for payload in buffer.feed(data):
            if payload == DONE:
                return True
            try:
                n = reader.tokens_in(loads(payload))
            except ValueError:
                reader.error = f"malformed event {payload[:80]!r}"
                return False
            if reader.error:
                return False
            if n:
                times.append(now)
                tokens.append(n)
    return False


async def _error_body(resp: aiohttp.ClientResponse) -> str:
    text = (await resp.text(errors="replace")).strip()
    try:
        err = json.loads(text).get("error", text)
        text = err.get("message", str(err)) if isinstance(err, dict) else str(err)
    except (ValueError, AttributeError):
        pass
    return " ".join(text.split())[:300] or (resp.reason or "")


def _reason(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, aiohttp.ClientConnectorError) and exc.os_error is not None:
        text = exc.os_error.strerror or text
    return text[:200]


def normalize_base_url(url: str) -> str:
    """`http://host:8000`, `.../v1` or `.../v1/` all name the same server."""
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise LoadgenError(f"url {url!r} is invalid; use http://HOST:PORT")
    try:  # a port past 65535 or an unclosed [IPv6 bracket only fails when parsed
        parsed = yarl.URL(url)
        has_host = bool(parsed.host) and parsed.port is not None
    except ValueError as exc:
        raise LoadgenError(f"url {url!r} is invalid ({exc}); use http://HOST:PORT") from None
    if not has_host:
        raise LoadgenError(f"url {url!r} has no host; use http://HOST:PORT")
    base = url.rstrip("/")
    for suffix in ("/v1/completions", "/v1/chat/completions", "/v1"):
        base = base.removesuffix(suffix)
    return base
