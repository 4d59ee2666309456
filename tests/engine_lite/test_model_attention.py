"""Paged attention against plain full attention on random data: chunks mid-sequence, decodes of
different lengths, fresh prefills and 1-token prompts, all packed into one batch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine_lite.attention.base import StepBatch, write_kv
from engine_lite.attention.torch_paged import TorchPagedAttention

HEADS, KV_HEADS, HEAD_DIM = 4, 2, 16


def reference_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, first_pos: int, window: int | None
) -> torch.Tensor:
    """Full attention in float64; query i sits at absolute position first_pos + i."""
    group = HEADS // KV_HEADS
    k = keys.double().repeat_interleave(group, dim=1)
    v = values.double().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.double(), k) * HEAD_DIM**-0.5
    q_pos = torch.arange(first_pos, first_pos + q.shape[0])[:, None]
    k_pos = torch.arange(keys.shape[0])[None, :]
    allowed = k_pos <= q_pos
    if window is not None:
        allowed &= k_pos > q_pos - window
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).float()


def run_case(
    entries: list[tuple[int, int]],
    block_size: int,
    window: int | None = None,
    seed: int = 0,
    split: bool = True,
) -> None:
    """entries: (tokens already cached, tokens this step) per sequence, in batch order.

    split=False attends a chunk after a cached prefix under its explicit mask, the path a GPU
    and a sliding window take, instead of in two parts."""
    gen = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    num_blocks = sum(-(-(c + n) // block_size) for c, n in entries) + 3
    k_cache = torch.zeros(num_blocks, block_size, KV_HEADS, HEAD_DIM)
    v_cache = torch.zeros_like(k_cache)
    free = list(rng.permutation(num_blocks))  # scattered physical blocks, like a used cache
    backend = TorchPagedAttention(
        HEADS, KV_HEADS, HEAD_DIM, block_size, torch.device("cpu"), sliding_window=window
    )
    assert backend.split_chunks, "this torch lacks the CPU flash kernel the split path calls"
    backend.split_chunks = split
    tables, seqs, slots = [], [], []
    for computed, n in entries:
        total = computed + n
        table = [int(free.pop()) for _ in range(-(-total // block_size))]
        keys = torch.randn(total, KV_HEADS, HEAD_DIM, generator=gen)
        values = torch.randn(total, KV_HEADS, HEAD_DIM, generator=gen)
        pos = np.arange(total)
        seq_slots = np.array(table)[pos // block_size] * block_size + pos % block_size
        prefix = torch.from_numpy(seq_slots[:computed])
        write_kv(keys[:computed], values[:computed], k_cache, v_cache, prefix)
        tables.append(table)
        seqs.append((keys, values, torch.randn(n, HEADS, HEAD_DIM, generator=gen)))
        slots.append(seq_slots[computed:])
    width = max(len(t) for t in tables)
    batch = StepBatch(
        query_lens=np.array([n for _, n in entries], dtype=np.int64),
        computed_lens=np.array([c for c, _ in entries], dtype=np.int64),
        block_tables=np.array([t + [0] * (width - len(t)) for t in tables], dtype=np.int32),
        slot_mapping=np.concatenate(slots).astype(np.int64),
    )
    q = torch.cat([s[2] for s in seqs])
    k = torch.cat([s[0][c:] for s, (c, _) in zip(seqs, entries, strict=True)])
    v = torch.cat([s[1][c:] for s, (c, _) in zip(seqs, entries, strict=True)])
    out = backend.forward(q, k, v, k_cache, v_cache, backend.prepare_metadata(batch))
    row = 0
    for (computed, n), (keys, values, q_seq) in zip(entries, seqs, strict=True):
        expected = reference_attention(q_seq, keys, values, computed, window)
        torch.testing.assert_close(out[row : row + n], expected, atol=1e-5, rtol=1e-4)
        row += n


@pytest.mark.parametrize("split", [True, False], ids=["split", "masked"])
@pytest.mark.parametrize("block_size", [16, 4])
def test_mixed_batch_matches_full_attention(block_size: int, split: bool) -> None:
    # decodes of very different contexts (several decode groups, out of order), a chunk in the
    # middle of its sequence, a fresh prefill, a final chunk and a 1-token prompt
    entries = [(40, 1), (100, 33), (3, 1), (0, 29), (511, 1), (60, 1), (0, 1), (17, 5), (64, 1)]
    run_case(entries, block_size, split=split)


@pytest.mark.parametrize("split", [True, False], ids=["split", "masked"])
def test_chunk_mid_sequence_uses_bottom_right_causal_mask(split: bool) -> None:
    # SDPA's is_causal would let query 0 of this chunk see only key 0; it must see keys 0..50.
    run_case([(50, 20)], block_size=16, split=split)


@pytest.mark.parametrize("prefix", [1, 7, 300])
def test_chunk_after_a_prefix_of_any_length(prefix: int) -> None:
    # a one-token prefix, one inside the first block, and a long one; one row and longer chunks
    run_case([(prefix, 1), (prefix, 9), (prefix, 64)], block_size=8)


def test_split_chunk_in_bfloat16_matches_the_masked_path() -> None:
    gen = torch.Generator().manual_seed(3)
    block, cached, n = 16, 200, 48
    blocks = -(-(cached + n) // block)
    k_cache = torch.randn(blocks, block, KV_HEADS, HEAD_DIM, generator=gen).bfloat16()
    v_cache = torch.randn(blocks, block, KV_HEADS, HEAD_DIM, generator=gen).bfloat16()
    q = torch.randn(n, HEADS, HEAD_DIM, generator=gen).bfloat16()
    pos = np.arange(cached, cached + n)
    k = k_cache.flatten(0, 1)[pos].clone()  # the chunk's own keys, already in their slots
    v = v_cache.flatten(0, 1)[pos].clone()
    batch = StepBatch(
        query_lens=np.array([n]),
        computed_lens=np.array([cached]),
        block_tables=np.arange(blocks, dtype=np.int32)[None],
        slot_mapping=pos.astype(np.int64),
    )
    outs = []
    for split in (True, False):
        backend = TorchPagedAttention(
            HEADS, KV_HEADS, HEAD_DIM, block, torch.device("cpu"), dtype=torch.bfloat16
        )
        backend.split_chunks = split
        meta = backend.prepare_metadata(batch)
        assert [c.split for c in meta.prefill_chunks] == [split]
        outs.append(backend.forward(q, k, v, k_cache, v_cache, meta))
    assert outs[0].dtype == torch.bfloat16
    torch.testing.assert_close(outs[0].float(), outs[1].float(), atol=2e-2, rtol=2e-2)


def test_pure_decode_batch_of_equal_lengths() -> None:
    run_case([(77, 1)] * 8, block_size=16)


def test_chunks_that_split_a_block() -> None:
    # chunk boundaries fall inside blocks: 13 cached, 10 new, block size 8
    run_case([(13, 10), (5, 3), (8, 8)], block_size=8)


@pytest.mark.parametrize("split", [True, False], ids=["split", "masked"])
def test_sliding_window_limits_keys(split: bool) -> None:
    # (5, 3) ends inside the window, so the split path may take it; (25, 12) may not
    entries = [(30, 1), (0, 40), (25, 12), (6, 1), (5, 3)]
    run_case(entries, block_size=8, window=16, split=split)


def test_kv_written_to_its_slots() -> None:
    k_cache = torch.zeros(4, 2, KV_HEADS, HEAD_DIM)
    v_cache = torch.zeros_like(k_cache)
    k = torch.randn(3, KV_HEADS, HEAD_DIM)
    v = torch.randn(3, KV_HEADS, HEAD_DIM)
    write_kv(k, v, k_cache, v_cache, torch.tensor([7, 0, 3]))
    torch.testing.assert_close(k_cache[3, 1], k[0])
    torch.testing.assert_close(v_cache[0, 0], v[1])
    torch.testing.assert_close(k_cache[1, 1], k[2])
    assert k_cache[2].abs().sum() == 0
