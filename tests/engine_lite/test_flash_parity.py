"""FlashAttention backend against the PyTorch backend on the same paged cache (CUDA + flash-attn
only; skipped elsewhere)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine_lite.attention.base import StepBatch, write_kv
from engine_lite.attention.flash import FlashPagedAttention, load_flash_attn
from engine_lite.attention.torch_paged import TorchPagedAttention

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or load_flash_attn() is None,
        reason="needs CUDA and flash-attn",
    ),
]

HEADS, KV_HEADS, HEAD_DIM, BLOCK = 8, 2, 128, 256
DTYPE = torch.bfloat16


def build_step(entries: list[tuple[int, int]]):
    """Random paged cache holding each entry's prefix, plus this step's q/k/v and layout."""
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    rng = np.random.default_rng(0)
    num_blocks = sum(-(-(c + n) // BLOCK) for c, n in entries) + 2
    k_cache = torch.zeros(num_blocks, BLOCK, KV_HEADS, HEAD_DIM, dtype=DTYPE, device=dev)
    v_cache = torch.zeros_like(k_cache)
    free = list(rng.permutation(num_blocks))
    tables, slots, qs, ks, vs = [], [], [], [], []
    for computed, n in entries:
        total = computed + n
        table = [int(free.pop()) for _ in range(-(-total // BLOCK))]
        pos = np.arange(total)
        seq_slots = np.array(table)[pos // BLOCK] * BLOCK + pos % BLOCK

        def rand(*shape: int) -> torch.Tensor:
            return torch.randn(*shape, generator=gen, device=dev, dtype=DTYPE)

        keys, values = rand(total, KV_HEADS, HEAD_DIM), rand(total, KV_HEADS, HEAD_DIM)
        prefix = torch.from_numpy(seq_slots[:computed]).to(dev)
        write_kv(keys[:computed], values[:computed], k_cache, v_cache, prefix)
        tables.append(table)
        slots.append(seq_slots[computed:])
        qs.append(rand(n, HEADS, HEAD_DIM))
        ks.append(keys[computed:])
        vs.append(values[computed:])
    width = max(len(t) for t in tables)
    batch = StepBatch(
        query_lens=np.array([n for _, n in entries], dtype=np.int64),
        computed_lens=np.array([c for c, _ in entries], dtype=np.int64),
        block_tables=np.array([t + [0] * (width - len(t)) for t in tables], dtype=np.int32),
        slot_mapping=np.concatenate(slots).astype(np.int64),
    )
    return batch, torch.cat(qs), torch.cat(ks), torch.cat(vs), k_cache, v_cache


@pytest.mark.parametrize("window", [None, 300])
def test_flash_matches_torch_backend(window: int | None) -> None:
    entries = [(700, 1), (1000, 300), (0, 513), (5, 1), (0, 1), (256, 256), (2000, 1)]
    batch, q, k, v, k_cache, v_cache = build_step(entries)
    args = (HEADS, KV_HEADS, HEAD_DIM, BLOCK, torch.device("cuda"), window, DTYPE)
    flash, ref = FlashPagedAttention(*args), TorchPagedAttention(*args)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    out = flash.forward(q, k, v, k_cache, v_cache, flash.prepare_metadata(batch))
    expected = ref.forward(q, k, v, k_ref, v_ref, ref.prepare_metadata(batch))
    torch.testing.assert_close(k_cache, k_ref)  # both wrote the same slots
    torch.testing.assert_close(out.float(), expected.float(), atol=2e-2, rtol=2e-2)


def test_flash_rejects_small_blocks() -> None:
    from engine_lite.errors import EngineLiteError

    with pytest.raises(EngineLiteError, match="multiple of 256"):
        FlashPagedAttention(HEADS, KV_HEADS, HEAD_DIM, 16, torch.device("cuda"))
