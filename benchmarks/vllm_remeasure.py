"""Does a `tune --engine vllm` recommendation hold on vLLM when measured again, independently?

Reads a run's recommendation.json, starts real vLLM with exactly the recommended flags, and has
the standalone `loadgen` CLI replay the workload at the recommended rate `--repeats` times
(seeds 0, 1, ...: other arrival draws than tune's). Then it starts vLLM with no knob flags (its
own default) and replays the same rate, the default's capacity that tune reported, and 1.5x
that. The recommendation holds when it meets the SLO in every run at its rate while the
default misses there; tune's default capacity agrees with loadgen when loadgen meets the SLO
there in most runs and misses it at 1.5x. A run whose client fell behind its schedule is run
again (up to 3 tries); one that still lagged counts as neither a pass nor a miss. Each run
also says how much prefill its seed's list carries over a `tune` level's mix
(`prefill_vs_tune_mix`): loadgen's lists are independent draws, and a heavy one (seed 0 of
`mixed`, 1.16x) misses a rate the list's mix holds.

    .venv/bin/python benchmarks/vllm_remeasure.py RUN_DIR --vllm-folder DIR [--repeats 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tune_vs_loadgen import free_port, loadgen, start_server

from loadgen import build_workload

VOCAB = 32000  # prompt lengths do not depend on it


def runs(url: str, rate: float, repeats: int, slo: str, floor: int) -> list[dict[str, Any]]:
    return [loadgen(url, rate, seed, slo, floor) for seed in range(repeats)]


def prompt_tokens(workload: dict[str, Any], n: int, seed: int) -> list[int]:
    wl = build_workload(workload["name"], num_requests=n, seed=seed,
                        max_model_len=workload["max_model_len"], vocab_size=VOCAB)  # fmt: skip
    return [r.prompt_len for r in wl.requests]


def prefill_vs_mix(run: dict[str, Any], workload: dict[str, Any], seed: int,
                   mix_mean: float) -> float:  # fmt: skip
    """How much prefill loadgen's list for this seed carries, over what a `tune` level of as
    many requests carries (`mix_mean`, its list's mean prompt: levels take one request of each
    prompt-length stratum). Seed 0's 320 `mixed` requests carry 1.16x: a window as heavy as 1
    in 10."""
    return sum(prompt_tokens(workload, run["requests"], seed)) / (mix_mean * run["requests"])


def measure(args: argparse.Namespace, flags: str, rates: dict[str, float], slo: str,
            floor: int) -> dict[str, list[dict[str, Any]]]:  # fmt: skip
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as tmp:
        server = start_server(args, port, Path(tmp) / "server.log", shlex.split(flags))
        try:
            return {name: runs(url, rate, args.repeats, slo, floor)
                    for name, rate in rates.items()}  # fmt: skip
        finally:
            os.killpg(server.pid, 15)
            server.wait(timeout=60)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run_dir")
    p.add_argument("--vllm-folder", required=True, help="the model folder the run served")
    p.add_argument("--vllm-command", help="vLLM server command prefix")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    rec = json.loads((Path(args.run_dir) / "recommendation.json").read_text())
    # What the report tells the reader to run: `best`, or the default when the headline found
    # the two within noise (then there is no gap over the default to check).
    pick = rec.get("recommended") or rec["best"]
    is_default = pick["config"] == rec["default"]["config"]
    slo, rate = rec["slo"], pick["capacity_rps"]
    default_rps = rec["default"]["capacity_rps"]
    # Each loadgen run is as long as one of the run's levels at that rate.
    info = json.loads((Path(args.run_dir) / "run.json").read_text())
    floor = int(info["workload"].get("min_requests_per_level", 20))
    # The report's flags, exactly as a user would paste them.
    best = measure(args, rec["flags"]["vllm"], {"recommended_at_its_rate": rate}, slo, floor)
    default_rates = {"default_at_recommended_rate": rate, "default_at_its_capacity": default_rps,
                     "default_at_1_5x_its_capacity": 1.5 * default_rps}  # fmt: skip
    default = measure(args, "", default_rates, slo, floor)
    runs = {**best, **default}
    wl = info["workload"]
    tuned = prompt_tokens(wl, wl["num_requests"], wl["seed"])  # tune's list, built once
    mix_mean = sum(tuned) / len(tuned)
    for draws in runs.values():
        for seed, run in enumerate(draws):
            run["prefill_vs_tune_mix"] = prefill_vs_mix(run, wl, seed, mix_mean)
    # A run counts only where the client kept its schedule (it lagged in 3 tries otherwise):
    # a lagging client is a measurement failure, not the server meeting or missing the SLO.
    met = {k: sum(r["schedule_ok"] and r["slo_met"] for r in v) for k, v in runs.items()}
    missed = {k: sum(r["schedule_ok"] and not r["slo_met"] for r in v) for k, v in runs.items()}
    n = args.repeats
    result = {
        "run": args.run_dir, "slo": slo, "recommended": pick["config"],
        "recommended_rps": rate, "default_rps": default_rps, "min_requests_per_level": floor,
        "runs": runs, "met": met, "missed": missed,
        "recommendation_holds": met["recommended_at_its_rate"] == n
        and (is_default or missed["default_at_recommended_rate"] == n),
        "default_capacity_agrees": met["default_at_its_capacity"] * 2 > n
        and missed["default_at_1_5x_its_capacity"] * 2 > n,
    }  # fmt: skip
    if args.json:
        print(json.dumps(result, indent=2))
        return
    for name, values in result["runs"].items():
        tpot = ", ".join(f"{r['tpot_p99_ms']:.1f} ({r['prefill_vs_tune_mix']:.2f}x prefill)"
                         for r in values)  # fmt: skip
        lagged = sum(r["lagged_runs"] for r in values)
        print(f"{name:32s} {values[0]['rate_rps']:6.2f} req/s: SLO met {met[name]}/{n}, "
              f"missed {missed[name]}/{n} (tpot_p99 {tpot} ms; client lagged "
              f"{lagged}x)")  # fmt: skip
    print(f"recommendation holds: {result['recommendation_holds']}; "
          f"default capacity agrees: {result['default_capacity_agrees']}")  # fmt: skip


if __name__ == "__main__":
    main()
