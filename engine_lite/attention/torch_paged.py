"""Paged attention in plain PyTorch (SDPA): the backend for CPUs and GPUs without flash-attn.

Single-token entries (decodes) of similar context length are attended together: their blocks are
gathered into one padded [rows, kv_heads, ctx, head_dim] tensor and one masked SDPA call serves
them all. Multi-token entries (prefill chunks) are attended one by one; a chunk that starts at
position 0 attends to its own fresh keys with `is_causal`.

A later chunk needs a bottom-right causal mask, because SDPA's `is_causal` aligns top-left. On a
CPU it is attended in two unmasked parts instead, merged by their log-sum-exps: the whole cached
prefix, and its own keys under `is_causal` (see `_attend_split`). A mask of [chunk, context] cost
about 9 ms to build for a 2048-token chunk at 4096 positions, and the masked kernel took 1.4x the
split's time (`benchmarks/chunk_attention.py`). Off a CPU, or where a sliding window cuts the
prefix, the chunk keeps the explicit mask.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from engine_lite.attention.base import AttentionBackend, AttentionMetadata, StepBatch, write_kv

# A decode group holds rows whose context is at least this fraction of the group's longest, so
# padding at most doubles the keys read.
_GROUP_MIN_FILL = 0.5


@dataclass(slots=True)
class DecodeGroup:
    """Single-token rows attended by one SDPA call over a padded gather of their blocks."""

    token_idx: torch.Tensor | None  # [R] rows of q, or None when the group is rows 0..R-1
    block_ids: torch.Tensor  # [R * blocks_per_row] physical blocks, row-major
    blocks_per_row: int
    ctx_len: int  # padded key length
    mask: torch.Tensor | None  # [R, 1, 1, ctx_len] additive (0 or -inf); None = all valid


@dataclass(slots=True)
class PrefillChunk:
    """A multi-token entry: rows start..end of the packed batch."""

    start: int
    end: int
    ctx_len: int
    block_ids: torch.Tensor | None  # None: the chunk is its whole context (use fresh k/v)
    mask: torch.Tensor | None  # [n, ctx_len] additive; None with block_ids None = plain causal
    split: bool = False  # attend the cached prefix and the chunk's own keys apart, then merge


@dataclass(slots=True)
class TorchAttentionMetadata(AttentionMetadata):
    decode_groups: list[DecodeGroup] = field(default_factory=list)
    prefill_chunks: list[PrefillChunk] = field(default_factory=list)


class TorchPagedAttention(AttentionBackend):
    """Reference-quality paged attention that is also fast enough to serve on a CPU."""

    name = "torch"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # The CPU flash kernel that SDPA runs, called directly for its log-sum-exp.
        self.flash_cpu = getattr(
            torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None
        )
        self.split_chunks = self.device.type == "cpu" and self.flash_cpu is not None

    def prepare_metadata(self, batch: StepBatch) -> TorchAttentionMetadata:
        slot_mapping = torch.from_numpy(batch.slot_mapping).to(self.device, non_blocking=True)
        meta = TorchAttentionMetadata(slot_mapping=slot_mapping)
        cu_q = batch.cu_seqlens_q
        seq_lens = batch.seq_lens
        is_decode = batch.query_lens == 1
        decode_entries = np.flatnonzero(is_decode)
        if len(decode_entries):
            meta.decode_groups = self._decode_groups(batch, decode_entries, cu_q, seq_lens)
        for i in np.flatnonzero(~is_decode):
            meta.prefill_chunks.append(self._prefill_chunk(batch, int(i), cu_q, seq_lens))
        return meta

    def _decode_groups(
        self, batch: StepBatch, entries: np.ndarray, cu_q: np.ndarray, seq_lens: np.ndarray
    ) -> list[DecodeGroup]:
        order = np.argsort(-seq_lens[entries], kind="stable")
        rows = entries[order]
        neg_lens = -seq_lens[rows]  # ascending
        groups = []
        begin = 0
        while begin < len(rows):
            # the group ends where a context drops below half of its longest (neg_lens[begin])
            limit = _GROUP_MIN_FILL * neg_lens[begin]
            end = int(np.searchsorted(neg_lens, limit, side="right"))
            groups.append(self._decode_group(batch, rows[begin:end], cu_q, seq_lens))
            begin = end
        return groups

    def _decode_group(
        self, batch: StepBatch, rows: np.ndarray, cu_q: np.ndarray, seq_lens: np.ndarray
    ) -> DecodeGroup:
        lens = seq_lens[rows]
        ctx_len = int(lens[0])  # rows come longest first
        blocks_per_row = -(-ctx_len // self.block_size)
        block_ids = batch.block_tables[rows, :blocks_per_row].reshape(-1).astype(np.int64)
        token_idx = cu_q[rows]
        is_identity = len(rows) == len(cu_q) - 1 and bool((token_idx == np.arange(len(rows))).all())
        mask = None
        if lens[-1] != ctx_len or self.sliding_window is not None:
            key_pos = np.arange(ctx_len)
            valid = key_pos[None, :] < lens[:, None]
            if self.sliding_window is not None:
                valid &= key_pos[None, :] >= (lens - self.sliding_window)[:, None]
            additive = np.where(valid, np.float32(0.0), np.float32("-inf"))[:, None, None, :]
            mask = torch.from_numpy(additive).to(self.device, self.dtype)
        return DecodeGroup(
            token_idx=None if is_identity else torch.from_numpy(token_idx).to(self.device),
            block_ids=torch.from_numpy(block_ids).to(self.device),
            blocks_per_row=blocks_per_row,
            ctx_len=ctx_len,
            mask=mask,
        )

    def _prefill_chunk(
        self, batch: StepBatch, i: int, cu_q: np.ndarray, seq_lens: np.ndarray
    ) -> PrefillChunk:
        start, end = int(cu_q[i]), int(cu_q[i + 1])
        n, ctx_len = end - start, int(seq_lens[i])
        window = self.sliding_window
        fresh = ctx_len == n
        if fresh and (window is None or window >= n):
            return PrefillChunk(start, end, ctx_len, block_ids=None, mask=None)
        if not fresh and (window is None or window >= ctx_len) and self.split_chunks:
            # Every query sees the whole prefix (a window this wide cuts nothing). Only the
            # prefix is read from the cache; the chunk's own keys are fresh.
            prefix_blocks = -(-(ctx_len - n) // self.block_size)
            ids = torch.from_numpy(batch.block_tables[i, :prefix_blocks].astype(np.int64))
            return PrefillChunk(start, end, ctx_len, ids.to(self.device), None, split=True)
        block_ids = None
        if not fresh:
            blocks = -(-ctx_len // self.block_size)
            block_ids = torch.from_numpy(batch.block_tables[i, :blocks].astype(np.int64))
            block_ids = block_ids.to(self.device)
        # Bottom-right alignment: query i (position ctx_len - n + i) sees keys up to that position.
        q_pos = torch.arange(ctx_len - n, ctx_len, device=self.device)[:, None]
        k_pos = torch.arange(ctx_len, device=self.device)[None, :]
        mask = k_pos <= q_pos
        if window is not None:
            mask &= k_pos > q_pos - window
        return PrefillChunk(start, end, ctx_len, block_ids=block_ids, mask=self._additive(mask))

    def _additive(self, allowed: torch.Tensor) -> torch.Tensor:
        # SDPA turns a boolean mask into an additive one on every call; doing it once per step
        # spares that work in every layer.
        mask = torch.zeros(allowed.shape, dtype=self.dtype, device=self.device)
        return mask.masked_fill_(~allowed, float("-inf"))

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        assert isinstance(meta, TorchAttentionMetadata)
        write_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        out = torch.empty_like(q)
        for group in meta.decode_groups:
            self._attend_decodes(q, k_cache, v_cache, group, out)
        for chunk in meta.prefill_chunks:
            self._attend_chunk(q, k, v, k_cache, v_cache, chunk, out)
        return out

    def _attend_decodes(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        g: DecodeGroup,
        out: torch.Tensor,
    ) -> None:
        rows = q if g.token_idx is None else q.index_select(0, g.token_idx)
        num_rows = rows.shape[0]
        # GQA without copying K/V: the query heads sharing a KV head become query rows of it.
        qg = rows.reshape(num_rows, self.num_kv_heads, -1, self.head_dim)
        keys = self._gather(k_cache, g, num_rows)
        values = self._gather(v_cache, g, num_rows)
        o = F.scaled_dot_product_attention(qg, keys, values, attn_mask=g.mask, scale=self.scale)
        o = o.reshape(num_rows, self.num_heads, self.head_dim)
        if g.token_idx is None:
            out.copy_(o)
        else:
            out.index_copy_(0, g.token_idx, o)

    def _gather(self, cache: torch.Tensor, g: DecodeGroup, num_rows: int) -> torch.Tensor:
        """[rows, kv_heads, ctx_len, head_dim] view of each row's blocks, padded to ctx_len."""
        blocks = cache.index_select(0, g.block_ids)
        flat = blocks.view(num_rows, g.blocks_per_row * self.block_size, *cache.shape[2:])
        return flat[:, : g.ctx_len].transpose(1, 2)

    def _attend_chunk(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        c: PrefillChunk,
        out: torch.Tensor,
    ) -> None:
        if c.split:
            self._attend_split(q, k, v, k_cache, v_cache, c, out)
            return
        if c.block_ids is None:
            keys, values = k[c.start : c.end], v[c.start : c.end]
        else:
            keys = k_cache.index_select(0, c.block_ids).flatten(0, 1)[: c.ctx_len]
            values = v_cache.index_select(0, c.block_ids).flatten(0, 1)[: c.ctx_len]
        o = F.scaled_dot_product_attention(
            q[c.start : c.end].transpose(0, 1).unsqueeze(0),
            keys.transpose(0, 1).unsqueeze(0),
            values.transpose(0, 1).unsqueeze(0),
            attn_mask=c.mask,
            is_causal=c.mask is None,
            scale=self.scale,
            enable_gqa=True,
        )
        out[c.start : c.end] = o.squeeze(0).transpose(0, 1)

    def _attend_split(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        c: PrefillChunk,
        out: torch.Tensor,
    ) -> None:
        """A chunk after a cached prefix: every query sees the whole prefix and, causally, the
        chunk's own keys. Each part is one unmasked flash call; softmax over their union is the
        two outputs weighed by their log-sum-exps."""
        assert c.block_ids is not None and self.flash_cpu is not None
        n, prefix = c.end - c.start, c.ctx_len - (c.end - c.start)
        group = self.num_heads // self.num_kv_heads
        qc = q[c.start : c.end]  # [n, heads, dim]
        # The prefix needs no mask, so the query heads sharing a KV head can be rows of it
        # (GQA without repeating the cached keys): [1, kv_heads, group * n, dim].
        qg = qc.view(n, self.num_kv_heads, group, self.head_dim).permute(1, 2, 0, 3)
        qg = qg.reshape(1, self.num_kv_heads, group * n, self.head_dim)
        keys = k_cache.index_select(0, c.block_ids).flatten(0, 1)[:prefix]
        values = v_cache.index_select(0, c.block_ids).flatten(0, 1)[:prefix]
        o_pre, lse_pre = self.flash_cpu(
            qg,
            keys.transpose(0, 1).unsqueeze(0),
            values.transpose(0, 1).unsqueeze(0),
            scale=self.scale,
        )
        o_pre = o_pre.view(self.num_kv_heads, group, n, self.head_dim).permute(2, 0, 1, 3)
        lse_pre = lse_pre.view(self.num_kv_heads, group, n).permute(2, 0, 1)
        own_k = k[c.start : c.end].repeat_interleave(group, dim=1)
        own_v = v[c.start : c.end].repeat_interleave(group, dim=1)
        o_own, lse_own = self.flash_cpu(
            qc.transpose(0, 1).unsqueeze(0),
            own_k.transpose(0, 1).unsqueeze(0),
            own_v.transpose(0, 1).unsqueeze(0),
            is_causal=True,
            scale=self.scale,
        )
        o_own = o_own.squeeze(0).transpose(0, 1)  # [n, heads, dim]
        lse_own = lse_own.squeeze(0).transpose(0, 1)  # [n, heads]
        # weight of the prefix part: e^lse_pre / (e^lse_pre + e^lse_own)
        w_pre = torch.sigmoid(lse_pre.reshape(n, self.num_heads) - lse_own).unsqueeze(-1)
        o_pre = o_pre.reshape(n, self.num_heads, self.head_dim)
        out[c.start : c.end] = torch.lerp(o_own.float(), o_pre.float(), w_pre)
