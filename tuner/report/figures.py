"""The report's figures from the run's records, and knob importance from the study."""

from __future__ import annotations

import warnings
from typing import Any

import optuna
from optuna.trial import TrialState

from tuner.report.plots import TrialPoint, importance_plot, knob_plots, pareto_plot, progress_plot
from tuner.search.space import THRESHOLD_FRACTION, THRESHOLD_SWITCH
from tuner.store.records import TrialRecord
from tuner.targets.knobs import KNOBS, knobs_to_json

PARAM_LABELS = {
    THRESHOLD_SWITCH: "threshold on/off",
    THRESHOLD_FRACTION: "threshold / budget",
    **{k.name: k.label for k in KNOBS.values()},
}
FIGURE_TITLES = {
    "pareto": "TTFT p99 against TPOT p99",
    "knobs": "Capacity against each knob",
    "importance": "Knob importance",
    "progress": "Search progress",
}


def trial_points(trials: list[TrialRecord], recommended: int | None) -> list[TrialPoint]:
    """Each finished trial at its highest passing rate (else its first level)."""
    out = []
    for t in trials:
        if not t.finished or not t.levels:
            continue
        passing = [lv for lv in t.levels if lv.passed]
        level = max(passing, key=lambda lv: lv.rate_rps) if passing else t.levels[0]
        complete = t.state is TrialState.COMPLETE
        out.append(TrialPoint(
            number=t.number, role=t.role.value, state="complete" if complete else "pruned",
            knobs=knobs_to_json(t.knobs), capacity_rps=t.capacity_rps if complete else None,
            upper_bound_rps=t.upper_bound_rps, ttft_p99_s=level.latency.ttft_p99_s,
            tpot_p99_s=level.latency.tpot_p99_s, rate_rps=level.rate_rps,
            recommended=t.number == recommended,
        ))  # fmt: skip
    return out


def importance(study: optuna.Study) -> dict[str, float] | None:
    """Optuna's fANOVA importances over finished trials, None when there are too few."""
    done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if len(done) < 3 or len({t.value for t in done}) < 2:
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            raw = optuna.importance.get_param_importances(study)
    except (RuntimeError, ValueError):
        return None
    return {PARAM_LABELS.get(k, k): float(v) for k, v in raw.items()} or None


def report_figures(rec: dict[str, Any], trials: list[TrialRecord]) -> dict[str, bytes]:
    """PNG bytes of each figure the report shows."""
    best = rec.get("best") or {}
    points = trial_points(trials, best.get("trial"))
    limits = {t.get("metric"): t.get("limit_ms") for t in (best.get("terms") or [])}
    figures = {}
    if points:
        ttft, tpot = limits.get("ttft_p99"), limits.get("tpot_p99")
        figures["pareto"] = pareto_plot(points, ttft and ttft / 1e3, tpot and tpot / 1e3)
        figures["knobs"] = knob_plots(points, list(rec.get("search", {}).get("space", {})))
        figures["progress"] = progress_plot(points)
    if rec.get("importance"):
        figures["importance"] = importance_plot(rec["importance"])
    return figures
