"""engine_lite: a small chunked-prefill LLM engine with vLLM's scheduler knobs."""

from engine_lite.config import EngineConfig, Policy
from engine_lite.errors import EngineLiteError
from engine_lite.sampling_params import SamplingParams

__all__ = ["EngineConfig", "EngineLiteError", "Policy", "SamplingParams"]
