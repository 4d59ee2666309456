"""The `loadgen` command's target: a server by URL, or the built-in engine from engine flags."""

from __future__ import annotations

import argparse
import dataclasses
import re
from typing import Any

from loadgen.cli_args import ENGINE_INT_FLAGS, ENGINE_OTHER_FLAGS
from loadgen.client import HttpTarget
from loadgen.errors import LoadgenError
from loadgen.presets import REFERENCE_MODEL_LEN
from loadgen.target import Target
from loadgen.workloads import DEFAULT_VOCAB_SIZE

# EngineConfig fields that loadgen takes as flags of the same name.
_ENGINE_FLAG_FIELDS = (*ENGINE_INT_FLAGS, *ENGINE_OTHER_FLAGS, "max_model_len")


@dataclasses.dataclass(slots=True)
class TargetMeta:
    """What the target says about its model, and the backend name for the result."""

    max_model_len: int
    vocab_size: int
    model_id: str
    backend: str


async def open_target(args: argparse.Namespace) -> tuple[Target, Any, TargetMeta]:
    """The target, the engine to shut down (--builtin) and what it says about the model."""
    if args.builtin:
        return await _open_builtin(args)
    probe = HttpTarget(args.url, args.model, args.endpoint, api_key=args.api_key)
    await probe.open()  # one clear line if the server cannot be reached
    card = await probe.server_info()
    await probe.close()
    model = args.model or card.get("id")
    meta = TargetMeta(
        max_model_len=int(args.max_model_len or card.get("max_model_len") or REFERENCE_MODEL_LEN),
        vocab_size=args.vocab_size or DEFAULT_VOCAB_SIZE,
        model_id=model or "",
        backend="openai" if args.endpoint == "completions" else "openai-chat",
    )
    return HttpTarget(args.url, model, args.endpoint, api_key=args.api_key), None, meta


async def _open_builtin(args: argparse.Namespace) -> tuple[Target, Any, TargetMeta]:
    # Imported here: torch takes seconds to load, and --url runs never need it.
    from engine_lite import AsyncEngine, EngineConfig
    from engine_lite.errors import EngineLiteError
    from loadgen.inprocess import InProcessTarget

    knobs = {f: getattr(args, f) for f in _ENGINE_FLAG_FIELDS if getattr(args, f) is not None}
    try:
        engine = AsyncEngine(EngineConfig(model=args.model or "tiny", **knobs))
        await engine.start()
    except EngineLiteError as exc:
        raise LoadgenError(engine_error_as_flags(str(exc))) from None
    meta = TargetMeta(
        engine.max_model_len, engine.vocab_size, engine.config.model, "engine-lite-inprocess"
    )
    return InProcessTarget(engine), engine, meta


def engine_error_as_flags(message: str) -> str:
    """The engine's errors name its config fields; the user typed loadgen flags of the same
    names. `model` is only rewritten as `model=`, since the bare word is also plain prose."""
    for name in _ENGINE_FLAG_FIELDS:
        message = re.sub(rf"\b{name}\b", "--" + name.replace("_", "-"), message)
    message = re.sub(r"\bmodel=", "--model=", message)
    message = message.replace("--enable-chunked-prefill=False", "--no-enable-chunked-prefill")
    return message.replace("--enable-chunked-prefill=True", "--enable-chunked-prefill")
