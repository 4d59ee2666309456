"""Rotary position embedding (RoFormer) with Llama 3 and linear frequency scaling."""

from __future__ import annotations

import math

import torch

from engine_lite.models.model_config import ModelConfig, RopeScaling, RopeType


def inverse_frequencies(config: ModelConfig) -> torch.Tensor:
    """Per-pair inverse frequencies in fp32, as transformers' `ROPE_INIT_FUNCTIONS` compute them."""
    dim = config.head_dim
    inv_freq = 1.0 / (
        config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim)
    )
    scaling = config.rope_scaling
    if scaling is None:
        return inv_freq
    if scaling.rope_type is RopeType.LINEAR:
        # Position interpolation (Chen et al. 2023): positions / factor == inv_freq / factor.
        return inv_freq / scaling.factor
    return _llama3_frequencies(inv_freq, scaling)


def _llama3_frequencies(inv_freq: torch.Tensor, s: RopeScaling) -> torch.Tensor:
    # Llama 3.1's scheme: keep high frequencies, divide low ones by `factor`, blend in between.
    old_len = s.original_max_position_embeddings
    low_freq_wavelen = old_len / s.low_freq_factor
    high_freq_wavelen = old_len / s.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / s.factor, inv_freq)
    smooth = (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


class RotaryEmbedding:
    """cos/sin tables for every position up to `max_positions`, looked up per step."""

    def __init__(
        self, config: ModelConfig, max_positions: int, device: torch.device, dtype: torch.dtype
    ) -> None:
        inv_freq = inverse_frequencies(config).to(device)
        positions = torch.arange(max_positions, device=device, dtype=torch.float32)
        freqs = torch.outer(positions, inv_freq)
        # Computed in fp32 then cast, like transformers, so fp32 runs match it bit for bit.
        self.cos = freqs.cos().to(dtype)
        self.sin = freqs.sin().to(dtype)

    def lookup(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin of shape [tokens, 1, head_dim / 2] (broadcast over heads)."""
        return self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotates [tokens, heads, head_dim] by halves (Hugging Face's `rotate_half` layout)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
