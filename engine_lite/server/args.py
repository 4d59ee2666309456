"""Command-line flags: every `EngineConfig` knob under vLLM's flag name, plus server options."""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from typing import NoReturn

from engine_lite.config import EngineConfig, Policy
from engine_lite.errors import EngineLiteError

# flag dest -> EngineConfig field; the flags are `vllm serve`'s (dashes for underscores).
ENGINE_FIELDS = (
    "model",
    "max_num_batched_tokens",
    "max_num_seqs",
    "enable_chunked_prefill",
    "long_prefill_token_threshold",
    "long_prefill_token_threshold_adaptive",
    "policy",
    "block_size",
    "num_gpu_blocks_override",
    "gpu_memory_utilization",
    "kv_cache_memory_gb",
    "max_model_len",
    "device",
    "dtype",
    "attention_backend",
    "seed",
    "cpu_threads",
)


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a bad flag as one `error: ...` line and exits 2, no usage dump."""

    def error(self, message: str) -> NoReturn:
        print(f"error: {message} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(2)


def _number(kind: type, minimum: float, what: str) -> Callable[[str], float]:
    def convert(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{text!r} is invalid; use {what} >= {minimum}")
        return value

    convert.__name__ = what  # argparse names the type in some messages
    return convert


def _port(text: str) -> int:
    if not text.isdigit() or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port; use 0..65535")
    return int(text)


_INT0 = _number(int, 0, "an integer")
_INT1 = _number(int, 1, "an integer")


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    """Adds the engine flags; unset flags keep `EngineConfig`'s (vLLM's) defaults."""
    g = parser.add_argument_group("engine (vLLM 0.32 flag names; defaults are vllm serve's)")
    g.add_argument("--model", default="tiny", help="preset name or local Hugging Face folder")
    g.add_argument(
        "--max-num-batched-tokens",
        type=_INT1,
        help="token budget of one step (default: vLLM's for the device: 2048 on CPU, "
        "8192 on H100/H200)",
    )
    g.add_argument(
        "--max-num-seqs",
        type=_INT1,
        help="most running requests (default: vLLM's for the device: 128 on CPU, 1024 on H100)",
    )
    g.add_argument(
        "--enable-chunked-prefill",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="split long prompts across steps (default on)",
    )
    g.add_argument(
        "--long-prefill-token-threshold",
        type=_INT0,
        help="most prompt tokens per request per step (0 = off)",
    )
    g.add_argument(
        "--long-prefill-token-threshold-adaptive",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="floor the threshold at budget / (running + waiting) (default off)",
    )
    g.add_argument(
        "--policy",
        choices=[p.value for p in Policy],
        help="engine_lite extension, not a vLLM flag: decode_first (vLLM's order, default) "
        "or prefill_first",
    )
    g.add_argument("--block-size", type=_INT1, help="tokens per KV block")
    g.add_argument("--num-gpu-blocks-override", type=_INT1, help="KV cache size in blocks")
    g.add_argument(
        "--gpu-memory-utilization",
        type=_number(float, 0.0, "a fraction"),
        help="CUDA: fraction of memory",
    )
    g.add_argument(
        "--kv-cache-memory-gb",
        type=_number(float, 0.0, "a number of GiB"),
        help="KV cache GiB off CUDA",
    )
    g.add_argument("--max-model-len", type=_INT1, help="longest prompt + output")
    g.add_argument("--device", help="auto, cpu, cuda or cuda:N")
    g.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"])
    g.add_argument("--attention-backend", choices=["auto", "torch", "flash"])
    g.add_argument("--seed", type=_INT0, help="seed of a preset's random weights")
    g.add_argument(
        "--cpu-threads",
        type=_INT1,
        help="torch threads on a CPU (default: in bfloat16 or float16 all usable cores but "
        "one, left to the serving path as vLLM's CPU worker does; in float32 torch's count)",
    )


def config_from_args(ns: argparse.Namespace) -> EngineConfig:
    """The validated config; raises `EngineLiteError` naming the flag and the fix."""
    given = {f: getattr(ns, f) for f in ENGINE_FIELDS if getattr(ns, f, None) is not None}
    try:
        return EngineConfig(**given)
    except EngineLiteError as exc:
        raise EngineLiteError(as_flag(str(exc))) from None


def as_flag(message: str) -> str:
    # EngineConfig speaks in field names; on the command line the user typed flags. "model" is
    # only rewritten as `model=`, since the bare word is also plain prose.
    for field in ENGINE_FIELDS:
        flag = "--" + field.replace("_", "-")
        pattern = rf"\b{field}=" if field == "model" else rf"\b{field}\b"
        message = re.sub(pattern, flag + ("=" if field == "model" else ""), message)
    for switch in ("--enable-chunked-prefill", "--long-prefill-token-threshold-adaptive"):
        message = message.replace(f"{switch}=False", "--no-" + switch[2:])
        message = message.replace(f"{switch}=True", switch)
    return message


def build_serve_parser() -> OneLineParser:
    parser = OneLineParser(
        prog="engine-lite serve",
        description="OpenAI-compatible server with vLLM-compatible Prometheus metrics.",
    )
    add_engine_args(parser)
    s = parser.add_argument_group("server")
    s.add_argument("--served-model-name", help="model name clients send (default: --model)")
    s.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    s.add_argument("--port", type=_port, default=8000, help="0 = any free port (default 8000)")
    s.add_argument("--api-key", help="require 'Authorization: Bearer KEY' on /v1 routes")
    return parser
