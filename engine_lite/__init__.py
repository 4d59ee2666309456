"""engine_lite: a small chunked-prefill LLM engine with vLLM's scheduler knobs."""

import os

# OpenMP workers spin while idle by default; on a small shared CPU that spinning starved the
# engine (6-10x slower steps under load). Must be set before torch loads its OpenMP runtime;
# a user's own setting wins. The caller's own value (or "unset") is kept for the servers we
# start, such as real vLLM, which should run as the user would run it.
os.environ.setdefault(
    "ENGINE_LITE_CALLER_OMP_WAIT_POLICY", os.environ.get("OMP_WAIT_POLICY", "unset")
)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


from engine_lite.async_engine import AsyncEngine
from engine_lite.config import EngineConfig, Policy
from engine_lite.errors import EngineLiteError
from engine_lite.llm import LLM
from engine_lite.outputs import (
    CompletionOutput,
    EngineStats,
    RequestOutput,
    RequestStats,
    StepStats,
    TokenEvent,
)
from engine_lite.sampling_params import SamplingParams

__all__ = [
    "LLM",
    "AsyncEngine",
    "CompletionOutput",
    "EngineConfig",
    "EngineLiteError",
    "EngineStats",
    "Policy",
    "RequestOutput",
    "RequestStats",
    "SamplingParams",
    "StepStats",
    "TokenEvent",
]
