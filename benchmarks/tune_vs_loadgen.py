"""Do `tune` and a standalone `loadgen` agree on the same server?

Starts one server with its default config (`engine-lite serve`, or real vLLM with
`--vllm-folder DIR`), has `tune --url` measure the default's capacity under the SLO, then runs
the independent `loadgen` CLI against the same server, the same workload, at that capacity
(several times) and at 1.5x it. They agree when loadgen meets the SLO at the capacity tune
reported (most runs) and misses it at 1.5x.

    .venv/bin/python benchmarks/tune_vs_loadgen.py [--repeats 3] [--vllm-folder DIR] [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tuner.measure.meter import LAG_TRIES  # noqa: E402
from tuner.settings import TuneSettings  # noqa: E402

BIN = Path(sys.executable).parent
SLO = "tpot_p99=30ms"
LEVEL_S = 8.0  # tune's default seconds of arrivals per level (tuner/settings.py)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(args: argparse.Namespace, port: int, log: Path,
                 flags: list[str] | None = None) -> subprocess.Popen:  # fmt: skip
    """The server on 127.0.0.1:port; `flags` go to vLLM as they are (a report's flags)."""
    if args.vllm_folder:
        from tuner.targets.vllm import default_command, server_env

        argv = [*shlex.split(args.vllm_command or default_command()), "--model",
                args.vllm_folder, "--served-model-name", "m", "--host", "127.0.0.1",
                "--port", str(port), "--no-enable-prefix-caching", *(flags or [])]  # fmt: skip
        env = server_env()
    else:
        argv = [str(BIN / "engine-lite"), "serve", "--model", "tiny", "--served-model-name",
                "m", "--host", "127.0.0.1", "--port", str(port)]  # fmt: skip
        env = dict(os.environ)
    proc = subprocess.Popen(argv, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env,
                            process_group=0)  # fmt: skip
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited ({proc.returncode}); see {log}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return proc
        except OSError:
            time.sleep(0.5)
    raise SystemExit(f"the server gave no /health in 600 s; see {log}")


def tune_capacity(url: str, run_dir: Path, min_requests: int) -> dict[str, Any]:
    argv = [str(BIN / "tune"), "--url", url, "--served-model", "m", "--slo", SLO, "--json",
            "--quiet", "--fidelity", "real", "--run-dir", str(run_dir),
            "--min-requests", str(min_requests)]  # fmt: skip
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    rec = json.loads(out)
    default = rec["default"]
    return {"capacity_rps": default["capacity_rps"], "terms": default["terms"],
            "rate_rps": default["rate_rps"]}  # fmt: skip


def loadgen(url: str, rate: float, seed: int, slo: str = SLO, min_requests: int = 20
            ) -> dict[str, Any]:  # fmt: skip
    n = max(min_requests, math.ceil(rate * LEVEL_S))  # what one tune level at this rate replays
    argv = [str(BIN / "loadgen"), "--url", url, "--model", "m", "--workload", "mixed",
            "--num-requests", str(n), "--rate", f"{rate:.4f}", "--seed", str(seed),
            "--slo", slo, "--json", "--no-progress"]  # fmt: skip
    # A run whose client fell behind its schedule measured the client, not the server: it is
    # run again (as tune re-measures such a level), and how often is reported.
    lagged = 0
    while True:
        rec = json.loads(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)
        lagged += not rec["schedule_ok"]
        if rec["schedule_ok"] or lagged == LAG_TRIES:
            break
    return {"rate_rps": rate, "requests": n, "slo_met": rec["slo_met"],
            "tpot_p99_ms": rec["p99_tpot_ms"], "schedule_ok": rec["schedule_ok"],
            "lagged_runs": lagged}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3, help="loadgen runs at the capacity")
    p.add_argument("--vllm-folder", help="measure real vLLM serving this model folder")
    p.add_argument("--vllm-command", help="vLLM server command prefix")
    p.add_argument(
        "--min-requests",
        type=int,
        help="requests per level, for tune and loadgen "
        "alike (default: tune's, 20; 640 with --vllm-folder, as tune --engine vllm)",
    )
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    engine = "vllm" if args.vllm_folder else "builtin"
    floor = TuneSettings(slo=SLO, engine=engine, min_requests=args.min_requests
                         ).resolved_min_requests()  # fmt: skip
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as tmp:
        server = start_server(args, port, Path(tmp) / "server.log")
        try:
            tuned = tune_capacity(url, Path(tmp) / "run", floor)
            cap = tuned["capacity_rps"]
            # Seeds from 1: seed 0 is the draw tune's search levels replayed.
            at_cap = [loadgen(url, cap, seed, min_requests=floor)
                      for seed in range(1, args.repeats + 1)]  # fmt: skip
            above = loadgen(url, 1.5 * cap, 1, min_requests=floor)
        finally:
            os.killpg(server.pid, 15)
            server.wait(timeout=60)
    tpot = [t["value_ms"] for t in tuned["terms"] if t["metric"] == "tpot_p99"]
    result = {
        "server": "vllm" if args.vllm_folder else "engine-lite serve", "slo": SLO,
        "min_requests_per_level": floor,
        "tune_capacity_rps": cap, "tune_tpot_p99_ms_at_capacity": tpot[0] if tpot else None,
        "loadgen_at_capacity": at_cap,
        "loadgen_tpot_p99_ms_median": statistics.median(r["tpot_p99_ms"] for r in at_cap),
        "loadgen_met_at_capacity": sum(r["slo_met"] for r in at_cap),
        "loadgen_at_1_5x": above,
        "agree": sum(r["slo_met"] for r in at_cap) * 2 > len(at_cap) and not above["slo_met"],
    }  # fmt: skip
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(
        f"{result['server']}: tune says the default holds {SLO} up to {cap:.2f} req/s "
        f"(tpot_p99 {result['tune_tpot_p99_ms_at_capacity']:.1f} ms there)"
    )
    print(
        f"  loadgen at {cap:.2f} req/s: SLO met in {result['loadgen_met_at_capacity']} of "
        f"{len(at_cap)} runs, median tpot_p99 {result['loadgen_tpot_p99_ms_median']:.1f} ms"
    )
    print(
        f"  loadgen at {1.5 * cap:.2f} req/s (1.5x): SLO met: {above['slo_met']} "
        f"(tpot_p99 {above['tpot_p99_ms']:.1f} ms)"
    )
    print(f"  agree: {result['agree']}")


if __name__ == "__main__":
    main()
