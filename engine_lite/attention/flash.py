"""FlashAttention-2 paged varlen backend: one kernel call per layer for the whole mixed batch.

Written against flash-attn's documented `flash_attn_varlen_func` (2.6+): with `block_table`, k and
v are the paged caches [num_blocks, page_block_size, kv_heads, head_dim] with page_block_size a
multiple of 256, `cu_seqlens_k` holds each sequence's cached length, and `causal=True` aligns the
mask bottom-right, which is exactly chunked prefill's mask (nano-vllm calls it the same way).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from engine_lite.attention.base import AttentionBackend, AttentionMetadata, StepBatch, write_kv
from engine_lite.errors import EngineLiteError

FLASH_BLOCK_MULTIPLE = 256


def load_flash_attn() -> Any | None:
    """`flash_attn_varlen_func`, or None when flash-attn is not installed or cannot load."""
    try:
        from flash_attn import flash_attn_varlen_func
    except Exception:  # ImportError, or an OSError/RuntimeError from a mismatched CUDA build
        return None
    return flash_attn_varlen_func


@dataclass(slots=True)
class FlashAttentionMetadata(AttentionMetadata):
    cu_seqlens_q: torch.Tensor  # [B + 1] int32
    cu_seqlens_k: torch.Tensor  # [B + 1] int32
    max_seqlen_q: int
    max_seqlen_k: int
    block_tables: torch.Tensor  # [B, max_blocks] int32


class FlashPagedAttention(AttentionBackend):
    """Paged attention through flash-attn's varlen kernel (CUDA only)."""

    name = "flash"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.block_size % FLASH_BLOCK_MULTIPLE:
            raise EngineLiteError(
                f"block_size={self.block_size} does not suit flash-attn's paged KV cache; use a "
                f"multiple of {FLASH_BLOCK_MULTIPLE} (or attention_backend='torch')"
            )
        fn = load_flash_attn()
        if fn is None:
            raise EngineLiteError(
                "attention_backend='flash' needs flash-attn; install it with "
                "`pip install -e .[gpu]` or use attention_backend='torch'"
            )
        self._varlen = fn
        # flash-attn's window is (left, right) keys around the diagonal, the diagonal included;
        # Hugging Face's sliding window of W keeps W keys, the query's own included.
        window = self.sliding_window
        self._window = (window - 1, 0) if window is not None else (-1, -1)

    def prepare_metadata(self, batch: StepBatch) -> FlashAttentionMetadata:
        seq_lens = batch.seq_lens
        cu_k = np.concatenate(([0], np.cumsum(seq_lens)))

        def to_device(a: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(np.ascontiguousarray(a)).to(self.device, non_blocking=True)

        return FlashAttentionMetadata(
            slot_mapping=to_device(batch.slot_mapping),
            cu_seqlens_q=to_device(batch.cu_seqlens_q.astype(np.int32)),
            cu_seqlens_k=to_device(cu_k.astype(np.int32)),
            max_seqlen_q=int(batch.query_lens.max()),
            max_seqlen_k=int(seq_lens.max()),
            block_tables=to_device(batch.block_tables.astype(np.int32)),
        )

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        assert isinstance(meta, FlashAttentionMetadata)
        write_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        return self._varlen(
            q,
            k_cache,
            v_cache,
            cu_seqlens_q=meta.cu_seqlens_q,
            cu_seqlens_k=meta.cu_seqlens_k,
            max_seqlen_q=meta.max_seqlen_q,
            max_seqlen_k=meta.max_seqlen_k,
            softmax_scale=self.scale,
            causal=True,
            window_size=self._window,
            block_table=meta.block_tables,
        )
