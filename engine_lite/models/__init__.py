"""Llama-family models: resolve `model=` (preset or local folder) and build it on a device."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from engine_lite.attention.base import AttentionBackend
from engine_lite.models.llama import KVCache, LlamaForCausalLM
from engine_lite.models.loader import load_model_config, load_weights
from engine_lite.models.model_config import ModelConfig, ModelType, RopeScaling, RopeType
from engine_lite.models.presets import PRESETS, get_preset, init_random_weights

__all__ = [
    "PRESETS",
    "KVCache",
    "LlamaForCausalLM",
    "ModelConfig",
    "ModelSource",
    "ModelType",
    "RopeScaling",
    "RopeType",
    "build_model",
    "resolve_model",
]


@dataclass(frozen=True, slots=True)
class ModelSource:
    """Where a model's weights come from: a local folder, or a preset's seeded random init."""

    name: str
    config: ModelConfig
    folder: Path | None  # None: preset


def resolve_model(model: str) -> ModelSource:
    """A preset name wins; otherwise `model` must be a local Hugging Face folder."""
    if model in PRESETS:
        return ModelSource(model, PRESETS[model], None)
    folder = Path(model).expanduser()
    if folder.is_dir():
        return ModelSource(model, load_model_config(folder), folder)
    return ModelSource(model, get_preset(model), None)  # raises, listing the presets


def build_model(
    source: ModelSource,
    backend: AttentionBackend,
    device: torch.device,
    dtype: torch.dtype,
    seed: int,
) -> LlamaForCausalLM:
    """Allocates parameters directly on `device` in `dtype`, then loads or seeds them."""
    model = LlamaForCausalLM(source.config, backend, dtype=dtype, device="meta")
    model = model.to_empty(device=device)
    if source.folder is None:
        init_random_weights(model, seed)
    else:
        load_weights(model, source.folder)
    return model.eval().requires_grad_(False)
