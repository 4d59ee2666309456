"""Does the `tune bench` gate cry wolf, and does it catch a real slowdown?

Records a baseline for a suite, then runs the gate N times on the unchanged suite (every exit 1
is a false alarm) and N times with one config swapped for a slower one (every exit 0 is a
missed regression). Each run is a fresh `tune bench` process, as in CI. Prints one JSON object.

    python benchmarks/bench_gate.py --suite results/baselines/cpu-tiny.toml --runs 10 \\
        --config chunked-512 --slow-knobs max_num_seqs=46

Pick --slow-knobs so that the config is about 20% worse in the gated figure (the script prints
the measured drop of each slowed run, so the size of the slowdown is on record too).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def _bench(suite: Path, baseline: Path, *extra: str) -> tuple[int, dict]:
    cmd = [sys.executable, "-m", "tuner.bench.cli", "--suite", str(suite), "--baseline",
           str(baseline), "--json", *extra]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode == 2:
        raise SystemExit(f"tune bench could not run: {proc.stderr.strip()[-500:]}")
    return proc.returncode, json.loads(proc.stdout)


def _slowed_suite(text: str, config: str, knobs: dict[str, int]) -> str:
    """The suite with extra knob lines added to one [[config]] table."""
    pattern = re.compile(rf'(\[\[config\]\]\s*\nname\s*=\s*"{re.escape(config)}"\s*\n)')
    if not pattern.search(text):
        raise SystemExit(f"suite has no [[config]] named {config!r}")
    lines = "".join(f"{k} = {v}\n" for k, v in knobs.items())
    return pattern.sub(lambda m: m.group(1) + lines, text, count=1)


def _run(code: int, result: dict, config: str) -> dict:
    """One gate run: its exit code, and for `config` each gated figure's measured change
    (current / baseline - 1) with the 95% interval the verdict is made on."""
    mine = {r["figure"]: r["comparison"] for r in result["rows"]
            if r["config"] == config and r["comparison"] is not None}  # fmt: skip
    return {
        "exit": code,
        "changes": {f: round(c["change_frac"], 4) for f, c in mine.items()},
        "intervals": {
            f: [round(c["change_lo"], 4), round(c["change_hi"], 4)] for f, c in mine.items()
        },
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--suite", default="results/baselines/cpu-tiny.toml")
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--config", default="chunked-512", help="the config to slow down")
    p.add_argument("--slow-knobs", default="max_num_seqs=46", help="k=v,... added to --config")
    p.add_argument(
        "--slowed-only",
        action="store_true",
        help="skip the unchanged runs (when only the size of the slowdown changed)",
    )
    args = p.parse_args()
    knobs = {k: int(v) for k, v in (kv.split("=") for kv in args.slow_knobs.split(","))}
    suite = Path(args.suite)
    with tempfile.TemporaryDirectory() as tmp:
        baseline = Path(tmp) / "baseline.json"
        _bench(suite, baseline, "--update-baseline")
        slowed = Path(tmp) / "slowed.toml"
        slowed.write_text(_slowed_suite(suite.read_text(), args.config, knobs))
        unchanged, slowed_runs = [], []
        for i in range(args.runs):
            if not args.slowed_only:
                code, res = _bench(suite, baseline)
                unchanged.append(_run(code, res, args.config))
            code, res = _bench(slowed, baseline)
            slowed_runs.append(_run(code, res, args.config))
            before = f"unchanged exit {unchanged[-1]['exit']}, " if unchanged else ""
            print(f"run {i + 1}: {before}slowed exit {code}", file=sys.stderr)
    figures = sorted({f for r in slowed_runs for f in r["changes"]})
    median_change = {
        f: statistics.median(r["changes"][f] for r in slowed_runs if f in r["changes"])
        for f in figures
    }
    print(json.dumps({
        "suite": str(suite),
        "runs": args.runs,
        "slow_knobs": knobs,
        "false_alarms": sum(r["exit"] == 1 for r in unchanged) if unchanged else None,
        "caught": sum(r["exit"] == 1 for r in slowed_runs),
        "slowed_median_change": median_change,
        "unchanged": unchanged,
        "slowed": slowed_runs,
    }, indent=2))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
