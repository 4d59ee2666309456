"""Is `tune bench --mode sim` exact, and does it catch a small change to scheduling?

Runs the committed sim suite against its committed baseline in fresh processes, as CI does:
(a) `--runs` times on unchanged code: every run must exit 0 with byte-identical figures;
(b) once with each of ten different deliberate 5% scheduling regressions: each must exit 1.
Prints one JSON object: for (a) how many runs exited 0, whether the figures of every run are
identical to each other and to the baseline's; for (b) each regression's description, exit code,
how many figures regressed / improved / stayed within float rounding, and each regressed
config/figure with its change (current / baseline - 1).

    .venv/bin/python benchmarks/sim_gate.py [--suite results/baselines/cpu-tiny-sim.toml]
        [--baseline results/baselines/cpu-tiny-sim.json] [--runs 10]

A regression is injected without editing the source: its child process is this script with
`--inject NAME -- <tune bench arguments>`, which monkeypatches engine_lite's `Scheduler` in
that process only and then runs `tune bench` there. Five regressions cut one scheduling
quantity by 5% in every step; five (seeds 0-4) make the scheduler skip admitting new prompts
in a seeded 5% of the steps that have running requests.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CUT = 0.95  # every regression is 5%
SKIP_SHARE = 0.05


def _cut(n: int) -> int:
    return max(1, math.floor(n * CUT)) if n > 0 else n


def _after_init(change: Callable[[Any], None]) -> None:
    from engine_lite.scheduler import Scheduler

    orig = Scheduler.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        orig(self, *args, **kwargs)
        change(self)

    Scheduler.__init__ = init  # type: ignore[method-assign]


def _budget() -> None:
    _after_init(lambda s: setattr(s, "token_budget", _cut(s.token_budget)))


def _seqs() -> None:
    _after_init(lambda s: setattr(s, "max_num_seqs", _cut(s.max_num_seqs)))


def _threshold() -> None:
    import engine_lite.scheduler as sched

    orig = sched.step_threshold
    sched.step_threshold = lambda *a: _cut(orig(*a))  # type: ignore[assignment]


def _chunk() -> None:
    import engine_lite.scheduler as sched

    orig = sched._Step.chunk
    sched._Step.chunk = lambda self, req: _cut(orig(self, req))  # type: ignore[method-assign]


def _admission() -> None:
    from engine_lite.scheduler import Scheduler

    orig = Scheduler._schedule_waiting

    def waiting(self: Any, step: Any) -> None:
        held = min(step.budget, round(self.token_budget * (1 - CUT)))
        step.budget -= held
        orig(self, step)
        step.budget += held

    Scheduler._schedule_waiting = waiting  # type: ignore[method-assign]


def _skip_admission(seed: int) -> Callable[[], None]:
    def patch() -> None:
        from engine_lite.scheduler import Scheduler

        orig = Scheduler._schedule_waiting

        def waiting(self: Any, step: Any) -> None:
            # Only while something runs: a step with nothing scheduled would stall the engine.
            rng = self.__dict__.setdefault("_sim_gate_rng", random.Random(seed))
            if self.running and rng.random() < SKIP_SHARE:
                return
            orig(self, step)

        Scheduler._schedule_waiting = waiting  # type: ignore[method-assign]

    return patch


REGRESSIONS: dict[str, tuple[str, Callable[[], None]]] = {
    "budget": ("every step's token budget 5% smaller", _budget),
    "seqs": ("max_num_seqs 5% smaller", _seqs),
    "threshold": ("the long-prefill threshold 5% smaller where one is in force", _threshold),
    "chunk": ("every scheduled chunk 5% shorter (a decode stays 1 token)", _chunk),
    "admission": ("5% of each step's token budget withheld from admitting new prompts",
                  _admission),
    **{f"skip-admission-{k}": (f"no admission in a seeded 5% of busy steps (seed {k})",
                               _skip_admission(k)) for k in range(5)},
}  # fmt: skip


def _bench(argv: list[str], inject: str | None = None) -> tuple[int, dict[str, Any]]:
    if inject is None:
        cmd = [sys.executable, "-m", "tuner.bench.cli", *argv]
    else:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--inject", inject, "--", *argv]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=ROOT)
    if proc.returncode == 2 or not proc.stdout.strip():
        raise SystemExit(f"tune bench could not run: {proc.stderr.strip()[-500:]}")
    return proc.returncode, json.loads(proc.stdout)


def _figures_digest(configs: dict[str, Any]) -> str:
    """Every figure of every config, as the exact JSON floats a baseline stores."""
    samples = {name: cfg["samples"] for name, cfg in configs.items()}
    return hashlib.sha256(json.dumps(samples, sort_keys=True).encode()).hexdigest()[:16]


def _verdicts(result: dict[str, Any]) -> dict[str, Any]:
    """How many figures each verdict got, and the regressed ones with their change."""
    rows = [r for r in result["rows"] if r["comparison"] is not None]
    counts = {v: sum(r["comparison"]["verdict"] == v for r in rows)
              for v in ("regression", "improvement", "ok")}  # fmt: skip
    regressed = {f"{r['config']}/{r['figure']}": float(f"{r['comparison']['change_frac']:.3g}")
                 for r in rows if r["comparison"]["verdict"] == "regression"}  # fmt: skip
    return {**counts, "regressed": regressed}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--suite", default="results/baselines/cpu-tiny-sim.toml")
    p.add_argument("--baseline", default="results/baselines/cpu-tiny-sim.json")
    p.add_argument("--runs", type=int, default=10)
    args = p.parse_args()
    argv = ["--suite", args.suite, "--baseline", args.baseline, "--mode", "sim", "--json"]
    recorded = json.loads((ROOT / args.baseline).read_text())["configs"]
    unchanged = []
    for i in range(args.runs):
        code, result = _bench(argv)
        unchanged.append((code, _figures_digest(result["configs"])))
        print(f"unchanged run {i + 1}: exit {code}", file=sys.stderr)
    injected = {}
    for name, (what, _) in REGRESSIONS.items():
        code, result = _bench(argv, inject=name)
        injected[name] = {"regression": what, "exit": code, **_verdicts(result)}
        print(f"{name}: exit {code}", file=sys.stderr)
    digests = {d for _, d in unchanged}
    print(json.dumps({
        "suite": args.suite, "baseline": args.baseline,
        "unchanged": {"runs": args.runs, "exit_0": sum(c == 0 for c, _ in unchanged),
                      "identical_figures": len(digests) == 1,
                      "identical_to_baseline": digests == {_figures_digest(recorded)},
                      "figures_sha256": sorted(digests)},
        "regressions": {"runs": len(injected),
                        "caught": sum(r["exit"] == 1 for r in injected.values()),
                        "each": injected},
    }, indent=2))  # fmt: skip
    return 0


def child(argv: list[str]) -> int:
    """`--inject NAME -- ARGS`: apply one regression in this process, then run tune bench."""
    name, rest = argv[1], argv[3:]
    REGRESSIONS[name][1]()
    from tuner.bench.cli import main as bench_main

    return bench_main(rest)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--inject"]:
        raise SystemExit(child(sys.argv[1:]))
    raise SystemExit(main())
