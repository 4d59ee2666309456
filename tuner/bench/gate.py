"""`tune bench`: measure a suite's configs several times and compare them with a baseline.

Repeats are interleaved (every config once per round, the order rotated each round) so that a
slow minute on a shared machine hits all configs alike instead of one config's every sample.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engine_lite import EngineConfig
from loadgen import build_workload
from slo import compute_metrics, parse_slo
from tuner.bench.baseline import (
    Baseline,
    ConfigSamples,
    Environment,
    device_description,
    software_versions,
    text_hash,
)
from tuner.bench.stats import Comparison, Verdict, compare_figure
from tuner.bench.suite import FIGURES, BenchMode, BenchSuite
from tuner.errors import TuneError
from tuner.measure.level import LevelResult, LevelSettings, find_capacity, measure_level
from tuner.measure.ratesearch import RateSearchSettings
from tuner.targets.base import BuiltinTarget, LaunchTarget, Target, UrlTarget
from tuner.targets.launch import LaunchSpec

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

    @property
    def regressions(self) -> list[FigureRow]:
        return [r for r in self.rows if r.comparison and r.comparison.verdict is Verdict.REGRESSION]


def make_target(suite: BenchSuite) -> Target:
    t = suite.target
    model = str(t.get("served_model_name", t.get("model", "tiny")))
    if "url" in t:
        return UrlTarget(str(t["url"]), model)
    if "launch" in t:
        url = str(t.get("launch_url", "http://127.0.0.1:8000"))
        return LaunchTarget(LaunchSpec(str(t["launch"]), url, model), url, model)
    engine_opts = {k: v for k, v in t.items() if k != "model"}
    return BuiltinTarget(EngineConfig(model=model, **engine_opts))


# Figures that need a replay at the suite's fixed rate, and those read at saturation.
_AT_RATE = {"request_goodput"} | {f for f in FIGURES if f.endswith("_ms")}
_AT_SATURATION = {"saturation_rps", "saturation_tok_s"}


def _rate_figures(level: LevelResult) -> dict[str, float]:
    out = {f"{k}_ms": v * 1000.0 for k, v in level.latency_s.items()}
    out["request_goodput"] = float(level.goodput_rps)
    return out


def _saturation_figures(level: LevelResult) -> dict[str, float]:
    """Everything sent at once: the throughput ceiling, a capacity proxy without an SLO."""
    metrics = compute_metrics([r for r in level.records if not r.warmup])
    return {
        "saturation_rps": float(metrics.request_throughput),
        "saturation_tok_s": float(metrics.total_token_throughput),
    }


async def _measure_once(
    suite: BenchSuite, target: Target, requests: list[Any], knobs: dict[str, Any]
) -> dict[str, float]:
    slo = parse_slo(suite.slo)
    settings = LevelSettings(seed=int(suite.workload.get("seed", 0)))
    wanted = set(suite.figures)
    out: dict[str, float] = {}
    await target.apply(knobs)
    if wanted & _AT_RATE:
        out |= _rate_figures(await measure_level(target, requests, suite.rate_rps, slo, settings))
    if wanted & _AT_SATURATION:
        level = await measure_level(target, requests, math.inf, slo, settings)
        out |= _saturation_figures(level)
    if "capacity_rps" in wanted:
        search = RateSearchSettings(start_rps=suite.rate_rps, rel_tol=CAPACITY_REL_TOL)
        result = await find_capacity(target, requests, slo, search, settings)
        out["capacity_rps"] = result.capacity_rps
    return out


async def measure_suite(suite: BenchSuite, progress: ProgressFn | None = None) -> Baseline:
    """Measure every config `suite.repeats` times; returns the samples as a Baseline."""
    parse_slo(suite.slo)  # fail on a bad SLO before loading anything
    target = make_target(suite)
    wl_args = dict(suite.workload)
    wl = build_workload(wl_args.pop("name", "mixed"), **wl_args)
    samples: dict[str, dict[str, list[float]]] = {c.name: {} for c in suite.configs}
    try:
        # Warm-up: the first forward passes allocate and compile; keep them out of every sample.
        await target.apply(suite.configs[0].knobs)
        await measure_level(target, wl.requests[:4], suite.rate_rps, parse_slo(suite.slo))
        for rnd in range(suite.repeats):
            order = (
                suite.configs[rnd % len(suite.configs) :]
                + suite.configs[: rnd % len(suite.configs)]
            )
            for cfg in order:
                if progress:
                    progress(f"round {rnd + 1}/{suite.repeats}: {cfg.name}")
                figs = await _measure_once(suite, target, wl.requests, cfg.knobs)
                for name in suite.figures:
                    samples[cfg.name].setdefault(name, []).append(figs[name])
    finally:
        await target.close()
    env = Environment(
        device=device_description(),
        model=str(suite.target.get("model") or suite.target.get("url") or suite.target["launch"]),
        workload_hash=wl.fingerprint(),
        mode=suite.mode.value,
        rate_rps=suite.rate_rps,
        slo=str(parse_slo(suite.slo)),
        versions=software_versions(),
    )
    configs = {
        c.name: ConfigSamples(knobs=dict(c.knobs), samples=samples[c.name]) for c in suite.configs
    }
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
    problems = current.environment.mismatches(baseline.environment)
    if problems:
        raise TuneError(
            "the baseline was measured in another environment (" + "; ".join(problems) + "); "
            "re-record it here with --update-baseline"
        )
    rows = []
    ratio_mode = suite.mode is BenchMode.RATIO
    for name, cur in current.configs.items():
        base = baseline.configs.get(name)
        for fig in suite.figures:
            cur_vals = cur.ratios.get(fig) if ratio_mode else cur.samples.get(fig)
            median = sorted(cur.samples[fig])[len(cur.samples[fig]) // 2]
            if base is None:
                rows.append(FigureRow(name, fig, None, median, "new config: no baseline"))
                continue
            if ratio_mode and name == suite.reference:
                rows.append(FigureRow(name, fig, None, median, "reference"))
                continue
            base_vals = base.ratios.get(fig) if ratio_mode else base.samples.get(fig)
            if not base_vals or not cur_vals:
                rows.append(FigureRow(name, fig, None, median, "figure not in baseline"))
                continue
            cmp_ = compare_figure(
                fig,
                base_vals,
                cur_vals,
                higher_is_better=FIGURES[fig],
                tolerance=suite.tolerance,
                min_noise_frac=noise_floor,
            )
            note = "knobs changed since baseline" if base.knobs != cur.knobs else ""
            rows.append(FigureRow(name, fig, cmp_, median, note))
    return rows


def knobs_text(knobs: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(knobs.items())) or "engine defaults"


def suite_hash(suite: BenchSuite) -> str:
    return text_hash(suite.source)
