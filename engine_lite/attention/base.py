"""The attention backend interface and the packed-batch description every backend reads.

A step is one packed (varlen) batch: entry i contributes `query_lens[i]` consecutive tokens that
sit at positions `computed_lens[i] .. computed_lens[i] + query_lens[i] - 1` of its sequence, so
prefill chunks and decodes share one forward. Like nano-vllm's `Context`, the batch travels as one
object so model code never sees batching.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(slots=True)
class StepBatch:
    """Host-side (numpy) layout of one step, built by the runner."""

    query_lens: np.ndarray  # [B] int64: tokens each entry computes this step
    computed_lens: np.ndarray  # [B] int64: tokens whose KV was cached before this step
    block_tables: np.ndarray  # [B, max_blocks] int32: physical blocks, padded with 0
    slot_mapping: np.ndarray  # [T] int64: cache slot (block * block_size + offset) per token

    @property
    def num_entries(self) -> int:
        return len(self.query_lens)

    @property
    def num_tokens(self) -> int:
        return len(self.slot_mapping)

    @property
    def seq_lens(self) -> np.ndarray:
        """Context length of each entry once this step's tokens are cached (`seqused_k`)."""
        return self.computed_lens + self.query_lens

    @property
    def cu_seqlens_q(self) -> np.ndarray:
        return np.concatenate(([0], np.cumsum(self.query_lens)))


@dataclass(slots=True)
class AttentionMetadata:
    """Device tensors shared by every layer of one forward; backends subclass it."""

    slot_mapping: torch.Tensor  # [T] int64


@dataclass(slots=True)
class KVCacheSpec:
    """Shape of one layer's paged cache: [num_blocks, block_size, num_kv_heads, head_dim]."""

    num_blocks: int
    block_size: int
    num_kv_heads: int
    head_dim: int


class AttentionBackend(ABC):
    """Paged causal attention over a packed batch (mini-sglang's `prepare_metadata` / `forward`)."""

    name: str = ""

    def __init__(
        self,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        block_size: int,
        device: torch.device,
        sliding_window: int | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        self.num_heads = num_heads
        self.dtype = dtype
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.block_size = block_size
        self.device = device
        self.sliding_window = sliding_window
        self.scale = head_dim**-0.5

    @abstractmethod
    def prepare_metadata(self, batch: StepBatch) -> AttentionMetadata:
        """Everything the layers need, built once per step and reused by every layer."""

    @abstractmethod
    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        """Caches k/v at `meta.slot_mapping`, then attends.

        q: [T, num_heads, head_dim]; k, v: [T, num_kv_heads, head_dim]; returns q's shape.
        Query i of an entry whose chunk starts at position p sees keys 0 .. p + i (causal mask
        aligned bottom-right, as flash-attn's `causal=True`).
        """


def write_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Scatters this step's keys and values into their cache slots."""
    num_slots = k_cache.shape[0] * k_cache.shape[1]
    k_cache.view(num_slots, *k_cache.shape[2:]).index_copy_(0, slot_mapping, k)
    v_cache.view(num_slots, *v_cache.shape[2:]).index_copy_(0, slot_mapping, v)
