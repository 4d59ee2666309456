"""`engine-lite serve`: open the port, load the model behind it, serve until a signal."""

from __future__ import annotations

import asyncio
import signal
import sys

from engine_lite.config import EngineConfig
from engine_lite.defaults import BatchDefaults
from engine_lite.errors import EngineLiteError
from engine_lite.server.app import STATE, build_app, start_site
from engine_lite.server.args import as_flag, build_serve_parser, config_from_args
from engine_lite.server.state import ServerSettings


def main(argv: list[str]) -> int:
    ns = build_serve_parser().parse_args(argv)
    try:
        config = config_from_args(ns)
        settings = ServerSettings(ns.served_model_name or ns.model, ns.api_key)
        asyncio.run(serve(config, settings, ns.host, ns.port))
    except EngineLiteError as exc:
        # Load errors speak of config fields; the user typed flags.
        print(f"error: {as_flag(str(exc))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        pass
    return 0


async def serve(config: EngineConfig, settings: ServerSettings, host: str, port: int) -> None:
    """Binds first so `/health` can answer 503 while the weights load, as `vllm serve` does."""
    app = build_app(config, settings)
    runner, bound = await start_site(app, host, port)
    try:
        _say(f"listening on http://{host}:{bound} (loading model {config.model})")
        ready = await app[STATE].wait_loaded()
        _say(
            f"ready: model {config.model} served as {settings.served_model_name}, "
            f"max_model_len {ready.max_model_len}"
        )
        _say(describe_scheduler(config, ready.engine.config, ready.engine.batch_defaults))
        await _until_signal()
    finally:
        await runner.cleanup()


def describe_scheduler(asked: EngineConfig, used: EngineConfig, defaults: BatchDefaults) -> str:
    """The limits in force, and which of them came from vLLM's device table."""
    line = (
        f"scheduler: max_num_batched_tokens {used.max_num_batched_tokens}, max_num_seqs "
        f"{used.max_num_seqs}, long_prefill_token_threshold "
        f"{used.long_prefill_token_threshold}"
    )
    if asked.max_num_batched_tokens is None or asked.max_num_seqs is None:
        line += f"; unset limits from {defaults.describe()}"
    return line


def _say(line: str) -> None:
    print(f"engine-lite serve: {line}", flush=True)


async def _until_signal() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
