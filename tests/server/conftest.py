"""A real `engine-lite serve` app on the tiny preset, in its own thread and event loop."""

from __future__ import annotations

import asyncio
import threading

import pytest

from engine_lite.config import EngineConfig
from engine_lite.server.app import STATE, build_app, start_site
from engine_lite.server.state import ServerSettings

API_KEY = "test-key"
SERVED_NAME = "tiny-served"
# Small KV cache and context: the tests run beside others on two cores.
TEST_CONFIG = EngineConfig(
    model="tiny", max_model_len=1024, kv_cache_memory_gb=0.05, max_num_batched_tokens=512
)


class ServerThread:
    """Runs the server app on 127.0.0.1 in a separate loop, like a separate process would."""

    def __init__(self, config: EngineConfig, settings: ServerSettings) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.app = build_app(config, settings)
        self.runner = None
        self.port = 0

    def call(self, coro, timeout: float = 120.0):
        """Runs `coro` on the server's loop and returns its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def start(self) -> ServerThread:
        self.thread.start()
        self.runner, self.port = self.call(start_site(self.app, "127.0.0.1", 0))
        self.call(self.state.wait_loaded())
        return self

    @property
    def state(self):
        return self.app[STATE]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.call(self.runner.cleanup())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=30)


@pytest.fixture(scope="session")
def server_thread():
    """The `ServerThread` class, for tests that need a server of their own."""
    return ServerThread


@pytest.fixture(scope="session")
def server():
    srv = ServerThread(TEST_CONFIG, ServerSettings(SERVED_NAME, api_key=API_KEY)).start()
    yield srv
    srv.stop()
