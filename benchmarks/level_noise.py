"""How many requests must a load level hold before its p99 says more about the config than
about the arrival draw?

A level's TPOT p99 over n requests is close to its worst request's when n is small, and which
request is worst depends on where the long prompts happened to land. This benchmark measures
that noise where nothing else adds any: in virtual time, on the simulator fitted to the target
(a `tune profile` file), so every difference below comes from the draw alone.

For each way a level draws its requests (`--mix`: one of each prompt-length stratum, or a
contiguous stretch of the list), each level size n and each config, it runs one capacity search
per draw (each with its own arrival seed), then prints the spread of the capacities across
draws, and how often a single draw ranks the two configs the way the median of all draws does.
`--list-size 400` draws from a list as long as tune's; by default each draw has its own
requests.

    .venv/bin/python benchmarks/level_noise.py [--profile FILE] [--list-size N] [--json]

The default profile is the CPU sim gate's (`results/baselines/cpu-tiny.profile.json`); any
`tune profile` file of the built-in engine will do.
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
from tuner.bench.sim import SuiteProfile
from tuner.measure.draws import LevelMix
from tuner.measure.meter import LevelSettings, Meter
from tuner.measure.ratesearch import RateSearchSettings
from tuner.sim.profile import Profile
from tuner.store.records import Mode, rules_for

DEFAULT_PROFILE = Path(__file__).resolve().parents[1] / "results/baselines/cpu-tiny.profile.json"
SLO = "tpot_p99=30ms"
SIZES = (40, 80, 160, 320, 640)
CONFIGS = {
    "default 2048": {"max_num_batched_tokens": 2048},
    "512 / 128": {"max_num_batched_tokens": 512, "long_prefill_token_threshold": 128},
}


def search(start_rps: float) -> RateSearchSettings:
    return RateSearchSettings(start_rps=start_rps, growth=1.6, rel_tol=0.02,
                              min_rps=start_rps / 64, max_levels=24)  # fmt: skip


async def measure(path: Path, sizes: list[int], draws: int, workload: str,
                  mixes: list[str], list_size: int) -> dict[str, Any]:  # fmt: skip
    profile = Profile.load(path)
    target = SuiteProfile(path, profile, "").target()
    knobs = target.knobs
    rows = []
    for mix in mixes:
        for n in sizes:
            wl = build_workload(workload, num_requests=list_size or n * draws, seed=0,
                                max_model_len=profile.shape.max_model_len)  # fmt: skip
            # A level of exactly n requests, whatever its rate: the size is what is measured.
            level = LevelSettings(duration_s=1e-9, min_requests=n, mix=LevelMix(mix))
            meter = Meter(target, wl.requests, parse_slo(SLO), level,
                          rules_for(Mode.CAPACITY, require_schedule=False))  # fmt: skip
            caps: dict[str, list[float]] = {}
            for name, config in CONFIGS.items():
                await target.apply(knobs.complete(config))
                caps[name] = [(await meter.capacity(search(4.0), draw=d)).capacity_rps
                              for d in range(draws)]  # fmt: skip
            a, b = (caps[name] for name in CONFIGS)
            truth = statistics.median(a) > statistics.median(b)
            agree = sum((x > y) == truth for x, y in zip(a, b, strict=True)) / draws
            rows.append({"mix": mix, "requests_per_level": n, "agree_with_median_ranking": agree,
                         **{name: _spread(c) for name, c in caps.items()}})  # fmt: skip
            print(json.dumps(rows[-1]), file=sys.stderr)
    return {"profile": f"{profile.engine} on {profile.device}", "workload": workload,
            "slo": SLO, "draws": draws, "list_size": list_size or None, "rows": rows}  # fmt: skip


def _spread(values: list[float]) -> dict[str, float]:
    med = statistics.median(values)
    q1, _, q3 = statistics.quantiles(values, n=4)
    # The interquartile range is what a typical draw moves; a single lucky draw moves the cv.
    return {"min_rps": min(values), "median_rps": med, "max_rps": max(values),
            "cv": statistics.pstdev(values) / med if med else float("nan"),
            "iqr_rel": (q3 - q1) / med if med else float("nan")}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--profile", default=str(DEFAULT_PROFILE), help="a `tune profile` file")
    p.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    p.add_argument("--draws", type=int, default=20)
    p.add_argument("--workload", default="mixed")
    mixes = [m.value for m in LevelMix]
    p.add_argument("--mix", nargs="+", default=mixes, choices=mixes, help="how levels draw")
    p.add_argument("--list-size", type=int, default=0,
                   help="requests in the list (tune: 400); 0: the draws, disjoint")  # fmt: skip
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    result = asyncio.run(measure(Path(args.profile), args.sizes, args.draws, args.workload,
                                 args.mix, args.list_size))  # fmt: skip
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"{result['profile']}, {args.workload}, {SLO}, {args.draws} draws per size")
    names = list(CONFIGS)
    print(f"{'draw':>10}  {'requests':>8}  " + "  ".join(f"{n:>32}" for n in names)
          + "  same ranking")  # fmt: skip
    for row in result["rows"]:
        cells = [f"{row[n]['min_rps']:5.2f}-{row[n]['max_rps']:5.2f} cv {row[n]['cv']:4.0%} "
                 f"iqr {row[n]['iqr_rel']:4.0%}" for n in names]  # fmt: skip
        print(f"{row['mix']:>10}  {row['requests_per_level']:>8}  "
              + "  ".join(f"{c:>32}" for c in cells)
              + f"  {row['agree_with_median_ranking']:>11.0%}")  # fmt: skip


if __name__ == "__main__":
    main()
