"""engine_lite against real vLLM 0.32 (CPU) on the same weights and the same 64 mixed requests.

Offline throughput, total (prompt + output) tokens per second, at several token budgets: the
`tiny` preset's seeded weights are exported as a Hugging Face folder, vLLM's `LLM` class runs it
in its own interpreter (prefix caching off), engine_lite's `LLM` runs the same folder here. Each
engine warms up, then runs the batch `--repeats` times; medians are compared. Both must produce
the same greedy tokens, which the script checks too.

    python benchmarks/engine_vs_vllm.py                  # budgets 256 and 2048, 3 repeats
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from engine_lite import LLM, SamplingParams
from engine_lite.bench import mixed_workload
from engine_lite.fidelity.compare import find_vllm_python, vllm_offline
from engine_lite.models.export import export_hf_folder

MAX_MODEL_LEN = 8192


def ours(folder: Path, prompts: list[list[int]], budget: int, out_len: int, repeats: int):
    llm = LLM(str(folder), device="cpu", max_model_len=MAX_MODEL_LEN, max_num_batched_tokens=budget,
              max_num_seqs=min(256, budget), kv_cache_memory_gb=2.0)  # fmt: skip
    params = SamplingParams(max_tokens=out_len, temperature=0.0, ignore_eos=True)
    llm.generate(prompts[:2], params)  # warm-up, as vLLM's side does
    seconds, outs = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        outs = llm.generate(prompts, params)
        seconds.append(time.perf_counter() - start)
    return [o.outputs[0].token_ids for o in outs], seconds


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budgets", default="256,2048", help="max_num_batched_tokens values")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--vllm-python", default=None, help="interpreter with vLLM installed")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    python = args.vllm_python or find_vllm_python()
    if python is None:
        print("error: vLLM is not installed; see docs/engine.md", file=sys.stderr)
        return 2
    reqs = mixed_workload(output_len=args.output_len)
    prompts = [r.prompt_token_ids for r in reqs]
    total = sum(len(p) for p in prompts) + args.output_len * len(prompts)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = export_hf_folder("tiny", Path(tmp) / "tiny")
        for budget in (int(b) for b in args.budgets.split(",")):
            job = {"model": str(folder), "prompts": prompts, "max_tokens": args.output_len,
                   "max_model_len": MAX_MODEL_LEN, "repeats": args.repeats,
                   "engine_args": {"max_num_batched_tokens": budget,
                                   "max_num_seqs": min(256, budget)}}  # fmt: skip
            theirs = vllm_offline(job, python)
            tokens, seconds = ours(folder, prompts, budget, args.output_len, args.repeats)
            vllm_tps = total / statistics.median(theirs["seconds"])
            ours_tps = total / statistics.median(seconds)
            rows.append({
                "max_num_batched_tokens": budget,
                "vllm_tokens_per_s": round(vllm_tps),
                "engine_lite_tokens_per_s": round(ours_tps),
                "ratio": round(ours_tps / vllm_tps, 3),
                "same_greedy_tokens": tokens == theirs["token_ids"],
                "vllm_seconds": theirs["seconds"],
                "engine_lite_seconds": seconds,
            })  # fmt: skip
    if args.json:
        print(json.dumps({"requests": len(prompts), "total_tokens": total, "rows": rows}))
        return 0
    print(f"{len(prompts)} requests, {total} tokens (prompt + output); medians of {args.repeats}")
    print(
        f"{'budget':>7} {'vLLM 0.32 tok/s':>16} {'engine_lite tok/s':>18} {'ratio':>6} same tokens"
    )
    for r in rows:
        print(
            f"{r['max_num_batched_tokens']:>7} {r['vllm_tokens_per_s']:>16} "
            f"{r['engine_lite_tokens_per_s']:>18} {r['ratio']:>6.2f} {r['same_greedy_tokens']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
