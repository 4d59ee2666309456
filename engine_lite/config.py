"""`EngineConfig`: vLLM 0.32's knob names, defaults and validation (`SchedulerConfig`)."""

from __future__ import annotations

import dataclasses
import enum
import re
from dataclasses import dataclass
from typing import Any

from engine_lite.defaults import (
    BatchDefaults,
    DeviceInfo,
    UsageContext,
    batch_defaults,
    resolve_batch_limits,
)
from engine_lite.errors import EngineLiteError


class Policy(enum.StrEnum):
    """Which work takes the step's token budget first."""

    # vLLM 0.32 V1: the running requests (decodes and continuing prefill chunks) in admission
    # order, then new prompts under what is left. The only order vLLM has.
    DECODE_FIRST = "decode_first"
    # engine_lite extension, not deployable on vLLM: continuing and new prefill chunks take
    # the budget first, decodes get what is left.
    PREFILL_FIRST = "prefill_first"


# vLLM 0.32's scheduler flags, in the order `vllm serve --help` lists them.
VLLM_SCHEDULER_KNOBS = (
    "max_num_batched_tokens",
    "max_num_seqs",
    "enable_chunked_prefill",
    "long_prefill_token_threshold",
    "long_prefill_token_threshold_adaptive",
)
# engine_lite's own knobs that vLLM lacks; a vLLM recommendation leaves them at the default.
EXTENSION_KNOBS = ("policy",)
SCHEDULER_KNOBS = VLLM_SCHEDULER_KNOBS + EXTENSION_KNOBS

_DEVICE_RE = re.compile(r"^(auto|cpu|cuda|cuda:\d+)$")
_DTYPES = ("auto", "float32", "bfloat16", "float16")
_BACKENDS = ("auto", "torch", "flash")


@dataclass(slots=True)
class EngineConfig:
    """Everything that shapes one engine; defaults are `vllm serve`'s.

    `max_num_batched_tokens` and `max_num_seqs` left as None take vLLM 0.32's value for the
    device the engine runs on (`engine_lite.defaults`), resolved once the device is known.
    """

    model: str = "tiny"
    max_num_batched_tokens: int | None = None
    max_num_seqs: int | None = None
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0
    long_prefill_token_threshold_adaptive: bool = False
    policy: Policy = Policy.DECODE_FIRST
    block_size: int | None = None
    num_gpu_blocks_override: int | None = None
    gpu_memory_utilization: float = 0.9
    kv_cache_memory_gb: float | None = None
    max_model_len: int | None = None
    device: str = "auto"
    dtype: str = "auto"
    attention_backend: str = "auto"
    seed: int = 0
    # Torch threads on a CPU device; None: all usable cores but one when serving in bfloat16 or
    # float16, as vLLM's CPU worker runs; the process's count otherwise (`defaults.cpu_threads`).
    cpu_threads: int | None = None

    def __post_init__(self) -> None:
        self.policy = _parse_policy(self.policy)
        self._check_types()
        self._check_scheduler_knobs()
        self._check_cache_and_device()
        if self.max_model_len is not None:
            self.check_max_model_len(self.max_model_len)

    def scheduler_knobs(self) -> dict[str, Any]:
        """The scheduler fields, as `dataclasses.replace(cfg, **knobs)` takes them."""
        return {name: getattr(self, name) for name in SCHEDULER_KNOBS}

    def resolved(
        self, device: DeviceInfo, max_model_len: int, usage: UsageContext = UsageContext.SERVER
    ) -> tuple[EngineConfig, BatchDefaults]:
        """This config with unset limits filled from vLLM's table for `device`, and the row."""
        defaults = batch_defaults(device, usage)
        tokens, seqs = resolve_batch_limits(
            self.max_num_batched_tokens,
            self.max_num_seqs,
            self.enable_chunked_prefill,
            max_model_len,
            defaults,
        )
        config = dataclasses.replace(self, max_num_batched_tokens=tokens, max_num_seqs=seqs)
        config.check_max_model_len(max_model_len)
        return config, defaults

    def is_vllm_deployable(self) -> bool:
        """False when an engine_lite extension is set away from what vLLM does."""
        return self.policy is Policy.DECODE_FIRST

    def replace(self, **changes: Any) -> EngineConfig:
        """A validated copy with `changes` applied (unknown names are an error, not a typo)."""
        known = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(changes) - known)
        if unknown:
            raise EngineLiteError(
                f"unknown engine option {unknown[0]!r}; valid options: {', '.join(sorted(known))}"
            )
        return dataclasses.replace(self, **changes)

    def check_max_model_len(self, max_model_len: int) -> None:
        """Checks that need the model's context length (called again once the model is loaded)."""
        budget = self.max_num_batched_tokens
        if not self.enable_chunked_prefill and budget is not None and budget < max_model_len:
            # vLLM SchedulerConfig._verify_args: without chunking a prompt must fit one step.
            raise EngineLiteError(
                f"max_num_batched_tokens={self.max_num_batched_tokens} is smaller than "
                f"max_model_len={max_model_len} with enable_chunked_prefill=False, so long "
                "prompts could never be scheduled; raise max_num_batched_tokens, lower "
                "max_model_len, or enable chunked prefill"
            )
        if self.long_prefill_token_threshold > max_model_len:
            raise EngineLiteError(
                f"long_prefill_token_threshold={self.long_prefill_token_threshold} exceeds "
                f"max_model_len={max_model_len}; set it to at most max_model_len (0 = off)"
            )

    def _check_types(self) -> None:
        _check_int("long_prefill_token_threshold", self.long_prefill_token_threshold, 0)
        _check_int("seed", self.seed, minimum=0)
        for name in (
            "max_num_batched_tokens",
            "max_num_seqs",
            "block_size",
            "num_gpu_blocks_override",
            "max_model_len",
            "cpu_threads",
        ):
            if getattr(self, name) is not None:
                _check_int(name, getattr(self, name), minimum=1)
        for name in ("enable_chunked_prefill", "long_prefill_token_threshold_adaptive"):
            if not isinstance(getattr(self, name), bool):
                raise EngineLiteError(
                    f"{name}={getattr(self, name)!r} is invalid; use True or False"
                )
        if not isinstance(self.model, str) or not self.model:
            raise EngineLiteError(
                f"model={self.model!r} is invalid; use a preset name or a model folder"
            )

    def _check_scheduler_knobs(self) -> None:
        # vLLM 0.32 SchedulerConfig.verify_max_model_len; checked again after defaults resolve.
        tokens, seqs = self.max_num_batched_tokens, self.max_num_seqs
        if tokens is not None and seqs is not None and tokens < seqs:
            raise EngineLiteError(
                f"max_num_batched_tokens={tokens} is smaller than max_num_seqs={seqs}, so a "
                "full batch of decodes could not fit one step; raise max_num_batched_tokens "
                "or lower max_num_seqs"
            )

    def _check_cache_and_device(self) -> None:
        gmu = self.gpu_memory_utilization
        if isinstance(gmu, bool) or not isinstance(gmu, (int, float)) or not 0 < gmu <= 1:
            raise EngineLiteError(
                f"gpu_memory_utilization={gmu!r} is invalid; use a fraction in (0, 1]"
            )
        kv_gb = self.kv_cache_memory_gb
        if kv_gb is not None and (
            isinstance(kv_gb, bool) or not isinstance(kv_gb, (int, float)) or kv_gb <= 0
        ):
            raise EngineLiteError(
                f"kv_cache_memory_gb={kv_gb!r} is invalid; use a positive number of GiB"
            )
        if not isinstance(self.device, str) or not _DEVICE_RE.match(self.device):
            raise EngineLiteError(
                f"device={self.device!r} is invalid; use auto, cpu, cuda or cuda:N"
            )
        if self.dtype not in _DTYPES:
            raise EngineLiteError(f"dtype={self.dtype!r} is invalid; use one of {_DTYPES}")
        if self.attention_backend not in _BACKENDS:
            raise EngineLiteError(
                f"attention_backend={self.attention_backend!r} is invalid; use one of {_BACKENDS}"
            )


def _parse_policy(value: object) -> Policy:
    if isinstance(value, str):  # Policy members are strings too
        try:
            return Policy(value)
        except ValueError:
            pass
    choices = ", ".join(p.value for p in Policy)
    raise EngineLiteError(f"policy={value!r} is invalid; use one of {choices}")


def _check_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise EngineLiteError(f"{name}={value!r} is invalid; use an integer >= {minimum}")
