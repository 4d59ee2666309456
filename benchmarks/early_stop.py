"""What stopping failing levels saves: the same levels with and without it, side by side.

On the built-in engine (tiny, `mixed`, tpot_p99=30ms, tune's level size), the default config
replays each of a fixed set of rates (from under its capacity to about twice it) twice in a
row: once letting a failing level drain, once stopping it as soon as its SLO is already
broken, alternating which goes first; `--rounds` times. A whole capacity search differs
between runs in the rates it measures and in levels the machine's noise made it measure
again, so the comparison is per level. Prints per rate the median wall time of each way,
how often each passed (the verdicts agree by construction, up to the machine's noise) and
how many of the stopping levels stopped.

    .venv/bin/python benchmarks/early_stop.py [--rounds 3] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from loadgen import build_workload
from slo import parse_slo
from tuner.measure.meter import LevelSettings, Meter
from tuner.settings import DEFAULT_LEVEL_S, MIN_REQUESTS_PER_LEVEL
from tuner.store.records import Mode, rules_for
from tuner.targets.factory import TargetOptions, open_target

SLO = "tpot_p99=30ms"
RATES = [4.0, 6.4, 8.0, 10.0, 12.8]


async def main_async(rounds: int) -> dict[str, Any]:
    target = open_target(TargetOptions(model="tiny"))
    facts = target.facts
    wl = build_workload("mixed", num_requests=400, seed=0, max_model_len=facts.max_model_len,
                        vocab_size=facts.vocab_size)  # fmt: skip
    level = LevelSettings(duration_s=DEFAULT_LEVEL_S, min_requests=MIN_REQUESTS_PER_LEVEL)
    meter = Meter(target, wl.requests, parse_slo(SLO), level,
                  rules_for(Mode.CAPACITY, facts.require_schedule))  # fmt: skip
    runs: dict[float, dict[str, list[dict[str, Any]]]] = {r: {"drain": [], "stop": []}
                                                          for r in RATES}  # fmt: skip
    try:
        await target.apply(target.knobs.complete({}))
        for i in range(rounds):
            for rate in RATES:
                for stop in (i % 2 == 1, i % 2 == 0):
                    run = (await meter.level(rate, stop_failing=stop)).level
                    way = "stop" if stop else "drain"
                    runs[rate][way].append({"wall_s": run.wall_s, "passed": run.passed,
                                            "stopped_s": run.stopped_s})  # fmt: skip
                    print(f"{rate} {way}: {runs[rate][way][-1]}", file=sys.stderr)
    finally:
        await target.close()
    rows = []
    for rate, ways in runs.items():
        med = {k: statistics.median(r["wall_s"] for r in v) for k, v in ways.items()}
        rows.append({"rate_rps": rate, "median_wall_s": med,
                     "stop_over_drain": med["stop"] / med["drain"],
                     "passed": {k: sum(r["passed"] for r in v) for k, v in ways.items()},
                     "stopped": sum(r["stopped_s"] is not None for r in ways["stop"]),
                     "runs": ways})  # fmt: skip
    return {"slo": SLO, "workload": "mixed", "config": "default", "rounds": rounds,
            "levels": rows}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    result = asyncio.run(main_async(args.rounds))
    if args.json:
        print(json.dumps(result, indent=2))
        return
    n = result["rounds"]
    for row in result["levels"]:
        med, passed = row["median_wall_s"], row["passed"]
        print(f"{row['rate_rps']:5.1f} req/s: drain {med['drain']:5.1f} s, "
              f"stop {med['stop']:5.1f} s "
              f"({row['stop_over_drain']:.2f}x); passed {passed['drain']}/{n} and "
              f"{passed['stop']}/{n}; stopped {row['stopped']}/{n}")  # fmt: skip


if __name__ == "__main__":
    main()
