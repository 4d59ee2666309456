"""The Grafana dashboard's PromQL, evaluated by a real Prometheus scraping `engine-lite serve`."""

from __future__ import annotations

import asyncio
import json
import math
import queue
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import aiohttp
import pytest

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "dashboards" / "engine-lite-grafana.json"
SCRAPE_CONFIG = ROOT / "dashboards" / "prometheus.yml"
SERVED = "dash-model"
REQUIRED_PANELS = (
    "E2E request latency",
    "Time to first token",
    "Inter-token latency",
    "Token throughput",
    "Scheduler state",
    "KV cache usage",
    "Preemptions",
    "Tokens per step",
    "Prefill / decode split per step",
)


def _panels():
    return [p for p in json.loads(DASHBOARD.read_text())["panels"] if p["type"] != "row"]


def _exprs():
    return [t["expr"] for p in _panels() for t in p["targets"]]


def test_dashboard_has_the_panels_operators_look_for():
    titles = [p["title"] for p in _panels()]
    for want in REQUIRED_PANELS:
        assert any(t.startswith(want) for t in titles), want
    for expr in _exprs():
        assert '{model_name="$model_name"}' in expr, expr


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian prometheus) absent")
def test_scrape_config_is_valid():
    proc = subprocess.run(
        ["promtool", "check", "config", str(SCRAPE_CONFIG)], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status
    except urllib.error.HTTPError as err:
        return err.code
    except OSError:
        return 0


class LineReader:
    """stdout lines of a child process, read on a thread so waits can have a deadline."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._pump, args=(proc,), daemon=True).start()

    def _pump(self, proc: subprocess.Popen) -> None:
        for line in proc.stdout:
            self.lines.put(line)

    def wait_for(self, pattern: str, timeout_s: float) -> re.Match[str]:
        end = time.monotonic() + timeout_s
        while (left := end - time.monotonic()) > 0:
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                break
            if m := re.search(pattern, line):
                return m
        raise AssertionError(f"no line matching {pattern!r} within {timeout_s}s")


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)


@pytest.fixture
def serve_url():
    """`engine-lite serve` as a user starts it, on a free port; checks /health 503 then 200."""
    argv = [sys.executable, "-m", "engine_lite.cli", "serve", "--model", "tiny", "--port", "0",
            "--served-model-name", SERVED, "--max-model-len", "2048", "--kv-cache-memory-gb",
            "0.05", "--max-num-batched-tokens", "256"]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        reader = LineReader(proc)
        port = int(reader.wait_for(r"listening on http://127\.0\.0\.1:(\d+)", 60).group(1))
        url = f"http://127.0.0.1:{port}"
        # The port opens before the weights load (torch alone takes seconds to import).
        assert _get_status(f"{url}/health") == 503
        reader.wait_for(r"ready: model tiny", 120)
        assert _get_status(f"{url}/health") == 200
        yield url
    finally:
        _stop(proc)


@pytest.fixture
def prometheus_url(serve_url, tmp_path):
    target = serve_url.removeprefix("http://")
    config = SCRAPE_CONFIG.read_text().replace("127.0.0.1:8000", target)
    config = config.replace("scrape_interval: 5s", "scrape_interval: 1s")
    (tmp_path / "prometheus.yml").write_text(config)
    port = _free_port()
    argv = ["prometheus", f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn"]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        end = time.monotonic() + 30
        while _get_status(f"{url}/-/ready") != 200:
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < end, "prometheus did not become ready in 30 s"
            time.sleep(0.1)
        yield url
    finally:
        _stop(proc)


async def _load(url: str, min_duration_s: float, max_requests: int) -> int:
    """Mixed short and chunked-long streaming requests, 8 at a time; returns how many ran."""

    async def one(session: aiohttp.ClientSession, i: int) -> None:
        prompt = list(range(3, 3 + (700 if i % 4 == 0 else 40)))
        body = {"model": SERVED, "prompt": prompt, "max_tokens": 24, "ignore_eos": True,
                "stream": True}  # fmt: skip
        async with session.post(f"{url}/v1/completions", json=body) as resp:
            assert resp.status == 200
            async for _ in resp.content:
                pass

    done, start = 0, time.monotonic()
    async with aiohttp.ClientSession() as session:
        while done < max_requests and (done < 24 or time.monotonic() - start < min_duration_s):
            await asyncio.gather(*(one(session, done + k) for k in range(8)))
            done += 8
    return done


def _wait_for(prom, query: str, ok, what: str, timeout_s: float = 30.0) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        result = prom.custom_query(query=query)
        if result and ok(float(result[0]["value"][1])):
            return
        time.sleep(0.25)
    raise AssertionError(f"prometheus never saw {what} within {timeout_s} s")


@pytest.mark.slow
@pytest.mark.skipif(
    shutil.which("prometheus") is None,
    reason="the prometheus binary is absent (Debian: apt-get install prometheus; .ci/run does)",
)
def test_every_dashboard_query_returns_data_from_a_real_prometheus(serve_url, prometheus_url):
    from prometheus_api_client import PrometheusConnect

    prom = PrometheusConnect(url=prometheus_url, disable_ssl=True)
    # Prometheus hands new targets to its scraper a few seconds after start; load before that
    # would leave too few samples for rate().
    _wait_for(prom, 'up{job="engine-lite"}', lambda v: v == 1, "the server up")
    total = asyncio.run(_load(serve_url, min_duration_s=4.0, max_requests=160))
    finished = f'sum(vllm:request_success_total{{model_name="{SERVED}"}})'
    _wait_for(prom, finished, lambda v: v >= total, f"{total} finished requests")
    # The dashboard's model_name variable comes from this series' labels.
    assert prom.custom_query(query="vllm:num_requests_running")[0]["metric"]["model_name"] == SERVED
    empty = []
    for expr in _exprs():
        query = expr.replace("$model_name", SERVED).replace("$__rate_interval", "1m")
        values = [float(r["value"][1]) for r in prom.custom_query(query=query)]
        if not any(math.isfinite(v) for v in values):
            empty.append((expr, values))
    assert not empty, f"{len(empty)} dashboard queries returned no data: {empty}"
