"""`ModelConfig`: the shape of a Llama-family model, from a preset or a Hugging Face config.json."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from engine_lite.errors import EngineLiteError


class ModelType(enum.StrEnum):
    """Architectures the Llama implementation covers (they differ only in biases and defaults)."""

    LLAMA = "llama"
    MISTRAL = "mistral"
    QWEN2 = "qwen2"


class RopeType(enum.StrEnum):
    """RoPE frequency scalings we implement, named as Hugging Face's `rope_type`."""

    DEFAULT = "default"
    LINEAR = "linear"
    LLAMA3 = "llama3"


@dataclass(frozen=True, slots=True)
class RopeScaling:
    """Parameters of a scaled RoPE (transformers' `rope_parameters` / `rope_scaling`)."""

    rope_type: RopeType
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Everything the model code needs to know about a checkpoint's shape."""

    model_type: ModelType
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    head_dim: int = 0  # 0 = hidden_size // num_heads
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    sliding_window: int | None = None
    eos_token_id: int | None = None

    def __post_init__(self) -> None:
        if self.head_dim == 0:
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_heads)
        if self.num_heads % self.num_kv_heads != 0:
            raise EngineLiteError(
                f"num_attention_heads={self.num_heads} is not a multiple of "
                f"num_key_value_heads={self.num_kv_heads}; the checkpoint's config.json is invalid"
            )

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def num_params(self) -> int:
        """Parameter count (embeddings counted once when tied)."""
        h, i = self.hidden_size, self.intermediate_size
        attn = h * (self.q_size + 2 * self.kv_size) + self.q_size * h
        layer = attn + 3 * h * i + 2 * h
        emb = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * layer + emb + h


def model_config_from_hf(cfg: dict[str, Any], where: str) -> ModelConfig:
    """Reads a transformers config.json dict (v4 `rope_scaling` or v5 `rope_parameters`)."""
    model_type = _model_type(cfg, where)
    rope_theta, rope_scaling = _rope(cfg, where)
    attention_bias = bool(cfg.get("attention_bias", False))
    heads = int(cfg["num_attention_heads"])
    return ModelConfig(
        model_type=model_type,
        hidden_size=int(cfg["hidden_size"]),
        num_layers=int(cfg["num_hidden_layers"]),
        num_heads=heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        intermediate_size=int(cfg["intermediate_size"]),
        vocab_size=int(cfg["vocab_size"]),
        max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
        head_dim=int(cfg.get("head_dim") or 0),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=rope_theta,
        rope_scaling=rope_scaling,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        # Qwen2 always has q/k/v biases (transformers hard-codes bias=True); Llama's
        # `attention_bias` adds biases to q/k/v and o.
        qkv_bias=model_type is ModelType.QWEN2 or attention_bias,
        o_bias=model_type is ModelType.LLAMA and attention_bias,
        mlp_bias=bool(cfg.get("mlp_bias", False)),
        sliding_window=_sliding_window(cfg, model_type, where),
        eos_token_id=_first_eos(cfg.get("eos_token_id")),
    )


def _model_type(cfg: dict[str, Any], where: str) -> ModelType:
    try:
        return ModelType(cfg.get("model_type"))
    except ValueError:
        supported = ", ".join(t.value for t in ModelType)
        raise EngineLiteError(
            f"model_type={cfg.get('model_type')!r} in {where} is not supported; "
            f"use a checkpoint of type {supported}"
        ) from None


def _rope(cfg: dict[str, Any], where: str) -> tuple[float, RopeScaling | None]:
    # transformers >= 5 writes `rope_parameters` (theta inside); 4.x writes `rope_theta` plus an
    # optional `rope_scaling` whose type key was `type` in old files and `rope_type` in newer ones.
    params = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    theta = float(params.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    kind = params.get("rope_type", params.get("type", "default"))
    try:
        rope_type = RopeType(kind)
    except ValueError:
        supported = ", ".join(t.value for t in RopeType)
        raise EngineLiteError(
            f"rope type {kind!r} in {where} is not supported; supported types: {supported}"
        ) from None
    if rope_type is RopeType.DEFAULT:
        return theta, None
    scaling = RopeScaling(
        rope_type=rope_type,
        factor=float(params.get("factor", 1.0)),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=int(params.get("original_max_position_embeddings", 8192)),
    )
    return theta, scaling


def _sliding_window(cfg: dict[str, Any], model_type: ModelType, where: str) -> int | None:
    if model_type is ModelType.MISTRAL:
        window = cfg.get("sliding_window")
        return int(window) if window else None
    if model_type is ModelType.QWEN2 and cfg.get("use_sliding_window"):
        # Qwen2 applies the window only to some layers (max_window_layers); not implemented.
        raise EngineLiteError(
            f"use_sliding_window=true in {where} is not supported; set it to false "
            "(Qwen2.5 checkpoints ship with it off)"
        )
    return None


def _first_eos(value: object) -> int | None:
    # Llama 3 instruct lists several end tokens; the engine stops on the first (the
    # end-of-text token), and callers can add the others as stop_token_ids.
    if isinstance(value, list):
        return int(value[0]) if value else None
    return int(value) if isinstance(value, int) else None
