"""How `tune` scales with workers on one PostgreSQL study: trials per hour with 1, 2, 4 and 8
workers, and what coordinating them costs per trial.

Every worker is a real `tune` process on a real PostgreSQL storage; only the measurement is
synthetic (`--synthetic`): a trial is one load level (`--rate` mode, so every trial is the same
length) that waits a fixed time on the event loop and costs no CPU. What is left is the
coordination: Optuna's sampler and storage calls, judging and keeping each level's records.

    python benchmarks/cluster_scaling.py            # starts a throwaway server (.ci/postgres)
    python benchmarks/cluster_scaling.py --storage postgresql+psycopg://user@host/db

The workers of a run start together and measure at once; trials per hour is the sum of each
worker's rate over its own span (first trial start to last trial end: start-up, the final wait
and the report are left out), and duplicates (a config already measured, so not measured
again) do not count. Storage is what a worker's main thread spent in storage calls during its
search, per trial; overhead is a worker's wall time per trial beyond the level itself.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import optuna
from optuna.trial import FrozenTrial, TrialState

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tuner.store import attrs  # noqa: E402

FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)


@contextmanager
def postgres(url: str | None) -> Iterator[str]:
    """The given server, or a throwaway one for the length of the benchmark."""
    if url:
        yield url
        return
    with tempfile.TemporaryDirectory(prefix="tune-pg-") as tmp:
        script = str(ROOT / ".ci" / "postgres")
        started = subprocess.run([script, "start", tmp], capture_output=True, text=True,
                                 check=True)  # fmt: skip
        try:
            yield started.stdout.strip()
        finally:
            subprocess.run([script, "stop", tmp], check=False)


def run_workers(url: str, n: int, args: argparse.Namespace, out: Path) -> str:
    """N workers on a fresh study until it holds N x trials-per-worker trials; its name."""
    study = f"scaling-{n}-{uuid.uuid4().hex[:8]}"
    cmd = [sys.executable, "-m", "tuner.cli", "--slo", "tpot_p99=30ms",
           "--synthetic", str(args.level_s), "--rate", "6", "--level-seconds", "2",
           "--num-requests", "40", "--trials", str(n * args.trials_per_worker),
           "--repeats", "0", "--top-k", "1", "--time-budget", "1h", "--storage", url,
           "--study-name", study, "--quiet"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([*cmd, "--run-dir", str(out / f"{study}-{i}")], env=env, cwd=out,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for i in range(n)]  # fmt: skip
    for proc in procs:
        _, err = proc.communicate()
        if proc.returncode:
            raise SystemExit(f"a worker failed: {err.strip()}")
    return study


def figures(url: str, study_name: str, n: int) -> dict[str, float]:
    study = optuna.load_study(study_name=study_name, storage=url)
    done = [t for t in study.get_trials(deepcopy=False) if t.state in FINISHED]
    # A duplicate (a config already measured, so not measured again) takes no time: only
    # measured trials count.
    measured = [t for t in done if _level_walls(t)]
    by_worker: dict[str, list[FrozenTrial]] = {}
    for t in measured:
        by_worker.setdefault(attrs.worker_of(t), []).append(t)
    spans = {w: max(map(_end, ts)) - min(map(_start, ts)) for w, ts in by_worker.items()}
    starts = [min(map(_start, ts)) for ts in by_worker.values()]
    overheads = [(spans[w] - sum(sum(_level_walls(t)) for t in ts)) / len(ts)
                 for w, ts in by_worker.items()]  # fmt: skip
    registry = attrs.workers(study).values()
    return {
        "workers": n, "measured_trials": len(measured), "duplicates": len(done) - len(measured),
        # The workers run at once: the study's rate is the sum of theirs.
        "trials_per_hour": 3600 * sum(len(ts) / spans[w] for w, ts in by_worker.items()),
        "start_spread_s": max(starts) - min(starts), "mean_span_s": statistics.mean(spans.values()),
        "storage_s_per_trial": sum(w.get("storage_s", 0.0) for w in registry) / len(measured),
        "storage_calls_per_trial": sum(w.get("storage_calls", 0) for w in registry)
        / len(measured),
        "overhead_s_per_trial": statistics.mean(overheads),
    }  # fmt: skip


def _level_walls(t: FrozenTrial) -> list[float]:
    return [row["wall_s"] for key, row in t.user_attrs.items()
            if key.startswith(attrs.LEVEL_PREFIX)]  # fmt: skip


def _start(t: FrozenTrial) -> float:
    assert t.datetime_start is not None
    return t.datetime_start.timestamp()


def _end(t: FrozenTrial) -> float:
    assert t.datetime_complete is not None
    return t.datetime_complete.timestamp()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--storage", help="a PostgreSQL URL (default: start a throwaway server)")
    p.add_argument("--workers", default="1,2,4,8")
    p.add_argument("--trials-per-worker", type=int, default=8)
    # A real level is 8 s of arrivals and its drain: the shortest real trial (one pruned level)
    # takes about this long.
    p.add_argument("--level-s", type=float, default=15.0, help="seconds one synthetic level waits")
    p.add_argument("--json", type=Path, help="also write the figures here")
    args = p.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    rows = []
    with postgres(args.storage) as url, tempfile.TemporaryDirectory() as out:
        for n in (int(x) for x in args.workers.split(",")):
            study = run_workers(url, n, args, Path(out))
            rows.append(figures(url, study, n))
            print(_row(rows[-1], rows[0]), flush=True)
    if args.json:
        args.json.write_text(json.dumps({"level_s": args.level_s, "rows": rows}, indent=2) + "\n")


def _row(r: dict[str, float], first: dict[str, float]) -> str:
    speedup = r["trials_per_hour"] / first["trials_per_hour"]
    return (f"| {r['workers']:.0f} | {r['measured_trials']:.0f} ({r['duplicates']:.0f}) | "
            f"{r['trials_per_hour']:.0f} | "
            f"{speedup:.2f}x | {1e3 * r['storage_s_per_trial']:.0f} ms "
            f"({r['storage_calls_per_trial']:.0f} calls) | "
            f"{1e3 * r['overhead_s_per_trial']:.0f} ms |")  # fmt: skip


if __name__ == "__main__":
    print(
        "| workers | trials (duplicates) | trials/hour | speed-up | storage per trial | "
        "overhead per trial |"
    )
    print("|---|---|---|---|---|---|")
    main()
