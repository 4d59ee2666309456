"""Does vLLM's capacity keep rising as the token budget falls? Budgets measured side by side.

`tune` searches budgets from 256 (or `max_num_seqs`, where larger), and its recommendations on
vLLM sit near that edge. This benchmark measures budgets below and at it, and the default, on
real vLLM 0.32 serving a folder, each on a fresh start, in interleaved rounds (all budgets,
then all again) so the machine's drift falls on every config alike. It uses `tune`'s meter:
the `mixed` workload, `tpot_p99=30ms`, levels of at least `--min-requests` requests, the CPU
guard. For each config it prints the capacity of every round, their median, the median over
the default's, and what failed the levels above it: TPOT p99 (`slo`) or the server falling
behind its arrivals (`queue`, the keep-up rule), the throughput ceiling no knob moves.

    .venv/bin/python benchmarks/vllm_budgets.py --vllm-folder DIR [--budgets 128,192,256]
        [--rounds 2] [--min-requests 320] [--vllm-command CMD] [--json]

Each config of each round is a vLLM start (45-75 s on a 2-core CPU) and 4-6 levels: four
configs in two rounds took about 25 minutes (`benchmarks/results/vllm_small_budgets_2.json`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from transfer import SLO, meter_for, search_from
from vllm_side_by_side import described

from tuner.measure.verdict import LevelVerdict
from tuner.settings import MIN_REQUESTS_PER_LEVEL_VLLM
from tuner.targets.vllm import VllmOptions, VllmTarget

# Every search starts here (and climbs by 1.3x), whatever the order: a config's figure does not
# hang on the one measured before it.
START_RPS = 15.0


def parse_budgets(text: str, max_num_seqs: int) -> list[int]:
    """`128,192,256` as budgets; each a whole number vLLM accepts (not below max_num_seqs)."""
    budgets = []
    for item in text.split(","):
        try:
            budget = int(item)
        except ValueError:
            raise SystemExit(f"--budgets: {item!r} is not a whole number; write e.g. "
                             "--budgets 128,192,256") from None  # fmt: skip
        if budget < max_num_seqs:
            raise SystemExit(f"--budgets: {budget} is below max_num_seqs ({max_num_seqs}), "
                             f"which vLLM refuses; use {max_num_seqs} or more")  # fmt: skip
        budgets.append(budget)
    return budgets


def level_row(v: LevelVerdict) -> dict[str, Any]:
    """A level as `vllm_side_by_side` describes it, and which rule failed it."""
    failure = v.failure()
    return {**described(v), "failure": None if failure is None else failure.value}


def summary(configs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians, each over the default's, and what failed each config's levels."""
    for c in configs:
        c["median_rps"] = statistics.median(c["capacities_rps"])
        failed = [lv["failure"] for r in c["levels"] for lv in r if lv["failure"]]
        c["failures"] = {name: failed.count(name) for name in sorted(set(failed))}
    default = next(c for c in configs if c["label"] == "default")["median_rps"]
    for c in configs:
        c["vs_default"] = c["median_rps"] / default if default else None
    return {"slo": SLO, "workload": "mixed", "configs": configs}


async def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as tmp:
        target = VllmTarget(VllmOptions(args.vllm_folder, command=args.vllm_command,
                                        log_dir=Path(tmp) / "logs"))  # fmt: skip
        try:
            default = target.knobs.defaults
            budgets = parse_budgets(args.budgets, int(default["max_num_seqs"]))
            configs = [{"label": str(b), "config": {"max_num_batched_tokens": b}} for b in budgets]
            configs.append({"label": "default", "config": {}})
            meter = meter_for(target, args.min_requests)
            for round_ in range(args.rounds):
                for c in configs:
                    await target.apply(target.knobs.complete(c["config"]))
                    found = await meter.capacity(search_from(START_RPS, first=False))
                    c.setdefault("capacities_rps", []).append(found.capacity_rps or 0.0)
                    c.setdefault("levels", []).append([level_row(r.level.verdict)
                                                       for r in found.levels])  # fmt: skip
                    print(f"round {round_ + 1}: {c['label']} -> {found.capacity_rps or 0:.2f} "
                          "req/s", file=sys.stderr)  # fmt: skip
        finally:
            await target.close()
    return configs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vllm-folder", required=True, help="the Hugging Face folder vLLM serves")
    p.add_argument("--vllm-command", help="vLLM server command prefix (default: found)")
    p.add_argument("--budgets", default="128,192,256", help="budgets besides the default")
    p.add_argument("--rounds", type=int, default=2, help="capacity searches per config")
    p.add_argument(
        "--min-requests",
        type=int,
        default=MIN_REQUESTS_PER_LEVEL_VLLM,
        help="requests a level holds at least (default: tune's with --engine vllm)",
    )
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    if args.rounds < 1:
        raise SystemExit(f"--rounds {args.rounds} measures nothing; use 1 or more")
    parse_budgets(args.budgets, 1)  # a typo ends here, before vLLM starts
    result = summary(asyncio.run(measure(args)))
    if args.json:
        print(json.dumps(result, indent=2))
        return
    for c in result["configs"]:
        runs = ", ".join(f"{x:.2f}" for x in c["capacities_rps"])
        print(
            f"{c['label']:>8}: {runs} req/s, median {c['median_rps']:.2f} "
            f"({c['vs_default']:.2f}x the default); levels failed by {c['failures']}"
        )


if __name__ == "__main__":
    main()
