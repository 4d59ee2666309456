"""`engine-lite serve`: an OpenAI-compatible aiohttp server with vLLM-compatible metrics."""

from engine_lite.server.app import build_app, start_site
from engine_lite.server.state import ServerSettings

__all__ = ["ServerSettings", "build_app", "start_site"]
