"""Are two `tune --engine vllm` recommendations as good as each other? Measured side by side.

Two runs minutes apart read the same vLLM config's capacity differently: the default's went
12.75, 13.78 and 15.27 req/s in three runs on one 2-core VM, so one run's recommended capacity
against another's mixes the configs with the machine's drift. This benchmark takes each run's
recommendation and the default, and measures every config's capacity again with `tune`'s own
meter (the same levels, verdicts and CPU guard), on a fresh vLLM start each, in interleaved
rounds (A, B, default, A, B, default, ...), so drift falls on every config alike. It prints
each config's capacity per round, the median, and each median over the default's and over the
first run's recommendation.

    .venv/bin/python benchmarks/vllm_side_by_side.py RUN_DIR [RUN_DIR ...] --vllm-folder DIR
        [--vllm-command CMD] [--rounds 2] [--json]

Each config's search starts at the capacity its run reported and converges to 10%; a config
costs a start (45-75 s) and 3-5 levels of at least the run's requests: two runs and the
default in 2 rounds took 12 min 19 s on a 2-core VM.
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
from transfer import SLO, search_from

from slo import parse_slo
from tuner.measure.contention import CpuGuard
from tuner.measure.meter import Meter
from tuner.measure.verdict import LevelVerdict
from tuner.settings import TuneSettings
from tuner.store.records import Mode, rules_for
from tuner.store.runfiles import RunFiles
from tuner.targets.vllm import VllmOptions, VllmTarget


def configs_of(run_dirs: list[str]) -> list[dict[str, Any]]:
    """Each run's recommended config (as its report tells the reader to run it) and the
    default, once each, with the capacity the run reported as the search's start. The runs
    must have replayed one workload (else a one-line exit)."""
    out: dict[str, dict[str, Any]] = {}
    workloads = set()
    for run_dir in run_dirs:
        path = Path(run_dir) / "recommendation.json"
        if not path.is_file():
            raise SystemExit(f"{run_dir} holds no recommendation.json; pass a finished run's dir")
        rec = json.loads(path.read_text())
        if rec["slo"] != SLO or rec["workload"]["name"] != "mixed":
            raise SystemExit(f"{run_dir} tuned {rec['workload']['name']} under {rec['slo']}; "
                             f"this benchmark measures mixed under {SLO}")  # fmt: skip
        workloads.add(json.dumps(rec["workload"], sort_keys=True))
        pick = rec.get("recommended") or rec["best"]
        for label, entry in (("default", rec["default"]), (Path(run_dir).name, pick)):
            key = json.dumps(entry["config"], sort_keys=True)
            out.setdefault(key, {"label": label, "config": entry["config"],
                                 "reported_rps": entry["capacity_rps"]})  # fmt: skip
    if len(workloads) > 1:
        raise SystemExit("the runs replayed different workloads (seed, size or level settings); "
                         "pass runs of one `tune` command line")  # fmt: skip
    return sorted(out.values(), key=lambda c: c["label"] == "default")


def meter_for(target: VllmTarget, run_dir: str) -> Meter:
    """The meter `tune` measured the run with: its request list, levels and verdicts."""
    settings = TuneSettings.from_json(RunFiles(Path(run_dir)).read_run_info()["settings"])
    facts = target.facts
    requests = settings.request_list(facts).requests
    return Meter(target, requests, parse_slo(SLO), settings.level_settings(),
                 rules_for(Mode.CAPACITY, facts.require_schedule),
                 guard=CpuGuard.watching(target))  # fmt: skip


async def measure(args: argparse.Namespace, configs: list[dict[str, Any]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        target = VllmTarget(VllmOptions(args.vllm_folder, command=args.vllm_command,
                                        log_dir=Path(tmp) / "logs"))  # fmt: skip
        try:
            meter = meter_for(target, args.run_dirs[0])
            for round_ in range(args.rounds):
                for c in configs:
                    await target.apply(target.knobs.complete(c["config"]))
                    result = await meter.capacity(search_from(c["reported_rps"], first=False))
                    c.setdefault("capacities_rps", []).append(result.capacity_rps)
                    c.setdefault("levels", []).append([described(r.level.verdict)
                                                       for r in result.levels])  # fmt: skip
                    print(f"round {round_ + 1}: {c['label']} -> {result.capacity_rps:.2f} req/s",
                          file=sys.stderr)  # fmt: skip
        finally:
            await target.close()


def described(v: LevelVerdict) -> dict[str, Any]:
    """A level as the search judged it: what bound a config shows in which rule failed (TPOT,
    or completions falling behind arrivals, the CPU's ceiling on small budgets)."""
    return {
        "rate_rps": v.rate_rps,
        "passed": v.passed,
        "tpot_p99_ms": v.terms[0].value_s * 1e3,
        "served_fraction": v.served_fraction,
    }


def summary(configs: list[dict[str, Any]]) -> dict[str, Any]:
    for c in configs:
        c["median_rps"] = statistics.median(c["capacities_rps"])
    default = next(c for c in configs if c["label"] == "default")["median_rps"]
    first = configs[0]["median_rps"]
    for c in configs:
        c["vs_default"] = c["median_rps"] / default if default else None
        c["vs_first"] = c["median_rps"] / first if first else None
    return {"slo": SLO, "configs": configs}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run_dirs", nargs="+")
    p.add_argument("--vllm-folder", required=True, help="the model folder the runs served")
    p.add_argument("--vllm-command", help="vLLM server command prefix")
    p.add_argument("--rounds", type=int, default=2, help="capacity searches per config")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    if args.rounds < 1:
        raise SystemExit(f"--rounds {args.rounds} measures nothing; use 1 or more")
    configs = configs_of(args.run_dirs)
    asyncio.run(measure(args, configs))
    result = summary(configs)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    for c in result["configs"]:
        runs = ", ".join(f"{x:.2f}" for x in c["capacities_rps"])
        print(f"{c['label']:12s} {json.dumps(c['config'])}\n    reported {c['reported_rps']:.2f}, "
              f"measured {runs}: median {c['median_rps']:.2f} req/s, {c['vs_default']:.2f}x "
              f"the default, {c['vs_first']:.2f}x {result['configs'][0]['label']}")  # fmt: skip


if __name__ == "__main__":
    main()
