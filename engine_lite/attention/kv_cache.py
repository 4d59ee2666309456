"""Sizes and allocates the paged KV cache: one [num_blocks, block_size, kv_heads, head_dim] K and V
tensor per layer (flash-attn's paged layout)."""

from __future__ import annotations

import torch

from engine_lite.config import EngineConfig
from engine_lite.errors import EngineLiteError
from engine_lite.models.model_config import ModelConfig

GIB = 1 << 30
DEFAULT_CPU_KV_GB = 4.0
# Headroom on CUDA for the CUDA context, allocator fragmentation and kernels' workspaces.
CUDA_FIXED_MARGIN_BYTES = 1 * GIB


def bytes_per_block(cfg: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    itemsize = torch.empty((), dtype=dtype).element_size()
    return 2 * cfg.num_layers * block_size * cfg.num_kv_heads * cfg.head_dim * itemsize


def activation_bytes(cfg: ModelConfig, config: EngineConfig, dtype: torch.dtype) -> int:
    """Rough peak of one step's activations: a few hidden-sized buffers, the fused MLP input and
    output, q/k/v, plus fp32 logits for every sequence."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    per_token = 6 * cfg.hidden_size + 3 * cfg.intermediate_size + 2 * (cfg.q_size + 2 * cfg.kv_size)
    logits = config.max_num_seqs * cfg.vocab_size * 4
    return config.max_num_batched_tokens * per_token * itemsize + logits


def num_kv_blocks(
    config: EngineConfig,
    cfg: ModelConfig,
    block_size: int,
    max_model_len: int,
    device: torch.device,
    dtype: torch.dtype,
) -> int:
    """num_gpu_blocks_override, else what the memory budget allows, capped at what the engine
    could ever fill (max_num_seqs sequences of max_model_len tokens)."""
    if config.num_gpu_blocks_override is not None:
        return config.num_gpu_blocks_override
    per_block = bytes_per_block(cfg, block_size, dtype)
    if device.type == "cuda":
        budget = _cuda_kv_budget(config, cfg, device, dtype)
    else:
        budget = int((config.kv_cache_memory_gb or DEFAULT_CPU_KV_GB) * GIB)
    blocks = budget // per_block
    blocks_per_seq = -(-max_model_len // block_size)
    blocks = min(blocks, config.max_num_seqs * blocks_per_seq)
    if blocks < blocks_per_seq:
        raise EngineLiteError(
            f"the KV cache fits {blocks} blocks of {block_size} tokens, fewer than one "
            f"max_model_len={max_model_len} sequence needs ({blocks_per_seq}); raise "
            "gpu_memory_utilization / kv_cache_memory_gb or lower max_model_len"
        )
    return int(blocks)


def _cuda_kv_budget(
    config: EngineConfig, cfg: ModelConfig, device: torch.device, dtype: torch.dtype
) -> int:
    # vLLM's rule: gpu_memory_utilization * total covers weights + activations + KV. Called after
    # the weights are loaded, so memory_allocated() is the weights.
    free, total = torch.cuda.mem_get_info(device)
    weights = torch.cuda.memory_allocated(device)
    margin = activation_bytes(cfg, config, dtype) + CUDA_FIXED_MARGIN_BYTES
    budget = int(total * config.gpu_memory_utilization) - weights - margin
    # Other processes may hold memory too; never plan past what is actually free.
    return max(0, min(budget, free - margin))


def allocate_kv_cache(
    cfg: ModelConfig, num_blocks: int, block_size: int, device: torch.device, dtype: torch.dtype
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Zero-filled so padded reads of never-written slots stay finite (0 * NaN would be NaN)."""
    shape = (2, cfg.num_layers, num_blocks, block_size, cfg.num_kv_heads, cfg.head_dim)
    cache = torch.zeros(shape, dtype=dtype, device=device)
    return [(cache[0, layer], cache[1, layer]) for layer in range(cfg.num_layers)]
