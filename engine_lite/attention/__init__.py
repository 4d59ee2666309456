"""Attention backends: choose one for a device and build it."""

from __future__ import annotations

import torch

from engine_lite.attention.base import AttentionBackend, AttentionMetadata, StepBatch
from engine_lite.attention.flash import FLASH_BLOCK_MULTIPLE, FlashPagedAttention, load_flash_attn
from engine_lite.attention.torch_paged import TorchPagedAttention
from engine_lite.errors import EngineLiteError

TORCH_BLOCK_SIZE = 16

__all__ = [
    "AttentionBackend",
    "AttentionMetadata",
    "StepBatch",
    "create_backend",
    "default_block_size",
    "resolve_backend",
]


FLASH_DTYPES = (torch.bfloat16, torch.float16)
FLASH_MAX_HEAD_DIM = 256  # flash-attn 2's kernels: head dims up to 256, in multiples of 8


def flash_supports_head_dim(head_dim: int) -> bool:
    return head_dim <= FLASH_MAX_HEAD_DIM and head_dim % 8 == 0


def resolve_backend(requested: str, device: torch.device, dtype: torch.dtype, head_dim: int) -> str:
    """`auto` means flash-attn on CUDA in 16-bit for a head dim it has kernels for, when it
    imports; the PyTorch backend otherwise."""
    if requested == "auto":
        usable = device.type == "cuda" and dtype in FLASH_DTYPES
        usable = usable and flash_supports_head_dim(head_dim)
        return "flash" if usable and load_flash_attn() is not None else "torch"
    if requested == "flash" and device.type != "cuda":
        raise EngineLiteError(
            f"attention_backend='flash' needs a CUDA device but device is {device}; "
            "use attention_backend='torch' or 'auto'"
        )
    if requested == "flash" and dtype not in FLASH_DTYPES:
        raise EngineLiteError(
            f"attention_backend='flash' needs dtype bfloat16 or float16, not {dtype}; "
            "set dtype='bfloat16' or use attention_backend='torch'"
        )
    if requested == "flash" and not flash_supports_head_dim(head_dim):
        raise EngineLiteError(
            f"attention_backend='flash' has no kernels for this model's head_dim={head_dim} "
            f"(flash-attn needs a multiple of 8, at most {FLASH_MAX_HEAD_DIM}); "
            "use attention_backend='torch' or 'auto'"
        )
    return requested


def default_block_size(backend: str) -> int:
    return FLASH_BLOCK_MULTIPLE if backend == "flash" else TORCH_BLOCK_SIZE


def create_backend(
    backend: str,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    device: torch.device,
    sliding_window: int | None,
    dtype: torch.dtype,
) -> AttentionBackend:
    cls = FlashPagedAttention if backend == "flash" else TorchPagedAttention
    return cls(num_heads, num_kv_heads, head_dim, block_size, device, sliding_window, dtype)
