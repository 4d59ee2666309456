"""GPU check: flash-attn parity with the PyTorch backend, then `llama-3.1-8b` step times, as JSON.

    python benchmarks/gpu_check.py [--preset llama-3.1-8b] [--skip-bench] [--device cpu]

Needs CUDA (flash-attn optional: without it the parity section says so and timings use the
PyTorch backend). Runs in a few minutes on one H100/H200-class GPU:
1. parity: the flash backend's output on a mixed paged batch (decodes, a chunk mid-sequence,
   fresh prefills, with and without a sliding window) against the PyTorch backend;
2. the preset's step times with seeded random weights in bf16: a 4096-token prefill in one step,
   decode steps of 32 and 128 sequences with 512 tokens of context;
3. `engine-lite bench` on the preset: the mixed 64-request workload under the default step budget,
   2048 and 512 tokens, and `--decode-only 128`.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from step_times import measure

from engine_lite import EngineConfig
from engine_lite.attention import default_block_size, resolve_backend
from engine_lite.attention.base import StepBatch, write_kv
from engine_lite.attention.flash import FlashPagedAttention, load_flash_attn
from engine_lite.attention.torch_paged import TorchPagedAttention
from engine_lite.models import resolve_model
from engine_lite.runner import ModelRunner

ENTRIES = [(700, 1), (1000, 300), (0, 513), (5, 1), (0, 1), (256, 256), (2000, 1)]


def parity(window: int | None) -> dict:
    heads, kv_heads, head_dim, block = 32, 8, 128, 256
    dev, dtype = torch.device("cuda"), torch.bfloat16
    gen = torch.Generator(device=dev).manual_seed(0)
    rng = np.random.default_rng(0)
    num_blocks = sum(-(-(c + n) // block) for c, n in ENTRIES) + 2
    k_cache = torch.zeros(num_blocks, block, kv_heads, head_dim, dtype=dtype, device=dev)
    v_cache = torch.zeros_like(k_cache)
    free = list(rng.permutation(num_blocks))
    tables, slots, qs, ks, vs = [], [], [], [], []
    for computed, n in ENTRIES:
        total = computed + n
        table = [int(free.pop()) for _ in range(-(-total // block))]
        pos = np.arange(total)
        seq_slots = np.array(table)[pos // block] * block + pos % block
        keys = torch.randn(total, kv_heads, head_dim, generator=gen, device=dev, dtype=dtype)
        values = torch.randn(total, kv_heads, head_dim, generator=gen, device=dev, dtype=dtype)
        prefix = torch.from_numpy(seq_slots[:computed]).to(dev)
        write_kv(keys[:computed], values[:computed], k_cache, v_cache, prefix)
        tables.append(table)
        slots.append(seq_slots[computed:])
        qs.append(torch.randn(n, heads, head_dim, generator=gen, device=dev, dtype=dtype))
        ks.append(keys[computed:])
        vs.append(values[computed:])
    width = max(len(t) for t in tables)
    batch = StepBatch(
        query_lens=np.array([n for _, n in ENTRIES], dtype=np.int64),
        computed_lens=np.array([c for c, _ in ENTRIES], dtype=np.int64),
        block_tables=np.array([t + [0] * (width - len(t)) for t in tables], dtype=np.int32),
        slot_mapping=np.concatenate(slots).astype(np.int64),
    )
    q, k, v = torch.cat(qs), torch.cat(ks), torch.cat(vs)
    args = (heads, kv_heads, head_dim, block, dev, window, dtype)
    flash, ref = FlashPagedAttention(*args), TorchPagedAttention(*args)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    out = flash.forward(q, k, v, k_cache, v_cache, flash.prepare_metadata(batch)).float()
    expected = ref.forward(q, k, v, k_ref, v_ref, ref.prepare_metadata(batch)).float()
    err = (out - expected).abs().max().item()
    return {"window": window, "max_abs_err": round(err, 5), "ok": err < 2e-2}


def step_times(preset: str, device: str) -> dict:
    start = time.perf_counter()
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    # Blocks for 128 decodes of 512 tokens plus one 4096-token prefill, in the block size the
    # backend will use (16 for PyTorch, 256 for flash-attn): no more, an 8B KV cache is large.
    head_dim = resolve_model(preset).config.head_dim
    block = default_block_size(resolve_backend("auto", torch.device(device), dtype, head_dim))
    runner = ModelRunner(
        EngineConfig(
            model=preset,
            device=device,
            max_num_seqs=128,
            max_num_batched_tokens=4096,
            max_model_len=8192,
            block_size=block,
            num_gpu_blocks_override=128 * -(-512 // block) + -(-4096 // block) + 8,
        )
    )
    if device == "cuda":
        torch.cuda.synchronize()
    load_s = time.perf_counter() - start
    result = measure(runner, 4096, [32, 128], 512, repeats=5)
    return {
        "backend": runner.attention_backend,
        "dtype": str(runner.dtype),
        "load_s": round(load_s, 2),
        **result,
    }


def release_gpu_memory() -> None:
    # The next engine sizes its KV cache from free memory: hand the last one's back first.
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def bench(preset: str, device: str) -> dict:
    from engine_lite.bench import main as bench_main

    common = ["--preset", preset, "--device", device, "--json"]
    runs = {
        "mixed": common,
        # the same traffic under smaller step budgets: how far chunking caps the longest step
        "mixed_budget_2048": [*common, "--max-num-batched-tokens", "2048"],
        "mixed_budget_512": [*common, "--max-num-batched-tokens", "512"],
        "decode_only_128": [*common, "--decode-only", "128"],
    }
    out = {}
    for name, argv in runs.items():
        start = time.perf_counter()
        code = bench_main(argv)
        out[name] = {"exit_code": code, "seconds": round(time.perf_counter() - start, 1)}
        release_gpu_memory()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="llama-3.1-8b")
    ap.add_argument("--skip-bench", action="store_true")
    ap.add_argument(
        "--device",
        default="cuda",
        choices=["cuda", "cpu"],
        help="cpu only rehearses the script (use --preset tiny); figures need cuda",
    )
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print(json.dumps({"error": "CUDA is not available; --device cpu only rehearses"}))
        return 2
    name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    report: dict = {"device": name, "torch": torch.__version__}
    if args.device != "cuda":
        report["parity"] = "skipped: flash-attn runs on CUDA only"
    elif load_flash_attn() is None:
        report["parity"] = "skipped: flash-attn is not installed"
    else:
        report["parity"] = [parity(None), parity(300)]
    print(json.dumps(report), flush=True)
    report["step_times"] = step_times(args.preset, args.device)
    release_gpu_memory()
    print(json.dumps(report["step_times"]), flush=True)
    if not args.skip_bench:
        report["bench"] = bench(args.preset, args.device)  # bench prints its own JSON lines
    print(json.dumps(report))
    return 0 if all(p["ok"] for p in report.get("parity", []) if isinstance(p, dict)) else 1


if __name__ == "__main__":
    raise SystemExit(main())
