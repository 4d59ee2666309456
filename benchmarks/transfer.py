"""Does a ranking on the built-in engine transfer to real vLLM?

A fixed set of configs (budgets 256-8192, the long-prefill threshold on and off) is measured
for capacity under tpot_p99=30ms on the `mixed` workload twice: on engine_lite in this process
and on real vLLM 0.32, both serving the same weights (the `tiny` preset exported as a Hugging
Face folder). Prints each config's two capacities, the Spearman rank correlation, and the
capacity on vLLM of the built-in engine's pick against vLLM's best in the set.

It also ranks the set as `tune --engine vllm` screens it: a simulator fitted on the vLLM
default's own levels (from what the clients saw, tuner/sim/read_back.py), with the same
correlation and pick figures for it.

Every level holds at least `--min-requests` requests (default: as `tune --engine vllm`), on
both engines, so both rankings rest on p99s of the same sample size. Both run the weights in
one `--dtype`: bfloat16 by default, what vLLM 0.32 runs a float32 checkpoint in on a CPU. The
built-in engine's own CPU default is float32, which on a CPU with AMX ran its steps 1.7x
slower than bfloat16 (2.5x for the longest prefills), so in float32 it weighs a prefill chunk
against decodes differently from vLLM.

    .venv/bin/python benchmarks/transfer.py [--vllm-command CMD] [--min-requests N]
        [--dtype bfloat16|float32] [--json]

One vLLM start per config (45-75 s on a 2-core CPU). With 320-request levels a run took about
45 minutes (`--min-requests 320`, as `benchmarks/results/transfer_mixed_bf16.json` was
measured); with the default 640, tune's, 87 minutes, 61 of them on engine_lite
(`benchmarks/results/transfer_mixed_bf16_640.json`). Since a serving engine_lite leaves a core
to the serving path as vLLM does, 35 minutes at 320
(`benchmarks/results/transfer_mixed_bf16_320_cpu_threads.json`).

One run is one draw: `benchmarks/transfer_pool.py` pools several runs' `--json` results into
medians, and scores vLLM's runs against each other.
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
from tuner.measure.contention import CpuGuard
from tuner.measure.meter import LevelSettings, Meter
from tuner.measure.ratesearch import RateSearchSettings
from tuner.search import fidelity
from tuner.settings import MIN_REQUESTS_PER_LEVEL_VLLM
from tuner.sim.calibrate import RealLevel
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


DEFAULT = 3  # CONFIGS[3]: 2048, vLLM 0.32's CPU default


def meter_for(target: Any, min_requests: int) -> Meter:
    facts = target.facts
    wl = build_workload(
        "mixed",
        num_requests=3 * min_requests,
        seed=0,
        max_model_len=facts.max_model_len,
        vocab_size=facts.vocab_size,
    )
    level = LevelSettings(duration_s=8.0, min_requests=min_requests)
    rules = rules_for(Mode.CAPACITY, facts.require_schedule)
    guard = CpuGuard.watching(target)
    return Meter(target, wl.requests, parse_slo(SLO), level, rules, guard=guard)


def search_from(start_rps: float, first: bool) -> RateSearchSettings:
    # The first search climbs from a guess; later ones start at the previous config's
    # capacity (neighbouring configs are close), since a slow level of 640 requests is long.
    return RateSearchSettings(
        start_rps=start_rps, growth=1.6 if first else 1.3, rel_tol=0.1, min_rps=0.1
    )


async def capacities(
    target: Any, meter: Meter, configs: list[dict], label: str, start_rps: float = 6.0
) -> tuple[list[float], list[RealLevel]]:
    """Each config's capacity, and the default's levels (what tune fits vLLM's simulator on)."""
    out, default_levels = [], []
    for i, knobs in enumerate(configs):
        complete = target.knobs.complete(knobs)
        await target.apply(complete)
        result = await meter.capacity(search_from(start_rps, first=i == 0))
        out.append(result.capacity_rps)
        if i == DEFAULT:
            default_levels = [
                RealLevel(complete, r.level.rate_rps, r.records)
                for r in result.levels
                if r.level.verdict.schedule_ok
            ]
        start_rps = result.capacity_rps or start_rps
        print(f"{label}: {knobs} -> {result.capacity_rps:.2f} req/s", file=sys.stderr)
    return out, default_levels


async def simulated(
    target: Any, meter: Meter, levels: list[RealLevel], start_rps: float
) -> tuple[list[float], str]:
    """The set ranked by the simulator fitted on the default's vLLM levels, as tune screens."""
    sim = fidelity.Simulator.for_target(target, None)
    if sim is None or not await sim.fit(meter, levels):
        raise SystemExit("too few vLLM requests to fit the simulator on")
    out = []
    for i, knobs in enumerate(CONFIGS):
        await sim.sim.apply(target.knobs.complete(knobs))
        out.append((await sim.meter.capacity(search_from(start_rps, i == 0))).capacity_rps)
    return out, sim.source


def picked(values: list[float], vllm: list[float]) -> dict[str, Any]:
    pick, best = max(range(len(CONFIGS)), key=lambda i: values[i]), max(vllm)
    return {"pick": CONFIGS[pick], "pick_on_vllm_rps": vllm[pick],
            "pick_vs_best": vllm[pick] / best if best else None,
            "spearman": spearman(values, vllm)}  # fmt: skip


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        folder = export_hf_folder("tiny", Path(tmp) / "tiny")
        builtin = open_target(TargetOptions(model=str(folder), engine={"dtype": args.dtype}))
        try:
            ours, _ = await capacities(builtin, meter_for(builtin, args.min_requests), CONFIGS,
                                       "engine_lite")  # fmt: skip
        finally:
            await builtin.close()
        vllm = VllmTarget(VllmOptions(str(folder), command=args.vllm_command,
                                      log_dir=Path(tmp) / "logs", dtype=args.dtype))  # fmt: skip
        try:
            meter = meter_for(vllm, args.min_requests)
            theirs, levels = await capacities(vllm, meter, CONFIGS, "vLLM")
            sim, source = await simulated(vllm, meter, levels, theirs[DEFAULT] or 6.0)
        finally:
            await vllm.close()
    builtin_pick, sim_pick = picked(ours, theirs), picked(sim, theirs)
    return {
        "slo": SLO, "workload": "mixed", "min_requests_per_level": args.min_requests,
        "dtype": args.dtype,
        "configs": [{"config": c, "engine_lite_rps": o, "vllm_rps": t, "vllm_sim_rps": v}
                    for c, o, t, v in zip(CONFIGS, ours, theirs, sim, strict=True)],
        "spearman": builtin_pick["spearman"], "engine_lite_pick": builtin_pick["pick"],
        "pick_on_vllm_rps": builtin_pick["pick_on_vllm_rps"], "vllm_best_rps": max(theirs),
        "pick_vs_best": builtin_pick["pick_vs_best"],
        "vllm_sim": {"fit": source, **sim_pick},
    }  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vllm-command", help="vLLM server command prefix (default: found)")
    p.add_argument(
        "--min-requests",
        type=int,
        default=MIN_REQUESTS_PER_LEVEL_VLLM,
        help="requests a level holds at least, on both engines (default: tune's "
        "with --engine vllm)",
    )
    p.add_argument(
        "--dtype",
        choices=("bfloat16", "float32"),
        default="bfloat16",
        help="the dtype both engines run the weights in (default: vLLM's on a CPU)",
    )
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    result = asyncio.run(main_async(args))
    if args.json:
        print(json.dumps(result, indent=2))
        return
    for row in result["configs"]:
        print(
            f"{json.dumps(row['config']):70} engine_lite {row['engine_lite_rps']:6.2f}  "
            f"vLLM {row['vllm_rps']:6.2f}  vLLM-fitted sim {row['vllm_sim_rps']:6.2f} req/s"
        )
    print(f"Spearman rank correlation: {result['spearman']:.2f}")
    print(
        f"engine_lite's pick on vLLM: {result['pick_on_vllm_rps']:.2f} req/s, "
        f"{result['pick_vs_best']:.0%} of vLLM's best in the set ({result['vllm_best_rps']:.2f})"
    )
    sim = result["vllm_sim"]
    print(
        f"vLLM-fitted simulator ({sim['fit']}): Spearman {sim['spearman']:.2f}, its pick on "
        f"vLLM {sim['pick_on_vllm_rps']:.2f} req/s, {sim['pick_vs_best']:.0%} of the best"
    )


if __name__ == "__main__":
    main()
