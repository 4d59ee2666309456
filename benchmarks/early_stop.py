"""What stopping failing levels saves: the same capacity searches with and without it.

On the built-in engine (tiny, `mixed`, tpot_p99=30ms, tune's level size), each config's
capacity search runs twice in a row, once letting failing levels drain and once stopping them
as soon as their SLO is already broken, alternating which goes first; `--rounds` times. Prints
per config the median wall time of each way, their ratio and the capacities each found (the
verdicts are the same by construction: a search that differs did so by the machine's noise).

    .venv/bin/python benchmarks/early_stop.py [--rounds 3] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from loadgen import build_workload
from slo import parse_slo
from tuner.measure.contention import CpuGuard
from tuner.measure.meter import LevelSettings, Meter
from tuner.measure.ratesearch import RateSearchSettings
from tuner.settings import DEFAULT_LEVEL_S, MIN_REQUESTS_PER_LEVEL
from tuner.store.records import Mode, rules_for
from tuner.targets.factory import TargetOptions, open_target

SLO = "tpot_p99=30ms"
CONFIGS = [{}, {"max_num_batched_tokens": 512, "long_prefill_token_threshold": 128}]
SEARCH = RateSearchSettings(start_rps=4.0, growth=1.6, rel_tol=0.1, min_rps=0.1)


async def search(meter: Meter, stop: bool) -> dict[str, Any]:
    result = await dataclasses.replace(meter, stop_failing=stop).capacity(SEARCH)
    return {"wall_s": result.wall_s, "capacity_rps": result.capacity_rps,
            "levels": len(result.levels),
            "stopped": sum(r.level.stopped_s is not None for r in result.levels)}  # fmt: skip


async def main_async(rounds: int) -> dict[str, Any]:
    target = open_target(TargetOptions(model="tiny"))
    facts = target.facts
    wl = build_workload("mixed", num_requests=400, seed=0, max_model_len=facts.max_model_len,
                        vocab_size=facts.vocab_size)  # fmt: skip
    level = LevelSettings(duration_s=DEFAULT_LEVEL_S, min_requests=MIN_REQUESTS_PER_LEVEL)
    meter = Meter(target, wl.requests, parse_slo(SLO), level,
                  rules_for(Mode.CAPACITY, facts.require_schedule),
                  guard=CpuGuard.watching(target))  # fmt: skip
    out = []
    try:
        for knobs in CONFIGS:
            await target.apply(target.knobs.complete(knobs))
            runs: dict[str, list[dict[str, Any]]] = {"drain": [], "stop": []}
            for i in range(rounds):
                for stop in (i % 2 == 1, i % 2 == 0):
                    way = "stop" if stop else "drain"
                    runs[way].append(await search(meter, stop))
                    print(f"{knobs} {way}: {runs[way][-1]}", file=sys.stderr)
            med = {k: statistics.median(r["wall_s"] for r in v) for k, v in runs.items()}
            out.append({"config": knobs, "median_wall_s": med,
                        "stop_over_drain": med["stop"] / med["drain"], "runs": runs})  # fmt: skip
    finally:
        await target.close()
    return {"slo": SLO, "workload": "mixed", "rounds": rounds, "configs": out}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    result = asyncio.run(main_async(args.rounds))
    if args.json:
        print(json.dumps(result, indent=2))
        return
    for row in result["configs"]:
        caps = {k: [r["capacity_rps"] for r in v] for k, v in row["runs"].items()}
        med = row["median_wall_s"]
        print(
            f"{json.dumps(row['config']):60} drain {med['drain']:5.1f} s, stop "
            f"{med['stop']:5.1f} s ({row['stop_over_drain']:.2f}x); capacities {caps}"
        )


if __name__ == "__main__":
    main()
