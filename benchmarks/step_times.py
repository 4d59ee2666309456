"""Step times of the real ModelRunner on a preset: one-step prefills and decode steps.

    python benchmarks/step_times.py --preset tiny --json

Reports the median of several repeats of: a 4096-token prefill in one step (logits for its last
token only), and decode steps of 32 and 128 requests with 512 tokens of context each. The ratio
prefill / decode says how much one unchunked long prompt stalls a batch of decodes.
"""

from __future__ import annotations

import os

# Before torch loads OpenMP: idle threads sleep instead of spinning (see engine_lite/bench.py).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import json
import statistics
import time

from engine_lite import EngineConfig, SamplingParams
from engine_lite.request import Request
from engine_lite.runner import ModelRunner

GREEDY = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)


def _requests(runner: ModelRunner, num: int, context: int, computed: int) -> list[Request]:
    """num requests of `context` tokens, the first `computed` already cached, disjoint blocks."""
    bs = runner.block_size
    per_req = -(-context // bs)
    if num * per_req > runner.num_kv_blocks:
        raise SystemExit(f"KV cache too small for {num} x {context} tokens")
    reqs = []
    for i in range(num):
        prompt = [(7 * i + 3 * t) % runner.vocab_size for t in range(context)]
        req = Request(str(i), prompt, GREEDY, 0.0, num_computed_tokens=computed)
        req.block_table = list(range(i * per_req, (i + 1) * per_req))
        reqs.append(req)
    return reqs


def time_step(runner: ModelRunner, batch: list[tuple[Request, int]], repeats: int) -> dict:
    runner.execute(batch)  # warm-up (allocator, kernels)
    walls, forwards = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        runner.execute(batch)
        walls.append(time.perf_counter() - start)
        forwards.append(runner.last_forward_duration_s)
    return {
        "step_ms": round(statistics.median(walls) * 1e3, 3),
        "forward_ms": round(statistics.median(forwards) * 1e3, 3),
    }


def measure(
    runner: ModelRunner, prefill_len: int, decode_sizes: list[int], context: int, repeats: int
) -> dict:
    out: dict = {}
    prefill = _requests(runner, 1, prefill_len, 0)
    out[f"prefill_{prefill_len}"] = time_step(runner, [(prefill[0], prefill_len)], repeats)
    for n in decode_sizes:
        reqs = _requests(runner, n, context, context - 1)
        out[f"decode_{n}x{context}"] = time_step(runner, [(r, 1) for r in reqs], repeats)
    base = out[f"decode_{decode_sizes[0]}x{context}"]["step_ms"]
    out["prefill_over_decode"] = round(out[f"prefill_{prefill_len}"]["step_ms"] / base, 2)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--prefill-len", type=int, default=4096)
    ap.add_argument("--decode-sizes", type=int, nargs="+", default=[32, 128])
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    need = max(args.decode_sizes) * args.context + args.prefill_len
    runner = ModelRunner(
        EngineConfig(
            model=args.preset,
            device=args.device,
            max_num_seqs=max(args.decode_sizes),
            max_num_batched_tokens=max(args.prefill_len, max(args.decode_sizes)),
            num_gpu_blocks_override=need // 16 + 64,
            block_size=None,
        )
    )
    result = {
        "preset": args.preset,
        "device": str(runner.device),
        **measure(runner, args.prefill_len, args.decode_sizes, args.context, args.repeats),
    }
    print(json.dumps(result, indent=None if args.json else 2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
