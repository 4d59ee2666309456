"""`tune bench`: measure a suite's configs several times and compare them with a baseline.

Repeats are interleaved (every config once per round, the order rotated each round) so that a
slow minute on a shared machine hits all configs alike instead of one config's every sample.
In sim mode the target is the simulator (`bench/sim.py`): one round, compared exactly.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from loadgen import build_workload
from slo import compute_metrics, parse_slo
from tuner.bench.baseline import Baseline, ConfigSamples, Environment
from tuner.bench.sim import SuiteProfile, load_profile
from tuner.bench.stats import Comparison, Verdict, compare_exact, compare_figure
from tuner.bench.suite import FIGURES, BenchMode, BenchSuite
from tuner.errors import TuneError
from tuner.measure.contention import CpuGuard
from tuner.measure.meter import LevelRecord, LevelRun, LevelSettings, Meter
from tuner.measure.ratesearch import RateSearchSettings
from tuner.measure.verdict import VerdictRules
from tuner.store.environment import device_description, software_versions
from tuner.targets.base import Target
from tuner.targets.factory import DEFAULT_LAUNCH_URL, TargetOptions, open_target

# Capacity in a bench is bisected finer than in `tune`: a 5% tolerance needs steps under 5%.
CAPACITY_REL_TOL = 0.03
ProgressFn = Callable[[str], None]


@dataclass(slots=True)
class FigureRow:
    """One config's figure in the comparison table."""

    config: str
    figure: str
    comparison: Comparison | None  # None: nothing to compare with (new config or the reference)
    current_median: float
    note: str = ""


@dataclass(slots=True)
class BenchOutcome:
    """A measured suite, and its comparison when a baseline was given."""

    suite: BenchSuite
    baseline: Baseline  # what this run measured, in baseline form (written by --update-baseline)
    rows: list[FigureRow] = field(default_factory=list)
    compared_with: str | None = None
    not_compared: str | None = None  # why a --report-only run could not compare (the baseline's)

    @property
    def regressions(self) -> list[FigureRow]:
        return self._with(Verdict.REGRESSION)

    @property
    def improvements(self) -> list[FigureRow]:
        return self._with(Verdict.IMPROVEMENT)

    def _with(self, verdict: Verdict) -> list[FigureRow]:
        return [r for r in self.rows if r.comparison and r.comparison.verdict is verdict]


def make_target(suite: BenchSuite) -> Target:
    """The suite's [target]: the built-in engine (`model` and engine options), `url` or
    `launch` (with `served_model_name`, `launch_url`)."""
    t = dict(suite.target)
    t.pop("profile", None)  # a sim suite measured for real (--mode ratio|absolute)
    model = str(t.pop("served_model_name", t.get("model", "tiny")))
    options = TargetOptions(served_model=model, max_model_len=t.pop("max_model_len", None))
    if "url" in t:
        options.url = str(t["url"])
    elif "launch" in t:
        options.launch = str(t["launch"])
        options.url = str(t.get("launch_url", DEFAULT_LAUNCH_URL))
    else:
        options.model = str(t.pop("model", "tiny"))
        options.engine = t
    return open_target(options)


# Figures that need a replay at the suite's fixed rate, and those read at saturation.
_AT_RATE = {"request_goodput"} | {f for f in FIGURES if f.endswith("_ms")}
_AT_SATURATION = {"saturation_rps", "saturation_tok_s"}


def _rate_figures(level: LevelRecord) -> dict[str, float]:
    out = {f"{k.removesuffix('_s')}_ms": v * 1000.0 for k, v in level.latency.as_dict().items()}
    out["request_goodput"] = float(level.goodput_rps)
    return out


def _saturation_figures(run: LevelRun) -> dict[str, float]:
    """Everything sent at once: the throughput ceiling, a capacity proxy without an SLO."""
    metrics = compute_metrics(run.records)
    return {"saturation_rps": float(metrics.request_throughput),
            "saturation_tok_s": float(metrics.total_token_throughput)}  # fmt: skip


async def _measure_once(suite: BenchSuite, meter: Meter, knobs: dict[str, Any]) -> dict[str, float]:
    wanted = set(suite.figures)
    out: dict[str, float] = {}
    await meter.target.apply(knobs)
    if wanted & _AT_RATE:
        out |= _rate_figures((await meter.level(suite.rate_rps)).level)
    if wanted & _AT_SATURATION:
        out |= _saturation_figures(await meter.level(math.inf))
    if "capacity_rps" in wanted:
        search = RateSearchSettings(start_rps=suite.rate_rps, rel_tol=CAPACITY_REL_TOL)
        out["capacity_rps"] = (await meter.capacity(search)).capacity_rps
    return out


async def measure_suite(suite: BenchSuite, progress: ProgressFn | None = None) -> Baseline:
    """Measure every config `suite.rounds` times; returns the samples as a Baseline."""
    slo = parse_slo(suite.slo)  # fail on a bad SLO before loading anything
    sim = load_profile(suite) if suite.mode is BenchMode.SIM else None
    target = sim.target() if sim else make_target(suite)
    wl_args = dict(suite.workload)
    wl = build_workload(wl_args.pop("name", "mixed"), **wl_args)
    rules = VerdictRules(require_schedule=target.facts.require_schedule)
    settings = LevelSettings(seed=int(suite.workload.get("seed", 0)))
    # In virtual time the meter's clock stands still: only a level's wall_s reads it, and no
    # figure can then depend on how fast this machine simulated.
    clock = _still if sim else time.monotonic
    # Wall-clock rounds are run again when other processes took the CPU meanwhile.
    guard = None if sim else CpuGuard.watching(target)
    meter = Meter(target, wl.requests, slo, settings, rules, clock=clock, guard=guard)
    samples: dict[str, dict[str, list[float]]] = {c.name: {} for c in suite.configs}
    try:
        if sim is None:  # the first forward passes allocate and compile: not in any sample
            await target.apply(suite.configs[0].knobs)
            await Meter(target, wl.requests[:4], slo, LevelSettings(), rules).level(suite.rate_rps)
        for rnd in range(suite.rounds):
            shift = rnd % len(suite.configs)
            for cfg in suite.configs[shift:] + suite.configs[:shift]:
                if progress:
                    progress(f"round {rnd + 1}/{suite.rounds}: {cfg.name}")
                figs = await _measure_once(suite, meter, cfg.knobs)
                for name in suite.figures:
                    samples[cfg.name].setdefault(name, []).append(figs[name])
    finally:
        await target.close()
    return _baseline(suite, wl.fingerprint(), samples, sim)


def _still() -> float:
    return 0.0


def _environment(suite: BenchSuite, workload_hash: str, sim: SuiteProfile | None) -> Environment:
    """Where the figures came from: this machine, or (sim mode) the profile, wherever it runs."""
    slo = str(parse_slo(suite.slo))
    if sim is not None:
        return Environment(f"sim:{sim.profile.device}", sim.profile.model, workload_hash,
                           suite.mode.value, suite.rate_rps, slo, software_versions(),
                           sim.path.name, sim.content_hash)  # fmt: skip
    model = str(suite.target.get("model") or suite.target.get("url") or suite.target["launch"])
    return Environment(device_description(), model, workload_hash, suite.mode.value,
                       suite.rate_rps, slo, software_versions())  # fmt: skip


def _baseline(suite: BenchSuite, workload_hash: str, samples: dict[str, dict[str, list[float]]],
              sim: SuiteProfile | None = None) -> Baseline:  # fmt: skip
    env = _environment(suite, workload_hash, sim)
    configs = {c.name: ConfigSamples(dict(c.knobs), samples[c.name]) for c in suite.configs}
    if suite.mode is BenchMode.RATIO and suite.reference:
        _fill_ratios(configs, suite.reference)
    return Baseline(suite=suite.name, environment=env, configs=configs, reference=suite.reference)


def _fill_ratios(configs: dict[str, ConfigSamples], reference: str) -> None:
    """Each sample over the reference's sample of the same round (paired, so drift cancels)."""
    ref = configs[reference].samples
    for cfg in configs.values():
        cfg.ratios = {
            fig: [v / r if r > 0 else 0.0 for v, r in zip(vals, ref[fig], strict=True)]
            for fig, vals in cfg.samples.items()
        }


def compare(
    current: Baseline, baseline: Baseline, suite: BenchSuite, noise_floor: float = 0.0
) -> list[FigureRow]:
    """One row per config and figure; refuses a baseline from another environment."""
    problem = environment_problem(current, baseline)
    if problem:
        raise TuneError(problem + "; re-record it here with --update-baseline")
    return [_compare_one(name, fig, cur, baseline.configs.get(name), suite, noise_floor)
            for name, cur in current.configs.items() for fig in suite.figures]  # fmt: skip


def environment_problem(current: Baseline, baseline: Baseline) -> str | None:
    """Why the two cannot be compared (another device, model, workload, mode...), or None."""
    problems = current.environment.mismatches(baseline.environment)
    if not problems:
        return None
    return "the baseline was measured in another environment (" + "; ".join(problems) + ")"


def _compare_one(
    name: str, fig: str, cur: ConfigSamples, base: ConfigSamples | None, suite: BenchSuite,
    noise_floor: float,
) -> FigureRow:  # fmt: skip
    ratio = suite.mode is BenchMode.RATIO  # compare each round's ratio to the reference
    median = statistics.median(cur.samples[fig])
    if base is None:
        return FigureRow(name, fig, None, median, "new config: no baseline")
    if ratio and name == suite.reference:
        return FigureRow(name, fig, None, median, "reference")
    cur_vals = (cur.ratios if ratio else cur.samples).get(fig)
    base_vals = (base.ratios if ratio else base.samples).get(fig)
    if not base_vals or not cur_vals:
        return FigureRow(name, fig, None, median, "figure not in baseline")
    better, tol = FIGURES[fig], suite.allowed_change
    if suite.mode is BenchMode.SIM:  # one exact value a side
        comparison = compare_exact(fig, base_vals[0], cur_vals[0], higher_is_better=better,
                                   tolerance=tol)  # fmt: skip
    else:
        comparison = compare_figure(fig, base_vals, cur_vals, higher_is_better=better,
                                    tolerance=tol, min_noise_frac=noise_floor)  # fmt: skip
    note = "knobs changed since baseline" if base.knobs != cur.knobs else ""
    return FigureRow(name, fig, comparison, median, note)
