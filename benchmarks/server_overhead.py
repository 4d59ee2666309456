"""Per-token cost of HTTP/SSE over the in-process path, and a 256-stream burst.

Runs `engine-lite serve` as a child process and an `AsyncEngine` with the same config in this
process, replays the same workload against both (alternating, several rounds) and prints:

- ITL p50 via the server, ITL p50 in-process, and their difference (the per-token overhead of
  HTTP + SSE + client parsing; target <= 1 ms);
- a burst of 256 concurrent streaming requests: errors (target 0), wall time, tokens.

ITL follows `vllm bench serve`: the gap between consecutive token-bearing chunks as the client
receives them, pooled over requests; percentiles by numpy linear interpolation.

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
import time
from dataclasses import dataclass, field

import aiohttp
import numpy as np

from engine_lite import EngineConfig, SamplingParams

SERVED = "bench"


@dataclass(slots=True)
class Workload:
    num_requests: int
    prompt_len: int
    output_len: int

    def prompts(self) -> list[list[int]]:
        # Distinct prompts (ids past the byte tokenizer's specials), identical across paths.
        return [
            [3 + (i * 7 + j) % 250 for j in range(self.prompt_len)]
            for i in range(self.num_requests)
        ]


@dataclass(slots=True)
class RunResult:
    itl_s: list[float] = field(default_factory=list)
    ttft_s: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    tokens: int = 0
    wall_s: float = 0.0


async def run_inprocess(engine, wl: Workload) -> RunResult:
    params = SamplingParams(max_tokens=wl.output_len, temperature=0.0, ignore_eos=True)
    out = RunResult()

    async def one(prompt: list[int]) -> None:
        sent = time.monotonic()
        times = []
        async for ev in engine.generate(prompt, params):
            times.append(time.monotonic())
            out.tokens += len(ev.token_ids)
        out.ttft_s.append(times[0] - sent)
        out.itl_s.extend(np.diff(times).tolist())

    start = time.monotonic()
    await asyncio.gather(*(one(p) for p in wl.prompts()))
    out.wall_s = time.monotonic() - start
    return out


async def run_http(url: str, wl: Workload) -> RunResult:
    out = RunResult()

    async def one(session: aiohttp.ClientSession, prompt: list[int]) -> None:
        body = {
            "model": SERVED,
            "prompt": prompt,
            "max_tokens": wl.output_len,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        sent = time.monotonic()
        times: list[float] = []
        try:
            async with session.post(f"{url}/v1/completions", json=body) as resp:
                if resp.status != 200:
                    out.errors.append(f"HTTP {resp.status}: {(await resp.text())[:200]}")
                    return
                async for line in resp.content:
                    now = time.monotonic()  # stamped before parsing, as vllm bench does
                    if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                        continue
                    chunk = json.loads(line[6:])
                    if chunk.get("error"):
                        out.errors.append(str(chunk["error"]))
                    elif chunk["choices"]:
                        times.append(now)
                    else:
                        out.tokens += chunk["usage"]["completion_tokens"]
        except aiohttp.ClientError as exc:
            out.errors.append(repr(exc))
            return
        if len(times) != wl.output_len:
            out.errors.append(f"got {len(times)} token chunks, wanted {wl.output_len}")
            return
        out.ttft_s.append(times[0] - sent)
        out.itl_s.extend(np.diff(times).tolist())

    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        start = time.monotonic()
        await asyncio.gather(*(one(session, p) for p in wl.prompts()))
        out.wall_s = time.monotonic() - start
    return out


def start_server(flags: list[str]) -> tuple[subprocess.Popen, str]:
    argv = [
        sys.executable,
        "-m",
        "engine_lite.cli",
        "serve",
        "--port",
        "0",
        "--served-model-name",
        SERVED,
        *flags,
    ]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = None
    assert proc.stdout is not None
    for line in proc.stdout:
        if m := re.search(r"listening on (http://\S+)", line):
            url = m.group(1)
        if "ready:" in line:
            return proc, str(url)
    raise SystemExit(f"engine-lite serve exited with {proc.wait()} before it was ready")


def p50_ms(values: list[float]) -> float:
    return float(np.percentile(values, 50)) * 1e3


def own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def child_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a running child, from /proc (Linux)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def compare(server: subprocess.Popen, url: str, engine, wl: Workload, rounds: int) -> dict:
    """Alternates the two paths `rounds` times; medians over rounds of each p50 and the diff.

    CPU per token (server process + this client, against the in-process run) is reported
    beside it: on a shared 2-core machine it is far less noisy than latency.
    """
    pairs, cpu_us = [], []
    tokens = wl.num_requests * wl.output_len
    for r in range(rounds):
        c0 = own_cpu_s()
        local = await run_inprocess(engine, wl)
        c1, s1 = own_cpu_s(), child_cpu_s(server.pid)
        remote = await run_http(url, wl)
        c2, s2 = own_cpu_s(), child_cpu_s(server.pid)
        if remote.errors:
            raise SystemExit(f"HTTP errors in round {r}: {remote.errors[:3]}")
        pairs.append((p50_ms(remote.itl_s), p50_ms(local.itl_s)))
        cpu_us.append(((c2 - c1) + (s2 - s1) - (c1 - c0)) / tokens * 1e6)
        print(
            f"  {wl.num_requests:>3} streams, round {r}: ITL p50 server {pairs[-1][0]:.3f} ms, "
            f"in-process {pairs[-1][1]:.3f} ms, diff {pairs[-1][0] - pairs[-1][1]:+.3f} ms; "
            f"extra CPU {cpu_us[-1]:.0f} us/token",
            flush=True,
        )
    return {
        "streams": wl.num_requests,
        "itl_p50_server_ms": round(float(np.median([s for s, _ in pairs])), 3),
        "itl_p50_inprocess_ms": round(float(np.median([i for _, i in pairs])), 3),
        "overhead_ms": round(float(np.median([s - i for s, i in pairs])), 3),
        "extra_cpu_us_per_token": round(float(np.median(cpu_us)), 1),
    }


async def main_async(args: argparse.Namespace) -> dict[str, object]:
    from engine_lite.async_engine import AsyncEngine

    flags = ["--model", args.model, "--max-model-len", "2048", "--kv-cache-memory-gb", "0.5"]
    config = EngineConfig(model=args.model, max_model_len=2048, kv_cache_memory_gb=0.5)
    proc, url = start_server(flags)
    engine = AsyncEngine(config)
    await engine.start()
    try:
        await run_inprocess(engine, Workload(4, args.prompt_len, 8))  # warm-up both paths
        await run_http(url, Workload(4, args.prompt_len, 8))
        table = [
            await compare(
                proc, url, engine, Workload(n, args.prompt_len, args.output_len), args.rounds
            )
            for n in args.requests
        ]
        burst = await run_http(url, Workload(args.burst, args.prompt_len, args.burst_output_len))
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
        "burst_errors": args.burst - len(burst.ttft_s),
        "burst_error_samples": burst.errors[:3],
        "burst_wall_s": round(burst.wall_s, 2),
        "burst_output_tokens": burst.tokens,
        "burst_ttft_p50_ms": round(p50_ms(burst.ttft_s), 1) if burst.ttft_s else None,
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
