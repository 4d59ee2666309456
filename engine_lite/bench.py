"""`engine-lite bench`: offline throughput and scheduling overhead of the engine on a fixed batch.

Default workload (the peer comparison's): 64 requests, 56 short prompts of 64-256 tokens and 8
long ones of 2048-4096, 32 output tokens each, seeded, all submitted at once. `--decode-only N`
instead runs N concurrent requests and reports only their pure-decode steps.
"""

from __future__ import annotations

import os

# Before torch loads OpenMP: idle threads sleep instead of spinning. On a machine shared with
# other work, spinning workers stall every parallel region (a 2-core box ran 6x slower).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import json
import random
import sys
import time
from dataclasses import asdict, dataclass

from engine_lite.config import EngineConfig
from engine_lite.errors import EngineLiteError
from engine_lite.outputs import StepStats
from engine_lite.sampling_params import SamplingParams


@dataclass(frozen=True, slots=True)
class BenchRequest:
    prompt_token_ids: list[int]
    output_len: int


@dataclass(slots=True)
class BenchResult:
    """One run's numbers; `sched_overhead_frac` = step wall time outside the forward / step time."""

    preset: str
    device: str
    dtype: str
    attention_backend: str
    max_num_batched_tokens: int
    num_requests: int
    num_prompt_tokens: int
    num_output_tokens: int
    steps: int
    wall_s: float
    output_tokens_per_s: float
    total_tokens_per_s: float
    sched_overhead_frac: float
    mean_step_ms: float
    max_step_ms: float
    num_preemptions: int
    mode: str
    threads: int


def mixed_workload(
    num_requests: int = 64,
    num_long: int = 8,
    short_len: tuple[int, int] = (64, 256),
    long_len: tuple[int, int] = (2048, 4096),
    output_len: int = 32,
    vocab_size: int = 4096,
    seed: int = 0,
) -> list[BenchRequest]:
    """Seeded prompts of uniform random lengths, long ones shuffled among the short."""
    rng = random.Random(seed)
    lengths = [rng.randint(*long_len) for _ in range(num_long)]
    lengths += [rng.randint(*short_len) for _ in range(num_requests - num_long)]
    rng.shuffle(lengths)
    return [
        BenchRequest([rng.randrange(vocab_size) for _ in range(n)], output_len) for n in lengths
    ]


def decode_workload(
    num_requests: int, prompt_len: int, output_len: int, vocab_size: int, seed: int = 0
) -> list[BenchRequest]:
    rng = random.Random(seed)
    return [
        BenchRequest([rng.randrange(vocab_size) for _ in range(prompt_len)], output_len)
        for _ in range(num_requests)
    ]


def run_engine(engine: object, workload: list[BenchRequest], decode_only: bool = False) -> dict:
    """Submits everything at once and steps to completion; returns raw totals."""
    from engine_lite.engine import LLMEngine

    assert isinstance(engine, LLMEngine)
    for req in workload:
        params = SamplingParams(max_tokens=req.output_len, temperature=0.0, ignore_eos=True)
        engine.add_request(req.prompt_token_ids, params)
    stats: list[StepStats] = []
    preempted_before = engine.stats().num_preemptions_total
    start = time.perf_counter()
    while engine.has_unfinished():
        stats.append(engine.step().stats)
    wall_s = time.perf_counter() - start
    if decode_only:
        # Only steps where every running request decodes: the regime the overhead target is about.
        stats = [s for s in stats if s.num_prefill_tokens == 0 and s.num_decode_tokens > 0]
        wall_s = sum(s.step_duration_s for s in stats)
    return {
        "stats": stats,
        "wall_s": wall_s,
        "num_preemptions": engine.stats().num_preemptions_total - preempted_before,
    }


def summarize(engine: object, workload: list[BenchRequest], run: dict, mode: str) -> BenchResult:
    from engine_lite.engine import LLMEngine

    assert isinstance(engine, LLMEngine)
    stats: list[StepStats] = run["stats"]
    wall_s = run["wall_s"]
    step_total = sum(s.step_duration_s for s in stats) or 1e-12
    outside = sum(s.sched_overhead_s for s in stats)
    if mode == "decode_only":
        prompt_tokens, output_tokens = 0, sum(s.num_decode_tokens for s in stats)
    else:
        prompt_tokens = sum(len(r.prompt_token_ids) for r in workload)
        output_tokens = sum(r.output_len for r in workload)
    runner = engine.runner
    cfg = engine.config
    return BenchResult(
        preset=cfg.model,
        device=str(getattr(runner, "device", "?")),
        dtype=str(getattr(runner, "dtype", "?")).replace("torch.", ""),
        attention_backend=str(getattr(runner, "attention_backend", "?")),
        max_num_batched_tokens=cfg.max_num_batched_tokens,
        num_requests=len(workload),
        num_prompt_tokens=prompt_tokens,
        num_output_tokens=output_tokens,
        steps=len(stats),
        wall_s=round(wall_s, 4),
        output_tokens_per_s=round(output_tokens / wall_s, 1),
        total_tokens_per_s=round((prompt_tokens + output_tokens) / wall_s, 1),
        sched_overhead_frac=round(outside / step_total, 4),
        mean_step_ms=round(step_total / max(len(stats), 1) * 1e3, 3),
        max_step_ms=round(max((s.step_duration_s for s in stats), default=0.0) * 1e3, 3),
        num_preemptions=run["num_preemptions"],
        mode=mode,
        threads=_torch_threads(),
    )


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="engine-lite bench", description=__doc__.splitlines()[0])
    ap.add_argument(
        "--preset",
        "--model",
        dest="model",
        default="tiny",
        help="preset name or local Hugging Face folder (default tiny)",
    )
    ap.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=None,
        help="token budget (default: vLLM's offline default for the device, 4096 on CPU)",
    )
    ap.add_argument(
        "--max-num-seqs", type=int, default=None, help="default: vLLM's offline default"
    )
    ap.add_argument("--long-prefill-token-threshold", type=int, default=0)
    ap.add_argument("--long-prefill-token-threshold-adaptive", action="store_true")
    ap.add_argument(
        "--policy",
        default="decode_first",
        choices=["decode_first", "prefill_first"],
        help="engine_lite extension; decode_first is vLLM's order",
    )
    ap.add_argument("--num-requests", type=int, default=64)
    ap.add_argument("--num-long", type=int, default=8, help="long prompts among --num-requests")
    ap.add_argument("--short-len", type=int, nargs=2, default=[64, 256], metavar=("MIN", "MAX"))
    ap.add_argument("--long-len", type=int, nargs=2, default=[2048, 4096], metavar=("MIN", "MAX"))
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument(
        "--decode-only",
        type=int,
        default=0,
        metavar="N",
        help="N concurrent decodes (prompt --prompt-len); report decode steps only",
    )
    ap.add_argument("--prompt-len", type=int, default=512, help="prompt length for --decode-only")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--attention-backend", default="auto")
    ap.add_argument("--num-gpu-blocks-override", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch's)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    return ap.parse_args(argv)


def build_engine(args: argparse.Namespace) -> object:
    from engine_lite.defaults import UsageContext
    from engine_lite.engine import LLMEngine

    seqs = args.max_num_seqs
    if args.decode_only:  # all N decodes must run at once
        seqs = max(seqs or 0, args.decode_only)
    config = EngineConfig(
        model=args.model,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_num_seqs=seqs,
        long_prefill_token_threshold=args.long_prefill_token_threshold,
        long_prefill_token_threshold_adaptive=args.long_prefill_token_threshold_adaptive,
        policy=args.policy,
        device=args.device,
        dtype=args.dtype,
        attention_backend=args.attention_backend,
        num_gpu_blocks_override=args.num_gpu_blocks_override,
        seed=args.seed,
    )
    # Like `vllm bench throughput`, an offline run: vLLM's offline defaults apply.
    return LLMEngine(config, usage=UsageContext.OFFLINE)


def bench(args: argparse.Namespace) -> BenchResult:
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    engine = build_engine(args)
    vocab = engine.vocab_size  # type: ignore[attr-defined]
    # Warm-up: first-call costs (allocator growth, kernel selection) are not throughput.
    run_engine(engine, decode_workload(2, 16, 2, vocab, seed=args.seed + 1))
    if args.decode_only:
        workload = decode_workload(
            args.decode_only, args.prompt_len, args.output_len, vocab, args.seed
        )
        return summarize(engine, workload, run_engine(engine, workload, True), "decode_only")
    workload = mixed_workload(
        args.num_requests,
        args.num_long,
        tuple(args.short_len),
        tuple(args.long_len),
        args.output_len,
        vocab,
        args.seed,
    )
    return summarize(engine, workload, run_engine(engine, workload), "mixed")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if args.num_long > args.num_requests:
            raise EngineLiteError(
                f"--num-long={args.num_long} exceeds --num-requests={args.num_requests}; "
                "use at most --num-requests long prompts"
            )
        result = bench(args)
    except EngineLiteError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(asdict(result)))
    else:
        for key, value in asdict(result).items():
            print(f"{key:>24}: {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
