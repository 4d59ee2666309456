"""A prefill chunk after a cached prefix, attended in two parts against under one mask.

    python benchmarks/chunk_attention.py [--preset tiny] [--dtype bfloat16] [--repeats 15] [--json]

Times the real ModelRunner's step (metadata, forward, sampling) on steps a chunked prefill makes:
one chunk of n tokens at the end of a c-token context, beside 8 decodes of 512 tokens. Each shape
runs both ways in alternation, on the same runner and threads: the split path (`torch_paged`'s
`_attend_split`, the CPU default) and the explicit bottom-right mask it replaced. Prints the
median step time of each and their ratio.
"""

from __future__ import annotations

import os

# Before torch loads OpenMP: idle threads sleep instead of spinning (see engine_lite/bench.py).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine_lite import EngineConfig, SamplingParams
from engine_lite.request import Request
from engine_lite.runner import ModelRunner

GREEDY = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
# (chunk tokens, context after the chunk): the last chunk of a 4k prompt at budgets 256-2048,
# and the second half of an 8k one
SHAPES = [(256, 4096), (512, 4096), (1024, 4096), (2048, 4096), (4096, 8192)]
DECODES = 8


def step_batch(runner: ModelRunner, chunk: int, context: int) -> list[tuple[Request, int]]:
    """8 decodes at 512 tokens and one chunk ending a `context`-token prompt, disjoint blocks."""
    bs, next_block, batch = runner.block_size, 0, []
    for i, (length, n) in enumerate([(513, 1)] * DECODES + [(context, chunk)]):
        prompt = [(7 * i + 3 * t) % runner.vocab_size for t in range(length)]
        req = Request(f"r{i}", prompt, GREEDY, 0.0, num_computed_tokens=length - n)
        blocks = -(-length // bs)
        req.block_table = list(range(next_block, next_block + blocks))
        next_block += blocks
        batch.append((req, n))
    return batch


def measure(runner: ModelRunner, repeats: int) -> list[dict[str, float]]:
    rows = []
    for chunk, context in SHAPES:
        batch = step_batch(runner, chunk, context)
        times: dict[bool, list[float]] = {True: [], False: []}
        for split in (True, False):  # warm both paths
            runner.backend.split_chunks = split
            runner.execute(batch)
        for _ in range(repeats):
            for split in (True, False):
                runner.backend.split_chunks = split
                start = time.perf_counter()
                runner.execute(batch)
                times[split].append(time.perf_counter() - start)
        split_ms = statistics.median(times[True]) * 1e3
        masked_ms = statistics.median(times[False]) * 1e3
        rows.append(
            {
                "chunk": chunk,
                "context": context,
                "split_ms": split_ms,
                "masked_ms": masked_ms,
                "speedup": masked_ms / split_ms,
            }
        )
    runner.backend.split_chunks = True
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--cpu-threads", type=int, default=None, help="default: a serving engine's")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    runner = ModelRunner(
        EngineConfig(
            model=args.preset,
            device="cpu",
            dtype=args.dtype,
            max_model_len=8192,
            num_gpu_blocks_override=2048,
            cpu_threads=args.cpu_threads,
        )
    )
    if not runner.backend.split_chunks:
        raise SystemExit("this torch has no CPU flash kernel to split with; nothing to compare")
    rows = measure(runner, args.repeats)
    if args.json:
        info = {"preset": args.preset, "dtype": args.dtype, "cpu_threads": runner.cpu_threads}
        print(json.dumps({**info, "repeats": args.repeats, "steps": rows}, indent=2))
        return
    print(f"{args.preset} {args.dtype}, {runner.cpu_threads} thread(s), median of {args.repeats}")
    print(f"{'chunk @ context':>16} {'split ms':>9} {'masked ms':>10} {'speedup':>8}")
    for r in rows:
        shape = f"{r['chunk']} @ {r['context']}"
        print(f"{shape:>16} {r['split_ms']:9.1f} {r['masked_ms']:10.1f} {r['speedup']:7.2f}x")


if __name__ == "__main__":
    main()
