"""How exactly loadgen measures TTFT and ITL, and how many token chunks per second it keeps up with.

    .venv/bin/python benchmarks/loadgen_accuracy.py [--rates 1000 10000] [--repeats 3]
        [--ramp 10000 15000 20000 30000] [--workers 1 2] [--duration 5] [--pin] [--json]

The scripted server (loadgen/scripted_server.py) runs in its own process and streams every
request's 40 tokens one chunk at a time, the first after 50 ms, then gaps of 20 ms +-50%
(seeded per request). It stamps `time.monotonic()` right before writing each chunk; on Linux
that clock is system-wide, so the client's arrival stamps and the server's send stamps are
directly comparable. Truth per request: TTFT = first chunk sent - request received; ITL = the
gaps between the server's sends. Requests arrive at a constant rate of chunk_rate / 40 req/s.

Per load level and repeat it prints the client's TTFT and ITL percentiles minus the truth's
(p50/p90/p99, ms), the per-chunk delivery delay (arrival - send), the loop and send lag, and
whether the client kept its schedule; medians over repeats. A level is *sustained* when the
schedule held, no request was lost, and the ITL error is within 1 ms at p50 and 5 ms at p99
(a client that falls behind reads chunks together, and ITL p50 collapses towards 0).
The TTFT error is split into the request path (send stamp to the server's handler: client
request overhead plus the server's own intake delay), the first chunk's delivery, and (one
worker) the client's own share per request: send stamp to request written (aiohttp trace)
plus the first chunk's delivery; the rest is the network and the server's intake.
`--pin` puts the server on CPU 1 and the client on CPU 0 (else the OS places them, and other
work on the machine shares both cores: the load average is printed with every level).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from loadgen import HttpTarget, RequestSpec, arrival_offsets, replay
from loadgen.workers import run_event_loop

ROOT = Path(__file__).resolve().parents[1]
TOKENS, TTFT_MS, ITL_MS, JITTER = 40, 50.0, 20.0, 0.5


def start_server(pin: bool) -> tuple[subprocess.Popen[str], str]:
    cmd = [sys.executable, "-m", "loadgen.scripted_server", "--port", "0"]
    cmd += ["--ttft-ms", str(TTFT_MS), "--itl-ms", str(ITL_MS), "--itl-jitter", str(JITTER)]
    if pin:
        cmd = ["taskset", "-c", "1", *cmd]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("listening on "):
        raise SystemExit(f"scripted server did not start: {line!r}")
    return proc, line.split()[-1]


def fetch_truth(url: str, reset: bool = False) -> dict[str, dict[str, object]]:
    if reset:
        req = urllib.request.Request(url + "/truth/reset", method="POST", data=b"")
        urllib.request.urlopen(req, timeout=30).read()
        return {}
    with urllib.request.urlopen(url + "/truth", timeout=60) as resp:
        return json.loads(resp.read())


class TracedTarget(HttpTarget):
    """Also notes when each request's body has been handed to the socket (benchmark only)."""

    def __init__(self, url: str) -> None:
        super().__init__(url, "scripted")
        self.body_sent_s: dict[str, float] = {}

    def new_session(self, **extra: Any) -> aiohttp.ClientSession:
        trace = aiohttp.TraceConfig()

        async def on_chunk_sent(session: Any, ctx: Any, params: Any) -> None:
            ctx.body_sent_s = time.monotonic()  # ctx: one namespace per request

        async def on_end(session: Any, ctx: Any, params: Any) -> None:
            if "X-Request-Id" in params.headers:  # not the GET /v1/models check
                self.body_sent_s[params.headers["X-Request-Id"]] = ctx.body_sent_s

        trace.on_request_chunk_sent.append(on_chunk_sent)
        trace.on_request_end.append(on_end)
        return super().new_session(trace_configs=[trace], **extra)


def proc_cpu_s(pid: int) -> float:
    """utime + stime of a process, from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def one_level(
    url: str, chunk_rate: float, duration_s: float, workers: int, server_pid: int
) -> dict:
    rate = chunk_rate / TOKENS
    n = max(10, round(rate * duration_s))
    specs = [RequestSpec(i, [5, 6, 7, 8], TOKENS, "short") for i in range(n)]
    offsets = arrival_offsets("constant", rate, n)
    fetch_truth(url, reset=True)
    cpu0, server0, load0 = time.process_time(), proc_cpu_s(server_pid), os.getloadavg()[0]
    target = TracedTarget(url) if workers == 1 else HttpTarget(url, "scripted")
    res = await replay(target, specs, offsets, timeout_s=60, workers=workers)
    cpu_s = time.process_time() - cpu0  # this process only: meaningful with one worker
    server_s = proc_cpu_s(server_pid) - server0
    truth = fetch_truth(url)
    body_sent = target.body_sent_s if isinstance(target, TracedTarget) else {}
    row = compare(res, truth, body_sent)
    row |= {"chunk_rate": chunk_rate, "workers": workers, "requests": n}
    chunks = sum(len(r.chunk_times_s) for r in res.records)
    row["client_cpu_us_per_chunk"] = cpu_s / max(1, chunks) * 1e6 if workers == 1 else float("nan")
    row["server_cpu_us_per_chunk"] = server_s / max(1, chunks) * 1e6
    row["load_avg_1m"] = max(load0, os.getloadavg()[0])  # other work on the machine
    return row


def compare(res, truth: dict, body_sent: dict[str, float]) -> dict:
    ttft_c, ttft_t, itl_c, itl_t, delay, intake, client_ttft = [], [], [], [], [], [], []
    lost = merged = 0
    for rec in res.records:
        t = truth.get(str(rec.index))
        if not rec.success or t is None or len(rec.chunk_times_s) != len(t["chunk_sent_s"]):
            lost += 1
            continue
        sent = np.asarray(t["chunk_sent_s"])
        got = np.asarray(rec.chunk_times_s)
        ttft_c.append(got[0] - rec.sent_s)
        ttft_t.append(sent[0] - t["received_s"])
        intake.append(t["received_s"] - rec.sent_s)
        if str(rec.index) in body_sent:
            # The client's own share of this request's TTFT error: stamp to request written,
            # plus the first chunk's sent-to-read delay. The rest is network and server intake.
            path = body_sent[str(rec.index)] - rec.sent_s
            client_ttft.append(path + got[0] - sent[0])
        itl_c.extend(np.diff(got))
        itl_t.extend(np.diff(sent))
        delay.extend(got - sent)
        # Two chunks the server sent >= 5 ms apart but the client read together: a client stall.
        merged += int(np.sum((np.diff(got) < 1e-4) & (np.diff(sent) >= 5e-3)))
    out = {"lost": lost, "merged": merged, "schedule_ok": res.schedule_ok}
    out["p99_loop_lag_ms"] = res.p99_loop_lag_s * 1e3
    out["p99_send_lag_ms"] = res.p99_send_lag_s * 1e3
    for q in (50, 90, 99):
        out[f"ttft_p{q}_err_ms"] = _pct(ttft_c, q) - _pct(ttft_t, q)
        out[f"itl_p{q}_err_ms"] = _pct(itl_c, q) - _pct(itl_t, q)
        out[f"delay_p{q}_ms"] = _pct(delay, q)
        out[f"intake_p{q}_ms"] = _pct(intake, q)
        out[f"client_ttft_err_p{q}_ms"] = _pct(client_ttft, q)
    out["delay_max_ms"] = max(delay) * 1e3 if delay else float("nan")
    out["merged_frac"] = merged / max(1, len(delay))
    out["sustained"] = bool(
        res.schedule_ok
        and lost == 0
        and abs(out["itl_p50_err_ms"]) <= 1.0
        and abs(out["itl_p99_err_ms"]) <= 5.0
    )
    return out


def _pct(xs: list[float], q: float) -> float:
    return float(np.percentile(xs, q)) * 1e3 if xs else float("nan")


def median_of(runs: list[dict]) -> dict:
    out = dict(runs[0])
    for key, value in runs[0].items():
        if isinstance(value, float):
            out[key] = statistics.median(r[key] for r in runs)
    out["sustained"] = all(r["sustained"] for r in runs)
    out["repeats"] = len(runs)
    return out


def show(row: dict) -> None:
    print(
        f"{row['chunk_rate']:>7.0f} chunks/s  workers {row['workers']}  "
        f"TTFT err p50/p99 {row['ttft_p50_err_ms']:+.2f}/{row['ttft_p99_err_ms']:+.2f} ms "
        f"(client's share per request p50/p99 {row['client_ttft_err_p50_ms']:.2f}/"
        f"{row['client_ttft_err_p99_ms']:.2f})  "
        f"ITL err p50/p90/p99 {row['itl_p50_err_ms']:+.2f}/{row['itl_p90_err_ms']:+.2f}/"
        f"{row['itl_p99_err_ms']:+.2f} ms  delay p50/p99 {row['delay_p50_ms']:.2f}/"
        f"{row['delay_p99_ms']:.2f} ms  request intake p50/p99 {row['intake_p50_ms']:.2f}/"
        f"{row['intake_p99_ms']:.2f} ms  loop lag p99 {row['p99_loop_lag_ms']:.1f} ms  "
        f"CPU us/chunk client {row['client_cpu_us_per_chunk']:.0f} "
        f"server {row['server_cpu_us_per_chunk']:.0f}  load {row['load_avg_1m']:.1f}  "
        f"{'sustained' if row['sustained'] else 'NOT sustained'}"
        f" (lost {row['lost']}, merged {row['merged']}, schedule_ok {row['schedule_ok']})",
        flush=True,
    )


async def run_all(args: argparse.Namespace, url: str, server_pid: int) -> dict:
    accuracy, ramp = [], []
    for rate in args.rates:
        runs = [
            await one_level(url, rate, args.duration, 1, server_pid) for _ in range(args.repeats)
        ]
        accuracy.append(median_of(runs))
        show(accuracy[-1])
    for workers in args.workers:
        for rate in args.ramp:
            row = median_of([await one_level(url, rate, args.duration, workers, server_pid)])
            ramp.append(row)
            show(row)
            if not row["sustained"]:
                break
    best = {
        w: max((r["chunk_rate"] for r in ramp if r["workers"] == w and r["sustained"]), default=0)
        for w in args.workers
    }
    return {"accuracy": accuracy, "ramp": ramp, "max_sustained_chunk_rate": best}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rates", type=float, nargs="+", default=[1000.0, 10000.0])
    p.add_argument("--ramp", type=float, nargs="+", default=[10000.0, 15000.0, 20000.0, 30000.0])
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--duration", type=float, default=5.0, help="seconds of arrivals per level")
    p.add_argument("--pin", action="store_true", help="server on CPU 1, client on CPU 0")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    if args.pin:
        os.sched_setaffinity(0, {0})
    server, url = start_server(args.pin)
    try:
        time.sleep(0.5)
        result = run_event_loop(run_all(args, url, server.pid))
    finally:
        server.terminate()
        server.wait(timeout=10)
    print("max sustained chunks/s by workers:", result["max_sustained_chunk_rate"])
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
