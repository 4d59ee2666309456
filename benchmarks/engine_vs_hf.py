"""Our engine against Hugging Face transformers' continuous batching, same weights and requests.

    .venv/bin/python benchmarks/engine_vs_hf.py [--preset tiny] [--budgets 256 1024 4096]
        [--repeats 3] [--json]

Builds a transformers LlamaForCausalLM with the preset's shape (seeded random weights), saves it,
and loads that folder into our engine, so both run identical weights. The workload is
`engine-lite bench`'s (64 requests: 56 prompts of 64-256 tokens, 8 of 2048-4096, 32 output
tokens each). For every token budget both engines run the whole batch `--repeats` times,
alternating so machine noise hits both alike; medians and the ratio ours / HF are printed.
HF gets `max_batch_tokens` = the budget through `ContinuousBatchingConfig` (transformers >= 5.17)
and `eos_token_id=-1` so every request makes exactly 32 tokens; ours uses ignore_eos.
"""

from __future__ import annotations

import os

# Before torch loads OpenMP: idle threads sleep instead of spinning (see engine_lite/bench.py).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import json
import logging
import statistics
import tempfile
import time
from pathlib import Path

import torch

from engine_lite.bench import BenchRequest, mixed_workload, run_engine, summarize
from engine_lite.config import EngineConfig
from engine_lite.engine import LLMEngine
from engine_lite.models import PRESETS, ModelConfig

HF_PAGE_SIZE = 256


def save_hf_model(cfg: ModelConfig, folder: Path, seed: int) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    hf_cfg = LlamaConfig(
        hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_layers,
        intermediate_size=cfg.intermediate_size,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim,
        vocab_size=cfg.vocab_size,
        max_position_embeddings=cfg.max_position_embeddings,
        rms_norm_eps=cfg.rms_norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
        tie_word_embeddings=cfg.tie_word_embeddings,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    model = LlamaForCausalLM(hf_cfg).eval()
    model.save_pretrained(folder)
    return model


def run_hf(model: torch.nn.Module, workload: list[BenchRequest], budget: int) -> dict:
    from transformers import ContinuousBatchingConfig, GenerationConfig

    output_len = workload[0].output_len
    num_blocks = sum(-(-(len(r.prompt_token_ids) + output_len) // HF_PAGE_SIZE) for r in workload)
    gen_cfg = GenerationConfig(
        max_new_tokens=output_len, do_sample=False, eos_token_id=-1, pad_token_id=0
    )
    cb_cfg = ContinuousBatchingConfig(
        num_blocks=num_blocks + 16, page_size=HF_PAGE_SIZE, max_batch_tokens=budget
    )
    inputs = [r.prompt_token_ids for r in workload]
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate_batch(  # type: ignore[operator]
            inputs, generation_config=gen_cfg, continuous_batching_config=cb_cfg
        )
    wall_s = time.perf_counter() - start
    tokens = sum(len(r.prompt_token_ids) + output_len for r in workload)
    generated = sum(len(o.generated_tokens) for o in out.values())
    assert generated == output_len * len(workload), f"HF made {generated} tokens"
    return {"wall_s": wall_s, "total_tokens_per_s": tokens / wall_s}


def compare(args: argparse.Namespace) -> dict:
    cfg = PRESETS[args.preset]
    workload = mixed_workload(vocab_size=cfg.vocab_size, seed=args.seed)
    results: dict = {
        "preset": args.preset,
        "repeats": args.repeats,
        "threads": torch.get_num_threads(),
        "budgets": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        hf_model = save_hf_model(cfg, Path(tmp), args.seed)
        run_hf(hf_model, workload[:4], 256)  # warm-up
        for budget in args.budgets:
            engine = LLMEngine(
                EngineConfig(model=tmp, max_num_batched_tokens=budget, max_num_seqs=256)
            )
            run_engine(engine, workload[:4])  # warm-up
            hf_tps, ours_tps, overhead = [], [], []
            for _ in range(args.repeats):
                hf_tps.append(run_hf(hf_model, workload, budget)["total_tokens_per_s"])
                ours = summarize(engine, workload, run_engine(engine, workload), "mixed")
                ours_tps.append(ours.total_tokens_per_s)
                overhead.append(ours.sched_overhead_frac)
            hf_med, ours_med = statistics.median(hf_tps), statistics.median(ours_tps)
            results["budgets"][budget] = {
                "hf_total_tokens_per_s": round(hf_med, 1),
                "ours_total_tokens_per_s": round(ours_med, 1),
                "ratio": round(ours_med / hf_med, 2),
                "ours_sched_overhead_frac": round(statistics.median(overhead), 4),
                "hf_runs": [round(x, 1) for x in hf_tps],
                "ours_runs": [round(x, 1) for x in ours_tps],
            }
            if not args.json:
                print(budget, json.dumps(results["budgets"][budget]), flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="tiny", choices=["tiny", "small"])
    ap.add_argument("--budgets", type=int, nargs="+", default=[256, 1024, 4096])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch's)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    for name in ("transformers", "ContinuousBatchingLogger"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    results = compare(args)
    print(json.dumps(results, indent=None if args.json else 2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
