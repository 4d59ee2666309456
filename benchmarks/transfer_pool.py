"""Pool several `benchmarks/transfer.py --json` results: medians, and vLLM against itself.

One run measures each config's capacity once per engine, and on a shared 2-core CPU one
capacity search moves by a capacity step or two between runs. So a run's rank correlation says
as much about that run's draw as about the built-in engine. This pools runs of the same
settings: each config's median capacity on each engine, the rank correlation of the medians
(raw, and with each run scaled by its geometric mean, which takes out a machine that ran slower
through a whole run),
the built-in engine's pick on vLLM's medians, and the ceiling any predictor faces: how well one
vLLM run ranks the configs as another vLLM run does (every pair), and as the median of the
other runs does.

    python benchmarks/transfer_pool.py RUN.json [RUN.json ...] [--vllm-only OLD.json ...] [--json]

`--vllm-only` adds runs whose vLLM side joins the pool while their engine_lite side, measured
on older code, does not.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from transfer import spearman

SAME = ("slo", "workload", "min_requests_per_level", "dtype")


def load(paths: list[Path]) -> list[dict[str, Any]]:
    runs = []
    for path in paths:
        try:
            run = json.loads(path.read_text())
            run["configs"][0]["vllm_rps"]
        except (OSError, ValueError, KeyError, IndexError, TypeError) as exc:
            raise SystemExit(
                f"{path}: not a transfer.py --json result ({exc}); rerun it with --json"
            ) from None
        run["path"] = str(path)
        runs.append(run)
    first = runs[0]
    for run in runs[1:]:
        for key in (*SAME, "configs"):
            mine, theirs = _setting(run, key), _setting(first, key)
            if mine != theirs:
                raise SystemExit(
                    f"{run['path']}: {key} differs from {first['path']} ({mine!r} against "
                    f"{theirs!r}); pool runs of one setting"
                )
    return runs


def _setting(run: dict[str, Any], key: str) -> Any:
    return [c["config"] for c in run["configs"]] if key == "configs" else run[key]


def column(runs: list[dict[str, Any]], key: str) -> list[list[float]]:
    return [[c[key] for c in run["configs"]] for run in runs]


def medians(rows: list[list[float]]) -> list[float]:
    return [statistics.median(values) for values in zip(*rows, strict=True)]


def relative(rows: list[list[float]]) -> list[list[float]]:
    """Each run's capacities over that run's geometric mean. The machine's speed drifts between
    runs (three runs in a row read every built-in config 20-70% lower in the last than in the
    first), and a raw median then takes each config from whichever run was in the middle."""
    out = []
    for row in rows:
        scale = math.exp(statistics.mean(math.log(max(x, 1e-9)) for x in row))
        out.append([x / scale for x in row])
    return out


def pool(runs: list[dict[str, Any]], vllm_only: list[dict[str, Any]]) -> dict[str, Any]:
    ours, theirs = column(runs, "engine_lite_rps"), column(runs + vllm_only, "vllm_rps")
    ours_med, theirs_med = medians(ours), medians(theirs)
    theirs_rel = medians(relative(theirs))
    pick = max(range(len(ours_med)), key=lambda i: ours_med[i])
    pairs = [spearman(a, b) for a, b in itertools.combinations(theirs, 2)]
    leave_one_out = [spearman(run, medians(theirs[:i] + theirs[i + 1 :]))
                     for i, run in enumerate(theirs)] if len(theirs) > 2 else []  # fmt: skip
    configs = [c["config"] for c in runs[0]["configs"]]
    rows = []
    for i, config in enumerate(configs):
        spread = [run[i] for run in theirs]
        rows.append({"config": config, "engine_lite_median_rps": ours_med[i],
                     "vllm_median_rps": theirs_med[i],
                     "vllm_range_rps": [min(spread), max(spread)]})  # fmt: skip
    own = {"pairs": pairs, "median_pair": statistics.median(pairs) if pairs else None,
           "each_vs_median_of_others": leave_one_out}  # fmt: skip
    return {
        "runs": [r["path"] for r in runs],
        "vllm_only_runs": [r["path"] for r in vllm_only],
        **{key: runs[0][key] for key in SAME},
        "configs": rows,
        "spearman_of_medians": spearman(ours_med, theirs_med),
        "spearman_of_relative_medians": spearman(medians(relative(ours)), theirs_rel),
        "spearman_per_run": [r["spearman"] for r in runs],
        "engine_lite_pick": configs[pick],
        "pick_vs_best_median": theirs_med[pick] / max(theirs_med),
        "pick_vs_best_relative_median": theirs_rel[pick] / max(theirs_rel),
        "vllm_vs_vllm": own,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", type=Path, help="transfer.py --json results")
    p.add_argument("--vllm-only", nargs="*", type=Path, default=[],
                   help="results whose vLLM side alone joins the pool")  # fmt: skip
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    runs = load([*args.runs, *args.vllm_only])
    result = pool(runs[: len(args.runs)], runs[len(args.runs) :])
    if args.json:
        print(json.dumps(result, indent=2))
        return
    n_ours, n_theirs = len(args.runs), len(args.runs) + len(args.vllm_only)
    print(f"medians of {n_ours} engine_lite and {n_theirs} vLLM runs, req/s under {result['slo']}")
    for row in result["configs"]:
        low, high = row["vllm_range_rps"]
        print(f"{json.dumps(row['config']):70} engine_lite {row['engine_lite_median_rps']:6.2f}  "
              f"vLLM {row['vllm_median_rps']:6.2f} ({low:.2f}-{high:.2f})")  # fmt: skip
    per_run = ", ".join(f"{s:.2f}" for s in result["spearman_per_run"])
    print(f"Spearman of the medians: {result['spearman_of_medians']:.2f}, of the medians relative "
          f"to each run's mean: {result['spearman_of_relative_medians']:.2f} "
          f"(each run: {per_run})")  # fmt: skip
    print(f"engine_lite's pick {json.dumps(result['engine_lite_pick'])}: "
          f"{result['pick_vs_best_median']:.0%} of vLLM's best median, "
          f"{result['pick_vs_best_relative_median']:.0%} relative to each run's mean")  # fmt: skip
    own = result["vllm_vs_vllm"]
    if own["pairs"]:
        pairs = ", ".join(f"{s:.2f}" for s in own["pairs"])
        print(f"vLLM against itself, every pair of runs: {pairs} (median {own['median_pair']:.2f})")
    if own["each_vs_median_of_others"]:
        loo = ", ".join(f"{s:.2f}" for s in own["each_vs_median_of_others"])
        print(f"each vLLM run against the median of the others: {loo}")


if __name__ == "__main__":
    main()
