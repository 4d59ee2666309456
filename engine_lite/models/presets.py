"""Named model shapes (gpt-fast style registry) and their seeded random weights.

Step times depend on shapes, not on weight values, so a preset times like the real checkpoint
without downloading it. Random weights make the text meaningless; presets have no EOS token so
every request produces exactly `max_tokens`.
"""

from __future__ import annotations

import torch
from torch import nn

from engine_lite.errors import EngineLiteError
from engine_lite.models.model_config import ModelConfig, ModelType, RopeScaling, RopeType

# Hugging Face's `initializer_range` for these families; with RMSNorm before every projection it
# keeps activations O(1) at any depth, so bf16 stays finite even for 8B shapes.
INIT_STD = 0.02

_LLAMA3_ROPE = dict(
    rope_type=RopeType.LLAMA3,
    low_freq_factor=1.0,
    high_freq_factor=4.0,
    original_max_position_embeddings=8192,
)

PRESETS: dict[str, ModelConfig] = {
    # Same shape as the CPU peer figures in ANCHORS.md (1.4M params): on 2 cores a 4k prefill
    # step costs many decode steps, so chunking visibly changes TPOT.
    "tiny": ModelConfig(
        model_type=ModelType.LLAMA,
        hidden_size=128,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=352,
        vocab_size=4096,
        max_position_embeddings=8192,
    ),
    "small": ModelConfig(
        model_type=ModelType.LLAMA,
        hidden_size=256,
        num_layers=4,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=704,
        vocab_size=32000,
        max_position_embeddings=8192,
    ),
    # meta-llama/Llama-3.2-1B config.json
    "llama-3.2-1b": ModelConfig(
        model_type=ModelType.LLAMA,
        hidden_size=2048,
        num_layers=16,
        num_heads=32,
        num_kv_heads=8,
        head_dim=64,
        intermediate_size=8192,
        vocab_size=128256,
        max_position_embeddings=131072,
        rope_theta=500000.0,
        rope_scaling=RopeScaling(factor=32.0, **_LLAMA3_ROPE),  # type: ignore[arg-type]
        tie_word_embeddings=True,
    ),
    # meta-llama/Llama-3.1-8B config.json
    "llama-3.1-8b": ModelConfig(
        model_type=ModelType.LLAMA,
        hidden_size=4096,
        num_layers=32,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        intermediate_size=14336,
        vocab_size=128256,
        max_position_embeddings=131072,
        rope_theta=500000.0,
        rope_scaling=RopeScaling(factor=8.0, **_LLAMA3_ROPE),  # type: ignore[arg-type]
    ),
    # Qwen/Qwen2.5-7B config.json (q/k/v biases, no tying, theta 1e6)
    "qwen2.5-7b": ModelConfig(
        model_type=ModelType.QWEN2,
        hidden_size=3584,
        num_layers=28,
        num_heads=28,
        num_kv_heads=4,
        intermediate_size=18944,
        vocab_size=152064,
        max_position_embeddings=131072,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        qkv_bias=True,
    ),
}


def get_preset(name: str) -> ModelConfig:
    """The preset's shape, or an error listing the valid names."""
    try:
        return PRESETS[name]
    except KeyError:
        raise EngineLiteError(
            f"model={name!r} is neither a preset nor an existing folder; use one of "
            f"{', '.join(PRESETS)} or the path of a local Hugging Face model folder"
        ) from None


@torch.no_grad()
def init_random_weights(model: nn.Module, seed: int) -> None:
    """Fills every parameter in place, on its own device and dtype, from one seeded generator.

    Norm weights are 1 and biases 0 (as a freshly initialised Hugging Face model); matrices are
    N(0, INIT_STD). Sampling straight into the target device and dtype makes an 8B preset take
    seconds on a GPU instead of minutes through fp32 on the host.
    """
    generators: dict[torch.device, torch.Generator] = {}
    for name, param in model.named_parameters():
        if name.endswith("norm.weight"):
            param.fill_(1.0)
        elif name.endswith(".bias"):
            param.zero_()
        else:
            gen = generators.get(param.device)
            if gen is None:
                gen = torch.Generator(device=param.device).manual_seed(seed)
                generators[param.device] = gen
            param.normal_(0.0, INIT_STD, generator=gen)
