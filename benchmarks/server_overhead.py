"""Per-token cost of HTTP/SSE over the in-process path, and a 256-stream burst.

Runs `engine-lite serve` as a child process and an `AsyncEngine` with the same config in this
process, replays the same workload against both with loadgen (`HttpTarget` vs
`InProcessTarget`, alternating, several rounds) and prints:

- ITL p50 via the server, ITL p50 in-process, and their difference: the per-token overhead of
  HTTP + SSE + client parsing (target <= 1 ms), per concurrency level;
- extra CPU per token of the HTTP path (server process + client, minus the in-process run),
  which a shared 2-core machine disturbs far less than latency;
- a burst of 256 concurrent streaming requests: errors (target 0), wall time.

ITL is `vllm bench serve`'s (slo.compute_metrics): gaps between consecutive token-bearing
chunks, pooled over requests. In process, a chunk's time is the engine's end-of-step time.

    .venv/bin/python benchmarks/server_overhead.py [--rounds 5] [--requests 4 16 32] [--burst 256]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import resource
import subprocess
import sys

import numpy as np

from engine_lite import EngineConfig
from loadgen import HttpTarget, InProcessTarget, RequestSpec, replay
from slo import compute_metrics

SERVED = "bench"


def requests(n: int, prompt_len: int, output_len: int) -> list[RequestSpec]:
    # Distinct prompts, identical on both paths; ids 3.. are bytes in the presets' tokenizer.
    return [
        RequestSpec(i, [3 + (i * 7 + j) % 250 for j in range(prompt_len)], output_len, "short")
        for i in range(n)
    ]


async def run(target, specs: list[RequestSpec]):
    """All requests at once; returns slo's RunMetrics."""
    result = await replay(target, specs, [0.0] * len(specs), timeout_s=300.0)
    return compute_metrics(result.records)


def own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def child_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a running child, from /proc (Linux)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_server(flags: list[str]) -> tuple[subprocess.Popen, str]:
    argv = [sys.executable, "-m", "engine_lite.cli", "serve", "--port", "0",
            "--served-model-name", SERVED, *flags]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = None
    assert proc.stdout is not None
    for line in proc.stdout:
        if m := re.search(r"listening on (http://\S+)", line):
            url = m.group(1)
        if "ready:" in line:
            return proc, str(url)
    raise SystemExit(f"engine-lite serve exited with {proc.wait()} before it was ready")


async def compare(server: subprocess.Popen, http, local, specs, rounds: int) -> dict:
    """Alternates the two paths `rounds` times; medians over rounds."""
    itl_pairs, cpu_us = [], []
    tokens = sum(s.output_len for s in specs)
    for r in range(rounds):
        c0 = own_cpu_s()
        m_local = await run(local, specs)
        c1, s1 = own_cpu_s(), child_cpu_s(server.pid)
        m_http = await run(http, specs)
        c2, s2 = own_cpu_s(), child_cpu_s(server.pid)
        if m_http.failed or m_local.failed:
            raise SystemExit(f"round {r}: {m_http.failed} HTTP, {m_local.failed} local failures")
        itl_pairs.append((m_http.itl.median_s * 1e3, m_local.itl.median_s * 1e3))
        cpu_us.append(((c2 - c1) + (s2 - s1) - (c1 - c0)) / tokens * 1e6)
        server_ms, local_ms = itl_pairs[-1]
        print(
            f"  {len(specs):>3} streams, round {r}: ITL p50 server {server_ms:.3f} ms, "
            f"in-process {local_ms:.3f} ms, diff {server_ms - local_ms:+.3f} ms; "
            f"extra CPU {cpu_us[-1]:.0f} us/token",
            flush=True,
        )
    return {
        "streams": len(specs),
        "itl_p50_server_ms": round(float(np.median([s for s, _ in itl_pairs])), 3),
        "itl_p50_inprocess_ms": round(float(np.median([i for _, i in itl_pairs])), 3),
        "overhead_ms": round(float(np.median([s - i for s, i in itl_pairs])), 3),
        "extra_cpu_us_per_token": round(float(np.median(cpu_us)), 1),
    }


async def main_async(args: argparse.Namespace) -> dict[str, object]:
    from engine_lite.async_engine import AsyncEngine

    flags = ["--model", args.model, "--max-model-len", "2048", "--kv-cache-memory-gb", "0.5"]
    config = EngineConfig(model=args.model, max_model_len=2048, kv_cache_memory_gb=0.5)
    proc, url = start_server(flags)
    engine = AsyncEngine(config)
    await engine.start()
    http, local = HttpTarget(url, SERVED), InProcessTarget(engine)
    try:
        await run(local, requests(4, args.prompt_len, 8))  # warm-up both paths
        await run(http, requests(4, args.prompt_len, 8))
        table = [
            await compare(
                proc, http, local, requests(n, args.prompt_len, args.output_len), args.rounds
            )
            for n in args.requests
        ]
        burst = await run(http, requests(args.burst, args.prompt_len, args.burst_output_len))
    finally:
        await engine.shutdown()
        proc.terminate()
        proc.wait(timeout=30)
    return {
        "model": args.model,
        "prompt_len": args.prompt_len,
        "output_len": args.output_len,
        "rounds": args.rounds,
        "overhead_target_ms": 1.0,
        "itl_by_streams": table,
        "burst_requests": args.burst,
        "burst_completed": burst.completed,
        "burst_errors": burst.failed,
        "burst_duration_s": round(burst.duration_s, 2),
        "burst_output_tokens": burst.total_output_tokens,
        "burst_ttft_p50_ms": round(burst.ttft.median_s * 1e3, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument(
        "--requests", type=int, nargs="+", default=[4, 16, 32], help="concurrent streams per round"
    )
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--burst", type=int, default=256)
    parser.add_argument("--burst-output-len", type=int, default=32)
    summary = asyncio.run(main_async(parser.parse_args()))
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
