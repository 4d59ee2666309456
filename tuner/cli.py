"""`tune`: find the scheduler knobs that serve the most traffic within an SLO, and say why."""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import shlex
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any

from tuner.errors import TuneError
from tuner.measure.draws import LevelMix
from tuner.search.starting import Scenario
from tuner.search.study import SamplerName
from tuner.settings import (
    DEFAULT_HEARTBEAT_S,
    DEFAULT_LEVEL_S,
    DEFAULT_NUM_REQUESTS,
    DEFAULT_NUM_REQUESTS_GPU,
    DEFAULT_REL_TOL,
    DEFAULT_REPEATS,
    DEFAULT_REPEATS_VLLM,
    DEFAULT_TIME_BUDGET_S,
    DEFAULT_TIME_BUDGET_VLLM_S,
    DEFAULT_TRIALS,
    MIN_REQUESTS_PER_LEVEL,
    MIN_REQUESTS_PER_LEVEL_VLLM,
    TuneSettings,
)
from tuner.targets.signals import Stopped

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(h|m|min|s|sec)?\s*$")


def parse_duration(text: str, flag: str = "--time-budget", zero_ok: bool = False) -> float:
    """`10m`, `90s`, `1.5h` or plain seconds."""
    match = _DURATION.match(text)
    if not match:
        raise TuneError(f"{flag} {text!r} is not a duration; write e.g. 10m, 90s or 1h")
    value, unit = float(match.group(1)), match.group(2) or "s"
    seconds = value * {"h": 3600, "m": 60, "min": 60, "s": 1, "sec": 1}[unit]
    if seconds <= 0 and not zero_ok:
        raise TuneError(f"{flag} {text!r} must be longer than zero")
    return seconds


def build_parser() -> argparse.ArgumentParser:
    # fmt: off
    p = argparse.ArgumentParser(prog="tune", description=__doc__, epilog="`tune report RUN_DIR` "
                                "rebuilds a run's report; `tune profile` saves a target's "
                                "step-time model; `tune bench` gates a suite in CI. "
                                "docs/tuner.md has the details.")
    p.add_argument("--slo", help="e.g. tpot_p99=30ms,ttft_p99=2s (required unless --resume)")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue a run with its saved settings")
    w = p.add_argument_group("workload")
    w.add_argument("--workload", default="mixed", help="preset (default: mixed)")
    w.add_argument("--num-requests", type=int, help="size of the seeded request list levels "
                   f"draw from (default {DEFAULT_NUM_REQUESTS} on CPU, "
                   f"{DEFAULT_NUM_REQUESTS_GPU} on a GPU)")
    w.add_argument("--level-seconds", type=float, default=DEFAULT_LEVEL_S, help="seconds of "
                   f"arrivals per load level (default {DEFAULT_LEVEL_S:g}); 0 replays the whole "
                   "list at every level")
    w.add_argument("--min-requests", type=int, help="requests a load level holds at least, "
                   f"however short its seconds (default {MIN_REQUESTS_PER_LEVEL}; "
                   f"{MIN_REQUESTS_PER_LEVEL_VLLM} with --engine vllm, whose p99 over fewer "
                   "moves with the arrival draw)")
    w.add_argument("--level-mix", default=LevelMix.STRATIFIED.value,
                   choices=[m.value for m in LevelMix], help="which requests a level takes: "
                   "stratified (default) carries the list's prompt-length mix in every draw; "
                   "contiguous takes the next stretch of the list")
    w.add_argument("--workload-seed", type=int, default=0)
    w.add_argument("--arrival", default="poisson", help="poisson, gamma or constant")
    w.add_argument("--burstiness", type=float, default=1.0, help="gamma shape (1 = Poisson)")
    w.add_argument("--scenario", choices=[s.value for s in Scenario],
                   help="table row for the rule of thumb (default: from the workload)")
    e = p.add_argument_group("engine")
    e.add_argument("--engine", default="builtin", choices=["builtin", "vllm"],
                   help="builtin: engine_lite in this process (default); vllm: real vLLM started "
                   "per config with only the flags it accepts")
    e.add_argument("--model", default="tiny", help="preset or local Hugging Face folder (a "
                   "folder with --engine vllm)")
    e.add_argument("--vllm-command", help="vLLM server command prefix (default: this "
                   "interpreter's, or .venv-vllm's, python -m vllm.entrypoints.openai.api_server)")
    e.add_argument("--vllm-args", default="", help="more vllm serve flags for every trial")
    e.add_argument("--device", default="auto")
    e.add_argument("--dtype", default="auto",
                   help="model dtype (built-in engine, and vLLM's --dtype with --engine vllm)")
    e.add_argument("--kv-cache-memory-gb", type=float)
    e.add_argument("--max-model-len", type=int)
    s = p.add_argument_group("search")
    s.add_argument("--param", action="append", default=[], metavar="NAME=V1,V2|LO..HI",
                   help="narrow or add a searched knob (repeatable)")
    s.add_argument("--fix", action="append", default=[], metavar="NAME=V",
                   help="pin a knob (repeatable)")
    s.add_argument("--trials", type=int, help="most trials in the study, references included "
                   f"(default {DEFAULT_TRIALS}; a resume keeps the run's)")
    s.add_argument("--time-budget", help="wall-clock budget of this run, e.g. 10m (default 9m, "
                   "20m with --engine vllm; a resume keeps the run's)")
    s.add_argument("--rate", type=float, help="optimise goodput at this fixed rate (req/s)")
    s.add_argument("--repeats", type=int, help="re-measurements of each top config, each on a "
                   f"fresh draw (default {DEFAULT_REPEATS}; {DEFAULT_REPEATS_VLLM} with --engine "
                   "vllm, whose promise is checked on fresh starts)")
    s.add_argument("--top-k", type=int, default=3, help="configs to re-measure (default 3)")
    s.add_argument("--sampler", default=SamplerName.TPE.value,
                   choices=[x.value for x in SamplerName])
    s.add_argument("--seed", type=int, default=0, help="sampler seed")
    s.add_argument("--fidelity", default="sim", choices=["sim", "real"], help="sim (default): "
                   "screen the space on a simulator fitted to the target, then measure the "
                   "default and the best for real; real: search on the target alone")
    s.add_argument("--profile", help="a `tune profile` file for the simulator (default: fit "
                   "one on the target at the start)")
    s.add_argument("--verify-top", type=int, default=2, help="screened configs measured on "
                   "the target besides the default (default 2; as many again while every one "
                   "overstated its gain)")
    s.add_argument("--goal", help="once a verified config held its simulated gain, verify "
                   "another only if the run can still end within this, e.g. 3m (default 2m on "
                   "the built-in engine, none against a server; 0: none)")
    s.add_argument("--robust", action="store_true", help="recommend the confirmed config whose "
                   "worst simulated capacity across the traffic band (long-prompt fraction "
                   "x0.5-1.5, burstiness 0.5-2) is best, not the fastest on the workload itself")
    s.add_argument("--startup-trials", type=int, default=5, help="trials before the sampler "
                   "models the space (the queued references and budget sweep count; default 5)")
    s.add_argument("--no-budget-sweep", dest="budget_sweep", action="store_false",
                   help="do not queue the budget sweep (256, 1024, ... 4x apart) before the "
                   "sampler: the references, then the sampler alone (to compare samplers)")
    s.add_argument("--start-rate", type=float, help="first load level of the first trial, "
                   "req/s (default: 80%% of the throughput measured on a burst of the request "
                   "list)")
    s.add_argument("--rate-tolerance", type=float, default=DEFAULT_REL_TOL, help="stop "
                   f"bisecting at this relative bracket width (default {DEFAULT_REL_TOL:g})")
    s.add_argument("--min-rate", type=float, help="lowest rate worth measuring (start/8)")
    s.add_argument("--max-levels", type=int, default=8, help="load levels per trial at most")
    s.add_argument("--growth", type=float, default=2.0, help="climb factor (default 2)")
    s.add_argument("--request-timeout", type=float, default=120.0)
    o = p.add_argument_group("storage and output")
    o.add_argument("--run-dir", help="results folder (default results/tune-DATE-TIME)")
    o.add_argument("--storage", help="Optuna RDB URL or journal file shared by workers")
    o.add_argument("--study-name")
    o.add_argument("--heartbeat-interval", type=int, default=DEFAULT_HEARTBEAT_S, help="with a "
                   "shared --storage URL: seconds between a running trial's heartbeats; one "
                   f"silent for 3 is failed and queued again (default {DEFAULT_HEARTBEAT_S})")
    o.add_argument("--json", action="store_true", help="print the recommendation JSON")
    o.add_argument("--quiet", action="store_true", help="no progress display")
    t = p.add_argument_group("external servers")
    t.add_argument("--launch", metavar="CMD", help="server command per trial with {knob} "
                   "placeholders, e.g. 'vllm serve M --port {port} --max-num-batched-tokens "
                   "{max_num_batched_tokens}'")
    t.add_argument("--url", help="server base URL (default for --launch: http://127.0.0.1:8000)")
    t.add_argument("--served-model", help="model name the server expects in requests")
    t.add_argument("--endpoint", default="completions", choices=["completions", "chat"])
    t.add_argument("--prometheus-url", help="pull preemptions and KV usage per level")
    t.add_argument("--prometheus-interval", type=float, default=5.0,
                   help="Prometheus scrape interval in seconds (default 5)")
    t.add_argument("--launch-timeout", type=float, default=600.0,
                   help="seconds to wait for /health (default 600)")
    t.add_argument("--synthetic", type=float, metavar="SECONDS", help="a stand-in target whose "
                   "levels wait SECONDS and measure nothing: rehearse a cluster or a study")
    return p
    # fmt: on


# TuneSettings fields whose flag has another name; the others share theirs.
_FLAG_OF = {"level_s": "level_seconds", "params": "param", "fixed": "fix", "rate_rps": "rate",
            "n_startup_trials": "startup_trials", "start_rps": "start_rate",
            "rel_tol": "rate_tolerance", "min_rps": "min_rate",
            "request_timeout_s": "request_timeout", "prometheus_interval_s": "prometheus_interval",
            "launch_timeout_s": "launch_timeout", "time_budget_s": "time_budget", "goal_s": "goal",
            "heartbeat_s": "heartbeat_interval", "synthetic_s": "synthetic"}  # fmt: skip


# What a resume may change; everything else is the run's, as saved in its run.json.
_RESUME_FLAGS = {"resume", "trials", "time_budget", "json", "quiet"}


def settings_from_args(args: argparse.Namespace) -> TuneSettings:
    if args.resume:
        return resume_settings(args)
    if not args.slo:
        raise TuneError("--slo is required, e.g. tune --slo tpot_p99=30ms")
    values = {f.name: getattr(args, _FLAG_OF.get(f.name, f.name)) for f in fields(TuneSettings)}
    values["trials"] = DEFAULT_TRIALS if args.trials is None else args.trials
    default_budget = DEFAULT_TIME_BUDGET_VLLM_S if args.engine == "vllm" else DEFAULT_TIME_BUDGET_S
    budget = f"{default_budget:g}s" if args.time_budget is None else args.time_budget
    values["time_budget_s"] = parse_duration(budget)
    if args.goal is not None:
        values["goal_s"] = parse_duration(args.goal, "--goal", zero_ok=True)
    if args.repeats is None:
        values["repeats"] = DEFAULT_REPEATS_VLLM if args.engine == "vllm" else DEFAULT_REPEATS
    return TuneSettings(**values)


def resume_settings(args: argparse.Namespace) -> TuneSettings:
    """The run's saved settings, with the budget and trial count it saved unless given again."""
    from tuner.store.runfiles import RUN_FILE, RunFiles

    # A folder that holds no run is the first thing to say: no flag could make it resume.
    files = RunFiles(Path(args.resume))
    saved: dict[str, Any] = {**files.read_run_info()["settings"], "run_dir": args.resume}
    defaults = vars(build_parser().parse_args([]))
    given = vars(args).items()
    changed = sorted(k for k, v in given if k not in _RESUME_FLAGS and v != defaults[k])
    if changed:
        raise TuneError(
            f"--{changed[0].replace('_', '-')} cannot change on --resume: the run keeps the "
            "settings it was started with; only --trials and --time-budget may be given again"
        )
    try:
        settings = TuneSettings.from_json(saved)
    except (TuneError, TypeError) as exc:
        raise TuneError(f"{files.root / RUN_FILE} holds invalid settings ({exc})") from None
    if args.trials is not None:
        settings = dataclasses.replace(settings, trials=args.trials)
    if args.time_budget is not None:
        settings = dataclasses.replace(settings, time_budget_s=parse_duration(args.time_budget))
    return settings


def interrupted_line(settings: TuneSettings | None, what: str) -> str:
    """What a person needs after stopping a run: where it is and how to go on."""
    run_dir = Path(settings.run_dir) if settings and settings.run_dir else None
    if run_dir is None or not (run_dir / "run.json").exists():
        return f"{what} before anything was measured; nothing to resume"
    return f"{what}; resume with tune --resume {shlex.quote(str(run_dir))}"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    settings: TuneSettings | None = None
    try:
        if argv[:1] == ["report"]:
            from tuner.report.publish import report_main

            return report_main(argv[1:])
        if argv[:1] == ["bench"]:
            from tuner.bench.cli import main as bench_main

            return bench_main(argv[1:])
        if argv[:1] == ["profile"]:
            from tuner.sim.profile_cli import main as profile_main

            return profile_main(argv[1:])
        args = build_parser().parse_args(argv)
        settings = settings_from_args(args)
        from tuner.run import run_tune
        from tuner.targets.signals import run_stoppable

        rec = run_stoppable(run_tune(settings, quiet=args.quiet or args.json))
    except TuneError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(interrupted_line(settings, "interrupted"), file=sys.stderr)
        return 130
    except Stopped as stop:
        print(interrupted_line(settings, f"stopped by {stop}"), file=sys.stderr)
        return stop.exit_code
    if args.json:
        print(json.dumps(rec, indent=2))
    else:
        from tuner.report.summary import print_summary

        print_summary(rec)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
