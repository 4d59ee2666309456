"""Clients that hang up mid-stream must never hurt anyone else's stream.

Starts `engine-lite serve` (tiny preset) in its own process with Python's thread switch interval
shortened, so its event loop and its engine step thread interleave as on a busier machine or
free-threaded Python, and runs many concurrent long streams over HTTP to 127.0.0.1; at random
a client hangs up. Every stream that was not hung up must end normally with exactly the tokens
it asked for, and once the traffic stops the KV cache must be empty and the server healthy.

    python benchmarks/abort_stress.py --duration 60 --streams 128      # prints one JSON line
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field

import aiohttp


@dataclass(slots=True)
class StressResult:
    duration_s: float
    streams: int
    switch_interval_s: float
    completed: int = 0  # ran to the end with every token
    hung_up: int = 0  # the client disconnected on purpose
    failed: int = 0  # anything else: an error status, a short or broken stream
    failures: list[str] = field(default_factory=list)
    kv_cache_usage_after: float = -1.0
    healthy_after: bool = False

    @property
    def ok(self) -> bool:
        return self.failed == 0 and self.kv_cache_usage_after == 0.0 and self.healthy_after


_SERVE = """
import sys
sys.setswitchinterval(float(sys.argv.pop(1)))
from engine_lite.cli import main
sys.exit(main(sys.argv[1:]))
"""


class _Server:
    """`engine-lite serve` in its own process, its thread switch interval shortened."""

    def __init__(self, switch_interval_s: float) -> None:
        self.port = _free_port()
        self.argv = [
            sys.executable, "-c", _SERVE, repr(switch_interval_s), "serve", "--model", "tiny",
            "--device", "cpu", "--max-model-len", "2048", "--kv-cache-memory-gb", "0.5",
            "--host", "127.0.0.1", "--port", str(self.port),
        ]  # fmt: skip

    def __enter__(self) -> _Server:
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.DEVNULL)
        asyncio.run(self._wait_healthy())
        return self

    async def _wait_healthy(self, timeout_s: float = 120.0) -> None:
        end = time.monotonic() + timeout_s
        async with aiohttp.ClientSession() as session:
            while time.monotonic() < end:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"engine-lite serve exited with {self.proc.returncode}")
                try:
                    async with session.get(f"http://127.0.0.1:{self.port}/health") as r:
                        if r.status == 200:
                            return
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.2)
        raise RuntimeError("engine-lite serve did not become healthy")

    def __exit__(self, *_: object) -> None:
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def _one_stream(
    session: aiohttp.ClientSession, url: str, rng: random.Random, hang_up_frac: float,
    res: StressResult,
) -> None:  # fmt: skip
    max_tokens = rng.randint(100, 600)
    body = {
        "model": "tiny",
        "prompt": [rng.randint(300, 3000) for _ in range(rng.randint(16, 1200))],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    # Most clients hang up, many soon after their first token: aborts land in every phase of
    # a step (scheduling, input preparation, the forward, token delivery).
    hang_up_after = rng.randint(1, 40) if rng.random() < hang_up_frac else None
    chunks, usage, done = 0, None, False
    try:
        async with session.post(url, json=body) as resp:
            if resp.status != 200:
                raise RuntimeError(f"HTTP {resp.status}: {(await resp.text())[:120]}")
            async for line in resp.content:
                if not line.startswith(b"data: "):
                    continue
                data = line[6:].strip()
                if data == b"[DONE]":
                    done = True
                    break
                event = json.loads(data)
                if "error" in event:
                    raise RuntimeError(f"error event: {event['error']}")
                if event.get("usage"):
                    usage = event["usage"]
                if event.get("choices"):
                    chunks += 1
                if hang_up_after is not None and chunks >= hang_up_after:
                    resp.close()  # drops the connection mid-stream: the server sees a hang-up
                    res.hung_up += 1
                    return
        if not done or usage is None or usage["completion_tokens"] != max_tokens:
            raise RuntimeError(f"stream ended early: done={done}, usage={usage}")
        res.completed += 1
    except (TimeoutError, aiohttp.ClientError, RuntimeError) as exc:
        res.failed += 1
        if len(res.failures) < 10:
            res.failures.append(f"{type(exc).__name__}: {exc}"[:200])


async def _traffic(port: int, args: argparse.Namespace, res: StressResult) -> None:
    url = f"http://127.0.0.1:{port}/v1/completions"
    deadline = time.monotonic() + args.duration
    timeout = aiohttp.ClientTimeout(total=args.duration + 120)
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=conn) as session:

        async def worker(i: int) -> None:
            rng = random.Random(f"{args.seed}-{i}")
            while time.monotonic() < deadline:
                await _one_stream(session, url, rng, args.hang_up_frac, res)

        await asyncio.gather(*(worker(i) for i in range(args.streams)))


async def _settled(port: int, timeout_s: float = 30.0) -> tuple[float, bool]:
    """KV usage once the server has drained, from its own /metrics, and whether /health
    still answers 200 (a dead step thread turns every route into a 503)."""
    base = f"http://127.0.0.1:{port}"
    end = time.monotonic() + timeout_s
    usage = -1.0
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < end:
            async with session.get(f"{base}/metrics") as r:
                text = await r.text() if r.status == 200 else ""
            gauges = dict(_gauges(text, ("vllm:kv_cache_usage_perc", "vllm:num_requests_running")))
            usage = gauges.get("vllm:kv_cache_usage_perc", -1.0)
            if usage == 0.0 and gauges.get("vllm:num_requests_running") == 0.0:
                break
            await asyncio.sleep(0.1)
        async with session.get(f"{base}/health") as r:
            return usage, r.status == 200


def _gauges(text: str, names: tuple[str, ...]):  # type: ignore[no-untyped-def]
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        base = name.split("{")[0]
        if base in names:
            yield base, float(value)


def run_stress(args: argparse.Namespace) -> StressResult:
    res = StressResult(args.duration, args.streams, args.switch_interval_us * 1e-6)
    with _Server(res.switch_interval_s) as server:
        asyncio.run(_traffic(server.port, args, res))
        res.kv_cache_usage_after, res.healthy_after = asyncio.run(_settled(server.port))
    return res


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=60.0, help="seconds of traffic")
    ap.add_argument("--streams", type=int, default=128, help="concurrent streams")
    ap.add_argument("--switch-interval-us", type=float, default=20.0)
    ap.add_argument("--hang-up-frac", type=float, default=0.8, help="share of clients that hang up")
    ap.add_argument("--seed", type=int, default=0)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    res = run_stress(parse_args(argv))
    print(json.dumps({**asdict(res), "ok": res.ok}))
    return 0 if res.ok else 1


if __name__ == "__main__":
    sys.exit(main())
