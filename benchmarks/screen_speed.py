"""Screening a default run's grid in virtual time: one process against several.

The CPU sim gate's profile of the built-in engine (`results/baselines/cpu-tiny.profile.json`),
`mixed`, tpot_p99=30ms, and the grid `tune` screens first (every budget, then every threshold
option at the three best). Rounds alternate the worker counts; each prints its wall time, and
the end prints the medians, their ratio, and whether every config got the same capacity both
ways (it must: the split into chains, not the number of processes, sets each search's start).

    python benchmarks/screen_speed.py [--rounds 3] [--workers 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
from pathlib import Path

from loadgen import build_workload
from slo import parse_slo
from tuner.bench.sim import SuiteProfile
from tuner.measure.meter import LevelSettings, Meter
from tuner.search.space import SpaceFacts, build_space
from tuner.sim.profile import Profile
from tuner.sim.screen import screen_space
from tuner.store.records import Mode, rules_for

PROFILE = Path(__file__).resolve().parents[1] / "results/baselines/cpu-tiny.profile.json"


def setup(workload: str):
    profile = Profile.load(PROFILE)
    target = SuiteProfile(PROFILE, profile, "").target()
    wl = build_workload(workload, num_requests=400, seed=0,
                        max_model_len=profile.shape.max_model_len)  # fmt: skip
    rules = rules_for(Mode.CAPACITY, require_schedule=False)
    meter = Meter(target, wl.requests, parse_slo("tpot_p99=30ms"), LevelSettings(duration_s=8.0),
                  rules)  # fmt: skip
    longest = max(r.prompt_len for r in wl.requests)
    facts = SpaceFacts(profile.shape.block_size, profile.shape.max_model_len, longest)
    return target, meter, build_space(target.knobs, facts)


async def one_round(workload: str, workers: int) -> tuple[float, list[tuple[str, float]]]:
    target, meter, space = setup(workload)
    screening = await screen_space(target, meter, space, 6.0, workers=workers)
    figures = sorted((json.dumps(s.knobs, sort_keys=True, default=str), s.capacity_rps)
                     for s in screening.ranked)  # fmt: skip
    return screening.wall_s, figures


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--workload", default="mixed")
    args = ap.parse_args()
    walls: dict[int, list[float]] = {1: [], args.workers: []}
    figures: dict[int, list] = {}
    for r in range(args.rounds):
        order = (1, args.workers) if r % 2 == 0 else (args.workers, 1)
        for workers in order:
            wall, figs = asyncio.run(one_round(args.workload, workers))
            walls[workers].append(wall)
            figures.setdefault(workers, figs)
            print(f"round {r + 1}: {workers} process(es) {wall:.1f} s, {len(figs)} configs")
    one, many = statistics.median(walls[1]), statistics.median(walls[args.workers])
    same = figures[1] == figures[args.workers]
    print(f"median: 1 process {one:.1f} s, {args.workers} processes {many:.1f} s "
          f"({one / many:.2f}x); identical capacities: {same}")  # fmt: skip


if __name__ == "__main__":
    main()
