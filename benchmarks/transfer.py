"""Does a ranking on the built-in engine transfer to real vLLM?

A fixed set of configs (budgets 256-8192, the long-prefill threshold on and off) is measured
for capacity under tpot_p99=30ms on the `mixed` workload twice: on engine_lite in this process
and on real vLLM 0.32, both serving the same weights (the `tiny` preset exported as a Hugging
Face folder). Prints each config's two capacities, the Spearman rank correlation, and the
capacity on vLLM of the built-in engine's pick against vLLM's best in the set.

    .venv/bin/python benchmarks/transfer.py [--vllm-command CMD] [--json]

One vLLM start per config (45-75 s on a 2-core CPU), so a run takes 15-25 minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine_lite.models.export import export_hf_folder
from loadgen import build_workload
from slo import parse_slo
from tuner.measure.meter import LevelSettings, Meter
from tuner.measure.ratesearch import RateSearchSettings
from tuner.settings import MIN_REQUESTS_PER_LEVEL
from tuner.store.records import Mode, rules_for
from tuner.targets.factory import TargetOptions, open_target
from tuner.targets.vllm import VllmOptions, VllmTarget

SLO = "tpot_p99=30ms"
CONFIGS = [
    {"max_num_batched_tokens": 256},
    {"max_num_batched_tokens": 512, "long_prefill_token_threshold": 128},
    {"max_num_batched_tokens": 1024},
    {"max_num_batched_tokens": 2048},
    {"max_num_batched_tokens": 4096, "long_prefill_token_threshold": 512},
    {"max_num_batched_tokens": 8192},
]


def ranks(values: list[float]) -> list[float]:
    """Average ranks (ties share theirs), as Spearman's coefficient takes them."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2
        i = j + 1
    return out


def spearman(a: list[float], b: list[float]) -> float:
    ra, rb = ranks(a), ranks(b)
    ma, mb = sum(ra) / len(ra), sum(rb) / len(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb, strict=True))
    var = (sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb)) ** 0.5
    return cov / var if var else float("nan")


async def capacities(target: Any, configs: list[dict], label: str) -> list[float]:
    facts = target.facts
    wl = build_workload("mixed", num_requests=400, seed=0, max_model_len=facts.max_model_len,
                        vocab_size=facts.vocab_size)  # fmt: skip
    level = LevelSettings(duration_s=8.0, min_requests=MIN_REQUESTS_PER_LEVEL)
    meter = Meter(target, wl.requests, parse_slo(SLO), level,
                  rules_for(Mode.CAPACITY, facts.require_schedule))  # fmt: skip
    out = []
    for knobs in configs:
        await target.apply(target.knobs.complete(knobs))
        search = RateSearchSettings(start_rps=2.0, growth=1.6, rel_tol=0.1, min_rps=0.1)
        result = await meter.capacity(search)
        out.append(result.capacity_rps)
        print(f"{label}: {knobs} -> {result.capacity_rps:.2f} req/s", file=sys.stderr)
    return out


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        folder = export_hf_folder("tiny", Path(tmp) / "tiny")
        builtin = open_target(TargetOptions(model=str(folder)))
        try:
            ours = await capacities(builtin, CONFIGS, "engine_lite")
        finally:
            await builtin.close()
        vllm = VllmTarget(VllmOptions(str(folder), command=args.vllm_command))
        try:
            theirs = await capacities(vllm, CONFIGS, "vLLM")
        finally:
            await vllm.close()
    pick = max(range(len(CONFIGS)), key=lambda i: ours[i])
    best = max(theirs)
    return {
        "slo": SLO, "workload": "mixed",
        "configs": [{"config": c, "engine_lite_rps": o, "vllm_rps": t}
                    for c, o, t in zip(CONFIGS, ours, theirs, strict=True)],
        "spearman": spearman(ours, theirs),
        "engine_lite_pick": CONFIGS[pick], "pick_on_vllm_rps": theirs[pick],
        "vllm_best_rps": best, "pick_vs_best": theirs[pick] / best if best else None,
    }  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vllm-command", help="vLLM server command prefix (default: found)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    result = asyncio.run(main_async(args))
    if args.json:
        print(json.dumps(result, indent=2))
        return
    for row in result["configs"]:
        print(
            f"{json.dumps(row['config']):70} engine_lite {row['engine_lite_rps']:6.2f}  "
            f"vLLM {row['vllm_rps']:6.2f} req/s"
        )
    print(f"Spearman rank correlation: {result['spearman']:.2f}")
    print(
        f"engine_lite's pick on vLLM: {result['pick_on_vllm_rps']:.2f} req/s, "
        f"{result['pick_vs_best']:.0%} of vLLM's best in the set ({result['vllm_best_rps']:.2f})"
    )


if __name__ == "__main__":
    main()
