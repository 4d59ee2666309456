"""The server's engine, tokenizer and metrics, loaded in the background after the port opens."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine_lite.config import EngineConfig
from engine_lite.errors import EngineLiteError
from engine_lite.server.metrics import ServerMetrics
from engine_lite.server.protocol import APIError
from engine_lite.server.tokenizer import Tokenizer, load_tokenizer

if TYPE_CHECKING:
    from engine_lite.async_engine import AsyncEngine

log = logging.getLogger("engine_lite.server")


@dataclass(slots=True)
class ServerSettings:
    """Server options that are not engine knobs."""

    served_model_name: str
    api_key: str | None = None
    # Longest wait for a request body to arrive in full (408 after it).
    body_timeout_s: float = 60.0


@dataclass(slots=True)
class Ready:
    """Everything a request handler needs, present once the model is loaded."""

    engine: AsyncEngine
    tokenizer: Tokenizer
    metrics: ServerMetrics
    max_model_len: int
    vocab_size: int


class ServerState:
    """Loads the engine off the event loop; `/health` answers 200 only once `ready` is set."""

    def __init__(
        self, config: EngineConfig, settings: ServerSettings, engine: AsyncEngine | None = None
    ) -> None:
        self.config = config
        self.settings = settings
        self.ready: Ready | None = None
        self.load_error: str | None = None
        self.engine_error: str | None = None
        self._given_engine = engine
        self._owns_engine = engine is None
        self._task: asyncio.Task[None] | None = None

    def start_loading(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._load())

    async def wait_loaded(self) -> Ready:
        """Waits for the load; raises `EngineLiteError` with the reason when it failed."""
        assert self._task is not None, "start_loading() first"
        await asyncio.shield(self._task)
        if self.ready is None:
            raise EngineLiteError(self.load_error or "the model failed to load")
        return self.ready

    def require_ready(self) -> Ready:
        if self.engine_error is not None:
            raise APIError(
                f"the engine stopped after an error ({self.engine_error}); restart the server",
                status=503,
            )
        if self.ready is not None:
            return self.ready
        if self.load_error is not None:
            raise APIError(f"the model failed to load: {self.load_error}", status=503)
        raise APIError("the model is still loading; retry once /health answers 200", status=503)

    def mark_engine_failed(self, reason: str) -> None:
        """The step thread died: from now on `/health` and every request answer 503, so an
        orchestrator restarts the server instead of routing traffic to it."""
        if self.engine_error is None:
            log.error("engine failed: %s", reason)
            self.engine_error = reason

    async def _load(self) -> None:
        try:
            engine = self._given_engine or await asyncio.get_running_loop().run_in_executor(
                None, _build_engine, self.config
            )
            self._given_engine = engine
            if self._owns_engine:
                await engine.start()
            self.ready = self._wire(engine)
        except EngineLiteError as exc:
            self.load_error = str(exc)
        except Exception as exc:  # torch or file errors: the server must still answer 503
            log.exception("loading %s failed", self.config.model)
            self.load_error = f"{type(exc).__name__}: {exc}"

    def _wire(self, engine: AsyncEngine) -> Ready:
        tokenizer = load_tokenizer(self.config.model, engine.vocab_size, engine.eos_token_id)
        metrics = ServerMetrics(self.settings.served_model_name, engine.max_model_len)
        engine.add_step_listener(metrics.on_step)
        engine.add_finish_listener(metrics.on_finish)
        return Ready(engine, tokenizer, metrics, engine.max_model_len, engine.vocab_size)

    async def close(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._owns_engine and self._given_engine is not None:
            await self._given_engine.shutdown()


def _build_engine(config: EngineConfig) -> AsyncEngine:
    # Imported here: torch takes seconds to import, and `engine-lite serve --help` or a bad flag
    # should answer at once.
    from engine_lite.async_engine import AsyncEngine

    return AsyncEngine(config)
